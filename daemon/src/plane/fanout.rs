//! The fan-out writer: the durable `fanout` on `CHAT_<s>`.
//!
//! It turns each post into per-member copies in `INBOX_<s>`. Routing only: authorization stays
//! with the broker and with the trusted reader's re-check. Per batch of a lane, one coalesced
//! fence per bucket proves the channel and member caches current (or per-key leader reads when
//! not proved, `plane/cache.rs`); then per post: the sender check (a `from.id` that is not the
//! subject's sender is terminated), the channel's class (`channel ?? defaults ?? durable`), then
//! either every member whose join/leave interval admits the post's CHAT sequence (durable) or
//! every uniquely resolved, ACL-covered @mention (live). Copies of a post are published in lane
//! order without waiting (at most [`MAX_COPIES_IN_FLIGHT`] unacknowledged: a post with more
//! members than that awaits its oldest copies' acks as it publishes the rest), and the post is
//! acked only after every copy is stored; any failure naks it whole, and the copies'
//! duplicate-suppression ids make the retry idempotent (an id-less post carries none, so its
//! retry may surface twice, docs/data-path.md). A post's body is serialised once for all its
//! copies.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::base::GiveUp;
use crate::plane::acl::{AclRow, Acls};
use crate::plane::cache::View;
use crate::plane::channels::{Channels, DeliveryClass};
use crate::plane::membership::Members;
use crate::plane::pump::{self, Arrival, Pulled, Settle};
use crate::plane::{BrokerError, BrokerErrorKind, PlaneCtx, PlaneError, PlaneErrorKind, StopRx};
use crate::wire::{mentions, message_id, parse_chat_subject, sender_id, Reason};
use crate::wire::{LifecycleNames, Principal, FANOUT_DURABLE};

/// Lanes of the writer (by CHAT subject: one sender's posts on one channel stay in order).
pub const FANOUT_LANES: usize = 32;
/// Copies published and not yet acknowledged by JetStream, over all lanes. With the reader's
/// [`crate::plane::reader::MAX_HANDOFFS_IN_FLIGHT`] it stays below
/// [`crate::plane::CONTEXT_PENDING_ACKS`] (asserted there).
pub const MAX_COPIES_IN_FLIGHT: usize = 2048;
/// `max_ack_pending` of `fanout`: posts pulled and not yet acked (the bound of the lane queues).
pub const FANOUT_MAX_ACK_PENDING: i64 = 1000;

/// One copy to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The member lifecycle's names (its INBOX subject and dedup id built from them).
    pub names: Arc<LifecycleNames>,
    pub reason: Reason,
    pub generation: u64,
}

/// The writer's handles on the buckets it reads.
struct Writer {
    ctx: PlaneCtx,
    channels: Channels,
    members: Members,
    acls: Acls,
    copies: Arc<Semaphore>,
}

/// A post routed: what to copy where.
struct Routed {
    body: Value,
    channel: String,
    seq: u64,
    targets: Vec<Target>,
}

/// Creates (or binds) the `fanout` durable and starts its loop.
pub async fn bind(ctx: &PlaneCtx, stop: StopRx) -> Result<JoinHandle<()>, PlaneError> {
    let err = |detail: String| PlaneError::new(PlaneErrorKind::Bucket, "fan-out writer", detail);
    let config = pull::Config {
        durable_name: Some(FANOUT_DURABLE.to_string()),
        filter_subject: ctx.names.chat_all(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: ctx.config.ack_wait,
        deliver_policy: DeliverPolicy::New,
        max_ack_pending: FANOUT_MAX_ACK_PENDING,
        ..Default::default()
    };
    let consumer =
        pump::bind_durable(ctx, "fan-out writer", &ctx.names.chat_stream(), config).await?;
    let writer = Arc::new(Writer {
        ctx: ctx.clone(),
        channels: Channels::open(ctx).await.map_err(|e| err(e.to_string()))?,
        members: Members::open(ctx).await.map_err(|e| err(e.to_string()))?,
        acls: Acls::open(ctx).await.map_err(|e| err(e.to_string()))?,
        copies: Arc::new(Semaphore::new(MAX_COPIES_IN_FLIGHT)),
    });
    let ctx = ctx.clone();
    let asks = ctx.clone();
    Ok(tokio::spawn(pump::run(
        ctx.clone(),
        consumer,
        ctx.names.chat_stream(),
        stop,
        FANOUT_LANES,
        "fan-out writer",
        vec![ctx.caches.channels.clone(), ctx.caches.members.clone()],
        move || {
            let caches = &asks.caches;
            Arrival {
                channels: caches.channels.ask(&asks),
                members: caches.members.ask(&asks),
                ..Arrival::default()
            }
        },
        move |batch| writer.clone().handle_batch(batch),
    )))
}

impl Writer {
    /// Routes a lane batch from caches proved once for it, publishes each post's copies in
    /// order, and settles each post when its copies are stored, in order, by one task per batch
    /// (started with the batch, so the lane goes on with the next batch and the copy slots it
    /// holds are given back as the acks come in).
    async fn handle_batch(self: Arc<Self>, batch: Vec<Pulled>) {
        // Both buckets proved current after every post of the batch was received: by the fences
        // the batch's last post's burst asked for once it had arrived (a lane's queue is in
        // arrival order, so that burst arrived last).
        let Some(arrival) = batch.last().map(|p| p.arrival.clone()) else {
            return;
        };
        let caches = &self.ctx.caches;
        let (channels, members) = tokio::join!(
            caches.channels.prove_asked(&self.ctx, arrival.channels),
            caches.members.prove_asked(&self.ctx, arrival.members)
        );
        let mut live: Option<(View<'_>, View<'_>)> = None;
        let mut settles: Option<mpsc::UnboundedSender<Copies>> = None;
        for pulled in batch {
            let routed = match self.route(&pulled, &channels, &members, &mut live).await {
                Ok(r) => r,
                Err(verdict) => {
                    pulled.settle(&self.ctx, verdict).await;
                    continue;
                }
            };
            tracing::debug!(
                seq = routed.seq,
                targets = routed.targets.len(),
                proved = matches!(members, View::Proved(_)),
                "fan-out: routed"
            );
            if routed.targets.is_empty() {
                pulled.settle(&self.ctx, Settle::Ack).await;
                continue;
            }
            let want = routed.targets.len().min(MAX_COPIES_IN_FLIGHT) as u32;
            let Ok(permits) = self.copies.clone().acquire_many_owned(want).await else {
                return;
            };
            let copies = Copies {
                sent: publish_copies(
                    &self.ctx,
                    &routed.body,
                    &routed.channel,
                    routed.seq,
                    &routed.targets,
                )
                .await,
                bound: Instant::now() + COPY_BOUND,
                pulled,
                _permits: permits,
            };
            let tx = settles.get_or_insert_with(|| settle_in_order(self.ctx.clone()));
            // The settling task is alive until this sender is dropped, after the batch.
            let _ = tx.send(copies);
        }
    }

    async fn route<'a>(
        &'a self,
        pulled: &Pulled,
        channels: &View<'_>,
        members: &View<'_>,
        live: &mut Option<(View<'a>, View<'a>)>,
    ) -> Result<Routed, Settle> {
        let (msg, seq) = (&pulled.msg, pulled.stream_sequence);
        let Some((sender, channel)) = parse_chat_subject(&msg.subject, self.ctx.names.prefix())
        else {
            tracing::warn!(subject = %msg.subject, "fan-out: malformed-subject; terminated");
            self.ctx.metrics.gave_up(GiveUp::Malformed);
            return Err(Settle::Term);
        };
        let body: Value = match serde_json::from_slice(&msg.payload) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                tracing::warn!(subject = %msg.subject, "fan-out: malformed-json; terminated");
                self.ctx.metrics.gave_up(GiveUp::Malformed);
                return Err(Settle::Term);
            }
        };
        if sender_id(&body) != Some(sender.dot_form().as_str()) {
            tracing::warn!(subject = %msg.subject, "fan-out: sender-mismatch; terminated");
            self.ctx.metrics.gave_up(GiveUp::Malformed);
            return Err(Settle::Term);
        }
        let targets = match self
            .targets(&sender, &channel, seq, &body, channels, members, live)
            .await
        {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(subject = %msg.subject, error = %e, "fan-out: routing read failed; nak");
                return Err(Settle::Nak);
            }
        };
        Ok(Routed {
            body,
            channel,
            seq,
            targets,
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn targets<'a>(
        &'a self,
        sender: &Principal,
        channel: &str,
        seq: u64,
        body: &Value,
        channels: &View<'_>,
        members: &View<'_>,
        live: &mut Option<(View<'a>, View<'a>)>,
    ) -> Result<Vec<Target>, crate::base::RowError> {
        match self.channels.class_of_in(channels, channel).await? {
            DeliveryClass::Durable => {
                let rows = self.members.of_channel_in(members, channel).await?;
                // Each post is judged by the interval it was posted in, kept closed or current.
                Ok(rows
                    .iter()
                    .filter_map(|r| {
                        let names = r.names.as_ref().filter(|n| n.member != *sender)?;
                        let generation = r.record.as_ref().ok()?.generation_admitting(seq)?;
                        Some(Target {
                            names: names.clone(),
                            reason: Reason::DurableChannel,
                            generation,
                        })
                    })
                    .collect())
            }
            DeliveryClass::Live => {
                let names = mentions(body);
                if names.is_empty() {
                    return Ok(Vec::new());
                }
                if live.is_none() {
                    // Proved once per batch, the first time a live post needs them.
                    let caches = &self.ctx.caches;
                    *live = Some(tokio::join!(
                        caches.presence.prove(&self.ctx),
                        caches.acl.prove(&self.ctx)
                    ));
                }
                let Some((presence, acls)) = live.as_ref() else {
                    return Ok(Vec::new());
                };
                let roster = crate::plane::presence::live_roster_in(
                    &self.ctx,
                    presence,
                    crate::base::epoch_ms(),
                )
                .await?;
                let mut out: Vec<Target> = Vec::new();
                for name in names {
                    let crate::plane::presence::Resolved::Unique(peer) =
                        crate::plane::presence::resolve(&roster, &name)
                    else {
                        continue;
                    };
                    if &peer == sender || out.iter().any(|t| t.names.member == peer) {
                        continue;
                    }
                    // The target lifecycle is its single live ACL row, not presence.
                    let Ok((uid, _)) = self.acls.single_live_in(acls, &peer).await else {
                        continue;
                    };
                    // The *current* allowSubscribe of that row must cover the channel.
                    if let AclRow::Present { record, .. } =
                        self.acls.read_in(acls, &peer, &uid).await?
                    {
                        if record.covers(channel) {
                            out.push(Target {
                                names: Arc::new(self.ctx.names.lifecycle(&peer, &uid)),
                                reason: Reason::LiveMention,
                                generation: 0,
                            });
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// One post's copies sent and waiting for their acks: the post is settled once they all came
/// (or the bound passed, or one failed), and its copy slots are given back then.
struct Copies {
    pulled: Pulled,
    sent: Result<Sent, BrokerError>,
    /// Every copy must be stored by then ([`COPY_BOUND`] after the last was sent).
    bound: Instant,
    _permits: OwnedSemaphorePermit,
}

/// Starts the task that settles one batch's posts in the order their copies were sent.
fn settle_in_order(ctx: PlaneCtx) -> mpsc::UnboundedSender<Copies> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Copies>();
    tokio::spawn(async move {
        while let Some(Copies {
            pulled,
            sent,
            bound,
            ..
        }) = rx.recv().await
        {
            let stored = match sent {
                Ok(acks) => stored_by(acks, bound).await,
                Err(e) => Err(e),
            };
            let verdict = match stored {
                Ok(stored) => {
                    ctx.metrics.posts_copied(stored.len() as u64);
                    Settle::Ack
                }
                Err(e) => {
                    tracing::warn!(subject = %pulled.msg.subject, error = %e, "fan-out: a copy was not stored; nak");
                    Settle::Nak
                }
            };
            pulled.settle(&ctx, verdict).await;
        }
    });
    tx
}

/// Bound on storing all copies of one post.
const COPY_BOUND: Duration = Duration::from_secs(10);

/// Publishes every copy and waits until the broker stored each (or reports the first failure).
/// Returns the `INBOX_<s>` sequences the copies are stored at (a duplicate names the stored one).
pub async fn store_copies(
    ctx: &PlaneCtx,
    msg: &Value,
    channel: &str,
    seq: u64,
    targets: &[Target],
) -> Result<Vec<u64>, BrokerError> {
    let acks = tokio::time::timeout(COPY_BOUND, publish_copies(ctx, msg, channel, seq, targets))
        .await
        .map_err(|elapsed| {
            let text = format!("copies not sent within {} ms", COPY_BOUND.as_millis());
            BrokerError::new(BrokerErrorKind::TimedOut, text).source(elapsed)
        })??;
    stored_by(acks, Instant::now() + COPY_BOUND).await
}

/// One post's copies as published: the INBOX sequences of those already stored (in order),
/// then the acks still awaited.
struct Sent {
    stored: Vec<u64>,
    pending: VecDeque<(Subject, PublishAckFuture)>,
}

/// Publishes every copy of one post, in order, without waiting for the acks while fewer than
/// [`MAX_COPIES_IN_FLIGHT`] of its copies are unacknowledged; beyond that, the oldest copy's
/// ack is awaited before the next copy is published. The message body is serialised once
/// ([`EntryBytes`]).
///
/// Why the window: the JetStream context holds a slot for every publish whose ack future is
/// alive ([`crate::plane::CONTEXT_PENDING_ACKS`], 5,000), and a publish without a free slot
/// waits for one. Holding every ack of a post until all its copies were published made a post
/// to a channel of more than about 5,000 durable members wait forever on its own acks: the
/// lane, then every lane, stopped (seen in `smoke bench-scale` with a 10,000-member channel:
/// 5,000 copies stored, the writer idle, the post never acked).
async fn publish_copies(
    ctx: &PlaneCtx,
    msg: &Value,
    channel: &str,
    seq: u64,
    targets: &[Target],
) -> Result<Sent, BrokerError> {
    let bytes = EntryBytes::new(msg, channel, seq)
        .map_err(|e| BrokerError::new(BrokerErrorKind::Unsent, e.to_string()).source(e))?;
    let id = message_id(msg);
    let window = MAX_COPIES_IN_FLIGHT;
    let mut stored = Vec::with_capacity(targets.len().saturating_sub(window));
    let mut acks = VecDeque::with_capacity(targets.len().min(window));
    // Copies with the same reason and generation (every member of a channel, usually) share
    // one entry's bytes.
    let mut last: Option<((Reason, u64), Bytes)> = None;
    for t in targets {
        let mut headers = HeaderMap::new();
        if let Some(id) = t.names.dedup_id(id, t.generation) {
            headers.insert("Nats-Msg-Id", id.as_str());
        }
        let entry = match &last {
            Some((of, entry)) if *of == (t.reason, t.generation) => entry.clone(),
            _ => {
                let entry = bytes.entry(t.reason, t.generation);
                last = Some(((t.reason, t.generation), entry.clone()));
                entry
            }
        };
        if acks.len() >= window {
            if let Some((subject, ack)) = acks.pop_front() {
                stored.push(stored_one(subject, ack).await?);
            }
        }
        let subject = &t.names.dinbox;
        let ack = ctx
            .js
            .publish_with_headers(subject.clone(), headers, entry)
            .await
            .map_err(|e| {
                BrokerError::quoting(
                    BrokerErrorKind::Unsent,
                    format_args!("publish {subject}: "),
                    e,
                )
            })?;
        acks.push_back((subject.clone(), ack));
    }
    Ok(Sent {
        stored,
        pending: acks,
    })
}

/// The INBOX sequence one copy was stored at (its ack awaited within the context's timeout).
async fn stored_one(subject: Subject, ack: PublishAckFuture) -> Result<u64, BrokerError> {
    let ack = ack
        .await
        .map_err(|e| BrokerError::ack(format_args!("store {subject}: "), e))?;
    Ok(ack.sequence)
}

/// Waits until every publish is stored, at the latest by `bound`; the INBOX sequences, or the
/// first failure.
async fn stored_by(sent: Sent, bound: Instant) -> Result<Vec<u64>, BrokerError> {
    let Sent {
        mut stored,
        pending,
    } = sent;
    let work = async {
        for (subject, ack) in pending {
            stored.push(stored_one(subject, ack).await?);
        }
        Ok(stored)
    };
    match tokio::time::timeout_at(bound, work).await {
        Ok(r) => r,
        Err(elapsed) => Err(BrokerError::new(
            BrokerErrorKind::TimedOut,
            format!("copies not stored within {} ms", COPY_BOUND.as_millis()),
        )
        .source(elapsed)),
    }
}

/// A `Plane3Entry` serialised once per post: everything but `reason` and `generation` is the
/// same for every copy, so only those are appended per member.
struct EntryBytes {
    head: String,
}

impl EntryBytes {
    fn new(msg: &Value, channel: &str, seq: u64) -> Result<EntryBytes, serde_json::Error> {
        Ok(EntryBytes {
            head: format!(
                "{{\"msg\":{},\"channel\":{},\"seq\":{seq},\"reason\":",
                serde_json::to_string(msg)?,
                serde_json::to_string(channel)?
            ),
        })
    }

    fn entry(&self, reason: Reason, generation: u64) -> Bytes {
        let reason = match reason {
            Reason::DurableChannel => "\"durable-channel\"",
            Reason::LiveMention => "\"live-mention\"",
        };
        Bytes::from(format!(
            "{}{reason},\"generation\":{generation}}}",
            self.head
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Plane3Entry;

    /// Mutation: spelling a reason differently from its serde name (e.g. `durable_channel`)
    /// fails the round trip.
    #[test]
    fn an_entry_serialised_once_is_the_entry_serde_writes() {
        let msg = serde_json::json!({"id":"m1","text":"a \"quoted\" line","from":{"id":"local.a"}});
        let bytes = EntryBytes::new(&msg, "eng.alerts", 42).unwrap();
        for (reason, generation) in [(Reason::DurableChannel, 3), (Reason::LiveMention, 0)] {
            let ours: Plane3Entry =
                serde_json::from_slice(&bytes.entry(reason, generation)).unwrap();
            let theirs = Plane3Entry {
                msg: msg.clone(),
                channel: "eng.alerts".into(),
                seq: 42,
                reason,
                generation,
            };
            assert_eq!(ours, theirs);
            let theirs_bytes: Value = serde_json::to_value(&theirs).unwrap();
            let ours_value: Value =
                serde_json::from_slice(&bytes.entry(reason, generation)).unwrap();
            assert_eq!(ours_value, theirs_bytes);
        }
    }
}
