//! The trusted reader: the durable `reader` on `INBOX_<s>`.
//!
//! Agents hold no content-bearing read on the mixed per-member store; the reader re-authorizes
//! each entry and hands the authorized frame to the member's own `dlv_` durable. Per lane batch,
//! one coalesced fence per bucket proves the ACL and member caches current (per-key leader reads
//! when not proved, `plane/cache.rs`); this re-check is the reader's own and never skipped
//! because the writer checked. Handoffs are published in lane order without waiting (at most
//! [`MAX_HANDOFFS_IN_FLIGHT`] unacknowledged), each entry is acked after its handoff's ack, and
//! each burst's boundary ticket (`plane/boundary.rs`), taken when it arrived and before its
//! fences were asked, is held until the last of its entries is settled.
//! Per entry:
//!
//! - owner with no (or a garbled) ACL row: nak, and after ten redeliveries (the eleventh
//!   delivery) term with the
//!   reference warning. Term does not delete: the entry stays in the stream, because a missing
//!   row does not prove the owner is gone;
//! - retired lifecycle (tombstone on its ACL row): delete the entry from `INBOX_<s>` (an entry
//!   the stream no longer holds counts as removed), remove the lifecycle's member row for a
//!   durable-channel entry (best effort, a warning on failure), and ack only after the delete
//!   succeeded. A failed delete naks and is given up after ten redeliveries. A daemon that stops
//!   serving while the delete is in flight neither acks nor terms;
//! - ACL no longer covering the channel, or (durable-channel entries) a sequence outside the
//!   member's join/leave interval: ack without surfacing (a leave is a hard read boundary);
//! - otherwise publish the frame (header `Cotal-Delivery-Frame: 1`) to the member's
//!   `dlv.<o>.<a>.<uid>` and ack the entry only once that publish is acknowledged, so a crash
//!   between handoff and surfacing loses nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::stream::DeleteMessageErrorKind;
use async_nats::HeaderMap;
use bytes::Bytes;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::base::{GiveUp, RowError};
use crate::plane::acl::RowDecodeError;
use crate::plane::acl::{AclDecoded, Acls};
use crate::plane::cache::View;
use crate::plane::membership::{MemberDecoded, MemberRead, Members};
use crate::plane::pump::{self, Arrival, Pulled, Settle};
use crate::plane::{BrokerError, BrokerErrorKind, PlaneCtx, PlaneError, PlaneErrorKind, StopRx};
use crate::wire::{parse_dinbox_subject, EntryRead, LifecycleNames, Reason};
use crate::wire::{LifecycleUid, Principal, SpaceNames, DELIVERY_FRAME_HEADER, READER_DURABLE};

/// Lanes of the reader (by INBOX subject: one member lifecycle's entries stay in order). Each
/// lane batch costs two fenced cache proofs and a settling task whatever its
/// size, so fewer lanes with larger batches cost less CPU per frame than one lane per few
/// members (64 lanes gave a lane one or two of 100 members' subjects; docs/performance-history.md),
/// and handoffs stay pipelined within a lane.
pub const READER_LANES: usize = 16;
/// Handoffs published and not yet acknowledged by JetStream, over all lanes.
pub const MAX_HANDOFFS_IN_FLIGHT: usize = 1024;
/// Bound on one handoff publish (or one delete) being acknowledged.
const HANDOFF_BOUND: Duration = crate::base::BROKER_BOUND;
/// Member lifecycles whose names the reader keeps built (by INBOX subject), entries; the memo
/// starts over when it is full. About 500 bytes each (8 MB full). At 4,096 a channel of 10,000
/// members cycled through it and missed on every copy: 18.1-18.9 µs of daemon CPU per frame
/// against 17.0-17.9 at this size (docs/performance-history.md, "Fifth pass").
pub const READER_NAMES_MAX: usize = 16_384;
/// Member lifecycles one lane batch keeps its rows for ([`BatchRows`]), entries; the list
/// starts over when it is full (a lookup compares at most this many subjects).
const BATCH_LIFECYCLES_MAX: usize = 32;

/// The reference warning for an entry given up because its owner has no ACL row, after
/// `redeliveries` deliveries past the first.
pub fn unknown_owner_warning(owner: &str, redeliveries: i64) -> String {
    format!("plane-3 reader: gave up on entry for unknown owner {owner} after {redeliveries} redeliveries")
}

/// One handoff sent and waiting for its ack: the entry is settled once it comes (or the bound
/// passes), and the handoff slot is given back then.
struct Handoff {
    pulled: Pulled,
    sent: Result<PublishAckFuture, BrokerError>,
    /// The ack must arrive by then ([`HANDOFF_BOUND`] after the publish was sent).
    bound: Instant,
    _permit: OwnedSemaphorePermit,
}

/// The rows one lane batch read for one member lifecycle (its INBOX subject): read once, the
/// first time an entry of the batch needs them, and shared by its later entries. Each read is
/// of the caches proved for this batch (a fence sent after every entry of it was received), or
/// a per-key leader read made after that, so it is as current for every entry of the batch as
/// a read per entry would be (docs/data-path.md, "Trusted reader").
struct Lifecycle {
    subject: async_nats::Subject,
    names: Arc<LifecycleNames>,
    /// The ACL row once read (`Some(None)`: absent).
    acl: Option<Option<Arc<AclDecoded>>>,
    /// Member rows read, by channel.
    members: Vec<(String, Option<Arc<MemberDecoded>>)>,
}

/// The member lifecycles one lane batch has met, most recent last.
#[derive(Default)]
struct BatchRows {
    seen: Vec<Lifecycle>,
}

impl BatchRows {
    /// The lifecycle `subject` names, if this batch met it.
    fn find(&mut self, subject: &str) -> Option<&mut Lifecycle> {
        self.seen
            .iter_mut()
            .rev()
            .find(|l| l.subject.as_str() == subject)
    }

    fn add(&mut self, subject: &async_nats::Subject, names: Arc<LifecycleNames>) -> &mut Lifecycle {
        if self.seen.len() >= BATCH_LIFECYCLES_MAX {
            self.seen.clear();
        }
        self.seen.push(Lifecycle {
            subject: subject.clone(),
            names,
            acl: None,
            members: Vec::new(),
        });
        let last = self.seen.len() - 1;
        &mut self.seen[last]
    }
}

/// The last frame a lane batch built, by what it depends on (`EntryRead::frame_key`): a post's
/// copies to the members of one lane come one after another with the same message and channel,
/// so they share one frame's bytes instead of each parsing the message and writing the frame
/// again.
#[derive(Default)]
struct LastFrame {
    /// The message's bytes and the channel (`None`: built for an entry parsed whole, never reused).
    key: Option<(String, String)>,
    body: Bytes,
    id: String,
}

impl LastFrame {
    /// `entry`'s frame and its message's id: the last one when `entry` has its key, else built
    /// (and kept). An error is [`EntryRead::frame`]'s.
    fn of(&mut self, entry: &EntryRead<'_>) -> Result<(Bytes, &str), serde_json::Error> {
        let key = entry.frame_key();
        let same = matches!((&self.key, key), (Some((m, c)), Some((msg, channel))) if m == msg && c == channel);
        if !same {
            let (body, id) = entry.frame()?;
            self.body = Bytes::from(body);
            self.id = id.into_owned();
            self.key = key.map(|(msg, channel)| (msg.to_string(), channel.to_string()));
        }
        Ok((self.body.clone(), &self.id))
    }
}

struct Reader {
    ctx: PlaneCtx,
    acls: Acls,
    members: Members,
    handoffs: Arc<Semaphore>,
    /// The names of each member lifecycle an INBOX subject names, built once: they depend on
    /// the subject only (every decision is still made from the rows per entry).
    names: Mutex<HashMap<String, Arc<LifecycleNames>>>,
}

/// Creates (or binds) the `reader` durable (exactly one filter subject: the `delivery` grant names it).
pub async fn bind(ctx: &PlaneCtx, stop: StopRx) -> Result<JoinHandle<()>, PlaneError> {
    let err = |detail: String| PlaneError::new(PlaneErrorKind::Bucket, "trusted reader", detail);
    let config = pull::Config {
        durable_name: Some(READER_DURABLE.to_string()),
        filter_subject: ctx.names.dinbox_all(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: ctx.config.ack_wait,
        deliver_policy: DeliverPolicy::All,
        max_ack_pending: ctx.config.reader_max_ack_pending,
        ..Default::default()
    };
    let consumer =
        pump::bind_durable(ctx, "trusted reader", &ctx.names.inbox_stream(), config).await?;
    let reader = Arc::new(Reader {
        ctx: ctx.clone(),
        acls: Acls::open(ctx).await.map_err(|e| err(e.to_string()))?,
        members: Members::open(ctx).await.map_err(|e| err(e.to_string()))?,
        handoffs: Arc::new(Semaphore::new(MAX_HANDOFFS_IN_FLIGHT)),
        names: Mutex::new(HashMap::new()),
    });
    let asks = ctx.clone();
    Ok(tokio::spawn(pump::run(
        ctx.clone(),
        consumer,
        ctx.names.inbox_stream(),
        stop,
        READER_LANES,
        "trusted reader",
        vec![ctx.caches.acl.clone(), ctx.caches.members.clone()],
        move || {
            // The ticket first: the fences asked for next are sent after it was taken.
            let ticket = asks.handoffs.ticket();
            let caches = &asks.caches;
            Arrival {
                ticket: Some(ticket),
                acl: caches.acl.ask(&asks),
                members: caches.members.ask(&asks),
                channels: None,
            }
        },
        move |batch| reader.clone().handle_batch(batch),
    )))
}

impl Reader {
    /// Whether `pulled` has been redelivered the ceiling's number of times: "given up after
    /// ten redeliveries" (docs/operations.md) is the eleventh delivery (the reference terms at its tenth,
    /// docs/conformance.md says why this one does not).
    fn given_up(&self, pulled: &Pulled) -> bool {
        redeliveries(pulled) >= self.ctx.config.reader_max_redeliveries
    }

    /// The member lifecycle an INBOX subject names, with its names (`None` when the subject
    /// does not parse).
    fn names_of(&self, subject: &str) -> Option<Arc<LifecycleNames>> {
        let mut memo = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(names) = memo.get(subject) {
            return Some(names.clone());
        }
        let (member, uid) = parse_dinbox_subject(subject, self.ctx.names.prefix())?;
        let names = Arc::new(self.ctx.names.lifecycle(&member, &uid));
        if memo.len() >= READER_NAMES_MAX {
            memo.clear();
        }
        memo.insert(subject.to_string(), names.clone());
        Some(names)
    }

    /// Re-checks a lane batch against caches proved once for it and hands off the authorized
    /// frames in order; each entry is settled when its handoff is acknowledged, in order, by one
    /// task per batch (started with the batch, so the lane goes on with the next batch and the
    /// handoff slots it holds are given back as the acks come in).
    async fn handle_batch(self: Arc<Self>, batch: Vec<Pulled>) {
        // The fences its entries' burst asked for when they arrived, after the burst's boundary
        // ticket was taken (each entry holds it until settled: a leave answered after its write
        // waits for it, the strict leave boundary). The batch's last entry arrived last (a
        // lane's queue is in arrival order), so its fences serve every entry of the batch.
        let Some(arrival) = batch.last().map(|p| p.arrival.clone()) else {
            return;
        };
        let caches = &self.ctx.caches;
        let (acls, members) = tokio::join!(
            caches.acl.prove_asked(&self.ctx, arrival.acl),
            caches.members.prove_asked(&self.ctx, arrival.members)
        );
        let mut settles: Option<mpsc::UnboundedSender<Handoff>> = None;
        let mut rows = BatchRows::default();
        let mut last_frame = LastFrame::default();
        for pulled in batch {
            let (names, entry) = match self.check(&pulled, &acls, &members, &mut rows).await {
                Ok(surface) => surface,
                Err(verdict) => {
                    pulled.settle(&self.ctx, verdict).await;
                    continue;
                }
            };
            let (body, id) = match last_frame.of(&entry) {
                Ok(frame) => frame,
                Err(e) => {
                    // Only a message serde cannot hold as a value gets here.
                    tracing::warn!(subject = %pulled.msg.subject, error = %e, "reader: malformed entry; terminated");
                    self.ctx.metrics.gave_up(GiveUp::Malformed);
                    pulled.settle(&self.ctx, Settle::Term).await;
                    continue;
                }
            };
            let Ok(permit) = self.handoffs.clone().acquire_owned().await else {
                return;
            };
            let sent = self
                .send_handoff(&names, entry.generation(), body, id)
                .await;
            let handoff = Handoff {
                sent,
                bound: Instant::now() + HANDOFF_BOUND,
                pulled,
                _permit: permit,
            };
            let tx = settles.get_or_insert_with(|| self.clone().settle_in_order());
            // The settling task is alive until this sender is dropped, after the batch.
            let _ = tx.send(handoff);
        }
    }

    /// Starts the task that settles one batch's handoffs in the order they were sent (each
    /// entry's burst ticket is given back with its last entry, `pump::Arrival`).
    fn settle_in_order(self: Arc<Self>) -> mpsc::UnboundedSender<Handoff> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Handoff>();
        tokio::spawn(async move {
            while let Some(Handoff {
                pulled,
                sent,
                bound,
                ..
            }) = rx.recv().await
            {
                let acked = match sent {
                    Ok(ack) => match tokio::time::timeout_at(bound, ack).await {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(e)) => Err(BrokerError::ack("", e)),
                        Err(elapsed) => Err(BrokerError::new(
                            BrokerErrorKind::TimedOut,
                            format!("no ack within {} ms", HANDOFF_BOUND.as_millis()),
                        )
                        .source(elapsed)),
                    },
                    Err(e) => Err(e),
                };
                let verdict = match acked {
                    Ok(()) => {
                        self.ctx.metrics.handed_off();
                        Settle::Ack
                    }
                    Err(e) => {
                        tracing::warn!(subject = %pulled.msg.subject, error = %e, "reader: handoff failed");
                        if self.given_up(&pulled) {
                            self.ctx.metrics.gave_up(GiveUp::Handoff);
                            Settle::Term
                        } else {
                            Settle::Nak
                        }
                    }
                };
                pulled.settle(&self.ctx, verdict).await;
            }
        });
        tx
    }

    /// The re-check of one entry: `Ok` to surface it, or how to settle it. The rows come from
    /// `rows` when an earlier entry of the batch read them for the same lifecycle.
    async fn check<'p>(
        &self,
        pulled: &'p Pulled,
        acls: &View<'_>,
        members: &View<'_>,
        rows: &mut BatchRows,
    ) -> Result<(Arc<LifecycleNames>, EntryRead<'p>), Settle> {
        let (msg, epoch) = (&pulled.msg, pulled.epoch);
        let lifecycle = match rows.find(&msg.subject) {
            Some(l) => l,
            None => {
                let Some(names) = self.names_of(&msg.subject) else {
                    tracing::warn!(subject = %msg.subject, "reader: unparseable subject; terminated");
                    self.ctx.metrics.gave_up(GiveUp::Malformed);
                    return Err(Settle::Term);
                };
                rows.add(&msg.subject, names)
            }
        };
        let names = lifecycle.names.clone();
        let entry = match EntryRead::parse(&msg.payload) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(subject = %msg.subject, error = %e, "reader: malformed entry; terminated");
                self.ctx.metrics.gave_up(GiveUp::Malformed);
                return Err(Settle::Term);
            }
        };
        let acl = match &lifecycle.acl {
            Some(acl) => acl.clone(),
            None => match self.acls.read_shared_in(acls, &names).await {
                Err(e) => {
                    tracing::warn!(error = %e, "reader: ACL read failed; nak");
                    return Err(Settle::Nak);
                }
                Ok(acl) => lifecycle.acl.insert(acl).clone(),
            },
        };
        let Some(Ok(record)) = acl.as_deref() else {
            // No (or a garbled) row: the owner is unknown.
            if self.given_up(pulled) {
                if self.ctx.gate.still(epoch) {
                    // One line per owner and window, however many entries it owes.
                    let owner = &names.acl_key;
                    self.ctx.journal.repeated(
                        &format!("give-up:unknown-owner:{}:{owner}", self.ctx.names.space()),
                        format!("! {}", unknown_owner_warning(owner, redeliveries(pulled))),
                    );
                }
                self.ctx.metrics.gave_up(GiveUp::UnknownOwner);
                return Err(Settle::Term);
            }
            return Err(Settle::Nak);
        };
        if record.is_retired() {
            return Err(self
                .drop_retired(pulled, &names.member, &names.uid, &entry)
                .await);
        }
        if !record.covers(entry.channel()) {
            return Err(Settle::Ack);
        }
        if entry.reason() == Reason::DurableChannel {
            let channel = entry.channel();
            let row = match lifecycle.members.iter().find(|(c, _)| c == channel) {
                Some((_, row)) => row.clone(),
                None => match self.members.read_in(members, channel, &names).await {
                    Err(e) => {
                        tracing::warn!(error = %e, "reader: member row read failed; nak");
                        return Err(Settle::Nak);
                    }
                    Ok(row) => {
                        lifecycle.members.push((channel.to_string(), row.clone()));
                        row
                    }
                },
            };
            let admitted = row.is_some_and(|row| {
                row.record
                    .as_ref()
                    .is_ok_and(|r| r.admits_entry(entry.seq(), entry.generation()))
            });
            if !admitted {
                return Err(Settle::Ack);
            }
        }
        Ok((names, entry))
    }

    /// Publishes the frame `body` of a message whose id is `id` without waiting for its ack.
    async fn send_handoff(
        &self,
        names: &LifecycleNames,
        generation: u64,
        body: Bytes,
        id: &str,
    ) -> Result<PublishAckFuture, BrokerError> {
        let mut headers = HeaderMap::new();
        headers.insert(DELIVERY_FRAME_HEADER, "1");
        if let Some(id) = names.dedup_id(id, generation) {
            headers.insert("Nats-Msg-Id", id.as_str());
        }
        let subject = &names.dlv;
        // The send is bounded by the context's own timeout (the request bound); a publish slot
        // of the context is free, since the handoffs and copies in flight stay below its count.
        self.ctx
            .js
            .publish_with_headers(subject.clone(), headers, body)
            .await
            .map_err(|e| {
                BrokerError::quoting(
                    BrokerErrorKind::Unsent,
                    format_args!("publish {subject}: "),
                    e,
                )
            })
    }

    async fn drop_retired(
        &self,
        pulled: &Pulled,
        member: &Principal,
        uid: &LifecycleUid,
        entry: &EntryRead<'_>,
    ) -> Settle {
        let seq = pulled.stream_sequence;
        let deleted = delete_inbox_entry(&self.ctx, seq).await;
        if !self.ctx.gate.still(pulled.epoch) {
            // Stopped serving while the delete was in flight: the next daemon retries it.
            return Settle::Leave;
        }
        if let Err(e) = deleted {
            tracing::warn!(seq, error = %e, "reader: deleting a retired lifecycle's entry failed");
            return if self.given_up(pulled) {
                self.ctx.metrics.gave_up(GiveUp::RetiredDelete);
                Settle::Term
            } else {
                Settle::Nak
            };
        }
        if entry.reason() == Reason::DurableChannel {
            if let Err(e) = self.remove_member_row(entry.channel(), member, uid).await {
                self.ctx.journal.line(format!(
                    "! plane-3 reader: could not remove the member row {} of retired lifecycle {}.{uid}: {e}",
                    SpaceNames::member_key(entry.channel(), member, uid),
                    member.dot_form()
                ));
            }
        }
        Settle::Ack
    }

    async fn remove_member_row(
        &self,
        channel: &str,
        member: &Principal,
        uid: &LifecycleUid,
    ) -> Result<(), RemoveRowError> {
        match self.members.read(channel, member, uid).await? {
            MemberRead::Absent { .. } => Ok(()),
            MemberRead::Present(_, revision) => {
                self.members.remove(channel, member, uid, revision).await?;
                Ok(())
            }
            MemberRead::Garbled(e) => Err(RemoveRowError::Garbled(e)),
        }
    }
}

/// Why a retired lifecycle's member row was not removed (said in the reader's warning).
#[derive(Debug)]
enum RemoveRowError {
    /// The read or the compare-and-set remove failed.
    Row(RowError),
    /// The stored row does not parse, so its revision is not to be trusted.
    Garbled(RowDecodeError),
}

impl From<RowError> for RemoveRowError {
    fn from(e: RowError) -> RemoveRowError {
        RemoveRowError::Row(e)
    }
}

impl std::fmt::Display for RemoveRowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoveRowError::Row(e) => e.fmt(f),
            RemoveRowError::Garbled(_) => f.write_str("the row does not parse"),
        }
    }
}

impl std::error::Error for RemoveRowError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RemoveRowError::Row(e) => Some(e),
            RemoveRowError::Garbled(e) => Some(e),
        }
    }
}

/// Deliveries of `pulled` past its first.
fn redeliveries(pulled: &Pulled) -> i64 {
    (pulled.deliveries - 1).max(0)
}

/// Deletes `INBOX_<s>` entry `seq`; an entry the stream no longer holds counts as removed.
pub async fn delete_inbox_entry(ctx: &PlaneCtx, seq: u64) -> Result<(), BrokerError> {
    let work = async {
        let stream = ctx
            .js
            .get_stream_no_info(ctx.names.inbox_stream())
            .await
            .map_err(|e| BrokerError::quoting(BrokerErrorKind::Unsent, "", e))?;
        match stream.delete_message(seq).await {
            Ok(_) => Ok(()),
            Err(e) => {
                // The broker answers a sequence it no longer holds with its generic "delete
                // failed" code; only its words tell that case apart.
                let words = crate::base::broker_words(&e);
                if words.to_lowercase().contains("no message found") {
                    Ok(())
                } else {
                    let kind = match e.kind() {
                        DeleteMessageErrorKind::TimedOut => BrokerErrorKind::TimedOut,
                        _ => BrokerErrorKind::Refused,
                    };
                    Err(BrokerError::new(kind, words).source(e))
                }
            }
        }
    };
    match tokio::time::timeout(HANDOFF_BOUND, work).await {
        Ok(r) => r,
        Err(elapsed) => Err(BrokerError::new(
            BrokerErrorKind::TimedOut,
            format!("no answer within {} ms", HANDOFF_BOUND.as_millis()),
        )
        .source(elapsed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{LifecycleUid, Principal, Space};

    /// A post's copies in one lane batch share one frame, and only copies with the same message
    /// and channel do: the second copy of a post (another reason and generation) gets the first
    /// one's bytes (the same buffer), a copy of the same message bytes under another channel
    /// gets its own frame, each equal to what `EntryRead::frame` writes for it. Mutations seen
    /// failing: the key without the channel (the third copy got the first frame), `of` never
    /// building again (the same).
    #[test]
    fn a_posts_copies_share_one_frame_and_only_theirs() {
        let msg = r#"{"id":"m1","channel":"general","from":{"id":"local.alice"},"text":"hi"}"#;
        let entry = |channel: &str, reason: &str, generation: u64| {
            format!(
                r#"{{"msg":{msg},"channel":"{channel}","seq":7,"reason":"{reason}","generation":{generation}}}"#
            )
        };
        let (a, b, c) = (
            entry("general", "durable-channel", 1),
            entry("general", "live-mention", 0),
            entry("random", "durable-channel", 1),
        );
        let reads: Vec<EntryRead<'_>> = [&a, &b, &c]
            .iter()
            .map(|e| EntryRead::parse(e.as_bytes()).unwrap())
            .collect();
        let mut last = LastFrame::default();
        let (first, id) = last.of(&reads[0]).unwrap();
        assert_eq!(id, "m1");
        assert_eq!(&first[..], &reads[0].frame().unwrap().0[..]);
        let (second, _) = last.of(&reads[1]).unwrap();
        assert_eq!(
            second.as_ptr(),
            first.as_ptr(),
            "the second copy reuses the frame"
        );
        let (third, _) = last.of(&reads[2]).unwrap();
        assert_eq!(&third[..], &reads[2].frame().unwrap().0[..]);
        assert_ne!(&third[..], &first[..]);
    }

    /// A batch's rows are found by the INBOX subject they were read for, and only by it.
    /// Mutations seen failing: `find` matching any lifecycle (the second lifecycle's names
    /// answered for the first), `add` not starting over at the bound (`seen` grows past it).
    #[test]
    fn a_batch_finds_a_lifecycles_rows_by_its_subject_only() {
        let space = SpaceNames::new(&Space::parse("eng-1").unwrap());
        let uid = LifecycleUid::parse("abcdefghijklmnopqrstuvwxyz").unwrap();
        let lifecycle = |who: &str| {
            let names = space.lifecycle(&Principal::parse(who).unwrap(), &uid);
            (names.dinbox.clone(), Arc::new(names))
        };
        let (alice, alice_names) = lifecycle("local.alice");
        let (bob, bob_names) = lifecycle("local.bob");
        let mut rows = BatchRows::default();
        assert!(rows.find(&alice).is_none(), "nothing read yet");
        rows.add(&alice, alice_names.clone()).acl = Some(None);
        rows.add(&bob, bob_names.clone());
        let found = rows.find(&alice).expect("alice's rows");
        assert_eq!(found.names, alice_names);
        assert_eq!(found.acl.as_ref().map(Option::is_none), Some(true));
        assert_eq!(rows.find(&bob).expect("bob's rows").names, bob_names);
        assert!(rows.find("cotal.eng-1.dinbox.local.carol.x").is_none());
        for i in 0..BATCH_LIFECYCLES_MAX {
            let (subject, names) = lifecycle(&format!("local.a{i}"));
            rows.add(&subject, names);
        }
        assert!(rows.seen.len() <= BATCH_LIFECYCLES_MAX, "bounded");
    }
}
