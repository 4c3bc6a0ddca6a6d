//! `cotal-delivery up`: a local authenticated mesh, in the foreground or detached.
//!
//! It provisions through the same code path as the harness (signer in `.cotal/auth/`, the
//! space's streams and buckets, the daemon's credentials), starts `nats-server` in operator
//! mode, starts the delivery daemon beside it, and reports the daemon only once it is actually
//! serving: its lease row reads `ready` under the daemon's own holder. A daemon that exits
//! without serving is reported with its own last words and `up` exits non-zero.
//!
//! Foreground (`supervise.rs`): a daemon that dies while the broker runs is restarted; one that
//! exits cleanly, on SIGTERM/SIGINT, or under `down` stays stopped; Ctrl-C and a broker that
//! exits stop the daemon with the stop `down` uses (`stop.rs`). Detached: both processes outlive
//! `up`, which restarts nothing. A bare `up` on a running mesh relaunches a missing daemon with
//! the mesh's transport. `up` records the mesh in `.cotal/mesh.json` and in the machine's mesh
//! registry (`$COTAL_HOME/meshes/space.<key>.json`).

mod demo;
mod down;
mod foreground;
mod remint;
mod renewal;
mod status;
mod stop;

pub(crate) use demo::offline_member_receives;
pub use demo::{DemoError, DemoErrorKind};
pub(crate) use down::down;
pub(crate) use remint::{
    pass_json, pass_lines, remint_once, remint_watch, stamp_stderr as stamp_remint_stderr,
    RemintConfig, WatchEnded,
};
pub use renewal::{
    AdminRequestError, AdminRequestErrorKind, OwnerBrokerError, OwnerBrokerErrorKind,
};
pub(crate) use status::{status, StatusReport};

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::base::{self, read_creds_file, Journal, MeshRecord, PidLiveness, Read, Rows};
use crate::provision::{
    self, MeshAuthority, MintOptions, Profile, ProvisionOptions, ServerConf, SpaceMaterial,
    TlsFiles, Workspace,
};
use crate::wire::LeaseInfo;
use crate::wire::{Principal, Space, SpaceNames, LEASE_KEY};

/// How long `up` waits for the broker's ports file.
const BROKER_READY_BOUND: Duration = Duration::from_secs(20);
/// Poll period of the bounded waits.
const POLL: Duration = Duration::from_millis(100);

/// What `up` is started with.
#[derive(Debug, Clone)]
pub struct UpConfig {
    pub space: Space,
    pub root: PathBuf,
    /// Client port; 0 picks a free one.
    pub port: u16,
    pub tls: Option<TlsFiles>,
    /// CA the daemon trusts with TLS (the signer of `tls.cert_file`).
    pub tls_ca: Option<PathBuf>,
    pub nats_server: PathBuf,
    pub lease_ttl: Duration,
    /// Stop after the mesh is serving (and after `after_serving` ran) instead of waiting for Ctrl-C.
    pub once: bool,
    /// Launch broker and daemon as processes that outlive `up`, then exit; restart nothing.
    pub detach: bool,
    /// Lifetime of the standing credentials `up` mints (`None`: the profiles' 24 h).
    pub creds_lifetime: Option<Duration>,
    /// SIGTERM grace of the stop (`COTAL_DELIVERY_STOP_GRACE_MS`, 15 s by default).
    pub stop_grace: Duration,
    /// How long `up` waits for a daemon it started (at start-up or as a replacement) to serve,
    /// its responder bound and its lease ready, before the not-bound warning
    /// (`COTAL_DELIVERY_SERVING_BOUND_MS`, 30 s by default).
    pub serving_bound: Duration,
    /// `--metrics-addr` of every daemon `up` starts (at start-up, on a restart, on a relaunch).
    pub metrics_addr: Option<String>,
    /// The flags typed that only an `up` starting the mesh uses (`--port`, `--demo`, …): on a
    /// root whose mesh already runs they are refused instead of ignored.
    pub start_only: Vec<String>,
}

/// A running broker started by `up`.
struct BrokerChild {
    child: Child,
    url: String,
}

/// A running daemon started by `up`.
struct DaemonChild {
    child: Child,
    pid: u32,
    /// Epoch ms just before the spawn; its lease claim is later.
    started_ms: u64,
}

/// Why `up` failed: its kind, and the operator's line (`Display`).
#[derive(Debug)]
pub struct UpError {
    kind: UpErrorKind,
    text: String,
}

/// What `up` could not do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpErrorKind {
    /// SIGINT/SIGTERM could not be watched.
    Signals,
    /// A file or directory of the root could not be created, opened or written.
    Files,
    /// The signer could not be loaded, created or saved, or a credential not minted.
    Authority,
    /// Provisioning the space (streams, buckets, its material) failed.
    Provision,
    /// nats-server did not start, exited, or could not be reached.
    Broker,
    /// The delivery daemon did not start, exited, or did not serve.
    Daemon,
    /// A detached mesh's renewal owner (`remint --watch`) did not start or did not record itself.
    Renewal,
    /// The main job's demonstration failed.
    Demo,
    /// The daemon could not claim the lease yet: its row belongs to a holder that is not
    /// running and expires soon. A broker `up` started for a detached mesh keeps running.
    NotClaimedYet,
    /// A flag that would do nothing here (one only an `up` starting the mesh uses, on a root
    /// whose mesh already runs): refused, the usage exit code.
    Usage,
}

impl UpError {
    pub fn new(kind: UpErrorKind, text: impl Into<String>) -> UpError {
        UpError {
            kind,
            text: text.into(),
        }
    }
    pub fn kind(&self) -> UpErrorKind {
        self.kind
    }
    /// The same error, its line ending with `more`.
    fn ending(mut self, more: &str) -> UpError {
        self.text.push_str(more);
        self
    }
}

impl std::fmt::Display for UpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for UpError {}

/// A running mesh, handed to `after_serving` (the demo) while the daemon serves.
pub struct RunningMesh {
    pub space: Space,
    pub url: String,
    pub tls_ca: Option<PathBuf>,
    /// The signer is in `workspace.auth_dir()` (`MeshAuthority::load`).
    pub workspace: Workspace,
}

/// The nats-server binary: `--nats-server`, else `NATS_SERVER_BIN`, else `nats-server` on PATH.
pub fn nats_server_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os("NATS_SERVER_BIN").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("nats-server"))
}

/// The mesh `up` left running at `root`, if its broker still is a live `nats-server`.
pub fn running_mesh(root: &Path) -> Option<MeshRecord> {
    let pid = base::read_pid(&base::broker_pid_path(root))?;
    match base::process_liveness(pid, base::argv_names_nats_server) {
        PidLiveness::Alive(_) | PidLiveness::Unverified(_) => {
            MeshRecord::read(&base::mesh_state_path(root)).ok()?
        }
        _ => None,
    }
}

/// Runs `up`; `after_serving` runs once the daemon serves (the demo), before Ctrl-C is awaited.
pub async fn up<F, Fut>(cfg: UpConfig, after_serving: F) -> Result<(), UpError>
where
    F: FnOnce(RunningMesh) -> Fut,
    Fut: std::future::Future<Output = Result<(), DemoError>>,
{
    let journal = Journal::stderr_only();
    let root = base::absolute(&cfg.root, &std::env::current_dir().unwrap_or_default());
    let workspace = Workspace::new(&root);
    // Signals are ours from the start, so Ctrl-C during start-up still stops what was started.
    let signals = foreground::Signals::install().map_err(|e| {
        UpError::new(
            UpErrorKind::Signals,
            format!("✗ up: could not watch SIGINT/SIGTERM: {e}"),
        )
    })?;
    if let Some(mesh) = running_mesh(&root) {
        return relaunch(&cfg, &workspace, &mesh, &journal).await;
    }
    std::fs::create_dir_all(workspace.auth_dir()).map_err(|e| {
        UpError::new(
            UpErrorKind::Files,
            format!(
                "✗ up: could not create {}: {e}",
                workspace.auth_dir().display()
            ),
        )
    })?;
    let mut authority = MeshAuthority::load_or_create(&workspace.auth_dir())
        .map_err(|e| UpError::new(UpErrorKind::Authority, format!("✗ up: {e}")))?;
    authority.add_space(&cfg.space);
    authority
        .save(&workspace.auth_dir())
        .map_err(|e| UpError::new(UpErrorKind::Authority, format!("✗ up: {e}")))?;
    // A new `up` means the operator wants the daemon running again.
    let _ = std::fs::remove_file(base::down_marker_path(&root, &cfg.space));

    let mut broker = start_broker(&cfg, &workspace, &authority).await?;
    journal.line(format!(
        "✓ nats-server up at {} (operator mode, JetStream)",
        broker.url
    ));
    record_mesh(&cfg, &root, &broker.url, &journal);

    let result = serve(
        &cfg,
        &journal,
        &workspace,
        &authority,
        &mut broker,
        signals,
        after_serving,
    )
    .await;
    if cfg.detach && result.is_ok() {
        return result;
    }
    let bare = format!(
        "`cotal-delivery up --space {} --root {}`",
        cfg.space,
        root.display()
    );
    let result = match result {
        // Only the daemon could not claim yet: a detached mesh keeps the broker it started.
        Err(e) if e.kind() == UpErrorKind::NotClaimedYet && cfg.detach => {
            return Err(e.ending(&format!(
                "; nats-server keeps running (pid {}, {}); {bare} serves once it has expired",
                broker.child.id().unwrap_or(0),
                broker.url
            )));
        }
        Err(e) if e.kind() == UpErrorKind::NotClaimedYet => Err(e.ending(&format!(
            "; nats-server is stopped with up; run {bare} again once it has expired"
        ))),
        other => other,
    };
    if let Ok(None) = broker.child.try_wait() {
        stop::terminate(
            stop::Target::Child(&mut broker.child),
            cfg.stop_grace,
            "nats-server",
            "up",
            &journal,
        )
        .await;
    }
    let _ = std::fs::remove_file(base::broker_pid_path(&root));
    result
}

/// Writes `.cotal/mesh.json` and the machine registry record of the space.
fn record_mesh(cfg: &UpConfig, root: &Path, url: &str, journal: &Journal) {
    let record = MeshRecord {
        space: cfg.space.as_str().to_string(),
        server: url.to_string(),
        root: root.to_path_buf(),
        tls_required: cfg.tls.is_some(),
        tls_ca: cfg.tls_ca.clone(),
    };
    if let Err(e) = record.write(&base::mesh_state_path(root)) {
        journal.line(format!("! up: {e}"));
    }
    match base::cotal_home() {
        Some(home) => {
            let path = base::registry_path(&home, &cfg.space);
            // A record of this space from another root is replaced: said, with both roots.
            if let Ok(Some(old)) = MeshRecord::read(&path) {
                if old.root != record.root {
                    journal.line(format!(
                        "! up: the mesh registry record of space {} named root {} (broker {}); it now names root {} - a daemon typed by hand at {} is refused from now on (registered for another root)",
                        cfg.space,
                        old.root.display(),
                        old.server,
                        root.display(),
                        old.root.display()
                    ));
                }
            }
            match record.write(&path) {
                Ok(()) => journal.line(format!(
                    "• mesh registry: space {} recorded at {} ({})",
                    cfg.space,
                    url,
                    path.display()
                )),
                Err(e) => journal.line(format!("! up: {e}")),
            }
        }
        None => {
            journal.line("! up: neither COTAL_HOME nor HOME is set - the mesh is not registered")
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve<F, Fut>(
    cfg: &UpConfig,
    journal: &Journal,
    workspace: &Workspace,
    authority: &MeshAuthority,
    broker: &mut BrokerChild,
    signals: foreground::Signals,
    after_serving: F,
) -> Result<(), UpError>
where
    F: FnOnce(RunningMesh) -> Fut,
    Fut: std::future::Future<Output = Result<(), DemoError>>,
{
    let space = &cfg.space;
    let url = broker.url.clone();
    let options = ProvisionOptions::new().lease_ttl(cfg.lease_ttl);
    let report =
        provision::provision_space(authority, &url, cfg.tls_ca.as_deref(), space, &options)
            .await
            .map_err(|e| {
                UpError::new(
                    UpErrorKind::Provision,
                    format!("✗ up: provisioning space {space} failed: {e}"),
                )
            })?;
    journal.line(format!(
        "✓ space {space} provisioned ({})",
        report.summary()
    ));
    let material = SpaceMaterial::mint_standing(authority, space, cfg.creds_lifetime)
        .map_err(|e| UpError::new(UpErrorKind::Provision, format!("✗ up: {e}")))?;
    workspace
        .write_space_material(space, &material)
        .map_err(|e| UpError::new(UpErrorKind::Provision, format!("✗ up: {e}")))?;
    journal.line(format!(
        "• delivery credential at {}",
        workspace.delivery_creds_path(space).display()
    ));

    let transport = Transport {
        tls: cfg.tls.is_some(),
        tls_ca: cfg.tls_ca.clone(),
        metrics_addr: cfg.metrics_addr.clone(),
    };
    let mut daemon = start_daemon(space, workspace, &url, &transport, cfg.detach)?;
    let watch = LeaseWatch::open(authority, space, &url, cfg.tls_ca.as_deref()).await?;
    if let Err(e) = wait_serving(&watch, space, workspace, &mut daemon, cfg.serving_bound).await {
        // A daemon still running without serving is stopped like any other before `up` gives up.
        if let Ok(None) = daemon.child.try_wait() {
            stop_own(cfg, workspace, &mut daemon, journal).await;
        }
        watch.close().await;
        return Err(e);
    }
    journal.line(format!(
        "✓ delivery daemon serving space {space} (pid {}, log {})",
        daemon.pid,
        workspace.log_path(space).display()
    ));
    if cfg.detach {
        // Nothing else renews a detached mesh: without its owner it stops at the lifetime.
        if let Err(e) = remint::ensure_renewal_owner(workspace.root(), space, false, journal).await
        {
            stop_own(cfg, workspace, &mut daemon, journal).await;
            watch.close().await;
            return Err(e);
        }
        journal.line(format!(
            "• detached: nats-server, the delivery daemon and its renewal owner keep running; stop them with: cotal-delivery down --space {space} --root {}",
            workspace.root().display()
        ));
        return Ok(());
    }

    let mesh = RunningMesh {
        space: space.clone(),
        url: url.clone(),
        tls_ca: cfg.tls_ca.clone(),
        workspace: Workspace::new(workspace.root()),
    };
    let demo = after_serving(mesh).await;
    if let Err(e) = &demo {
        journal.line(format!("✗ up: {e}"));
    }
    let mut outcome = Ok(());
    if !cfg.once && demo.is_ok() {
        let ctx = foreground::Ctx {
            cfg,
            workspace,
            url: &url,
            transport: &transport,
            watch: &watch,
            journal,
        };
        outcome = foreground::run(&ctx, broker, daemon, signals).await;
    } else {
        stop_own(cfg, workspace, &mut daemon, journal).await;
    }
    watch.close().await;
    demo.map_err(|e| UpError::new(UpErrorKind::Demo, e.to_string()))?;
    outcome
}

/// The shared stop for the daemon `up` itself started (outside the foreground loop, which
/// handles a concurrent `down`'s reservation itself); its line is the stop's own.
async fn stop_own(
    cfg: &UpConfig,
    workspace: &Workspace,
    daemon: &mut DaemonChild,
    journal: &Journal,
) {
    let _ = stop::stop_daemon(
        workspace.root(),
        &cfg.space,
        Some(&mut daemon.child),
        cfg.stop_grace,
        "up",
        journal,
    )
    .await;
}

/// A bare `up` on a mesh that already runs: relaunch its daemon if it is missing, with the
/// mesh's transport (a TLS mesh demands TLS of the relaunched daemon too), detached.
async fn relaunch(
    cfg: &UpConfig,
    workspace: &Workspace,
    mesh: &MeshRecord,
    journal: &Journal,
) -> Result<(), UpError> {
    let space = &cfg.space;
    let root = workspace.root();
    journal.line(format!(
        "• a mesh is already running at {} (root {}{})",
        mesh.server,
        root.display(),
        if mesh.tls_required {
            ", TLS required"
        } else {
            ""
        }
    ));
    refuse_start_only(cfg, workspace, mesh)?;
    refuse_unknown_space(cfg, workspace, mesh)?;
    let served = relaunch_daemon(cfg, workspace, mesh, journal).await;
    // Also when the daemon could not serve yet: its credentials keep being renewed.
    let owner = remint::ensure_renewal_owner(root, space, true, journal).await;
    served.and(owner)
}

/// The flags a running mesh would ignore, refused before anything is touched: those only an
/// `up` starting the mesh uses, and `--metrics-addr` and `--creds-lifetime-secs` while the
/// daemon already serves (a relaunch of a missing daemon mints with them).
fn refuse_start_only(
    cfg: &UpConfig,
    workspace: &Workspace,
    mesh: &MeshRecord,
) -> Result<(), UpError> {
    let space = &cfg.space;
    let root = workspace.root();
    let serving = base::pid_liveness(&workspace.pid_path(space)).daemon_pid();
    let mut ignored: Vec<String> = cfg
        .start_only
        .iter()
        // `--port` of the running broker's own port, or 0 (any free one), changes nothing.
        .filter(|f| {
            f.as_str() != "--port"
                || cfg.port != 0 && !mesh.server.ends_with(&format!(":{}", cfg.port))
        })
        .map(|f| match f.as_str() {
            "--port" => format!("--port {}", cfg.port),
            _ => f.clone(),
        })
        .collect();
    if let (Some(pid), Some(_)) = (serving, &cfg.metrics_addr) {
        ignored.push(format!(
            "--metrics-addr (the daemon already serving, pid {pid}, keeps the address it was started with)"
        ));
    }
    if let (Some(pid), Some(_)) = (serving, &cfg.creds_lifetime) {
        ignored.push(format!(
            "--creds-lifetime-secs (the daemon already serving, pid {pid}, keeps its credentials, which its renewal owner re-signs at their own lifetime)"
        ));
    }
    if ignored.is_empty() {
        return Ok(());
    }
    Err(UpError::new(
        UpErrorKind::Usage,
        format!(
            "✗ up: {} would do nothing: the mesh at {} already runs (root {}); they apply when up starts it. Run up without them, or stop the mesh first: cotal-delivery down --space {space} --root {}",
            ignored.join(", "),
            mesh.server,
            root.display(),
            root.display()
        ),
    ))
}

/// A missing daemon's space that the running mesh's signer has no account for, refused before
/// anything is touched (no daemon, no renewal owner): the broker preloads the accounts it was
/// started with, so a running mesh takes no new space. The line says what to run instead.
fn refuse_unknown_space(
    cfg: &UpConfig,
    workspace: &Workspace,
    mesh: &MeshRecord,
) -> Result<(), UpError> {
    let space = &cfg.space;
    let root = workspace.root();
    // A daemon already serving needs nothing of the signer: the relaunch says it serves.
    if base::pid_liveness(&workspace.pid_path(space))
        .daemon_pid()
        .is_some()
    {
        return Ok(());
    }
    // A signer that cannot be read is the relaunch's own error, said there.
    let Ok(authority) = MeshAuthority::load(&workspace.auth_dir()) else {
        return Ok(());
    };
    if authority.has_space(space) {
        return Ok(());
    }
    let text = if mesh.space == space.as_str() {
        format!(
            "✗ up: the mesh at {} (root {}) was started for space {space}, but its signer ({}) no longer holds the space's account; start the mesh again: cotal-delivery down --space {space} --root {}, then cotal-delivery up --space {space} --root {}",
            mesh.server,
            root.display(),
            workspace.auth_dir().display(),
            root.display(),
            root.display()
        )
    } else {
        format!(
            "✗ up: the mesh at {} (root {}) was started for space {}, and its signer ({}) has no account for space {space}: a running broker takes no new space. Serve {space} from a root of its own: cotal-delivery up --space {space} --root <another directory> --port 0",
            mesh.server,
            root.display(),
            mesh.space,
            workspace.auth_dir().display()
        )
    };
    Err(UpError::new(UpErrorKind::Authority, text))
}

/// The daemon half of a bare `up`: relaunched when it is missing.
async fn relaunch_daemon(
    cfg: &UpConfig,
    workspace: &Workspace,
    mesh: &MeshRecord,
    journal: &Journal,
) -> Result<(), UpError> {
    let space = &cfg.space;
    let root = workspace.root();
    if let Some(pid) = base::pid_liveness(&workspace.pid_path(space)).daemon_pid() {
        journal.line(format!(
            "✓ delivery daemon already serving space {space} (pid {pid})"
        ));
        return Ok(());
    }
    let _ = std::fs::remove_file(base::down_marker_path(root, space));
    let authority = MeshAuthority::load(&workspace.auth_dir())
        .map_err(|e| UpError::new(UpErrorKind::Authority, format!("✗ up: {e}")))?;
    if read_creds_file(&workspace.delivery_creds_path(space)).is_err() {
        // The stop removed it: mint the space's material again.
        let material = SpaceMaterial::mint_standing(&authority, space, cfg.creds_lifetime)
            .map_err(|e| UpError::new(UpErrorKind::Provision, format!("✗ up: {e}")))?;
        workspace
            .write_space_material(space, &material)
            .map_err(|e| UpError::new(UpErrorKind::Provision, format!("✗ up: {e}")))?;
    }
    let transport = Transport {
        tls: mesh.tls_required,
        tls_ca: mesh.tls_ca.clone(),
        metrics_addr: cfg.metrics_addr.clone(),
    };
    journal.line(format!(
        "• relaunching the missing delivery daemon for space {space}{}",
        if transport.tls {
            " with TLS required"
        } else {
            ""
        }
    ));
    let mut daemon = start_daemon(space, workspace, &mesh.server, &transport, true)?;
    let watch = LeaseWatch::open(&authority, space, &mesh.server, mesh.tls_ca.as_deref()).await?;
    let served = wait_serving(&watch, space, workspace, &mut daemon, cfg.serving_bound).await;
    watch.close().await;
    served.map_err(|e| match e.kind() {
        UpErrorKind::NotClaimedYet => e.ending(&format!(
            "; nats-server keeps running; run `cotal-delivery up --space {space} --root {}` again once it has expired",
            root.display()
        )),
        _ => e,
    })?;
    journal.line(format!(
        "✓ delivery daemon serving space {space} (pid {}, log {})",
        daemon.pid,
        workspace.log_path(space).display()
    ));
    Ok(())
}

/// How the daemon reaches the broker: the mesh's transport, the same on every launch.
#[derive(Debug, Clone)]
struct Transport {
    tls: bool,
    tls_ca: Option<PathBuf>,
    /// Where the daemon serves its metrics (`up --metrics-addr`), on every launch too.
    metrics_addr: Option<String>,
}

async fn start_broker(
    cfg: &UpConfig,
    workspace: &Workspace,
    authority: &MeshAuthority,
) -> Result<BrokerChild, UpError> {
    let operator = authority
        .operator_auth()
        .map_err(|e| UpError::new(UpErrorKind::Authority, format!("✗ up: {e}")))?;
    let cotal = workspace.cotal_dir();
    let mut conf = ServerConf::new()
        .jetstream(cotal.join("jetstream"))
        .operator(operator);
    if cfg.port != 0 {
        conf = conf.port(cfg.port);
    }
    if let Some(tls) = &cfg.tls {
        conf = conf.tls(tls.clone());
    }
    let conf_path = workspace
        .write_server_conf(&conf)
        .map_err(|e| UpError::new(UpErrorKind::Files, format!("✗ up: {e}")))?;
    let ports_dir = cotal.join("ports");
    let _ = std::fs::remove_dir_all(&ports_dir);
    std::fs::create_dir_all(&ports_dir).map_err(|e| {
        UpError::new(
            UpErrorKind::Files,
            format!("✗ up: could not create {}: {e}", ports_dir.display()),
        )
    })?;
    let log = open_append(&cotal.join("nats.log"))?;
    let mut cmd = Command::new(&cfg.nats_server);
    tie_to_up(&mut cmd, cfg.detach);
    let child = cmd
        .arg("-c")
        .arg(&conf_path)
        .arg("--ports_file_dir")
        .arg(&ports_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().map_err(|e| UpError::new(UpErrorKind::Files, e.to_string()))?))
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| {
            UpError::new(UpErrorKind::Broker, format!(
                "✗ up: could not start nats-server at {} ({e}); run ci/install-nats-server, or set NATS_SERVER_BIN",
                cfg.nats_server.display()
            ))
        })?;
    let pid = child.id().unwrap_or(0);
    let _ = base::write_atomic(
        &base::broker_pid_path(workspace.root()),
        format!("{pid}\n").as_bytes(),
    );
    let mut broker = BrokerChild {
        child,
        url: String::new(),
    };
    let deadline = Instant::now() + BROKER_READY_BOUND;
    loop {
        if let Some(url) = read_ports_file(&ports_dir, pid) {
            broker.url = url;
            return Ok(broker);
        }
        if let Ok(Some(status)) = broker.child.try_wait() {
            return Err(UpError::new(
                UpErrorKind::Broker,
                format!(
                    "✗ up: nats-server exited ({status}) before it listened; see {}",
                    cotal.join("nats.log").display()
                ),
            ));
        }
        if Instant::now() > deadline {
            let _ = broker.child.kill().await;
            return Err(UpError::new(
                UpErrorKind::Broker,
                format!(
                    "✗ up: nats-server did not listen within {} s; see {}",
                    BROKER_READY_BOUND.as_secs(),
                    cotal.join("nats.log").display()
                ),
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Ties a child's life to `up`'s. Foreground: the children (broker, daemon) die with `up`, even
/// when `up` itself is killed without a chance to stop them: Linux `PR_SET_DEATHSIG`, tied to
/// the spawning thread, which is a runtime worker living as long as `up`. Detached: the child
/// gets its own process group, so a Ctrl-C in `up`'s terminal does not reach it, and outlives
/// `up`.
fn tie_to_up(cmd: &mut Command, detach: bool) {
    if detach {
        cmd.process_group(0);
        return;
    }
    cmd.kill_on_drop(true);
    #[cfg(target_os = "linux")]
    // SAFETY: the closure runs between fork and exec and only makes the async-signal-safe
    // prctl(2) call.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
}

fn read_ports_file(dir: &Path, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(format!("nats-server_{pid}.ports"))).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["nats"][0].as_str().map(str::to_string)
}

fn open_append(path: &Path) -> Result<std::fs::File, UpError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| {
            UpError::new(
                UpErrorKind::Files,
                format!("✗ up: could not open {}: {e}", path.display()),
            )
        })
}

/// Starts `deliver` for `space` with the mesh's transport, its stdout and stderr on the space's
/// log, and records the launch (`.cotal/delivery.<key>.launched`) so a stop finds a replacement
/// that has not recorded itself yet.
fn start_daemon(
    space: &Space,
    workspace: &Workspace,
    url: &str,
    transport: &Transport,
    detach: bool,
) -> Result<DaemonChild, UpError> {
    let exe = std::env::current_exe()
        .map_err(|e| UpError::new(UpErrorKind::Files, format!("✗ up: {e}")))?;
    let log_path = workspace.log_path(space);
    let log = open_append(&log_path)?;
    let mut cmd = Command::new(exe);
    tie_to_up(&mut cmd, detach);
    cmd.args(["deliver", "--space", space.as_str(), "--server", url])
        .arg("--root")
        .arg(workspace.root())
        .current_dir(workspace.root())
        .stdin(Stdio::null())
        .stdout(Stdio::from(
            log.try_clone()
                .map_err(|e| UpError::new(UpErrorKind::Files, e.to_string()))?,
        ))
        .stderr(Stdio::from(log));
    // The mesh's transport on every launch: a TLS mesh always demands TLS of its daemon.
    if transport.tls {
        cmd.arg("--tls");
    }
    if let Some(ca) = &transport.tls_ca {
        cmd.arg("--tls-ca").arg(ca);
    }
    if let Some(addr) = &transport.metrics_addr {
        cmd.args(["--metrics-addr", addr]);
    }
    let started_ms = crate::base::epoch_ms();
    let child = cmd.spawn().map_err(|e| {
        UpError::new(
            UpErrorKind::Daemon,
            format!("✗ up: could not start the delivery daemon: {e}"),
        )
    })?;
    let pid = child.id().unwrap_or(0);
    let _ = base::write_atomic(
        &base::launched_path(workspace.root(), space),
        format!("{pid}\n").as_bytes(),
    );
    Ok(DaemonChild {
        child,
        pid,
        started_ms,
    })
}

/// `up`'s view of the lease row, on one operator connection kept for the whole run.
struct LeaseWatch {
    client: async_nats::Client,
    js: async_nats::jetstream::Context,
    names: SpaceNames,
    rows: Rows,
}

impl LeaseWatch {
    async fn open(
        authority: &MeshAuthority,
        space: &Space,
        url: &str,
        tls_ca: Option<&Path>,
    ) -> Result<LeaseWatch, UpError> {
        let operator = authority
            .mint(
                space,
                &Profile::Operator,
                MintOptions::new().expires_in(Duration::from_secs(7 * 24 * 3600)),
            )
            .map_err(|e| UpError::new(UpErrorKind::Authority, format!("✗ up: {e}")))?;
        // Kept across a broker restart of the same URL; up watches the broker process itself.
        let options = crate::base::standing_credential_options(
            &operator,
            tls_ca,
            "cotal-up",
            &crate::wire::inbox_prefix(
                &operator
                    .public_key()
                    .map_err(|e| UpError::new(UpErrorKind::Authority, format!("✗ up: {e}")))?,
            ),
            crate::base::BROKER_BOUND,
        )
        .map_err(|e| UpError::new(UpErrorKind::Authority, format!("✗ up: {e}")))?;
        let client =
            crate::base::connect_options(options, url, "cotal-up", crate::base::BROKER_BOUND)
                .await
                .map_err(|e| UpError::new(UpErrorKind::Broker, format!("✗ up: {e}")))?;
        let js = async_nats::jetstream::new(client.clone());
        let names = SpaceNames::new(space);
        let rows = Rows::open(&js, &names.delivery_bucket(), Duration::from_secs(2))
            .await
            .map_err(|e| UpError::new(UpErrorKind::Broker, format!("✗ up: {e}")))?;
        Ok(LeaseWatch {
            client,
            js,
            names,
            rows,
        })
    }

    /// The live lease row, dated by the broker (when it expires).
    async fn held_row(&self) -> Option<crate::space::HeldRow> {
        let ttl = crate::space::lease_ttl(&self.js, &self.names).await;
        crate::space::held_row(&self.rows, ttl).await
    }

    /// Serving = this process recorded itself (it holds the lease) and the row it claimed after
    /// it was started reads ready under the holder of the space's delivery credential. A row a
    /// killed predecessor left behind has an older claim time and another pid record.
    async fn serving(&self, space: &Space, workspace: &Workspace, daemon: &DaemonChild) -> bool {
        let holder = read_creds_file(&workspace.delivery_creds_path(space))
            .ok()
            .and_then(|c| c.public_key().ok())
            .and_then(|k| Principal::for_nkey(&k).ok())
            .map(|p| p.dot_form())
            .unwrap_or_default();
        if base::read_pid(&workspace.pid_path(space)) != Some(daemon.pid) {
            return false;
        }
        match self.rows.read(LEASE_KEY).await {
            Ok(Read::Present(row)) => {
                serde_json::from_slice::<LeaseInfo>(&row.value).is_ok_and(|info| {
                    info.ready && info.holder == holder && info.since >= daemon.started_ms
                })
            }
            _ => false,
        }
    }

    async fn close(self) {
        let _ = self.client.drain().await;
    }
}

/// The line for a daemon whose responder did not bind in time (start-up and restarts alike).
fn not_bound(space: &Space, workspace: &Workspace, bound: Duration) -> String {
    format!(
        "the delivery daemon did not serve space {space} within {} (its responder is not bound); see {}",
        human_bound(bound),
        workspace.log_path(space).display()
    )
}

/// `30 s`, or `1500 ms` for a bound that is not whole seconds.
fn human_bound(bound: Duration) -> String {
    if bound.subsec_millis() == 0 {
        format!("{} s", bound.as_secs())
    } else {
        format!("{} ms", bound.as_millis())
    }
}

/// Waits until the daemon serves, or exits (its last log line is the reason), or the bound ends.
async fn wait_serving(
    watch: &LeaseWatch,
    space: &Space,
    workspace: &Workspace,
    daemon: &mut DaemonChild,
    bound: Duration,
) -> Result<(), UpError> {
    let deadline = Instant::now() + bound;
    loop {
        if let Ok(Some(status)) = daemon.child.try_wait() {
            let last = last_line(&workspace.log_path(space)).unwrap_or_else(|| "no output".into());
            // Refused by a row whose holder is not running: not a failure of the mesh, only a
            // wait until the row expires.
            if last.contains(crate::space::NOT_RUNNING_HOLDER) {
                if let Some(row) = watch.held_row().await {
                    return Err(UpError::new(
                        UpErrorKind::NotClaimedYet,
                        format!(
                            "✗ up: the delivery daemon could not claim the lease of space {space} yet: its row belongs to a holder that is not running ({}: {}) and expires in {} s",
                            row.info.holder,
                            crate::space::NOT_RUNNING_PROOF,
                            row.expires_in_secs()
                        ),
                    ));
                }
            }
            return Err(UpError::new(
                UpErrorKind::Daemon,
                format!(
                    "✗ up: the delivery daemon exited ({}) without serving space {space}: {last}",
                    exit_cause(&status)
                ),
            ));
        }
        if watch.serving(space, workspace, daemon).await {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(UpError::new(
                UpErrorKind::Daemon,
                format!("✗ up: {}", not_bound(space, workspace, bound)),
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `code 9`, `signal SIGKILL`: how a daemon ended, for the restart line (docs/operations.md).
fn exit_cause(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return format!("code {code}");
    }
    match status.signal() {
        Some(sig) => match nix::sys::signal::Signal::try_from(sig) {
            Ok(s) => format!("signal {}", s.as_str()),
            Err(_) => format!("signal {sig}"),
        },
        None => status.to_string(),
    }
}

/// How the last line of a `deliver` run begins (`host/process.rs`).
const RUN_ENDED: &str = "• delivery: run ended — ";

fn last_line(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .rev()
        .map(|l| {
            // Without the timestamp every line of the log begins with.
            match l.split_once(' ') {
                Some((first, rest))
                    if first.ends_with('Z') && first.starts_with(|c: char| c.is_ascii_digit()) =>
                {
                    rest
                }
                _ => l,
            }
        })
        // The run's own last line says only how it ended; the reason is the line before it.
        .find(|l| !l.trim().is_empty() && !l.starts_with(RUN_ENDED))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A nats-server binary that cannot be started ends `up` with a `Broker` error that names
    /// the binary, before anything is provisioned. Mutation seen failing: the spawn failure's
    /// kind set to `Files`.
    #[tokio::test]
    async fn a_broker_binary_that_cannot_start_is_a_broker_error() {
        let root = tempfile::tempdir().unwrap();
        let cfg = UpConfig {
            space: Space::parse("demo").unwrap(),
            root: root.path().to_path_buf(),
            port: 0,
            tls: None,
            tls_ca: None,
            nats_server: root.path().join("no-such-nats-server"),
            lease_ttl: Duration::from_secs(30),
            once: true,
            detach: false,
            creds_lifetime: None,
            stop_grace: Duration::from_secs(1),
            serving_bound: Duration::from_secs(1),
            metrics_addr: None,
            start_only: Vec::new(),
        };
        let e = up(cfg, |_| async { Ok(()) }).await.unwrap_err();
        assert_eq!(e.kind(), UpErrorKind::Broker, "{e}");
        assert!(
            e.to_string().contains("could not start nats-server at"),
            "{e}"
        );
    }
}
