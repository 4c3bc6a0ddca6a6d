//! Replay: a stored run's schedule as it really happened (`History::schedule`), issued again
//! against a fresh mesh: every workload and manager operation and every fault at its time from
//! the quiet phase's start, the same lifecycles (provisioned with the recorded uids), the same
//! tags and ids, the same fault kinds, targets and durations; a fault that waited for a daemon
//! to serve (`after_line`) waits for the same observation (the n-th serving line of the same
//! daemon) again. Daemon starts are the supervisor's reactions to exits, so they are not
//! replayed: the supervisor reacts again. Real processes do not replay exactly (Vortex); what
//! the replay ran is its own history, with `replay_of` naming the run it follows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::config::{self, Phases};
use super::nemesis;
use super::observe::{LeaseWrites, OBSERVE_TICK};
use super::population::Command;
use super::record::Recorder;
use super::stage::Stage;
use super::workload::Workload;
use crate::simulation::check::{
    Call, Completion, FaultKind, History, Ms, Observation, Phase, Process,
};

/// What a replayed fault waits for: the original waited for `daemon` to serve (its
/// `after_line` names that serving line), so the replay waits until `daemon` serves again.
#[derive(Debug, Clone)]
pub struct After {
    pub daemon: String,
}

/// A fault to replay.
#[derive(Debug, Clone)]
pub struct ReplayFault {
    pub at: Ms,
    pub id: u64,
    pub kind: FaultKind,
    pub target: String,
    pub planned_ms: Option<u64>,
    /// The drawn parameters (a latency's, a slow broker's, a partition's).
    pub shape: Option<crate::simulation::check::FaultShape>,
    pub after: Option<After>,
    /// When it ended in the original run (`None`: it never did).
    pub end_at: Option<Ms>,
}

/// The schedule to replay, in this run's ms.
#[derive(Debug, Clone)]
pub struct Plan {
    pub work: Vec<(Ms, Process, Call)>,
    pub faults: Vec<ReplayFault>,
}

fn kind_of(o: &Observation) -> (&str, &'static str) {
    match o {
        Observation::DaemonServing { daemon, .. } => (daemon, "serving"),
        Observation::DaemonQuiesced { daemon } => (daemon, "quiesced"),
        Observation::DaemonExited { daemon, .. } => (daemon, "exited"),
    }
}

impl Plan {
    /// `history`'s schedule moved so that its quiet phase starts at this run's `t0`.
    pub fn of(history: &History, t0: Ms) -> Plan {
        let origin = history.phase_ms(Phase::Quiet).unwrap_or(0);
        let at = |ms: Ms| t0 + ms.saturating_sub(origin);
        let mut work = Vec::new();
        let mut faults = Vec::new();
        for op in history.schedule() {
            match &op.call {
                Call::FaultStart {
                    fault,
                    kind,
                    target,
                    planned_ms,
                    shape,
                } => {
                    if matches!(op.outcome, Completion::Fail { .. }) {
                        continue;
                    }
                    let after = op.after_line.and_then(|line| {
                        let o = history.observed.iter().find(|o| o.line == line)?;
                        match kind_of(&o.what) {
                            (daemon, "serving") => Some(After {
                                daemon: daemon.to_string(),
                            }),
                            _ => None,
                        }
                    });
                    let end_at = history
                        .ops
                        .iter()
                        .find(|e| matches!(e.call, Call::FaultEnd { fault: f } if f == *fault))
                        .map(|e| at(e.invoke_ms));
                    faults.push(ReplayFault {
                        at: at(op.invoke_ms),
                        id: *fault,
                        kind: *kind,
                        target: target.clone(),
                        planned_ms: *planned_ms,
                        shape: *shape,
                        after,
                        end_at,
                    });
                }
                Call::FaultEnd { .. } | Call::DaemonStart { .. } | Call::DaemonStop { .. } => {}
                _ => work.push((at(op.invoke_ms), op.process.clone(), op.call.clone())),
            }
        }
        Plan { work, faults }
    }
}

/// The slots a history's population needs (`local.ag<NN>`).
pub fn population_size(history: &History) -> usize {
    history
        .ops
        .iter()
        .filter_map(|op| match &op.call {
            Call::Provision { member, .. } => slot_of(member.principal().actor()),
            _ => None,
        })
        .map(|i| i + 1)
        .max()
        .unwrap_or(0)
}

fn slot_of(actor: &str) -> Option<usize> {
    actor.strip_prefix("ag")?.parse().ok()
}

/// The phases of the original run (its durations), or the defaults for a run of its length.
pub fn phases(history: &History) -> Phases {
    let p = |ph| history.phase_ms(ph);
    match (
        p(Phase::Quiet),
        p(Phase::Faults),
        p(Phase::Heal),
        p(Phase::Drain),
    ) {
        (Some(q), Some(f), Some(h), Some(d)) if q <= f && f <= h && h <= d => Phases {
            quiet_ms: f - q,
            faults_ms: h - f,
            heal_ms: d - h,
        },
        _ => Phases::of((config::DEFAULT_MINUTES * 60_000.0) as u64),
    }
}

/// Issues the plan's workload and manager operations at their times.
pub async fn workload(w: Arc<Workload>, plan: Plan) {
    for (at, process, call) in plan.work {
        w.recorder.sleep_until_ms(at).await;
        let slot_of_member = |m: &crate::simulation::check::Member| {
            w.population
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .position(|s| s.member.as_ref() == Some(m))
        };
        let issued = match (&process, call) {
            (_, Call::Provision { member, .. }) => match slot_of(member.principal().actor()) {
                Some(slot) => w.provision(slot, member.uid().clone()).await,
                None => false,
            },
            (Process::Agent(m), call) => {
                let cmd = match call {
                    Call::Post {
                        channel,
                        class,
                        id,
                        tag,
                        mentions,
                    } => Some(Command::Post {
                        channel,
                        class,
                        id,
                        tag,
                        mentions,
                    }),
                    Call::Join { channel } => Some(Command::Join { channel }),
                    Call::Leave { channel, .. } => Some(Command::Leave { channel }),
                    Call::Online => Some(Command::Online),
                    Call::Offline => Some(Command::Offline),
                    _ => None,
                };
                match (slot_of_member(m), cmd) {
                    (Some(slot), Some(cmd)) => w.send(slot, cmd),
                    _ => false,
                }
            }
            (_, Call::AclNarrow { member, allow } | Call::AclWiden { member, allow }) => {
                match slot_of_member(&member) {
                    Some(slot) => {
                        let w = w.clone();
                        tokio::spawn(
                            async move { w.manager_write(slot, member, Some(allow)).await },
                        );
                        true
                    }
                    None => false,
                }
            }
            (_, Call::Retire { member }) => match slot_of_member(&member) {
                Some(slot) => {
                    let w = w.clone();
                    tokio::spawn(async move {
                        w.retire_slot(slot, member).await;
                    });
                    true
                }
                None => false,
            },
            _ => false,
        };
        if !issued {
            w.recorder.skipped();
        }
    }
}

/// Runs the plan's faults at their times, each after the observation it waited for.
pub async fn nemesis(
    stage: Arc<Mutex<Stage>>,
    recorder: Arc<Recorder>,
    lease: LeaseWrites,
    plan: Plan,
) {
    for f in plan.faults {
        recorder.sleep_until_ms(f.at).await;
        let mut after_line = None;
        if let Some(a) = &f.after {
            let deadline = Instant::now() + Duration::from_millis(config::SERVING_WAIT_MS);
            loop {
                {
                    let s = stage.lock().await;
                    if s.daemons.serving.contains(&a.daemon) {
                        after_line = s.daemons.last_line("serving", Some(&a.daemon));
                        break;
                    }
                }
                if Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(OBSERVE_TICK).await;
            }
        }
        let planned = nemesis::Planned {
            id: f.id,
            kind: f.kind,
            target: f.target.clone(),
            planned_ms: f.planned_ms,
            shape: f.shape,
        };
        let active = nemesis::start(&stage, &recorder, &lease, planned, after_line).await;
        if let Some(active) = active {
            let end_at = f.end_at.unwrap_or_else(|| f.at + f.planned_ms.unwrap_or(0));
            recorder.sleep_until_ms(end_at).await;
            nemesis::end(&stage, &recorder, &lease, active).await;
        }
    }
}
