//! Activation catch-up for a durable join.
//!
//! A join's cursor is the CHAT frontier read *before* its member row is written. A post captured
//! in between (sequence above the cursor) may already have been routed by the fan-out writer,
//! which read the channel's members before the row existed, so the new member would never get
//! its copy. After the row is written the daemon therefore copies the posts of
//! `(joinCursor, frontier-after-write]` itself. The fan-out writer copies every later post (it
//! reads the row fresh), and a post it also copied lands twice under one dedup id, which the
//! broker stores once (an id-less post may surface twice, docs/data-path.md).

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use futures::StreamExt;
use serde_json::Value;

use crate::plane::channels::{Channels, DeliveryClass};
use crate::plane::fanout::{store_copies, Target};
use crate::plane::membership::chat_frontier;
use crate::plane::PlaneCtx;
use crate::wire::{parse_chat_subject, sender_id, Reason};
use crate::wire::{LifecycleUid, Principal, SpaceNames};

/// Most posts one catch-up copies; the window is the few milliseconds of a join's row write.
pub const CATCH_UP_MAX_POSTS: usize = 10_000;
/// Bound on the whole catch-up.
const CATCH_UP_BOUND: Duration = Duration::from_secs(10);

/// Copies to `member` the posts on `channel` in `(join_cursor, frontier]` (frontier read now).
/// Returns the `INBOX_<s>` sequences of the copies stored (so a refused join can take them back).
pub async fn activate(
    ctx: &PlaneCtx,
    channel: &str,
    member: &Principal,
    uid: &LifecycleUid,
    generation: u64,
    join_cursor: u64,
) -> Result<Vec<u64>, String> {
    let frontier = chat_frontier(ctx)
        .await
        .map_err(|e| format!("the CHAT frontier: {e}"))?;
    if frontier <= join_cursor {
        return Ok(Vec::new());
    }
    let channels = Channels::open(ctx)
        .await
        .map_err(|e| format!("the channel class: {e}"))?;
    let class = channels
        .class_of(channel)
        .await
        .map_err(|e| format!("the channel class: {e}"))?;
    if class != DeliveryClass::Durable {
        return Ok(Vec::new());
    }
    match tokio::time::timeout(
        CATCH_UP_BOUND,
        copy_range(ctx, channel, member, uid, generation, join_cursor, frontier),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(format!(
            "not finished within {} ms",
            CATCH_UP_BOUND.as_millis()
        )),
    }
}

/// The first sequence after a join cursor read from a stored row; a cursor at `u64::MAX` is
/// refused instead of overflowing.
fn first_after(join_cursor: u64) -> Result<u64, String> {
    join_cursor
        .checked_add(1)
        .ok_or_else(|| format!("the stored join cursor {join_cursor} has no sequence after it"))
}

async fn copy_range(
    ctx: &PlaneCtx,
    channel: &str,
    member: &Principal,
    uid: &LifecycleUid,
    generation: u64,
    join_cursor: u64,
    frontier: u64,
) -> Result<Vec<u64>, String> {
    let stream = ctx
        .js
        .get_stream_no_info(ctx.names.chat_stream())
        .await
        .map_err(|e| crate::kv::broker_words(&e))?;
    // The reference's activation consumer: `cu_<o>-<a>-<uid>_<generation>`, one filter.
    let name = format!(
        "cu_{}_{generation}",
        SpaceNames::dlv_durable(member, uid).trim_start_matches("dlv_")
    );
    let consumer = stream
        .create_consumer(pull::Config {
            name: Some(name.clone()),
            filter_subject: ctx.names.chat_read_subject(channel),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: first_after(join_cursor)?,
            },
            ack_policy: AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            memory_storage: true,
            ..Default::default()
        })
        .await
        .map_err(|e| crate::kv::broker_words(&e))?;
    let result = async {
        let mut copied = Vec::new();
        let mut seen = 0usize;
        while seen < CATCH_UP_MAX_POSTS {
            let batch = consumer
                .fetch()
                .max_messages(256)
                .expires(Duration::from_millis(500))
                .messages()
                .await
                .map_err(|e| e.to_string())?;
            let mut batch = Box::pin(batch);
            let mut got = 0usize;
            let mut past = false;
            while let Some(msg) = batch.next().await {
                let msg = msg.map_err(|e| e.to_string())?;
                got += 1;
                seen += 1;
                let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(u64::MAX);
                if seq > frontier {
                    past = true;
                    break;
                }
                let prefix = ctx.names.space().prefix();
                let Some((sender, ch)) = parse_chat_subject(&msg.subject, &prefix) else {
                    continue;
                };
                if ch != channel || &sender == member {
                    continue;
                }
                let Ok(body) = serde_json::from_slice::<Value>(&msg.payload) else {
                    continue;
                };
                if sender_id(&body) != Some(sender.dot_form().as_str()) {
                    continue;
                }
                let target = Target {
                    member: member.clone(),
                    uid: uid.clone(),
                    reason: Reason::DurableChannel,
                    generation,
                };
                copied.extend(
                    store_copies(ctx, &body, channel, seq, std::slice::from_ref(&target)).await?,
                );
            }
            if past || got == 0 {
                break;
            }
        }
        Ok(copied)
    }
    .await;
    let _ = stream.delete_consumer(&name).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation seen failing: `Ok(join_cursor + 1)` (debug build: "attempt to add with
    /// overflow" at the top of the range).
    #[test]
    fn a_join_cursor_at_the_top_of_the_range_is_refused_not_overflowed() {
        assert_eq!(first_after(0), Ok(1));
        assert_eq!(first_after(u64::MAX - 1), Ok(u64::MAX));
        let e = first_after(u64::MAX).expect_err("refused");
        assert!(e.contains("has no sequence after it"), "{e}");
    }
}
