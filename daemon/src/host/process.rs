//! The `deliver --space` host: one space's daemon as its own process.
//!
//! Why apart from [`SpaceDaemon`]: the workspace root, the log file, the pid record, the
//! process's signals and the hard-exit grace are concerns of a process that serves one space.
//! A multi-space host's lanes and an embedded `start_delivery_service` have none of them, so
//! they live here, around the value, and the way out is handed to `cli.rs` as a typed
//! [`Ended`] (the exit code is chosen there).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::base::{
    self, delivery_creds_key, read_creds_file, Credential, CredsErrorKind, CredsFileStore, FsStore,
    Journal, PidRecord, SecretStore, Tuning, DEFAULT_SERVER,
};
use crate::space::RELEASE_REDIAL_BOUND;
use crate::space::{Closed, SpaceConfig, SpaceDaemon, StartError, StartErrorKind};
use crate::space::{Verdict, HARD_EXIT_GRACE};
use crate::wire::Space;

/// Everything `deliver` is started with.
#[derive(Debug, Clone)]
pub struct DeliverConfig {
    pub space: Space,
    pub server: String,
    pub root: Option<PathBuf>,
    pub creds: Option<PathBuf>,
    /// An injected directory store (`--store`): the credential, its renewals and the `$SYS`
    /// pair are read from it, and no workspace root is resolved.
    pub store: Option<PathBuf>,
    pub tls: bool,
    pub tls_ca: Option<PathBuf>,
    pub cwd: PathBuf,
    /// The process's timing, read from the environment once by the command line.
    pub tuning: Tuning,
    /// This space's metrics handle (served when `--metrics-addr` is given).
    pub metrics: crate::base::Metrics,
    /// The line that says which broker the registry decided on (`base::resolve_dial`),
    /// written once the log is open, after the run's first line.
    pub banner: Option<String>,
}

impl DeliverConfig {
    pub fn new(space: Space, cwd: PathBuf) -> DeliverConfig {
        DeliverConfig {
            space,
            server: DEFAULT_SERVER.into(),
            root: None,
            creds: None,
            store: None,
            tls: false,
            tls_ca: None,
            cwd,
            tuning: Tuning::default(),
            metrics: crate::base::Metrics::default(),
            banner: None,
        }
    }

    fn say_banner(&self, journal: &Journal) {
        if let Some(b) = &self.banner {
            journal.line(b);
        }
    }
}

/// How a `deliver` process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The start refused (what it opened is closed, a won claim released).
    Refused(StartError),
    /// The daemon ran and closed.
    Closed(Closed),
    /// A transport verdict was reached and the daemon did not close within
    /// [`HARD_EXIT_GRACE`]: the process ends anyway.
    Abandoned(Verdict),
}

impl Ended {
    /// What ended the run, in the words of its last log line.
    pub fn reason(&self) -> String {
        match self {
            Ended::Refused(e) => format!("refused at start: {e}"),
            Ended::Closed(c) => c.to_string(),
            Ended::Abandoned(v) => format!(
                "{} (the daemon did not close within {} ms of the verdict)",
                v.line().trim_start_matches("✗ "),
                HARD_EXIT_GRACE.as_millis()
            ),
        }
    }
}

/// A finished `deliver` run: how it ended, and the log its last line goes to once the exit
/// code is chosen (by `cli.rs`).
pub struct Run {
    pub ended: Ended,
    journal: Journal,
}

impl Run {
    /// Writes the run's last line: the exit code and its reason.
    pub fn close(&self, code: i32) {
        self.journal.file_line(format!(
            "• delivery: run ended — exit code {code}: {} (pid {})",
            self.ended.reason(),
            std::process::id()
        ));
    }
}

/// When this process's stderr is the space's log (`up` redirected it there), stamps every line
/// written to it, the journal's and any other (a `RUST_LOG` diagnostic, a panic): the redirect
/// stands until the returned value is dropped. Installed before anything is written.
pub fn stamp_stderr(
    space: &Space,
    root_flag: Option<&Path>,
    cwd: &Path,
) -> Option<crate::base::StampedStderr> {
    let root = base::resolve_root(root_flag, cwd).ok()?;
    let path = base::log_path(&root, space);
    if !base::stderr_is_path(&path) {
        return None;
    }
    crate::base::StampedStderr::install(&path).ok()
}

/// The run's first log line: what runs, as which process, for which space, root and broker.
fn run_started(cfg: &DeliverConfig, root: &Path) -> String {
    format!(
        "• delivery: run started — cotal-delivery {} (build {}), pid {}, space {}, root {}, broker {}",
        env!("CARGO_PKG_VERSION"),
        crate::BUILD_ID,
        std::process::id(),
        cfg.space,
        root.display(),
        cfg.server
    )
}

/// Where the credential comes from, and the store its renewals are re-read from.
struct Source {
    credential: Credential,
    store: Arc<dyn SecretStore>,
    sys_store: Arc<dyn SecretStore>,
    sweeps_bound_to: String,
    /// `.cotal/` of the workspace served, when there is one (pid record, log file).
    root: Option<PathBuf>,
}

fn refused(journal: &Journal, text: String) -> Ended {
    journal.line(format!("✗ {text}"));
    Ended::Refused(StartError::new(StartErrorKind::Config, text))
}

/// The injected directory store of `--store`: no workspace root, no `.cotal/`.
fn injected_source(journal: &Journal, dir: &Path, cfg: &DeliverConfig) -> Result<Source, Ended> {
    cfg.say_banner(journal);
    let dir = base::absolute(dir, &cfg.cwd);
    let store: Arc<dyn SecretStore> = Arc::new(FsStore::at_dir(&dir));
    let identity = store
        .identity()
        .map_err(|e| refused(journal, format!("delivery: --store {}: {e}", dir.display())))?;
    let key = delivery_creds_key(&cfg.space);
    let credential = match store.get(&key) {
        Ok(Some(text)) => Credential::parse(&text).map_err(|e| {
            refused(
                journal,
                format!("delivery: {} does not hold a usable credential ({})", store.locate(&key), e.detail()),
            )
        })?,
        Ok(None) => {
            return Err(refused(
                journal,
                format!(
                    "delivery: no scoped creds at {}. Put the space's delivery credential into the store or pass --creds <file>",
                    store.locate(&key)
                ),
            ))
        }
        Err(e) => return Err(refused(journal, format!("delivery: {e}"))),
    };
    Ok(Source {
        credential,
        sys_store: store.clone(),
        store,
        sweeps_bound_to: identity.to_string(),
        root: None,
    })
}

/// The workspace (root, `--creds` or the canonical file), as `deliver` always resolved it.
fn workspace_source(journal: &Journal, cfg: &DeliverConfig) -> Result<Source, Ended> {
    let space = &cfg.space;
    // The workspace root, before any credential is read or any broker dialed.
    let root = base::resolve_root(cfg.root.as_deref(), &cfg.cwd).map_err(|e| {
        cfg.say_banner(journal);
        journal.line(format!("✗ {e}"));
        Ended::Refused(StartError::new(StartErrorKind::Config, e.to_string()))
    })?;
    match base::open_log(&base::log_path(&root, space)) {
        // Stderr is the log: lines reach it through stderr, stamped (`stamp_stderr`).
        Ok(_) if crate::base::stderr_is_stamped() => {}
        Ok(Some(f)) => journal.attach_file(f),
        Ok(None) => {}
        Err(e) => journal.line(format!("! {e}")),
    }
    journal.file_line(run_started(cfg, &root));
    cfg.say_banner(journal);
    if let Some(creds) = &cfg.creds {
        if let Err(e) = base::check_creds_root(creds, &root, &cfg.cwd) {
            journal.line(format!("✗ {e}"));
            return Err(Ended::Refused(StartError::new(
                StartErrorKind::Config,
                e.to_string(),
            )));
        }
    }
    let creds_path = cfg
        .creds
        .as_ref()
        .map(|p| base::absolute(p, &cfg.cwd))
        .unwrap_or_else(|| {
            root.join(base::COTAL_DIR)
                .join(space.segment())
                .join("delivery.creds")
        });
    // The source renewals are re-read from: the workspace store, or the --creds file (checked
    // before it is read: a store identity file under any name is refused as such).
    let workspace: Arc<dyn SecretStore> = Arc::new(FsStore::new(root.clone()));
    let store: Arc<dyn SecretStore> = match &cfg.creds {
        None => workspace.clone(),
        Some(_) => match CredsFileStore::new(creds_path.clone(), space.clone()) {
            Ok(s) => Arc::new(s),
            Err(e) => return Err(refused(journal, format!("delivery: {e}"))),
        },
    };
    let credential = match read_creds_file(&creds_path) {
        Ok(c) => c,
        Err(e) if e.kind() == CredsErrorKind::Io && !creds_path.exists() => {
            return Err(refused(journal, format!(
                "delivery: no scoped creds at {}. Provision the space (cotal-delivery up) or pass --creds <file>",
                creds_path.display()
            )))
        }
        Err(e) => return Err(refused(journal, format!("delivery: {e}"))),
    };
    Ok(Source {
        credential,
        store,
        sys_store: workspace,
        sweeps_bound_to: format!("{}/{}", root.display(), base::COTAL_DIR),
        root: Some(root),
    })
}

/// Runs one space's daemon as this process: resolve the inputs, start, record the pid while
/// serving, and wait for the end (giving a transport verdict [`HARD_EXIT_GRACE`] to close).
pub async fn run(cfg: DeliverConfig) -> Run {
    let journal = Journal::with_repeat_window(cfg.tuning.log_repeat_window);
    let ended = serve(cfg, &journal).await;
    Run { ended, journal }
}

async fn serve(cfg: DeliverConfig, journal: &Journal) -> Ended {
    let journal = journal.clone();
    let signals = match crate::host::signal::install() {
        Ok(s) => s,
        Err(e) => {
            let text = format!("delivery: could not install signal handlers ({e})");
            journal.line(format!("✗ {text}"));
            return Ended::Refused(StartError::new(StartErrorKind::Fault, text));
        }
    };
    let source = match &cfg.store {
        Some(dir) => injected_source(&journal, dir, &cfg),
        None => workspace_source(&journal, &cfg),
    };
    let source = match source {
        Ok(s) => s,
        Err(ended) => return ended,
    };
    let mut space_cfg = SpaceConfig::new(
        cfg.space.clone(),
        cfg.server.clone(),
        source.credential,
        source.store,
    );
    space_cfg.sys_store = source.sys_store;
    space_cfg.sweeps_bound_to = source.sweeps_bound_to;
    if let Some(root) = &source.root {
        // The pid record this daemon writes is what `down` signals.
        space_cfg.stop_with = format!(
            "cotal-delivery down --space {} --root {}",
            cfg.space,
            root.display()
        );
    }
    space_cfg.tls = cfg.tls;
    space_cfg.tls_ca = cfg.tls_ca.clone();
    space_cfg.tuning = cfg.tuning.clone();
    space_cfg.redial_wait = RELEASE_REDIAL_BOUND;
    space_cfg.journal = journal.clone();
    space_cfg.metrics = cfg.metrics.clone();
    space_cfg.reread = signals.reread.clone();
    let log = source.root.as_ref().map(|r| base::log_path(r, &cfg.space));
    let reopen = crate::host::signal::reopen_on_usr1(&signals, journal.clone(), log, "delivery");

    // It is the space's daemon once its claim won: record it (a workspace process only).
    let pid_record = Arc::new(Mutex::new(None::<PidRecord>));
    if let Some(root) = source.root.clone() {
        let (slot, journal, space) = (pid_record.clone(), journal.clone(), cfg.space.clone());
        space_cfg.on_lease_won = Some(Arc::new(move || {
            match PidRecord::write(base::pid_path(&root, &space), std::process::id()) {
                Ok(r) => *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(r),
                Err(e) => journal.line(format!("! {e}")),
            }
        }));
    }
    let remove_record = || {
        if let Some(p) = pid_record.lock().unwrap_or_else(|p| p.into_inner()).take() {
            p.remove();
        }
    };
    let daemon = match SpaceDaemon::start(space_cfg, signals.stop.clone()).await {
        Ok(d) => d,
        Err(e) => {
            reopen.abort();
            remove_record();
            return Ended::Refused(e);
        }
    };
    let ended = tokio::select! {
        closed = daemon.closed() => Ended::Closed(closed),
        verdict = daemon.verdict() => {
            match tokio::time::timeout(HARD_EXIT_GRACE, daemon.closed()).await {
                Ok(closed) => Ended::Closed(closed),
                Err(_) => {
                    journal.line(format!(
                        "! delivery: the run loop did not exit within {} ms of the verdict; exiting now",
                        HARD_EXIT_GRACE.as_millis()
                    ));
                    Ended::Abandoned(verdict)
                }
            }
        }
    };
    reopen.abort();
    // Counts still held are said, also when the daemon was abandoned without closing.
    journal.flush_repeats();
    remove_record();
    ended
}
