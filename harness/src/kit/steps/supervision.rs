//! The daemon under its supervisor, as an operator meets them (docs/operations.md, "The
//! supervisor"): `cotal-delivery up` run in a root of its own (it starts its own broker and
//! provisions the space there), in the foreground as an actor whose lines and exit later steps
//! judge, or detached; `down`, a bare `up` and `status` run to their end in that root; the daemon
//! `up` started found through the root's pid record and remembered by its pid, signalled, and
//! watched until it is gone; whether a live daemon is recorded there at all; the space's log file
//! and delivery credential in that root or in the case's own workspace.
//!
//! `up` and `down` are this distribution's commands: a command template names how to start a
//! daemon, not a supervisor, so these verbs do not run under `--daemon-cmd`. The log-file verb
//! judges a file the seeds name and runs under either.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cotal_delivery::base::{self, PidLiveness};
use serde::Deserialize;

use super::verb::{only_here, poll, Ctx, Kind, Profiled, Refs};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::holdings::SupervisedRoot;
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;
use crate::rig::daemon::DaemonSpec;

pub const VERBS: &[&str] = &[
    "up",
    "supervise",
    "recorded_daemon",
    "recorded_broker",
    "expect_planted_alive",
    "signal_pid",
    "expect_pid_gone",
    "expect_no_daemon",
    "expect_stop_reservation",
    "expect_log",
    "expect_credential_file",
];

/// Whose files a step reads.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RootChoice {
    /// The root `up` runs in.
    #[default]
    Supervised,
    /// The case's own workspace (the daemons `start` runs).
    Workspace,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SupervisionStep {
    /// `cotal-delivery up --space <s> --root <root> --port 0 [args…]` as actor `name`.
    Up {
        name: String,
        #[serde(default)]
        args: Vec<String>,
    },
    /// `cotal-delivery <command> --space <s> --root <root> [args…]` run to its end.
    Supervise {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        /// The exact exit code (this distribution's).
        #[serde(default)]
        code: Option<i32>,
        /// Any non-zero exit.
        #[serde(default)]
        nonzero: bool,
        #[serde(default)]
        contains: Option<String>,
        /// Its output contains no line with this text.
        #[serde(default)]
        lacks: Option<String>,
    },
    RecordedDaemon {
        /// The pid's name for later steps.
        name: String,
        /// A pid other than this remembered one (a replacement).
        #[serde(default)]
        other_than: Option<String>,
    },
    /// The broker `up` started, by the pid in its root's `.cotal/nats.pid`.
    RecordedBroker {
        name: String,
    },
    /// The process a case planted to hold a reused pid (`plant_reused_pid`) still runs.
    ExpectPlantedAlive {},
    SignalPid {
        pid: String,
        signal: String,
    },
    ExpectPidGone {
        pid: String,
    },
    ExpectNoDaemon {},
    /// A stop holds the reservation `down` takes (`.cotal/delivery.<key>.stopping` in up's
    /// root, naming a live process).
    ExpectStopReservation {},
    ExpectLog {
        #[serde(default)]
        root: RootChoice,
        /// A line containing this text.
        #[serde(default)]
        contains: Option<String>,
        /// The last line this daemon printed.
        #[serde(default)]
        last_line_of: Option<String>,
    },
    ExpectCredentialFile {
        exists: bool,
    },
}

/// Bound of a command run to its end, and of the wait for `up` to record a daemon: `up` starts a
/// broker and provisions the space first.
const COMMAND_BOUND: Duration = Duration::from_secs(60);
/// How often a pid or a file is looked at again.
const LOOK: Duration = Duration::from_millis(20);

impl Profiled for SupervisionStep {
    fn wording(&self) -> Vec<&str> {
        match self {
            SupervisionStep::ExpectLog {
                contains: Some(t), ..
            } => vec![t.as_str()],
            _ => Vec::new(),
        }
    }

    fn distribution_only(&self) -> Option<&'static str> {
        match self {
            SupervisionStep::ExpectLog {
                root: RootChoice::Workspace,
                ..
            } => None,
            _ => Some(
                "it runs cotal-delivery up or down, this distribution's supervisor, or reads the root up runs in",
            ),
        }
    }
}

impl SupervisionStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            SupervisionStep::Supervise { .. } | SupervisionStep::RecordedDaemon { .. } => {
                Some(COMMAND_BOUND)
            }
            SupervisionStep::ExpectPidGone { .. }
            | SupervisionStep::ExpectLog { .. }
            | SupervisionStep::ExpectStopReservation {} => Some(Duration::from_secs(20)),
            _ => None,
        }
    }

    pub fn unsupported(&self, daemon: &DaemonUnderTest) -> Option<String> {
        match self {
            SupervisionStep::ExpectLog {
                root: RootChoice::Workspace,
                ..
            } => None,
            _ => only_here(
                daemon,
                "it runs cotal-delivery up or down, this distribution's supervisor (a command template starts a daemon, not a supervisor)",
            ),
        }
    }

    pub fn refs(&self) -> Refs {
        match self {
            SupervisionStep::Up { name, .. } => Refs::default().creates(Kind::Daemon, name),
            SupervisionStep::RecordedDaemon { name, other_than } => Refs::default()
                .uses_opt(Kind::Pid, other_than.as_ref())
                .creates(Kind::Pid, name),
            SupervisionStep::RecordedBroker { name } => Refs::default().creates(Kind::Pid, name),
            SupervisionStep::SignalPid { pid, .. } | SupervisionStep::ExpectPidGone { pid } => {
                Refs::default().uses(Kind::Pid, pid)
            }
            SupervisionStep::ExpectLog { last_line_of, .. } => {
                Refs::default().uses_opt(Kind::Daemon, last_line_of.as_ref())
            }
            _ => Refs::default(),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            SupervisionStep::Up { name, args } => {
                let root = supervised(w)?;
                let spec = command(w, &root, "up", args)?;
                let d = spec.spawn()?;
                w.daemons.insert(name.clone(), d);
                Ok(format!(
                    "`cotal-delivery up{}` runs as {name} in a root of its own",
                    shown(args)
                ))
            }
            SupervisionStep::Supervise {
                command: cmd,
                args,
                code,
                nonzero,
                contains,
                lacks,
            } => {
                let root = supervised(w)?;
                let spec = command(w, &root, cmd, args)?;
                let (status, text) = run_to_end(spec, ctx.left()).await?;
                let line = format!("`cotal-delivery {cmd}{}`", shown(args));
                if let Some(c) = code {
                    if status != Some(*c) {
                        return Err(Failure::new(
                            format!("{line} to exit {c}"),
                            format!("exit {status:?}: {text}"),
                        ));
                    }
                }
                if *nonzero && status == Some(0) {
                    return Err(Failure::new(
                        format!("{line} to exit non-zero"),
                        format!("exit 0: {text}"),
                    ));
                }
                if let Some(want) = contains {
                    if !text.contains(want.as_str()) {
                        return Err(Failure::new(format!("{line} to print {want:?}"), text));
                    }
                }
                if let Some(not) = lacks {
                    if let Some(l) = text.lines().find(|l| l.contains(not.as_str())) {
                        return Err(Failure::new(
                            format!("{line} to print no line with {not:?}"),
                            l.to_string(),
                        ));
                    }
                }
                let mut said = Vec::new();
                if let Some(c) = code {
                    said.push(format!("exits {c}"));
                } else if *nonzero {
                    said.push("exits non-zero".to_string());
                }
                if let Some(c) = contains {
                    said.push(format!("printing {c:?}"));
                }
                if let Some(n) = lacks {
                    said.push(format!("never {n:?}"));
                }
                Ok(format!("{line} {}", said.join(", ")))
            }
            SupervisionStep::RecordedDaemon { name, other_than } => {
                let root = supervised(w)?;
                let space = w.mesh.space().clone();
                let before = other_than.as_ref().map(|o| pid_named(w, o)).transpose()?;
                let path = base::pid_path(&root, &space);
                let pid = poll(
                    ctx,
                    "the pid record to name a live delivery daemon",
                    || async {
                        let pid = base::read_pid(&path).ok_or("no pid record")?;
                        if Some(pid) == before {
                            return Err(format!("it still names {pid}"));
                        }
                        match base::process_liveness(pid, base::argv_names_delivery_daemon) {
                            PidLiveness::Alive(p) => Ok(p),
                            other => Err(format!("{other:?}")),
                        }
                    },
                )
                .await?;
                w.holdings.pids.insert(name.clone(), pid);
                Ok(match other_than {
                    Some(o) => format!(
                        "the pid record names a live delivery daemon other than {o}: {name}"
                    ),
                    None => format!("the pid record names a live delivery daemon: {name}"),
                })
            }
            SupervisionStep::RecordedBroker { name } => {
                let root = supervised(w)?;
                let path = base::broker_pid_path(&root);
                let pid = match base::read_pid(&path) {
                    Some(p) if base::process_alive(p) && !base::is_zombie(p) => p,
                    other => {
                        return Err(Failure::new(
                            "up's broker recorded and running",
                            format!("{}: {other:?}", path.display()),
                        ))
                    }
                };
                w.holdings.pids.insert(name.clone(), pid);
                Ok(format!("the broker up started is remembered as {name}"))
            }
            SupervisionStep::ExpectPlantedAlive {} => {
                let child = w.sleeper.as_mut().ok_or_else(|| {
                    Failure::could_not("no process was planted (plant_reused_pid)")
                })?;
                match child.try_wait() {
                    Ok(None) => Ok("the planted process still runs".to_string()),
                    Ok(Some(status)) => Err(Failure::new(
                        "the planted process still running",
                        format!("it ended: {status}"),
                    )),
                    Err(e) => Err(Failure::could_not(format!("the planted process: {e}"))),
                }
            }
            SupervisionStep::SignalPid { pid, signal } => {
                let p = pid_named(w, pid)?;
                let sig = match signal.as_str() {
                    "TERM" => nix::sys::signal::Signal::SIGTERM,
                    "INT" => nix::sys::signal::Signal::SIGINT,
                    "KILL" => nix::sys::signal::Signal::SIGKILL,
                    "STOP" => nix::sys::signal::Signal::SIGSTOP,
                    "CONT" => nix::sys::signal::Signal::SIGCONT,
                    other => {
                        return Err(Failure::could_not(format!(
                            "signal {other:?} (TERM, INT, KILL, STOP, CONT)"
                        )))
                    }
                };
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(p as i32), sig)
                    .map_err(|e| Failure::could_not(format!("signal {pid}: {e}")))?;
                Ok(format!("SIG{signal} to {pid}"))
            }
            SupervisionStep::ExpectPidGone { pid } => {
                let p = pid_named(w, pid)?;
                let what = format!("{pid} to be gone");
                loop {
                    if !base::process_alive(p) || base::is_zombie(p) {
                        break;
                    }
                    if Instant::now() >= ctx.deadline {
                        return Err(Failure::new(
                            format!(
                                "{what} within {} ms",
                                ctx.deadline
                                    .saturating_duration_since(ctx.started)
                                    .as_millis()
                            ),
                            format!("pid {p} still runs"),
                        ));
                    }
                    tokio::time::sleep(LOOK.min(ctx.left())).await;
                }
                Ok(format!("{pid} is gone"))
            }
            SupervisionStep::ExpectNoDaemon {} => {
                let root = supervised(w)?;
                let space = w.mesh.space().clone();
                for path in [
                    base::pid_path(&root, &space),
                    base::launched_path(&root, &space),
                ] {
                    if let Some(pid) = base::read_pid(&path) {
                        if let PidLiveness::Alive(p) =
                            base::process_liveness(pid, base::argv_names_delivery_daemon)
                        {
                            return Err(Failure::new(
                                "no live delivery daemon recorded in the root",
                                format!("{} names the live daemon {p}", path.display()),
                            ));
                        }
                    }
                }
                Ok("no live delivery daemon is recorded in the root".to_string())
            }
            SupervisionStep::ExpectStopReservation {} => {
                let root = supervised(w)?;
                let path = base::stop_reservation_path(&root, w.mesh.space());
                poll(ctx, "a stop to hold the reservation", || async {
                    match base::read_pid(&path) {
                        Some(p) if base::process_alive(p) && !base::is_zombie(p) => Ok(()),
                        Some(p) => Err(format!("{} names {p}, which is gone", path.display())),
                        None => Err(format!("no {}", path.display())),
                    }
                })
                .await?;
                Ok("a stop holds the reservation in up's root".to_string())
            }
            SupervisionStep::ExpectLog {
                root,
                contains,
                last_line_of,
            } => {
                let dir = match root {
                    RootChoice::Supervised => supervised(w)?,
                    RootChoice::Workspace => w.mesh.root().to_path_buf(),
                };
                let path = base::log_path(&dir, w.mesh.space());
                let (want, said) = match (contains, last_line_of) {
                    (Some(t), None) => (t.clone(), format!("a line containing {t:?}")),
                    (None, Some(d)) => {
                        let last = w.daemon(d)?.lines().last().cloned().ok_or_else(|| {
                            Failure::could_not(format!("daemon {d} printed nothing"))
                        })?;
                        (last, format!("the last line daemon {d} printed"))
                    }
                    _ => {
                        return Err(Failure::could_not(
                            "`expect_log` has `contains` or `last_line_of`, one of them",
                        ))
                    }
                };
                let file = path.display().to_string();
                poll(ctx, &format!("{file} to hold {said}"), || async {
                    let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
                    if text.lines().any(|l| l.contains(want.as_str())) {
                        Ok(())
                    } else {
                        Err(format!(
                            "its last lines: {}",
                            text.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
                        ))
                    }
                })
                .await?;
                Ok(format!(
                    "the space's log file{} holds {said}",
                    match root {
                        RootChoice::Supervised => " in up's root",
                        RootChoice::Workspace => "",
                    }
                ))
            }
            SupervisionStep::ExpectCredentialFile { exists } => {
                let root = supervised(w)?;
                let path = cotal_delivery::provision::Workspace::new(&root)
                    .delivery_creds_path(w.mesh.space());
                if path.exists() != *exists {
                    return Err(Failure::new(
                        format!(
                            "the delivery credential {}",
                            if *exists { "there" } else { "removed" }
                        ),
                        format!(
                            "{} {}",
                            path.display(),
                            if path.exists() { "exists" } else { "is gone" }
                        ),
                    ));
                }
                Ok(format!(
                    "the space's delivery credential in up's root {}",
                    if *exists { "is there" } else { "is removed" }
                ))
            }
        }
    }
}

/// The supervised root, made on first use.
fn supervised(w: &mut World) -> Result<PathBuf, Failure> {
    if w.holdings.supervised.is_none() {
        let dir = tempfile::Builder::new()
            .prefix("cotal-up-")
            .tempdir()
            .map_err(|e| Failure::could_not(format!("create up's root: {e}")))?;
        w.holdings.supervised = Some(SupervisedRoot {
            dir,
            space: w.mesh.space().clone(),
        });
    }
    Ok(w.holdings
        .supervised
        .as_ref()
        .map(|s| s.root())
        .unwrap_or_default())
}

/// `cotal-delivery <cmd> --space <s> --root <root> [--port 0 for up] [args…]`, run from the
/// root with its own `COTAL_HOME` and the broker binary `up` starts.
fn command(
    w: &World,
    root: &std::path::Path,
    cmd: &str,
    args: &[String],
) -> Result<DaemonSpec, Failure> {
    let mut all = vec![
        cmd.to_string(),
        "--space".to_string(),
        w.mesh.space().as_str().to_string(),
        "--root".to_string(),
        root.display().to_string(),
    ];
    if cmd == "up" && !args.iter().any(|a| a == "--port") {
        all.extend(["--port".to_string(), "0".to_string()]);
    }
    all.extend(args.iter().cloned());
    let nats = crate::rig::nats_server_bin()?;
    Ok(w.command_spec(&all, root)?
        .env("NATS_SERVER_BIN", nats.display().to_string())
        .env("COTAL_HOME", root.join("home").display().to_string()))
}

fn shown(args: &[String]) -> String {
    if args.is_empty() {
        String::new()
    } else {
        format!(" {}", args.join(" "))
    }
}

fn pid_named(w: &World, name: &str) -> Result<u32, Failure> {
    w.holdings
        .pids
        .get(name)
        .copied()
        .ok_or_else(|| Failure::could_not(format!("no pid remembered as {name:?}")))
}

/// Runs a command to its end (bounded): its exit code and every line it printed.
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
