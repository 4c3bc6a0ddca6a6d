//! The durable membership transactions as plane operations: `durableJoin`, `durableLeave` and
//! `listMemberships`, on their typed arguments (`wire::requests`), answering typed replies or a
//! [`Refusal`] with the rail's text.
//!
//! Why here and not in the rail: a join is a transaction over the plane's rows (the read-ACL row
//! read before and after the member row's write, the CHAT frontier, the activation catch-up,
//! and its undo when the join is refused after writing), and the strict leave boundary waits
//! for the reader's decisions. The rail parses, calls and replies; it owns none of this.
//!
//! Without `lifecycleUid` the caller's single live ACL row `<o>.<a>.*` names the lifecycle; two
//! live rows are refused loudly. Every write happens only while the serving epoch the verb was
//! admitted at still holds.

use std::time::Duration;

use crate::base::epoch_ms;
use crate::plane::acl::{AclRow, Acls};
use crate::plane::fence::Fences;
use crate::plane::membership::{
    chat_frontier, progress, prune_prior, MemberRead, Members, MembershipRecord, PriorInterval,
    MAX_PRIOR_INTERVALS, STATE_DURABLE_ACTIVE, STATE_LIVE_CONFIRMED,
};
use crate::plane::{PlaneCtx, NOT_SERVING, STOPPED_SERVING};
use crate::wire::{
    DurableJoin, DurableLeave, Joined, Left, LifecycleUid, ListMemberships, Membership,
    Memberships, Principal, Refusal, RefusalKind,
};

/// Bound on a leave waiting for the reader decisions taken before its write (each is bounded by
/// its fences and its handoff publish).
pub const LEAVE_DRAIN_BOUND: Duration = Duration::from_secs(15);

/// The serving epoch this verb acts under.
fn admit(ctx: &PlaneCtx) -> Result<u64, Refusal> {
    ctx.gate
        .admit()
        .ok_or_else(|| Refusal::new(RefusalKind::NotServing, NOT_SERVING))
}

fn stopped_serving() -> Refusal {
    Refusal::new(RefusalKind::StoppedServing, STOPPED_SERVING)
}

fn still(ctx: &PlaneCtx, epoch: u64) -> Result<(), Refusal> {
    if ctx.gate.still(epoch) {
        Ok(())
    } else {
        Err(stopped_serving())
    }
}

/// A broker read or write of the transaction that did not succeed.
fn unavailable(text: String, e: crate::base::RowError) -> Refusal {
    Refusal::new(RefusalKind::Unavailable, text).source(e)
}

fn open_err(e: crate::base::RowError) -> Refusal {
    unavailable(format!("delivery: the registry is unavailable: {e}"), e)
}

/// The lifecycle the verb addresses: the explicit one, or the caller's single live ACL row.
async fn lifecycle(
    op: &str,
    acls: &Acls,
    caller: &Principal,
    explicit: &Option<LifecycleUid>,
) -> Result<LifecycleUid, Refusal> {
    match explicit {
        Some(uid) => Ok(uid.clone()),
        None => acls
            .single_live(caller)
            .await
            .map(|(uid, _)| uid)
            .map_err(|e| Refusal::new(RefusalKind::Denied, e.describe(caller, op))),
    }
}

/// Refusal of a join or leave of a lifecycle a retirement inventory fenced on this process.
fn fenced(op: &str, caller: &Principal, uid: &LifecycleUid) -> Refusal {
    Refusal::new(
        RefusalKind::Denied,
        format!(
            "{op}: lifecycle {uid} of {caller} is being retired (a lifecycleMemberships inventory fenced it on this daemon); durable joins and leaves of it are refused"
        ),
    )
}

/// Whether the caller's current ACL row covers `channel`: `Ok(())`, or the refusal.
async fn check_acl(
    acls: &Acls,
    caller: &Principal,
    uid: &LifecycleUid,
    channel: &str,
) -> Result<(), Refusal> {
    let denied = |text: String| Refusal::new(RefusalKind::Denied, text);
    match acls
        .read(caller, uid)
        .await
        .map_err(|e| unavailable(format!("durableJoin: could not read the read ACL: {e}"), e))?
    {
        AclRow::Absent | AclRow::Garbled(_) => Err(denied(format!(
            "durableJoin: no read ACL on record for {caller} (not provisioned for durable delivery)"
        ))),
        AclRow::Present { record, .. } if record.is_retired() => Err(denied(format!(
            "durableJoin: lifecycle {uid} of {caller} is retired"
        ))),
        AclRow::Present { record, .. } if !record.covers(channel) => Err(denied(format!(
            "channel \"{channel}\" is not within your read ACL [{}]",
            record.allow_subscribe.join(", ")
        ))),
        AclRow::Present { .. } => Ok(()),
    }
}

/// A member row as a join or leave reads it.
enum Row {
    Present(MembershipRecord, u64),
    /// No row; a create expects this revision (the bucket's marker, or none).
    Absent {
        marker_revision: u64,
    },
}

/// The caller's member row of `channel` for `op`, read leader-served; a failed read or a row
/// that does not parse refuses the verb.
async fn member_row(
    members: &Members,
    op: &str,
    channel: &str,
    caller: &Principal,
    uid: &LifecycleUid,
) -> Result<Row, Refusal> {
    match members
        .read(channel, caller, uid)
        .await
        .map_err(|e| unavailable(format!("{op}: could not read the member row: {e}"), e))?
    {
        MemberRead::Present(rec, revision) => Ok(Row::Present(rec, revision)),
        MemberRead::Absent { marker_revision } => Ok(Row::Absent { marker_revision }),
        MemberRead::Garbled(e) => Err(Refusal::new(
            RefusalKind::Unavailable,
            format!("{op}: the member row does not parse ({e})"),
        )),
    }
}

/// The generation a join writes after `previous` (read from a stored row, so it may be anything):
/// refused instead of wrapping or panicking at the top of the range.
fn next_generation(previous: u64) -> Result<u64, Refusal> {
    previous.checked_add(1).ok_or_else(|| {
        Refusal::new(RefusalKind::Conflict, format!("durableJoin: the member row's generation {previous} is at the maximum and cannot be advanced; nothing written"))
    })
}

/// `durableJoin`: the member row written between two reads of the caller's ACL row (a
/// narrowing that raced the first read wins: the row is taken back), then the activation
/// catch-up of the posts captured meanwhile; a join refused after its write leaves nothing.
pub async fn durable_join(
    ctx: &PlaneCtx,
    fences: &Fences,
    caller: &Principal,
    args: &DurableJoin,
) -> Result<Joined, Refusal> {
    const OP: &str = "durableJoin";
    let epoch = admit(ctx)?;
    let channel = &args.channel;
    let acls = Acls::open(ctx).await.map_err(open_err)?;
    let members = Members::open(ctx).await.map_err(open_err)?;
    let uid = lifecycle(OP, &acls, caller, &args.lifecycle_uid).await?;
    let _running = fences
        .begin(caller, &uid)
        .map_err(|_| fenced(OP, caller, &uid))?;
    check_acl(&acls, caller, &uid, channel).await?;

    let (previous, expected) = match member_row(&members, OP, channel, caller, &uid).await? {
        Row::Present(rec, revision) => (Some(rec), revision),
        Row::Absent { marker_revision } => (None, marker_revision),
    };
    // The join cursor is the CHAT frontier: posts after it are this membership's.
    let join_cursor = chat_frontier(ctx).await.map_err(|e| {
        unavailable(
            format!("durableJoin: could not read the CHAT frontier: {e}"),
            e,
        )
    })?;
    // A rejoin keeps the interval it closes (and earlier ones still needed), so posts of it the
    // writer or reader has not judged yet are judged by it, not by the new interval.
    let mut prior = previous
        .as_ref()
        .map(|r| r.closed_for_rejoin(join_cursor))
        .unwrap_or_default();
    prune_and_say(ctx, caller, channel, &mut prior).await;
    let record = MembershipRecord {
        channel: channel.clone(),
        owner: caller.dot_form(),
        lifecycle_uid: uid.to_string(),
        state: STATE_DURABLE_ACTIVE.to_string(),
        join_cursor,
        activated: Some(true),
        leave_cursor: None,
        generation: next_generation(previous.as_ref().map_or(0, |r| r.generation))?,
        writer_identity: ctx.me.dot_form(),
        updated_at: epoch_ms(),
        prior_intervals: prior,
    };
    // Re-check just before the write: a narrowing that raced the first check wins.
    check_acl(&acls, caller, &uid, channel).await?;
    still(ctx, epoch)?;
    let revision = members
        .write(caller, &uid, &record, expected)
        .await
        .map_err(|e| {
            unavailable(
                format!("durableJoin: the member row was not written: {e}"),
                e,
            )
        })?;
    // And once more after: if the channel is no longer allowed, take our own row back.
    if let Err(refusal) = check_acl(&acls, caller, &uid, channel).await {
        if let Err(e) = members.remove(channel, caller, &uid, revision).await {
            ctx.journal.line(format!(
                "! delivery: durableJoin of {caller} to \"{channel}\" lost its ACL after the write, and removing the row failed: {e}"
            ));
        }
        return Err(refusal);
    }
    let join = Written {
        members: &members,
        caller,
        uid: &uid,
        record: &record,
        revision,
        previous,
    };
    // Posts captured between the cursor read and the row write may have been routed without
    // this row: copy them now. A failure leaves the row standing and says so.
    let copies =
        match crate::plane::activate(ctx, channel, caller, &uid, record.generation, join_cursor)
            .await
        {
            Ok(copies) => copies,
            Err(e) => {
                ctx.journal.line(format!(
                    "! delivery: activation catch-up of {caller} on \"{channel}\" failed: {e}"
                ));
                if !ctx.gate.still(epoch) {
                    join.undo(ctx, &[]).await;
                    return Err(stopped_serving());
                }
                return Ok(Joined {
                    durable: false,
                    reason: Some(format!("activation catch-up failed: {e}")),
                    generation: record.generation,
                });
            }
        };
    // Stopped serving while the join ran: it is refused, so it must leave nothing behind.
    if !ctx.gate.still(epoch) {
        join.undo(ctx, &copies).await;
        return Err(stopped_serving());
    }
    Ok(Joined {
        durable: true,
        reason: None,
        generation: record.generation,
    })
}

/// Prunes the kept closed intervals both the writer and the reader have passed; an interval
/// dropped by the cap instead is said in the log (its late posts would be judged by the new row).
async fn prune_and_say(
    ctx: &PlaneCtx,
    caller: &Principal,
    channel: &str,
    prior: &mut Vec<PriorInterval>,
) {
    if prior.is_empty() {
        return;
    }
    let dropped = prune_prior(prior, progress(ctx).await);
    if dropped > 0 {
        ctx.journal.line(format!(
            "! delivery: {caller} on \"{channel}\" has more than {MAX_PRIOR_INTERVALS} closed membership intervals the fan-out writer or reader has not passed; the {dropped} oldest are no longer kept"
        ));
    }
}

/// A join's member row as written, and what it replaced.
struct Written<'a> {
    members: &'a Members,
    caller: &'a Principal,
    uid: &'a LifecycleUid,
    record: &'a MembershipRecord,
    revision: u64,
    previous: Option<MembershipRecord>,
}

impl Written<'_> {
    /// Takes back a join refused after its row was written: the catch-up copies are deleted from
    /// `INBOX_<s>`, then the row is restored to what it was (or removed), by compare-and-set at
    /// the revision this join wrote, so a row another writer changed since is left alone. It
    /// runs while not serving because it only undoes this request's own writes. A failure is
    /// said in the log.
    async fn undo(self, ctx: &PlaneCtx, copies: &[u64]) {
        let (caller, record) = (self.caller, self.record);
        let channel = &record.channel;
        for seq in copies {
            if let Err(e) = crate::plane::delete_inbox_entry(ctx, *seq).await {
                ctx.journal.line(format!(
                    "! delivery: a refused durableJoin of {caller} to \"{channel}\" could not delete its catch-up copy (INBOX sequence {seq}): {e}"
                ));
            }
        }
        let restored = match self.previous {
            Some(previous) => {
                self.members
                    .write(caller, self.uid, &previous, self.revision)
                    .await
            }
            None => {
                self.members
                    .remove(channel, caller, self.uid, self.revision)
                    .await
            }
        };
        if let Err(e) = restored {
            ctx.journal.line(format!(
                "! delivery: a refused durableJoin of {caller} to \"{channel}\" could not take back its member row (generation {}): {e}",
                record.generation
            ));
        }
    }
}

/// `durableLeave`: the leave cursor written by compare-and-set on the row just read (no ACL
/// coverage check: a leave must work after a narrowing), then the strict boundary: reader
/// decisions taken before the write finish before the answer.
pub async fn durable_leave(
    ctx: &PlaneCtx,
    fences: &Fences,
    caller: &Principal,
    args: &DurableLeave,
) -> Result<Left, Refusal> {
    const OP: &str = "durableLeave";
    let epoch = admit(ctx)?;
    let channel = &args.channel;
    let generation = args.generation;
    let left = |already_left: bool| Left {
        channel: channel.clone(),
        already_left,
    };
    let acls = Acls::open(ctx).await.map_err(open_err)?;
    let members = Members::open(ctx).await.map_err(open_err)?;
    let uid = lifecycle(OP, &acls, caller, &args.lifecycle_uid).await?;
    let _running = fences
        .begin(caller, &uid)
        .map_err(|_| fenced(OP, caller, &uid))?;
    let (mut record, revision) = match member_row(&members, OP, channel, caller, &uid).await? {
        Row::Present(rec, revision) => (rec, revision),
        Row::Absent { .. } => return Ok(left(true)),
    };
    if (record.generation as f64) != generation {
        return Err(Refusal::new(
            RefusalKind::Conflict,
            format!(
                "durableLeave: stale leave - generation {generation} is not the membership's current generation {}",
                record.generation
            ),
        ));
    }
    if record.is_tombstone() {
        return Ok(left(true));
    }
    let leave_cursor = chat_frontier(ctx).await.map_err(|e| {
        unavailable(
            format!("durableLeave: could not read the CHAT frontier: {e}"),
            e,
        )
    })?;
    let previous = record.clone();
    record.leave_cursor = Some(leave_cursor.max(record.join_cursor));
    prune_and_say(ctx, caller, channel, &mut record.prior_intervals).await;
    record.state = STATE_LIVE_CONFIRMED.to_string();
    record.writer_identity = ctx.me.dot_form();
    record.updated_at = epoch_ms();
    still(ctx, epoch)?;
    // Compare-and-set on the revision just read: only a row that still exists is updated.
    let written = members
        .write(caller, &uid, &record, revision)
        .await
        .map_err(|e| {
            unavailable(
                format!("durableLeave: the leave cursor was not written: {e}"),
                e,
            )
        })?;
    // Strict boundary: reader decisions taken before the write (which may have seen the row
    // without its leave cursor) finish before the answer; every later one fences after it.
    let mark = ctx.handoffs.mark();
    let drained = ctx.handoffs.drain_before(mark, LEAVE_DRAIN_BOUND).await;
    if !drained || !ctx.gate.still(epoch) {
        // Refused: the leave must change nothing, so the row goes back to what it was.
        if let Err(e) = members.write(caller, &uid, &previous, written).await {
            ctx.journal.line(format!(
                "! delivery: a refused durableLeave of {caller} on \"{channel}\" could not take back its leave cursor (generation {}): {e}",
                record.generation
            ));
        }
        if !drained {
            return Err(Refusal::new(
                RefusalKind::Conflict,
                format!(
                    "durableLeave: reader handoffs decided before the leave did not finish within {} ms; nothing changed, retry",
                    LEAVE_DRAIN_BOUND.as_millis()
                ),
            ));
        }
        return Err(stopped_serving());
    }
    Ok(left(false))
}

/// `listMemberships`: the lifecycle's rows that are not tombstones.
pub async fn list_memberships(
    ctx: &PlaneCtx,
    caller: &Principal,
    args: &ListMemberships,
) -> Result<Memberships, Refusal> {
    admit(ctx)?;
    let acls = Acls::open(ctx).await.map_err(open_err)?;
    let members = Members::open(ctx).await.map_err(open_err)?;
    let uid = lifecycle("listMemberships", &acls, caller, &args.lifecycle_uid).await?;
    let rows = members.of_lifecycle(caller, &uid).await.map_err(|e| {
        unavailable(
            format!("listMemberships: could not read the registry: {e}"),
            e,
        )
    })?;
    Ok(Memberships {
        memberships: rows
            .iter()
            .filter(|r| !r.record.is_tombstone())
            .map(|r| Membership {
                channel: r.record.channel.clone(),
                generation: r.record.generation,
                activated: r.record.activated.unwrap_or(false),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation caught: `previous + 1` instead of `checked_add` (panics on a stored
    /// `u64::MAX` generation in a debug build, wraps to 0 in a release one).
    #[test]
    fn a_stored_generation_at_the_maximum_is_refused_not_wrapped() {
        assert_eq!(next_generation(0).ok(), Some(1));
        assert_eq!(next_generation(41).ok(), Some(42));
        let refusal = next_generation(u64::MAX)
            .err()
            .map(|r| (r.kind(), r.text().to_string()));
        let (kind, text) = refusal.unwrap_or((RefusalKind::Argument, String::new()));
        assert_eq!(kind, RefusalKind::Conflict);
        assert!(text.contains("at the maximum"), "{text}");
        assert!(text.contains(&u64::MAX.to_string()), "{text}");
    }
}
