//! The row log as the checker reads it: every write to the members and ACL buckets as the
//! broker stored it (the runner's row watch, `row` lines of a version-2 history), replayed per
//! key into the states the key went through, each with the broker's stamp.
//!
//! Why: the buckets keep one revision per key, so the final state cannot say what an unanswered
//! join or leave wrote once a later revision replaced it, nor when an ACL row changed. The log
//! can: a generation's join cursor is the one its first row carried, its leave cursor the last
//! one its row carried before a rejoin replaced it (the daemon's `closed_for_rejoin`), and a
//! write taken back (a refused join's row removed, the replaced row put back, a leave undone)
//! shows as a state that stood only between two stamps. A bucket whose log misses a revision
//! (the watch bound again after a broker fault while the bucket replaced a row) is not used: the
//! checker then infers from the operations, as it did, and names the revisions it lacks.

use std::collections::{BTreeMap, BTreeSet};

use cotal_delivery::wire::channel_matches;
use serde_json::Value;

use super::history::{History, Member, Ms, RowBucket, RowChange, RowWrite};
use super::snapshot::Snapshot;

/// One bucket's log: whether it can be used, and each key's writes in revision order.
pub(crate) struct BucketLog<'h> {
    /// Why it cannot be used (no last revision in the snapshot, revisions missing).
    pub missing: Option<String>,
    pub keys: BTreeMap<&'h str, Vec<&'h RowWrite>>,
}

impl<'h> BucketLog<'h> {
    pub fn build(history: &'h History, snapshot: &Snapshot, bucket: RowBucket) -> BucketLog<'h> {
        let mut keys: BTreeMap<&'h str, Vec<&'h RowWrite>> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for r in &history.rows {
            if r.write.bucket == bucket {
                seen.insert(r.write.revision);
                keys.entry(r.write.key.as_str()).or_default().push(&r.write);
            }
        }
        for writes in keys.values_mut() {
            writes.sort_by_key(|w| w.revision);
            writes.dedup_by_key(|w| w.revision);
        }
        let missing = match snapshot.row_log_end(bucket) {
            None => Some(format!(
                "the history holds no complete log of the {} bucket",
                bucket.name()
            )),
            Some(last) => {
                let gaps = gaps(&seen, last);
                (!gaps.is_empty()).then(|| {
                    format!(
                        "the {} row watch missed revision(s) {}",
                        bucket.name(),
                        describe(&gaps)
                    )
                })
            }
        };
        BucketLog { missing, keys }
    }
}

/// The revisions in `1..=last` not in `seen`, as inclusive ranges.
pub(crate) fn gaps(seen: &BTreeSet<u64>, last: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    if last == 0 {
        return out;
    }
    let mut next = 1u64;
    for &r in seen.range(1..=last) {
        if r > next {
            out.push((next, r - 1));
        }
        next = r + 1;
    }
    if next <= last {
        out.push((next, last));
    }
    out
}

fn describe(gaps: &[(u64, u64)]) -> String {
    gaps.iter()
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `<o>.<a>.<uid>` (a bucket key's member part) as a member.
pub(crate) fn member_of_key(key: &str) -> Option<Member> {
    let (principal, uid) = key.rsplit_once('.')?;
    Member::parse(&format!("{principal}#{uid}")).ok()
}

/// A member row's state, as far as intervals go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RowState {
    generation: u64,
    join: u64,
    leave: Option<u64>,
}

fn row_state(w: &RowWrite) -> Option<RowState> {
    if w.change != RowChange::Put {
        return None;
    }
    let v = w.value.as_ref()?;
    Some(RowState {
        generation: v["generation"].as_u64()?,
        join: v["joinCursor"].as_u64()?,
        leave: v["leaveCursor"].as_u64(),
    })
}

/// One generation's interval `(join, end]` as the log settles it (`end: None`: open).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settled {
    pub generation: u64,
    pub join: u64,
    pub end: Option<u64>,
    /// When the row first carried the leave cursor that ends it (the broker's stamp), if a
    /// leave ended it.
    pub left_ms: Option<Ms>,
    /// When the row first carried this generation (its join's write).
    pub joined_ms: Ms,
}

impl Settled {
    fn admits(&self, seq: u64) -> bool {
        seq > self.join && self.end.is_none_or(|e| seq <= e)
    }
}

/// A state that stood only from `from_ms` to `to_ms` (taken back): while it stood, the writer
/// or the reader may have judged by it. `admits` is what it admitted; `differs_above` the
/// sequences above which it may have judged otherwise than the settled intervals do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Passing {
    pub from_ms: Ms,
    pub to_ms: Ms,
    pub admits: Option<Settled>,
    pub differs_above: u64,
}

/// One (member, channel) key's membership as its log settles it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyMembership {
    pub settled: Vec<Settled>,
    pub passing: Vec<Passing>,
    /// Every rejoin the log shows, settled or not: the first state of a generation after
    /// another generation in the same epoch (its `joined_ms` is that state's stamp). A rejoin
    /// in an epoch later removed (the lifecycle retired) is only passing, yet its catch-up
    /// copied posts all the same (seed 7013).
    pub rejoins: Vec<Settled>,
}

/// Where a post's sequence stands for a member, by the log, for checks that ran in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoggedStanding {
    /// Inside a settled interval, and no state taken back could have judged it otherwise.
    Inside,
    /// Outside every settled interval, and no state taken back could have admitted it.
    Outside,
    /// A state taken back could have decided either way while the checks ran: surfaced or
    /// missing, both are explained.
    Either,
}

impl KeyMembership {
    /// Replays one key's writes. An epoch ends at a delete or purge (a refused first join's row
    /// removed, or a retired lifecycle's rows removed): its states stood only until then. Within
    /// an epoch a state followed later by a lower generation was taken back (a refused rejoin's
    /// replaced row put back); a leave cursor a later state of the same generation no longer
    /// carries was taken back (a refused leave).
    pub fn replay(writes: &[&RowWrite], end_ms: Ms) -> KeyMembership {
        let mut out = KeyMembership::default();
        let mut epoch: Vec<(Ms, RowState)> = Vec::new();
        for w in writes {
            match row_state(w) {
                Some(s) => epoch.push((w.stamp_ms, s)),
                None if w.change == RowChange::Put => {}
                None => {
                    out.epoch(&epoch, Some(w.stamp_ms), end_ms);
                    epoch.clear();
                }
            }
        }
        out.epoch(&epoch, None, end_ms);
        out
    }

    fn epoch(&mut self, states: &[(Ms, RowState)], removed_at: Option<Ms>, end_ms: Ms) {
        if states.is_empty() {
            return;
        }
        for pair in states.windows(2) {
            let ((_, before), (t, s)) = (&pair[0], &pair[1]);
            if s.generation > before.generation {
                self.rejoins.push(Settled {
                    generation: s.generation,
                    join: s.join,
                    end: s.leave,
                    left_ms: None,
                    joined_ms: *t,
                });
            }
        }
        let until = |i: usize| {
            states
                .get(i + 1)
                .map(|(t, _)| *t)
                .or(removed_at)
                .unwrap_or(end_ms)
        };
        // A removed epoch stood only until its removal.
        if removed_at.is_some() {
            for (i, (t, s)) in states.iter().enumerate() {
                self.passing.push(Passing {
                    from_ms: *t,
                    to_ms: until(i),
                    admits: Some(Settled {
                        generation: s.generation,
                        join: s.join,
                        end: s.leave,
                        left_ms: None,
                        joined_ms: *t,
                    }),
                    differs_above: s.join,
                });
            }
            return;
        }
        let taken_back: Vec<bool> = (0..states.len())
            .map(|i| {
                states[i + 1..]
                    .iter()
                    .any(|(_, later)| later.generation < states[i].1.generation)
            })
            .collect();
        let kept: Vec<(usize, RowState)> = states
            .iter()
            .enumerate()
            .filter(|(i, _)| !taken_back[*i])
            .map(|(i, (_, s))| (i, *s))
            .collect();
        for (i, (t, s)) in states.iter().enumerate() {
            if taken_back[i] {
                self.passing.push(Passing {
                    from_ms: *t,
                    to_ms: until(i),
                    admits: Some(Settled {
                        generation: s.generation,
                        join: s.join,
                        end: s.leave,
                        left_ms: None,
                        joined_ms: *t,
                    }),
                    differs_above: s.join,
                });
            }
        }
        let mut generations: Vec<u64> = kept.iter().map(|(_, s)| s.generation).collect();
        generations.dedup();
        for (k, g) in generations.iter().enumerate() {
            let of_g: Vec<&(usize, RowState)> =
                kept.iter().filter(|(_, s)| s.generation == *g).collect();
            let (Some(first), Some(last)) = (of_g.first(), of_g.last()) else {
                continue;
            };
            let join = first.1.join;
            let end = match generations.get(k + 1) {
                // `closed_for_rejoin`: the leave cursor, else the new join cursor, never below
                // the old join cursor.
                Some(next) => {
                    let next_join = kept
                        .iter()
                        .find(|(_, s)| s.generation == *next)
                        .map(|(_, s)| s.join)
                        .unwrap_or(join);
                    Some(last.1.leave.unwrap_or(next_join).max(join))
                }
                None => last.1.leave,
            };
            // A leave cursor carried and then no longer carried by this generation's row.
            for (pos, (i, s)) in of_g.iter().enumerate() {
                let Some(l) = s.leave else { continue };
                let dropped = of_g[pos + 1..].iter().find(|(_, x)| x.leave != Some(l));
                if let Some((j, _)) = dropped {
                    self.passing.push(Passing {
                        from_ms: states[*i].0,
                        to_ms: states[*j].0,
                        admits: Some(Settled {
                            generation: *g,
                            join,
                            end: Some(l),
                            left_ms: None,
                            joined_ms: states[*i].0,
                        }),
                        differs_above: l,
                    });
                }
            }
            // The first state of this generation carrying the leave cursor it ends with.
            let left_ms = match last.1.leave {
                Some(l) => of_g
                    .iter()
                    .rev()
                    .take_while(|(_, x)| x.leave == Some(l))
                    .last()
                    .map(|(i, _)| states[*i].0),
                None => None,
            };
            self.settled.push(Settled {
                generation: *g,
                join,
                end,
                left_ms,
                joined_ms: states[first.0].0,
            });
        }
    }

    /// For a sequence outside every settled interval: the generation whose leave cursor it is
    /// past (the latest such), and when the row first carried that cursor. A hand-off decided
    /// before that write read the row without it (the daemon's strict boundary lets such a
    /// decision finish, before the leave is answered).
    pub fn past_leave(&self, seq: u64) -> Option<(u64, Ms)> {
        if self.settled.iter().any(|s| s.admits(seq)) {
            return None;
        }
        self.settled
            .iter()
            .filter(|s| s.end.is_some_and(|e| seq > e) && seq > s.join)
            .filter_map(|s| s.left_ms.map(|t| (s.generation, t)))
            .next_back()
    }

    /// Whether a later generation whose interval admits `seq` (any, when `seq` is unknown) was
    /// first written within `[from, to]`: a rejoin that took `seq` into its interval after a
    /// hand-off under the generation it closed.
    pub fn rejoined_over(&self, seq: Option<u64>, from: Ms, to: Ms) -> bool {
        self.settled
            .iter()
            .skip(1)
            .chain(&self.rejoins)
            .any(|s| seq.is_none_or(|q| s.admits(q)) && s.joined_ms >= from && s.joined_ms <= to)
    }

    /// Where `seq` stands for checks that ran within `[from, to]` (with `skew` either side).
    pub fn standing(&self, seq: u64, from: Ms, to: Ms, skew: Ms) -> LoggedStanding {
        let meets = |p: &Passing| {
            p.from_ms <= to.saturating_add(skew) && p.to_ms.saturating_add(skew) >= from
        };
        let inside = self.settled.iter().any(|s| s.admits(seq));
        let passing = self.passing.iter().filter(|p| meets(p));
        let mut differs = false;
        for p in passing {
            let admits = p.admits.as_ref().is_some_and(|s| s.admits(seq));
            if admits != inside || seq > p.differs_above {
                differs = true;
            }
        }
        match (inside, differs) {
            (_, true) => LoggedStanding::Either,
            (true, false) => LoggedStanding::Inside,
            (false, false) => LoggedStanding::Outside,
        }
    }
}

/// A read-ACL row's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AclState {
    pub allow: Vec<String>,
    pub retired: bool,
}

impl AclState {
    pub fn covers(&self, channel: &str) -> bool {
        !self.retired && self.allow.iter().any(|p| channel_matches(p, channel))
    }
}

fn acl_state(w: &RowWrite) -> Option<AclState> {
    if w.change != RowChange::Put {
        return None;
    }
    let v: &Value = w.value.as_ref()?;
    Some(AclState {
        allow: v["allowSubscribe"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        retired: v["retired"].as_bool() == Some(true) || v.get("retiredAt").is_some(),
    })
}

/// One lifecycle's ACL row over the run: each state with the revision and stamp it came with
/// (`None`: no row, which covers nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyAcl {
    pub states: Vec<(u64, Ms, Option<AclState>)>,
}

/// How the ACL row judged a check that ran in a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AclJudged {
    /// Every state in force in the window covered the channel.
    Covered,
    /// Every state in force in the window excluded it: the first of them, by revision and stamp
    /// (0, 0: no row yet), and whether it was the tombstone.
    Excluded {
        revision: u64,
        stamp_ms: Ms,
        retired: bool,
    },
    /// The window met both: the check may have read either.
    Either { revision: u64, stamp_ms: Ms },
}

impl KeyAcl {
    pub fn replay(writes: &[&RowWrite]) -> KeyAcl {
        KeyAcl {
            states: writes
                .iter()
                .map(|w| (w.revision, w.stamp_ms, acl_state(w)))
                .collect(),
        }
    }

    /// Whether the row was ever the tombstone.
    pub fn ever_retired(&self) -> bool {
        self.states
            .iter()
            .any(|(_, _, s)| s.as_ref().is_some_and(|s| s.retired))
    }

    /// How the states in force over `[from - skew, to + skew]` judge `channel`: the state in
    /// force at the window's start and every one written in it.
    pub fn judge(&self, channel: &str, from: Ms, to: Ms, skew: Ms) -> AclJudged {
        let (from, to) = (from.saturating_sub(skew), to.saturating_add(skew));
        let start = self.states.iter().rposition(|(_, t, _)| *t <= from);
        let first = start.unwrap_or(0);
        let mut within: Vec<(u64, Ms, Option<&AclState>)> = Vec::new();
        if start.is_none() {
            within.push((0, 0, None));
        }
        for (r, t, s) in &self.states[first..] {
            if *t > to && !within.is_empty() {
                break;
            }
            within.push((*r, *t, s.as_ref()));
        }
        let covered = |s: &Option<&AclState>| s.is_some_and(|s| s.covers(channel));
        match (
            within.iter().all(|(_, _, s)| covered(s)),
            within.iter().find(|(_, _, s)| !covered(s)),
        ) {
            (true, _) | (_, None) => AclJudged::Covered,
            (false, Some(&(revision, stamp_ms, s))) => {
                if within.iter().any(|(_, _, s)| covered(s)) {
                    AclJudged::Either { revision, stamp_ms }
                } else {
                    AclJudged::Excluded {
                        revision,
                        stamp_ms,
                        retired: s.is_some_and(|s| s.retired),
                    }
                }
            }
        }
    }
}

/// The log of both buckets, replayed per key; `None` for a bucket that cannot be used.
pub(crate) struct RowModel {
    pub members: Option<BTreeMap<(Member, String), KeyMembership>>,
    pub acl: Option<BTreeMap<Member, KeyAcl>>,
    /// Why a bucket's log is not used (each fact the history lacks), for the findings.
    pub missing: Vec<String>,
}

impl RowModel {
    pub fn build(history: &History, snapshot: &Snapshot) -> RowModel {
        let members = BucketLog::build(history, snapshot, RowBucket::Members);
        let acl = BucketLog::build(history, snapshot, RowBucket::Acl);
        let mut missing = Vec::new();
        let members = match members.missing {
            Some(why) => {
                missing.push(why);
                None
            }
            None => Some(
                members
                    .keys
                    .iter()
                    .filter_map(|(key, writes)| {
                        let (channel, who) = key.rsplit_once('/')?;
                        let member = member_of_key(who)?;
                        Some((
                            (member, channel.to_string()),
                            KeyMembership::replay(writes, history.end_ms),
                        ))
                    })
                    .collect(),
            ),
        };
        let acl = match acl.missing {
            Some(why) => {
                missing.push(why);
                None
            }
            None => Some(
                acl.keys
                    .iter()
                    .filter_map(|(key, writes)| Some((member_of_key(key)?, KeyAcl::replay(writes))))
                    .collect(),
            ),
        };
        RowModel {
            members,
            acl,
            missing,
        }
    }
}
