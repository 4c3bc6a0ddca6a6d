//! What the broker recorded over time: every write to the lease key in order (a row and whose
//! run of the daemon wrote it, a delete, a purge, the broker's own expiry marker), stamped by the
//! broker; and every connection the broker accepted for a daemon's credential, open or closed,
//! with the broker's start stamps. Takeovers and retries are judged from these records, and a
//! step that reads one is timed by the broker's stamp, not by the moment the harness saw it.

use std::time::{Duration as StdDuration, Instant, SystemTime};

use cotal_delivery::base::RowOp;
use serde::Deserialize;

use super::verb::{parse_rfc3339, Ctx, Kind, Profiled, Refs, DEFAULT_WITHIN};
use crate::kit::expr::Duration;
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::watch::LeaseLogWatch;
use crate::kit::world::World;
use crate::rig::connz::ConnState;
use crate::rig::lease_log::{LeaseLog, LeaseWrite, LogFrom};

pub const VERBS: &[&str] = &["watch_lease", "expect_lease_write", "expect_dials"];

/// Where a lease watch starts.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LogStart {
    /// The key's last message (the row as it stands), then every write.
    #[default]
    Last,
    /// The writes made after the watch is bound.
    Now,
}

/// A kind of write to the lease key.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Write {
    /// A live row (a claim, a renew, a readiness change).
    Row,
    /// A delete marker (a release, an operator's delete).
    Deleted,
    /// A purge.
    Purged,
    /// The broker's marker of a row that ran out the bucket's TTL.
    Expired,
}

impl Write {
    fn op(self) -> RowOp {
        match self {
            Write::Row => RowOp::Put,
            Write::Deleted => RowOp::Deleted,
            Write::Purged => RowOp::Purged,
            Write::Expired => RowOp::Expired,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum HistoryStep {
    WatchLease {
        name: String,
        #[serde(default)]
        from: LogStart,
    },
    ExpectLeaseWrite {
        log: String,
        write: Write,
        /// A row written by the delivery credential this daemon or host was started with.
        #[serde(default)]
        holder: Option<String>,
        /// A run of rows of one daemon run (one holder and incarnation), ended by a write that
        /// is not one of them (left for the next step); the step's event is the run's last row.
        #[serde(default)]
        run: bool,
        /// With `run`: the run may be empty (the next write is not one of these rows, and is
        /// left for the next step), for a row that may or may not be rewritten before the
        /// write the case waits for. The step has no event of its own then.
        #[serde(default)]
        or_none: bool,
    },
    ExpectDials {
        daemon: String,
        /// Only connections that gave this client name.
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        min: Option<usize>,
        #[serde(default)]
        max: Option<usize>,
        /// How many of them are still open.
        #[serde(default)]
        open: Option<usize>,
        /// Only the dials the broker has closed again: a connection the daemon keeps open beside
        /// them (a standby's watch of the lease row) is left out.
        #[serde(default)]
        closed: bool,
        /// Each dial starts at least this long after the one before it…
        #[serde(default)]
        every: Option<Duration>,
        /// …and at most this much later than that (default 0).
        #[serde(default)]
        slack: Option<Duration>,
    },
}

impl Profiled for HistoryStep {
    fn distribution_only(&self) -> Option<&'static str> {
        match self {
            HistoryStep::ExpectDials { name: Some(_), .. } => {
                Some("it counts the connections that gave this distribution's connection name")
            }
            _ => None,
        }
    }
}

impl HistoryStep {
    pub fn default_within(&self) -> Option<StdDuration> {
        match self {
            HistoryStep::ExpectLeaseWrite { .. } => Some(DEFAULT_WITHIN),
            // Counted once, unless the case gives a bound to wait for the counts.
            HistoryStep::ExpectDials { .. } => Some(StdDuration::ZERO),
            HistoryStep::WatchLease { .. } => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            HistoryStep::WatchLease { name, .. } => Refs::default().creates(Kind::LeaseLog, name),
            HistoryStep::ExpectLeaseWrite { log, holder, .. } => Refs::default()
                .uses(Kind::LeaseLog, log)
                .uses_opt(Kind::Daemon, holder.as_ref()),
            HistoryStep::ExpectDials { daemon, .. } => Refs::default().uses(Kind::Daemon, daemon),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            HistoryStep::WatchLease { name, from } => {
                let log = LeaseLog::bind(
                    &w.insp,
                    match from {
                        LogStart::Last => LogFrom::Last,
                        LogStart::Now => LogFrom::Now,
                    },
                )
                .await?;
                w.lease_logs.insert(name.clone(), LeaseLogWatch::new(log));
                Ok(format!(
                    "watch every write to the lease key as {name}{}",
                    match from {
                        LogStart::Last => ", from the row as it stands",
                        LogStart::Now => ", from now",
                    }
                ))
            }
            HistoryStep::ExpectLeaseWrite {
                log,
                write,
                holder,
                run,
                or_none,
            } => {
                let run = match (*run, *or_none) {
                    (false, false) => LeaseRun::One,
                    (true, false) => LeaseRun::Some,
                    (true, true) => LeaseRun::AnyNumber,
                    (false, true) => {
                        return Err(Failure::could_not("`or_none` goes with `run = true` only"))
                    }
                };
                expect_write(w, ctx, log, *write, holder.as_deref(), run).await
            }
            HistoryStep::ExpectDials {
                daemon,
                name,
                min,
                max,
                open,
                closed,
                every,
                slack,
            } => {
                let dials = Dials {
                    name: name.as_deref(),
                    closed: *closed,
                    min: *min,
                    max: *max,
                    open: *open,
                    every: every.as_ref(),
                    slack: slack.as_ref(),
                };
                expect_dials(w, ctx, daemon, &dials).await
            }
        }
    }
}

/// What a write is, for a failure.
fn describe(w: &LeaseWrite) -> String {
    match (&w.op, &w.info) {
        (RowOp::Put, Some(i)) => format!(
            "a row of {} (incarnation {}, ready {}) at revision {}",
            i.holder, i.incarnation, i.ready, w.revision
        ),
        (RowOp::Put, None) => format!("an unreadable row at revision {}", w.revision),
        (op, _) => format!("a {} marker at revision {}", op.as_str(), w.revision),
    }
}

/// The instant of a broker stamp on this host's clock.
fn instant_of(stamp: SystemTime) -> Instant {
    let (now, wall) = (Instant::now(), SystemTime::now());
    match wall.duration_since(stamp) {
        Ok(ago) => now.checked_sub(ago).unwrap_or(now),
        Err(ahead) => now + ahead.duration(),
    }
}

/// How many writes an `expect_lease_write` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseRun {
    /// The next write.
    One,
    /// A run of one or more rows of one daemon run, ended by another write.
    Some,
    /// A run of zero or more such rows, ended by another write.
    AnyNumber,
}

async fn expect_write(
    w: &mut World,
    ctx: Ctx,
    log: &str,
    write: Write,
    holder: Option<&str>,
    how: LeaseRun,
) -> StepResult {
    let run = how != LeaseRun::One;
    if run && write != Write::Row {
        return Err(Failure::could_not("`run` goes with `write = \"row\"` only"));
    }
    let want_holder = holder
        .map(|h| {
            let path = w
                .daemon_creds
                .get(h)
                .ok_or_else(|| Failure::could_not(format!("no daemon {h:?} was started")))?;
            World::holder_of_creds(path)
        })
        .transpose()?;
    // The holder's principal is named, so a transcript shows which holder a line names.
    let of = |h: &str| format!("{h} ({})", want_holder.as_deref().unwrap_or_default());
    let what = match (write, holder) {
        (Write::Row, Some(h)) if how == LeaseRun::AnyNumber => {
            format!("a run of rows of {} or none", of(h))
        }
        (Write::Row, None) if how == LeaseRun::AnyNumber => {
            "a run of rows of one holder or none".to_string()
        }
        (Write::Row, Some(h)) if run => format!("a run of rows of {}", of(h)),
        (Write::Row, Some(h)) => format!("a row of {}", of(h)),
        (Write::Row, None) if run => "a run of rows of one holder".to_string(),
        (Write::Row, None) => "a row".to_string(),
        (Write::Expired, _) => "an expired marker (the broker's, at the bucket TTL)".to_string(),
        (other, _) => format!("a {} marker", other.op().as_str()),
    };
    let watch = w
        .lease_logs
        .get_mut(log)
        .ok_or_else(|| Failure::could_not(format!("no lease watch named {log:?}")))?;
    let bound = ctx.deadline.saturating_duration_since(ctx.started);
    let first = watch.next(ctx.deadline).await?.ok_or_else(|| {
        Failure::new(
            format!(
                "the next write to the lease key to be {what} within {} ms",
                bound.as_millis()
            ),
            "no write",
        )
    })?;
    let matches = first.op == write.op()
        && want_holder
            .as_ref()
            .is_none_or(|h| first.info.as_ref().is_some_and(|i| i.holder == *h));
    if !matches && how == LeaseRun::AnyNumber {
        // The same words either way: the transcript does not hang on whether a row came.
        watch.put_back(first);
        return Ok(format!(
            "lease key ({log}): {what}, one run of the daemon, then another write"
        ));
    }
    if !matches {
        return Err(Failure::new(
            format!("the next write to the lease key to be {what}"),
            describe(&first),
        ));
    }
    let mut last = first;
    if run {
        let one_run = |a: &LeaseWrite, b: &LeaseWrite| {
            b.op == RowOp::Put
                && matches!((&a.info, &b.info), (Some(x), Some(y))
                    if x.holder == y.holder && x.incarnation == y.incarnation)
        };
        loop {
            let Some(next) = watch.next(ctx.deadline).await? else {
                return Err(Failure::new(
                    format!(
                        "{what} to end with another write within {} ms",
                        bound.as_millis()
                    ),
                    format!("the run goes on through {}", describe(&last)),
                ));
            };
            if one_run(&last, &next) {
                last = next;
            } else {
                watch.put_back(next);
                break;
            }
        }
    }
    let at = instant_of(last.stamped);
    if at > ctx.deadline {
        return Err(Failure::new(
            format!("{what} within {} ms", bound.as_millis()),
            format!(
                "{} stamped {} ms after the bound",
                describe(&last),
                at.saturating_duration_since(ctx.deadline).as_millis()
            ),
        ));
    }
    w.happened_at = Some(at);
    Ok(if run {
        format!("lease key ({log}): {what}, one run of the daemon, then another write")
    } else {
        format!("lease key ({log}): {what}")
    })
}

/// The bounds of an `expect_dials`.
struct Dials<'a> {
    name: Option<&'a str>,
    closed: bool,
    min: Option<usize>,
    max: Option<usize>,
    open: Option<usize>,
    every: Option<&'a Duration>,
    slack: Option<&'a Duration>,
}

/// One connection the broker accepted: when (its stamp) and whether it is still open.
#[derive(Debug)]
struct Dial {
    start: SystemTime,
    open: bool,
}

/// The dials the broker accepted for `nkey` (with client name `name`) since `spawned`, by start.
async fn dials_of(
    w: &mut World,
    nkey: &str,
    name: Option<&str>,
    spawned: SystemTime,
) -> Result<Vec<Dial>, Failure> {
    let mut dials = Vec::new();
    for i in 0..w.mesh.node_count() {
        let Some(node) = w.mesh.node_mut(i) else {
            continue;
        };
        if !node.is_running() {
            continue;
        }
        for c in node.connz(ConnState::All).await? {
            if c.user.as_deref() != Some(nkey) || name.is_some_and(|n| c.name != n) {
                continue;
            }
            let start = parse_rfc3339(&c.start).ok_or_else(|| {
                Failure::could_not(format!("the broker's start stamp {:?}", c.start))
            })?;
            if start >= spawned {
                dials.push(Dial {
                    start,
                    open: c.reason.is_none(),
                });
            }
        }
    }
    dials.sort_by_key(|d| d.start);
    Ok(dials)
}

/// The dials as a failure shows them: each one's start after the first, and which are open.
fn seen(dials: &[Dial]) -> String {
    let first = dials.first().map(|d| d.start);
    let offsets: Vec<String> = dials
        .iter()
        .map(|d| {
            let at = first
                .and_then(|f| d.start.duration_since(f).ok())
                .unwrap_or_default();
            format!(
                "+{} ms{}",
                at.as_millis(),
                if d.open { " (open)" } else { "" }
            )
        })
        .collect();
    format!("{} dials: [{}]", dials.len(), offsets.join(", "))
}

async fn expect_dials(w: &mut World, ctx: Ctx, daemon: &str, want: &Dials<'_>) -> StepResult {
    let path = w
        .daemon_creds
        .get(daemon)
        .ok_or_else(|| Failure::could_not(format!("no daemon {daemon:?} was started")))?
        .clone();
    let nkey = cotal_delivery::base::read_creds_file(&path)
        .and_then(|c| c.public_key())
        .map_err(|e| Failure::could_not(format!("the credential of daemon {daemon}: {e}")))?;
    let spawned = w.daemon(daemon)?.spawned_at();
    let named = want
        .name
        .map(|n| format!(" named {n:?}"))
        .unwrap_or_default()
        + if want.closed { ", closed again" } else { "" };
    let mut expected = Vec::new();
    if let Some(min) = want.min {
        expected.push(format!("at least {min}"));
    }
    if let Some(max) = want.max {
        expected.push(format!("at most {max}"));
    }
    if let Some(open) = want.open {
        expected.push(format!("{open} still open"));
    }
    let counts = format!(
        "dials of daemon {daemon}'s credential{named}: {}",
        expected.join(", ")
    );
    // The counts are waited for (a dial under way is open until its attempt ends); a count
    // past `max` never comes back under it.
    let dials = loop {
        let mut dials = dials_of(w, &nkey, want.name, spawned).await?;
        if want.closed {
            dials.retain(|d| !d.open);
        }
        let open = dials.iter().filter(|d| d.open).count();
        if want.max.is_some_and(|m| dials.len() > m) {
            return Err(Failure::new(counts, seen(&dials)));
        }
        if want.min.is_none_or(|m| dials.len() >= m) && want.open.is_none_or(|o| open == o) {
            break dials;
        }
        if Instant::now() >= ctx.deadline {
            return Err(Failure::new(
                format!(
                    "{counts} within {} ms",
                    ctx.deadline
                        .saturating_duration_since(ctx.started)
                        .as_millis()
                ),
                seen(&dials),
            ));
        }
        tokio::time::sleep(DIALS_POLL.min(ctx.left())).await;
    };
    let mut what = expected;
    if let Some(every) = want.every {
        let floor = StdDuration::from_millis(every.eval(&w.vars).map_err(Failure::could_not)?);
        let slack = match want.slack {
            Some(s) => StdDuration::from_millis(s.eval(&w.vars).map_err(Failure::could_not)?),
            None => StdDuration::ZERO,
        };
        for pair in dials.windows(2) {
            let gap = pair[1]
                .start
                .duration_since(pair[0].start)
                .unwrap_or_default();
            if gap < floor || gap > floor + slack {
                return Err(Failure::new(
                    format!(
                        "each dial of daemon {daemon}'s credential{named} {} to {} ms after the one before",
                        floor.as_millis(),
                        (floor + slack).as_millis()
                    ),
                    format!("a gap of {} ms; {}", gap.as_millis(), seen(&dials)),
                ));
            }
        }
        what.push(match want.slack {
            Some(s) => format!("each {every} to {every} + {s} after the one before"),
            None => format!("each {every} after the one before"),
        });
    }
    Ok(format!(
        "the broker's dials of daemon {daemon}'s credential{named}: {}",
        what.join(", ")
    ))
}

/// How often the broker's connection records are read again while a count is awaited.
const DIALS_POLL: StdDuration = StdDuration::from_millis(250);

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation seen failing: the fraction read as written (`.5` as 5 ns).
    #[test]
    fn broker_stamps_parse_to_their_instant() {
        let at = |s: &str| {
            parse_rfc3339(s)
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map(|d| d.as_millis())
        };
        assert_eq!(at("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(at("2000-02-29T00:00:00.5Z"), Some(951_782_400_500));
        assert_eq!(
            at("2026-12-02T12:00:00.123456789Z"),
            Some(1_796_212_800_123)
        );
        assert_eq!(at("2026-12-02T13:30:00.25+01:30"), Some(1_796_212_800_250));
        assert_eq!(at("not a time"), None);
    }
}
