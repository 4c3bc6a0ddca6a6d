//! The process's stop signals (SIGTERM/SIGINT) as one value every waiter can look at.
//!
//! Why a `watch`: a task that starts waiting after the signal arrived still sees it, and the
//! first signal decides the way out (later ones change nothing).

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// The first SIGTERM/SIGINT, as a watch the whole process can look at.
#[derive(Clone)]
pub struct StopSignal(watch::Receiver<Option<&'static str>>);

impl StopSignal {
    pub fn install() -> std::io::Result<StopSignal> {
        let (tx, rx) = watch::channel(None);
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            let _ = tx.send(Some(name));
            // Later signals change nothing: the first one decides the way out.
            loop {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
            }
        });
        Ok(StopSignal(rx))
    }
    pub fn received(&self) -> Option<&'static str> {
        *self.0.borrow()
    }
    pub async fn wait(&mut self) -> &'static str {
        loop {
            if let Some(name) = *self.0.borrow() {
                return name;
            }
            if self.0.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}
