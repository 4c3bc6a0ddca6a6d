//! The daemon under its supervisor, as an operator meets them (docs/operations.md, "The
//! supervisor"): `cotal-delivery up` run in a root of its own (it starts its own broker and
//! provisions the space there), in the foreground as an actor whose lines and exit later steps
//! judge, or detached; `down`, a bare `up` and `status` run to their end in that root; the daemon
//! `up` started found through the root's pid record and remembered by its pid, signalled, and
//! watched until it is gone; whether a live daemon is recorded there at all; the space's log file
//! (a line in it, or a daemon run by the stamps of its first and last lines) and delivery
//! credential in that root or in the case's own workspace, and that credential spoiled and put
//! back (a restart refused at start); the daemon `up` launched last frozen before it binds.
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
    "up_material",
    "expect_log_run",
    "freeze_launched",
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
    /// What an operator gets wrong in up's root: the space's delivery credential replaced by
    /// text that is no credential (`garbage`), or put back as it stood (`restore`).
    UpMaterial {
        creds: UpCreds,
    },
    /// A daemon run in up's root's log file, after the run of a remembered pid: timed by the
    /// log's stamp of its first (`started`) or last (`ended`) line.
    ExpectLogRun {
        /// The remembered pid whose run the counting starts after.
        after: String,
        /// Which run after it: 1 is the next one.
        run: usize,
        at: RunEdge,
        /// Its run ended with a non-zero exit code (with `at = "ended"`).
        #[serde(default)]
        refused: bool,
    },
    /// The daemon up launched last (`.cotal/delivery.<key>.launched` in up's root), once it is
    /// another pid than `other_than`, frozen with SIGSTOP as soon as it is seen: a replacement
    /// frozen before it could claim the lease, so its responder never binds.
    FreezeLaunched {
        name: String,
        other_than: String,
    },
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum UpCreds {
    Garbage,
    Restore,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RunEdge {
    Started,
    Ended,
}

/// One daemon run as the stamped log shows it: its pid, when its first line was written and,
/// once it ended, when its last line was and the exit code it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRun {
    pub pid: u32,
    pub started: Option<std::time::SystemTime>,
    pub ended: Option<(std::time::SystemTime, i32)>,
}

/// How a `deliver` run's first and last log lines begin (`daemon/src/host/process.rs`).
const RUN_STARTED: &str = "• delivery: run started — ";
const RUN_ENDED: &str = "• delivery: run ended — exit code ";

/// The daemon runs of a stamped log, in order: `<stamp> • delivery: run started — …, pid <n>, …`
/// opens one, `<stamp> • delivery: run ended — exit code <c>: … (pid <n>)` closes the last run
/// of that pid.
pub fn log_runs(text: &str) -> Vec<LogRun> {
    let mut out: Vec<LogRun> = Vec::new();
    for line in text.lines() {
        let Some((stamp, rest)) = line.split_once(' ') else {
            continue;
        };
        let Some(at) = super::verb::parse_rfc3339(stamp) else {
            continue;
        };
        if let Some(frame) = rest.strip_prefix(RUN_STARTED) {
            let pid = frame
                .split(", ")
                .find_map(|f| f.strip_prefix("pid "))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid {
                out.push(LogRun {
                    pid,
                    started: Some(at),
                    ended: None,
                });
            }
        } else if let Some(frame) = rest.strip_prefix(RUN_ENDED) {
            let code = frame
                .split(':')
                .next()
                .and_then(|c| c.trim().parse::<i32>().ok());
            let pid = frame
                .rsplit_once("(pid ")
                .and_then(|(_, p)| p.trim_end_matches(')').parse::<u32>().ok());
            if let (Some(code), Some(pid)) = (code, pid) {
                if let Some(run) = out.iter_mut().rev().find(|r| r.pid == pid) {
                    run.ended = Some((at, code));
                }
            }
        }
    }
    out
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
            | SupervisionStep::ExpectLogRun { .. }
            | SupervisionStep::FreezeLaunched { .. }
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
            SupervisionStep::ExpectLogRun { after, .. } => Refs::default().uses(Kind::Pid, after),
            SupervisionStep::FreezeLaunched { name, other_than } => Refs::default()
                .uses(Kind::Pid, other_than)
                .creates(Kind::Pid, name),
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
            SupervisionStep::UpMaterial { creds } => {
                let root = supervised(w)?;
                let path = cotal_delivery::provision::Workspace::new(&root)
                    .delivery_creds_path(w.mesh.space());
                match creds {
                    UpCreds::Garbage => {
                        let was = std::fs::read(&path).map_err(|e| {
                            Failure::could_not(format!("read {}: {e}", path.display()))
                        })?;
                        w.holdings.up_creds.get_or_insert(was);
                        std::fs::write(&path, "not a credential\n").map_err(|e| {
                            Failure::could_not(format!("spoil {}: {e}", path.display()))
                        })?;
                        Ok(
                            "the space's delivery credential in up's root is no credential"
                                .to_string(),
                        )
                    }
                    UpCreds::Restore => {
                        let was = w.holdings.up_creds.take().ok_or_else(|| {
                            Failure::could_not("no credential was spoiled (`creds = \"garbage\"`)")
                        })?;
                        std::fs::write(&path, was).map_err(|e| {
                            Failure::could_not(format!("restore {}: {e}", path.display()))
                        })?;
                        Ok("the space's delivery credential in up's root is put back".to_string())
                    }
                }
            }
            SupervisionStep::ExpectLogRun {
                after,
                run,
                at,
                refused,
            } => {
                let root = supervised(w)?;
                let pid = pid_named(w, after)?;
                let path = base::log_path(&root, w.mesh.space());
                let edge = match at {
                    RunEdge::Started => "started",
                    RunEdge::Ended => "ended",
                };
                let what = format!("run {run} after {after}'s in the log to have {edge}");
                let (stamp, code) = poll(ctx, &what, || async {
                    let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
                    let runs = log_runs(&text);
                    let mine = runs
                        .iter()
                        .position(|r| r.pid == pid)
                        .ok_or_else(|| format!("no run of pid {pid} among {} runs", runs.len()))?;
                    let r = runs.get(mine + *run).ok_or_else(|| {
                        format!("{} runs after it", runs.len().saturating_sub(mine + 1))
                    })?;
                    match at {
                        RunEdge::Started => r
                            .started
                            .map(|t| (t, None))
                            .ok_or_else(|| "it has no first line".to_string()),
                        RunEdge::Ended => r
                            .ended
                            .map(|(t, c)| (t, Some(c)))
                            .ok_or_else(|| "it has not ended".to_string()),
                    }
                })
                .await?;
                if *refused && code.is_none_or(|c| c == 0) {
                    return Err(Failure::new(
                        format!("{what} with a non-zero exit code"),
                        format!("exit code {code:?}"),
                    ));
                }
                let ms = stamp
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_err(|e| Failure::could_not(e.to_string()))?
                    .as_millis() as i64;
                w.happened_at = Some(super::verb::instant_at_unix_ms(ms)?);
                Ok(format!(
                    "the log shows run {run} after {after}'s {edge}{}",
                    if *refused {
                        ", refused (a non-zero exit code)"
                    } else {
                        ""
                    }
                ))
            }
            SupervisionStep::FreezeLaunched { name, other_than } => {
                let root = supervised(w)?;
                let before = pid_named(w, other_than)?;
                let launched = base::launched_path(&root, w.mesh.space());
                let recorded = base::pid_path(&root, w.mesh.space());
                // Looked at far more often than `poll` does: the replacement must be stopped
                // before it claims the lease, a matter of milliseconds after its launch.
                const QUICK: Duration = Duration::from_millis(5);
                let mut passed = vec![before];
                let pid = loop {
                    if let Some(p) = base::read_pid(&launched).filter(|p| !passed.contains(p)) {
                        let sent = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(p as i32),
                            nix::sys::signal::Signal::SIGSTOP,
                        )
                        .is_ok();
                        // SIGSTOP is delivered asynchronously: wait (bounded) for the state.
                        let until = Instant::now() + Duration::from_secs(2);
                        while sent && Instant::now() < until && proc_state(p) != Some('T') {
                            if matches!(proc_state(p), Some('Z') | None) {
                                break;
                            }
                            tokio::time::sleep(QUICK).await;
                        }
                        if proc_state(p) == Some('T') {
                            break p;
                        }
                        passed.push(p);
                    }
                    if Instant::now() >= ctx.deadline {
                        return Err(Failure::new(
                            format!("a daemon launched after {other_than} to be frozen"),
                            format!(
                                "{} names {:?}",
                                launched.display(),
                                base::read_pid(&launched)
                            ),
                        ));
                    }
                    tokio::time::sleep(QUICK.min(ctx.left())).await;
                };
                w.holdings.pids.insert(name.clone(), pid);
                // Frozen in time only if it had not yet recorded itself, which it does once it
                // holds the lease.
                if base::read_pid(&recorded) == Some(pid) {
                    return Err(Failure::could_not(format!(
                        "{name} (pid {pid}) was frozen only after it claimed the lease"
                    )));
                }
                Ok(format!(
                    "the daemon up launched after {other_than} is frozen before it claimed the lease: {name}"
                ))
            }
        }
    }
}

/// The state letter of `/proc/<pid>/stat` (`T` stopped, `Z` zombie), or `None` once it is gone.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the parenthesised command name, which may itself hold spaces.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|s| s.chars().next())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A process frozen with SIGSTOP reads as stopped (`T`), running again once continued, and
    /// gone once reaped: what `freeze_launched` waits on before it calls a replacement frozen.
    /// Mutation seen failing: the state taken after the first `)` (`split_once`), which a command
    /// name holding `)` shifts onto its own text.
    #[test]
    fn proc_state_reads_a_frozen_process() {
        let dir = tempfile::tempdir().expect("dir");
        let prog = dir.path().join("sl)eep x");
        std::os::unix::fs::symlink("/bin/sleep", &prog).expect("link");
        let mut child = std::process::Command::new(&prog)
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let signal = |s| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), s);
        let state_within = |want: char| {
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until && proc_state(pid) != Some(want) {
                std::thread::sleep(Duration::from_millis(5));
            }
            proc_state(pid)
        };
        signal(nix::sys::signal::Signal::SIGSTOP).expect("stop");
        assert_eq!(state_within('T'), Some('T'));
        signal(nix::sys::signal::Signal::SIGCONT).expect("cont");
        assert_eq!(state_within('S'), Some('S'));
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert_eq!(proc_state(pid), None);
    }

    /// Each run is opened by its first line and closed by the last line naming its pid, with
    /// the log's stamps and the exit code; a line of another run in between is no frame.
    /// Mutation seen failing: a run's end taken from the first run of that pid (`find` instead
    /// of `rev().find`), which puts the refused run's end on the pid's earlier run.
    #[test]
    fn log_runs_reads_each_runs_frames_and_stamps() {
        let log = "\
2026-12-07T10:00:00.100Z • delivery: run started — cotal-delivery 0.1.0 (build x), pid 41, space demo, root /r, broker nats://127.0.0.1:1
2026-12-07T10:00:00.300Z ✓ delivery daemon serving space demo
2026-12-07T10:00:01.000Z • delivery: run started — cotal-delivery 0.1.0 (build x), pid 42, space demo, root /r, broker nats://127.0.0.1:1
2026-12-07T10:00:01.020Z ✗ deliver: the delivery credential (pid 7) is no credential
2026-12-07T10:00:01.025Z • delivery: run ended — exit code 3: could not start (pid 42)
2026-12-07T10:00:03.125Z • delivery: run started — cotal-delivery 0.1.0 (build x), pid 41, space demo, root /r, broker nats://127.0.0.1:1
2026-12-07T10:00:09.000Z • delivery: run ended — exit code 0: received SIGTERM (pid 41)
";
        let at = |ms: u64| std::time::UNIX_EPOCH + Duration::from_millis(ms);
        let base = 1_796_637_600_000;
        let runs = log_runs(log);
        assert_eq!(
            runs,
            vec![
                LogRun {
                    pid: 41,
                    started: Some(at(base + 100)),
                    ended: None
                },
                LogRun {
                    pid: 42,
                    started: Some(at(base + 1_000)),
                    ended: Some((at(base + 1_025), 3))
                },
                LogRun {
                    pid: 41,
                    started: Some(at(base + 3_125)),
                    ended: Some((at(base + 9_000), 0))
                },
            ]
        );
    }
}
