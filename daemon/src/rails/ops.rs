//! Verbs of the `ctl.delivery` rail (agent-callable). Each returns the reply `data` or the
//! refusal text; the rail module owns envelopes, caller identity and reply binding.
//!
//! Request shapes are pinned (DESIGN §6.7): `durableJoin {channel, lifecycleUid?}`,
//! `durableLeave {channel, generation, lifecycleUid?}`, `listMemberships {lifecycleUid?}`.
//! Without `lifecycleUid` the caller's single live ACL row `<o>.<a>.*` names the lifecycle; two
//! live rows are refused loudly. Every write happens only while the serving epoch the verb was
//! admitted at still holds.

use serde_json::{json, Value};

use crate::journal::epoch_ms;
use crate::plane::{
    chat_frontier, progress, prune_prior, MemberRead, Members, MembershipRecord,
    MAX_PRIOR_INTERVALS, STATE_DURABLE_ACTIVE, STATE_LIVE_CONFIRMED,
};
use crate::plane::{AclRow, Acls};
use crate::plane::{PlaneCtx, NOT_SERVING, STOPPED_SERVING};
use crate::rails::fence::Fences;
use crate::wire::{validate_channel, LifecycleUid, Principal};

/// `ctl.delivery` verbs (agent-callable).
pub async fn delivery(
    ctx: &PlaneCtx,
    fences: &Fences,
    caller: &Principal,
    op: &str,
    args: &Value,
) -> Result<Value, String> {
    match op {
        "durableJoin" => durable_join(ctx, fences, caller, args).await,
        "durableLeave" => durable_leave(ctx, fences, caller, args).await,
        "listMemberships" => list_memberships(ctx, caller, args).await,
        "anycastStatus" | "anycastCancel" => {
            crate::rails::anycast::delivery(ctx, caller, op, args).await
        }
        _ => Err(format!(
            "op \"{op}\" not supported on the delivery control service"
        )),
    }
}

/// The serving epoch this verb acts under.
fn admit(ctx: &PlaneCtx) -> Result<u64, String> {
    ctx.gate.admit().ok_or_else(|| NOT_SERVING.to_string())
}

fn still(ctx: &PlaneCtx, epoch: u64) -> Result<(), String> {
    if ctx.gate.still(epoch) {
        Ok(())
    } else {
        Err(STOPPED_SERVING.to_string())
    }
}

/// `args` must be an object (or absent).
fn object<'a>(
    op: &str,
    args: &'a Value,
) -> Result<Option<&'a serde_json::Map<String, Value>>, String> {
    match args {
        Value::Null => Ok(None),
        Value::Object(m) => Ok(Some(m)),
        _ => Err(format!("{op}: args must be an object")),
    }
}

/// The concrete channel argument.
fn channel_arg(op: &str, args: &Value) -> Result<String, String> {
    let raw = object(op, args)?
        .and_then(|m| m.get("channel"))
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| format!("{op}: channel must be a non-blank string"))?;
    if validate_channel(raw, false).is_ok() && validate_channel(raw, true).is_err() {
        return Err(format!(
            "{op}: \"{raw}\" must be a concrete channel (durable membership is per-concrete-channel, not wildcard)"
        ));
    }
    validate_channel(raw, true).map_err(|e| format!("{op}: {e}"))?;
    Ok(raw.to_string())
}

/// The lifecycle the verb addresses: the explicit `lifecycleUid`, or the caller's single live
/// ACL row.
async fn lifecycle_arg(
    op: &str,
    acls: &Acls,
    caller: &Principal,
    args: &Value,
) -> Result<LifecycleUid, String> {
    match object(op, args)?.and_then(|m| m.get("lifecycleUid")) {
        None | Some(Value::Null) => acls
            .single_live(caller)
            .await
            .map(|(uid, _)| uid)
            .map_err(|e| e.describe(caller, op)),
        Some(Value::String(s)) => LifecycleUid::parse(s).map_err(|e| format!("{op}: {e}")),
        Some(_) => Err(format!("{op}: lifecycleUid must be a string")),
    }
}

/// Refusal of a join or leave of a lifecycle a retirement inventory fenced on this process.
fn fenced(op: &str, caller: &Principal, uid: &LifecycleUid) -> String {
    format!(
        "{op}: lifecycle {uid} of {caller} is being retired (a lifecycleMemberships inventory fenced it on this daemon); durable joins and leaves of it are refused"
    )
}

fn open_err(e: impl std::fmt::Display) -> String {
    format!("delivery: the registry is unavailable: {e}")
}

/// Whether the caller's current ACL row covers `channel`: `Ok(())`, or the refusal.
async fn check_acl(
    acls: &Acls,
    caller: &Principal,
    uid: &LifecycleUid,
    channel: &str,
) -> Result<(), String> {
    match acls
        .read(caller, uid)
        .await
        .map_err(|e| format!("durableJoin: could not read the read ACL: {e}"))?
    {
        AclRow::Absent | AclRow::Garbled(_) => Err(format!(
            "durableJoin: no read ACL on record for {caller} (not provisioned for durable delivery)"
        )),
        AclRow::Present { record, .. } if record.is_retired() => Err(format!(
            "durableJoin: lifecycle {uid} of {caller} is retired"
        )),
        AclRow::Present { record, .. } if !record.covers(channel) => Err(format!(
            "channel \"{channel}\" is not within your read ACL [{}]",
            record.allow_subscribe.join(", ")
        )),
        AclRow::Present { .. } => Ok(()),
    }
}

/// The generation a join writes after `previous` (read from a stored row, so it may be anything):
/// refused instead of wrapping or panicking at the top of the range.
fn next_generation(previous: u64) -> Result<u64, String> {
    previous.checked_add(1).ok_or_else(|| {
        format!("durableJoin: the member row's generation {previous} is at the maximum and cannot be advanced; nothing written")
    })
}

async fn durable_join(
    ctx: &PlaneCtx,
    fences: &Fences,
    caller: &Principal,
    args: &Value,
) -> Result<Value, String> {
    let epoch = admit(ctx)?;
    let channel = channel_arg("durableJoin", args)?;
    let acls = Acls::open(ctx).await.map_err(open_err)?;
    let members = Members::open(ctx).await.map_err(open_err)?;
    let uid = lifecycle_arg("durableJoin", &acls, caller, args).await?;
    let _running = fences
        .begin(caller, &uid)
        .map_err(|_| fenced("durableJoin", caller, &uid))?;
    check_acl(&acls, caller, &uid, &channel).await?;

    let (previous, expected) = match members
        .read(&channel, caller, &uid)
        .await
        .map_err(|e| format!("durableJoin: could not read the member row: {e}"))?
    {
        MemberRead::Present(rec, revision) => (Some(rec), revision),
        MemberRead::Absent { marker_revision } => (None, marker_revision),
        MemberRead::Garbled(e) => {
            return Err(format!("durableJoin: the member row does not parse ({e})"))
        }
    };
    // The join cursor is the CHAT frontier: posts after it are this membership's.
    let join_cursor = chat_frontier(ctx)
        .await
        .map_err(|e| format!("durableJoin: could not read the CHAT frontier: {e}"))?;
    // A rejoin keeps the interval it closes (and earlier ones still needed), so posts of it the
    // writer or reader has not judged yet are judged by it, not by the new interval.
    let mut prior = previous
        .as_ref()
        .map(|r| r.closed_for_rejoin(join_cursor))
        .unwrap_or_default();
    prune_and_say(ctx, caller, &channel, &mut prior).await;
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
    check_acl(&acls, caller, &uid, &channel).await?;
    still(ctx, epoch)?;
    let revision = members
        .write(caller, &uid, &record, expected)
        .await
        .map_err(|e| format!("durableJoin: the member row was not written: {e}"))?;
    // And once more after: if the channel is no longer allowed, take our own row back.
    if let Err(refusal) = check_acl(&acls, caller, &uid, &channel).await {
        if let Err(e) = members.remove(&channel, caller, &uid, revision).await {
            ctx.journal.line(format!(
                "! delivery: durableJoin of {caller} to \"{channel}\" lost its ACL after the write, and removing the row failed: {e}"
            ));
        }
        return Err(refusal);
    }
    // Posts captured between the cursor read and the row write may have been routed without
    // this row: copy them now. A failure leaves the row standing and says so.
    let copies =
        match crate::plane::activate(ctx, &channel, caller, &uid, record.generation, join_cursor)
            .await
        {
            Ok(copies) => copies,
            Err(e) => {
                ctx.journal.line(format!(
                    "! delivery: activation catch-up of {caller} on \"{channel}\" failed: {e}"
                ));
                if !ctx.gate.still(epoch) {
                    undo_join(
                        ctx,
                        &members,
                        caller,
                        &uid,
                        &record,
                        revision,
                        previous,
                        &[],
                    )
                    .await;
                    return Err(STOPPED_SERVING.to_string());
                }
                return Ok(json!({
                    "durable": false,
                    "reason": format!("activation catch-up failed: {e}"),
                    "generation": record.generation,
                }));
            }
        };
    // Stopped serving while the join ran: it is refused, so it must leave nothing behind.
    if !ctx.gate.still(epoch) {
        undo_join(
            ctx, &members, caller, &uid, &record, revision, previous, &copies,
        )
        .await;
        return Err(STOPPED_SERVING.to_string());
    }
    Ok(json!({"durable": true, "generation": record.generation}))
}

/// Prunes the kept closed intervals both the writer and the reader have passed; an interval
/// dropped by the cap instead is said in the log (its late posts would be judged by the new row).
async fn prune_and_say(
    ctx: &PlaneCtx,
    caller: &Principal,
    channel: &str,
    prior: &mut Vec<crate::plane::PriorInterval>,
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

/// Takes back a join refused after its row was written: the catch-up copies are deleted from
/// `INBOX_<s>`, then the row is restored to what it was (or removed), by compare-and-set at the
/// revision this join wrote, so a row another writer changed since is left alone. It runs while
/// not serving because it only undoes this request's own writes. A failure is said in the log.
#[allow(clippy::too_many_arguments)]
async fn undo_join(
    ctx: &PlaneCtx,
    members: &Members,
    caller: &Principal,
    uid: &LifecycleUid,
    record: &MembershipRecord,
    revision: u64,
    previous: Option<MembershipRecord>,
    copies: &[u64],
) {
    let channel = &record.channel;
    for seq in copies {
        if let Err(e) = crate::plane::delete_inbox_entry(ctx, *seq).await {
            ctx.journal.line(format!(
                "! delivery: a refused durableJoin of {caller} to \"{channel}\" could not delete its catch-up copy (INBOX sequence {seq}): {e}"
            ));
        }
    }
    let restored = match previous {
        Some(previous) => members.write(caller, uid, &previous, revision).await,
        None => members.remove(channel, caller, uid, revision).await,
    };
    if let Err(e) = restored {
        ctx.journal.line(format!(
            "! delivery: a refused durableJoin of {caller} to \"{channel}\" could not take back its member row (generation {}): {e}",
            record.generation
        ));
    }
}

async fn durable_leave(
    ctx: &PlaneCtx,
    fences: &Fences,
    caller: &Principal,
    args: &Value,
) -> Result<Value, String> {
    let epoch = admit(ctx)?;
    let channel = channel_arg("durableLeave", args)?;
    let generation = object("durableLeave", args)?
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_f64)
        .filter(|g| g.is_finite())
        .ok_or_else(|| {
            "durableLeave: a finite generation is required (fail-closed stale-leave guard)"
                .to_string()
        })?;
    // No ACL coverage check: a leave must work after a narrowing.
    let acls = Acls::open(ctx).await.map_err(open_err)?;
    let members = Members::open(ctx).await.map_err(open_err)?;
    let uid = lifecycle_arg("durableLeave", &acls, caller, args).await?;
    let _running = fences
        .begin(caller, &uid)
        .map_err(|_| fenced("durableLeave", caller, &uid))?;
    let (mut record, revision) = match members
        .read(&channel, caller, &uid)
        .await
        .map_err(|e| format!("durableLeave: could not read the member row: {e}"))?
    {
        MemberRead::Present(rec, revision) => (rec, revision),
        MemberRead::Absent { .. } => return Ok(json!({"channel": channel, "alreadyLeft": true})),
        MemberRead::Garbled(e) => {
            return Err(format!("durableLeave: the member row does not parse ({e})"))
        }
    };
    if (record.generation as f64) != generation {
        return Err(format!(
            "durableLeave: stale leave - generation {generation} is not the membership's current generation {}",
            record.generation
        ));
    }
    if record.is_tombstone() {
        return Ok(json!({"channel": channel, "alreadyLeft": true}));
    }
    let leave_cursor = chat_frontier(ctx)
        .await
        .map_err(|e| format!("durableLeave: could not read the CHAT frontier: {e}"))?;
    let previous = record.clone();
    record.leave_cursor = Some(leave_cursor.max(record.join_cursor));
    prune_and_say(ctx, caller, &channel, &mut record.prior_intervals).await;
    record.state = STATE_LIVE_CONFIRMED.to_string();
    record.writer_identity = ctx.me.dot_form();
    record.updated_at = epoch_ms();
    still(ctx, epoch)?;
    // Compare-and-set on the revision just read: only a row that still exists is updated.
    let written = members
        .write(caller, &uid, &record, revision)
        .await
        .map_err(|e| format!("durableLeave: the leave cursor was not written: {e}"))?;
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
            return Err(format!(
                "durableLeave: reader handoffs decided before the leave did not finish within {} ms; nothing changed, retry",
                LEAVE_DRAIN_BOUND.as_millis()
            ));
        }
        return Err(STOPPED_SERVING.to_string());
    }
    Ok(json!({"channel": channel}))
}

/// Bound on a leave waiting for the reader decisions taken before its write (each is bounded by
/// its fences and its handoff publish).
const LEAVE_DRAIN_BOUND: std::time::Duration = std::time::Duration::from_secs(15);

async fn list_memberships(
    ctx: &PlaneCtx,
    caller: &Principal,
    args: &Value,
) -> Result<Value, String> {
    admit(ctx)?;
    let acls = Acls::open(ctx).await.map_err(open_err)?;
    let members = Members::open(ctx).await.map_err(open_err)?;
    let uid = lifecycle_arg("listMemberships", &acls, caller, args).await?;
    let rows = members
        .of_lifecycle(caller, &uid)
        .await
        .map_err(|e| format!("listMemberships: could not read the registry: {e}"))?;
    let list: Vec<Value> = rows
        .iter()
        .filter(|r| !r.record.is_tombstone())
        .map(|r| {
            json!({
                "channel": r.record.channel,
                "generation": r.record.generation,
                "activated": r.record.activated.unwrap_or(false),
            })
        })
        .collect();
    Ok(json!({"memberships": list}))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation caught: `previous + 1` instead of `checked_add` (panics on a stored
    /// `u64::MAX` generation in a debug build, wraps to 0 in a release one).
    #[test]
    fn a_stored_generation_at_the_maximum_is_refused_not_wrapped() {
        assert_eq!(next_generation(0), Ok(1));
        assert_eq!(next_generation(41), Ok(42));
        let refusal = next_generation(u64::MAX).unwrap_err();
        assert!(refusal.contains("at the maximum"), "{refusal}");
        assert!(refusal.contains(&u64::MAX.to_string()), "{refusal}");
    }
}
