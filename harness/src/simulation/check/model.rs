//! The run as the checker reasons about it, built once from the history and the snapshot:
//! posts with their CHAT sequences, each member's membership intervals per channel, its ACL
//! writes, its online spans, the faults and each daemon's serving spans.
//!
//! Why bounds everywhere: the join and leave replies carry no cursor, and an operation whose
//! answer never came may or may not have landed. A cursor the runner did not read is bounded by
//! the posts around it (the CHAT last sequence at some moment between the invoke and the ok is
//! at least every post acknowledged before the invoke, and below every post invoked after the
//! ok), and a post between the bounds is *uncertain*, never lost and never leaked.

use std::collections::BTreeMap;

use cotal_delivery::wire::channel_matches;

use super::bounds::CheckConfig;
use super::history::{
    Call, Class, Completion, Done, FaultKind, History, Member, Ms, Observation, Op,
};
use super::rows::{LoggedStanding, RowModel};
use super::snapshot::Snapshot;

/// A cursor known to lie in `[lo, hi]` (`lo == hi`: known exactly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bound {
    pub lo: u64,
    pub hi: u64,
}

impl Bound {
    pub fn exact(v: u64) -> Bound {
        Bound { lo: v, hi: v }
    }
}

/// How a membership interval ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Open,
    /// Closed at a cursor within `at`; `certain: false` when the close itself may not have
    /// happened (a leave or a rejoin whose answer never came).
    Closed {
        at: Bound,
        certain: bool,
    },
}

/// One generation of a member on a channel: `(join cursor, leave cursor]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interval {
    /// `None` for a join whose answer never came.
    pub generation: Option<u64>,
    /// Whether the join certainly happened.
    pub certain: bool,
    pub start: Bound,
    pub end: End,
}

/// Where a member stands at a post's CHAT sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    Inside,
    /// Inside an interval that certainly stands, within a gap a failed or undecided leave left
    /// (its write may have landed and been taken back, and the reader may have dropped entries
    /// meanwhile): owed is undecided, but a frame is no leak, since the member was in before
    /// and after and the final row shows the leave never stood.
    InGap,
    Outside,
    Uncertain,
    /// Decided by the row log: a membership state that stood only for a while (a write taken
    /// back) may have judged it either way while its checks ran, so it surfacing and it missing
    /// are both explained.
    Either,
}

/// A post, as posted.
#[derive(Debug, Clone)]
pub(crate) struct Posted<'h> {
    pub op: &'h Op,
    pub sender: &'h Member,
    pub channel: &'h str,
    pub class: Class,
    pub id: Option<&'h str>,
    pub tag: &'h str,
    pub mentions: &'h [String],
    /// The CHAT sequence, for a post acknowledged ok.
    pub seq: Option<u64>,
}

/// A write to a member's ACL row (provisioning, narrowing, widening, retirement).
#[derive(Debug, Clone)]
pub(crate) struct AclWrite<'h> {
    pub op: &'h Op,
    /// `None` for a retirement: it covers nothing, for good.
    pub allow: Option<&'h [String]>,
    /// When the broker's acknowledgement was seen; `None`: it may have landed any time after
    /// its invoke (unknown or pending), or is known only from the snapshot.
    pub acked_ms: Option<Ms>,
}

impl AclWrite<'_> {
    pub fn covers(&self, channel: &str) -> bool {
        self.allow
            .is_some_and(|allow| allow.iter().any(|p| channel_matches(p, channel)))
    }
    pub fn is_retire(&self) -> bool {
        self.allow.is_none()
    }
}

/// A fault as it really ran: from its start's invoke to its end's completion (or the end of
/// the history, when it never ended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FaultSpan {
    pub id: u64,
    pub kind: FaultKind,
    pub target: String,
    pub from_ms: Ms,
    pub to_ms: Ms,
}

/// A lifecycle's membership of one channel: its intervals, and the CHAT sequence ranges
/// `(lo, hi]` a failed or undecided leave leaves uncertain.
#[derive(Debug, Clone, Default)]
pub(crate) struct Membership {
    pub intervals: Vec<Interval>,
    pub gaps: Vec<(u64, u64)>,
}

/// What the checker knows of one lifecycle.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lifecycle<'h> {
    /// The card name mentions resolve, lowercased; `None` until provisioned ok.
    pub name: Option<String>,
    pub acl: Vec<AclWrite<'h>>,
    /// Retired for certain (acknowledged, or the snapshot's tombstone).
    pub retired: bool,
    /// When the retirement was acknowledged (what leaks are judged from).
    pub retired_ms: Option<Ms>,
    /// A retirement that may have landed and the snapshot cannot settle.
    pub maybe_retired: bool,
    /// Spans `[from, to)` in which the agent was certainly online.
    pub online: Vec<(Ms, Ms)>,
    /// Per channel: its membership.
    pub channels: BTreeMap<String, Membership>,
}

/// A join answered `durable:false`: its activation catch-up failed and its row stands
/// (docs/data-path.md, "Activation catch-up"). It promises nothing for its catch-up window
/// `(join_cursor, frontier]`: the posts there the fan-out writer routed before the row was
/// written reach the member only through the catch-up that failed. The frontier is the CHAT
/// last sequence the daemon read after the row write, before the answer; the history bounds it
/// from above by `frontier_max` (below every post invoked after the answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailedCatchUp<'h> {
    pub member: &'h Member,
    pub channel: &'h str,
    /// The join's op.
    pub op: u64,
    pub generation: u64,
    pub join_cursor: u64,
    pub frontier_max: u64,
}

impl FailedCatchUp<'_> {
    /// Whether the post at `seq` on `channel` to `member` sits in this join's window.
    pub fn excuses(&self, member: &Member, channel: &str, seq: u64) -> bool {
        self.member == member
            && self.channel == channel
            && seq > self.join_cursor
            && seq <= self.frontier_max
    }
}

/// The generation a `durable:false` answer carried, from the runner's record of it
/// (`durable:false: <the answer's JSON>`).
pub(crate) fn durable_false_generation(error: &str) -> Option<u64> {
    let answer = error.strip_prefix("durable:false: ")?;
    let v: serde_json::Value = serde_json::from_str(answer).ok()?;
    (v["durable"].as_bool() == Some(false))
        .then(|| v["generation"].as_u64())
        .flatten()
}

/// The run, as the rules read it.
pub(crate) struct Model<'h> {
    pub history: &'h History,
    pub snapshot: &'h Snapshot,
    pub cfg: &'h CheckConfig,
    pub posts: Vec<Posted<'h>>,
    pub lifecycles: BTreeMap<&'h Member, Lifecycle<'h>>,
    pub faults: Vec<FaultSpan>,
    /// Per daemon: spans `[from, to)` it said it served.
    pub serving: BTreeMap<String, Vec<(Ms, Ms)>>,
    /// The members and ACL buckets' writes as the broker stored them, where complete.
    pub rows: RowModel,
    /// Joins answered `durable:false` whose join cursor is known: their windows are excused.
    pub failed_catch_ups: Vec<FailedCatchUp<'h>>,
    /// `(ok ms, seq)` of every post acknowledged, by ok time, with the running max of seq.
    acked: Vec<(Ms, u64)>,
    /// `(invoke ms, seq)` of every post acknowledged, by invoke time, with the min of seq from
    /// each on.
    invoked: Vec<(Ms, u64)>,
}

impl<'h> Model<'h> {
    pub fn build(history: &'h History, snapshot: &'h Snapshot, cfg: &'h CheckConfig) -> Model<'h> {
        let mut model = Model {
            history,
            snapshot,
            cfg,
            posts: Vec::new(),
            lifecycles: BTreeMap::new(),
            faults: Vec::new(),
            serving: BTreeMap::new(),
            rows: RowModel::build(history, snapshot),
            acked: Vec::new(),
            invoked: Vec::new(),
            failed_catch_ups: Vec::new(),
        };
        model.collect_posts();
        model.collect_failed_catch_ups();
        model.collect_lifecycles();
        model.collect_faults();
        model.collect_serving();
        model
    }

    fn collect_posts(&mut self) {
        for op in &self.history.ops {
            let Call::Post {
                channel,
                class,
                id,
                tag,
                mentions,
            } = &op.call
            else {
                continue;
            };
            let Some(sender) = op.process.member() else {
                continue;
            };
            let seq = match &op.outcome {
                Completion::Ok {
                    done: Done::Post { seq },
                    ..
                } => Some(*seq),
                _ => None,
            };
            if let (Some(seq), Some(ok)) = (seq, op.outcome.ok_ms()) {
                self.acked.push((ok, seq));
                self.invoked.push((op.invoke_ms, seq));
            }
            self.posts.push(Posted {
                op,
                sender,
                channel,
                class: *class,
                id: id.as_deref().filter(|i| !i.is_empty()),
                tag,
                mentions,
                seq,
            });
        }
        self.acked.sort_unstable();
        let mut max = 0;
        for e in &mut self.acked {
            max = max.max(e.1);
            e.1 = max;
        }
        self.invoked.sort_unstable();
        let mut min = u64::MAX;
        for e in self.invoked.iter_mut().rev() {
            min = min.min(e.1);
            e.1 = min;
        }
    }

    /// Every join answered `durable:false` whose generation's join cursor the row log (else the
    /// final row, current or kept closed interval) holds.
    fn collect_failed_catch_ups(&mut self) {
        let history = self.history;
        for op in &history.ops {
            let (Call::Join { channel }, Completion::Unknown { ms, error }) =
                (&op.call, &op.outcome)
            else {
                continue;
            };
            let (Some(member), Some(generation)) =
                (op.process.member(), durable_false_generation(error))
            else {
                continue;
            };
            let Some(join_cursor) = self.join_cursor_of(member, channel, generation) else {
                continue;
            };
            let frontier_max = self.cursor_between(op.invoke_ms, *ms).hi;
            self.failed_catch_ups.push(FailedCatchUp {
                member,
                channel,
                op: op.id,
                generation,
                join_cursor,
                frontier_max,
            });
        }
    }

    /// The join cursor generation `generation` of `member` on `channel` carried: from the row
    /// log when complete, else from the final row (current or a kept closed interval).
    fn join_cursor_of(&self, member: &Member, channel: &str, generation: u64) -> Option<u64> {
        if let Some(members) = &self.rows.members {
            let key = members.get(&(member.clone(), channel.to_string()))?;
            return key
                .settled
                .iter()
                .find(|s| s.generation == generation)
                .or_else(|| {
                    key.passing
                        .iter()
                        .filter_map(|p| p.admits.as_ref())
                        .find(|s| s.generation == generation)
                })
                .map(|s| s.join);
        }
        let row = self
            .snapshot
            .member_rows
            .iter()
            .find(|r| &r.member == member && r.channel == channel)?;
        if row.generation == generation {
            return Some(row.join_cursor);
        }
        row.prior
            .iter()
            .find(|p| p.generation == generation)
            .map(|p| p.join_cursor)
    }

    /// The join answered `durable:false` whose catch-up window holds the post at `seq`.
    pub fn failed_catch_up(
        &self,
        member: &Member,
        channel: &str,
        seq: u64,
    ) -> Option<&FailedCatchUp<'h>> {
        self.failed_catch_ups
            .iter()
            .find(|f| f.excuses(member, channel, seq))
    }

    /// The CHAT last sequence read at some moment in `[from, to]`: at least every post
    /// acknowledged before `from`, below every post invoked after `to`.
    pub fn cursor_between(&self, from: Ms, to: Ms) -> Bound {
        let below = self.acked.partition_point(|(ok, _)| *ok < from);
        let lo = if below == 0 {
            0
        } else {
            self.acked[below - 1].1
        };
        let after = self.invoked.partition_point(|(inv, _)| *inv <= to);
        let hi = self
            .invoked
            .get(after)
            .map(|(_, min)| min.saturating_sub(1))
            .unwrap_or(u64::MAX);
        Bound { lo, hi: hi.max(lo) }
    }

    fn lifecycle(&mut self, member: &'h Member) -> &mut Lifecycle<'h> {
        self.lifecycles.entry(member).or_default()
    }

    fn collect_lifecycles(&mut self) {
        let history = self.history;
        for op in &history.ops {
            match &op.call {
                Call::Provision {
                    member,
                    name,
                    allow,
                } => {
                    if let Some(ok) = op.outcome.ok_ms() {
                        let lc = self.lifecycle(member);
                        lc.name = Some(name.trim().to_lowercase());
                        lc.acl.push(AclWrite {
                            op,
                            allow: Some(allow),
                            acked_ms: Some(ok),
                        });
                    }
                }
                // A write the broker refused changed nothing.
                Call::AclNarrow { member, allow } | Call::AclWiden { member, allow }
                    if !matches!(op.outcome, Completion::Fail { .. }) =>
                {
                    let acked_ms = op.outcome.ok_ms();
                    self.lifecycle(member).acl.push(AclWrite {
                        op,
                        allow: Some(allow),
                        acked_ms,
                    });
                }
                Call::Retire { member } if !matches!(op.outcome, Completion::Fail { .. }) => {
                    let acked_ms = op.outcome.ok_ms();
                    self.lifecycle(member).acl.push(AclWrite {
                        op,
                        allow: None,
                        acked_ms,
                    });
                }
                _ => {}
            }
        }
        let members: Vec<&'h Member> = self.lifecycles.keys().copied().collect();
        for member in members {
            self.settle_acl(member);
            self.collect_online(member);
            self.collect_membership(member);
        }
    }

    /// Settles what the snapshot can of the member's undecided ACL writes: a tombstone is for
    /// good (a retirement that may have landed did, if the row carries one, and did not if
    /// not), and a row still at the revision of a write acknowledged before an undecided one
    /// began shows the undecided one never landed.
    fn settle_acl(&mut self, member: &'h Member) {
        let row = self.snapshot.acl_row(member);
        let Some(lc) = self.lifecycles.get_mut(member) else {
            return;
        };
        let revision_of = |w: &AclWrite<'_>| match &w.op.outcome {
            Completion::Ok {
                done:
                    Done::Provision { revision }
                    | Done::AclNarrow { revision }
                    | Done::AclWiden { revision }
                    | Done::Retire { revision },
                ..
            } => Some(*revision),
            _ => None,
        };
        let settled_before: Vec<Ms> = match row {
            Some(row) => lc
                .acl
                .iter()
                .filter(|w| revision_of(w) == Some(row.revision))
                .filter_map(|w| w.acked_ms)
                .collect(),
            None => Vec::new(),
        };
        lc.acl.retain(|w| {
            w.acked_ms.is_some()
                || w.is_retire()
                || !settled_before.iter().any(|acked| *acked < w.op.invoke_ms)
        });
        for w in &lc.acl {
            if !w.is_retire() {
                continue;
            }
            match (w.acked_ms, row) {
                (Some(ms), _) => {
                    lc.retired = true;
                    lc.retired_ms = Some(lc.retired_ms.map_or(ms, |t| t.min(ms)));
                }
                (None, Some(row)) if row.retired => lc.retired = true,
                (None, Some(_)) => {}
                (None, None) => lc.maybe_retired = true,
            }
        }
        if row.is_some_and(|r| r.retired) {
            lc.retired = true;
        }
        if lc.retired {
            lc.maybe_retired = false;
        }
        // A retirement the tombstone disproves is not a write at all.
        lc.acl.retain(|w| {
            !(w.is_retire() && w.acked_ms.is_none() && row.is_some_and(|r| !r.retired))
        });
    }

    fn collect_online(&mut self, member: &'h Member) {
        let end = self.history.end_ms;
        let mut spans = Vec::new();
        let mut since: Option<Ms> = None;
        for op in self.ops_of(member) {
            match (&op.call, &op.outcome) {
                (Call::Online, Completion::Ok { ms, .. }) => {
                    since.get_or_insert(*ms);
                }
                // Offline from its invoke, whatever the answer: presence may lapse then.
                (Call::Offline, outcome) if !matches!(outcome, Completion::Fail { .. }) => {
                    if let Some(from) = since.take() {
                        spans.push((from, op.invoke_ms));
                    }
                }
                _ => {}
            }
        }
        if let Some(from) = since {
            spans.push((from, end.saturating_add(1)));
        }
        self.lifecycle(member).online = spans;
    }

    fn ops_of(&self, member: &Member) -> Vec<&'h Op> {
        let history: &'h History = self.history;
        history
            .ops
            .iter()
            .filter(|op| op.process.member() == Some(member))
            .collect()
    }

    fn collect_membership(&mut self, member: &'h Member) {
        let mut channels: BTreeMap<String, Membership> = BTreeMap::new();
        let ops: Vec<&'h Op> = self.ops_of(member);
        let mut never_stood = joins_that_never_stood(&ops);
        // A join that ran after a later one was answered (held by a daemon that then served it)
        // would show in the final row as a generation past every one the history knows: then
        // nothing is inferred for that channel.
        never_stood.retain(|id| {
            let Some(Call::Join { channel }) = ops.iter().find(|o| o.id == *id).map(|o| &o.call)
            else {
                return false;
            };
            let known = ops
                .iter()
                .filter_map(|o| match (&o.call, &o.outcome) {
                    (
                        Call::Join { channel: c },
                        Completion::Ok {
                            done: Done::Join { generation, .. },
                            ..
                        },
                    ) if c == channel => Some(*generation),
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            self.snapshot
                .member_row(member, channel)
                .is_none_or(|row| row.generation <= known)
        });
        never_stood.extend(self.trailing_joins_the_row_disproves(member, &ops));
        for (i, op) in ops.iter().enumerate() {
            match &op.call {
                Call::Join { .. } if never_stood.contains(&op.id) => {}
                Call::Join { channel } => {
                    let entry = channels.entry(channel.clone()).or_default();
                    self.apply_join(member, channel, op, &mut entry.intervals);
                }
                Call::Leave {
                    channel,
                    generation,
                } => {
                    // The next certain membership operation on the channel bounds how long an
                    // undecided leave can have stood before it was taken back.
                    let next_ok = ops[i + 1..]
                        .iter()
                        .find(|o| {
                            o.outcome.is_ok()
                                && matches!(&o.call, Call::Join { channel: c } | Call::Leave { channel: c, .. } if c == channel)
                        })
                        .map(|o| o.invoke_ms);
                    let entry = channels.entry(channel.clone()).or_default();
                    self.apply_leave(member, channel, *generation, op, next_ok, entry);
                }
                _ => {}
            }
        }
        self.lifecycle(member).channels = channels;
    }

    /// The joins whose answer never came, after the member's last certain join or leave on
    /// their channel, that the final row shows never stood: the row is absent, or at no
    /// generation past the last one answered ("generation = previous + 1": a join that stood
    /// would have left it at the next one, open; a leave sets a cursor and lowers no
    /// generation). Not when something else may have removed a row the join wrote: a
    /// retirement (the lifecycle retired or maybe retired), or a refused join after the last
    /// certain operation (a refusal may write the row and remove it; one no daemon received
    /// wrote nothing). A join the daemon refused although no answer came
    /// (the ACL no longer allowing the channel) "writes nothing, or removes the row it just
    /// wrote": no interval, as for a refused join (`apply_join`).
    fn trailing_joins_the_row_disproves(
        &self,
        member: &Member,
        ops: &[&'h Op],
    ) -> std::collections::BTreeSet<u64> {
        let mut out = std::collections::BTreeSet::new();
        let Some(lc) = self.lifecycles.get(member) else {
            return out;
        };
        if lc.retired || lc.maybe_retired {
            return out;
        }
        let mut tails: BTreeMap<&str, (u64, Vec<&Op>, bool)> = BTreeMap::new();
        for op in ops {
            let (channel, certain_generation) = match (&op.call, &op.outcome) {
                (
                    Call::Join { channel },
                    Completion::Ok {
                        done: Done::Join { generation, .. },
                        ..
                    },
                ) => (channel, Some(*generation)),
                (
                    Call::Leave {
                        channel,
                        generation,
                    },
                    Completion::Ok { .. },
                ) => (channel, Some(*generation)),
                (Call::Join { channel } | Call::Leave { channel, .. }, _) => (channel, None),
                _ => continue,
            };
            let tail = tails.entry(channel.as_str()).or_default();
            match certain_generation {
                Some(g) => *tail = (tail.0.max(g), Vec::new(), false),
                None => match (&op.call, &op.outcome) {
                    // It wrote nothing, or put back what it replaced (`leaves_the_count`).
                    (Call::Join { .. }, Completion::Fail { error, .. })
                        if leaves_the_count(error) => {}
                    (Call::Join { .. }, Completion::Unknown { .. } | Completion::Pending) => {
                        tail.1.push(op)
                    }
                    // A refusal may have written the row and removed it: nothing is inferred.
                    (Call::Join { .. }, _) => tail.2 = true,
                    // A leave not answered ok sets a leave cursor at most: it lowers no
                    // generation, and removes no row.
                    _ => {}
                },
            }
        }
        for (channel, (known, undecided, void)) in tails {
            if undecided.is_empty() {
                continue;
            }
            let row_disproves = self
                .snapshot
                .member_row(member, channel)
                .is_none_or(|row| row.generation <= known);
            if !void && row_disproves {
                out.extend(undecided.iter().map(|o| o.id));
            }
        }
        out
    }

    fn apply_join(&self, member: &Member, channel: &str, op: &Op, intervals: &mut Vec<Interval>) {
        let (start, generation, certain) = match &op.outcome {
            Completion::Fail { .. } => return,
            Completion::Ok {
                ms,
                done:
                    Done::Join {
                        generation,
                        join_cursor,
                    },
            } => {
                let known = join_cursor.or_else(|| {
                    self.snapshot
                        .member_row(member, channel)
                        .and_then(|r| r.cursors_of(*generation))
                        .map(|(join, _)| join)
                });
                let start = known
                    .map(Bound::exact)
                    .unwrap_or_else(|| self.cursor_between(op.invoke_ms, *ms));
                (start, Some(*generation), true)
            }
            _ => (
                self.cursor_between(op.invoke_ms, self.history.end_ms),
                None,
                false,
            ),
        };
        // A rejoin closes an open interval at the new join cursor.
        if let Some(last) = intervals.last_mut() {
            if last.end == End::Open {
                last.end = End::Closed { at: start, certain };
            }
        }
        intervals.push(Interval {
            generation,
            certain,
            start,
            end: End::Open,
        });
    }

    fn apply_leave(
        &self,
        member: &Member,
        channel: &str,
        generation: u64,
        op: &Op,
        next_ok: Option<Ms>,
        Membership { intervals, gaps }: &mut Membership,
    ) {
        let row = self.snapshot.member_row(member, channel);
        let from_row = row
            .and_then(|r| r.cursors_of(generation))
            .and_then(|(_, leave)| leave);
        let target = intervals
            .iter()
            .rposition(|i| i.generation == Some(generation))
            .or_else(|| intervals.iter().rposition(|i| i.generation.is_none()));
        match &op.outcome {
            Completion::Ok {
                ms,
                done:
                    Done::Leave {
                        leave_cursor,
                        already_left,
                    },
            } => {
                let Some(t) = target else { return };
                let interval = &mut intervals[t];
                // A leave of this generation answered proves the join that made it.
                interval.generation = Some(generation);
                interval.certain = true;
                let at = match (leave_cursor.or(from_row), &interval.end, already_left) {
                    (Some(exact), _, _) => Bound::exact(exact),
                    // Already left: an earlier undecided close did land.
                    (None, End::Closed { at, .. }, true) => *at,
                    _ => self.cursor_between(op.invoke_ms, *ms),
                };
                interval.end = End::Closed { at, certain: true };
            }
            Completion::Fail { ms, .. } => {
                // A leave refused after its write takes the row back: between the two, the
                // reader may have dropped entries past the temporary cursor.
                let b = self.cursor_between(op.invoke_ms, *ms);
                gaps.push((b.lo, b.hi));
            }
            Completion::Unknown { .. } | Completion::Pending => {
                let lo = self.cursor_between(op.invoke_ms, op.invoke_ms).lo;
                let Some(t) = target else { return };
                let interval = &mut intervals[t];
                match (from_row, row.and_then(|r| r.cursors_of(generation))) {
                    (Some(exact), _) => {
                        interval.end = End::Closed {
                            at: Bound::exact(exact),
                            certain: true,
                        }
                    }
                    // The row stands open at this generation: the leave never landed or was
                    // taken back; posts while it may have stood are uncertain.
                    (None, Some(_)) => {
                        let hi = next_ok.map_or(u64::MAX, |t| self.cursor_between(t, t).hi);
                        gaps.push((lo, hi));
                    }
                    (None, None) => {
                        if interval.end == End::Open {
                            interval.end = End::Closed {
                                at: Bound { lo, hi: u64::MAX },
                                certain: false,
                            };
                        }
                    }
                }
            }
            Completion::Ok { .. } => {}
        }
    }

    fn collect_faults(&mut self) {
        let end = self.history.end_ms;
        let mut ends: BTreeMap<u64, &Op> = BTreeMap::new();
        for op in &self.history.ops {
            if let Call::FaultEnd { fault } = &op.call {
                ends.insert(*fault, op);
            }
        }
        for op in &self.history.ops {
            let Call::FaultStart {
                fault,
                kind,
                target,
                ..
            } = &op.call
            else {
                continue;
            };
            // A refused start did nothing, except a partition's: its route proxies were cut
            // before the node was found still listing routes, and healed only at the refusal,
            // so the cluster was cut (a node losing quorum) from the invoke to the refusal.
            // Found by seed 4302 on a new host: both partitions refused after 5 s, node 1's
            // stream and consumer groups without quorum meanwhile.
            let refused = match &op.outcome {
                Completion::Fail { ms, .. } if *kind == FaultKind::Partition => Some(*ms),
                Completion::Fail { .. } => continue,
                _ => None,
            };
            let to_ms = match (refused, ends.get(fault).map(|o| &o.outcome)) {
                (Some(ms), _) => ms,
                (None, Some(Completion::Ok { ms, .. })) => *ms,
                _ => end,
            };
            self.faults.push(FaultSpan {
                id: *fault,
                kind: *kind,
                target: target.clone(),
                from_ms: op.invoke_ms,
                to_ms,
            });
        }
    }

    fn collect_serving(&mut self) {
        let end = self.history.end_ms.saturating_add(1);
        let mut open: BTreeMap<String, Ms> = BTreeMap::new();
        for o in &self.history.observed {
            match &o.what {
                Observation::DaemonServing { daemon, .. } => {
                    open.entry(daemon.clone()).or_insert(o.ms);
                }
                Observation::DaemonQuiesced { daemon }
                | Observation::DaemonExited { daemon, .. } => {
                    if let Some(from) = open.remove(daemon) {
                        self.serving
                            .entry(daemon.clone())
                            .or_default()
                            .push((from, o.ms));
                    }
                }
            }
        }
        for (daemon, from) in open {
            self.serving.entry(daemon).or_default().push((from, end));
        }
    }

    /// Where `member` stands on `channel` at CHAT sequence `seq`.
    pub fn standing(&self, member: &Member, channel: &str, seq: u64) -> Standing {
        let Some(Membership { intervals, gaps }) = self
            .lifecycles
            .get(member)
            .and_then(|lc| lc.channels.get(channel))
        else {
            return Standing::Outside;
        };
        let in_gap = gaps.iter().any(|(lo, hi)| seq > *lo && seq <= *hi);
        let surely_in = intervals.iter().any(|i| {
            i.certain
                && seq > i.start.hi
                && match i.end {
                    End::Open => true,
                    End::Closed { at, .. } => seq <= at.lo,
                }
        });
        let maybe_in = intervals.iter().any(|i| {
            seq > i.start.lo
                && match i.end {
                    End::Open => true,
                    End::Closed { at, certain } => seq <= at.hi || !certain,
                }
        });
        if surely_in && !in_gap {
            Standing::Inside
        } else if surely_in {
            Standing::InGap
        } else if !maybe_in && !in_gap {
            Standing::Outside
        } else {
            Standing::Uncertain
        }
    }

    /// Where `member` stands on `channel` at `seq` for checks that ran within `[from, to]`: by
    /// the row log when the members bucket's is complete (decided, every cursor exact), else
    /// by the operations ([`Model::standing`]).
    pub fn standing_within(
        &self,
        member: &Member,
        channel: &str,
        seq: u64,
        from: Ms,
        to: Ms,
    ) -> Standing {
        let Some(log) = &self.rows.members else {
            return self.standing(member, channel, seq);
        };
        match log.get(&(member.clone(), channel.to_string())) {
            None => Standing::Outside,
            Some(k) => match k.standing(seq, from, to, self.cfg.stamp_skew_ms) {
                LoggedStanding::Inside => Standing::Inside,
                LoggedStanding::Outside => Standing::Outside,
                LoggedStanding::Either => Standing::Either,
            },
        }
    }

    /// By the row log: whether a frame of `seq`, past the leave cursor of `member`'s generation
    /// on `channel`, may have been handed off by a decision taken before the leave was written
    /// (the daemon's strict boundary: "reader decisions taken before the write … finish before
    /// the answer"). Its post was invoked before the row carried the cursor, and its hand-off
    /// was stamped no later than the leave's answer (when the leave was answered). `None` when
    /// the sequence is past no leave the log knows.
    pub fn handed_off_before_leave(
        &self,
        member: &Member,
        channel: &str,
        seq: u64,
        invoked: Ms,
        stamped: Ms,
    ) -> Option<bool> {
        let log = self.rows.members.as_ref()?;
        let (generation, left_ms) = log
            .get(&(member.clone(), channel.to_string()))?
            .past_leave(seq)?;
        let skew = self.cfg.stamp_skew_ms;
        if invoked > left_ms.saturating_add(skew) {
            return Some(false);
        }
        let answered = self
            .ops_of(member)
            .iter()
            .filter(|o| {
                matches!(&o.call, Call::Leave { channel: c, generation: g } if c == channel && *g == generation)
            })
            .filter_map(|o| o.outcome.ok_ms())
            .filter(|ok| *ok + skew >= left_ms)
            .min();
        Some(answered.is_none_or(|a| stamped <= a.saturating_add(skew)))
    }

    /// By the row log: whether `member` rejoined `channel` between `first` (the post's invoke)
    /// and the second hand-off of `seq`, stamped at `again`, its new generation admitting `seq`. A post whose publish
    /// went unanswered has no known sequence (`None`): as for any unanswered operation, some
    /// sequence explains it, and the second hand-off, made under the new generation, is itself
    /// the reader's word that its interval admitted the post, so any rejoin written between
    /// the two hand-offs explains them.
    pub fn rejoined_between(
        &self,
        member: &Member,
        channel: &str,
        seq: Option<u64>,
        first: Ms,
        again: Ms,
    ) -> bool {
        let skew = self.cfg.stamp_skew_ms;
        self.rows
            .members
            .as_ref()
            .and_then(|log| log.get(&(member.clone(), channel.to_string())))
            .is_some_and(|k| {
                k.rejoined_over(seq, first.saturating_sub(skew), again.saturating_add(skew))
            })
    }

    /// Whether `member` ever had a row on `channel` (by the log) or asked to join it.
    pub fn knows_channel(&self, member: &Member, channel: &str) -> bool {
        match &self.rows.members {
            Some(log) => log.contains_key(&(member.clone(), channel.to_string())),
            None => self
                .lifecycles
                .get(member)
                .is_some_and(|lc| lc.channels.contains_key(channel)),
        }
    }

    /// Whether the agent was certainly online over all of `[from, to]`.
    pub fn online_throughout(&self, member: &Member, from: Ms, to: Ms) -> bool {
        self.lifecycles
            .get(member)
            .is_some_and(|lc| lc.online.iter().any(|(a, b)| *a <= from && to < *b))
    }

    /// Whether some daemon said it served over all of `[from, to]` (spans joined end to end).
    pub fn served_throughout(&self, from: Ms, to: Ms) -> bool {
        if to < from {
            return false;
        }
        let mut spans: Vec<(Ms, Ms)> = self.serving.values().flatten().copied().collect();
        spans.sort_unstable();
        let mut reached = from;
        for (a, b) in spans {
            if a <= reached && b > reached {
                reached = b;
            }
            if reached > to {
                return true;
            }
        }
        false
    }

    /// The faults whose span meets `[from, to]`.
    pub fn faults_within(&self, from: Ms, to: Ms) -> Vec<&FaultSpan> {
        self.faults
            .iter()
            .filter(|f| f.from_ms <= to && f.to_ms >= from)
            .collect()
    }

    /// The daemon a process names, for a `daemon:<name>` fault target.
    pub fn daemon_of_target(target: &str) -> Option<&str> {
        target.strip_prefix("daemon:")
    }

    /// The lifecycles whose card name is `name` (lowercased, trimmed), by principal.
    pub fn named(&self, name: &str) -> Vec<&'h Member> {
        let name = name.trim().to_lowercase();
        self.lifecycles
            .iter()
            .filter(|(_, lc)| lc.name.as_deref() == Some(name.as_str()))
            .map(|(m, _)| *m)
            .collect()
    }
}

/// Whether a join refused with `error` left the member row's generation where it was: no
/// daemon received it (no responders), no serving daemon admitted it (it wrote nothing), or its
/// daemon stopped serving while it ran (`durable_join` puts back the row it replaced, or
/// removes the one it created, by compare-and-set; one it could not take back would leave the
/// row a generation further, which the arguments over generations see).
fn leaves_the_count(error: &str) -> bool {
    error.contains(cotal_delivery::agent::NO_DAEMON_SERVING)
        || error.contains(cotal_delivery::plane::NOT_SERVING)
        || error.contains(cotal_delivery::plane::STOPPED_SERVING)
}

/// The joins of unknown outcome that certainly left no membership: "generation = previous + 1
/// (a rejoin takes a new cursor and generation)" (docs/data-path.md), so when the next join
/// answered on the channel carries the generation right after the last one known before
/// them, none of them stood (or each was taken back). A join refused in between voids the
/// argument (one refused after its write removes the row, and the count starts again), unless
/// no daemon received it (the broker's no-responders answer); so does a leave answered for a
/// generation not known before. One agent's operations are
/// sequential (Jepsen's processes), so the order of its invokes is the order they took effect;
/// the caller still drops the inference when the final row holds a generation past every one
/// answered (an unanswered join a daemon ran late).
fn joins_that_never_stood(ops: &[&Op]) -> std::collections::BTreeSet<u64> {
    #[derive(Default)]
    struct Run {
        known: u64,
        undecided: Vec<u64>,
        void: bool,
        void_by_leave: bool,
    }
    let mut runs: BTreeMap<&str, Run> = BTreeMap::new();
    let mut out = std::collections::BTreeSet::new();
    for op in ops {
        match (&op.call, &op.outcome) {
            (
                Call::Join { channel },
                Completion::Ok {
                    done: Done::Join { generation, .. },
                    ..
                },
            ) => {
                let run = runs.entry(channel.as_str()).or_default();
                // A refusal that removed its row restarted the count: the next join is then
                // at most one past the undecided ones that stood. An answer past that shows no
                // row was removed, so the refusal does not void the argument.
                let refusal_ruled_out =
                    !run.void_by_leave && run.known > run.undecided.len() as u64;
                if (!run.void || refusal_ruled_out) && *generation == run.known + 1 {
                    out.extend(run.undecided.iter().copied());
                }
                *run = Run {
                    known: *generation,
                    ..Run::default()
                };
            }
            // A request no daemon received, or no serving daemon admitted, wrote nothing; one
            // refused as its daemon stopped serving put back the row it replaced (or removed
            // one it created), which keeps the count; another refusal may have written the row
            // and removed it (an ACL lost after the write), which restarts it.
            (Call::Join { .. }, Completion::Fail { error, .. }) if leaves_the_count(error) => {}
            (Call::Join { channel }, Completion::Fail { .. }) => {
                runs.entry(channel.as_str()).or_default().void = true;
            }
            (Call::Join { channel }, _) => runs
                .entry(channel.as_str())
                .or_default()
                .undecided
                .push(op.id),
            (
                Call::Leave {
                    channel,
                    generation,
                },
                Completion::Ok { .. },
            ) => {
                let run = runs.entry(channel.as_str()).or_default();
                if *generation > run.known {
                    run.void = true;
                    run.void_by_leave = true;
                }
            }
            _ => {}
        }
    }
    out
}
