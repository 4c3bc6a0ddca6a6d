//! `cotal-delivery up`: a local authenticated mesh in the foreground.
//!
//! It provisions through the same code path as the harness (signer in `.cotal/auth/`, the
//! space's streams and buckets, the daemon's credentials), starts `nats-server` in operator
//! mode, starts the delivery daemon beside it, and reports the daemon only once it is actually
//! serving: its lease row reads `ready` under the daemon's own holder. A daemon that exits
//! without serving is reported with its own last words and `up` exits non-zero. While serving,
//! a daemon that dies while the broker is still running is restarted; a clean or signalled exit
//! is left stopped. Ctrl-C stops the daemon (SIGTERM, then SIGKILL after 15 s), then the broker.

pub mod demo;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::creds::read_creds_file;
use crate::files;
use crate::journal::Journal;
use crate::kv::{Read, Rows};
use crate::provision::{
    self, MeshAuthority, MintOptions, Profile, ProvisionOptions, ServerConf, SpaceMaterial,
    TlsFiles, Workspace,
};
use crate::space::lease::LeaseInfo;
use crate::wire::{Principal, Space, SpaceNames, LEASE_KEY};

/// How long `up` waits for the broker's ports file.
const BROKER_READY_BOUND: Duration = Duration::from_secs(20);
/// How long `up` waits for the daemon to serve.
const SERVING_BOUND: Duration = Duration::from_secs(30);
/// SIGTERM grace before SIGKILL when stopping the daemon.
const STOP_GRACE: Duration = Duration::from_secs(15);
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

/// Why `up` failed; the text is the operator's line.
#[derive(Debug)]
pub struct UpError(pub String);

impl std::fmt::Display for UpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

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

/// Runs `up`; `after_serving` runs once the daemon serves (the demo), before Ctrl-C is awaited.
pub async fn up<F, Fut>(cfg: UpConfig, after_serving: F) -> Result<(), UpError>
where
    F: FnOnce(RunningMesh) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let journal = Journal::stderr_only();
    let root = files::absolute(&cfg.root, &std::env::current_dir().unwrap_or_default());
    let workspace = Workspace::new(&root);
    std::fs::create_dir_all(workspace.auth_dir()).map_err(|e| {
        UpError(format!(
            "✗ up: could not create {}: {e}",
            workspace.auth_dir().display()
        ))
    })?;
    let mut authority = MeshAuthority::load_or_create(&workspace.auth_dir())
        .map_err(|e| UpError(format!("✗ up: {e}")))?;
    authority.add_space(&cfg.space);
    authority
        .save(&workspace.auth_dir())
        .map_err(|e| UpError(format!("✗ up: {e}")))?;

    let mut broker = start_broker(&cfg, &workspace, &authority).await?;
    journal.line(format!(
        "✓ nats-server up at {} (operator mode, JetStream)",
        broker.url
    ));

    let result = serve(
        &cfg,
        &journal,
        &workspace,
        &authority,
        &broker.url,
        after_serving,
    )
    .await;
    stop_broker(&mut broker, &journal).await;
    result
}

async fn serve<F, Fut>(
    cfg: &UpConfig,
    journal: &Journal,
    workspace: &Workspace,
    authority: &MeshAuthority,
    url: &str,
    after_serving: F,
) -> Result<(), UpError>
where
    F: FnOnce(RunningMesh) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let space = &cfg.space;
    let options = ProvisionOptions::new().lease_ttl(cfg.lease_ttl);
    let report = provision::provision_space(authority, url, cfg.tls_ca.as_deref(), space, &options)
        .await
        .map_err(|e| UpError(format!("✗ up: provisioning space {space} failed: {e}")))?;
    journal.line(format!(
        "✓ space {space} provisioned ({} created, the rest already in place)",
        report.created()
    ));
    let material =
        SpaceMaterial::mint(authority, space).map_err(|e| UpError(format!("✗ up: {e}")))?;
    workspace
        .write_space_material(space, &material)
        .map_err(|e| UpError(format!("✗ up: {e}")))?;
    journal.line(format!(
        "• delivery credential at {}",
        workspace.delivery_creds_path(space).display()
    ));

    let mut daemon = start_daemon(cfg, workspace, url)?;
    wait_serving(cfg, workspace, authority, url, &mut daemon).await?;
    journal.line(format!(
        "✓ delivery daemon serving space {space} (pid {}, log {})",
        daemon.pid,
        workspace.log_path(space).display()
    ));

    let mesh = RunningMesh {
        space: space.clone(),
        url: url.to_string(),
        tls_ca: cfg.tls_ca.clone(),
        workspace: Workspace::new(workspace.root()),
    };
    let demo = after_serving(mesh).await;
    if let Err(e) = &demo {
        journal.line(format!("✗ up: {e}"));
    }
    if !cfg.once && demo.is_ok() {
        supervise(cfg, workspace, authority, url, &mut daemon, journal).await;
    }
    stop_daemon(&mut daemon, journal).await;
    demo.map_err(UpError)
}

async fn start_broker(
    cfg: &UpConfig,
    workspace: &Workspace,
    authority: &MeshAuthority,
) -> Result<BrokerChild, UpError> {
    let operator = authority
        .operator_auth()
        .map_err(|e| UpError(format!("✗ up: {e}")))?;
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
        .map_err(|e| UpError(format!("✗ up: {e}")))?;
    let ports_dir = cotal.join("ports");
    let _ = std::fs::remove_dir_all(&ports_dir);
    std::fs::create_dir_all(&ports_dir).map_err(|e| {
        UpError(format!(
            "✗ up: could not create {}: {e}",
            ports_dir.display()
        ))
    })?;
    let log = open_append(&cotal.join("nats.log"))?;
    let mut cmd = Command::new(&cfg.nats_server);
    die_with_up(&mut cmd);
    let child = cmd
        .arg("-c")
        .arg(&conf_path)
        .arg("--ports_file_dir")
        .arg(&ports_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().map_err(|e| UpError(e.to_string()))?))
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            UpError(format!(
                "✗ up: could not start nats-server at {} ({e}); run ci/install-nats-server, or set NATS_SERVER_BIN",
                cfg.nats_server.display()
            ))
        })?;
    let pid = child.id().unwrap_or(0);
    let _ = files::write_atomic(&cotal.join("nats.pid"), format!("{pid}\n").as_bytes());
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
            return Err(UpError(format!(
                "✗ up: nats-server exited ({status}) before it listened; see {}",
                cotal.join("nats.log").display()
            )));
        }
        if Instant::now() > deadline {
            let _ = broker.child.kill().await;
            return Err(UpError(format!(
                "✗ up: nats-server did not listen within {} s; see {}",
                BROKER_READY_BOUND.as_secs(),
                cotal.join("nats.log").display()
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The children of a foreground `up` (its broker, its daemon) die with it, even when `up` itself
/// is killed without a chance to stop them: Linux `PR_SET_DEATHSIG`, tied to the spawning thread,
/// which is a runtime worker living as long as `up`.
fn die_with_up(cmd: &mut Command) {
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
        .map_err(|e| UpError(format!("✗ up: could not open {}: {e}", path.display())))
}

fn start_daemon(cfg: &UpConfig, workspace: &Workspace, url: &str) -> Result<DaemonChild, UpError> {
    let exe = std::env::current_exe().map_err(|e| UpError(format!("✗ up: {e}")))?;
    let log_path = workspace.log_path(&cfg.space);
    let log = open_append(&log_path)?;
    let mut cmd = Command::new(exe);
    die_with_up(&mut cmd);
    cmd.args(["deliver", "--space", cfg.space.as_str(), "--server", url])
        .current_dir(workspace.root())
        .stdin(Stdio::null())
        .stdout(Stdio::from(
            log.try_clone().map_err(|e| UpError(e.to_string()))?,
        ))
        .stderr(Stdio::from(log))
        .kill_on_drop(true);
    // The mesh's transport on every launch: a TLS mesh always demands TLS of its daemon.
    if cfg.tls.is_some() {
        cmd.arg("--tls");
        if let Some(ca) = &cfg.tls_ca {
            cmd.arg("--tls-ca").arg(ca);
        }
    }
    let started_ms = crate::journal::epoch_ms();
    let child = cmd
        .spawn()
        .map_err(|e| UpError(format!("✗ up: could not start the delivery daemon: {e}")))?;
    let pid = child.id().unwrap_or(0);
    Ok(DaemonChild {
        child,
        pid,
        started_ms,
    })
}

/// Waits until the lease row reads `ready` under the daemon's own holder, or the daemon exits.
async fn wait_serving(
    cfg: &UpConfig,
    workspace: &Workspace,
    authority: &MeshAuthority,
    url: &str,
    daemon: &mut DaemonChild,
) -> Result<(), UpError> {
    let space = &cfg.space;
    let holder = read_creds_file(&workspace.delivery_creds_path(space))
        .ok()
        .and_then(|c| c.public_key().ok())
        .and_then(|k| Principal::for_nkey(&k).ok())
        .map(|p| p.dot_form())
        .unwrap_or_default();
    let operator = authority
        .mint(space, &Profile::Operator, MintOptions::new())
        .map_err(|e| UpError(format!("✗ up: {e}")))?;
    let client = provision::connect_with_credential(
        url,
        cfg.tls_ca.as_deref(),
        &operator,
        "cotal-up",
        Duration::from_secs(5),
    )
    .await
    .map_err(|e| UpError(format!("✗ up: {e}")))?;
    let js = async_nats::jetstream::new(client.clone());
    let rows = Rows::open(
        &js,
        &SpaceNames::new(space).delivery_bucket(),
        Duration::from_secs(5),
    )
    .await
    .map_err(|e| UpError(format!("✗ up: {e}")))?;
    let deadline = Instant::now() + SERVING_BOUND;
    let log_path = workspace.log_path(space);
    loop {
        if let Ok(Some(status)) = daemon.child.try_wait() {
            let last = last_line(&log_path).unwrap_or_else(|| "no output".into());
            return Err(UpError(format!(
                "✗ up: the delivery daemon exited ({status}) without serving space {space}: {last}"
            )));
        }
        // Serving = this process recorded itself (it holds the lease) and the row it claimed
        // after it was started reads ready. A row a killed predecessor left behind has the
        // same holder but an older claim time and another pid record.
        let recorded = files::read_pid(&workspace.pid_path(space)) == Some(daemon.pid);
        if let (true, Ok(Read::Present(row))) = (recorded, rows.read(LEASE_KEY).await) {
            if let Ok(info) = serde_json::from_slice::<LeaseInfo>(&row.value) {
                if info.ready && info.holder == holder && info.since >= daemon.started_ms {
                    let _ = client.drain().await;
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            return Err(UpError(format!(
                "✗ up: the delivery daemon did not serve space {space} within {} s; see {}",
                SERVING_BOUND.as_secs(),
                log_path.display()
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

fn last_line(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().rev().find(|l| !l.trim().is_empty()).map(|l| {
        // Strip the log file's timestamp.
        l.split_once(' ')
            .map(|(_, rest)| rest.to_string())
            .unwrap_or_else(|| l.to_string())
    })
}

/// Foreground: wait for Ctrl-C; restart a daemon that dies while the broker runs.
async fn supervise(
    cfg: &UpConfig,
    workspace: &Workspace,
    authority: &MeshAuthority,
    url: &str,
    daemon: &mut DaemonChild,
    journal: &Journal,
) {
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    journal.line("• mesh serving; Ctrl-C stops the daemon, then the broker");
    loop {
        tokio::select! {
            _ = int.recv() => return,
            _ = term.recv() => return,
            status = daemon.child.wait() => {
                let cause = match status {
                    Ok(s) if s.success() => return,
                    Ok(s) => s.to_string(),
                    Err(e) => e.to_string(),
                };
                journal.line(format!("delivery daemon exited ({cause}) while nats-server is running - restarting it"));
                match start_daemon(cfg, workspace, url) {
                    Ok(d) => {
                        *daemon = d;
                        match wait_serving(cfg, workspace, authority, url, daemon).await {
                            Ok(()) => journal.line("delivery daemon running again"),
                            Err(e) => {
                                journal.line(format!("! {e}; retrying after the lease TTL ({} s)", cfg.lease_ttl.as_secs()));
                                tokio::time::sleep(cfg.lease_ttl).await;
                            }
                        }
                    }
                    Err(e) => journal.line(format!("! {e}")),
                }
            }
        }
    }
}

async fn stop_daemon(daemon: &mut DaemonChild, journal: &Journal) {
    if let Ok(Some(_)) = daemon.child.try_wait() {
        return;
    }
    if let Ok(raw) = i32::try_from(daemon.pid) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    match tokio::time::timeout(STOP_GRACE, daemon.child.wait()).await {
        Ok(_) => journal.line("• delivery daemon stopped"),
        Err(_) => {
            let _ = daemon.child.kill().await;
            journal.line(format!(
                "! delivery daemon did not exit {} s after SIGTERM; killed",
                STOP_GRACE.as_secs()
            ));
        }
    }
}

async fn stop_broker(broker: &mut BrokerChild, journal: &Journal) {
    if let Some(pid) = broker.child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(STOP_GRACE, broker.child.wait())
        .await
        .is_err()
    {
        let _ = broker.child.kill().await;
    }
    journal.line("• nats-server stopped");
}
