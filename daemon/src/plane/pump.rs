//! The pull loop shared by the fan-out writer and the trusted reader.
//!
//! One task per durable pulls messages and hands each to one of a fixed number of sequential
//! lanes, chosen by subject; every burst of messages received together asks the fences its
//! handler needs once all of it arrived ([`Arrival`]). A lane takes what is queued as one batch
//! (at most [`LANE_BATCH_MAX`]) and hands it to the handler, which decides the whole batch after
//! one coalesced fence per bucket and settles each message when its downstream acks arrive. Lane
//! queues never block the pull loop (one full lane must not stall the others): they are bounded
//! by the durable's `max_ack_pending`, since the broker delivers no more unacknowledged
//! messages than that. A message is admitted at a serving epoch and settled (ack, nak, term)
//! only while the gate still shows that epoch: a daemon that quiesced or lost its lease
//! mid-handling acks nothing, and the entry redelivers to whoever serves next. A pull stream
//! that ends or faults is reopened after a short pause until `stop`; its requests are counted
//! where they are sent (`plane/pull.rs`).
//!
//! Crash recovery rides on a short `ack_wait` (5 s by default): a message this daemon pulled and
//! still owns (queued in a lane or being handled) is kept alive with an in-progress ack once it
//! has been held a third of `ack_wait` since it was pulled or last kept alive (one sweeper per
//! loop looks every sixth, so none goes half an `ack_wait` without one) while the gate holds its
//! epoch, so only a message whose owner died (or stopped serving) redelivers, and it does so one
//! `ack_wait` after its last keep-alive instead of after a minute. Owning a message costs a
//! registry entry, not a task and a timer of its own (docs/performance-history.md). A loop pulls
//! only while the gate is open, and a message it pulled after the gate closed (never admitted,
//! nothing done with it) is handed back with an immediate nak once the loop's own pull stream is
//! dropped: a new holder's first posts are not held one `ack_wait` by pulls made before its
//! `arm` opened the gate (docs/performance-history.md).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, Consumer};
use async_nats::jetstream::{AckKind, Message};
use async_nats::Subject;
use futures::FutureExt;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::base::Store;
use crate::plane::boundary::Ticket;
use crate::plane::cache::{Asked, RowCache};
use crate::plane::pull::Pulls;
use crate::plane::{stopped, BrokerError, BrokerErrorKind, PlaneCtx, StopRx};

/// How a handler settles its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Handled: remove it from the consumer's pending set.
    Ack,
    /// Transient failure: redeliver after the configured nak delay.
    Nak,
    /// Permanent anomaly or given up: never redeliver (the stream keeps the message).
    Term,
    /// Neither ack nor term (the daemon stopped serving mid-work): redelivers after ack_wait.
    Leave,
}

/// Pause before reopening a pull stream that ended or faulted.
const REOPEN_PAUSE: Duration = Duration::from_millis(250);
/// Life of one pull request of a loop's stream: an idle loop sends a request and hears its
/// expiry every 5 s. Short, so that a request the broker no longer holds (lost with a
/// connection, say) is noticed within 6 s (`pull::PULL_LOST_MARGIN` past it), for one request
/// and one expiry status per idle loop every 5 s instead of every 30 s.
pub const PULL_EXPIRES: Duration = Duration::from_secs(5);

/// Most a pull loop's first pull waits for the row caches its handler decides from to load.
/// Until a cache is loaded every decision reads its rows one key at a time from the leader,
/// beside the load: a daemon restarted in front of a 100,000-entry backlog at 100,000 members
/// rows drained its first 0.45 s at a tenth of its pace, for 16 % more CPU per entry than
/// when it waited (docs/performance-history.md, "Fifth pass"). Past the bound the loop pulls
/// anyway, with per-key reads, so a cache that cannot load holds delivery back by at most this.
pub const CACHE_LOAD_WAIT: Duration = Duration::from_secs(10);

/// Applies `settle` to `msg` if the gate still shows `epoch`.
pub async fn settle(ctx: &PlaneCtx, msg: &Message, epoch: u64, settle: Settle) {
    if !ctx.gate.still(epoch) {
        return;
    }
    let kind = match settle {
        Settle::Ack => AckKind::Ack,
        Settle::Nak => AckKind::Nak(Some(ctx.config.nak_delay)),
        Settle::Term => AckKind::Term,
        Settle::Leave => return,
    };
    if let Err(e) = msg.ack_with(kind).await {
        tracing::warn!(subject = %msg.subject, error = %e, "settling a message failed; it will redeliver");
    }
}

/// Most messages a lane hands to its handler at once (one fence per bucket serves them all).
pub const LANE_BATCH_MAX: usize = 128;

/// The messages one pull loop owns (pulled, admitted, not yet settled), kept alive by one
/// sweeper task per loop instead of a task and a timer per message. A slab: owning and
/// settling a message reuses a free slot (no hashing, no map growth per message).
#[derive(Default)]
struct Owners {
    held: std::sync::Mutex<OwnersInner>,
}

#[derive(Default)]
struct OwnersInner {
    slots: Vec<Option<Held>>,
    /// Indices of the empty slots.
    free: Vec<usize>,
}

/// One owned message: where its in-progress acks go, the epoch it was admitted at, and when it
/// was last kept alive (or pulled).
struct Held {
    reply: Subject,
    epoch: u64,
    last: Instant,
}

impl Owners {
    fn lock(&self) -> std::sync::MutexGuard<'_, OwnersInner> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a message admitted at `epoch` whose acks go to `reply` (one without a reply
    /// subject cannot be acked, so there is nothing to keep alive).
    fn own(self: &Arc<Self>, reply: Option<&Subject>, epoch: u64, now: Instant) -> Owned {
        let slot = reply.map(|reply| {
            let held = Held {
                reply: reply.clone(),
                epoch,
                last: now,
            };
            let mut inner = self.lock();
            match inner.free.pop() {
                Some(slot) => {
                    inner.slots[slot] = Some(held);
                    slot
                }
                None => {
                    inner.slots.push(Some(held));
                    inner.slots.len() - 1
                }
            }
        });
        Owned {
            owners: self.clone(),
            slot,
        }
    }

    /// The reply subjects of the messages due an in-progress ack at `now`: held at least
    /// `period` since they were pulled or last kept alive, and still under the epoch they were
    /// admitted at (`still`); their clocks restart at `now`.
    fn due(&self, now: Instant, period: Duration, still: impl Fn(u64) -> bool) -> Vec<Subject> {
        let mut inner = self.lock();
        inner
            .slots
            .iter_mut()
            .flatten()
            .filter(|h| now.saturating_duration_since(h.last) >= period && still(h.epoch))
            .map(|h| {
                h.last = now;
                h.reply.clone()
            })
            .collect()
    }
}

/// Ends a message's keep-alive when dropped (settled, or its lane or the loop went away).
struct Owned {
    owners: Arc<Owners>,
    /// Its slot (`None`: nothing to keep alive).
    slot: Option<usize>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            let mut inner = self.owners.lock();
            inner.slots[slot] = None;
            inner.free.push(slot);
        }
    }
}

/// A pulled message, owned by this daemon until settled (kept alive meanwhile).
pub struct Pulled {
    pub msg: Message,
    /// What its burst set going when it arrived (shared with the burst's other messages).
    pub arrival: Arc<Arrival>,
    /// The serving epoch it was admitted at.
    pub epoch: u64,
    /// Delivery attempts (1 on first delivery; 0 if the ack subject is unreadable).
    pub deliveries: i64,
    /// Its stream sequence (0 if the ack subject is unreadable).
    pub stream_sequence: u64,
    _alive: Owned,
}

/// What a burst of messages (every message received with the first, at most [`BURST_MAX`]) set
/// going once all of them were received, shared by its messages until the last of them is
/// settled or dropped: the fences of the buckets the handler decides from, asked for then (so
/// each is sent after the burst was received, and under load while the lane still works on
/// earlier messages), and for the reader the boundary ticket taken before them
/// (`plane/boundary.rs`). One ask per burst, not per lane batch: a post's copies, received
/// together, wait for one fence, not for a fence sent after another lane's fence came back.
#[derive(Default)]
pub struct Arrival {
    /// Held, never read: given back when the burst's last message goes.
    #[allow(dead_code)]
    pub ticket: Option<Ticket>,
    /// The fence of each bucket asked for (`None`: not asked, or the cache not loaded).
    pub acl: Option<Asked>,
    pub members: Option<Asked>,
    pub channels: Option<Asked>,
}

/// Most messages taken from the pull stream as one burst.
pub const BURST_MAX: usize = LANE_BATCH_MAX;

/// A message admitted and not yet handed to its lane.
struct Admitted {
    msg: Message,
    epoch: u64,
    deliveries: i64,
    stream_sequence: u64,
}

impl Pulled {
    /// Settles the message (if the gate still shows its epoch) and ends its keep-alive.
    pub async fn settle(self, ctx: &PlaneCtx, verdict: Settle) {
        settle(ctx, &self.msg, self.epoch, verdict).await;
    }
}

/// Keeps every message `owners` holds alive: an in-progress ack for each once it has been held
/// a third of `ack_wait` since it was pulled or last kept alive, while the gate holds the epoch
/// it was admitted at. Looks twice per third, so no message goes more than half an `ack_wait`
/// without one.
async fn keep_alive(ctx: PlaneCtx, owners: Arc<Owners>) {
    let period = (ctx.config.ack_wait / 3).max(Duration::from_millis(50));
    let mut sweep = tokio::time::interval(period / 2);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        sweep.tick().await;
        // Not ours any more once the epoch moved: it redelivers to whoever serves next.
        for reply in owners.due(Instant::now(), period, |epoch| ctx.gate.still(epoch)) {
            if let Err(e) = ctx.client.publish(reply, AckKind::Progress.into()).await {
                tracing::debug!(error = %e, "in-progress ack failed");
            }
        }
    }
}

/// Returns a message this daemon pulled but never admitted: an immediate nak, so whoever
/// serves next gets it now rather than one `ack_wait` later.
async fn hand_back(msg: &Message) {
    if let Err(e) = msg.ack_with(AckKind::Nak(None)).await {
        tracing::debug!(subject = %msg.subject, error = %e, "handing back an unadmitted message failed; it redelivers after ack_wait");
    }
}

/// Runs the pull loop of `consumer` until `stop`, calling `handler(batch)` per lane batch.
/// Messages are spread over `lanes` sequential lanes by their subject, so messages on one
/// subject (one channel's posts, one member's entries) are handed over in stream order while
/// different subjects proceed in parallel. `arrive()` runs once per burst, after every message
/// of it was received and before any is handed to a lane; each message carries what it made.
/// The first pull waits (at most [`CACHE_LOAD_WAIT`]) for `reads`, the caches the handler
/// decides from, to load.
#[allow(clippy::too_many_arguments)]
pub async fn run<H, F>(
    ctx: PlaneCtx,
    consumer: Consumer<pull::Config>,
    stream: String,
    mut stop: StopRx,
    lanes: usize,
    what: &'static str,
    reads: Vec<RowCache>,
    arrive: impl Fn() -> Arrival + Send + Sync,
    handler: H,
) where
    H: Fn(Vec<Pulled>) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let handler = Arc::new(handler);
    let mut tasks: JoinSet<()> = JoinSet::new();
    let owners = Arc::new(Owners::default());
    tasks.spawn(keep_alive(ctx.clone(), owners.clone()));
    let store = Store::of(&ctx.names, &stream);
    let mut senders = Vec::with_capacity(lanes.max(1));
    for _ in 0..lanes.max(1) {
        // Unbounded here, bounded by the durable's max_ack_pending (see the module doc).
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Pulled>();
        let handler = handler.clone();
        tasks.spawn(async move {
            while let Some(first) = rx.recv().await {
                // Sized for what is queued, so the batch is not regrown (and moved) as it fills.
                let mut batch = Vec::with_capacity((rx.len() + 1).min(LANE_BATCH_MAX));
                batch.push(first);
                while batch.len() < LANE_BATCH_MAX {
                    match rx.try_recv() {
                        Ok(p) => batch.push(p),
                        Err(_) => break,
                    }
                }
                handler(batch).await;
            }
        });
        senders.push(tx);
    }
    let mut retention = RetentionWatch::default();
    // One burst buffer for the loop's life, emptied by each burst: a burst of many messages
    // does not regrow (and move) a new one message by message.
    let mut burst: Vec<Message> = Vec::new();
    let mut reads = Some(reads);
    'outer: loop {
        // Pull only while serving: a message pulled behind a closed gate (before `arm` opens it,
        // or after a quiesce closed it) would sit out a whole `ack_wait` before anyone got it.
        tokio::select! {
            _ = stopped(&mut stop) => break 'outer,
            _ = ctx.gate.opened() => {}
        }
        if let Some(reads) = reads.take() {
            tokio::select! {
                _ = stopped(&mut stop) => break 'outer,
                all = loaded_within(&reads, CACHE_LOAD_WAIT) => if !all {
                    tracing::warn!(what, bound_s = CACHE_LOAD_WAIT.as_secs(), "row caches not loaded within the bound; pulling, with per-key leader reads");
                }
            }
        }
        let mut messages = tokio::select! {
            _ = stopped(&mut stop) => break 'outer,
            m = Pulls::open(&ctx, &consumer, PULL_EXPIRES) => match m {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(what, error = %e, "opening the pull stream failed; retrying");
                    tokio::select! {
                        _ = stopped(&mut stop) => break 'outer,
                        _ = tokio::time::sleep(REOPEN_PAUSE) => continue 'outer,
                    }
                }
            },
        };
        loop {
            let next = tokio::select! {
                _ = stopped(&mut stop) => break 'outer,
                n = messages.next() => n,
            };
            match next {
                Some(Ok(msg)) => burst.push(msg),
                Some(Err(e)) => {
                    tracing::debug!(what, error = %e, "pull stream event");
                    continue;
                }
                None => break,
            };
            let mut ended = false;
            while burst.len() < BURST_MAX {
                match messages.next().now_or_never() {
                    Some(Some(Ok(msg))) => burst.push(msg),
                    Some(Some(Err(e))) => tracing::debug!(what, error = %e, "pull stream event"),
                    Some(None) => {
                        ended = true;
                        break;
                    }
                    None => break,
                }
            }
            let mut admitted = Vec::with_capacity(burst.len());
            let mut received = burst.drain(..);
            while let Some(msg) = received.next() {
                let (delivered, seq) = msg
                    .info()
                    .map(|i| (i.delivered, i.stream_sequence))
                    .unwrap_or((0, 0));
                if delivered == 1 {
                    retention.observe(&ctx, what, &stream, seq).await;
                } else {
                    ctx.metrics.redelivered(store);
                }
                let Some(epoch) = ctx.gate.admit() else {
                    // Quiesced before admitting it: nothing was done with it, so hand it (and
                    // the rest of the burst, and whatever the pull stream already buffered)
                    // straight back, and stop pulling until the gate opens again. The pull
                    // stream goes first: a nak the broker saw while this stream's pull
                    // requests were still open could be redelivered straight back to them,
                    // for an ack_wait. What was admitted before goes to its lanes, as it would
                    // have one message earlier.
                    if !dispatch(admitted, &arrive, &owners, &senders) {
                        break 'outer;
                    }
                    let mut unadmitted: Vec<Message> =
                        std::iter::once(msg).chain(received).collect();
                    if !ended {
                        while let Some(Some(Ok(m))) = messages.next().now_or_never() {
                            unadmitted.push(m);
                        }
                    }
                    drop(messages);
                    for m in &unadmitted {
                        hand_back(m).await;
                    }
                    continue 'outer;
                };
                admitted.push(Admitted {
                    msg,
                    epoch,
                    deliveries: delivered,
                    stream_sequence: seq,
                });
            }
            if !dispatch(admitted, &arrive, &owners, &senders) {
                break 'outer;
            }
            if ended {
                break;
            }
        }
        tokio::select! {
            _ = stopped(&mut stop) => break 'outer,
            _ = tokio::time::sleep(REOPEN_PAUSE) => {}
        }
    }
    drop(senders);
    tasks.abort_all();
}

/// Whether every cache of `reads` loaded within `bound` (waited for together).
async fn loaded_within(reads: &[RowCache], bound: Duration) -> bool {
    futures::future::join_all(reads.iter().map(|c| c.loaded_within(bound)))
        .await
        .into_iter()
        .all(|loaded| loaded)
}

/// Hands a burst's admitted messages to their lanes, with what `arrive` sets going for the
/// burst (only once every message of it was received); false when a lane is gone.
fn dispatch(
    admitted: Vec<Admitted>,
    arrive: &impl Fn() -> Arrival,
    owners: &Arc<Owners>,
    senders: &[tokio::sync::mpsc::UnboundedSender<Pulled>],
) -> bool {
    if admitted.is_empty() {
        return true;
    }
    let arrival = Arc::new(arrive());
    for a in admitted {
        let lane = lane_of(&a.msg.subject, senders.len());
        let alive = owners.own(a.msg.reply.as_ref(), a.epoch, Instant::now());
        let pulled = Pulled {
            msg: a.msg,
            arrival: arrival.clone(),
            epoch: a.epoch,
            deliveries: a.deliveries,
            stream_sequence: a.stream_sequence,
            _alive: alive,
        };
        if senders[lane].send(pulled).is_err() {
            return false;
        }
    }
    true
}

/// Creates (or binds) the durable `config` names on `stream`, within the request bound; a
/// failure is a `PlaneError` under `what`.
pub async fn bind_durable(
    ctx: &PlaneCtx,
    what: &'static str,
    stream: &str,
    config: pull::Config,
) -> Result<Consumer<pull::Config>, crate::plane::PlaneError> {
    use crate::plane::{PlaneError, PlaneErrorKind};
    let err = |detail: String| PlaneError::new(PlaneErrorKind::Consumer, what, detail);
    let name = config.durable_name.clone().unwrap_or_default();
    let stream = ctx.js.get_stream_no_info(stream).await.map_err(|e| {
        PlaneError::new(PlaneErrorKind::Stream, what, crate::base::broker_words(&e))
    })?;
    let bound = |what: String| {
        err(format!(
            "{what}: no answer within {} ms",
            ctx.config.request_bound.as_millis()
        ))
    };
    let ack_wait = config.ack_wait;
    let consumer: Consumer<pull::Config> = tokio::time::timeout(
        ctx.config.request_bound,
        stream.get_or_create_consumer(&name, config.clone()),
    )
    .await
    .map_err(|_| bound("binding".into()))?
    .map_err(|e| err(crate::base::broker_words(&e)))?;
    if consumer.cached_info().config.ack_wait == ack_wait {
        return Ok(consumer);
    }
    // A durable created with another ack_wait (e.g. the old 60 s) takes the configured one, so
    // crash recovery is as prompt as documented. A refused update keeps the durable as it is.
    match tokio::time::timeout(ctx.config.request_bound, stream.update_consumer(config)).await {
        Ok(Ok(updated)) => Ok(updated),
        Ok(Err(e)) => {
            tracing::warn!(what, error = %crate::base::broker_words(&e), "keeping the durable's own ack_wait");
            Ok(consumer)
        }
        Err(_) => Err(bound("updating its ack_wait".into())),
    }
}

/// Notices messages the broker discarded before this consumer read them.
///
/// Both durables filter their whole stream (`chat.>`, `dinbox.>`), so the stream sequences of
/// first deliveries (delivery count 1) only ever step by one; a jump means the messages in
/// between were either never delivered because the broker no longer holds them, or delivered to
/// an earlier incarnation of the daemon. Only the broker can tell which: the stream's first
/// sequence and its deleted sequences (per-subject retention, `max_msgs_per_subject` with
/// discard old, removes from the middle too) say how many in the gap are really gone. Only
/// those are reported; the guarantee is at-least-once *within retention*, and this makes its
/// edge visible instead of a silent gap (docs/data-path.md).
#[derive(Debug, Default)]
pub struct RetentionWatch {
    /// Highest first-delivery stream sequence seen in this run.
    last: u64,
    /// Messages confirmed gone so far.
    pub discarded: u64,
}

impl RetentionWatch {
    /// Records a first delivery; returns the gap it revealed, if any.
    pub fn gap(&mut self, seq: u64) -> Option<(u64, u64)> {
        if seq == 0 || seq <= self.last {
            return None;
        }
        // `seq > last` here, so `seq - last` and `last + 1` cannot overflow even at `u64::MAX`
        // (the sequence comes from the network).
        let gap = (self.last > 0 && seq - self.last > 1).then(|| (self.last + 1, seq - 1));
        self.last = seq;
        gap
    }

    async fn observe(&mut self, ctx: &PlaneCtx, what: &str, stream: &str, seq: u64) {
        let Some((from, to)) = self.gap(seq) else {
            return;
        };
        let gone = match gone_in(ctx, stream, from, to).await {
            Ok(n) => n,
            Err(e) => {
                ctx.journal.line(format!(
                    "! delivery: the {what} skipped stream sequences {from}..={to} and could not ask the broker whether retention discarded them: {e}"
                ));
                return;
            }
        };
        if gone == 0 {
            // Delivered to an earlier incarnation (or still pending there): not a loss.
            return;
        }
        self.discarded += gone;
        ctx.metrics.discarded(Store::of(&ctx.names, stream), gone);
        ctx.journal.line(format!(
            "! delivery: the {what} found {gone} message(s) gone before it read them (stream sequences {from}..={to}): discarded by retention, never delivered ({} so far in this run)",
            self.discarded
        ));
    }
}

/// How many of the stream sequences `from..=to` `stream` no longer holds (below its first
/// sequence or deleted), leader-served.
async fn gone_in(ctx: &PlaneCtx, stream: &str, from: u64, to: u64) -> Result<u64, BrokerError> {
    let work = async {
        let s = ctx
            .js
            .get_stream_no_info(stream)
            .await
            .map_err(|e| BrokerError::quoting(BrokerErrorKind::Unsent, "", e))?;
        let info = s
            .info_builder()
            .with_deleted(true)
            .fetch()
            .await
            .map_err(|e| BrokerError::quoting(BrokerErrorKind::Refused, "", e))?
            .info;
        Ok::<_, BrokerError>(count_gone(
            info.state.first_sequence,
            info.state.deleted.as_deref().unwrap_or_default(),
            from,
            to,
        ))
    };
    tokio::time::timeout(ctx.config.request_bound, work)
        .await
        .map_err(|elapsed| {
            let bound = ctx.config.request_bound.as_millis();
            let text = format!("no answer within {bound} ms");
            BrokerError::new(BrokerErrorKind::TimedOut, text).source(elapsed)
        })?
}

/// Sequences of `from..=to` below `first` or listed in `deleted`.
fn count_gone(first: u64, deleted: &[u64], from: u64, to: u64) -> u64 {
    // Saturating: `to` may be `u64::MAX` (a sequence read from the broker).
    let below = first.min(to.saturating_add(1)).saturating_sub(from);
    let interior = deleted
        .iter()
        .filter(|s| **s >= from.max(first) && **s <= to)
        .count() as u64;
    below + interior
}

/// The lane of a subject (FNV-1a).
fn lane_of(subject: &str, lanes: usize) -> usize {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in subject.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    (h % lanes as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutations seen failing: keeping alive every held message at each sweep (no `period`
    /// condition) fails the first assertion, not restarting a message's clock when it is kept
    /// alive the second, `Owned::drop` not removing its message the third.
    #[test]
    fn a_held_message_is_kept_alive_once_per_period_under_its_epoch_until_settled() {
        let owners = Arc::new(Owners::default());
        let period = Duration::from_millis(300);
        let t0 = Instant::now();
        let subject = |s: &str| Subject::from(s.to_string());
        let m1 = owners.own(Some(&subject("r1")), 1, t0);
        let _m2 = owners.own(Some(&subject("r2")), 1, t0 + period / 2);
        let _m3 = owners.own(Some(&subject("r3")), 2, t0);
        let _none = owners.own(None, 1, t0);
        let still = |epoch| epoch == 1;
        assert_eq!(
            owners.due(t0 + period, period, still),
            vec![subject("r1")],
            "r2 held half a period, r3 admitted at another epoch"
        );
        assert_eq!(
            owners.due(t0 + period * 3 / 2, period, still),
            vec![subject("r2")],
            "r1 was kept alive half a period ago"
        );
        drop(m1);
        assert_eq!(
            owners.due(t0 + period * 5 / 2, period, still),
            vec![subject("r2")],
            "r1 settled: no longer held"
        );
    }

    #[test]
    fn a_jump_in_first_deliveries_is_a_retention_gap() {
        let mut w = RetentionWatch::default();
        assert_eq!(w.gap(5), None, "the first delivery sets the baseline");
        assert_eq!(w.gap(6), None);
        assert_eq!(w.gap(3), None, "a redelivery below the high mark");
        assert_eq!(w.gap(10), Some((7, 9)));
        assert_eq!(w.gap(11), None);
    }

    /// Mutation: counting the whole gap (ignoring `first` and `deleted`) fails the first and
    /// third assertions.
    #[test]
    fn only_sequences_the_broker_no_longer_holds_count_as_gone() {
        assert_eq!(
            count_gone(1, &[], 7, 9),
            0,
            "all still held: delivered elsewhere"
        );
        assert_eq!(
            count_gone(9, &[], 7, 9),
            2,
            "7 and 8 below the first sequence"
        );
        assert_eq!(
            count_gone(1, &[3, 8, 12], 7, 9),
            1,
            "8 deleted in the middle"
        );
        assert_eq!(
            count_gone(20, &[], 7, 9),
            3,
            "the whole gap below the first sequence"
        );
        assert_eq!(count_gone(8, &[8, 9], 7, 9), 3, "no sequence counted twice");
    }

    /// Sequences read from the network at the top of the range must not overflow.
    /// Mutation seen failing: `to + 1` back in `count_gone` (debug build: "attempt to add with
    /// overflow"). The old `seq > self.last + 1` in `gap` could not overflow (`last < seq`);
    /// the assertions on `gap` pin that boundary.
    #[test]
    fn sequences_at_the_top_of_the_range_do_not_overflow() {
        let mut w = RetentionWatch::default();
        assert_eq!(w.gap(u64::MAX - 3), None);
        assert_eq!(w.gap(u64::MAX), Some((u64::MAX - 2, u64::MAX - 1)));
        assert_eq!(w.gap(u64::MAX), None, "a redelivery at the top");
        assert_eq!(count_gone(u64::MAX, &[], u64::MAX - 2, u64::MAX), 2);
        assert_eq!(count_gone(1, &[u64::MAX], u64::MAX - 1, u64::MAX), 1);
    }
}
