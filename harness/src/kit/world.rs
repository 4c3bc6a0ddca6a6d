//! The world a case runs in: the mesh it started (brokers of its shape, the workspace root, the
//! operator's view of the broker), and every actor its steps created by name: proxies, daemon
//! processes, standby host roots, agents, the posts they made, remembered rows and counters,
//! timed events and figures. Steps act on it; the runner turns what they saw into a transcript.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cotal_delivery::agent::{Agent, Delivery, Frame};
use cotal_delivery::base::Credential;
use cotal_delivery::provision::{AgentMaterial, MintOptions, Profile};
use serde_json::Value;

use super::expr::Vars;
use super::failure::Failure;
use super::holdings::Holdings;
use super::under_test::{DaemonUnderTest, RunOptions};
use super::watch::{AdminState, AdvisoryWatch, LeaseLogWatch};
use crate::kit::shape::{Preset, Shape};
use crate::rig::daemon::{Daemon, DaemonSpec};
use crate::rig::mesh::{Inspector, LeaseRow, Mesh};
use crate::rig::proxy::TcpProxy;

/// A post an agent made, kept under its text.
#[derive(Debug, Clone)]
pub struct Post {
    pub seq: u64,
    pub channel: String,
    pub id: String,
    pub msg: Value,
    pub agent: String,
}

/// An agent actor: its lifecycle's material, its connection while online, its bound `dlv_`
/// durable, the generation each durable join returned, and every frame it surfaced.
pub struct AgentActor {
    pub material: AgentMaterial,
    pub client: Option<Agent>,
    pub delivery: Option<Delivery>,
    pub generations: BTreeMap<String, u64>,
    pub surfaced: Vec<Frame>,
}

/// The owner's remints of the daemon's delivery credential, in order.
#[derive(Default)]
pub struct Remints {
    /// The credential the mesh was provisioned with (or reminted to before any start).
    pub original: Option<Credential>,
    pub written: Vec<Credential>,
}

/// Everything a case's steps act on.
pub struct World {
    pub opts: RunOptions,
    pub shape: Shape,
    pub vars: Vars,
    /// The daemons' environment (`[env]`, scaled form applied).
    pub env: Vec<(String, String)>,
    pub mesh: Mesh,
    pub insp: Inspector,
    pub proxies: BTreeMap<String, TcpProxy>,
    /// Brokers that require no authentication (`open_broker`), by the name of their proxy.
    pub open_brokers: BTreeMap<String, crate::rig::broker::Broker>,
    pub daemons: BTreeMap<String, Daemon>,
    /// The delivery credential file each daemon was started with (its lease holder).
    pub daemon_creds: BTreeMap<String, PathBuf>,
    /// The root whose `.cotal/` holds each daemon's credentials (a standby host's own root).
    pub daemon_roots: BTreeMap<String, PathBuf>,
    /// Connections remembered by `remember_connections`: the broker's ids of every connection
    /// it listed then, open or closed.
    pub connection_sets: BTreeMap<String, std::collections::BTreeSet<(usize, u64)>>,
    pub hosts: BTreeMap<String, tempfile::TempDir>,
    pub agents: BTreeMap<String, AgentActor>,
    pub posts: BTreeMap<String, Post>,
    pub leases: BTreeMap<String, LeaseRow>,
    pub counters: BTreeMap<String, u64>,
    pub advisories: BTreeMap<String, AdvisoryWatch>,
    /// Broker watches of the lease key (`watch_lease`), by name.
    pub lease_logs: BTreeMap<String, LeaseLogWatch>,
    pub remints: Remints,
    /// The admin rail's caller, connected on first use.
    pub supervisor: Option<async_nats::Client>,
    /// Requests in flight, one-shot connections and sweep watches (the admin rail's steps).
    pub admin: AdminState,
    pub marks: BTreeMap<String, Instant>,
    /// When the thing a step awaited happened, when the step knows it better than the moment
    /// it saw it (a broker's stamp): its `mark`, `since` bound and `figure` use this instant.
    pub happened_at: Option<Instant>,
    pub figures: Vec<(String, u128)>,
    /// An empty directory outside every workspace.
    pub outside: tempfile::TempDir,
    /// A process planted to hold a reused pid.
    pub sleeper: Option<std::process::Child>,
    /// What the anycast, timer-writer, membership-feed and supervision verbs keep.
    pub holdings: Holdings,
}

/// Lifetime of the harness's own broker view: longer than any case.
const INSPECTOR_LIFETIME: Duration = Duration::from_secs(4 * 3600);
/// Bound on closing a case's connections at its end (each drain flushes what is buffered).
const CLOSE_BOUND: Duration = Duration::from_secs(2);

impl World {
    /// Where `injected_store` puts its store: outside every workspace.
    pub fn injected_store_dir(&self) -> std::path::PathBuf {
        self.outside.path().join("injected-store")
    }

    /// Ends the case: closes every connection it opened while its brokers still run, then drops
    /// the rest (daemons, brokers, directories). A client dropped after its broker is gone is
    /// left redialling: its connection task is busy reconnecting and never sees the drop. In
    /// `harness qualify`, which runs every case on one runtime, that client dials the port a
    /// later case's broker takes (seen: two agents of `data-path/live-mention-reaches-authorized-non-member`
    /// counted three minutes later against `standby/refuses-malformed-credential`'s daemon).
    pub async fn close(mut self) {
        let mut clients: Vec<async_nats::Client> = Vec::new();
        for a in self.agents.values_mut() {
            a.delivery = None;
            if let Some(agent) = a.client.take() {
                clients.push(agent.client().clone());
            }
        }
        clients.extend(self.supervisor.take());
        clients.extend(std::mem::take(&mut self.admin.once).into_values());
        clients.push(self.insp.client.clone());
        // `drain` only asks: the connection task flushes and ends on its own time. A flush
        // fails once that task is gone (nothing reads the client's commands any more), so the
        // brokers stop only after every client's task has ended, or the bound ran out.
        let closed = futures::future::join_all(clients.iter().map(|c| async move {
            let _ = c.drain().await;
            while c.flush().await.is_ok() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
        let _ = tokio::time::timeout(CLOSE_BOUND, closed).await;
        drop(self);
    }

    /// Starts a mesh of `spec` in `shape`: its daemons get `env`, its durations are `vars` (a
    /// case's, or the simulation's).
    pub async fn start(
        spec: &crate::kit::shape::MeshSpec,
        shape: &Shape,
        env: Vec<(String, String)>,
        vars: Vars,
        opts: &RunOptions,
    ) -> Result<World, Failure> {
        let ttl_ms = spec.lease_ttl_ms.eval(&vars).map_err(Failure::could_not)?;
        // Built (when stale) before anything is minted: a case's short credential lifetimes
        // and its credential_time events are not spent on a build.
        if let DaemonUnderTest::Workspace = opts.daemon {
            crate::rig::daemon::daemon_bin()?;
        }
        let mut builder = Mesh::builder()
            .space(&spec.space)?
            .lease_ttl(Duration::from_millis(ttl_ms))
            .evictor(spec.evictor);
        for s in &spec.spaces {
            builder = builder.space(s)?;
        }
        let tls = shape.has(Preset::Tls);
        let max_payload = shape.has(Preset::MaxPayload).then_some(spec.max_payload);
        let store_cap = spec.max_file_store_bytes;
        builder = builder.broker(move |mut b| {
            if tls {
                b = b.tls();
            }
            if let Some(p) = max_payload {
                b = b.max_payload_bytes(p);
            }
            if let Some(c) = store_cap {
                b = b.max_file_store_bytes(c);
            }
            b
        });
        if shape.has(Preset::Cluster) {
            builder = builder.cluster(3);
        }
        let mesh = builder.start().await?;
        if spec.signer {
            mesh.authority
                .save(&mesh.workspace().auth_dir())
                .map_err(|e| Failure::could_not(format!("save the signer: {e}")))?;
        }
        let path = mesh.workspace().delivery_creds_path(mesh.space());
        let mut original = cotal_delivery::base::read_creds_file(&path)
            .map_err(|e| Failure::could_not(format!("read the delivery credential: {e}")))?;
        if let Some(life) = &spec.delivery_lifetime_ms {
            let ms = life.eval(&vars).map_err(Failure::could_not)?;
            original = mesh.mint(
                mesh.space(),
                &Profile::Delivery,
                MintOptions::new()
                    .renewal_of(&original)
                    .expires_in(Duration::from_millis(ms)),
            )?;
            cotal_delivery::base::write_creds_file_atomic(&path, &original)
                .map_err(|e| Failure::could_not(format!("write the delivery credential: {e}")))?;
        }
        let insp = mesh
            .inspector_with(
                mesh.space(),
                MintOptions::new().expires_in(INSPECTOR_LIFETIME),
            )
            .await?;
        let outside = tempfile::Builder::new()
            .prefix("cotal-outside-")
            .tempdir()
            .map_err(|e| Failure::could_not(format!("create a directory outside: {e}")))?;
        Ok(World {
            opts: opts.clone(),
            shape: shape.clone(),
            vars,
            env,
            mesh,
            insp,
            proxies: BTreeMap::new(),
            open_brokers: BTreeMap::new(),
            daemons: BTreeMap::new(),
            daemon_creds: BTreeMap::new(),
            daemon_roots: BTreeMap::new(),
            connection_sets: BTreeMap::new(),
            hosts: BTreeMap::new(),
            agents: BTreeMap::new(),
            posts: BTreeMap::new(),
            leases: BTreeMap::new(),
            counters: BTreeMap::new(),
            advisories: BTreeMap::new(),
            lease_logs: BTreeMap::new(),
            remints: Remints {
                original: Some(original),
                written: Vec::new(),
            },
            supervisor: None,
            admin: Default::default(),
            marks: BTreeMap::new(),
            happened_at: None,
            figures: Vec::new(),
            outside,
            sleeper: None,
            holdings: Holdings::default(),
        })
    }

    pub fn daemon(&mut self, name: &str) -> Result<&mut Daemon, Failure> {
        self.daemons
            .get_mut(name)
            .ok_or_else(|| Failure::could_not(format!("no daemon named {name:?} was started")))
    }

    pub fn agent(&mut self, name: &str) -> Result<&mut AgentActor, Failure> {
        self.agents
            .get_mut(name)
            .ok_or_else(|| Failure::could_not(format!("no agent named {name:?}")))
    }

    pub fn proxy(&self, name: &str) -> Result<&TcpProxy, Failure> {
        self.proxies
            .get(name)
            .ok_or_else(|| Failure::could_not(format!("no proxy named {name:?}")))
    }

    /// The post kept under `text`.
    pub fn post(&self, text: &str) -> Result<&Post, Failure> {
        self.posts
            .get(text)
            .ok_or_else(|| Failure::could_not(format!("no post with text {text:?}")))
    }

    /// The daemon under test as a process spec: `deliver --space <space>` (or the template),
    /// dialing `server`, run from `cwd`, with the case's environment.
    pub fn deliver_spec(&self, server: &str, cwd: &Path) -> Result<DaemonSpec, Failure> {
        let space = self.mesh.space();
        let ca = self.mesh.tls_ca();
        let mut spec = match &self.opts.daemon {
            DaemonUnderTest::Cmd(cmd) => cmd.spec(&super::template::Values {
                space: space.as_str().to_string(),
                server: server.to_string(),
                root: self.mesh.root().to_path_buf(),
                creds: None,
                tls_ca: ca.clone(),
                cwd: cwd.to_path_buf(),
            })?,
            other => {
                let mut spec = DaemonSpec::deliver(space.as_str(), cwd).server(server);
                if let Some(ca) = &ca {
                    spec = spec.arg("--tls").arg("--tls-ca").arg(ca);
                }
                if let DaemonUnderTest::Bin(b) = other {
                    spec = spec.bin(b);
                }
                spec
            }
        };
        for (k, v) in &self.env {
            spec = spec.env(k, v.clone());
        }
        Ok(spec)
    }

    /// A command of this distribution (`cotal-delivery <args>`) run from `cwd`.
    pub fn command_spec(&self, args: &[String], cwd: &Path) -> Result<DaemonSpec, Failure> {
        let bin = self.opts.distribution_bin()?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut spec = DaemonSpec::command(&args, cwd).bin(bin);
        for (k, v) in &self.env {
            spec = spec.env(k, v.clone());
        }
        Ok(spec)
    }

    /// The lease holder (`local.<nkey>`) of the delivery credential at `path`.
    pub fn holder_of_creds(path: &Path) -> Result<String, Failure> {
        let cred = cotal_delivery::base::read_creds_file(path)
            .map_err(|e| Failure::could_not(format!("read {}: {e}", path.display())))?;
        let nkey = cred
            .public_key()
            .map_err(|e| Failure::could_not(e.to_string()))?;
        cotal_delivery::wire::Principal::for_nkey(&nkey)
            .map(|p| p.dot_form())
            .map_err(|e| Failure::could_not(e.to_string()))
    }

    /// Paths that name this run's directories, replaced by stable tokens in the transcript.
    pub fn path_tokens(&self) -> Vec<(PathBuf, String)> {
        let mut out = vec![
            (self.mesh.root().to_path_buf(), "[ROOT]".to_string()),
            (self.outside.path().to_path_buf(), "[OUTSIDE]".to_string()),
        ];
        for (name, dir) in &self.hosts {
            out.push((dir.path().to_path_buf(), format!("[HOST {name}]")));
        }
        if let Some(s) = &self.holdings.supervised {
            out.push((s.root(), "[UP ROOT]".to_string()));
        }
        out
    }

    /// Copies what the run leaves behind into `dir`: each daemon's lines, each broker's log, the
    /// workspace's own log files.
    pub fn keep(&self, dir: &Path, transcript: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("transcript.txt"), transcript)?;
        for (name, d) in &self.daemons {
            let mut text = d.lines().join("\n");
            text.push('\n');
            std::fs::write(dir.join(format!("daemon-{name}.log")), text)?;
        }
        for i in 0..self.mesh.node_count() {
            if let Some(node) = self.mesh.node(i) {
                let _ = std::fs::copy(node.log_path(), dir.join(format!("broker-{i}.log")));
            }
        }
        let cotal = self.mesh.workspace().cotal_dir();
        if let Ok(entries) = std::fs::read_dir(&cotal) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    if let Some(name) = p.file_name() {
                        let _ = std::fs::copy(&p, dir.join(name));
                    }
                }
            }
        }
        Ok(())
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(mut s) = self.sleeper.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}
