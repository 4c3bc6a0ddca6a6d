//! Processes: the daemon under test started by name (by hand, through a proxy, as a standby
//! host), its lines, its signals and its exit; and this distribution's own commands run to
//! completion (`status`, `remint`, `down`…), which a template-started implementation lacks.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::verb::{only_here, Ctx, Kind, Profiled, Refs, DEFAULT_WITHIN};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;
use crate::rig::daemon::DaemonSpec;

pub const VERBS: &[&str] = &[
    "start",
    "wait_line",
    "no_line",
    "line_order",
    "count_lines",
    "signal",
    "expect_exit",
    "expect_running",
    "command",
    "status",
    "mesh_record",
    "injected_store",
];

/// Which credential a daemon is started with.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum CredsChoice {
    /// The provisioned `delivery.creds` (no `--creds`).
    #[default]
    Workspace,
    /// A `membership-rw` credential passed with `--creds`: it may not write the lease.
    MembershipRw,
    /// The delivery credential copied under another workspace's `.cotal/`, passed with
    /// `--creds` while the daemon runs from this workspace's root.
    OtherWorkspace,
    /// The delivery credential copied to a file under no `.cotal/` tree at all, passed with
    /// `--creds` while the daemon runs from this workspace's root.
    Outside,
}

/// Where a daemon is started from.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum CwdChoice {
    #[default]
    Root,
    /// An empty directory outside every workspace.
    Outside,
    /// An empty directory two levels below the workspace root (`<root>/below/deeper`): the
    /// nearest `.cotal/` above it is the root's.
    Below,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ProcessStep {
    Start {
        daemon: String,
        /// Dial this proxy instead of the broker.
        #[serde(default)]
        via: Option<String>,
        /// Run a standby host on this host's root (`deliver --spaces`; under `--daemon-cmd`, the
        /// `--host-cmd` template).
        #[serde(default)]
        host: Option<String>,
        /// Dial this cluster node (default 0).
        #[serde(default)]
        node: usize,
        #[serde(default)]
        env: BTreeMap<String, String>,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        creds: CredsChoice,
        #[serde(default)]
        cwd: CwdChoice,
        /// Pass `--tls` although the broker offers none.
        #[serde(default)]
        demand_tls: bool,
        /// No `--server` (nor `--tls`): the daemon finds its broker itself, in the mesh
        /// registry (`mesh_record`) or the local default.
        #[serde(default)]
        no_server: bool,
    },
    WaitLine {
        daemon: String,
        contains: String,
    },
    NoLine {
        daemon: String,
        contains: String,
    },
    LineOrder {
        daemon: String,
        first: String,
        then: String,
    },
    CountLines {
        daemon: String,
        contains: String,
        count: usize,
    },
    Signal {
        daemon: String,
        signal: String,
    },
    ExpectExit {
        daemon: String,
        /// The exact exit code (this distribution's: a distribution step).
        #[serde(default)]
        code: Option<i32>,
        /// Any exit code but 0 (what the seeds say of a refusal).
        #[serde(default)]
        nonzero: bool,
        /// The process ended by this signal instead (`KILL`: a SIGKILL leaves no exit code).
        #[serde(default)]
        signal: Option<String>,
    },
    ExpectRunning {
        daemon: String,
    },
    Command {
        args: Vec<String>,
        #[serde(default)]
        code: Option<i32>,
        #[serde(default)]
        contains: Option<String>,
    },
    Status {
        contains: String,
        code: i32,
    },
    /// The mesh registry's record of the space (`<COTAL_HOME>/meshes/space.<key>.json`, the
    /// reference's file and field names) for the workspace root, under the `COTAL_HOME` of a
    /// daemon started from the root: the broker (node 0) and its transport.
    MeshRecord {},
    /// An injected directory store outside every workspace (`{store}` in a start's `args`):
    /// the space's credentials of the workspace (`space.<key>/*.creds`) copied under their
    /// store keys, as a host that injects its store provides them.
    InjectedStore {},
}

/// Bound of a command run to completion.
const COMMAND_BOUND: Duration = Duration::from_secs(60);

impl Profiled for ProcessStep {
    fn wording(&self) -> Vec<&str> {
        match self {
            ProcessStep::WaitLine { contains, .. }
            | ProcessStep::NoLine { contains, .. }
            | ProcessStep::CountLines { contains, .. } => vec![contains.as_str()],
            ProcessStep::LineOrder { first, then, .. } => vec![first.as_str(), then.as_str()],
            _ => Vec::new(),
        }
    }

    fn distribution_only(&self) -> Option<&'static str> {
        match self {
            ProcessStep::ExpectExit { code: Some(_), .. } => {
                Some("an exact exit code is this distribution's (the seeds say only non-zero)")
            }
            ProcessStep::Command { .. } => Some("it runs a command of this distribution"),
            ProcessStep::Status { .. } => Some("it runs `cotal-delivery status`"),
            _ => None,
        }
    }
}

impl ProcessStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            ProcessStep::WaitLine { .. } | ProcessStep::ExpectExit { .. } => Some(DEFAULT_WITHIN),
            ProcessStep::Command { .. } | ProcessStep::Status { .. } => Some(COMMAND_BOUND),
            _ => None,
        }
    }

    pub fn unsupported(&self, daemon: &DaemonUnderTest) -> Option<String> {
        match self {
            ProcessStep::Start {
                host,
                args,
                creds,
                cwd,
                demand_tls,
                no_server,
                env,
                ..
            } => {
                if host.is_some() {
                    if let Some(why) = super::verb::no_host_cmd(daemon) {
                        return Some(why);
                    }
                }
                if !args.is_empty() {
                    return only_here(daemon, "the start passes this distribution's flags");
                }
                if *cwd == CwdChoice::Outside {
                    return only_here(daemon, "a start with no workspace root is this distribution's `deliver` typed by hand");
                }
                if *demand_tls {
                    return only_here(
                        daemon,
                        "`--tls` on a plaintext broker is this distribution's flag",
                    );
                }
                if *no_server {
                    return only_here(
                        daemon,
                        "a start without --server is this distribution's `deliver` typed by hand",
                    );
                }
                if env.keys().any(|k| k == "RUST_LOG") {
                    return only_here(daemon, "the start reads this distribution's diagnostics");
                }
                if let (
                    CredsChoice::MembershipRw | CredsChoice::OtherWorkspace | CredsChoice::Outside,
                    DaemonUnderTest::Cmd(c),
                ) = (creds, daemon)
                {
                    if !c.takes_creds() {
                        return Some("the template has no {creds} placeholder".into());
                    }
                }
                None
            }
            ProcessStep::Command { .. } => {
                only_here(daemon, "it runs a command of this distribution")
            }
            ProcessStep::Status { .. } => only_here(daemon, "it runs `cotal-delivery status`"),
            ProcessStep::MeshRecord {} => only_here(
                daemon,
                "a template names its broker itself; the registry is read by `deliver` typed by hand",
            ),
            ProcessStep::InjectedStore {} => only_here(
                daemon,
                "a template says itself where its credentials come from; `--store` is this distribution's",
            ),
            _ => None,
        }
    }

    pub fn refs(&self) -> Refs {
        match self {
            ProcessStep::Start {
                daemon, via, host, ..
            } => Refs::default()
                .uses_opt(Kind::Proxy, via.as_ref())
                .uses_opt(Kind::Host, host.as_ref())
                .creates(Kind::Daemon, daemon),
            ProcessStep::WaitLine { daemon, .. }
            | ProcessStep::NoLine { daemon, .. }
            | ProcessStep::LineOrder { daemon, .. }
            | ProcessStep::CountLines { daemon, .. }
            | ProcessStep::Signal { daemon, .. }
            | ProcessStep::ExpectExit { daemon, .. }
            | ProcessStep::ExpectRunning { daemon } => Refs::default().uses(Kind::Daemon, daemon),
            ProcessStep::Command { .. }
            | ProcessStep::Status { .. }
            | ProcessStep::MeshRecord {}
            | ProcessStep::InjectedStore {} => Refs::default(),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            ProcessStep::Start {
                daemon,
                via,
                host,
                node,
                env,
                args,
                creds,
                cwd,
                demand_tls,
                no_server,
            } => start(
                w,
                daemon,
                via,
                host,
                *node,
                env,
                args,
                *creds,
                *cwd,
                (*demand_tls, *no_server),
            ),
            ProcessStep::MeshRecord {} => {
                let space = w.mesh.space().clone();
                let server = w
                    .mesh
                    .node(0)
                    .ok_or_else(|| Failure::could_not("no broker node 0"))?
                    .client_url();
                let home = w.mesh.root().join(".cotal-home");
                let record = cotal_delivery::base::MeshRecord {
                    space: space.as_str().to_string(),
                    server: server.clone(),
                    root: w.mesh.root().to_path_buf(),
                    tls_required: w.mesh.tls_ca().is_some(),
                    tls_ca: w.mesh.tls_ca(),
                };
                record
                    .write(&cotal_delivery::base::registry_path(&home, &space))
                    .map_err(|e| Failure::could_not(e.to_string()))?;
                Ok(format!(
                    "the mesh registry records space {} at broker node 0 for the workspace root",
                    space.as_str()
                ))
            }
            ProcessStep::InjectedStore {} => {
                let segment = w.mesh.space().segment();
                let from = w.mesh.root().join(".cotal").join(&segment);
                let to = w.injected_store_dir().join(&segment);
                std::fs::create_dir_all(&to)
                    .map_err(|e| Failure::could_not(format!("create the store: {e}")))?;
                let mut keys = Vec::new();
                let entries = std::fs::read_dir(&from)
                    .map_err(|e| Failure::could_not(format!("read {}: {e}", from.display())))?;
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if name.ends_with(".creds") {
                        std::fs::copy(entry.path(), to.join(&name)).map_err(|e| {
                            Failure::could_not(format!("copy {name} into the store: {e}"))
                        })?;
                        keys.push(format!("{segment}/{name}"));
                    }
                }
                keys.sort();
                Ok(format!(
                    "an injected store outside every workspace holds {}",
                    keys.join(", ")
                ))
            }
            ProcessStep::WaitLine { daemon, contains } => {
                let left = ctx.left();
                let d = w.daemon(daemon)?;
                d.wait_for_line(contains, left).await.map_err(|_| {
                    Failure::new(
                        format!("daemon {daemon} to print a line containing {contains:?}"),
                        last_lines(d),
                    )
                })?;
                Ok(format!("daemon {daemon} printed {contains:?}"))
            }
            ProcessStep::NoLine { daemon, contains } => {
                let d = w.daemon(daemon)?;
                if let Some(l) = d
                    .lines()
                    .into_iter()
                    .find(|l| l.contains(contains.as_str()))
                {
                    return Err(Failure::new(
                        format!("no line of daemon {daemon} containing {contains:?}"),
                        l,
                    ));
                }
                Ok(format!("daemon {daemon} never printed {contains:?}"))
            }
            ProcessStep::LineOrder {
                daemon,
                first,
                then,
            } => {
                let lines = w.daemon(daemon)?.lines();
                let a = lines.iter().position(|l| l.contains(first.as_str()));
                let b = lines.iter().position(|l| l.contains(then.as_str()));
                match (a, b) {
                    (Some(a), Some(b)) if a < b => {
                        Ok(format!("daemon {daemon} printed {first:?} before {then:?}"))
                    }
                    _ => Err(Failure::new(
                        format!("daemon {daemon} to print {first:?} before {then:?}"),
                        format!("line positions {a:?} and {b:?}"),
                    )),
                }
            }
            ProcessStep::CountLines {
                daemon,
                contains,
                count,
            } => {
                let n = w
                    .daemon(daemon)?
                    .lines()
                    .iter()
                    .filter(|l| l.contains(contains.as_str()))
                    .count();
                if n != *count {
                    return Err(Failure::new(
                        format!("{count} lines of daemon {daemon} containing {contains:?}"),
                        format!("{n}"),
                    ));
                }
                Ok(format!(
                    "daemon {daemon} printed {count} lines containing {contains:?}"
                ))
            }
            ProcessStep::Signal { daemon, signal } => {
                let d = w.daemon(daemon)?;
                // The step's event (a mark on it) is the moment before the signal went: a
                // daemon that answers within a millisecond, under load, can otherwise have the
                // broker stamp its answer before the step is seen to end.
                let at = std::time::Instant::now();
                let sent = match signal.as_str() {
                    "TERM" => d.terminate(),
                    "INT" => d.interrupt(),
                    "KILL" => d.kill(),
                    "STOP" => d.freeze(),
                    "CONT" => d.thaw(),
                    "HUP" => nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(d.pid() as i32),
                        nix::sys::signal::Signal::SIGHUP,
                    )
                    .map_err(|e| crate::rig::error::HarnessError::Usage(e.to_string())),
                    other => {
                        return Err(Failure::could_not(format!(
                            "signal {other:?} (TERM, INT, KILL, STOP, CONT, HUP)"
                        )))
                    }
                };
                sent.map_err(|e| Failure::could_not(format!("signal daemon {daemon}: {e}")))?;
                w.happened_at = Some(at);
                Ok(format!("SIG{signal} to daemon {daemon}"))
            }
            ProcessStep::ExpectExit {
                daemon,
                code,
                nonzero,
                signal,
            } => {
                use std::os::unix::process::ExitStatusExt;
                let (want, signo) = match (code, signal) {
                    (Some(c), None) if *nonzero && *c == 0 => {
                        return Err(Failure::could_not("`nonzero` with `code = 0`"))
                    }
                    (Some(c), None) => (format!("exit with code {c}"), None),
                    (None, None) if *nonzero => ("exit with a non-zero code".to_string(), None),
                    (None, None) => ("exit".to_string(), None),
                    (None, Some(name)) if !*nonzero => (
                        format!("end by SIG{name}"),
                        Some(signal_number(name).ok_or_else(|| {
                            Failure::could_not(format!("unknown signal {name:?}"))
                        })?),
                    ),
                    _ => {
                        return Err(Failure::could_not(
                            "an exit has `code` (or `nonzero`) or `signal`, not both",
                        ))
                    }
                };
                let left = ctx.left();
                let d = w.daemon(daemon)?;
                let status = d.wait_exit(left).await.map_err(|_| {
                    Failure::new(
                        format!("daemon {daemon} to {want}"),
                        format!("still running after {} ms", left.as_millis()),
                    )
                })?;
                let met = match (signo, code) {
                    (Some(n), _) => status.signal() == Some(n),
                    (None, Some(c)) => status.code() == Some(*c),
                    // A process a signal ended has no exit code: not a non-zero exit.
                    (None, None) if *nonzero => status.code().is_some_and(|c| c != 0),
                    (None, None) => true,
                };
                if !met {
                    return Err(Failure::new(
                        format!("daemon {daemon} to {want}"),
                        format!("{status}; {}", last_lines(d)),
                    ));
                }
                Ok(match (signo, code) {
                    (None, Some(c)) => format!("daemon {daemon} exited with code {c}"),
                    (None, None) if *nonzero => {
                        format!("daemon {daemon} exited with a non-zero code")
                    }
                    (None, None) => format!("daemon {daemon} exited"),
                    (Some(_), _) => format!(
                        "daemon {daemon} ended by SIG{}",
                        signal.as_deref().unwrap_or("")
                    ),
                })
            }
            ProcessStep::ExpectRunning { daemon } => {
                let d = w.daemon(daemon)?;
                if !d.is_running() {
                    return Err(Failure::new(
                        format!("daemon {daemon} running"),
                        format!("it exited; {}", last_lines(d)),
                    ));
                }
                Ok(format!("daemon {daemon} is running"))
            }
            ProcessStep::Command {
                args,
                code,
                contains,
            } => {
                let args: Vec<String> = args.iter().map(|a| fill(w, a)).collect();
                let spec = w.command_spec(&args, w.mesh.root())?;
                let (status, text) = run_to_end(spec, ctx.left()).await?;
                if let Some(c) = code {
                    if status != Some(*c) {
                        return Err(Failure::new(
                            format!("`{}` to exit {c}", args.join(" ")),
                            format!("exit {status:?}: {text}"),
                        ));
                    }
                }
                if let Some(want) = contains {
                    if !text.contains(want.as_str()) {
                        return Err(Failure::new(
                            format!("`{}` to print {want:?}", args.join(" ")),
                            text,
                        ));
                    }
                }
                Ok(format!(
                    "`cotal-delivery {}`{}{}",
                    args.join(" "),
                    code.map(|c| format!(" exits {c}")).unwrap_or_default(),
                    contains
                        .as_ref()
                        .map(|c| format!(", printing {c:?}"))
                        .unwrap_or_default()
                ))
            }
            ProcessStep::Status { contains, code } => {
                w.mesh.leave_for_status()?;
                let args = vec![
                    "status".to_string(),
                    "--space".to_string(),
                    w.mesh.space().as_str().to_string(),
                ];
                let spec = w.command_spec(&args, w.mesh.root())?;
                let (status, text) = run_to_end(spec, ctx.left()).await?;
                if !text.contains(contains.as_str()) || status != Some(*code) {
                    return Err(Failure::new(
                        format!("status to report {contains:?} with exit {code}"),
                        format!("{text:?} with exit {status:?}"),
                    ));
                }
                Ok(format!("status reports {contains:?} (exit {code})"))
            }
        }
    }
}

/// `{space}`, `{root}` and `{server}` in a command's argument.
fn fill(w: &World, arg: &str) -> String {
    arg.replace("{space}", w.mesh.space().as_str())
        .replace("{root}", &w.mesh.root().display().to_string())
        .replace("{server}", &w.mesh.url())
}

/// The last lines a daemon printed, for a failure.
fn last_lines(d: &crate::rig::daemon::Daemon) -> String {
    let lines = d.lines();
    let tail: Vec<&String> = lines.iter().rev().take(5).collect();
    if tail.is_empty() {
        return "it printed nothing".into();
    }
    let mut tail: Vec<String> = tail.into_iter().cloned().collect();
    tail.reverse();
    format!("its last lines: {}", tail.join(" | "))
}

/// Runs a command to its exit within `bound`; its exit code and stdout and stderr.
async fn run_to_end(spec: DaemonSpec, bound: Duration) -> Result<(Option<i32>, String), Failure> {
    let mut d = spec.spawn()?;
    let status = d.wait_exit(bound).await.map_err(|_| {
        Failure::new(
            "the command to finish",
            format!("still running after {} ms", bound.as_millis()),
        )
    })?;
    // The readers may still be draining the pipes after the exit.
    let until = Instant::now() + Duration::from_millis(200);
    let mut text = d.lines().join("\n");
    while Instant::now() < until && text.is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
        text = d.lines().join("\n");
    }
    Ok((status.code(), text))
}

#[allow(clippy::too_many_arguments)]
fn start(
    w: &mut World,
    daemon: &str,
    via: &Option<String>,
    host: &Option<String>,
    node: usize,
    env: &BTreeMap<String, String>,
    args: &[String],
    creds: CredsChoice,
    cwd: CwdChoice,
    (demand_tls, no_server): (bool, bool),
) -> StepResult {
    let space = w.mesh.space().clone();
    let server = match via {
        Some(p) => w.proxy(p)?.url(),
        None => w
            .mesh
            .node(node)
            .ok_or_else(|| Failure::could_not(format!("no broker node {node}")))?
            .client_url(),
    };
    let mut creds_path = w.mesh.workspace().delivery_creds_path(&space);
    let mut root = w.mesh.root().to_path_buf();
    let mut spec = if let Some(h) = host {
        root = w
            .hosts
            .get(h)
            .ok_or_else(|| Failure::could_not(format!("no host {h:?}")))?
            .path()
            .to_path_buf();
        creds_path = cotal_delivery::provision::Workspace::new(&root).delivery_creds_path(&space);
        if let DaemonUnderTest::Cmd(cmd) = &w.opts.daemon {
            let host_cmd = cmd
                .host()
                .ok_or_else(|| Failure::could_not("a standby host needs --host-cmd"))?;
            let mut spec = host_cmd.spec(&crate::kit::template::Values {
                space: space.as_str().to_string(),
                server: server.clone(),
                root: root.clone(),
                creds: None,
                tls_ca: w.mesh.tls_ca(),
                cwd: root.clone(),
            })?;
            for (k, v) in &w.env {
                spec = spec.env(k, v.clone());
            }
            spec
        } else {
            let root_s = root.display().to_string();
            let mut spec = w.command_spec(
                &[
                    "deliver".into(),
                    "--spaces".into(),
                    "--root".into(),
                    root_s,
                    "--server".into(),
                    server.clone(),
                ],
                w.mesh.root(),
            )?;
            if let Some(ca) = w.mesh.tls_ca() {
                spec = spec.arg("--tls").arg("--tls-ca").arg(ca);
            }
            spec
        }
    } else {
        let dir = match cwd {
            CwdChoice::Root => w.mesh.root().to_path_buf(),
            CwdChoice::Outside => w.outside.path().to_path_buf(),
            CwdChoice::Below => {
                let below = w.mesh.root().join("below").join("deeper");
                std::fs::create_dir_all(&below).map_err(|e| {
                    Failure::could_not(format!("create a directory below the root: {e}"))
                })?;
                below
            }
        };
        let extra_creds = match creds {
            CredsChoice::Workspace => None,
            CredsChoice::MembershipRw => {
                let cred = w.mesh.mint(
                    &space,
                    &cotal_delivery::provision::Profile::MembershipRw,
                    cotal_delivery::provision::MintOptions::new(),
                )?;
                let path = w.mesh.root().join("membership-rw-as-delivery.creds");
                cotal_delivery::base::write_creds_file_atomic(&path, &cred)
                    .map_err(|e| Failure::could_not(e.to_string()))?;
                Some(path)
            }
            CredsChoice::OtherWorkspace => {
                let other = w.outside.path().join("other-ws");
                let dir = other.join(".cotal").join(space.segment());
                std::fs::create_dir_all(&dir)
                    .map_err(|e| Failure::could_not(format!("create another workspace: {e}")))?;
                let path = dir.join("delivery.creds");
                std::fs::copy(&creds_path, &path)
                    .map_err(|e| Failure::could_not(format!("copy the credential: {e}")))?;
                Some(path)
            }
            CredsChoice::Outside => {
                let dir = w.outside.path().join("creds-elsewhere");
                std::fs::create_dir_all(&dir).map_err(|e| {
                    Failure::could_not(format!("create a directory outside every workspace: {e}"))
                })?;
                let path = dir.join("delivery.creds");
                std::fs::copy(&creds_path, &path)
                    .map_err(|e| Failure::could_not(format!("copy the credential: {e}")))?;
                Some(path)
            }
        };
        let mut spec = match (&w.opts.daemon, &extra_creds) {
            (DaemonUnderTest::Cmd(cmd), _) => {
                let ca = w.mesh.tls_ca();
                let mut spec = cmd.spec(&crate::kit::template::Values {
                    space: space.as_str().to_string(),
                    server: server.clone(),
                    root: w.mesh.root().to_path_buf(),
                    creds: extra_creds.clone(),
                    tls_ca: ca,
                    cwd: dir.clone(),
                })?;
                for (k, v) in &w.env {
                    spec = spec.env(k, v.clone());
                }
                spec
            }
            (_, Some(path)) => w.deliver_spec(&server, &dir)?.arg("--creds").arg(path),
            (_, None) => w.deliver_spec(&server, &dir)?,
        };
        if cwd == CwdChoice::Outside {
            // Typed by hand outside every workspace: no `--root`, nothing to find above.
            spec = crate::rig::daemon::DaemonSpec::deliver(space.as_str(), &dir).server(&server);
            if let Some(ca) = w.mesh.tls_ca() {
                spec = spec.arg("--tls").arg("--tls-ca").arg(ca);
            }
            if let DaemonUnderTest::Bin(b) = &w.opts.daemon {
                spec = spec.bin(b);
            }
            for (k, v) in &w.env {
                spec = spec.env(k, v.clone());
            }
        }
        if no_server {
            // Typed by hand with no `--server`: the daemon finds its broker itself.
            spec = crate::rig::daemon::DaemonSpec::deliver(space.as_str(), &dir);
            if let DaemonUnderTest::Bin(b) = &w.opts.daemon {
                spec = spec.bin(b);
            }
            for (k, v) in &w.env {
                spec = spec.env(k, v.clone());
            }
        }
        if let Some(p) = extra_creds {
            creds_path = p;
        }
        if demand_tls {
            spec = spec.arg("--tls");
        }
        spec
    };
    for a in args {
        // `{root}`: the workspace root, as an operator types it (`--root {root}`); `{store}`:
        // the injected store's directory (`injected_store`).
        let a = a
            .replace("{root}", &w.mesh.root().display().to_string())
            .replace("{store}", &w.injected_store_dir().display().to_string());
        spec = spec.arg(a);
    }
    for (k, v) in env {
        let v = crate::kit::expr::substitute(v, &w.vars).map_err(Failure::could_not)?;
        spec = spec.env(k, v);
    }
    let d = spec.spawn()?;
    w.daemons.insert(daemon.to_string(), d);
    w.daemon_creds.insert(daemon.to_string(), creds_path);
    w.daemon_roots.insert(daemon.to_string(), root);
    let mut how = Vec::new();
    if let Some(h) = host {
        how.push(format!("standby host on {h}"));
    }
    if let Some(p) = via {
        how.push(format!("via proxy {p}"));
    }
    if node != 0 {
        how.push(format!("dialing node {node}"));
    }
    if creds != CredsChoice::Workspace {
        how.push(format!("creds: {creds:?}"));
    }
    if cwd != CwdChoice::Root {
        how.push(format!("cwd: {cwd:?}"));
    }
    if demand_tls {
        how.push("--tls".into());
    }
    if no_server {
        how.push("no --server".into());
    }
    if how.is_empty() {
        Ok(format!("start daemon {daemon}"))
    } else {
        Ok(format!("start daemon {daemon} ({})", how.join(", ")))
    }
}

/// The number of a signal `signal` and `expect_exit` name (`TERM`, `INT`, `KILL`, …).
fn signal_number(name: &str) -> Option<i32> {
    use nix::sys::signal::Signal;
    let s = match name {
        "TERM" => Signal::SIGTERM,
        "INT" => Signal::SIGINT,
        "KILL" => Signal::SIGKILL,
        "STOP" => Signal::SIGSTOP,
        "CONT" => Signal::SIGCONT,
        "HUP" => Signal::SIGHUP,
        _ => return None,
    };
    Some(s as i32)
}
