//! `cotal-delivery remint`: the renewal owner from the command line. One pass re-signs the
//! space's standing credentials into its store and reports each file (`--json`: one object);
//! `--watch` keeps the owner running as its own process (the one a detached `up` leaves),
//! recorded in `.cotal/remint.<key>.pid` and logging to `.cotal/remint.<key>.log`.
//!
//! Why a process of its own: a detached mesh has nobody else to renew it, so it would stop at
//! its credentials' lifetime; and under systemd a timer running the one-shot pass is the
//! renewal owner instead.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use super::renewal::{OwnerEvent, Pass, Reload, RenewalOwner};
use crate::files::{self, PidRecord};
use crate::journal::{utc_timestamp, Journal};
use crate::provision::RemintOutcome;
use crate::store::{FsStore, RemintTarget, SecretStore};
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
                locate(cfg, &crate::store::account_signer_key(&cfg.space)),
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
    /// Stopped by a signal; its record removed.
    Stopped,
    /// Refused at start: another live renewal owner is recorded, or the record could not be
    /// written, or the signals could not be installed (the line says which).
    Refused(String),
}

/// `remint --watch` for a workspace root: records itself, logs to `.cotal/remint.<key>.log`,
/// re-signs at half of the credentials' lifetime until SIGTERM/SIGINT (SIGHUP: re-sign now).
pub async fn remint_watch(cfg: &RemintConfig) -> WatchEnded {
    let journal = Journal::stderr_only();
    let RemintTarget::Workspace(root) = &cfg.target else {
        return WatchEnded::Refused("✗ remint: --watch serves a workspace root (--root)".into());
    };
    let space = &cfg.space;
    let record_path = files::remint_pid_path(root, space);
    let me = std::process::id();
    let recorded = files::pid_liveness_of(&record_path, files::argv_names_renewal_owner);
    if let Some(pid) = recorded.daemon_pid().filter(|p| *p != me) {
        return WatchEnded::Refused(format!(
            "✗ remint: a renewal owner already runs for space {space} (pid {pid}, {}) - not starting another",
            record_path.display()
        ));
    }
    let (tx, mut events) = mpsc::channel(4);
    if let Err(e) = install_signals(tx) {
        return WatchEnded::Refused(format!("✗ remint: could not watch its signals: {e}"));
    }
    let record = match PidRecord::write(record_path, me) {
        Ok(r) => r,
        Err(e) => return WatchEnded::Refused(format!("✗ remint: {e}")),
    };
    match files::open_log(&files::remint_log_path(root, space)) {
        Ok(Some(f)) => journal.attach_file(f),
        Ok(None) => {}
        Err(e) => journal.line(format!("! remint: {e}")),
    }
    let owner = cfg.owner();
    let broker = match owner.broker() {
        Ok(b) => format!("{} ({})", b.url, b.source),
        Err(e) => format!("unresolved ({e})"),
    };
    journal.line(format!(
        "• remint: renewal owner of space {space} started (cotal-delivery {}, build {}, pid {me}, root {}, broker {broker})",
        env!("CARGO_PKG_VERSION"),
        crate::BUILD_ID,
        root.display()
    ));
    let by = owner.watch(&journal, &mut events).await;
    journal.line(format!("• remint: received {by}, exiting (space {space})"));
    journal.flush_repeats();
    record.remove();
    journal.line(format!(
        "• remint: renewal owner of space {space} exited (code 0: stopped by {by})"
    ));
    WatchEnded::Stopped
}

/// SIGTERM/SIGINT stop the owner; SIGHUP makes it re-sign now.
fn install_signals(tx: mpsc::Sender<OwnerEvent>) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                _ = term.recv() => OwnerEvent::Stop("SIGTERM"),
                _ = int.recv() => OwnerEvent::Stop("SIGINT"),
                _ = hup.recv() => OwnerEvent::RenewNow,
            };
            // A renewal already asked for is enough; a stop is never dropped (room for 4).
            let _ = tx.try_send(event);
        }
    });
    Ok(())
}
