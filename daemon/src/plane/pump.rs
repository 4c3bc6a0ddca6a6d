//! The pull loop shared by the fan-out writer and the trusted reader.
//!
//! One task per durable pulls messages and hands each to one of a fixed number of sequential
//! lanes, chosen by subject. A handler is admitted at a serving epoch and settles
//! its message (ack, nak, term) only while the gate still shows that epoch: a daemon that
//! quiesced or lost its lease mid-handling acks nothing, and the entry redelivers to whoever
//! serves next. A pull stream that ends or faults is reopened after a short pause until `stop`.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, Consumer};
use async_nats::jetstream::{AckKind, Message};
use futures::StreamExt;
use tokio::task::JoinSet;

use crate::plane::{stopped, PlaneCtx, StopRx};

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

/// Number of delivery attempts of `msg` (1 on first delivery; 0 if the ack subject is unreadable).
pub fn deliveries(msg: &Message) -> i64 {
    msg.info().map(|i| i.delivered).unwrap_or(0)
}

/// Stream sequence of `msg` (0 if the ack subject is unreadable).
pub fn stream_sequence(msg: &Message) -> u64 {
    msg.info().map(|i| i.stream_sequence).unwrap_or(0)
}

/// Capacity of each lane's queue (back-pressure on the pull loop).
const LANE_QUEUE: usize = 16;

/// Runs the pull loop of `consumer` until `stop`, calling `handler(msg, epoch)` per message.
/// Messages are spread over `lanes` sequential lanes by their subject, so messages on one
/// subject (one channel's posts, one member's entries) are handled in stream order while
/// different subjects proceed in parallel.
pub async fn run<H, F>(
    ctx: PlaneCtx,
    consumer: Consumer<pull::Config>,
    mut stop: StopRx,
    lanes: usize,
    what: &'static str,
    handler: H,
) where
    H: Fn(Message, u64) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let handler = std::sync::Arc::new(handler);
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut senders = Vec::with_capacity(lanes.max(1));
    for _ in 0..lanes.max(1) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(Message, u64)>(LANE_QUEUE);
        let handler = handler.clone();
        tasks.spawn(async move {
            while let Some((msg, epoch)) = rx.recv().await {
                handler(msg, epoch).await;
            }
        });
        senders.push(tx);
    }
    let mut retention = RetentionWatch::default();
    'outer: loop {
        let mut messages = tokio::select! {
            _ = stopped(&mut stop) => break 'outer,
            m = consumer.messages() => match m {
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
                Some(Ok(msg)) => {
                    retention.observe(&ctx, what, stream_sequence(&msg));
                    let Some(epoch) = ctx.gate.admit() else {
                        // Not serving: leave it pending; it redelivers to whoever serves.
                        continue;
                    };
                    let lane = lane_of(&msg.subject, senders.len());
                    tokio::select! {
                        _ = stopped(&mut stop) => break 'outer,
                        sent = senders[lane].send((msg, epoch)) => {
                            if sent.is_err() {
                                break 'outer;
                            }
                        }
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(what, error = %e, "pull stream event");
                }
                None => break,
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

/// Creates (or binds) the durable `config` names on `stream`, within the request bound; a
/// failure is a `PlaneError` under `what`.
pub async fn bind_durable(
    ctx: &PlaneCtx,
    what: &'static str,
    stream: &str,
    config: pull::Config,
) -> Result<Consumer<pull::Config>, crate::plane::PlaneError> {
    let err = |detail: String| crate::plane::PlaneError { what, detail };
    let name = config.durable_name.clone().unwrap_or_default();
    let stream = ctx
        .js
        .get_stream_no_info(stream)
        .await
        .map_err(|e| err(crate::kv::broker_words(&e)))?;
    tokio::time::timeout(
        ctx.config.request_bound,
        stream.get_or_create_consumer(&name, config),
    )
    .await
    .map_err(|_| {
        err(format!(
            "no answer within {} ms",
            ctx.config.request_bound.as_millis()
        ))
    })?
    .map_err(|e| err(crate::kv::broker_words(&e)))
}

/// Notices messages the broker discarded before this consumer read them.
///
/// Both durables filter their whole stream (`chat.>`, `dinbox.>`), so the stream sequences of
/// first deliveries only ever step by one; a jump means the messages in between are gone, which
/// for `INBOX_<s>`/`CHAT_<s>` means per-subject retention (`max_msgs_per_subject`, discard old)
/// dropped them before they were copied or handed off. The guarantee is at-least-once *within
/// retention*; this makes the edge of it visible instead of a silent gap (DESIGN §6.8).
#[derive(Debug, Default)]
pub struct RetentionWatch {
    /// Highest stream sequence seen in this run; redeliveries sit below it.
    last: u64,
    /// Messages found gone so far.
    pub discarded: u64,
}

impl RetentionWatch {
    /// Records a delivery; returns the size of the gap it revealed, if any.
    pub fn gap(&mut self, seq: u64) -> Option<(u64, u64)> {
        if seq == 0 || seq <= self.last {
            return None;
        }
        let gap = (self.last > 0 && seq > self.last + 1).then(|| (self.last + 1, seq - 1));
        self.last = seq;
        if let Some((from, to)) = gap {
            self.discarded += to - from + 1;
        }
        gap
    }

    fn observe(&mut self, ctx: &PlaneCtx, what: &str, seq: u64) {
        if let Some((from, to)) = self.gap(seq) {
            ctx.journal.line(format!(
                "! delivery: the {what} found {} message(s) gone before it read them (stream sequences {from}..={to}): discarded by retention, never delivered ({} so far in this run)",
                to - from + 1,
                self.discarded
            ));
        }
    }
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

    #[test]
    fn a_jump_in_first_deliveries_is_a_retention_gap() {
        let mut w = RetentionWatch::default();
        assert_eq!(w.gap(5), None, "the first delivery sets the baseline");
        assert_eq!(w.gap(6), None);
        assert_eq!(w.gap(3), None, "a redelivery below the high mark");
        assert_eq!(w.gap(10), Some((7, 9)));
        assert_eq!(w.discarded, 3);
        assert_eq!(w.gap(11), None);
    }
}
