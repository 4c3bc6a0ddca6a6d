//! `cotal-delivery remint`: the renewal owner from the command line. One pass re-signs the
//! space's standing credentials into its store and reports each file (`--json`: one object);
//! `--watch` keeps the owner running as its own process (the one a detached `up` leaves),
//! recorded in `.cotal/remint.<key>.pid` and logging to `.cotal/remint.<key>.log`.
//!
//! Why a process of its own: a detached mesh has nobody else to renew it, so it would stop at
//! its credentials' lifetime; and under systemd a timer running the one-shot pass is the
//! renewal owner instead.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use super::renewal::{OwnerEvent, Pass, Reload, RenewalOwner};
use super::stop::{terminate, Ended, Target};
use super::{exit_cause, last_line, open_append, tie_to_up, UpError, UpErrorKind};
use crate::base::{
    self, utc_timestamp, FsStore, Journal, PidLiveness, PidRecord, RemintTarget, SecretStore,
};
use crate::provision::RemintOutcome;
use crate::wire::Space;

/// What `remint` was asked to do.
#[derive(Debug, Clone)]
pub struct RemintConfig {
    pub space: Space,
    /// `--root` (a workspace) or `--store` (an injected directory store).
    pub target: RemintTarget,
    pub server: Option<String>,
    pub tls_ca: Option<PathBuf>,
    pub lifetime: Option<Duration>,
    pub offline: bool,
}

impl RemintConfig {
    fn owner(&self) -> RenewalOwner {
        RenewalOwner::new(&self.space, self.target.clone(), "remint")
            .server(self.server.clone(), self.tls_ca.clone())
            .lifetime(self.lifetime)
            .offline(self.offline)
    }
}

/// Runs one pass.
pub async fn remint_once(cfg: &RemintConfig) -> Pass {
    cfg.owner().pass().await
}

/// Where a file of the pass lives, for the report.
fn locate(cfg: &RemintConfig, key: &str) -> String {
    match &cfg.target {
        RemintTarget::Workspace(root) => FsStore::new(root).locate(key),
        RemintTarget::Dir(dir) => FsStore::at_dir(dir).locate(key),
    }
}

fn exp_text(exp: Option<i64>) -> String {
    match exp {
        Some(e) => utc_timestamp(std::time::UNIX_EPOCH + Duration::from_secs(e.max(0) as u64)),
        None => "never".into(),
    }
}

/// The human report of one pass: what it proved against, each file's outcome, the adoption.
pub fn pass_lines(cfg: &RemintConfig, pass: &Pass) -> Vec<String> {
    let mut lines = Vec::new();
    let signer = pass.report.signer.as_deref().unwrap_or("none");
    let against = match &pass.broker {
        Some(b) => format!("preflight against {} ({})", b.url, b.source),
        None if cfg.offline => "offline: no preflight, only a continuous re-sign is written".into(),
        None => "no preflight".into(),
    };
    lines.push(format!(
        "• remint: space {}: signer {signer}; {against}",
        cfg.space
    ));
    for note in &pass.report.notes {
        lines.push(format!("• remint: {note}"));
    }
    for (key, outcome) in &pass.report.files {
        let file = key.rsplit('/').next().unwrap_or(key);
        let path = locate(cfg, key);
        lines.push(match outcome {
            RemintOutcome::Written { identity, exp } => format!(
                "✓ remint: {file} re-signed at {path} ({identity}, expires {})",
                exp_text(*exp)
            ),
            RemintOutcome::Skipped(why) => format!(
                "✗ remint: {file} not renewed: skipped ({why}: the store holds neither {} nor {})",
                locate(cfg, &crate::base::account_signer_key(&cfg.space)),
                locate(cfg, crate::provision::SIGNER_BUNDLE_KEY)
            ),
            RemintOutcome::Refused(why) => format!("✗ remint: {file} not renewed: {why}"),
        });
    }
    lines.push(match &pass.reload {
        Reload::Adopted => "✓ remint: the daemon adopted the renewal (reloadCreds)".to_string(),
        Reload::Refused(why) => format!(
            "! remint: reloadCreds was refused ({why}); the daemon adopts the renewal at its own 75 % re-read"
        ),
        Reload::Unanswered(why) => format!(
            "! remint: reloadCreds: {why}; the daemon adopts the renewal at its own 75 % re-read"
        ),
        Reload::NotAsked(why) => format!("• remint: reloadCreds not sent ({why})"),
    });
    let renewed = pass
        .report
        .files
        .iter()
        .filter(|(_, o)| matches!(o, RemintOutcome::Written { .. }))
        .count();
    lines.push(format!(
        "remint: {renewed} of {} renewed",
        pass.report.files.len()
    ));
    lines
}

/// The `--json` report of one pass.
pub fn pass_json(cfg: &RemintConfig, pass: &Pass) -> Value {
    let files: Vec<Value> = pass
        .report
        .files
        .iter()
        .map(|(key, outcome)| {
            let file = key.rsplit('/').next().unwrap_or(key);
            let path = locate(cfg, key);
            match outcome {
                RemintOutcome::Written { identity, exp } => json!({
                    "file": file, "path": path, "renewed": true, "identity": identity, "exp": exp,
                }),
                RemintOutcome::Skipped(why) => json!({
                    "file": file, "path": path, "renewed": false, "skipped": why,
                }),
                RemintOutcome::Refused(why) => json!({
                    "file": file, "path": path, "renewed": false, "refused": why,
                }),
            }
        })
        .collect();
    let reload = match &pass.reload {
        Reload::Adopted => json!({"sent": true, "adopted": true}),
        Reload::Refused(why) => json!({"sent": true, "adopted": false, "refused": why}),
        Reload::Unanswered(why) => json!({"sent": true, "adopted": false, "unanswered": why}),
        Reload::NotAsked(why) => json!({"sent": false, "why": why}),
    };
    let (place, dir) = match &cfg.target {
        RemintTarget::Workspace(root) => ("root", root),
        RemintTarget::Dir(dir) => ("store", dir),
    };
    let mut v = json!({
        "space": cfg.space.as_str(),
        "preflight": pass.broker.as_ref().map(|b| json!({"server": b.url, "source": b.source})),
        "offline": cfg.offline,
        "signer": pass.report.signer,
        "notes": pass.report.notes,
        "files": files,
        "reload": reload,
        "renewed": pass.renewed(),
    });
    v[place] = json!(dir);
    v
}

/// How a `remint --watch` ended.
#[derive(Debug)]
pub enum WatchEnded {
    /// Stopped by this signal; its record removed.
    Stopped(&'static str),
    /// Refused at start: another live renewal owner is recorded, or the record could not be
    /// written, or the signals could not be installed (the line says which).
    Refused(String),
}

/// A finished `remint --watch`: how it ended, and its log, for the run's last line.
pub struct WatchRun {
    pub ended: WatchEnded,
    journal: Journal,
}

impl WatchRun {
    /// Writes the run's last line: the exit code and its reason (the daemon's convention).
    pub fn close(&self, code: i32) {
        let reason = match &self.ended {
            WatchEnded::Stopped(by) => format!("stopped by {by}"),
            WatchEnded::Refused(line) => line.trim_start_matches("✗ remint: ").to_string(),
        };
        self.journal.file_line(format!(
            "• remint: run ended — exit code {code}: {reason} (pid {})",
            std::process::id()
        ));
    }
}

/// When this process's stderr is the owner's log (`up` redirected it there), stamps every line
/// written to it, as the daemon's does; the redirect stands until the value is dropped.
pub fn stamp_stderr(cfg: &RemintConfig) -> Option<crate::base::StampedStderr> {
    let RemintTarget::Workspace(root) = &cfg.target else {
        return None;
    };
    let path = base::remint_log_path(root, &cfg.space);
    if !base::stderr_is_path(&path) {
        return None;
    }
    crate::base::StampedStderr::install(&path).ok()
}

/// `remint --watch` for a workspace root: records itself, logs to `.cotal/remint.<key>.log`
/// (each run framed by a first and a last line, every line stamped), re-signs at half of the
/// credentials' lifetime until SIGTERM/SIGINT (SIGHUP: re-sign now).
pub async fn remint_watch(cfg: &RemintConfig) -> WatchRun {
    let journal = Journal::stderr_only();
    let ended = watch(cfg, &journal).await;
    WatchRun { ended, journal }
}

async fn watch(cfg: &RemintConfig, journal: &Journal) -> WatchEnded {
    let RemintTarget::Workspace(root) = &cfg.target else {
        return WatchEnded::Refused("✗ remint: --watch serves a workspace root (--root)".into());
    };
    let space = &cfg.space;
    match base::open_log(&base::remint_log_path(root, space)) {
        // Stderr is the log: lines reach it through stderr, stamped (`stamp_stderr`).
        Ok(_) if crate::base::stderr_is_stamped() => {}
        Ok(Some(f)) => journal.attach_file(f),
        Ok(None) => {}
        Err(e) => journal.line(format!("! remint: {e}")),
    }
    let owner = cfg.owner();
    let me = std::process::id();
    let broker = match owner.broker() {
        Ok(b) => format!("{} ({})", b.url, b.source),
        Err(e) => format!("unresolved ({e})"),
    };
    journal.file_line(format!(
        "• remint: run started — cotal-delivery {} (build {}), pid {me}, space {space}, root {}, broker {broker}",
        env!("CARGO_PKG_VERSION"),
        crate::BUILD_ID,
        root.display()
    ));
    let record_path = base::remint_pid_path(root, space);
    let recorded = base::pid_liveness_of(&record_path, base::argv_names_renewal_owner);
    if let Some(pid) = recorded.daemon_pid().filter(|p| *p != me) {
        let line = format!(
            "✗ remint: a renewal owner already runs for space {space} (pid {pid}, {}) - not starting another",
            record_path.display()
        );
        journal.line(&line);
        return WatchEnded::Refused(line);
    }
    let (tx, mut events) = mpsc::channel(4);
    let log = base::remint_log_path(root, space);
    if let Err(e) = install_signals(tx, journal.clone(), log) {
        let line = format!("✗ remint: could not watch its signals: {e}");
        journal.line(&line);
        return WatchEnded::Refused(line);
    }
    let record = match PidRecord::write(record_path, me) {
        Ok(r) => r,
        Err(e) => {
            let line = format!("✗ remint: {e}");
            journal.line(&line);
            return WatchEnded::Refused(line);
        }
    };
    journal.line(format!(
        "✓ remint: renewal owner of space {space} running (pid {me}); it re-signs the standing credentials at half their lifetime"
    ));
    let by = owner.watch(journal, &mut events).await;
    journal.line(format!("• remint: received {by}, exiting (space {space})"));
    journal.flush_repeats();
    record.remove();
    WatchEnded::Stopped(by)
}

/// SIGTERM/SIGINT stop the owner; SIGHUP makes it re-sign now; SIGUSR1 reopens its log at `log`
/// (logrotate), the stamped stderr when stderr is the log, as the daemon does.
fn install_signals(
    tx: mpsc::Sender<OwnerEvent>,
    journal: Journal,
    log: PathBuf,
) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                _ = term.recv() => OwnerEvent::Stop("SIGTERM"),
                _ = int.recv() => OwnerEvent::Stop("SIGINT"),
                _ = hup.recv() => OwnerEvent::RenewNow,
                _ = usr1.recv() => {
                    let reopened = match crate::base::reopen_stamped() {
                        Some(r) => r.map(|_| true),
                        None => journal.reopen(&log),
                    };
                    match reopened {
                        Ok(_) => journal.line(format!(
                            "• remint: received SIGUSR1, reopened the log {}",
                            log.display()
                        )),
                        Err(e) => journal.line(format!(
                            "! remint: received SIGUSR1 but could not reopen {} ({e}); lines go on to the file it had open",
                            log.display()
                        )),
                    }
                    continue;
                }
            };
            // A renewal already asked for is enough; a stop is never dropped (room for 4).
            let _ = tx.try_send(event);
        }
    });
    Ok(())
}

/// How long `up` waits for a renewal owner it launched to record itself.
const OWNER_READY_BOUND: Duration = Duration::from_secs(10);
/// Poll period of that wait.
const OWNER_POLL: Duration = Duration::from_millis(50);

/// The renewal owner of a detached mesh: relaunched when none runs, named when one does.
/// `relaunch` says so in the line (a bare `up`); `Err` is the operator's line.
pub(super) async fn ensure_renewal_owner(
    root: &Path,
    space: &Space,
    relaunch: bool,
    journal: &Journal,
) -> Result<(), UpError> {
    let record = base::remint_pid_path(root, space);
    if let Some(pid) = base::pid_liveness_of(&record, base::argv_names_renewal_owner).daemon_pid() {
        journal.line(format!(
            "✓ renewal owner already running for space {space} (pid {pid})"
        ));
        return Ok(());
    }
    if relaunch {
        journal.line(format!(
            "• relaunching the missing renewal owner for space {space}"
        ));
    }
    let pid = launch_renewal_owner(root, space).await?;
    journal.line(format!(
        "✓ renewal owner running for space {space} (pid {pid}, log {}): it re-signs the standing credentials at half their lifetime",
        base::remint_log_path(root, space).display()
    ));
    Ok(())
}

/// Starts `remint --watch` in its own process group (it outlives `up`), its stdout and stderr
/// on `.cotal/remint.<key>.log`, and waits (bounded) until it has recorded itself.
async fn launch_renewal_owner(root: &Path, space: &Space) -> Result<u32, UpError> {
    let exe = std::env::current_exe()
        .map_err(|e| UpError::new(UpErrorKind::Files, format!("✗ up: {e}")))?;
    let log_path = base::remint_log_path(root, space);
    let log = open_append(&log_path)?;
    let mut cmd = Command::new(exe);
    tie_to_up(&mut cmd, true);
    cmd.args(["remint", "--watch", "--space", space.as_str(), "--root"])
        .arg(root)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::from(
            log.try_clone()
                .map_err(|e| UpError::new(UpErrorKind::Files, e.to_string()))?,
        ))
        .stderr(Stdio::from(log));
    let mut child = cmd.spawn().map_err(|e| {
        UpError::new(
            UpErrorKind::Renewal,
            format!("✗ up: could not start the renewal owner: {e}"),
        )
    })?;
    let pid = child.id().unwrap_or(0);
    let record = base::remint_pid_path(root, space);
    let deadline = Instant::now() + OWNER_READY_BOUND;
    loop {
        if base::read_pid(&record) == Some(pid) {
            return Ok(pid);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let last = last_line(&log_path).unwrap_or_else(|| "no output".into());
            return Err(UpError::new(
                UpErrorKind::Renewal,
                format!(
                    "✗ up: the renewal owner exited ({}) before it ran: {last}",
                    exit_cause(&status)
                ),
            ));
        }
        if Instant::now() > deadline {
            return Err(UpError::new(
                UpErrorKind::Renewal,
                format!(
                    "✗ up: the renewal owner (pid {pid}) did not record itself within {} s; see {}",
                    OWNER_READY_BOUND.as_secs(),
                    log_path.display()
                ),
            ));
        }
        tokio::time::sleep(OWNER_POLL).await;
    }
}

/// Stops the space's renewal owner for `down`: a `remint --watch` the record proves is
/// signalled (SIGTERM, SIGKILL after the grace); a foreground `up` running it is left (it ends
/// with its broker); a stale or foreign record is cleared.
pub(super) async fn stop_renewal_owner(
    root: &Path,
    space: &Space,
    grace: Duration,
    who: &str,
    journal: &Journal,
) {
    let path = base::remint_pid_path(root, space);
    match base::pid_liveness_of(&path, base::argv_names_renewal_owner) {
        PidLiveness::Alive(pid) | PidLiveness::Unverified(pid) => {
            let is_remint =
                base::process_argv(pid).is_none_or(|argv| base::argv_names_remint_watch(&argv));
            if !is_remint {
                journal.line(format!(
                    "• {who}: the renewal owner is the foreground up (pid {pid}); it stops with it"
                ));
                return;
            }
            if terminate(Target::Pid(pid), grace, "renewal owner", who, journal).await
                != Ended::Survived
            {
                // A SIGKILLed owner left its record behind.
                if base::read_pid(&path) == Some(pid) {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        PidLiveness::Stale(pid) => {
            let _ = std::fs::remove_file(&path);
            journal.line(format!(
                "• {who}: {} named pid {pid}, which is not running - stale record cleared",
                path.display()
            ));
        }
        PidLiveness::Foreign(pid) => {
            let _ = std::fs::remove_file(&path);
            journal.line(format!(
                "• {who}: {} named pid {pid}, which is now another program - record cleared, nothing signalled",
                path.display()
            ));
        }
        PidLiveness::Unreadable => {
            let _ = std::fs::remove_file(&path);
        }
        PidLiveness::Absent => {}
    }
}
