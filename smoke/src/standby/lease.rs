//! What the lease did in each case of `smoke delivery-standby`, read from a broker watch of
//! every write to the lease key (`delivery_harness::rig::lease_log`, the suite's own connection): when
//! the holder's row ended (its release's delete, or the broker's expiry marker), as the broker
//! stamped it; how long after that the standby answered and delivered; and whether exactly one
//! create followed, by the expected host, with nobody else writing the key until the next case.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use cotal_delivery::base::RowOp;
use delivery_harness::rig::lease_log::{LeaseLog, LeaseWrite, LogFrom};
use delivery_harness::rig::mesh::Inspector;

/// How long the recorder waits for one write (it runs for the whole suite).
const RECORD_WAIT: Duration = Duration::from_secs(3600);

/// Records every write to the lease key from its start until it is dropped.
pub struct Recorder {
    writes: Arc<Mutex<Vec<LeaseWrite>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    pub async fn start(insp: &Inspector) -> Result<Recorder, String> {
        let mut log = LeaseLog::bind(insp, LogFrom::Last)
            .await
            .map_err(|e| e.to_string())?;
        let writes: Arc<Mutex<Vec<LeaseWrite>>> = Arc::default();
        let into = writes.clone();
        let task = tokio::spawn(async move {
            // An error ends the record; the gap check then reports the writes it missed.
            while let Ok(next) = log.next(RECORD_WAIT).await {
                if let (Some(w), Ok(mut v)) = (next, into.lock()) {
                    v.push(w);
                }
            }
        });
        Ok(Recorder { writes, task })
    }

    /// The writes recorded so far, in the broker's order.
    pub fn writes(&self) -> Vec<LeaseWrite> {
        self.writes.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One case of one round as the suite ran it, in wall-clock time (the broker's stamps share the
/// machine's clock, on one broker and on the loopback cluster).
pub struct Run {
    /// The holder's SIGKILL or SIGTERM (or its node's).
    pub t0: SystemTime,
    pub answered: SystemTime,
    pub delivered: SystemTime,
    /// The holder at `t0`: the only writer of the key before its row ends.
    pub holder: String,
    /// The host that must create the row after it ended; `None`: any (the node case, where the
    /// old holder's lane may re-create its own expired row).
    pub winner: Option<String>,
}

/// A run's moments as the suite took them (monotonic), with the wall-clock time of its start.
pub struct Times {
    t0: Instant,
    t0_wall: SystemTime,
    answered: Instant,
    delivered: Instant,
}

impl Times {
    pub fn new(t0: Instant, t0_wall: SystemTime, answered: Instant, delivered: Instant) -> Times {
        Times {
            t0,
            t0_wall,
            answered,
            delivered,
        }
    }

    /// The run on the wall clock, for the holder at `t0` and the expected winner.
    pub fn run(&self, holder: String, winner: Option<String>) -> Run {
        let wall = |t: Instant| self.t0_wall + t.duration_since(self.t0);
        Run {
            t0: self.t0_wall,
            answered: wall(self.answered),
            delivered: wall(self.delivered),
            holder,
            winner,
        }
    }
}

/// What the broker's log says about one run.
#[derive(Debug, Clone)]
pub struct Facts {
    /// How the holder's row ended: `Deleted` (its release) or `Expired` (the broker's marker).
    pub gone_by: RowOp,
    /// From the holder's end to the row's end.
    pub row_gone_ms: i64,
    /// From the row's nominal expiry (its last write's stamp + TTL) to the marker: the broker's
    /// own granularity. For an expiry only.
    pub expiry_lag_ms: Option<i64>,
    pub answer_after_gone_ms: i64,
    pub post_after_gone_ms: i64,
}

/// `later - earlier` in milliseconds, negative when `later` is earlier.
pub fn ms_between(later: SystemTime, earlier: SystemTime) -> i64 {
    match later.duration_since(earlier) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// The run's facts from the writes stamped between its `t0` and `until` (the next run's `t0`,
/// or the end). `Ok(None)`: no row ended in the window (a lane that rode its node's failover).
/// `Err`: the window breaks the lease's rules (more than one end, a create by another host, a
/// write by anyone but the one winner after it) or the log missed writes in it.
pub fn facts(
    writes: &[LeaseWrite],
    run: &Run,
    until: Option<SystemTime>,
    ttl: Duration,
) -> Result<Option<Facts>, String> {
    let window: Vec<&LeaseWrite> = writes
        .iter()
        .filter(|w| w.stamped >= run.t0 && until.is_none_or(|u| w.stamped < u))
        .collect();
    for pair in window.windows(2) {
        if pair[1].revision != pair[0].revision + 1 {
            return Err(format!(
                "the broker watch of the key missed writes (revision {} then {})",
                pair[0].revision, pair[1].revision
            ));
        }
    }
    let ends: Vec<usize> = (0..window.len())
        .filter(|&i| !window[i].op.is_row())
        .collect();
    let at = match ends.as_slice() {
        [] => return Ok(None),
        [at] => *at,
        // The node case (no winner named): the old holder's lane may re-create its expired row
        // during the elections and lose it again. Each earlier end must still be followed by
        // one create over it, and nobody but that creator may write before the next end; the
        // figures are those of the last end.
        [.., last] if run.winner.is_none() => {
            for pair in ends.windows(2) {
                let (end, next) = (pair[0], pair[1]);
                let between = &window[end + 1..next];
                let creator = between
                    .first()
                    .filter(|c| c.revision == window[end].revision + 1)
                    .and_then(|c| c.info.as_ref())
                    .map(|i| (&i.holder, &i.incarnation));
                let Some(creator) = creator else {
                    return Err(format!(
                        "the write after the row's end at revision {} is not one create over it: {:?}",
                        window[end].revision,
                        between.first()
                    ));
                };
                if let Some(other) = between
                    .iter()
                    .find(|w| w.info.as_ref().map(|i| (&i.holder, &i.incarnation)) != Some(creator))
                {
                    return Err(format!(
                        "a write between two ends of the row that is not its creator's: {other:?}"
                    ));
                }
            }
            *last
        }
        _ => {
            return Err(format!(
                "the row ended {} times between two cases: {:?}",
                ends.len(),
                window
            ))
        }
    };
    if let Some(other) = window[..ends[0]].iter().find(|w| !w.is_row_of(&run.holder)) {
        return Err(format!(
            "a write before the row ended that is not the holder's: {other:?}"
        ));
    }
    let gone = window[at];
    let after = &window[at + 1..];
    let Some(create) = after.first() else {
        return Err(format!(
            "no create after the row ended at revision {}",
            gone.revision
        ));
    };
    let winner = create.info.as_ref().map(|i| (&i.holder, &i.incarnation));
    if let (Some(want), Some((holder, _))) = (&run.winner, winner) {
        if want != holder {
            return Err(format!(
                "the row was created by {holder}, not by the standby {want}"
            ));
        }
    }
    if winner.is_none() || create.revision != gone.revision + 1 {
        return Err(format!(
            "the write after the row's end is not one create over it: {create:?}"
        ));
    }
    if let Some(other) = after
        .iter()
        .find(|w| w.info.as_ref().map(|i| (&i.holder, &i.incarnation)) != winner)
    {
        return Err(format!(
            "a write after the one create that is not the winner's: {other:?}"
        ));
    }
    let expiry_lag_ms = match gone.op {
        RowOp::Expired => window[..at]
            .iter()
            .rev()
            .copied()
            .chain(writes.iter().rev().filter(|w| w.stamped < run.t0))
            .find(|w| w.op.is_row())
            .map(|last| ms_between(gone.stamped, last.stamped + ttl)),
        _ => None,
    };
    Ok(Some(Facts {
        gone_by: gone.op,
        row_gone_ms: ms_between(gone.stamped, run.t0),
        expiry_lag_ms,
        answer_after_gone_ms: ms_between(run.answered, gone.stamped),
        post_after_gone_ms: ms_between(run.delivered, gone.stamped),
    }))
}

/// (min, median, max) of `v`, `None` when it is empty.
fn stats(v: impl Iterator<Item = i64>) -> Option<(i64, i64, i64)> {
    let mut v: Vec<i64> = v.collect();
    v.sort_unstable();
    Some((*v.first()?, v[v.len() / 2], *v.last()?))
}

fn stats_json(s: Option<(i64, i64, i64)>) -> serde_json::Value {
    match s {
        Some((min, median, max)) => serde_json::json!({"min": min, "median": median, "max": max}),
        None => serde_json::Value::Null,
    }
}

/// One case's facts over its rounds.
pub struct Summary<'a> {
    pub case: &'a str,
    pub facts: &'a [Facts],
    /// The case's slowest first answer, from the holder's end.
    pub rail_max_ms: u128,
    /// Rounds whose log broke a rule (reported on stderr, and the suite fails).
    pub faults: usize,
    pub target: Duration,
}

impl Summary<'_> {
    fn gone_by(&self, op: RowOp) -> usize {
        self.facts.iter().filter(|f| f.gone_by == op).count()
    }

    /// Whether the first answer met the target: a graceful stop counted from the holder's
    /// SIGTERM, any other case from the row's end. `None` without a row's end (a node case
    /// whose lane rode every failover).
    pub fn within_target(&self) -> Option<bool> {
        let target = self.target.as_millis();
        if self.case == "stop" {
            return Some(self.rail_max_ms <= target);
        }
        stats(self.facts.iter().map(|f| f.answer_after_gone_ms))
            .map(|(_, _, max)| max <= target as i64)
    }

    /// The case's lease fields of `--json`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "row_gone_ms": stats_json(stats(self.facts.iter().map(|f| f.row_gone_ms))),
            "gone_by": {"delete": self.gone_by(RowOp::Deleted), "expiry": self.gone_by(RowOp::Expired), "purge": self.gone_by(RowOp::Purged)},
            "expiry_lag_ms": stats_json(stats(self.facts.iter().filter_map(|f| f.expiry_lag_ms))),
            "answer_after_gone_ms": stats_json(stats(self.facts.iter().map(|f| f.answer_after_gone_ms))),
            "post_after_gone_ms": stats_json(stats(self.facts.iter().map(|f| f.post_after_gone_ms))),
            "answer_target_ms": self.target.as_millis(),
            "answer_within_target": self.within_target(),
            "single_winner": self.faults == 0,
        })
    }

    /// The case's lease line of the table.
    pub fn line(&self) -> String {
        let mmm = |s: Option<(i64, i64, i64)>| match s {
            Some((a, b, c)) => format!("{a}/{b}/{c} ms"),
            None => "-".into(),
        };
        let target = match self.within_target() {
            Some(true) => "within",
            Some(false) => "beyond",
            None => "not measured against",
        };
        let from = if self.case == "stop" {
            "the SIGTERM"
        } else {
            "the row's end"
        };
        let lag = match stats(self.facts.iter().filter_map(|f| f.expiry_lag_ms)) {
            Some(s) => format!(", the expiry {} after its nominal time", mmm(Some(s))),
            None => String::new(),
        };
        format!(
            "        the row ended {} after the holder's end ({} by its delete, {} by the broker's expiry marker{lag}); after the row's end, first ctl.delivery answer {} and first delivered post {}; first answer {target} the {} ms target (from {from}); {}",
            mmm(stats(self.facts.iter().map(|f| f.row_gone_ms))),
            self.gone_by(RowOp::Deleted),
            self.gone_by(RowOp::Expired),
            mmm(stats(self.facts.iter().map(|f| f.answer_after_gone_ms))),
            mmm(stats(self.facts.iter().map(|f| f.post_after_gone_ms))),
            self.target.as_millis(),
            if self.faults == 0 {
                "one create after each end, by the standby, and no other write (broker log)"
            } else {
                "THE LEASE BROKE A RULE (see above)"
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cotal_delivery::wire::LeaseInfo;

    const TTL: Duration = Duration::from_secs(30);

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(1_000_000 + ms)
    }

    fn row(revision: u64, ms: u64, holder: &str, incarnation: &str) -> LeaseWrite {
        LeaseWrite {
            revision,
            stamped: at(ms),
            op: RowOp::Put,
            info: Some(LeaseInfo {
                holder: holder.into(),
                since: 0,
                ready: true,
                incarnation: incarnation.into(),
            }),
        }
    }

    fn end(revision: u64, ms: u64, op: RowOp) -> LeaseWrite {
        LeaseWrite {
            revision,
            stamped: at(ms),
            op,
            info: None,
        }
    }

    /// A kill at 10 s: A's last renewal at 5 s, its marker at 35.3 s, B's create and renewal.
    fn kill_log() -> Vec<LeaseWrite> {
        vec![
            row(1, 0, "A", "a1"),
            row(2, 5_000, "A", "a1"),
            end(3, 35_300, RowOp::Expired),
            row(4, 35_500, "B", "b1"),
            row(5, 50_500, "B", "b1"),
        ]
    }

    fn kill_run() -> Run {
        Run {
            t0: at(10_000),
            answered: at(35_700),
            delivered: at(35_800),
            holder: "A".into(),
            winner: Some("B".into()),
        }
    }

    /// A clean kill: the row ended by the broker's marker, the figures measured from its stamp,
    /// the expiry lag from A's last row (before the kill) + TTL.
    /// Mutation seen failing: the lag's search for the last row limited to the window (the
    /// writes before the kill skipped): no lag.
    #[test]
    fn a_kill_ends_by_the_marker_and_is_timed_from_its_stamp() {
        let f = facts(&kill_log(), &kill_run(), None, TTL)
            .expect("clean")
            .expect("an end");
        assert_eq!(f.gone_by, RowOp::Expired);
        assert_eq!(f.row_gone_ms, 25_300);
        assert_eq!(f.expiry_lag_ms, Some(300));
        assert_eq!((f.answer_after_gone_ms, f.post_after_gone_ms), (400, 500));
    }

    /// Only one winner: a second create after the end (the loser's row, or a returning host
    /// rewriting it) is a broken rule, as is a create by a host that is not the standby, two
    /// ends between cases, a write by anyone but the holder before the end, and a missed
    /// revision. Mutations seen failing: the check of the writes after the one create removed
    /// (`single_winner` stays true with a second create); the winner check removed.
    #[test]
    fn a_second_create_a_wrong_winner_or_a_gap_breaks_the_rules() {
        let run = kill_run();
        let mut second = kill_log();
        second[4] = row(5, 35_600, "C", "c1");
        let e = facts(&second, &run, None, TTL).expect_err("a second create");
        assert!(e.contains("not the winner's"), "{e}");

        let mut returning = kill_log();
        returning[4] = row(5, 40_000, "A", "a2");
        let e = facts(&returning, &run, None, TTL).expect_err("the returning host wrote");
        assert!(e.contains("not the winner's"), "{e}");

        let mut wrong = kill_log();
        wrong[3] = row(4, 35_500, "C", "c1");
        wrong.truncate(4);
        let e = facts(&wrong, &run, None, TTL).expect_err("created by another host");
        assert!(e.contains("not by the standby B"), "{e}");

        let mut twice = kill_log();
        twice.push(end(6, 51_000, RowOp::Deleted));
        let e = facts(&twice, &run, None, TTL).expect_err("two ends");
        assert!(e.contains("ended 2 times"), "{e}");

        let mut foreign = kill_log();
        foreign.insert(2, row(3, 20_000, "C", "c1"));
        for (i, w) in foreign.iter_mut().enumerate() {
            w.revision = i as u64 + 1;
        }
        let e = facts(&foreign, &run, None, TTL).expect_err("a foreign write before the end");
        assert!(e.contains("not the holder's"), "{e}");

        let mut gap = kill_log();
        gap[3].revision = 5;
        gap[4].revision = 6;
        let e = facts(&gap, &run, None, TTL).expect_err("a missed revision");
        assert!(e.contains("missed writes"), "{e}");
    }

    /// The node case (no winner named) may end the row more than once: the old holder's lane
    /// re-creates its expired row, loses it again, and another host creates it; each end
    /// followed by one create whose creator alone writes until the next end, timed from the
    /// last end. A second writer between two ends still breaks the rules.
    /// Mutation seen failing: the node arm removed (the two ends refused as a broken rule).
    #[test]
    fn a_failover_may_end_the_row_twice_each_end_with_one_create() {
        let log = vec![
            row(1, 0, "A", "a1"),
            row(2, 5_000, "A", "a1"),
            end(3, 35_300, RowOp::Expired),
            row(4, 35_400, "A", "a1"),
            end(5, 65_600, RowOp::Expired),
            row(6, 65_700, "B", "b1"),
        ];
        let run = Run {
            answered: at(65_900),
            delivered: at(66_000),
            winner: None,
            ..kill_run()
        };
        let f = facts(&log, &run, None, TTL)
            .expect("clean")
            .expect("an end");
        assert_eq!(f.row_gone_ms, 55_600);
        assert_eq!(f.answer_after_gone_ms, 300);

        let mut second = log.clone();
        second.insert(4, row(5, 40_000, "C", "c1"));
        for (i, w) in second.iter_mut().enumerate() {
            w.revision = i as u64 + 1;
        }
        let e = facts(&second, &run, None, TTL).expect_err("a second writer between the ends");
        assert!(e.contains("not its creator's"), "{e}");

        let e = facts(&log, &kill_run(), None, TTL).expect_err("a named winner: one end");
        assert!(e.contains("ended 2 times"), "{e}");
    }

    /// A window with no end (a lane that rode its node's failover) has no facts; writes after
    /// `until` belong to the next case.
    #[test]
    fn no_end_in_the_window_is_no_facts() {
        let log = kill_log();
        assert!(facts(&log, &kill_run(), Some(at(30_000)), TTL)
            .expect("clean")
            .is_none());
    }
}
