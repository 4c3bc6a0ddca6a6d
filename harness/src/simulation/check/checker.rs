//! The checker: given a history and the broker's final state, what was lost, leaked, served
//! twice or by two daemons at once, how each daemon exit fits the faults, and whether delivery
//! came back after the heal. Pure: no broker, no clock, so it runs on a stored run directory and
//! on hand-written histories alike.
//!
//! Each rule decides one of three answers and never guesses: *owed* (every schedule the history
//! allows makes the reader hand the post off), *not owed* (the history shows a legitimate way
//! for it to be dropped: a narrowing, a retirement, a leave), or *uncertain* (only an operation
//! whose outcome is unknown could have made it not owed). Uncertainty makes the verdict unknown,
//! never invalid. docs/simulation.md cites the seed sentence behind each rule.

use std::collections::{BTreeMap, HashMap};

use super::bounds::CheckConfig;
use super::daemons;
use super::history::{Class, Completion, FaultKind, FrameEvent, History, Member, Ms};
use super::model::{Model, Posted, Standing};
use super::report::{
    Counts, Duplicate, DuplicateWhy, Excused, FaultRef, Leak, LeakKind, Liveness, Lost, PostRef,
    Report, SingleFlight, Stuck, Uncertain, Undecided, Unexpected, UnexpectedKind, Verdict,
};
use super::rows::AclJudged;
use super::snapshot::Snapshot;

/// Checks a run: the history, the broker's final state and the bounds to judge time by.
pub fn check(history: &History, snapshot: &Snapshot, cfg: &CheckConfig) -> Report {
    let model = Model::build(history, snapshot, cfg);
    let mut report = Report {
        verdict: Verdict::Unknown,
        why: Vec::new(),
        counts: Counts::default(),
        lost: Vec::new(),
        excused: Vec::new(),
        uncertain: Vec::new(),
        leaked: Vec::new(),
        unexpected: Vec::new(),
        duplicates: Vec::new(),
        single_flight: SingleFlight::default(),
        exits: Vec::new(),
        liveness: Liveness::NotChecked {
            why: "not run".into(),
        },
        missing_facts: Vec::new(),
    };
    let matched = match_frames(&model, &mut report);
    let owed = delivery(&model, &matched, &mut report);
    leaks(&model, &matched, &mut report);
    duplicates(&model, &matched, &mut report);
    report.liveness = liveness(&model, &owed, &matched);
    report.single_flight = daemons::single_flight(&model);
    report.exits = daemons::exits(&model);
    count(&model, &matched, &mut report);
    report.missing_facts = model.rows.missing.clone();
    report.decide();
    report
}

/// Which member is owed which post (post index -> owed members), for liveness.
type OwedMap<'h> = BTreeMap<usize, Vec<&'h Member>>;

/// The frames of each (member, post), in surface order.
type Matched<'h> = BTreeMap<(&'h Member, usize), Vec<&'h FrameEvent>>;

pub(crate) fn post_ref(p: &Posted<'_>) -> PostRef {
    PostRef {
        op: p.op.id,
        sender: p.sender.clone(),
        channel: p.channel.to_string(),
        seq: p.seq,
        id: p.id.map(str::to_string),
        tag: p.tag.to_string(),
    }
}

/// Pairs each frame with the post it is a copy of: by the workload's tag, else by message id
/// (ids the workload used once), else by the CHAT sequence the frame carries. A frame that
/// fits none, or whose post failed or went to another channel, is unexpected.
fn match_frames<'h>(model: &Model<'h>, report: &mut Report) -> Matched<'h> {
    let mut by_tag: HashMap<&str, usize> = HashMap::new();
    let mut by_id: HashMap<&str, Option<usize>> = HashMap::new();
    let mut by_seq: HashMap<u64, usize> = HashMap::new();
    for (i, p) in model.posts.iter().enumerate() {
        by_tag.insert(p.tag, i);
        if let Some(id) = p.id {
            // An id posted twice names neither post.
            by_id.entry(id).and_modify(|e| *e = None).or_insert(Some(i));
        }
        if let Some(seq) = p.seq {
            by_seq.insert(seq, i);
        }
    }
    let mut matched: Matched<'h> = BTreeMap::new();
    for f in &model.history.frames {
        let fr = &f.frame;
        let found = fr
            .tag
            .as_deref()
            .and_then(|t| by_tag.get(t).copied())
            .or_else(|| {
                fr.id
                    .as_deref()
                    .and_then(|id| by_id.get(id).copied().flatten())
            })
            .or_else(|| fr.chat_seq.and_then(|s| by_seq.get(&s).copied()));
        let unexpected = |kind| Unexpected {
            member: f.member.clone(),
            surfaced_ms: f.ms,
            line: f.line,
            channel: fr.channel.clone(),
            dlv_seq: fr.dlv_seq,
            kind,
        };
        let Some(i) = found else {
            report
                .unexpected
                .push(unexpected(UnexpectedKind::NoSuchPost));
            continue;
        };
        let p = &model.posts[i];
        if matches!(p.op.outcome, Completion::Fail { .. }) {
            report
                .unexpected
                .push(unexpected(UnexpectedKind::FailedPost { op: p.op.id }));
        } else if fr.channel != p.channel {
            report
                .unexpected
                .push(unexpected(UnexpectedKind::WrongChannel {
                    op: p.op.id,
                    posted_on: p.channel.to_string(),
                }));
        } else if &f.member == p.sender {
            report
                .unexpected
                .push(unexpected(UnexpectedKind::SenderCopy { op: p.op.id }));
        } else {
            matched.entry((&f.member, i)).or_default().push(f);
        }
    }
    for frames in matched.values_mut() {
        frames.sort_by_key(|f| (f.ms, f.line));
    }
    matched
}

/// Whether the member's read ACL let the reader hand the post off, judged over every moment
/// from `from` (the post's invoke) to the end: the hand-off may happen any time in between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Due {
    Owed,
    NotOwed(String),
    Uncertain(String),
}

/// "Retired lifecycles owe nothing"; a narrowing acknowledged and not certainly undone before
/// the post makes it not owed (the reader re-checks the current ACL at hand-off); a narrowing
/// whose outcome is unknown makes it uncertain.
///
/// `until` is when the hand-off certainly happened (see [`handoff_deadline`]): a write invoked
/// after it cannot have been in force at the reader's check.
pub(crate) fn authorized(
    model: &Model<'_>,
    member: &Member,
    channel: &str,
    from: Ms,
    until: Ms,
) -> Due {
    let Some(lc) = model.lifecycles.get(member) else {
        return Due::NotOwed("never provisioned".into());
    };
    if lc.name.is_none() {
        return Due::NotOwed("never provisioned".into());
    }
    // The row log decides: the reader's check read the row as the broker held it at some
    // moment from the post (its fence proves the cache at least that current) to the hand-off.
    if let Some(acl) = &model.rows.acl {
        let Some(k) = acl.get(member) else {
            return Due::NotOwed("no ACL row was ever written".into());
        };
        if k.ever_retired() {
            return Due::NotOwed("retired lifecycle".into());
        }
        let to = until.min(model.history.end_ms);
        return match k.judge(channel, from, to, model.cfg.stamp_skew_ms) {
            AclJudged::Covered => Due::Owed,
            AclJudged::Excluded {
                revision, stamp_ms, ..
            }
            | AclJudged::Either { revision, stamp_ms } => Due::NotOwed(format!(
                "ACL revision {revision} (stored at {stamp_ms} ms) excludes {channel} while it may have been handed off"
            )),
        };
    }
    if lc.retired {
        return Due::NotOwed("retired lifecycle".into());
    }
    let superseded = |acked: Ms| {
        lc.acl.iter().any(|c| {
            c.covers(channel) && c.op.invoke_ms > acked && c.acked_ms.is_some_and(|ok| ok < from)
        })
    };
    let mut undecided = None;
    for w in lc
        .acl
        .iter()
        .filter(|w| !w.covers(channel) && w.op.invoke_ms <= until)
    {
        match w.acked_ms {
            Some(acked) if !superseded(acked) => {
                return Due::NotOwed(format!(
                    "ACL excluding {channel} acknowledged by op {} at {acked} ms",
                    w.op.id
                ))
            }
            Some(_) => {}
            None => undecided = Some(w.op.id),
        }
    }
    if lc.maybe_retired {
        return Due::Uncertain("a retirement of unknown outcome".into());
    }
    match undecided {
        Some(op) => Due::Uncertain(format!(
            "op {op} excluding {channel} has an unknown outcome"
        )),
        None => Due::Owed,
    }
}

/// Who is owed post `p`, and how sure: members whose interval admits its sequence (durable),
/// or the peer its mention resolves to (live).
fn owed_to<'h>(model: &Model<'h>, p: &Posted<'h>) -> Vec<(&'h Member, Due)> {
    let (Some(seq), Some(ok_ms)) = (p.seq, p.op.outcome.ok_ms()) else {
        return Vec::new();
    };
    let until = handoff_deadline(model, p.op.invoke_ms, ok_ms);
    let mut out = Vec::new();
    match p.class {
        Class::Durable => {
            for member in model.lifecycles.keys() {
                // "Every live member row … not the sender": the sender is a principal, so none of
                // its lifecycles (a retired one's successor included) is owed its post.
                if member.principal() == p.sender.principal()
                    || !model.knows_channel(member, p.channel)
                {
                    continue;
                }
                let to = until.min(model.history.end_ms);
                let standing = model.standing_within(member, p.channel, seq, p.op.invoke_ms, to);
                if standing == Standing::Outside {
                    continue;
                }
                let owed = match (
                    standing,
                    authorized(model, member, p.channel, p.op.invoke_ms, until),
                ) {
                    (_, Due::NotOwed(why)) => Due::NotOwed(why),
                    (Standing::Either, _) => Due::NotOwed(
                        "a membership write taken back may have dropped it (row log)".into(),
                    ),
                    (Standing::Inside, o) => o,
                    (_, _) => Due::Uncertain(format!(
                        "whether seq {seq} is inside its membership of {} is undecided",
                        p.channel
                    )),
                };
                out.push((*member, owed));
            }
        }
        Class::Live => {
            for name in p.mentions {
                let Some(member) = mention_target(model, p, name) else {
                    continue;
                };
                if out.iter().any(|(m, _)| *m == member) {
                    continue;
                }
                // The writer resolves presence when it routes the post: fresh only if the
                // peer was online until the hand-off surely happened.
                let fresh =
                    until < Ms::MAX && model.online_throughout(member, p.op.invoke_ms, until);
                let owed = if fresh {
                    authorized(model, member, p.channel, p.op.invoke_ms, until)
                } else {
                    Due::NotOwed("presence not provably fresh when the post was routed".into())
                };
                out.push((member, owed));
            }
        }
    }
    out
}

/// When the hand-off of a post invoked at `invoke` and stored at `ok` certainly happened: within
/// the hand-off bound, if a daemon served and nothing faulted all that time (capped at the
/// run's end phase, when the runner stops the daemons); otherwise it may have happened any time
/// (`Ms::MAX`).
fn handoff_deadline(model: &Model<'_>, invoke: Ms, ok: Ms) -> Ms {
    let end = model
        .history
        .phase_ms(super::history::Phase::End)
        .unwrap_or(model.history.end_ms);
    let until = ok.saturating_add(model.cfg.handoff_bound_ms).min(end);
    if until >= invoke
        && model.served_throughout(invoke, until)
        && model.faults_within(invoke, until).is_empty()
    {
        until
    } else {
        Ms::MAX
    }
}

/// The one lifecycle a mention reaches: the name names exactly one principal (not the
/// sender), and that principal has exactly one lifecycle not retired.
fn mention_target<'h>(model: &Model<'h>, p: &Posted<'h>, name: &str) -> Option<&'h Member> {
    let named = model.named(name);
    let principal = named.first()?.principal();
    if named.iter().any(|m| m.principal() != principal) || principal == p.sender.principal() {
        return None;
    }
    let live: Vec<&'h Member> = named
        .into_iter()
        .filter(|m| {
            model
                .lifecycles
                .get(m)
                .is_some_and(|lc| !lc.retired && !lc.maybe_retired)
        })
        .collect();
    match live.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

/// Lost and uncertain: every (post, member) owed, and whether the member surfaced it.
fn delivery<'h>(model: &Model<'h>, matched: &Matched<'h>, report: &mut Report) -> OwedMap<'h> {
    let mut owed_map = OwedMap::new();
    for (i, p) in model.posts.iter().enumerate() {
        for (member, owed) in owed_to(model, p) {
            let surfaced = matched.contains_key(&(member, i));
            match owed {
                Due::NotOwed(_) => report.counts.not_owed += 1,
                Due::Uncertain(why) => {
                    if !surfaced {
                        report.uncertain.push(Uncertain {
                            post: post_ref(p),
                            member: member.clone(),
                            about: Undecided::Owed,
                            why,
                        });
                    }
                }
                Due::Owed => {
                    report.counts.owed += 1;
                    owed_map.entry(i).or_default().push(member);
                    let excused = p
                        .seq
                        .filter(|_| p.class == Class::Durable)
                        .and_then(|seq| model.failed_catch_up(member, p.channel, seq));
                    if surfaced {
                        report.counts.delivered += 1;
                    } else if let Some(f) = excused {
                        report.excused.push(Excused {
                            post: post_ref(p),
                            member: member.clone(),
                            join_op: f.op,
                            generation: f.generation,
                            join_cursor: f.join_cursor,
                            frontier_max: f.frontier_max,
                        });
                    } else {
                        report.lost.push(Lost {
                            post: post_ref(p),
                            member: member.clone(),
                            stuck: stuck(model.snapshot, member, p),
                            faults: model
                                .faults_within(p.op.invoke_ms, model.history.end_ms)
                                .into_iter()
                                .map(|f| FaultRef {
                                    id: f.id,
                                    kind: f.kind,
                                    target: f.target.clone(),
                                    from_ms: f.from_ms,
                                    to_ms: f.to_ms,
                                })
                                .collect(),
                        });
                    }
                }
            }
        }
    }
    owed_map
}

/// Where a lost post still sits for the member, if the broker still holds it.
fn stuck(snapshot: &Snapshot, member: &Member, p: &Posted<'_>) -> Option<Stuck> {
    let same = |tag: &Option<String>, id: &Option<String>| {
        tag.as_deref() == Some(p.tag) || (p.id.is_some() && id.as_deref() == p.id)
    };
    if let Some(pending) = snapshot.pending_of(member) {
        if pending
            .dlv
            .iter()
            .any(|f| f.channel == p.channel && same(&f.tag, &f.id))
        {
            return Some(Stuck::Dlv);
        }
        if pending
            .inbox
            .iter()
            .any(|e| e.channel == p.channel && (Some(e.chat_seq) == p.seq || same(&e.tag, &e.id)))
        {
            return Some(Stuck::Inbox);
        }
    }
    // Pending nowhere for the member: where the post stands in CHAT, when the snapshot read it.
    let (chat, seq) = (snapshot.chat.as_ref()?, p.seq?);
    if chat.lost(seq) {
        return Some(Stuck::GoneFromChat);
    }
    match chat.fanout_ack_floor {
        Some(floor) if seq > floor => Some(Stuck::Chat),
        Some(_) => Some(Stuck::PassedByFanout),
        None => None,
    }
}

/// Leaks: a frame outside the member's interval, a live post's frame to a member no mention
/// names, or a frame whose reader check certainly ran after a narrowing or retirement was
/// acknowledged.
fn leaks<'h>(model: &Model<'h>, matched: &Matched<'h>, report: &mut Report) {
    for (&(member, i), frames) in matched {
        let p = &model.posts[i];
        for f in frames {
            let leak = |kind| Leak {
                post: post_ref(p),
                member: member.clone(),
                surfaced_ms: f.ms,
                line: f.line,
                dlv_seq: f.frame.dlv_seq,
                kind,
            };
            let undecided = |why: String| Uncertain {
                post: post_ref(p),
                member: member.clone(),
                about: Undecided::Leak,
                why,
            };
            match (p.class, p.seq) {
                (Class::Durable, Some(seq)) => match model.standing_within(
                    member,
                    p.channel,
                    seq,
                    p.op.invoke_ms,
                    f.frame.handed_off_ms.unwrap_or(f.ms),
                ) {
                    Standing::Inside | Standing::InGap | Standing::Either => {}
                    Standing::Outside
                        if model.handed_off_before_leave(
                            member,
                            p.channel,
                            seq,
                            p.op.invoke_ms,
                            f.frame.handed_off_ms.unwrap_or(f.ms),
                        ) == Some(true) => {}
                    Standing::Outside => {
                        report.leaked.push(leak(LeakKind::OutsideInterval));
                        continue;
                    }
                    Standing::Uncertain => report.uncertain.push(undecided(format!(
                        "whether seq {seq} is inside its membership of {} is undecided",
                        p.channel
                    ))),
                },
                (Class::Live, _) => {
                    let named = p.mentions.iter().any(|n| {
                        model
                            .named(n)
                            .iter()
                            .any(|m| m.principal() == member.principal())
                    });
                    if !named {
                        report.unexpected.push(Unexpected {
                            member: member.clone(),
                            surfaced_ms: f.ms,
                            line: f.line,
                            channel: f.frame.channel.clone(),
                            dlv_seq: f.frame.dlv_seq,
                            kind: UnexpectedKind::NotMentioned { op: p.op.id },
                        });
                        continue;
                    }
                }
                (Class::Durable, None) => {}
            }
            match after_exclusion(model, member, p, f) {
                Some(Ok(kind)) => report.leaked.push(leak(kind)),
                Some(Err(why)) => report.uncertain.push(undecided(why)),
                None => {}
            }
        }
    }
}

/// Whether the reader's check for frame `f` certainly ran after an acknowledged narrowing
/// excluding the channel (or the retirement) that nothing may have undone by then:
/// `Some(Ok(leak))`, `Some(Err(why))` when it may have, `None` when it did not.
///
/// The check ran after the post was invoked, and no later than the broker's stamp of the
/// hand-off (or the surface, without a stamp); with a stamp and no fault around it, no earlier
/// than the stamp less the hand-off slack.
fn after_exclusion(
    model: &Model<'_>,
    member: &Member,
    p: &Posted<'_>,
    f: &FrameEvent,
) -> Option<Result<LeakKind, String>> {
    let lc = model.lifecycles.get(member)?;
    let latest = f.frame.handed_off_ms.unwrap_or(f.ms);
    // The row log decides: the check read the row as the broker held it at some moment from
    // the post to the hand-off; a leak only if every state of that span excluded the channel.
    if let Some(acl) = &model.rows.acl {
        let k = acl.get(member)?;
        return match k.judge(p.channel, p.op.invoke_ms, latest, model.cfg.stamp_skew_ms) {
            AclJudged::Excluded {
                revision,
                stamp_ms,
                retired,
            } => Some(Ok(LeakKind::AclExcluded {
                revision,
                stored_ms: stamp_ms,
                retired,
            })),
            AclJudged::Covered | AclJudged::Either { .. } => None,
        };
    }
    let mut earliest = p.op.invoke_ms;
    if let Some(stamp) = f.frame.handed_off_ms {
        let from = stamp.saturating_sub(model.cfg.handoff_slack_ms);
        if model.faults_within(from, stamp).is_empty() {
            earliest = earliest.max(from);
        }
    }
    let mut undecided = None;
    for w in lc.acl.iter().filter(|w| !w.covers(p.channel)) {
        let Some(acked) = w.acked_ms else { continue };
        // A widening that may have landed between this write and the check undoes it.
        let undone = !w.is_retire()
            && lc.acl.iter().any(|c| {
                c.covers(p.channel)
                    && c.op.invoke_ms <= latest
                    && c.acked_ms.is_none_or(|ok| ok > w.op.invoke_ms)
            });
        if undone {
            continue;
        }
        let kind = if w.is_retire() {
            LeakKind::AfterRetirement {
                op: w.op.id,
                acked_ms: acked,
            }
        } else {
            LeakKind::AfterNarrowing {
                op: w.op.id,
                acked_ms: acked,
            }
        };
        if acked < earliest {
            return Some(Ok(kind));
        }
        if acked < latest {
            undecided = Some(format!(
                "op {} excluding {} was acknowledged at {acked} ms, and the reader's check ran between {earliest} and {latest} ms",
                w.op.id, p.channel
            ));
        }
    }
    undecided.map(Err)
}

/// How long after a confirmed ack a broker SIGKILL may still lose it: nats-server keeps a
/// consumer's acknowledgements in memory and stores them a moment later, so a broker killed
/// in between restarts from the state before the ack (seen with a kill 19 ms and 100 ms after
/// the ack; `harness simulate --seed 1`).
pub const BROKER_ACK_LOSS_MS: Ms = 5_000;
/// How long after a partition heals or a killed node is back the cluster's leaders may still
/// change (a node that was cut off comes back with higher terms, and the groups step down and
/// elect again): an ack confirmed by a consumer leader in that time may be lost with it. Seed
/// 4302 on a new host: a member's `dlv_` consumer leader changed 6.8 s after a partition
/// healed, 1.0 s after that leader confirmed two acks, and both frames came again one ack wait
/// later.
pub const HEAL_SETTLE_MS: Ms = 10_000;

/// Duplicates: each frame of a (member, post) after the first, classified.
fn duplicates<'h>(model: &Model<'h>, matched: &Matched<'h>, report: &mut Report) {
    let exits: Vec<Ms> = model
        .history
        .observed
        .iter()
        .filter(|o| matches!(o.what, super::history::Observation::DaemonExited { .. }))
        .map(|o| o.ms)
        .collect();
    for (&(member, i), frames) in matched {
        let p = &model.posts[i];
        let Some(first) = frames.first() else {
            continue;
        };
        for (k, again) in frames.iter().enumerate().skip(1) {
            let earlier = &frames[..k];
            let why = if let Some(same) = earlier
                .iter()
                .find(|e| e.frame.dlv_seq == again.frame.dlv_seq)
            {
                if same.frame.acked {
                    // A broker killed just after it confirmed the ack may restart from consumer
                    // state it stored before the ack, and deliver the frame again.
                    let lost_by_broker = model.faults.iter().any(|f| {
                        // Or one whose kill was under way at the ack: the step is invoked
                        // before its SIGKILL lands, and the broker confirms acks until then
                        // (seed 4303: the kill invoked 1 ms before the confirmed ack).
                        let killed_after =
                            matches!(f.kind, FaultKind::BrokerKill | FaultKind::NodeKill)
                                && f.from_ms <= same.ms.saturating_add(BROKER_ACK_LOSS_MS)
                                && f.to_ms >= same.ms;
                        // On the cluster, a consumer leader that confirmed the ack while a node
                        // was cut off or killed (or was about to be) may be replaced by a
                        // follower that never got it: the new leader delivers the frame again.
                        let leader_changed =
                            matches!(f.kind, FaultKind::Partition | FaultKind::NodeKill)
                                && f.from_ms <= same.ms.saturating_add(BROKER_ACK_LOSS_MS)
                                && f.to_ms.saturating_add(HEAL_SETTLE_MS) >= same.ms;
                        (killed_after || leader_changed) && f.from_ms <= again.ms
                    });
                    if lost_by_broker {
                        DuplicateWhy::BrokerLostAck
                    } else {
                        DuplicateWhy::AfterConfirmedAck
                    }
                } else {
                    DuplicateWhy::AckUnconfirmed
                }
            } else if p.id.is_none() {
                DuplicateWhy::IdLess
            } else if model.rejoined_between(
                member,
                p.channel,
                p.seq,
                // From the post's invoke, not its first hand-off: the copy under the closed
                // generation is taken once the post is stored, and the reader may hand it off
                // after the rejoin was written, its check read before (seed 7003, --standby: a
                // rejoin written 117 ms before the first hand-off, on a link with 48 ± 70 ms of
                // latency). A second DLV entry of an id'd post within the dedup window needs two
                // generations, so a rejoin anywhere in that span explains it, and none nothing.
                p.op.invoke_ms,
                again.frame.handed_off_ms.unwrap_or(again.ms),
            ) {
                DuplicateWhy::RejoinRace
            } else {
                let t0 = first.frame.handed_off_ms.unwrap_or(first.ms);
                let t1 = again.frame.handed_off_ms.unwrap_or(again.ms);
                let crashed = exits.iter().any(|&e| e >= t0 && e <= t1);
                if crashed && t1.saturating_sub(t0) >= model.cfg.dedup_window_ms {
                    DuplicateWhy::CrashRedelivery
                } else {
                    DuplicateWhy::SecondHandOff
                }
            };
            report.duplicates.push(Duplicate {
                post: post_ref(p),
                member: member.clone(),
                first_ms: first.ms,
                again_ms: again.ms,
                first_dlv_seq: first.frame.dlv_seq,
                again_dlv_seq: again.frame.dlv_seq,
                allowed: why.allowed(),
                why,
            });
        }
    }
}

/// After the heal, the first post owed to a member online to surface it must surface within
/// the bound. A member offline in that time cannot surface anything, whatever the daemon does,
/// so such a post says nothing about liveness and the next one is taken.
fn liveness<'h>(model: &Model<'h>, owed: &OwedMap<'h>, matched: &Matched<'h>) -> Liveness {
    let Some(heal) = model.history.phase_ms(super::history::Phase::Heal) else {
        return Liveness::NotChecked {
            why: "the history has no heal phase".into(),
        };
    };
    let bound = model.cfg.liveness_bound_ms;
    let mut after: Vec<(&usize, &Vec<&'h Member>)> = owed
        .iter()
        .filter(|(i, _)| model.posts[**i].op.invoke_ms >= heal)
        .collect();
    after.sort_by_key(|(i, _)| (model.posts[**i].op.invoke_ms, **i));
    let first = after.into_iter().find_map(|(&i, members)| {
        let p = &model.posts[i];
        let ok = p.op.outcome.ok_ms().unwrap_or(p.op.invoke_ms);
        let until = ok.saturating_add(bound).min(model.history.end_ms);
        let online: Vec<&Member> = members
            .iter()
            .copied()
            .filter(|m| model.online_throughout(m, p.op.invoke_ms, until))
            .collect();
        (!online.is_empty()).then_some((i, ok, online))
    });
    let Some((i, ok, members)) = first else {
        return Liveness::NotChecked {
            why: "no post after the heal was owed to a member online to surface it".into(),
        };
    };
    let p = &model.posts[i];
    let surfaced = members
        .iter()
        .filter_map(|m| matched.get(&(*m, i)))
        .filter_map(|frames| frames.first().map(|f| f.ms))
        .min();
    match surfaced {
        Some(t) if t.saturating_sub(ok) <= bound => Liveness::Met {
            post: post_ref(p),
            latency_ms: t.saturating_sub(ok),
        },
        _ => Liveness::Missed {
            post: post_ref(p),
            bound_ms: bound,
        },
    }
}

fn count(model: &Model<'_>, matched: &Matched<'_>, report: &mut Report) {
    let c = &mut report.counts;
    c.posts = model.posts.len() as u64;
    c.posts_ok = model.posts.iter().filter(|p| p.seq.is_some()).count() as u64;
    c.posts_indeterminate = model
        .posts
        .iter()
        .filter(|p| p.op.outcome.is_indeterminate())
        .count() as u64;
    let surfaced: std::collections::BTreeSet<usize> = matched.keys().map(|(_, i)| *i).collect();
    c.recovered = surfaced
        .iter()
        .filter(|i| model.posts[**i].op.outcome.is_indeterminate())
        .count() as u64;
    c.frames = model.history.frames.len() as u64;
    for f in &model.faults {
        *c.faults.entry(f.kind.name().to_string()).or_default() += 1;
    }
}
