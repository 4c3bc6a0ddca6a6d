//! Scenarios as data: `scenarios/<name>.toml` is a script of steps (start a mesh, start daemons,
//! signal them, touch the lease row as an operator, wait for lines, check the broker). `run`
//! executes one against the real daemon binary and returns a normalised transcript that
//! `harness run <file>` prints and `cargo test` compares with its insta snapshot. Every `expect_*`
//! step checks the broker or the process from the outside, never the daemon's word alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cotal_delivery::base::{self, write_creds_file_atomic};
use cotal_delivery::provision::{encode_user, UserClaimsSpec};
use cotal_delivery::provision::{MeshAuthority, MintOptions, Profile, SystemProfile};
use cotal_delivery::wire::LeaseInfo;
use serde::Deserialize;

use crate::daemon::{Daemon, DaemonSpec};
use crate::error::HarnessError;
use crate::mesh::{Inspector, LeaseRow, Mesh};
use crate::wait::wait_until;

/// A scenario file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub mesh: MeshSpec,
    #[serde(rename = "step")]
    pub steps: Vec<Step>,
}

/// The mesh a scenario runs on.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeshSpec {
    #[serde(default = "default_space")]
    pub space: String,
    #[serde(default = "default_lease_ttl_ms")]
    pub lease_ttl_ms: u64,
    #[serde(default)]
    pub tls: bool,
    /// JetStream file store cap of the broker, bytes.
    #[serde(default)]
    pub max_file_store_bytes: Option<u64>,
}

impl Default for MeshSpec {
    fn default() -> Self {
        MeshSpec {
            space: default_space(),
            lease_ttl_ms: default_lease_ttl_ms(),
            tls: false,
            max_file_store_bytes: None,
        }
    }
}

fn default_space() -> String {
    "demo".into()
}
fn default_lease_ttl_ms() -> u64 {
    30_000
}
fn default_within_ms() -> u64 {
    20_000
}

/// Which credential a daemon is started with.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum CredsChoice {
    /// The provisioned `delivery.creds` (no `--creds` flag).
    Workspace,
    /// A `membership-rw` credential passed with `--creds`: it may not write the lease.
    MembershipRw,
    /// The delivery credential copied under *another* workspace's `.cotal/` and passed with
    /// `--creds` while the daemon runs from this workspace's root.
    OtherWorkspace,
}

/// Where a daemon is started from.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum CwdChoice {
    /// The workspace root.
    Root,
    /// An empty directory outside every workspace.
    Outside,
}

/// One step. Exactly one key per `[[step]]` table.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Start a daemon under a name.
    Start {
        daemon: String,
        #[serde(default = "workspace_creds")]
        creds: CredsChoice,
        #[serde(default = "root_cwd")]
        cwd: CwdChoice,
        /// Pass `--tls` even though the mesh's broker offers no TLS.
        #[serde(default)]
        demand_tls: bool,
    },
    /// Wait for a line containing `contains`.
    WaitLine {
        daemon: String,
        contains: String,
        #[serde(default = "default_within_ms")]
        within_ms: u64,
    },
    /// Assert no line so far contains `contains`.
    NoLine { daemon: String, contains: String },
    /// Assert the line containing `first` comes before the one containing `then`.
    LineOrder {
        daemon: String,
        first: String,
        then: String,
    },
    /// Send a signal: TERM, INT, KILL, STOP or CONT.
    Signal { daemon: String, signal: String },
    /// Wait for the process to exit with `code`.
    ExpectExit {
        daemon: String,
        code: i32,
        #[serde(default = "default_within_ms")]
        within_ms: u64,
    },
    /// Assert the process is still running.
    ExpectRunning { daemon: String },
    /// Check the lease row as the broker holds it.
    ExpectLease {
        #[serde(default)]
        absent: bool,
        #[serde(default)]
        ready: Option<bool>,
        /// The row must equal (holder, incarnation, since) of a row remembered under this name.
        #[serde(default)]
        same_as: Option<String>,
        /// Wait up to this long for the row to match.
        #[serde(default)]
        within_ms: Option<u64>,
    },
    /// Remember the current lease row under a name.
    RememberLease { name: String },
    /// Delete the lease row as an operator would.
    DeleteLease {},
    /// Write the current row's exact bytes again (revision bumps, holder unchanged).
    RewriteLeaseIdentical {},
    /// Write the current row again with a fresh incarnation (same holder, another run).
    RewriteLeaseForeignIncarnation {},
    /// Check the space's pid record.
    ExpectPidRecord {
        /// `daemon name` (records that daemon's pid), `absent`.
        #[serde(default)]
        pid_of: Option<String>,
        #[serde(default)]
        absent: bool,
    },
    /// Write a pid record naming a live process that is not a delivery daemon (a reused pid).
    PlantReusedPid {},
    /// Run `cotal-delivery status` and expect a substring of its output and its exit code.
    Status { contains: String, code: i32 },
    /// Fill the broker's file store until a write is refused for lack of resources.
    FillStore {},
    /// Tamper with the `$SYS` pair next to the daemon's credentials.
    SysMaterial {
        /// `missing`, `other-account` (an observer that scans another account), or
        /// `several-accounts` (one whose grants scan this space's account and another one).
        #[serde(default)]
        observer: Option<String>,
        /// `missing`, or `other-signer` (an evictor signed by another system-account key).
        #[serde(default)]
        evictor: Option<String>,
    },
}

/// A `$SYS` observer of `ours`' system account whose grants scan `space`'s account in `ours`
/// and in `other` as well: what a wider provisioning tool could mint, signed by the right key.
fn observer_of_several_accounts(
    ours: &MeshAuthority,
    other: &MeshAuthority,
    space: &cotal_delivery::wire::Space,
) -> Result<cotal_delivery::base::Credential, HarnessError> {
    let usage = |e: &dyn std::fmt::Display| HarnessError::Usage(e.to_string());
    let ours_account = ours.account_public_key(space).map_err(|e| usage(&e))?;
    let other_account = other.account_public_key(space).map_err(|e| usage(&e))?;
    let mut permissions = SystemProfile::MembershipObserver.permissions(&ours_account);
    permissions.pub_allow.extend(
        SystemProfile::MembershipObserver
            .permissions(&other_account)
            .pub_allow,
    );
    let system = nkeys::KeyPair::from_seed(&ours.system_account_seed().map_err(|e| usage(&e))?)
        .map_err(|e| usage(&e))?;
    let user = nkeys::KeyPair::new_user();
    let spec = UserClaimsSpec::new(SystemProfile::MembershipObserver.name())
        .permissions(permissions)
        .expires_in(Some(Duration::from_secs(3600)));
    let jwt = encode_user(&system, &user.public_key(), &spec).map_err(|e| usage(&e))?;
    let seed = user.seed().map_err(|e| usage(&e))?;
    cotal_delivery::base::Credential::new(jwt, seed).map_err(|e| usage(&e))
}

fn workspace_creds() -> CredsChoice {
    CredsChoice::Workspace
}
fn root_cwd() -> CwdChoice {
    CwdChoice::Root
}

impl Scenario {
    pub fn load(path: &Path) -> Result<Scenario, HarnessError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| HarnessError::io(format!("read scenario {}", path.display()), e))?;
        toml::from_str(&text)
            .map_err(|e| HarnessError::Usage(format!("scenario {}: {e}", path.display())))
    }
}

/// Options of a run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The daemon binary (default: located next to the test executable or built).
    pub daemon_bin: Option<PathBuf>,
}

/// What a run produced.
#[derive(Debug)]
pub struct Outcome {
    /// The normalised transcript: steps, then each daemon's lines.
    pub transcript: String,
    /// Measured figures (name, milliseconds), e.g. how long an exit took.
    pub figures: Vec<(String, u128)>,
}

struct Run<'a> {
    scenario: &'a Scenario,
    options: &'a RunOptions,
    mesh: Mesh,
    inspector: Inspector,
    daemons: BTreeMap<String, Daemon>,
    remembered: BTreeMap<String, LeaseRow>,
    log: Vec<String>,
    figures: Vec<(String, u128)>,
    outside: tempfile::TempDir,
    sleeper: Option<std::process::Child>,
}

/// Runs a scenario to its end. A failed expectation is an error carrying the transcript so far.
pub async fn run(scenario: &Scenario, options: &RunOptions) -> Result<Outcome, HarnessError> {
    let spec = &scenario.mesh;
    let mut builder = Mesh::builder()
        .space(&spec.space)?
        .lease_ttl(Duration::from_millis(spec.lease_ttl_ms));
    let tls = spec.tls;
    let cap = spec.max_file_store_bytes;
    builder = builder.broker(move |mut b| {
        if tls {
            b = b.tls();
        }
        if let Some(c) = cap {
            b = b.max_file_store_bytes(c);
        }
        b
    });
    let mesh = builder.start().await?;
    let inspector = mesh.inspector(mesh.space()).await?;
    let outside = tempfile::Builder::new()
        .prefix("cotal-outside-")
        .tempdir()
        .map_err(|e| HarnessError::io("create outside dir", e))?;
    let mut run = Run {
        scenario,
        options,
        mesh,
        inspector,
        daemons: BTreeMap::new(),
        remembered: BTreeMap::new(),
        log: Vec::new(),
        figures: Vec::new(),
        outside,
        sleeper: None,
    };
    let result = run.all_steps().await;
    let transcript = run.transcript();
    if let Some(mut s) = run.sleeper.take() {
        let _ = s.kill();
        let _ = s.wait();
    }
    match result {
        Ok(()) => Ok(Outcome {
            transcript,
            figures: run.figures,
        }),
        Err(e) => Err(HarnessError::Usage(format!(
            "scenario {} failed: {e}\n--- transcript so far ---\n{transcript}",
            scenario.name
        ))),
    }
}

impl Run<'_> {
    async fn all_steps(&mut self) -> Result<(), HarnessError> {
        for (i, step) in self.scenario.steps.iter().enumerate() {
            let line = self
                .step(step)
                .await
                .map_err(|e| HarnessError::Usage(format!("step {} ({step:?}): {e}", i + 1)))?;
            self.log.push(format!("{:>2}. {line}", i + 1));
        }
        Ok(())
    }

    fn daemon(&mut self, name: &str) -> Result<&mut Daemon, HarnessError> {
        self.daemons
            .get_mut(name)
            .ok_or_else(|| HarnessError::Usage(format!("no daemon named {name:?} was started")))
    }

    async fn lease(&self) -> Result<Option<LeaseRow>, HarnessError> {
        self.inspector.lease().await
    }

    async fn step(&mut self, step: &Step) -> Result<String, HarnessError> {
        match step {
            Step::Start {
                daemon,
                creds,
                cwd,
                demand_tls,
            } => {
                let space = self.mesh.space().clone();
                let mut spec = match cwd {
                    CwdChoice::Root => self.mesh.deliver(&space),
                    CwdChoice::Outside => DaemonSpec::deliver(space.as_str(), self.outside.path())
                        .server(&self.mesh.url()),
                };
                if let Some(bin) = &self.options.daemon_bin {
                    spec = spec.bin(bin);
                }
                if *creds == CredsChoice::MembershipRw {
                    let cred =
                        self.mesh
                            .mint(&space, &Profile::MembershipRw, MintOptions::new())?;
                    let path = self.mesh.root().join("membership-rw-as-delivery.creds");
                    cotal_delivery::base::write_creds_file_atomic(&path, &cred)
                        .map_err(|e| HarnessError::Usage(e.to_string()))?;
                    spec = spec.arg("--creds").arg(path);
                }
                if *creds == CredsChoice::OtherWorkspace {
                    let other = self.outside.path().join("other-ws");
                    let dir = other.join(".cotal").join(space.segment());
                    std::fs::create_dir_all(&dir)
                        .map_err(|e| HarnessError::io("create other workspace", e))?;
                    let path = dir.join("delivery.creds");
                    std::fs::copy(self.mesh.workspace().delivery_creds_path(&space), &path)
                        .map_err(|e| HarnessError::io("copy creds", e))?;
                    spec = spec.arg("--creds").arg(path);
                }
                if *demand_tls {
                    spec = spec.arg("--tls");
                }
                let d = spec.spawn()?;
                self.daemons.insert(daemon.clone(), d);
                let tls = if *demand_tls { ", --tls" } else { "" };
                Ok(format!(
                    "start daemon {daemon} (creds: {creds:?}, cwd: {cwd:?}{tls})"
                ))
            }
            Step::WaitLine {
                daemon,
                contains,
                within_ms,
            } => {
                let d = self.daemon(daemon)?;
                d.wait_for_line(contains, Duration::from_millis(*within_ms))
                    .await?;
                Ok(format!("daemon {daemon} printed {contains:?}"))
            }
            Step::NoLine { daemon, contains } => {
                let d = self.daemon(daemon)?;
                if d.has_line(contains) {
                    return Err(HarnessError::Usage(format!(
                        "daemon {daemon} printed {contains:?}"
                    )));
                }
                Ok(format!("daemon {daemon} never printed {contains:?}"))
            }
            Step::LineOrder {
                daemon,
                first,
                then,
            } => {
                let lines = self.daemon(daemon)?.lines();
                let a = lines.iter().position(|l| l.contains(first.as_str()));
                let b = lines.iter().position(|l| l.contains(then.as_str()));
                match (a, b) {
                    (Some(a), Some(b)) if a < b => {
                        Ok(format!("daemon {daemon} printed {first:?} before {then:?}"))
                    }
                    _ => Err(HarnessError::Usage(format!(
                        "daemon {daemon}: expected {first:?} before {then:?}"
                    ))),
                }
            }
            Step::Signal { daemon, signal } => {
                let d = self.daemon(daemon)?;
                match signal.as_str() {
                    "TERM" => d.terminate()?,
                    "INT" => d.interrupt()?,
                    "KILL" => d.kill()?,
                    "STOP" => d.freeze()?,
                    "CONT" => d.thaw()?,
                    other => return Err(HarnessError::Usage(format!("unknown signal {other:?}"))),
                }
                Ok(format!("SIG{signal} to daemon {daemon}"))
            }
            Step::ExpectExit {
                daemon,
                code,
                within_ms,
            } => {
                let started = Instant::now();
                let d = self.daemon(daemon)?;
                let status = d.wait_exit(Duration::from_millis(*within_ms)).await?;
                let elapsed = started.elapsed().as_millis();
                if status.code() != Some(*code) {
                    return Err(HarnessError::Usage(format!(
                        "daemon {daemon} exited with {status}, expected code {code}"
                    )));
                }
                self.figures.push((format!("exit of {daemon}"), elapsed));
                Ok(format!("daemon {daemon} exited with code {code}"))
            }
            Step::ExpectRunning { daemon } => {
                if !self.daemon(daemon)?.is_running() {
                    return Err(HarnessError::Usage(format!(
                        "daemon {daemon} is not running"
                    )));
                }
                Ok(format!("daemon {daemon} is running"))
            }
            Step::ExpectLease {
                absent,
                ready,
                same_as,
                within_ms,
            } => {
                let want = same_as
                    .as_ref()
                    .map(|n| {
                        self.remembered.get(n).cloned().ok_or_else(|| {
                            HarnessError::Usage(format!("no lease remembered as {n:?}"))
                        })
                    })
                    .transpose()?;
                let check = |row: &Option<LeaseRow>| -> Result<(), String> {
                    match row {
                        None if *absent => Ok(()),
                        None => Err("no lease row".into()),
                        Some(r) if *absent => Err(format!("a lease row is present: {r:?}")),
                        Some(r) => {
                            if let Some(want_ready) = ready {
                                if r.info.ready != *want_ready {
                                    return Err(format!("ready is {}", r.info.ready));
                                }
                            }
                            if let Some(w) = &want {
                                if !same_holder_run(&w.info, &r.info) {
                                    return Err(format!(
                                        "row is {:?}, expected {:?}",
                                        r.info, w.info
                                    ));
                                }
                            }
                            Ok(())
                        }
                    }
                };
                let bound = Duration::from_millis(within_ms.unwrap_or(0));
                if bound.is_zero() {
                    let row = self.lease().await?;
                    check(&row).map_err(HarnessError::Usage)?;
                } else {
                    let insp = &self.inspector;
                    wait_until(
                        bound,
                        Duration::from_millis(100),
                        "the lease row to match",
                        || async {
                            let row = insp.lease().await.map_err(|e| e.to_string())?;
                            check(&row)
                        },
                    )
                    .await?;
                }
                let mut what = Vec::new();
                if *absent {
                    what.push("absent".to_string());
                }
                if let Some(r) = ready {
                    what.push(format!("ready={r}"));
                }
                if let Some(n) = same_as {
                    what.push(format!("same holder run as {n}"));
                }
                Ok(format!("lease row: {}", what.join(", ")))
            }
            Step::RememberLease { name } => {
                let row = self
                    .lease()
                    .await?
                    .ok_or_else(|| HarnessError::Usage("no lease row to remember".into()))?;
                self.remembered.insert(name.clone(), row);
                Ok(format!("remember the lease row as {name}"))
            }
            Step::DeleteLease {} => {
                self.inspector.delete_lease().await?;
                Ok("operator deletes the lease row".into())
            }
            Step::RewriteLeaseIdentical {} => {
                let row = self
                    .lease()
                    .await?
                    .ok_or_else(|| HarnessError::Usage("no lease row to rewrite".into()))?;
                let rev = self.inspector.put_lease(&row.info).await?;
                if rev <= row.revision {
                    return Err(HarnessError::Usage("the revision did not move".into()));
                }
                Ok("operator re-writes the lease row with identical bytes".into())
            }
            Step::RewriteLeaseForeignIncarnation {} => {
                let row = self
                    .lease()
                    .await?
                    .ok_or_else(|| HarnessError::Usage("no lease row to rewrite".into()))?;
                let mut info = row.info.clone();
                info.incarnation = "another-run".into();
                self.inspector.put_lease(&info).await?;
                Ok("operator re-writes the lease row with another incarnation".into())
            }
            Step::ExpectPidRecord { pid_of, absent } => {
                let path = base::pid_path(self.mesh.root(), self.mesh.space());
                let recorded = base::read_pid(&path);
                if *absent {
                    if path.exists() {
                        return Err(HarnessError::Usage(format!(
                            "a pid record exists naming {recorded:?}"
                        )));
                    }
                    return Ok("pid record: absent".into());
                }
                let name = pid_of.as_ref().ok_or_else(|| {
                    HarnessError::Usage("expect_pid_record needs pid_of or absent".into())
                })?;
                let pid = self.daemon(name)?.pid();
                if recorded != Some(pid) {
                    return Err(HarnessError::Usage(format!(
                        "pid record names {recorded:?}, daemon {name} is pid {pid}"
                    )));
                }
                Ok(format!("pid record names daemon {name}"))
            }
            Step::PlantReusedPid {} => {
                let child = std::process::Command::new("sleep")
                    .arg("60")
                    .spawn()
                    .map_err(|e| HarnessError::io("spawn sleep", e))?;
                let path = base::pid_path(self.mesh.root(), self.mesh.space());
                base::write_atomic(&path, format!("{}\n", child.id()).as_bytes())
                    .map_err(|e| HarnessError::Usage(e.to_string()))?;
                self.sleeper = Some(child);
                Ok("a pid record names a live process that is not a delivery daemon".into())
            }
            Step::Status { contains, code } => {
                self.mesh.leave_for_status()?;
                let bin = match &self.options.daemon_bin {
                    Some(b) => b.clone(),
                    None => crate::daemon::daemon_bin()?,
                };
                let out = tokio::process::Command::new(bin)
                    .args(["status", "--space", self.mesh.space().as_str()])
                    .current_dir(self.mesh.root())
                    .output()
                    .await
                    .map_err(|e| HarnessError::io("run status", e))?;
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                if !text.contains(contains.as_str()) || out.status.code() != Some(*code) {
                    return Err(HarnessError::Usage(format!(
                        "status said {text:?} with {}, expected {contains:?} and code {code}",
                        out.status
                    )));
                }
                Ok(format!("status reports {contains:?} (exit {code})"))
            }
            Step::SysMaterial { observer, evictor } => {
                let space = self.mesh.space().clone();
                let ws = self.mesh.workspace();
                // Another mesh's signer: same space name, another account and system key.
                let mut other = MeshAuthority::new();
                other.add_space(&space);
                let mut done = Vec::new();
                match observer.as_deref() {
                    None => {}
                    Some("missing") => {
                        std::fs::remove_file(ws.membership_observer_creds_path(&space))
                            .map_err(|e| HarnessError::io("remove observer", e))?;
                        done.push("the $SYS observer credential is removed");
                    }
                    Some("other-account") => {
                        let cred = other
                            .mint_system(
                                &space,
                                SystemProfile::MembershipObserver,
                                MintOptions::new(),
                            )
                            .map_err(|e| HarnessError::Usage(e.to_string()))?;
                        write_creds_file_atomic(&ws.membership_observer_creds_path(&space), &cred)
                            .map_err(|e| HarnessError::Usage(e.to_string()))?;
                        done.push("the $SYS observer is replaced by one scanning another account");
                    }
                    Some("several-accounts") => {
                        let cred =
                            observer_of_several_accounts(&self.mesh.authority, &other, &space)?;
                        write_creds_file_atomic(&ws.membership_observer_creds_path(&space), &cred)
                            .map_err(|e| HarnessError::Usage(e.to_string()))?;
                        done.push("the $SYS observer is replaced by one scanning this account and another");
                    }
                    Some(o) => return Err(HarnessError::Usage(format!("observer = {o:?}?"))),
                }
                match evictor.as_deref() {
                    None => {}
                    Some("missing") => {
                        std::fs::remove_file(ws.connection_evictor_creds_path(&space))
                            .map_err(|e| HarnessError::io("remove evictor", e))?;
                        done.push("the $SYS evictor credential is removed");
                    }
                    Some("other-signer") => {
                        let cred = other
                            .mint_system(
                                &space,
                                SystemProfile::ConnectionEvictor,
                                MintOptions::new(),
                            )
                            .map_err(|e| HarnessError::Usage(e.to_string()))?;
                        write_creds_file_atomic(&ws.connection_evictor_creds_path(&space), &cred)
                            .map_err(|e| HarnessError::Usage(e.to_string()))?;
                        done.push(
                            "the $SYS evictor is replaced by one signed by another system key",
                        );
                    }
                    Some(o) => return Err(HarnessError::Usage(format!("evictor = {o:?}?"))),
                }
                Ok(done.join("; "))
            }
            Step::FillStore {} => {
                let n = fill_store(&self.inspector).await?;
                Ok(format!(
                    "broker file store filled (refused after {} writes)",
                    bucket(n)
                ))
            }
        }
    }

    fn transcript(&self) -> String {
        let mut out = format!(
            "scenario: {}\n{}\n\nsteps:\n",
            self.scenario.name,
            self.scenario.description.trim()
        );
        for l in &self.log {
            out.push_str(l);
            out.push('\n');
        }
        for (name, d) in &self.daemons {
            out.push_str(&format!("\ndaemon {name}:\n"));
            for l in d.lines() {
                if crate::daemon::is_component_line(&l) {
                    continue;
                }
                out.push_str("  ");
                out.push_str(&l);
                out.push('\n');
            }
        }
        normalise(&out, self.mesh.root(), self.outside.path())
    }
}

/// Same holder, incarnation and `since`: the same daemon run, whatever its revision and
/// readiness.
fn same_holder_run(a: &LeaseInfo, b: &LeaseInfo) -> bool {
    a.holder == b.holder && a.incarnation == b.incarnation && a.since == b.since
}

/// Rounds a count so the transcript does not depend on exact store accounting.
fn bucket(n: usize) -> &'static str {
    if n == 0 {
        "0"
    } else {
        "some"
    }
}

/// Publishes 64 KiB messages into a scratch stream until the broker refuses for lack of
/// resources; returns how many were stored. Bounded by 4096 writes.
async fn fill_store(insp: &Inspector) -> Result<usize, HarnessError> {
    use async_nats::jetstream::stream::Config;
    const MAX_WRITES: usize = 4096;
    insp.js
        .get_or_create_stream(Config {
            name: "FILLER".into(),
            subjects: vec!["filler.>".into()],
            ..Default::default()
        })
        .await
        .map_err(|e| HarnessError::Usage(format!("create filler stream: {e}")))?;
    let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
    for i in 0..MAX_WRITES {
        let ack = insp
            .js
            .publish(format!("filler.{i}"), chunk.clone())
            .await
            .map_err(|e| HarnessError::Usage(format!("filler publish: {e}")))?;
        if let Err(e) = ack.await {
            let text = e.to_string();
            if text.contains("insufficient resources") {
                return Ok(i);
            }
            return Err(HarnessError::Usage(format!(
                "filler refused otherwise: {text}"
            )));
        }
    }
    Err(HarnessError::Usage(format!(
        "the store took {MAX_WRITES} writes without refusing"
    )))
}

/// An nkey (user, account, operator, server): a prefix letter and 55 base32 characters.
pub const NKEY_PATTERN: &str = r"\b[UAONC][A-Z2-7]{55}\b";

/// Replaces each distinct nkey with `[NKEY<n>]`, numbered in order of first appearance, so a
/// transcript still shows whether two keys are the same one (`[NKEY1] vs [NKEY2]` is a torn
/// rotation, `[NKEY1] vs [NKEY1]` would not be).
pub fn number_nkeys(text: &str) -> String {
    let Ok(re) = regex::Regex::new(NKEY_PATTERN) else {
        return text.to_string();
    };
    let mut seen: Vec<String> = Vec::new();
    re.replace_all(text, |caps: &regex::Captures<'_>| {
        let key = caps[0].to_string();
        let n = match seen.iter().position(|k| *k == key) {
            Some(i) => i + 1,
            None => {
                seen.push(key);
                seen.len()
            }
        };
        format!("[NKEY{n}]")
    })
    .into_owned()
}

/// Replaces volatile parts (paths, nkeys, revisions, pids, timestamps, durations) with stable
/// tokens.
pub fn normalise(text: &str, root: &Path, outside: &Path) -> String {
    let mut out = text.replace(&root.display().to_string(), "[ROOT]");
    out = out.replace(&outside.display().to_string(), "[OUTSIDE]");
    out = number_nkeys(&out);
    let rules: &[(&str, &str)] = &[
        (r"127\.0\.0\.1:\d+", "127.0.0.1:[PORT]"),
        (r"localhost:\d+", "localhost:[PORT]"),
        (r"revision \d+", "revision [REV]"),
        (r"wrong last sequence: \d+", "wrong last sequence: [SEQ]"),
        (r"\bpid \d+", "pid [PID]"),
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "[TIME]"),
        (r"expires in \d+ s\b", "expires in [N] s"),
        (r"\b\d+ ms\b", "[N] ms"),
        (r"/tmp/[A-Za-z0-9._-]+", "[TMP]"),
    ];
    replace_all(out, rules)
}

/// Applies each `(pattern, replacement)` of `rules` in order.
fn replace_all(mut out: String, rules: &[(&str, &str)]) -> String {
    for (pattern, replacement) in rules {
        if let Ok(re) = regex::Regex::new(pattern) {
            out = re.replace_all(&out, *replacement).into_owned();
        }
    }
    out
}

/// [`normalise`], plus the volatile parts of a `status` report: lease ages, incarnations and
/// credential expiry times.
pub fn normalise_status(text: &str, root: &Path) -> String {
    let rules: &[(&str, &str)] = &[
        (r"age \d+ s", "age [N] s"),
        (r"incarnation [0-9a-f]{32}", "incarnation [INCARNATION]"),
        (r"expires \S+ \((in \d+ s|expired)\)", "expires [EXP]"),
    ];
    replace_all(normalise(text, root, root), rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation caught: one shared `[NKEY]` token for every key (the old filter) makes the
    /// torn-rotation line read the same whether the two keys differ or not.
    #[test]
    fn nkeys_are_numbered_in_order_of_appearance() {
        let a = format!("A{}", "B".repeat(55));
        let b = format!("A{}", "C".repeat(55));
        let text = format!("signed by {a} vs {b}\naccount {a}");
        assert_eq!(
            number_nkeys(&text),
            "signed by [NKEY1] vs [NKEY2]\naccount [NKEY1]"
        );
        assert_eq!(number_nkeys(&format!("{a} vs {a}")), "[NKEY1] vs [NKEY1]");
    }
}
