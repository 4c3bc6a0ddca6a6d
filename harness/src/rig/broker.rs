//! One real nats-server per test. A `Broker` owns its process and its temp dir (config, JetStream
//! store, log, ports file); ports come from `--ports_file_dir` and readiness from `/healthz`, never
//! from a sleep. Faults (SIGKILL, SIGTERM, SIGSTOP/SIGCONT, restart on the same port and store)
//! are methods, so a test reads like the story it checks. The configuration is rendered by the
//! daemon's own `ServerConf`, so a test broker is configured exactly like an operator's.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use cotal_delivery::provision::{ClusterConf, OperatorAuth, ServerConf, TlsFiles};
use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::rig::error::HarnessError;
use crate::rig::http;
use crate::rig::process::ServerProcess;
use crate::rig::server_bin::nats_server_bin;
use crate::rig::tls::TestPki;
use crate::rig::wait::{wait_until, Outcome};

/// Default bound for each readiness stage (ports file, then `/healthz`).
pub const DEFAULT_READY_BOUND: Duration = Duration::from_secs(20);
/// How often readiness is polled.
const READY_POLL: Duration = Duration::from_millis(20);
/// Bound for one monitoring request.
const MONITOR_REQUEST_BOUND: Duration = Duration::from_secs(5);
/// Lines of the broker log shown in errors and on a failed test.
const LOG_TAIL_LINES: usize = 40;

const CONF_FILE: &str = "server.conf";
const LOG_FILE: &str = "nats-server.log";
const OUTPUT_FILE: &str = "nats-server.out";
const STORE_DIR: &str = "js";
const PORTS_DIR: &str = "ports";

/// Configuration of a broker to start. Defaults: JetStream on, plaintext, random client port,
/// random monitoring port, name `broker`.
#[derive(Debug, Clone)]
pub struct BrokerBuilder {
    name: String,
    jetstream: bool,
    tls: bool,
    max_payload_bytes: Option<u64>,
    max_file_store_bytes: Option<u64>,
    operator: Option<OperatorAuth>,
    ping_interval_ms: Option<u64>,
    port: Option<u16>,
    ready_bound: Duration,
    die_with_thread: bool,
    cluster: Option<ClusterConf>,
}

impl Default for BrokerBuilder {
    fn default() -> Self {
        BrokerBuilder {
            name: "broker".into(),
            jetstream: true,
            tls: false,
            max_payload_bytes: None,
            max_file_store_bytes: None,
            operator: None,
            ping_interval_ms: None,
            port: None,
            ready_bound: DEFAULT_READY_BOUND,
            die_with_thread: true,
            cluster: None,
        }
    }
}

impl BrokerBuilder {
    pub fn new() -> BrokerBuilder {
        BrokerBuilder::default()
    }
    /// JetStream with a file store in the broker's dir (default on).
    pub fn jetstream(mut self, on: bool) -> Self {
        self.jetstream = on;
        self
    }
    /// Require TLS of every client, with a freshly generated CA and leaf (see [`TestPki`]).
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }
    pub fn max_payload_bytes(mut self, bytes: u64) -> Self {
        self.max_payload_bytes = Some(bytes);
        self
    }
    pub fn max_file_store_bytes(mut self, bytes: u64) -> Self {
        self.max_file_store_bytes = Some(bytes);
        self
    }
    /// Operator mode with a memory resolver preloaded with the given accounts.
    pub fn operator(mut self, auth: OperatorAuth) -> Self {
        self.operator = Some(auth);
        self
    }
    /// Server-side ping interval towards clients.
    pub fn ping_interval_ms(mut self, ms: u64) -> Self {
        self.ping_interval_ms = Some(ms);
        self
    }
    /// A fixed client port (default: random, read from the ports file).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }
    /// `server_name`, also used in the temp dir name and in errors.
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
    /// Bound for each readiness stage (default [`DEFAULT_READY_BOUND`]).
    pub fn ready_bound(mut self, bound: Duration) -> Self {
        self.ready_bound = bound;
        self
    }
    /// Whether the broker process is SIGKILLed by the kernel when the thread that spawned (or
    /// restarted) it exits (Linux `PR_SET_DEATHSIG`; default on). It keeps a killed test binary
    /// from leaving brokers behind. Turn it off for a broker shared across tests through a
    /// static, whose spawning test thread ends before the other tests do.
    pub fn die_with_thread(mut self, on: bool) -> Self {
        self.die_with_thread = on;
        self
    }
    pub(crate) fn cluster(mut self, cluster: ClusterConf) -> Self {
        self.cluster = Some(cluster);
        self
    }
    pub(crate) fn ready_bound_value(&self) -> Duration {
        self.ready_bound
    }
    pub(crate) fn name_value(&self) -> &str {
        &self.name
    }

    /// Starts the broker and waits until it is ready: ports file written, `/healthz` 200.
    pub async fn start(self) -> Result<Broker, HarnessError> {
        let bound = self.ready_bound;
        let broker = self.spawn().await?;
        broker.wait_healthy(bound).await?;
        Ok(broker)
    }

    /// Starts the process and waits for its ports file only. A cluster node's `/healthz` stays
    /// 503 until enough peers are up, so a cluster spawns every node before checking health.
    pub(crate) async fn spawn(self) -> Result<Broker, HarnessError> {
        let bin = nats_server_bin()?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("cotal-broker-{}-", sanitize(&self.name)))
            .tempdir()
            .map_err(|e| HarnessError::io("create broker temp dir", e))?;
        let dir_path = dir.path().to_path_buf();
        let ports_dir = dir_path.join(PORTS_DIR);
        std::fs::create_dir_all(&ports_dir)
            .map_err(|e| HarnessError::io(format!("create {}", ports_dir.display()), e))?;
        let pki = if self.tls {
            Some(TestPki::generate(&dir_path)?)
        } else {
            None
        };

        let mut conf = ServerConf::new()
            .server_name(self.name.as_str())
            .monitoring_port(0);
        if let Some(port) = self.port {
            conf = conf.port(port);
        }
        if self.jetstream {
            conf = conf.jetstream(dir_path.join(STORE_DIR));
        }
        if let Some(bytes) = self.max_file_store_bytes {
            conf = conf.max_file_store_bytes(bytes);
        }
        if let Some(bytes) = self.max_payload_bytes {
            conf = conf.max_payload_bytes(bytes);
        }
        if let Some(ms) = self.ping_interval_ms {
            conf = conf.ping_interval_ms(ms);
        }
        if let Some(pki) = &pki {
            conf = conf.tls(TlsFiles {
                cert_file: pki.server_cert.clone(),
                key_file: pki.server_key.clone(),
            });
        }
        if let Some(auth) = self.operator {
            conf = conf.operator(auth);
        }
        if let Some(cluster) = &self.cluster {
            conf = conf.cluster(cluster.clone());
        }

        let process = launch(&bin, &dir_path, &conf, self.die_with_thread).map_err(|message| {
            HarnessError::Spawn {
                name: self.name.clone(),
                message,
                log: dir_path.join(LOG_FILE),
                log_tail: String::new(),
            }
        })?;
        let mut broker = Broker {
            name: self.name,
            bin,
            dir: Some(dir),
            dir_path,
            conf,
            pki,
            process,
            port: 0,
            monitoring_port: 0,
            cluster_port: self.cluster.as_ref().map(|c| c.listen_port),
            ready_bound: self.ready_bound,
            die_with_thread: self.die_with_thread,
        };
        let ports = broker.wait_ports(self.ready_bound).await?;
        broker.port = ports.client;
        broker.monitoring_port = ports.monitoring;
        Ok(broker)
    }
}

/// A running nats-server owned by the test. Dropping it SIGKILLs and reaps the process; the temp
/// dir is removed, or kept (path and log tail printed) when the thread is panicking.
#[derive(Debug)]
pub struct Broker {
    name: String,
    bin: PathBuf,
    dir: Option<TempDir>,
    dir_path: PathBuf,
    conf: ServerConf,
    pki: Option<TestPki>,
    process: ServerProcess,
    port: u16,
    monitoring_port: u16,
    cluster_port: Option<u16>,
    ready_bound: Duration,
    die_with_thread: bool,
}

impl Broker {
    pub fn builder() -> BrokerBuilder {
        BrokerBuilder::new()
    }

    /// `nats://127.0.0.1:<port>`, or `tls://...` for a TLS broker.
    pub fn client_url(&self) -> String {
        let scheme = if self.pki.is_some() { "tls" } else { "nats" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }
    pub fn port(&self) -> u16 {
        self.port
    }
    pub fn monitoring_port(&self) -> u16 {
        self.monitoring_port
    }
    /// `http://127.0.0.1:<monitoring port>`.
    pub fn monitoring_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.monitoring_port)
    }
    /// The cluster listen port, for a cluster node.
    pub fn cluster_port(&self) -> Option<u16> {
        self.cluster_port
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
    pub fn dir(&self) -> &Path {
        &self.dir_path
    }
    pub fn config_path(&self) -> PathBuf {
        self.dir_path.join(CONF_FILE)
    }
    /// The CA a client must trust, for a TLS broker.
    pub fn ca_pem_path(&self) -> Option<PathBuf> {
        self.pki.as_ref().map(|p| p.ca_cert.clone())
    }
    pub fn log_path(&self) -> PathBuf {
        self.dir_path.join(LOG_FILE)
    }
    /// The JetStream store dir (exists once JetStream has started).
    pub fn store_dir(&self) -> PathBuf {
        self.dir_path.join(STORE_DIR)
    }
    /// The configuration as rendered (ports pinned after a restart).
    pub fn conf(&self) -> &ServerConf {
        &self.conf
    }

    /// Connect options for this broker: the CA is trusted and TLS required for a TLS broker.
    pub fn connect_options(&self) -> async_nats::ConnectOptions {
        let options = async_nats::ConnectOptions::new();
        match self.ca_pem_path() {
            Some(ca) => options.add_root_certificates(ca).require_tls(true),
            None => options,
        }
    }

    /// The last `lines` lines of the broker log (and of its stdout/stderr, if any).
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.dir_path, lines)
    }

    /// `GET <path_and_query>` on the monitoring port, as JSON; anything but 200 is an error.
    pub async fn monitor(&self, path_and_query: &str) -> Result<serde_json::Value, HarnessError> {
        let response =
            http::get(self.monitoring_port, path_and_query, MONITOR_REQUEST_BOUND).await?;
        let url = format!("{}{path_and_query}", self.monitoring_url());
        if response.status != 200 {
            return Err(HarnessError::Monitoring {
                url,
                message: format!(
                    "status {}: {}",
                    response.status,
                    String::from_utf8_lossy(&response.body)
                ),
            });
        }
        response
            .json()
            .map_err(|message| HarnessError::Monitoring { url, message })
    }
    pub async fn varz(&self) -> Result<serde_json::Value, HarnessError> {
        self.monitor("/varz").await
    }
    pub async fn jsz(&self) -> Result<serde_json::Value, HarnessError> {
        self.monitor("/jsz").await
    }
    /// The `/healthz` body, for a healthy (200) and an unhealthy (503) broker alike; the body's
    /// `status` says which.
    pub async fn healthz(&self) -> Result<serde_json::Value, HarnessError> {
        let response = http::get(self.monitoring_port, "/healthz", MONITOR_REQUEST_BOUND).await?;
        response.json().map_err(|message| HarnessError::Monitoring {
            url: format!("{}/healthz", self.monitoring_url()),
            message,
        })
    }

    /// SIGKILL: a crash. The process is reaped by [`Broker::wait_exit`], `restart` or `Drop`.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGKILL)
    }
    /// SIGTERM: a clean shutdown.
    pub fn terminate(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGTERM)
    }
    /// SIGSTOP: the broker stops answering without closing any socket.
    pub fn freeze(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGSTOP)
    }
    /// SIGCONT after [`Broker::freeze`].
    pub fn thaw(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGCONT)
    }
    /// Whether the process is still running (a frozen broker is running).
    pub fn is_running(&mut self) -> bool {
        self.process.poll_exit().is_none()
    }

    /// Waits up to `bound` for the process to exit and returns its status.
    pub async fn wait_exit(&mut self, bound: Duration) -> Result<ExitStatus, HarnessError> {
        let what = format!("broker {} (pid {}) to exit", self.name, self.pid());
        let process = &mut self.process;
        wait_until(bound, Duration::from_millis(10), &what, || {
            let status = process.poll_exit();
            async move { status }
        })
        .await
    }

    /// Restarts the broker on the same client and monitoring ports, with the same store dir and
    /// configuration; a still-running process is SIGKILLed first. Returns once ready again.
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        self.restart_process().await?;
        self.wait_healthy(self.ready_bound).await
    }

    /// Restart without the health wait (a cluster node checks health at cluster level).
    pub(crate) async fn restart_process(&mut self) -> Result<(), HarnessError> {
        self.process.kill_and_reap();
        self.conf = self
            .conf
            .clone()
            .port(self.port)
            .monitoring_port(self.monitoring_port);
        self.process = launch(&self.bin, &self.dir_path, &self.conf, self.die_with_thread)
            .map_err(|message| self.spawn_error(message))?;
        let ports = self.wait_ports(self.ready_bound).await?;
        if ports.client != self.port || ports.monitoring != self.monitoring_port {
            return Err(self.spawn_error(format!(
                "restarted on ports {}/{} instead of {}/{}",
                ports.client, ports.monitoring, self.port, self.monitoring_port
            )));
        }
        Ok(())
    }

    /// Waits up to `bound` for `GET /healthz` to answer 200.
    pub async fn wait_healthy(&self, bound: Duration) -> Result<(), HarnessError> {
        let port = self.monitoring_port;
        let what = format!("broker {} /healthz to answer 200", self.name);
        wait_until(bound, READY_POLL, &what, || async move {
            match http::get(port, "/healthz", MONITOR_REQUEST_BOUND).await {
                Ok(r) if r.status == 200 => Ok(()),
                Ok(r) => Err(format!(
                    "status {}: {}",
                    r.status,
                    String::from_utf8_lossy(&r.body).trim()
                )),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .map_err(|e| self.not_ready(e))
    }

    /// Waits for this process's ports file; fails at once if the process exits.
    async fn wait_ports(&mut self, bound: Duration) -> Result<Ports, HarnessError> {
        let pid = self.process.pid();
        let file = self
            .dir_path
            .join(PORTS_DIR)
            .join(format!("nats-server_{pid}.ports"));
        let what = format!("broker {} ports file {}", self.name, file.display());
        let name = self.name.clone();
        let dir = self.dir_path.clone();
        let process = &mut self.process;
        let result = wait_until(bound, READY_POLL, &what, || {
            let exited = process.poll_exit();
            let outcome = match exited {
                Some(status) => Outcome::Abort(HarnessError::Spawn {
                    name: name.clone(),
                    message: format!("exited before it was listening ({status})"),
                    log: dir.join(LOG_FILE),
                    log_tail: log_tail(&dir, LOG_TAIL_LINES),
                }),
                None => match std::fs::read(&file) {
                    Ok(bytes) => match Ports::parse(&bytes) {
                        Ok(ports) => Outcome::Ready(ports),
                        Err(e) => Outcome::Retry(Some(e)),
                    },
                    Err(e) => Outcome::Retry(Some(e.to_string())),
                },
            };
            async move { outcome }
        })
        .await;
        result.map_err(|e| match e {
            HarnessError::Timeout { .. } => self.not_ready(e),
            other => other,
        })
    }

    fn spawn_error(&self, message: String) -> HarnessError {
        HarnessError::Spawn {
            name: self.name.clone(),
            message,
            log: self.log_path(),
            log_tail: self.log_tail(LOG_TAIL_LINES),
        }
    }

    fn not_ready(&self, cause: HarnessError) -> HarnessError {
        HarnessError::NotReady {
            name: self.name.clone(),
            message: cause.to_string(),
            log: self.log_path(),
            log_tail: self.log_tail(LOG_TAIL_LINES),
        }
    }

    fn signal(&mut self, signal: Signal) -> Result<(), HarnessError> {
        self.process
            .signal(signal)
            .map_err(|message| HarnessError::Signal {
                name: self.name.clone(),
                signal: signal.as_str().to_string(),
                message,
            })
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.process.kill_and_reap();
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                let kept = dir.keep();
                eprintln!(
                    "broker {} kept for the failed test: {}\n--- broker log tail ---\n{}",
                    self.name,
                    kept.display(),
                    log_tail(&kept, LOG_TAIL_LINES)
                );
            }
        }
    }
}

/// Ports read from `nats-server_<pid>.ports`.
#[derive(Debug, Clone, Copy)]
struct Ports {
    client: u16,
    monitoring: u16,
}

impl Ports {
    fn parse(bytes: &[u8]) -> Result<Ports, String> {
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| format!("ports file not complete JSON yet: {e}"))?;
        let port_of = |key: &str| -> Result<u16, String> {
            value[key][0]
                .as_str()
                .and_then(|url| url.rsplit(':').next())
                .and_then(|p| p.parse::<u16>().ok())
                .ok_or_else(|| format!("ports file has no {key} URL: {value}"))
        };
        Ok(Ports {
            client: port_of("nats")?,
            monitoring: port_of("monitoring")?,
        })
    }
}

/// Writes the config, removes stale ports files (one stays behind after SIGKILL) and spawns.
fn launch(
    bin: &Path,
    dir: &Path,
    conf: &ServerConf,
    die_with_thread: bool,
) -> Result<ServerProcess, String> {
    let conf_path = dir.join(CONF_FILE);
    std::fs::write(&conf_path, conf.render())
        .map_err(|e| format!("write {}: {e}", conf_path.display()))?;
    let ports_dir = dir.join(PORTS_DIR);
    if let Ok(entries) = std::fs::read_dir(&ports_dir) {
        for entry in entries.flatten() {
            if entry.path().extension().is_some_and(|e| e == "ports") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let log = dir.join(LOG_FILE);
    let args: [&OsStr; 6] = [
        OsStr::new("-c"),
        conf_path.as_os_str(),
        OsStr::new("-l"),
        log.as_os_str(),
        OsStr::new("--ports_file_dir"),
        ports_dir.as_os_str(),
    ];
    ServerProcess::spawn(bin, &args, &dir.join(OUTPUT_FILE), die_with_thread)
        .map_err(|e| format!("spawn {}: {e}", bin.display()))
}

fn log_tail(dir: &Path, lines: usize) -> String {
    let mut out = String::new();
    for file in [LOG_FILE, OUTPUT_FILE] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        let tail = &all[all.len().saturating_sub(lines)..];
        if !tail.is_empty() {
            if !out.is_empty() {
                out.push_str(&format!("--- {file} ---\n"));
            }
            out.push_str(&tail.join("\n"));
            out.push('\n');
        }
    }
    if out.is_empty() {
        out.push_str("(empty)\n");
    }
    out
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_ports_file() {
        let p = Ports::parse(
            br#"{"nats":["tls://127.0.0.1:37337"],"monitoring":["http://127.0.0.1:39695"]}"#,
        );
        assert_eq!(
            p.ok().map(|p| (p.client, p.monitoring)),
            Some((37337, 39695))
        );
        assert!(Ports::parse(br#"{"nats":["tls://127.0.0.1:3"#).is_err());
    }
}
