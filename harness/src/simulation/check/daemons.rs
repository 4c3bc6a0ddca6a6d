//! The daemon rules: single flight (one daemon serves a space; a lease row is written only by
//! its holder) and exits (each classified by its last line, and judged against the faults that
//! ran).

use std::collections::BTreeMap;

use super::history::{Call, FaultKind, Ms, Observation};
use super::model::{FaultSpan, Model};
use super::report::{
    ExitClass, ExitJudgement, ExitReport, ForeignWrite, Overlap, OverlapSeen, SingleFlight,
};
use super::snapshot::{LeaseOp, LeaseRecord};

/// Overlapping serving spans, a daemon serving while another holder's lease row is written,
/// and lease rows written over another holder's live row.
///
/// A daemon's serving span runs from its serving line to its quiesce or exit; a pause of that
/// daemon (SIGSTOP) is cut out of it, and so is the grace after its SIGCONT, in which it has
/// not yet seen that its lease was taken. Overlaps no longer than that grace are not reported.
pub(crate) fn single_flight(model: &Model<'_>) -> SingleFlight {
    let grace = model.cfg.takeover_grace_ms;
    let mut spans: BTreeMap<&str, Vec<(Ms, Ms)>> = BTreeMap::new();
    for (daemon, served) in &model.serving {
        let frozen: Vec<(Ms, Ms)> = model
            .faults
            .iter()
            .filter(|f| f.kind.freezes() && Model::daemon_of_target(&f.target) == Some(daemon))
            .map(|f| (f.from_ms, f.to_ms.saturating_add(grace)))
            .collect();
        let mut cut = served.clone();
        for hole in frozen {
            cut = cut
                .into_iter()
                .flat_map(|span| subtract(span, hole))
                .collect();
        }
        spans.insert(daemon, cut);
    }
    let mut out = SingleFlight::default();
    let names: Vec<&str> = spans.keys().copied().collect();
    for (k, a) in names.iter().enumerate() {
        for b in &names[k + 1..] {
            for sa in &spans[a] {
                for sb in &spans[b] {
                    let from = sa.0.max(sb.0);
                    let to = sa.1.min(sb.1);
                    if to > from && to - from > grace {
                        out.overlaps.push(Overlap {
                            a: a.to_string(),
                            b: b.to_string(),
                            from_ms: from,
                            to_ms: to,
                            seen: OverlapSeen::BothServing,
                        });
                    }
                }
            }
        }
    }
    // The lease row says who holds it: another holder's row written while a daemon still
    // serves (past the grace before its span ends) is two daemons serving at once, whether or
    // not the runner saw the other's serving line.
    let names = holder_names(model);
    for (daemon, cut) in &spans {
        for w in model
            .snapshot
            .lease_writes
            .iter()
            .filter(|w| w.op == LeaseOp::Row)
        {
            let writer = names.name(w);
            if writer == *daemon {
                continue;
            }
            if let Some(&(_, to)) = cut
                .iter()
                .find(|(from, to)| *from < w.ms && w.ms.saturating_add(grace) < *to)
            {
                out.overlaps.push(Overlap {
                    a: daemon.to_string(),
                    b: writer,
                    from_ms: w.ms,
                    to_ms: to,
                    seen: OverlapSeen::RowOfAnother,
                });
            }
        }
    }
    out.foreign_writes = foreign_writes(model, &names);
    out
}

/// Lease holders by name: the daemon whose serving line named the holder and incarnation.
struct HolderNames<'h>(BTreeMap<(&'h str, &'h str), &'h str>);

impl HolderNames<'_> {
    fn of(&self, holder: &str, incarnation: &str) -> String {
        if let Some(d) = self.0.get(&(holder, incarnation)) {
            return d.to_string();
        }
        // An incarnation no serving line named (the line recorded the holder's previous one,
        // its own row not yet through the lease watch): the holder's credential is one daemon's
        // when only one daemon ever served under it, and the runner runs one process of a
        // daemon at a time. Found by seed 4306 (one broker, host load 14): a restart after a
        // broker kill, its rows read as another holder's.
        let mut daemons: Vec<&str> = self
            .0
            .iter()
            .filter(|((h, _), _)| *h == holder)
            .map(|(_, d)| *d)
            .collect();
        daemons.sort_unstable();
        daemons.dedup();
        match daemons.as_slice() {
            [one] => one.to_string(),
            _ => format!("{holder}/{incarnation}"),
        }
    }
    fn name(&self, w: &LeaseRecord) -> String {
        self.of(
            w.holder.as_deref().unwrap_or(""),
            w.incarnation.as_deref().unwrap_or(""),
        )
    }
}

fn holder_names<'h>(model: &Model<'h>) -> HolderNames<'h> {
    let mut names = BTreeMap::new();
    for o in &model.history.observed {
        if let Observation::DaemonServing {
            daemon,
            holder,
            incarnation,
        } = &o.what
        {
            names.insert((holder.as_str(), incarnation.as_str()), daemon.as_str());
        }
    }
    HolderNames(names)
}

/// `span` less `hole`: zero, one or two spans.
fn subtract(span: (Ms, Ms), hole: (Ms, Ms)) -> Vec<(Ms, Ms)> {
    let mut out = Vec::new();
    if hole.0 > span.0 {
        out.push((span.0, hole.0.min(span.1)));
    }
    if hole.1 < span.1 {
        out.push((hole.1.max(span.0), span.1));
    }
    out.retain(|(a, b)| b > a);
    out
}

/// A row write while another holder's row is live (not deleted, not expired, written less than
/// a TTL ago): the writer did not hold the lease.
fn foreign_writes(model: &Model<'_>, names: &HolderNames<'_>) -> Vec<ForeignWrite> {
    let name = |h: &str, i: &str| names.of(h, i);
    let mut writes: Vec<_> = model.snapshot.lease_writes.iter().collect();
    writes.sort_by_key(|w| w.revision);
    let mut live: Option<(&str, &str, Ms)> = None;
    let mut out = Vec::new();
    for w in writes {
        match w.op {
            LeaseOp::Row => {
                let holder = w.holder.as_deref().unwrap_or("");
                let inc = w.incarnation.as_deref().unwrap_or("");
                if let Some((h, i, at)) = live {
                    let expired = w.ms >= at.saturating_add(model.cfg.lease_ttl_ms);
                    if (h, i) != (holder, inc) && !expired {
                        out.push(ForeignWrite {
                            revision: w.revision,
                            ms: w.ms,
                            writer: name(holder, inc),
                            over: name(h, i),
                        });
                    }
                }
                live = Some((holder, inc, w.ms));
            }
            LeaseOp::Delete | LeaseOp::Purge | LeaseOp::Expired => live = None,
        }
    }
    out
}

/// The seeds' exit lines, as substrings of the last line (which may be the log file's
/// `run ended — exit code <n>: <reason>` frame around them).
const EXIT_LINES: [(&str, ExitClass); 9] = [
    (
        "unavailable past backstop (broker unreachable)",
        ExitClass::BrokerGoneBackstop,
    ),
    (
        "broker connection unavailable (broker unreachable), exiting",
        ExitClass::BrokerGone,
    ),
    (
        "credential expired without renewal",
        ExitClass::CredentialExpired,
    ),
    ("exiting so the holder is single", ExitClass::LeaseLost),
    (
        "it serves only under its lease, exiting",
        ExitClass::LeaseLost,
    ),
    ("a live lease already exists", ExitClass::LeaseHeld),
    (
        "belongs to a holder that is not running",
        ExitClass::LeaseHeld,
    ),
    ("can't reach NATS at", ExitClass::Unreachable),
    ("start-up failed", ExitClass::StartupFailed),
];

/// Classifies an exit: SIGKILL first (a killed daemon's last line is whatever it last wrote),
/// then the line, then the code for a line the table does not know.
pub fn classify_exit(code: Option<i32>, signal: Option<i32>, last_line: Option<&str>) -> ExitClass {
    const SIGKILL: i32 = 9;
    if signal == Some(SIGKILL) {
        return ExitClass::Killed;
    }
    if signal.is_some() {
        return ExitClass::Other;
    }
    if let Some(line) = last_line {
        if let Some((_, class)) = EXIT_LINES.iter().find(|(text, _)| line.contains(text)) {
            return *class;
        }
        if line.contains("received SIG") || line.contains("stopped by SIG") {
            return ExitClass::Signal;
        }
    }
    match code {
        Some(9) => ExitClass::BrokerGone,
        Some(10) => ExitClass::CredentialExpired,
        Some(4) => ExitClass::Unreachable,
        _ => ExitClass::Other,
    }
}

/// Every daemon exit, classified and judged.
pub(crate) fn exits(model: &Model<'_>) -> Vec<ExitReport> {
    model
        .history
        .observed
        .iter()
        .filter_map(|o| match &o.what {
            Observation::DaemonExited {
                daemon,
                code,
                signal,
                last_line,
                ..
            } => {
                let class = classify_exit(*code, *signal, last_line.as_deref());
                Some(ExitReport {
                    daemon: daemon.clone(),
                    ms: o.ms,
                    code: *code,
                    signal: *signal,
                    last_line: last_line.clone(),
                    class,
                    judged: judge(model, daemon, o.ms, class, *code),
                })
            }
            _ => None,
        })
        .collect()
}

fn judge(
    model: &Model<'_>,
    daemon: &str,
    at: Ms,
    class: ExitClass,
    code: Option<i32>,
) -> ExitJudgement {
    let aimed = |f: &&FaultSpan, kinds: &[FaultKind]| {
        kinds.contains(&f.kind)
            && Model::daemon_of_target(&f.target) == Some(daemon)
            && f.from_ms <= at
    };
    let expected = |because: String| ExitJudgement::Expected { because };
    let stopped = model.history.ops.iter().any(|op| {
        matches!(&op.call, Call::DaemonStop { daemon: d } if d == daemon) && op.invoke_ms <= at
    });
    match class {
        ExitClass::BrokerGone | ExitClass::BrokerGoneBackstop => {
            broker_gone(model, daemon, at, class)
        }
        ExitClass::Killed => {
            let margin = model.cfg.exit_margin_ms;
            match model.faults.iter().find(|f| {
                aimed(f, &[FaultKind::DaemonKill]) && at <= f.to_ms.saturating_add(margin)
            }) {
                Some(f) => expected(format!("SIGKILL of fault {}", f.id)),
                // A stop that SIGTERM did not end in time ends with SIGKILL.
                None if stopped => expected("killed at the runner's stop".into()),
                None => ExitJudgement::Unexplained,
            }
        }
        ExitClass::Signal => {
            if let Some(f) = model
                .faults
                .iter()
                .find(|f| aimed(f, &[FaultKind::DaemonRestart]))
            {
                return expected(format!("graceful restart of fault {}", f.id));
            }
            if stopped {
                expected("stopped by the runner".into())
            } else {
                ExitJudgement::Unexplained
            }
        }
        ExitClass::CredentialExpired => {
            match model
                .faults
                .iter()
                .find(|f| aimed(f, &[FaultKind::CredentialExpiry]))
            {
                Some(f) => expected(format!(
                    "credential let expire without a remint, fault {}",
                    f.id
                )),
                None => ExitJudgement::Unexplained,
            }
        }
        ExitClass::LeaseLost | ExitClass::LeaseHeld => {
            // "a crashed holder's lease has not expired yet" refuses a start too, the
            // daemon's own earlier incarnation included.
            if class == ExitClass::LeaseHeld {
                // The daemon read the row before it exited, up to a margin before the runner saw
                // the exit (its shutdown, the observation tick): a row live then explains it.
                let since = at.saturating_sub(model.cfg.exit_margin_ms);
                if let Some(by) = live_row_within(model, since, at) {
                    return expected(format!("the lease row of {by} was live"));
                }
            }
            if let Some(other) = other_holder_before(model, daemon, at) {
                return expected(format!("the lease was held by {other}"));
            }
            // A partition leaves the minority side's lease renewals unanswered (the lease
            // bucket's replicas are out of reach), up to a TTL past its heal.
            let after_partition = model.cfg.lease_ttl_ms + model.cfg.exit_margin_ms;
            match model.faults.iter().find(|f| {
                f.from_ms <= at
                    && (f.kind == FaultKind::LeaseDelete
                        || (f.kind.freezes() && Model::daemon_of_target(&f.target) == Some(daemon))
                        || (f.kind == FaultKind::Partition
                            && at <= f.to_ms.saturating_add(after_partition)))
            }) {
                Some(f) => expected(format!("{} of fault {}", f.kind.name(), f.id)),
                None => ExitJudgement::Unexplained,
            }
        }
        ExitClass::Unreachable => {
            // Started while a fault kept the broker away: "restart once the broker is up".
            let margin = model.cfg.exit_margin_ms;
            match model.faults.iter().find(|f| {
                f.kind.cuts_broker() && f.from_ms <= at && at <= f.to_ms.saturating_add(margin)
            }) {
                Some(f) => expected(format!("{} of fault {}", f.kind.name(), f.id)),
                None => ExitJudgement::Unexplained,
            }
        }
        ExitClass::StartupFailed => match frozen_while_starting(model, daemon, at) {
            Some(f) => expected(format!(
                "{} of fault {} froze its start-up (a start-up bound ran out while frozen)",
                f.kind.name(),
                f.id
            )),
            None => ExitJudgement::Unexplained,
        },
        // A clean exit once the runner asked for the stop is the stop's, whatever line came
        // last: a standby host's lane may log its lease watch's news (the holder's release, seen
        // as a delete) after the host's own `received SIGTERM` line (seeds 6013 and 6019,
        // `--standby`: `the lease row was deleted … claiming the lease now` taken as the reason).
        ExitClass::Other if stopped && code == Some(0) => {
            expected("a clean exit at the runner's stop".into())
        }
        ExitClass::Other => ExitJudgement::Unexplained,
    }
}

/// A pause of `daemon` that froze the process which exited at `at` while it was still starting:
/// begun after that daemon's previous exit (so it froze this process), ended no more than the
/// exit margin before `at`. A start-up's bounds (the lease watch's bind is a JetStream request
/// bounded by the request timeout) run on the monotonic clock, which runs on while the process
/// is stopped, so at the SIGCONT the bound has run out and the start fails, releasing the claim
/// (`fault_after_claim`); the supervisor starts it again. Found by seeds 4305 and 4408: restarted
/// after a kill, SIGSTOPped for 15.8 s and 11.6 s right after `✓ delivery daemon up`, each exited
/// at the SIGCONT with `the lease watch could not be bound (timed out)`.
fn frozen_while_starting<'m>(model: &'m Model<'_>, daemon: &str, at: Ms) -> Option<&'m FaultSpan> {
    let started_after = model
        .history
        .observed
        .iter()
        .filter_map(|o| match &o.what {
            Observation::DaemonExited { daemon: d, .. } if d == daemon && o.ms < at => Some(o.ms),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    model.faults.iter().find(|f| {
        f.kind.freezes()
            && Model::daemon_of_target(&f.target) == Some(daemon)
            && f.from_ms >= started_after
            && f.from_ms <= at
            && at <= f.to_ms.saturating_add(model.cfg.exit_margin_ms)
    })
}

/// The holder of a lease row live at some moment in `[from, to]` (a row written by `to`, not
/// replaced by another write before `from`, and less than a TTL old at `from`), if the snapshot
/// has one.
fn live_row_within(model: &Model<'_>, from: Ms, to: Ms) -> Option<String> {
    let mut writes: Vec<&LeaseRecord> = model
        .snapshot
        .lease_writes
        .iter()
        .filter(|w| w.ms <= to)
        .collect();
    writes.sort_by_key(|w| w.revision);
    let live = writes.iter().enumerate().rev().find(|(k, w)| {
        let replaced_before = writes.get(k + 1).is_some_and(|next| next.ms <= from);
        w.op == LeaseOp::Row
            && !replaced_before
            && from < w.ms.saturating_add(model.cfg.lease_ttl_ms)
    })?;
    Some(holder_names(model).name(live.1))
}

/// Another daemon that wrote the lease row or said it served before `at`.
fn other_holder_before(model: &Model<'_>, daemon: &str, at: Ms) -> Option<String> {
    let mine: Vec<(&str, &str)> = model
        .history
        .observed
        .iter()
        .filter_map(|o| match &o.what {
            Observation::DaemonServing {
                daemon: d,
                holder,
                incarnation,
            } if d == daemon => Some((holder.as_str(), incarnation.as_str())),
            _ => None,
        })
        .collect();
    let row = model.snapshot.lease_writes.iter().find(|w| {
        w.op == LeaseOp::Row
            && w.ms <= at
            && !mine.contains(&(
                w.holder.as_deref().unwrap_or(""),
                w.incarnation.as_deref().unwrap_or(""),
            ))
    });
    if let Some(w) = row {
        return Some(w.holder.clone().unwrap_or_default());
    }
    model
        .serving
        .iter()
        .find(|(d, spans)| d.as_str() != daemon && spans.iter().any(|(from, _)| *from <= at))
        .map(|(d, _)| d.clone())
}

/// A broker-gone exit must fall within the window (or backstop) of a fault that cut the
/// daemon off its broker: no earlier than the fault's start plus the window, no later than
/// that plus the time a silent broker takes to count as gone, plus the margin. A pause of the
/// daemon itself is credited as its own stall, so the window line may then come as late as the
/// backstop.
fn broker_gone(model: &Model<'_>, daemon: &str, at: Ms, class: ExitClass) -> ExitJudgement {
    let cfg = model.cfg;
    let stalled = model.faults.iter().any(|f| {
        f.kind.freezes() && Model::daemon_of_target(&f.target) == Some(daemon) && f.from_ms <= at
    });
    let causes: Vec<&FaultSpan> = model
        .faults
        .iter()
        .filter(|f| f.kind.cuts_broker() && f.from_ms <= at)
        .collect();
    // Past the backstop "however long the daemon was stalled": a daemon frozen long enough
    // for the broker to drop it may find itself past the backstop once thawed.
    if class == ExitClass::BrokerGoneBackstop {
        let thawed = model.faults.iter().find(|f| {
            f.kind.freezes()
                && Model::daemon_of_target(&f.target) == Some(daemon)
                && f.from_ms <= at
                && at
                    <= f.to_ms
                        .saturating_add(cfg.silent_detect_ms)
                        .saturating_add(cfg.broker_gone_backstop_ms)
                        .saturating_add(cfg.exit_margin_ms)
        });
        if let Some(f) = thawed {
            return ExitJudgement::Expected {
                because: format!("{} of fault {} at {} ms", f.kind.name(), f.id, f.from_ms),
            };
        }
    }
    let window = |f: &FaultSpan| {
        let detect = if f.kind.is_silent() {
            cfg.silent_detect_ms
        } else {
            0
        };
        let (lo, hi) = match class {
            ExitClass::BrokerGoneBackstop => {
                (cfg.broker_gone_backstop_ms, cfg.broker_gone_backstop_ms)
            }
            _ if stalled => (cfg.broker_gone_window_ms, cfg.broker_gone_backstop_ms),
            _ => (cfg.broker_gone_window_ms, cfg.broker_gone_window_ms),
        };
        (
            f.from_ms
                .saturating_add(lo)
                .saturating_sub(cfg.exit_margin_ms),
            f.from_ms
                .saturating_add(detect)
                .saturating_add(hi)
                .saturating_add(cfg.exit_margin_ms),
        )
    };
    if let Some(f) = causes.iter().find(|f| {
        let (lo, hi) = window(f);
        at >= lo && at <= hi
    }) {
        return ExitJudgement::Expected {
            because: format!("{} of fault {} at {} ms", f.kind.name(), f.id, f.from_ms),
        };
    }
    match causes.iter().max_by_key(|f| f.from_ms) {
        None => ExitJudgement::Unexplained,
        Some(f) => {
            let (lo, hi) = window(f);
            if at > hi {
                ExitJudgement::Late {
                    fault: f.id,
                    by_ms: at - hi,
                }
            } else {
                ExitJudgement::Early {
                    fault: f.id,
                    by_ms: lo - at,
                }
            }
        }
    }
}
