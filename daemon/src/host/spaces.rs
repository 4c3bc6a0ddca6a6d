//! `deliver --spaces`: one process serving every space its manifest names, one lane per space
//! (`lane.rs`).
//!
//! Why a ring of its own: a lane is a [`crate::space::SpaceDaemon`] and must close alone, so
//! the process concerns (the manifest, the host's pid record and log, the signals, the exit)
//! live here, above `space/`, and reach `cli.rs` as a typed [`HostEnded`]. A malformed manifest
//! refuses the whole start before any dial; after that no lane's fault ends the host, only
//! SIGTERM/SIGINT does (every lane then releases its own row). See `docs/host.md`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::lane::LaneInputs;
use crate::base::{self, Journal, PidLiveness, PidRecord};
use crate::provision::{manifest_path, Manifest, ManifestError};

/// How long the host waits for its lanes to close after a signal. Each lane's close is bounded
/// on its own (the release, the redial wait); this only keeps a wedged lane from holding the
/// exit forever.
pub const HOST_CLOSE_BOUND: Duration = Duration::from_secs(30);

/// A host's argv carries the `deliver` verb and the `--spaces` flag.
pub fn argv_names_host(argv: &[String]) -> bool {
    argv.iter().skip(1).any(|a| a == "deliver") && argv.iter().any(|a| a == "--spaces")
}

/// What the host's record proves (the same rules as a space daemon's record).
pub fn host_liveness(root: &Path) -> PidLiveness {
    base::pid_liveness_of(&base::host_pid_path(root), argv_names_host)
}

/// Everything `deliver --spaces` is started with.
#[derive(Clone)]
pub struct HostConfig {
    pub root: PathBuf,
    pub cwd: PathBuf,
    pub lanes: LaneInputs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostErrorKind {
    /// `--root` holds no `.cotal/`.
    Root,
    /// The manifest is missing or malformed.
    Manifest,
    /// The signal handlers could not be installed.
    Fault,
}

/// Why the host refused to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostError {
    kind: HostErrorKind,
    detail: String,
}

impl HostError {
    pub fn kind(&self) -> HostErrorKind {
        self.kind
    }
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for HostError {}

/// How the host ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEnded {
    /// Refused before any lane opened (nothing dialed).
    Refused(HostError),
    /// Stopped by a signal; `closed_all` says whether every lane closed within the bound.
    Stopped { by: &'static str, closed_all: bool },
}

impl HostEnded {
    /// What ended the host, in the words of its last log line.
    pub fn reason(&self) -> String {
        match self {
            HostEnded::Refused(e) => format!("refused at start: {e}"),
            HostEnded::Stopped {
                by,
                closed_all: true,
            } => format!("stopped by {by}; every lane closed"),
            HostEnded::Stopped {
                by,
                closed_all: false,
            } => format!("stopped by {by}; a lane did not close in time"),
        }
    }
}

/// A finished host: how it ended, and the log its last line goes to once the exit code is
/// chosen (by `cli.rs`).
pub struct HostRun {
    pub ended: HostEnded,
    journal: Journal,
}

impl HostRun {
    /// Writes the host's last line: the exit code and its reason.
    pub fn close(&self, code: i32) {
        self.journal.file_line(format!(
            "• delivery host: run ended — exit code {code}: {} (pid {})",
            self.ended.reason(),
            std::process::id()
        ));
    }
}

fn refused(journal: &Journal, kind: HostErrorKind, detail: String) -> HostEnded {
    journal.line(format!("✗ {detail}"));
    HostEnded::Refused(HostError { kind, detail })
}

/// Runs the host: the manifest, then one lane per space until SIGTERM/SIGINT.
pub async fn run(cfg: HostConfig) -> HostRun {
    let journal = Journal::with_repeat_window(cfg.lanes.tuning.log_repeat_window);
    let ended = serve(cfg, &journal).await;
    HostRun { ended, journal }
}

async fn serve(cfg: HostConfig, journal: &Journal) -> HostEnded {
    let journal = journal.clone();
    let signals = match crate::host::signal::install() {
        Ok(s) => s,
        Err(e) => {
            let text = format!("delivery host: could not install signal handlers ({e})");
            return refused(&journal, HostErrorKind::Fault, text);
        }
    };
    let root = match base::resolve_root(Some(&cfg.root), &cfg.cwd) {
        Ok(r) => r,
        Err(e) => return refused(&journal, HostErrorKind::Root, e.to_string()),
    };
    // The whole start is refused on a malformed manifest, before any lane dials.
    let path = manifest_path(&root);
    let manifest = match Manifest::read(&path) {
        Ok(m) => m,
        Err(e) => return refused(&journal, HostErrorKind::Manifest, manifest_line(&e)),
    };
    match base::open_log(&base::host_log_path(&root)) {
        Ok(Some(f)) => journal.attach_file(f),
        Ok(None) => {}
        Err(e) => journal.line(format!("! {e}")),
    }
    journal.file_line(format!(
        "• delivery host: run started — cotal-delivery {} (build {}), pid {}, root {}, broker {}, spaces {}",
        env!("CARGO_PKG_VERSION"),
        crate::BUILD_ID,
        std::process::id(),
        root.display(),
        cfg.lanes.server,
        manifest
            .spaces
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let record = match PidRecord::write(base::host_pid_path(&root), std::process::id()) {
        Ok(r) => Some(r),
        Err(e) => {
            journal.line(format!("! {e}"));
            None
        }
    };
    let names: Vec<&str> = manifest.spaces.iter().map(|s| s.as_str()).collect();
    journal.line(format!(
        "• delivery host: {} lane(s) from {}: {}",
        names.len(),
        path.display(),
        names.join(", ")
    ));
    let mut inputs = cfg.lanes.clone();
    inputs.root = root.clone();
    // The host is the only kicker of its lanes (docs/host.md, "Kicks").
    let kicker = super::kicker::HostKicker::with_limits(
        root.clone(),
        manifest.spaces.clone(),
        inputs.server.clone(),
        inputs.tls_ca.clone(),
        crate::base::SweepLimits::of(&inputs.tuning),
    );
    let inputs = Arc::new(inputs);
    let lanes: Vec<_> = manifest
        .spaces
        .iter()
        .map(|space| {
            let lane = super::lane::run(
                space.clone(),
                inputs.clone(),
                signals.clone(),
                kicker.clone(),
            );
            tokio::spawn(lane)
        })
        .collect();
    let reopen = crate::host::signal::reopen_on_usr1(
        &signals,
        journal.clone(),
        Some(base::host_log_path(&root)),
        "delivery host",
    );
    let by = signals.stop.clone().stopped().await;
    reopen.abort();
    journal.line(format!(
        "• delivery host: received {by}, closing {} lane(s)",
        lanes.len()
    ));
    let closed_all = tokio::time::timeout(HOST_CLOSE_BOUND, futures::future::join_all(lanes))
        .await
        .is_ok();
    if closed_all {
        journal.line("• delivery host: every lane closed, exiting");
    } else {
        journal.line(format!(
            "! delivery host: a lane did not close within {} ms; exiting anyway",
            HOST_CLOSE_BOUND.as_millis()
        ));
    }
    if let Some(r) = record {
        r.remove();
    }
    HostEnded::Stopped { by, closed_all }
}

fn manifest_line(e: &ManifestError) -> String {
    format!("delivery host: {e}. No lane started.")
}
