//! The stop of a space's delivery daemon: one piece shared by `down` and by `up` (Ctrl-C, a
//! broker that exited under it), so both behave the same way.
//!
//! Why each step: a reservation file keeps two stops from signalling the same daemon at once;
//! only a process the pid record (or `up`'s launch record) proves to be a delivery daemon is
//! signalled, so a reused pid is cleared without a signal; SIGTERM lets the daemon release its
//! lease, SIGKILL after the grace handles one too starved to exit; and the credential is
//! removed only once the death is confirmed, so a daemon that survived keeps what it runs on.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::Child;

use crate::base::{self, Journal, PidLiveness};
use crate::wire::Space;

/// How long a SIGKILLed process may take to be confirmed dead.
const KILL_CONFIRM_BOUND: Duration = Duration::from_secs(5);
/// Poll period while waiting for a death.
const POLL: Duration = Duration::from_millis(50);

/// Why a stop did not complete. `Display` is the operator's line.
#[derive(Debug)]
pub struct StopError {
    kind: StopErrorKind,
    detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopErrorKind {
    /// Another stop of the same space holds the reservation.
    Busy,
    /// The reservation could not be written.
    Io,
    /// A process outlived SIGKILL; its credential was kept.
    Survived,
}

impl StopError {
    pub fn kind(&self) -> StopErrorKind {
        self.kind
    }
}

impl std::fmt::Display for StopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for StopError {}

/// The stop reservation of one space (`.cotal/delivery.<key>.stopping`, holding the holder's
/// pid). Released on drop, only while it still names this process.
#[derive(Debug)]
pub struct Reservation {
    path: PathBuf,
}

impl Reservation {
    /// Takes the reservation; refused while a live process holds it. A reservation whose holder
    /// is dead is taken over (its stop can no longer be running).
    pub fn take(root: &Path, space: &Space, who: &str) -> Result<Reservation, StopError> {
        let path = base::stop_reservation_path(root, space);
        let me = std::process::id();
        for _ in 0..2 {
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    let _ = writeln!(f, "{me}");
                    return Ok(Reservation { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    match base::read_pid(&path) {
                        Some(holder)
                            if holder != me
                                && base::process_alive(holder)
                                && !base::is_zombie(holder) =>
                        {
                            return Err(StopError {
                                kind: StopErrorKind::Busy,
                                detail: format!(
                                    "✗ {who}: another stop of the delivery daemon for space {space} is running (pid {holder} holds {}) - not signalling",
                                    path.display()
                                ),
                            });
                        }
                        _ => {
                            let _ = fs::remove_file(&path);
                        }
                    }
                }
                Err(e) => {
                    return Err(StopError {
                        kind: StopErrorKind::Io,
                        detail: format!("✗ {who}: could not write {}: {e}", path.display()),
                    })
                }
            }
        }
        Err(StopError {
            kind: StopErrorKind::Busy,
            detail: format!(
                "✗ {who}: the stop reservation {} keeps reappearing - not signalling",
                path.display()
            ),
        })
    }

    /// Waits (bounded) until nobody holds the reservation of `space`; true when it was released.
    pub async fn wait_released(root: &Path, space: &Space, bound: Duration) -> bool {
        let path = base::stop_reservation_path(root, space);
        let deadline = Instant::now() + bound;
        loop {
            let held = base::read_pid(&path)
                .is_some_and(|p| base::process_alive(p) && !base::is_zombie(p));
            if !held {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if base::read_pid(&self.path) == Some(std::process::id()) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// How one process ended under a stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It was not running.
    NotRunning,
    /// It exited within the grace after SIGTERM.
    Exited,
    /// It needed SIGKILL, and its death is confirmed.
    Killed,
    /// It outlived SIGKILL.
    Survived,
}

/// A process a stop signals: `up`'s own child (reaped through its handle) or a pid proved by a
/// record (watched through `/proc`; a zombie counts as dead).
pub enum Target<'a> {
    Child(&'a mut Child),
    Pid(u32),
}

impl Target<'_> {
    fn pid(&self) -> Option<u32> {
        match self {
            Target::Child(c) => c.id(),
            Target::Pid(p) => Some(*p),
        }
    }
    fn gone(&mut self) -> bool {
        match self {
            Target::Child(c) => !matches!(c.try_wait(), Ok(None)),
            Target::Pid(p) => !base::process_alive(*p) || base::is_zombie(*p),
        }
    }
    async fn wait_gone(&mut self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        loop {
            if self.gone() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

fn signal(pid: u32, sig: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(raw), sig);
    }
}

/// SIGTERM, wait up to `grace`, then SIGKILL and confirm the death (bounded). `label` names the
/// process in the lines (`delivery daemon`, `nats-server`).
pub async fn terminate(
    mut target: Target<'_>,
    grace: Duration,
    label: &str,
    who: &str,
    journal: &Journal,
) -> Ended {
    let Some(pid) = target.pid() else {
        return Ended::NotRunning;
    };
    if target.gone() {
        return Ended::NotRunning;
    }
    signal(pid, Signal::SIGTERM);
    if target.wait_gone(grace).await {
        journal.line(format!("• {who}: {label} (pid {pid}) stopped"));
        return Ended::Exited;
    }
    journal.line(format!(
        "! {who}: {label} (pid {pid}) did not exit {} ms after SIGTERM - sent SIGKILL",
        grace.as_millis()
    ));
    signal(pid, Signal::SIGKILL);
    if target.wait_gone(KILL_CONFIRM_BOUND).await {
        journal.line(format!("• {who}: {label} (pid {pid}) killed"));
        Ended::Killed
    } else {
        journal.line(format!(
            "✗ {who}: {label} (pid {pid}) is still alive {} ms after SIGKILL",
            KILL_CONFIRM_BOUND.as_millis()
        ));
        Ended::Survived
    }
}

/// What a stop found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StopReport {
    /// Pids signalled (record, launch record, `up`'s own child).
    pub signalled: Vec<u32>,
    /// Whether the credential was removed (only after every signalled process is dead).
    pub credential_removed: bool,
}

/// Stops the delivery daemon of `space` under `root`: takes the reservation, signals only what
/// is proved to be the daemon (`own` is `up`'s own child, if any), removes the credential once
/// every signalled process is dead, and releases the reservation.
pub async fn stop_daemon(
    root: &Path,
    space: &Space,
    own: Option<&mut Child>,
    grace: Duration,
    who: &str,
    journal: &Journal,
) -> Result<StopReport, StopError> {
    let _reservation = Reservation::take(root, space, who)?;
    let record_path = base::pid_path(root, space);
    let mut pids: Vec<u32> = Vec::new();
    match base::pid_liveness(&record_path) {
        PidLiveness::Alive(pid) | PidLiveness::Unverified(pid) => pids.push(pid),
        PidLiveness::Foreign(pid) => {
            let _ = fs::remove_file(&record_path);
            journal.line(format!(
                "• {who}: {} named pid {pid}, which is now another program - record cleared, nothing signalled",
                record_path.display()
            ));
        }
        PidLiveness::Stale(pid) => {
            let _ = fs::remove_file(&record_path);
            journal.line(format!(
                "• {who}: {} named pid {pid}, which is not running - stale record cleared",
                record_path.display()
            ));
        }
        PidLiveness::Unreadable => {
            let _ = fs::remove_file(&record_path);
        }
        PidLiveness::Absent => {}
    }
    // A replacement `up` launched that has not recorded itself yet.
    let launched_path = base::launched_path(root, space);
    if let Some(pid) = base::read_pid(&launched_path) {
        if let PidLiveness::Alive(p) | PidLiveness::Unverified(p) =
            base::process_liveness(pid, base::argv_names_delivery_daemon)
        {
            if !pids.contains(&p) {
                pids.push(p);
            }
        }
    }
    let own_pid = own.as_ref().and_then(|c| c.id());
    let mut report = StopReport::default();
    let mut survived = false;
    let mut own = own;
    if let Some(child) = own.take() {
        pids.retain(|p| Some(*p) != own_pid);
        if let Some(pid) = own_pid {
            match terminate(Target::Child(child), grace, "delivery daemon", who, journal).await {
                Ended::NotRunning => {}
                Ended::Survived => {
                    survived = true;
                    report.signalled.push(pid);
                }
                _ => report.signalled.push(pid),
            }
        }
    }
    for pid in pids {
        match terminate(Target::Pid(pid), grace, "delivery daemon", who, journal).await {
            Ended::NotRunning => {}
            Ended::Survived => {
                survived = true;
                report.signalled.push(pid);
            }
            _ => report.signalled.push(pid),
        }
    }
    if survived {
        return Err(StopError {
            kind: StopErrorKind::Survived,
            detail: format!(
                "✗ {who}: the delivery daemon for space {space} outlived SIGKILL - its credential is kept"
            ),
        });
    }
    if report.signalled.is_empty() {
        journal.line(format!(
            "• {who}: no delivery daemon running for space {space}"
        ));
        return Ok(report);
    }
    // Death confirmed: a SIGKILLed daemon left its record behind, and the credential goes.
    if base::read_pid(&record_path).is_some_and(|p| report.signalled.contains(&p)) {
        let _ = fs::remove_file(&record_path);
    }
    let _ = fs::remove_file(&launched_path);
    let creds = crate::provision::Workspace::new(root).delivery_creds_path(space);
    if fs::remove_file(&creds).is_ok() {
        report.credential_removed = true;
        journal.line(format!(
            "• {who}: delivery daemon confirmed dead - credential {} removed",
            creds.display()
        ));
    }
    Ok(report)
}

/// Stops the broker `up` started for `root` (`.cotal/nats.pid`), signalling it only while its
/// command line proves it is a `nats-server`; a reused pid is cleared without a signal.
pub async fn stop_recorded_broker(root: &Path, grace: Duration, who: &str, journal: &Journal) {
    let path = base::broker_pid_path(root);
    let Some(pid) = base::read_pid(&path) else {
        journal.line(format!(
            "• {who}: no nats-server recorded at {}",
            path.display()
        ));
        return;
    };
    match base::process_liveness(pid, base::argv_names_nats_server) {
        PidLiveness::Alive(p) | PidLiveness::Unverified(p) => {
            if terminate(Target::Pid(p), grace, "nats-server", who, journal).await
                != Ended::Survived
            {
                let _ = fs::remove_file(&path);
            }
        }
        PidLiveness::Foreign(p) => {
            let _ = fs::remove_file(&path);
            journal.line(format!(
                "• {who}: {} named pid {p}, which is now another program - record cleared, nothing signalled",
                path.display()
            ));
        }
        _ => {
            let _ = fs::remove_file(&path);
            journal.line(format!("• {who}: nats-server is not running"));
        }
    }
}
