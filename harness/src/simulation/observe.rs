//! What the runner sees of the daemons, and what it does about it: every daemon's lines and
//! exit turned into observations (serving, quiesced, exited) with their run time, the lease
//! key's writes as the broker stamped them, and a supervisor that starts a daemon again when it
//! exits and no fault holds it, as a foreground `cotal up` does ("a failed restart is logged and
//! retried after the lease TTL").
//!
//! The observer reads the kit's daemon actors (`World::daemons`) on a 100 ms tick, under the
//! world's lock, so an observation is at most a tick (and whatever a fault step holds the lock
//! for) later than the line. A later observation only shortens a serving span the checker
//! credits, or delays an exit the checker judges with a margin.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cotal_delivery::base::RowOp;
use tokio::sync::watch;

use super::record::Recorder;
use crate::kit::steps::process::{CredsChoice, CwdChoice, ProcessStep};
use crate::kit::steps::verb::Ctx;
use crate::kit::world::World;
use crate::rig::lease_log::{LeaseLog, LogFrom};
use crate::rig::mesh::Inspector;
use crate::simulation::check::snapshot::{LeaseOp, LeaseRecord};
use crate::simulation::check::{classify_exit, Call, Done, Ms, Observation, Process};

/// How often the daemons' lines and exits are read.
pub const OBSERVE_TICK: Duration = Duration::from_millis(100);
/// First wait before a daemon that exited is started again; doubled per failed start.
const RESTART_FIRST: Duration = Duration::from_millis(500);
/// Longest wait between two starts of a daemon that keeps exiting.
const RESTART_MAX: Duration = Duration::from_millis(4_000);
/// How long the lease watch waits for a write before it checks whether it must stop.
const LEASE_POLL: Duration = Duration::from_millis(500);
/// Wait before the lease watch is bound again after an error.
const LEASE_REBIND_GAP: Duration = Duration::from_millis(1_000);

/// How the runner starts one daemon.
#[derive(Debug, Clone)]
pub struct DaemonPlan {
    pub name: String,
    /// The proxy it dials through.
    pub via: String,
    /// The standby host root it serves (`deliver --spaces`), if it is a host.
    pub host: Option<String>,
}

/// One process of a daemon, as far as it has been observed.
#[derive(Debug, Default)]
struct Seen {
    pid: u32,
    lines: usize,
    exited: bool,
    /// Run ms when the runner started it: its lease row is written after.
    started_ms: Ms,
    /// Since when its serving line waits for its lease row to reach the watch.
    waiting_since: Option<Ms>,
}

/// Longest a serving line waits for the lease watch to show its row (the incarnation it
/// serves under); then it is recorded with the holder's latest row.
const ROW_WAIT_MS: Ms = 3_000;

/// What the runner knows of its daemons.
#[derive(Debug, Default)]
pub struct Daemons {
    pub plans: Vec<DaemonPlan>,
    seen: BTreeMap<String, Seen>,
    /// Daemons a fault holds: not started again until it ends.
    pub held: BTreeSet<String>,
    /// The run is ending: nothing is started again.
    pub stopping: bool,
    /// Daemons serving as last observed.
    pub serving: BTreeSet<String>,
    /// When each exited daemon may be started again, and the wait after the next failure.
    restart: BTreeMap<String, (Instant, Duration)>,
    /// Every observation's line, daemon and kind (`serving`, `quiesced`, `exited`) in order:
    /// what a replay maps an `after_line` through.
    pub lines: Vec<(u64, String, &'static str)>,
    /// The daemons' holders (`local.<nkey>`), by name.
    holders: BTreeMap<String, String>,
    /// Every exited process's lines, by daemon, each process after a header line: the run
    /// directory keeps them (`logs/daemon-<name>.processes.log`), where the world keeps only
    /// the latest process's.
    pub earlier: BTreeMap<String, Vec<String>>,
}

impl Daemons {
    pub fn new(plans: Vec<DaemonPlan>) -> Daemons {
        Daemons {
            plans,
            ..Daemons::default()
        }
    }

    /// The daemon that serves now: the one last seen serving, else the lease row's holder.
    pub fn holder(&self, lease: &LeaseWrites) -> Option<String> {
        if let Some(d) = self.serving.iter().next() {
            return Some(d.clone());
        }
        let writes = lease.lock().unwrap_or_else(|p| p.into_inner());
        let last = writes.values().rev().find(|w| w.op == LeaseOp::Row)?;
        let holder = last.holder.as_deref()?;
        self.holders
            .iter()
            .find(|(_, h)| h.as_str() == holder)
            .map(|(d, _)| d.clone())
    }

    /// The line of the latest observation of `kind` (of `daemon`, when given).
    pub fn last_line(&self, kind: &str, daemon: Option<&str>) -> Option<u64> {
        self.lines
            .iter()
            .rev()
            .find(|(_, d, k)| *k == kind && daemon.is_none_or(|want| want == d))
            .map(|(l, _, _)| *l)
    }

    /// Whether `name`'s current process has exited (or never started).
    pub fn is_down(&self, name: &str) -> bool {
        self.seen.get(name).is_none_or(|s| s.exited)
    }
}

/// The lease key's writes by revision, as the broker stamped them.
pub type LeaseWrites = Arc<Mutex<BTreeMap<u64, LeaseRecord>>>;

/// Reads every daemon's new lines and exit into observations, then starts again the daemons
/// that exited and may be.
pub async fn poll(w: &mut World, d: &mut Daemons, recorder: &Recorder, lease: &LeaseWrites) {
    let names: Vec<String> = w.daemons.keys().cloned().collect();
    for name in names {
        observe_one(w, d, recorder, lease, &name).await;
    }
    supervise(w, d, recorder, lease).await;
}

async fn observe_one(
    w: &mut World,
    d: &mut Daemons,
    recorder: &Recorder,
    lease: &LeaseWrites,
    name: &str,
) {
    if !d.holders.contains_key(name) {
        if let Some(path) = w.daemon_creds.get(name) {
            if let Ok(h) = World::holder_of_creds(path) {
                d.holders.insert(name.to_string(), h);
            }
        }
    }
    let Some(daemon) = w.daemons.get_mut(name) else {
        return;
    };
    let pid = daemon.pid();
    let seen = d.seen.entry(name.to_string()).or_default();
    if seen.pid != pid {
        *seen = Seen {
            pid,
            ..Seen::default()
        };
    }
    if seen.exited {
        return;
    }
    let running = daemon.is_running();
    let status = if running {
        None
    } else {
        daemon.wait_exit(Duration::ZERO).await.ok()
    };
    let lines = daemon.lines();
    let holder = d.holders.get(name).cloned().unwrap_or_default();
    let now = recorder.now_ms();
    let mut observed: Vec<Observation> = Vec::new();
    let mut waiting = false;
    while seen.lines < lines.len() {
        let line = &lines[seen.lines];
        let up = line.contains("✓ delivery daemon up");
        if up || line.contains("serving shard 0 again") {
            // A process that starts serving writes a row of a new incarnation first: wait
            // (bounded) until the watch shows one written since the start, so a row of the
            // process's own incarnation is never read as another holder's.
            let since = if up { seen.started_ms } else { 0 };
            let incarnation = incarnation_since(lease, &holder, since);
            let since_waiting = *seen.waiting_since.get_or_insert(now);
            if incarnation.is_none() && now.saturating_sub(since_waiting) < ROW_WAIT_MS {
                waiting = true;
                break;
            }
            seen.waiting_since = None;
            observed.push(Observation::DaemonServing {
                daemon: name.to_string(),
                incarnation: incarnation.unwrap_or_else(|| incarnation_of(lease, &holder)),
                holder: holder.clone(),
            });
        } else if line.contains("stopped serving shard 0") || line.contains("the lane closed") {
            observed.push(Observation::DaemonQuiesced {
                daemon: name.to_string(),
            });
        }
        seen.lines += 1;
    }
    // An exit is said after every line before it.
    let status = if waiting { None } else { status };
    if let Some(status) = status {
        let host = d.plans.iter().any(|p| p.name == name && p.host.is_some());
        let last_line = last_line(&lines, host);
        let kept = d.earlier.entry(name.to_string()).or_default();
        kept.push(format!(
            "── pid {pid}, exited at run ms {now} ({status:?}), {} line(s):",
            lines.len()
        ));
        kept.extend(lines.iter().cloned());
        observed.push(Observation::DaemonExited {
            daemon: name.to_string(),
            pid: Some(pid),
            code: status.code(),
            signal: status.signal(),
            last_line,
        });
    }
    for o in observed {
        let kind = match &o {
            Observation::DaemonServing { .. } => {
                d.serving.insert(name.to_string());
                d.restart.remove(name);
                "serving"
            }
            Observation::DaemonQuiesced { .. } => {
                if !d.serving.remove(name) {
                    continue;
                }
                "quiesced"
            }
            Observation::DaemonExited {
                code,
                signal,
                last_line,
                ..
            } => {
                d.serving.remove(name);
                let class = classify_exit(*code, *signal, last_line.as_deref());
                let wait = d
                    .restart
                    .get(name)
                    .map(|(_, next)| *next)
                    .unwrap_or(RESTART_FIRST);
                // A live row (its own killed incarnation's, say) refuses every start until it
                // expires: wait one TTL, as `up` does.
                let wait = if class == crate::simulation::check::report::ExitClass::LeaseHeld {
                    Duration::from_millis(super::config::LEASE_TTL_MS)
                } else {
                    wait
                };
                d.restart.insert(
                    name.to_string(),
                    (Instant::now() + wait, (wait * 2).min(RESTART_MAX)),
                );
                "exited"
            }
        };
        let line = recorder.observed(name, o);
        d.lines.push((line, name.to_string(), kind));
    }
    if let Some(seen) = d.seen.get_mut(name) {
        seen.exited = status.is_some();
    }
}

/// The last line a daemon wrote about itself: its own last line, leaving out its side
/// components' (timer writer, membership feed), its warnings (`! …`: the anycast records'
/// sweep, say, which runs beside start-up and shutdown) and the counts of repeated lines. A
/// start-up failure says two lines, `✗ delivery: start-up failed - releasing the shard before
/// exiting` and then its reason: both are kept, joined by ` | `, so the exit reads as the
/// start-up failure it is. For a standby host, its own `received SIG…` line when it was
/// signalled, else the last line of its lane (`lane <space>: …`, the space daemon's, without
/// the prefix), since the exit rules judge the space daemon; the host's own last line when no
/// lane wrote one.
pub(crate) fn last_line(lines: &[String], host: bool) -> Option<String> {
    // A repeated line's count is flushed as the process ends (docs/operations.md, "Repeated
    // lines"): bookkeeping, not the reason it ended. A warning never is the reason either: the
    // daemon says why it ends with a `✗` line or its `received SIG…` line, and a warning after
    // it (a shutdown past its bound, a side task's failure) only follows it. Found by seed
    // 4408: the anycast sweep's `! anycast records: …` taken as the last line.
    let own = |l: &&String| {
        let repeat_count = l.contains("(repeated ") && l.contains(" in the last ");
        let body = l
            .strip_prefix("lane ")
            .and_then(|r| r.split_once(": "))
            .map_or(l.as_str(), |(_, rest)| rest);
        let warning = body.trim_start().starts_with('!');
        !(crate::rig::daemon::is_component_line(l)
            || l.trim().is_empty()
            || repeat_count
            || warning
            || is_diagnostic(l))
    };
    let own_lines: Vec<&String> = lines.iter().filter(own).collect();
    let with_startup = |i: usize| -> String {
        let last = own_lines[i].clone();
        match i.checked_sub(1).map(|k| own_lines[k]) {
            Some(prev) if prev.contains("start-up failed") && !last.contains("start-up failed") => {
                format!("{prev} | {last}")
            }
            _ => last,
        }
    };
    if host {
        // The host's own signal line ends every lane; else the lane's last line.
        let lane = lines.iter().rev().find_map(|l| {
            if l.contains("delivery host: received SIG") {
                return Some(l.clone());
            }
            l.split_once(": ")
                .filter(|(p, _)| p.starts_with("lane "))
                .map(|(_, rest)| rest.to_string())
                .filter(|rest| own(&rest))
        });
        if lane.is_some() {
            return lane;
        }
    }
    own_lines.len().checked_sub(1).map(with_startup)
}

/// Whether `line` is one of the daemon's structured diagnostics (`RUST_LOG`, on stderr:
/// `<RFC 3339 time>  <LEVEL> <target>: …`), which a diagnosis asks for
/// (`config::DAEMON_RUST_LOG`): never a reason the daemon gives for ending.
fn is_diagnostic(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let stamped = words
        .next()
        .is_some_and(|t| t.len() > 20 && t.as_bytes()[0].is_ascii_digit() && t.ends_with('Z'));
    stamped
        && words
            .next()
            .is_some_and(|l| ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&l))
}

/// The incarnation of `holder`'s latest lease row stamped at or after run ms `since` (less a
/// second of clock skew between the broker's stamp and the runner's clock), if the watch has
/// one.
fn incarnation_since(lease: &LeaseWrites, holder: &str, since: Ms) -> Option<String> {
    let writes = lease.lock().unwrap_or_else(|p| p.into_inner());
    writes
        .values()
        .rev()
        .find(|w| w.op == LeaseOp::Row && w.holder.as_deref() == Some(holder))
        .filter(|w| w.ms + 1_000 >= since)
        .and_then(|w| w.incarnation.clone())
}

/// The incarnation of `holder`'s latest lease row.
fn incarnation_of(lease: &LeaseWrites, holder: &str) -> String {
    let writes = lease.lock().unwrap_or_else(|p| p.into_inner());
    writes
        .values()
        .rev()
        .find(|w| w.op == LeaseOp::Row && w.holder.as_deref() == Some(holder))
        .and_then(|w| w.incarnation.clone())
        .unwrap_or_default()
}

/// Starts again every daemon that exited, is not held by a fault, and whose wait is over.
async fn supervise(w: &mut World, d: &mut Daemons, recorder: &Recorder, lease: &LeaseWrites) {
    if d.stopping {
        return;
    }
    let now = Instant::now();
    let due: Vec<DaemonPlan> = d
        .plans
        .iter()
        .filter(|p| !d.held.contains(&p.name) && d.is_down(&p.name))
        .filter(|p| d.restart.get(&p.name).is_none_or(|(at, _)| *at <= now))
        .cloned()
        .collect();
    for plan in due {
        start(w, d, recorder, &plan, &Process::Runner).await;
        // Observe the new process at once, so its start is not mistaken for the old one's.
        observe_one(w, d, recorder, lease, &plan.name).await;
    }
}

/// Starts `plan`'s daemon (the kit's `start` verb), recording `daemon_start` by `by`.
pub async fn start(
    w: &mut World,
    d: &mut Daemons,
    recorder: &Recorder,
    plan: &DaemonPlan,
    by: &Process,
) {
    let op = recorder.invoke(
        by,
        Call::DaemonStart {
            daemon: plan.name.clone(),
        },
        None,
    );
    let step = ProcessStep::Start {
        daemon: plan.name.clone(),
        via: Some(plan.via.clone()),
        host: plan.host.clone(),
        node: 0,
        env: BTreeMap::new(),
        args: Vec::new(),
        creds: CredsChoice::Workspace,
        cwd: CwdChoice::Root,
        demand_tls: false,
        no_server: false,
    };
    let now = Instant::now();
    let ctx = Ctx {
        started: now,
        deadline: now + Duration::from_secs(10),
    };
    match step.run(w, ctx).await {
        Ok(_) => {
            let pid = w.daemons.get(&plan.name).map(|x| x.pid()).unwrap_or(0);
            recorder.ok(&op, Done::DaemonStart { pid });
            d.seen.insert(
                plan.name.clone(),
                Seen {
                    pid,
                    started_ms: recorder.now_ms(),
                    ..Seen::default()
                },
            );
        }
        Err(f) => {
            recorder.fail(&op, f.to_string());
            let wait = d
                .restart
                .get(&plan.name)
                .map(|(_, next)| *next)
                .unwrap_or(RESTART_FIRST);
            d.restart.insert(
                plan.name.clone(),
                (Instant::now() + wait, (wait * 2).min(RESTART_MAX)),
            );
        }
    }
}

/// Watches the lease key until `stop`, collecting every write by revision; bound again after
/// an error, from the last revision seen (writes the bucket no longer holds by then are
/// missed: it keeps one per key).
pub async fn watch_lease(
    insp: Inspector,
    recorder: Arc<Recorder>,
    writes: LeaseWrites,
    mut stop: watch::Receiver<bool>,
) {
    let mut log: Option<LeaseLog> = None;
    while !*stop.borrow() {
        let Some(current) = log.as_mut() else {
            let last = writes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .keys()
                .next_back()
                .copied();
            let from = last.map_or(LogFrom::Last, LogFrom::After);
            match LeaseLog::bind(&insp, from).await {
                Ok(l) => log = Some(l),
                Err(_) => {
                    let _ = tokio::time::timeout(LEASE_REBIND_GAP, stop.changed()).await;
                }
            }
            continue;
        };
        match current.next(LEASE_POLL).await {
            Ok(Some(w)) => {
                let write = LeaseRecord {
                    revision: w.revision,
                    ms: recorder.run_ms_of(w.stamped).unwrap_or(0),
                    op: match w.op {
                        RowOp::Put => LeaseOp::Row,
                        RowOp::Deleted => LeaseOp::Delete,
                        RowOp::Purged => LeaseOp::Purge,
                        RowOp::Expired => LeaseOp::Expired,
                    },
                    holder: w.info.as_ref().map(|i| i.holder.clone()),
                    incarnation: w.info.as_ref().map(|i| i.incarnation.clone()),
                    ready: w.info.as_ref().is_some_and(|i| i.ready),
                };
                writes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(write.revision, write);
            }
            Ok(None) => {}
            Err(_) => log = None,
        }
    }
}

/// What [`daemon_node`] asks: the daemons' user nkey and each node's monitoring port, read
/// from the world under its lock.
pub fn node_probe(w: &World) -> Option<(String, Vec<u16>)> {
    let creds = w.daemon_creds.values().next()?;
    let nkey = cotal_delivery::base::read_creds_file(creds)
        .ok()?
        .public_key()
        .ok()?;
    let ports = (0..w.mesh.node_count())
        .filter_map(|i| w.mesh.node(i).map(|b| b.monitoring_port()))
        .collect();
    Some((nkey, ports))
}

/// Bound on one node's connection list read.
const CONNZ_BOUND: Duration = Duration::from_secs(2);

/// The cluster node a daemon's connection is on now: the node whose connection list (its
/// `/connz`) holds a connection of the daemons' credential (its user nkey); `None` when no
/// node shows one.
pub async fn daemon_node(probe: Option<(String, Vec<u16>)>) -> Option<usize> {
    let (nkey, ports) = probe?;
    for (i, port) in ports.into_iter().enumerate() {
        let Ok(r) = crate::rig::http::get(port, "/connz?auth=1&limit=1024", CONNZ_BOUND).await
        else {
            continue;
        };
        let Ok(connz) = r.json() else { continue };
        let found = connz["connections"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                c["authorized_user"].as_str() == Some(nkey.as_str())
                    || c["nkey"].as_str() == Some(nkey.as_str())
            })
        });
        if found {
            return Some(i);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::last_line;

    fn lines(ls: &[&str]) -> Vec<String> {
        ls.iter().map(|l| l.to_string()).collect()
    }

    /// The exit line is the daemon's own reason, not a warning written after it, and a start-up
    /// failure keeps both its lines. Seed 4408's transcript, its tail as the runner read it.
    /// Mutations seen failing: the warning clause left out of `own` (the anycast warning is
    /// taken); `with_startup` returning the last line alone (the reason reads as `other`);
    /// `is_diagnostic` answering false (the `RUST_LOG` line is taken).
    #[test]
    fn the_last_line_is_the_exit_reason_not_a_warning_after_it() {
        let tail = lines(&[
            "✓ delivery daemon up (space sim) — stop with: cotal-delivery down",
            "✗ delivery: start-up failed - releasing the shard before exiting",
            "✗ delivery: the lease watch could not be bound (timed out)",
            "! anycast records: sweep failed (timed out); retrying in 600 s; delivery is unaffected",
            "• timer writer: stopped",
        ]);
        let got = last_line(&tail, false).expect("a line");
        assert_eq!(
            got,
            "✗ delivery: start-up failed - releasing the shard before exiting | ✗ delivery: the lease watch could not be bound (timed out)"
        );
        assert_eq!(
            crate::simulation::check::classify_exit(Some(1), None, Some(&got)),
            crate::simulation::check::report::ExitClass::StartupFailed
        );

        // A shutdown warning after the verdict: the verdict is the reason.
        let tail = lines(&[
            "✗ delivery: broker connection unavailable (broker unreachable), exiting (coupled to the broker)",
            "! delivery: shutdown did not finish within 5 s; exiting anyway",
        ]);
        assert_eq!(
            last_line(&tail, false).as_deref(),
            Some("✗ delivery: broker connection unavailable (broker unreachable), exiting (coupled to the broker)")
        );
        // A diagnostic (`RUST_LOG`) after the reason is no reason.
        let tail = lines(&[
            "• delivery: received SIGTERM, exiting (space sim, shard 0)",
            "2026-12-07T15:19:12.056123Z DEBUG cotal_delivery::plane::fanout: fan-out: routed seq=188 targets=0 proved=true",
        ]);
        assert_eq!(
            last_line(&tail, false).as_deref(),
            Some("• delivery: received SIGTERM, exiting (space sim, shard 0)")
        );
        // A plain last line stays as it is.
        let tail = lines(&[
            "✓ delivery daemon up (space sim)",
            "• delivery: received SIGTERM, exiting (space sim, shard 0)",
        ]);
        assert_eq!(
            last_line(&tail, false).as_deref(),
            Some("• delivery: received SIGTERM, exiting (space sim, shard 0)")
        );
    }
}
