//! The process's stop signals (SIGTERM/SIGINT) as a [`Stop`] a process host hands its daemon.
//!
//! Why here and not in the daemon: a library value must not install process-wide handlers; the
//! host that owns the process (`deliver --space`) installs them once and passes the `Stop` in.
//! The first signal decides the cause; later ones change nothing.

use tokio::signal::unix::{signal, SignalKind};

use crate::space::Stop;

/// Installs the SIGTERM/SIGINT handlers; the returned `Stop` fires with the first one's name.
pub fn install() -> std::io::Result<Stop> {
    let (tx, stop) = Stop::channel();
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
    Ok(stop)
}
