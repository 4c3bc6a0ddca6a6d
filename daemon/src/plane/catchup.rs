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
use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};
use async_nats::jetstream::ErrorCode;
use futures::StreamExt;
use serde_json::Value;

use crate::base::RowError;
use crate::plane::channels::{Channels, DeliveryClass};
use crate::plane::fanout::{store_copies, Target};
use crate::plane::membership::chat_frontier;
use crate::plane::PlaneCtx;
use crate::wire::{parse_chat_subject, sender_id, Reason};
use crate::wire::{LifecycleUid, Principal, SpaceNames};

/// Most posts one catch-up copies; the window is the few milliseconds of a join's row write.
pub const CATCH_UP_MAX_POSTS: usize = 10_000;
/// Bound on the whole catch-up, every attempt and every pause between them included. A join
/// answered `durable:false` promises nothing for its catch-up window, so a transient broker
/// error (a consumer leader moving, no responders, a request timing out) is worth retrying
/// within this bound; past it the join answers with the last error.
pub const CATCH_UP_BOUND: Duration = Duration::from_secs(15);
/// First pause before a catch-up is tried again after a transient error; doubled per attempt.
const CATCH_UP_RETRY_PAUSE: Duration = Duration::from_millis(250);
/// Longest pause between two attempts.
const CATCH_UP_RETRY_PAUSE_MAX: Duration = Duration::from_secs(2);
// The agent waits `JOIN_TIMEOUT` for the whole join; the catch-up with its retries may take at
// most half of it, the rest is the join's own reads and row write (each under `BROKER_BOUND`).
const _: () = assert!(CATCH_UP_BOUND.as_millis() * 2 <= crate::wire::JOIN_TIMEOUT.as_millis());
const _: () = assert!(CATCH_UP_RETRY_PAUSE_MAX.as_millis() * 4 <= CATCH_UP_BOUND.as_millis());

/// Why a catch-up did not finish: its kind, the text the join's warning and reply quote
/// (`Display`), and the broker's or the client's error behind it (`source()`).
#[derive(Debug)]
pub struct CatchUpError {
    kind: CatchUpErrorKind,
    /// A broker condition that passes (no responders, a timeout, a 503, a leader moving):
    /// worth another attempt within [`CATCH_UP_BOUND`].
    transient: bool,
    text: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// What a catch-up could not do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUpErrorKind {
    /// The CHAT frontier could not be read.
    Frontier,
    /// The channel's delivery class could not be read.
    ChannelClass,
    /// The stored join cursor has no sequence after it.
    Cursor,
    /// `CHAT_<s>` could not be looked up, or the activation consumer not created.
    Consumer,
    /// A fetch of the activation consumer failed.
    Fetch,
    /// A copy into `INBOX_<s>` was not stored.
    Copy,
    /// The whole catch-up did not finish within its bound.
    TimedOut,
}

impl CatchUpError {
    fn new(kind: CatchUpErrorKind, text: impl Into<String>) -> CatchUpError {
        CatchUpError {
            kind,
            transient: false,
            text: text.into(),
            source: None,
        }
    }
    /// The error of the last of `n` attempts, saying so when there was more than one.
    fn attempts(mut self, n: u32) -> CatchUpError {
        if n > 1 {
            self.text = format!("{} (attempt {n}, the earlier ones failed too)", self.text);
        }
        self
    }
    fn transient(mut self, transient: bool) -> CatchUpError {
        self.transient = transient;
        self
    }
    /// The same error, keeping `source` as its cause.
    fn source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> CatchUpError {
        self.source = Some(Box::new(source));
        self
    }
    pub fn kind(&self) -> CatchUpErrorKind {
        self.kind
    }
    /// Whether another attempt may succeed (see the field).
    pub fn is_transient(&self) -> bool {
        self.transient
    }
}

impl std::fmt::Display for CatchUpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for CatchUpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Copies to `member` the posts on `channel` in `(join_cursor, frontier]` (frontier read now).
/// Returns the `INBOX_<s>` sequences of the copies stored (so a refused join can take them back).
/// A transient broker error is retried (after a pause, doubled each time) while
/// [`CATCH_UP_BOUND`] allows; copies stored by a failed attempt are stored again under the same
/// dedup id, which the broker keeps once.
pub async fn activate(
    ctx: &PlaneCtx,
    channel: &str,
    member: &Principal,
    uid: &LifecycleUid,
    generation: u64,
    join_cursor: u64,
) -> Result<Vec<u64>, CatchUpError> {
    let started = tokio::time::Instant::now();
    let mut copied = Vec::new();
    let attempts = async {
        let mut pause = CATCH_UP_RETRY_PAUSE;
        let mut attempt = 1u32;
        loop {
            let e = match activate_once(
                ctx,
                channel,
                member,
                uid,
                generation,
                join_cursor,
                &mut copied,
            )
            .await
            {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if !e.transient || started.elapsed() + pause >= CATCH_UP_BOUND {
                return Err(e.attempts(attempt));
            }
            ctx.journal.line(format!(
                "! delivery: activation catch-up of {member} on \"{channel}\" (generation {generation}), attempt {attempt}: {e}; trying again in {} ms",
                pause.as_millis()
            ));
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(CATCH_UP_RETRY_PAUSE_MAX);
            attempt += 1;
        }
    };
    match tokio::time::timeout(CATCH_UP_BOUND, attempts).await {
        Ok(Ok(())) => {
            // An attempt after a failed one stores again what the failed one stored; the
            // broker answers with the same sequence, kept once here so a take-back deletes it once.
            copied.sort_unstable();
            copied.dedup();
            Ok(copied)
        }
        Ok(Err(e)) => Err(e),
        Err(elapsed) => Err(CatchUpError::new(
            CatchUpErrorKind::TimedOut,
            format!("not finished within {} ms", CATCH_UP_BOUND.as_millis()),
        )
        .source(elapsed)),
    }
}

/// One attempt of [`activate`]; the copies it stores are added to `copied` as they are stored.
async fn activate_once(
    ctx: &PlaneCtx,
    channel: &str,
    member: &Principal,
    uid: &LifecycleUid,
    generation: u64,
    join_cursor: u64,
    copied: &mut Vec<u64>,
) -> Result<(), CatchUpError> {
    use CatchUpErrorKind as K;
    // A stream info read of a stream that exists fails only for the broker's passing reasons.
    let frontier = chat_frontier(ctx).await.map_err(|e| {
        CatchUpError::new(K::Frontier, format!("the CHAT frontier: {e}"))
            .source(e)
            .transient(true)
    })?;
    if frontier <= join_cursor {
        return Ok(());
    }
    // An absent or garbled channel row is no error (the default class), so a failed read of
    // it is the broker's passing condition too (seed 4404 on the cluster: "JetStream system
    // temporarily unavailable (code 503, error code 10008)" in a node kill's churn).
    let class_error = |e: RowError| {
        CatchUpError::new(K::ChannelClass, format!("the channel class: {e}"))
            .source(e)
            .transient(true)
    };
    let channels = Channels::open(ctx).await.map_err(class_error)?;
    let class = channels.class_of(channel).await.map_err(class_error)?;
    if class != DeliveryClass::Durable {
        return Ok(());
    }
    copy_range(
        ctx,
        channel,
        member,
        uid,
        generation,
        (join_cursor, frontier),
        copied,
    )
    .await
}

/// The first sequence after a join cursor read from a stored row; a cursor at `u64::MAX` is
/// refused instead of overflowing.
fn first_after(join_cursor: u64) -> Result<u64, CatchUpError> {
    join_cursor.checked_add(1).ok_or_else(|| {
        CatchUpError::new(
            CatchUpErrorKind::Cursor,
            format!("the stored join cursor {join_cursor} has no sequence after it"),
        )
    })
}

/// A broker refusal while setting up the activation consumer, in the broker's words; transient
/// when it is one that passes ([`consumer_error_passes`]).
fn consumer_error(e: ConsumerError) -> CatchUpError {
    let transient = consumer_error_passes(e.kind());
    CatchUpError::new(CatchUpErrorKind::Consumer, crate::base::broker_words(&e))
        .source(e)
        .transient(transient)
}

/// Whether a consumer create's failure is one the broker gets over by itself: the request timed
/// out or found no responders (a JetStream API without a leader for the moment), or JetStream
/// answered 503 / "temporarily unavailable" (10008). Anything else (a config refused, a limit)
/// would fail again.
fn consumer_error_passes(kind: ConsumerErrorKind) -> bool {
    match kind {
        ConsumerErrorKind::TimedOut | ConsumerErrorKind::Request => true,
        ConsumerErrorKind::JetStream(e) => {
            e.code() == 503 || e.error_code() == ErrorCode::CLUSTER_NOT_AVAILABLE
        }
        _ => false,
    }
}

/// A failed fetch of the activation consumer, in the client's words. Always transient: a pull
/// of an AckNone consumer that exists fails only for the broker's passing reasons (a status
/// 503 while its leader moves, 408/409, the request not flushed).
fn fetch_error(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> CatchUpError {
    let e = e.into();
    CatchUpError {
        kind: CatchUpErrorKind::Fetch,
        transient: true,
        text: e.to_string(),
        source: Some(e),
    }
}

async fn copy_range(
    ctx: &PlaneCtx,
    channel: &str,
    member: &Principal,
    uid: &LifecycleUid,
    generation: u64,
    (join_cursor, frontier): (u64, u64),
    copied: &mut Vec<u64>,
) -> Result<(), CatchUpError> {
    let stream = ctx
        .js
        .get_stream_no_info(ctx.names.chat_stream())
        .await
        .map_err(|e| {
            CatchUpError::new(CatchUpErrorKind::Consumer, crate::base::broker_words(&e)).source(e)
        })?;
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
        .map_err(consumer_error)?;
    let names = std::sync::Arc::new(ctx.names.lifecycle(member, uid));
    let result = async {
        let mut seen = 0usize;
        while seen < CATCH_UP_MAX_POSTS {
            let batch = consumer
                .fetch()
                .max_messages(256)
                .expires(Duration::from_millis(500))
                .messages()
                .await
                .map_err(fetch_error)?;
            let mut batch = Box::pin(batch);
            let mut got = 0usize;
            let mut past = false;
            while let Some(msg) = batch.next().await {
                let msg = msg.map_err(fetch_error)?;
                got += 1;
                seen += 1;
                let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(u64::MAX);
                if seq > frontier {
                    past = true;
                    break;
                }
                let Some((sender, ch)) = parse_chat_subject(&msg.subject, ctx.names.prefix())
                else {
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
                    names: names.clone(),
                    reason: Reason::DurableChannel,
                    generation,
                };
                let stored = store_copies(ctx, &body, channel, seq, std::slice::from_ref(&target))
                    .await
                    .map_err(|e| {
                        CatchUpError::new(CatchUpErrorKind::Copy, e.to_string()).source(e)
                    })?;
                copied.extend(stored);
            }
            if past || got == 0 {
                break;
            }
        }
        Ok(())
    }
    .await;
    let _ = stream.delete_consumer(&name).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutations seen failing: `Ok(join_cursor + 1)` (debug build: "attempt to add with
    /// overflow" at the top of the range); the refusal's kind set to `Fetch`.
    #[test]
    fn a_join_cursor_at_the_top_of_the_range_is_refused_not_overflowed() {
        assert_eq!(first_after(0).ok(), Some(1));
        assert_eq!(first_after(u64::MAX - 1).ok(), Some(u64::MAX));
        let e = first_after(u64::MAX).expect_err("refused");
        assert_eq!(e.kind(), CatchUpErrorKind::Cursor);
        assert_eq!(
            e.to_string(),
            format!(
                "the stored join cursor {} has no sequence after it",
                u64::MAX
            )
        );
    }
}
