//! The process's signals, as what a process host hands its daemon: SIGTERM/SIGINT as a
//! [`Stop`], SIGHUP as a [`Reread`] of the credential, SIGUSR1 as a request to reopen the log.
//!
//! Why here and not in the daemon: a library value must not install process-wide handlers; the
//! host that owns the process (`deliver --space`, `deliver --spaces`) installs them once and
//! passes them in. The first stop signal decides the cause; later ones change nothing. SIGHUP
//! (a terminal hang-up, `systemctl reload`) is not a stop: its default action would end the
//! daemon without its stop line and without releasing its lease. SIGUSR1 is logrotate's.

use std::path::PathBuf;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::base::Journal;
use crate::space::{Reread, Stop};

/// The signals a process host acts on.
#[derive(Clone)]
pub struct ProcessSignals {
    /// SIGTERM or SIGINT: close, releasing the lease.
    pub stop: Stop,
    /// SIGHUP: re-read the credential now.
    pub reread: Reread,
    /// SIGUSR1: each one increments it; a holder of the log reopens its file.
    pub reopen: watch::Receiver<u64>,
}

impl ProcessSignals {
    /// Resolves at the next SIGUSR1 not seen yet by this copy (never once the handler is gone).
    pub async fn reopen_requested(&mut self) {
        if self.reopen.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Installs the handlers; the first SIGTERM/SIGINT fires the stop with its name.
pub fn install() -> std::io::Result<ProcessSignals> {
    let (stop_tx, stop) = Stop::channel();
    let (reread_tx, reread) = Reread::channel();
    let (reopen_tx, reopen) = watch::channel(0u64);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => { stop_tx.send_if_modified(|c| first(c, "SIGTERM")); }
                _ = int.recv() => { stop_tx.send_if_modified(|c| first(c, "SIGINT")); }
                _ = hup.recv() => reread_tx.send_modify(|n| *n += 1),
                _ = usr1.recv() => reopen_tx.send_modify(|n| *n += 1),
            }
        }
    });
    Ok(ProcessSignals {
        stop,
        reread,
        reopen,
    })
}

/// Sets the cause only when none is set yet: the first signal decides the way out.
fn first(cause: &mut Option<&'static str>, name: &'static str) -> bool {
    if cause.is_none() {
        *cause = Some(name);
        true
    } else {
        false
    }
}

/// Reopens `log` on every SIGUSR1 until the returned task is aborted: the stamped stderr when
/// stderr is the log, else `journal`'s file. The line that says so is written after the
/// reopen, so it is the new file's first. `who` begins the line (`delivery`, `delivery host`).
pub fn reopen_on_usr1(
    signals: &ProcessSignals,
    journal: Journal,
    log: Option<PathBuf>,
    who: &'static str,
) -> tokio::task::JoinHandle<()> {
    let mut signals = signals.clone();
    tokio::spawn(async move {
        loop {
            signals.reopen_requested().await;
            let Some(path) = &log else {
                journal.line(format!(
                    "• {who}: received SIGUSR1; it writes no log file (--store), nothing to reopen"
                ));
                continue;
            };
            let reopened = match crate::base::reopen_stamped() {
                Some(r) => r.map(|_| true),
                None => journal.reopen(path),
            };
            match reopened {
                Ok(true) => journal.line(format!(
                    "• {who}: received SIGUSR1, reopened the log {}",
                    path.display()
                )),
                Ok(false) => journal.line(format!(
                    "• {who}: received SIGUSR1; no log file is open, nothing to reopen"
                )),
                Err(e) => journal.line(format!(
                    "! {who}: received SIGUSR1 but could not reopen {} ({e}); lines go on to the file it had open",
                    path.display()
                )),
            }
        }
    })
}
