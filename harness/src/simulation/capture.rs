//! What the broker holds once the drain ended, read into the checker's [`Snapshot`]: per
//! lifecycle the frames its `dlv_` durable has not acknowledged and the INBOX entries above the
//! reader's ack floor, every member row and ACL row (leader-served reads), and the lease key's
//! writes the runner's watch collected during the run.

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::Context;
use cotal_delivery::base::{keys, Read, Rows};
use cotal_delivery::wire::{Plane3DeliveryFrame, Plane3Entry, SpaceNames};
use futures::StreamExt;
use serde_json::Value;

use super::observe::LeaseWrites;
use super::population::tag_of;
use crate::simulation::check::snapshot::{
    AclRow, ChatHeld, MemberRow, Pending, PendingEntry, PendingFrame, PriorInterval, Snapshot,
};
use crate::simulation::check::Member;

/// Bound on each broker read of the snapshot.
const READ_BOUND: Duration = Duration::from_secs(10);
/// Most messages read per lifecycle and store: the per-subject retention (1000) and then some.
const MAX_PENDING_READ: usize = 1_200;

/// Reads the final state; `members` are every lifecycle the run provisioned.
pub async fn read(
    js: &Context,
    names: &SpaceNames,
    members: &BTreeSet<Member>,
    lease: &LeaseWrites,
) -> Result<Snapshot, String> {
    let mut snap = Snapshot::default();
    for member in members {
        let (p, u) = (member.principal(), member.uid());
        let dlv_floor = ack_floor(js, &names.dlv_stream(), &SpaceNames::dlv_durable(p, u)).await;
        let inbox_floor = ack_floor(js, &names.inbox_stream(), "reader").await;
        let dlv = match dlv_floor {
            Some(floor) => after(js, &names.dlv_stream(), &names.dlv_subject(p, u), floor)
                .await?
                .into_iter()
                .filter_map(|(seq, body)| {
                    let f: Plane3DeliveryFrame = serde_json::from_slice(&body).ok()?;
                    Some(PendingFrame {
                        channel: f.channel,
                        id: id_of(&f.msg),
                        tag: tag_of(&f.msg),
                        dlv_seq: seq,
                    })
                })
                .collect(),
            None => Vec::new(),
        };
        let inbox = match inbox_floor {
            Some(floor) => after(
                js,
                &names.inbox_stream(),
                &names.dinbox_subject(p, u),
                floor,
            )
            .await?
            .into_iter()
            .filter_map(|(_, body)| {
                let e: Plane3Entry = serde_json::from_slice(&body).ok()?;
                Some(PendingEntry {
                    channel: e.channel,
                    chat_seq: e.seq,
                    generation: e.generation,
                    id: id_of(&e.msg),
                    tag: tag_of(&e.msg),
                })
            })
            .collect(),
            None => Vec::new(),
        };
        if !dlv.is_empty() || !inbox.is_empty() {
            snap.pending.push(Pending {
                member: member.clone(),
                dlv,
                inbox,
            });
        }
    }
    snap.chat = chat_held(js, names).await;
    snap.member_rows = member_rows(js, names).await?;
    snap.acl_rows = acl_rows(js, names).await?;
    snap.lease_writes = lease
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect();
    Ok(snap)
}

/// What `CHAT_<s>` still holds (its first and last sequence, the gaps between) and the
/// `fanout` durable's ack floor; `None` when the stream cannot be read (a lost post then says
/// nothing of CHAT).
async fn chat_held(js: &Context, names: &SpaceNames) -> Option<ChatHeld> {
    let stream = names.chat_stream();
    let mut s = js.get_stream(&stream).await.ok()?;
    let state = s.info().await.ok()?.state.clone();
    let (first_seq, last_seq) = (state.first_sequence, state.last_sequence);
    let held: BTreeSet<u64> = if state.messages == 0 {
        BTreeSet::new()
    } else {
        after_upto(
            js,
            &stream,
            &names.chat_all(),
            first_seq.saturating_sub(1),
            usize::MAX,
        )
        .await
        .ok()?
        .into_iter()
        .map(|(seq, _)| seq)
        .collect()
    };
    let missing = (first_seq..=last_seq)
        .filter(|q| *q > 0 && !held.contains(q))
        .collect();
    Some(ChatHeld {
        first_seq,
        last_seq,
        missing,
        fanout_ack_floor: ack_floor(js, &stream, "fanout").await,
    })
}

fn id_of(msg: &Value) -> Option<String> {
    msg["id"]
        .as_str()
        .filter(|i| !i.is_empty())
        .map(str::to_string)
}

/// A durable's ack floor (its stream sequence), `None` when it cannot be read.
async fn ack_floor(js: &Context, stream: &str, durable: &str) -> Option<u64> {
    let stream = js.get_stream_no_info(stream).await.ok()?;
    let mut c: async_nats::jetstream::consumer::Consumer<pull::Config> =
        stream.get_consumer(durable).await.ok()?;
    let info = c.info().await.ok()?;
    Some(info.ack_floor.stream_sequence)
}

/// The messages on `subject` after stream sequence `floor` (at most [`MAX_PENDING_READ`]),
/// through an ephemeral consumer that acknowledges nothing.
async fn after(
    js: &Context,
    stream: &str,
    subject: &str,
    floor: u64,
) -> Result<Vec<(u64, Vec<u8>)>, String> {
    after_upto(js, stream, subject, floor, MAX_PENDING_READ).await
}

/// [`after`], reading at most `most` messages.
async fn after_upto(
    js: &Context,
    stream: &str,
    subject: &str,
    floor: u64,
    most: usize,
) -> Result<Vec<(u64, Vec<u8>)>, String> {
    let err = |e: &dyn std::fmt::Display| format!("read {subject} after {floor}: {e}");
    let s = js.get_stream_no_info(stream).await.map_err(|e| err(&e))?;
    let consumer = s
        .create_consumer(pull::Config {
            filter_subject: subject.to_string(),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: floor + 1,
            },
            ack_policy: AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .map_err(|e| err(&e))?;
    let mut out = Vec::new();
    loop {
        let mut c = consumer.clone();
        let pending = c.info().await.map_err(|e| err(&e))?.num_pending;
        if pending == 0 || out.len() >= most {
            break;
        }
        let mut batch = consumer
            .fetch()
            .max_messages(pending.min(256) as usize)
            .expires(READ_BOUND)
            .messages()
            .await
            .map_err(|e| err(&e))?;
        let before = out.len();
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| err(&e))?;
            let seq = m.info().map(|i| i.stream_sequence).map_err(|e| err(&e))?;
            out.push((seq, m.payload.to_vec()));
        }
        if out.len() == before {
            break;
        }
    }
    Ok(out)
}

/// Every row of a bucket, leader-served, with its key.
async fn rows(js: &Context, bucket: &str) -> Result<Vec<(String, Value, u64)>, String> {
    let all = keys(js, bucket, ">", READ_BOUND)
        .await
        .map_err(|e| format!("keys of {bucket}: {e}"))?;
    let rows = Rows::open(js, bucket, READ_BOUND)
        .await
        .map_err(|e| format!("bucket {bucket}: {e}"))?;
    let mut out = Vec::new();
    for key in all {
        if let Read::Present(r) = rows
            .read(&key)
            .await
            .map_err(|e| format!("read {bucket} {key}: {e}"))?
        {
            if let Ok(v) = serde_json::from_slice::<Value>(&r.value) {
                out.push((key, v, r.revision));
            }
        }
    }
    Ok(out)
}

async fn member_rows(js: &Context, names: &SpaceNames) -> Result<Vec<MemberRow>, String> {
    let mut out = Vec::new();
    for (key, v, _) in rows(js, &names.members_bucket()).await? {
        // `<channel>/<o>.<a>.<uid>`.
        let Some((channel, who)) = key.rsplit_once('/') else {
            continue;
        };
        let Some(member) = member_of_key(who) else {
            continue;
        };
        let (Some(generation), Some(join_cursor)) =
            (v["generation"].as_u64(), v["joinCursor"].as_u64())
        else {
            continue;
        };
        let prior = v["priorIntervals"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| {
                        Some(PriorInterval {
                            generation: p["generation"].as_u64()?,
                            join_cursor: p["joinCursor"].as_u64()?,
                            leave_cursor: p["leaveCursor"].as_u64()?,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(MemberRow {
            member,
            channel: channel.to_string(),
            generation,
            join_cursor,
            leave_cursor: v["leaveCursor"].as_u64(),
            prior,
        });
    }
    Ok(out)
}

async fn acl_rows(js: &Context, names: &SpaceNames) -> Result<Vec<AclRow>, String> {
    let mut out = Vec::new();
    for (key, v, revision) in rows(js, &names.acl_bucket()).await? {
        let Some(member) = member_of_key(&key) else {
            continue;
        };
        out.push(AclRow {
            member,
            allow_subscribe: v["allowSubscribe"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|c| c.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            revision,
            retired: v["retired"].as_bool() == Some(true) || v.get("retiredAt").is_some(),
        });
    }
    Ok(out)
}

/// `<o>.<a>.<uid>` as a member.
fn member_of_key(key: &str) -> Option<Member> {
    let (principal, uid) = key.rsplit_once('.')?;
    Member::parse(&format!("{principal}#{uid}")).ok()
}
