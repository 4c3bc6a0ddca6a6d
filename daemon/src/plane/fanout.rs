//! The fan-out writer: the durable `fanout` on `CHAT_<s>`.
//!
//! It turns each post into per-member copies in `INBOX_<s>`. Routing only: authorization stays
//! with the broker and with the trusted reader's re-check. Per post, fresh from the leader:
//! the sender check (a `from.id` that is not the subject's sender is terminated), the channel's
//! class (`channel ?? defaults ?? durable`), then either every member whose join/leave interval
//! admits the post's CHAT sequence (durable) or every uniquely resolved, ACL-covered @mention
//! (live). The post is acked only after every copy is stored; any failure naks it whole, and
//! the copies' duplicate-suppression ids make the retry idempotent (an id-less post carries
//! none, so its retry may surface twice, as the seed allows).

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::Message;
use async_nats::HeaderMap;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::metrics::GiveUp;
use crate::plane::acl::{AclRow, Acls};
use crate::plane::channels::{Channels, DeliveryClass};
use crate::plane::entry::{dedup_id, mentions, parse_chat_subject, sender_id, Plane3Entry, Reason};
use crate::plane::membership::Members;
use crate::plane::pump::{self, Settle};
use crate::plane::{PlaneCtx, PlaneError, StopRx};
use crate::wire::{LifecycleUid, Principal, FANOUT_DURABLE};

/// Posts handled concurrently (one lane per subject hash).
pub const FANOUT_LANES: usize = 32;

/// One copy to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub member: Principal,
    pub uid: LifecycleUid,
    pub reason: Reason,
    pub generation: u64,
}

/// The writer's handles on the buckets it reads.
#[derive(Clone)]
struct Writer {
    ctx: PlaneCtx,
    channels: Channels,
    members: Members,
    acls: Acls,
}

/// Creates (or binds) the `fanout` durable and starts its loop.
pub async fn bind(ctx: &PlaneCtx, stop: StopRx) -> Result<JoinHandle<()>, PlaneError> {
    let err = |detail: String| PlaneError {
        what: "fan-out writer",
        detail,
    };
    let config = pull::Config {
        durable_name: Some(FANOUT_DURABLE.to_string()),
        filter_subject: ctx.names.chat_all(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: ctx.config.ack_wait,
        deliver_policy: DeliverPolicy::New,
        ..Default::default()
    };
    let consumer =
        pump::bind_durable(ctx, "fan-out writer", &ctx.names.chat_stream(), config).await?;
    let writer = Writer {
        ctx: ctx.clone(),
        channels: Channels::open(ctx).await.map_err(|e| err(e.to_string()))?,
        members: Members::open(ctx).await.map_err(|e| err(e.to_string()))?,
        acls: Acls::open(ctx).await.map_err(|e| err(e.to_string()))?,
    };
    let ctx = ctx.clone();
    Ok(tokio::spawn(pump::run(
        ctx.clone(),
        consumer,
        ctx.names.chat_stream(),
        stop,
        FANOUT_LANES,
        "fan-out writer",
        move |msg, epoch| {
            let writer = writer.clone();
            async move {
                let verdict = writer.handle(&msg).await;
                pump::settle(&writer.ctx, &msg, epoch, verdict).await;
            }
        },
    )))
}

impl Writer {
    async fn handle(&self, msg: &Message) -> Settle {
        let seq = pump::stream_sequence(msg);
        let prefix = self.ctx.names.space().prefix();
        let Some((sender, channel)) = parse_chat_subject(&msg.subject, &prefix) else {
            tracing::warn!(subject = %msg.subject, "fan-out: malformed-subject; terminated");
            self.ctx.metrics.gave_up(GiveUp::Malformed);
            return Settle::Term;
        };
        let body: Value = match serde_json::from_slice(&msg.payload) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                tracing::warn!(subject = %msg.subject, "fan-out: malformed-json; terminated");
                self.ctx.metrics.gave_up(GiveUp::Malformed);
                return Settle::Term;
            }
        };
        if sender_id(&body) != Some(sender.dot_form().as_str()) {
            tracing::warn!(subject = %msg.subject, "fan-out: sender-mismatch; terminated");
            self.ctx.metrics.gave_up(GiveUp::Malformed);
            return Settle::Term;
        }
        let targets = match self.targets(&sender, &channel, seq, &body).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(subject = %msg.subject, error = %e, "fan-out: routing read failed; nak");
                return Settle::Nak;
            }
        };
        match store_copies(&self.ctx, &body, &channel, seq, &targets).await {
            Ok(stored) => {
                self.ctx.metrics.posts_copied(stored.len() as u64);
                Settle::Ack
            }
            Err(e) => {
                tracing::warn!(subject = %msg.subject, error = %e, "fan-out: a copy was not stored; nak");
                Settle::Nak
            }
        }
    }

    async fn targets(
        &self,
        sender: &Principal,
        channel: &str,
        seq: u64,
        body: &Value,
    ) -> Result<Vec<Target>, crate::kv::RowError> {
        // Both buckets proved current after this post was received (coalesced fences).
        let caches = &self.ctx.caches;
        let (channels, members) = tokio::join!(
            caches.channels.prove(&self.ctx),
            caches.members.prove(&self.ctx)
        );
        match self.channels.class_of_in(&channels, channel).await? {
            DeliveryClass::Durable => {
                let rows = self.members.of_channel_in(&members, channel).await?;
                // Each post is judged by the interval it was posted in, kept closed or current.
                Ok(rows
                    .into_iter()
                    .filter(|r| &r.member != sender)
                    .filter_map(|r| {
                        let generation = r.record.generation_admitting(seq)?;
                        Some(Target {
                            member: r.member,
                            uid: r.uid,
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
                let (presence, acls) = tokio::join!(
                    caches.presence.prove(&self.ctx),
                    caches.acl.prove(&self.ctx)
                );
                let roster = crate::plane::presence::live_roster_in(
                    &self.ctx,
                    &presence,
                    crate::journal::epoch_ms(),
                )
                .await?;
                let mut out: Vec<Target> = Vec::new();
                for name in names {
                    let crate::plane::presence::Resolved::Unique(peer) =
                        crate::plane::presence::resolve(&roster, &name)
                    else {
                        continue;
                    };
                    if &peer == sender || out.iter().any(|t| t.member == peer) {
                        continue;
                    }
                    // The target lifecycle is its single live ACL row, not presence.
                    let Ok((uid, _)) = self.acls.single_live_in(&acls, &peer).await else {
                        continue;
                    };
                    // Fresh read of that row: the *current* allowSubscribe must cover it.
                    if let AclRow::Present { record, .. } =
                        self.acls.read_in(&acls, &peer, &uid).await?
                    {
                        if record.covers(channel) {
                            out.push(Target {
                                member: peer,
                                uid,
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
) -> Result<Vec<u64>, String> {
    let work = async {
        let mut acks = Vec::with_capacity(targets.len());
        for t in targets {
            let entry = Plane3Entry {
                msg: msg.clone(),
                channel: channel.to_string(),
                seq,
                reason: t.reason,
                generation: t.generation,
            };
            let body = serde_json::to_vec(&entry).map_err(|e| e.to_string())?;
            let mut headers = HeaderMap::new();
            if let Some(id) = dedup_id(msg, &t.member, &t.uid, t.generation) {
                headers.insert("Nats-Msg-Id", id.as_str());
            }
            let subject = ctx.names.dinbox_subject(&t.member, &t.uid);
            let ack = ctx
                .js
                .publish_with_headers(subject.clone(), headers, body.into())
                .await
                .map_err(|e| format!("publish {subject}: {}", crate::kv::broker_words(&e)))?;
            acks.push((subject, ack));
        }
        let mut stored = Vec::with_capacity(acks.len());
        for (subject, ack) in acks {
            let ack = ack
                .await
                .map_err(|e| format!("store {subject}: {}", crate::kv::broker_words(&e)))?;
            stored.push(ack.sequence);
        }
        Ok(stored)
    };
    match tokio::time::timeout(COPY_BOUND, work).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "copies not stored within {} ms",
            COPY_BOUND.as_millis()
        )),
    }
}
