//! A durable's pull requests, counted where they are sent.
//!
//! A pull loop keeps asking the broker for more while what it asked for runs low: it counts the
//! messages its open requests may still bring, and asks again once that count is at most half a
//! batch. The count must never fall below what the broker really owes, or the loop asks for
//! nothing while the broker holds no request of its own: it stalls with entries waiting until a
//! timer notices. async-nats 0.51's pull stream publishes its requests from a task of its own and
//! adds a request's batch to the count only when that task reports back to the stream; a request
//! served before the report (the task descheduled in between, on a loaded host) has its first
//! messages counted against nothing, and the count stays that much too high for the stream's
//! life. Caught with an instrumented copy of the client (38 messages counted against nothing in
//! one drain of `smoke bench-scale`); each such slip lasts, so a few of them stalled the trusted
//! reader's backlog drain for the request's expiry plus 5 s (docs/performance-history.md, "The
//! drain, fourth look"). Here the batch is counted in the same step that publishes the request,
//! by the only task that reads what the requests bring, so nothing a request brings can be read
//! before it is counted.
//!
//! The count is set back to nothing, and the loop asks again, when the broker cannot hold what
//! it was asked: after a reconnect (requests die with the broker process that held them), when
//! a new consumer leader voids them (`409 Leadership Change`, once per inbox), and when nothing
//! at all was heard for a request's expiry and a margin (its `408` would have come).
//! Asking again while an old request still lives costs at most a request the broker serves too.

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, Consumer};
use async_nats::jetstream::Message;
use async_nats::{StatusCode, Subject, Subscriber};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::base::ConnEvent;
use crate::plane::{BrokerError, BrokerErrorKind, PlaneCtx};
use crate::provision::js;

/// Messages one pull request asks for (async-nats's default batch).
pub const PULL_BATCH: usize = 200;
/// How long past a request's expiry the loop waits for the broker's word on it (a message, its
/// `408`, any status) before it takes the request for lost and asks again.
pub const PULL_LOST_MARGIN: Duration = Duration::from_secs(1);
/// Pause before asking again after the broker refused a request (no responders, too many
/// waiting requests): a refusal must not turn the loop into a stream of requests.
pub const PULL_REFUSED_PAUSE: Duration = Duration::from_secs(1);

/// What the open requests of one loop may still bring: the one count the loop asks by.
#[derive(Debug, Clone)]
pub struct Owed {
    batch: usize,
    expires: Duration,
    /// Messages the open requests may still bring.
    messages: usize,
    /// When the last request was sent.
    asked: Option<Instant>,
    /// No request before this (after a refusal).
    hold: Option<Instant>,
}

impl Owed {
    pub fn new(batch: usize, expires: Duration) -> Owed {
        Owed {
            batch: batch.max(1),
            expires,
            messages: 0,
            asked: None,
            hold: None,
        }
    }

    /// Whether the loop should ask for more at `now`: what it may still get is at most half a
    /// batch, and no refusal holds it.
    pub fn wants(&self, now: Instant) -> bool {
        self.messages <= self.batch / 2 && self.hold.is_none_or(|h| now >= h)
    }

    /// A request for a batch was sent at `now`.
    pub fn asked(&mut self, now: Instant) {
        self.messages += self.batch;
        self.asked = Some(now);
        self.hold = None;
    }

    /// A message came.
    pub fn brought(&mut self) {
        self.messages = self.messages.saturating_sub(1);
    }

    /// A request ended (expired, completed, interest gone) with `left` messages it will not
    /// bring.
    pub fn ended(&mut self, left: usize) {
        self.messages = self.messages.saturating_sub(left);
    }

    /// A request was refused at `now`: none of its batch comes, and the next waits a pause.
    pub fn refused(&mut self, now: Instant) {
        self.messages = self.messages.saturating_sub(self.batch);
        self.hold = Some(now + PULL_REFUSED_PAUSE);
    }

    /// The broker holds none of the requests counted: ask afresh.
    pub fn forget(&mut self) {
        self.messages = 0;
    }

    /// When the requests counted are taken for lost if nothing is heard (`None`: none counted).
    pub fn lost_at(&self) -> Option<Instant> {
        let asked = self.asked?;
        (self.messages > 0).then(|| asked + self.expires + PULL_LOST_MARGIN)
    }

    /// When a held request may be sent (`None`: not held).
    pub fn held_until(&self) -> Option<Instant> {
        self.hold
    }

    /// Messages the open requests may still bring.
    pub fn messages(&self) -> usize {
        self.messages
    }
}

/// Why a pull stream reported something other than a message.
#[derive(Debug)]
pub struct PullEvent {
    /// The stream cannot go on (the consumer is gone or not a pull consumer; the client is
    /// closed): the loop opens a new one.
    pub ends: bool,
    pub error: BrokerError,
}

impl std::fmt::Display for PullEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

/// One loop's pull stream: its inbox, its requests and their count.
pub struct Pulls {
    client: async_nats::Client,
    js: async_nats::jetstream::Context,
    subject: Subject,
    inbox: Subject,
    sub: Subscriber,
    events: Option<broadcast::Receiver<ConnEvent>>,
    request: Bytes,
    owed: Owed,
    ended: bool,
}

impl Pulls {
    /// Opens a pull stream on `consumer` whose requests ask for [`PULL_BATCH`] messages and
    /// live `expires`.
    pub async fn open(
        ctx: &PlaneCtx,
        consumer: &Consumer<pull::Config>,
        expires: Duration,
    ) -> Result<Pulls, BrokerError> {
        let info = consumer.cached_info();
        // The subject the daemon's credential may publish to (the JetStream context uses the
        // default API prefix, no domain).
        let subject = Subject::from(js::consumer_next(&info.stream_name, &info.name));
        let inbox = Subject::from(ctx.client.new_inbox());
        // Subscribed before the first request is published on the same connection, so the
        // broker sees the interest before the request.
        let sub = ctx
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| BrokerError::new(BrokerErrorKind::Unsent, "subscribe").source(e))?;
        let request = serde_json::json!({
            "batch": PULL_BATCH,
            "expires": expires.as_nanos() as u64,
        })
        .to_string();
        Ok(Pulls {
            client: ctx.client.clone(),
            js: ctx.js.clone(),
            subject,
            inbox,
            sub,
            events: Some(ctx.conn.subscribe()),
            request: Bytes::from(request),
            owed: Owed::new(PULL_BATCH, expires),
            ended: false,
        })
    }

    /// The next message, or what the broker said instead (`Some(Err)`); `None` once the stream
    /// ended. Cancel-safe: a request is counted in the step that publishes it, and one whose
    /// publish was cancelled was neither sent nor counted.
    pub async fn next(&mut self) -> Option<Result<Message, PullEvent>> {
        loop {
            if self.ended {
                return None;
            }
            if self.owed.wants(Instant::now()) {
                let sent = self
                    .client
                    .publish_with_reply(
                        self.subject.clone(),
                        self.inbox.clone(),
                        self.request.clone(),
                    )
                    .await;
                if let Err(e) = sent {
                    self.ended = true;
                    let error = BrokerError::new(BrokerErrorKind::Unsent, "pull request").source(e);
                    return Some(Err(PullEvent { ends: true, error }));
                }
                self.owed.asked(Instant::now());
            }
            // What already arrived first, without arming a timer per message.
            let arrived = match self.sub.next().now_or_never() {
                Some(m) => Some(m),
                None => {
                    let lost = self.owed.lost_at();
                    let held = self.owed.held_until();
                    tokio::select! {
                        biased;
                        m = self.sub.next() => Some(m),
                        e = recv(&mut self.events) => {
                            match e {
                                // Requests die with the connection they came on.
                                Ok(ConnEvent::Connected) | Err(broadcast::error::RecvError::Lagged(_)) => {
                                    self.owed.forget();
                                }
                                Ok(_) => {}
                                Err(broadcast::error::RecvError::Closed) => self.events = None,
                            }
                            None
                        }
                        _ = sleep_until(lost) => {
                            tracing::debug!(subject = %self.subject, owed = self.owed.messages(), "no word on the pull requests past their expiry; asking again");
                            self.owed.forget();
                            None
                        }
                        _ = sleep_until(held) => None,
                    }
                }
            };
            let Some(arrived) = arrived else { continue };
            let Some(message) = arrived else {
                self.ended = true;
                return None;
            };
            if message.status.is_none_or(|s| s == StatusCode::OK) {
                self.owed.brought();
                return Some(Ok(Message {
                    message,
                    context: self.js.clone(),
                }));
            }
            if let Some(e) = judge_status(&mut self.owed, &message, Instant::now()) {
                self.ended |= e.ends;
                return Some(Err(e));
            }
        }
    }
}

/// What a status on a loop's inbox says: a request's end (`None`, its rest taken off `owed`), a
/// heartbeat (`None`), the requests voided by a new consumer leader (`None`, all of them
/// forgotten: the next is asked at once), or a refusal or the consumer's end, for the loop.
fn judge_status(owed: &mut Owed, message: &async_nats::Message, now: Instant) -> Option<PullEvent> {
    let status = message.status.unwrap_or(StatusCode::OK);
    if status == StatusCode::IDLE_HEARTBEAT {
        return None;
    }
    let description = message.description.as_deref().unwrap_or_default();
    let event = |ends: bool| {
        let text = format!("pull request: {} {description}", status.as_u16());
        Some(PullEvent {
            ends,
            error: BrokerError::new(BrokerErrorKind::Refused, text),
        })
    };
    if description == "Consumer Deleted" || description == "Consumer is push based" {
        return event(true);
    }
    // Sent once per inbox by a new leader for every request the old one held (nats-server's
    // `checkPendingRequests`): none of them will bring anything.
    if description == "Leadership Change" {
        owed.forget();
        return None;
    }
    let left = message
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Pending-Messages"))
        .and_then(|v| v.as_str().parse::<usize>().ok());
    match left {
        // A request ended (expired, completed, its interest gone): what it will not bring.
        Some(left) => {
            owed.ended(left);
            None
        }
        // Refused whole (no responders, too many waiting requests, over a limit).
        None => {
            owed.refused(now);
            event(description.starts_with("Exceeded MaxRequest"))
        }
    }
}

async fn recv(
    events: &mut Option<broadcast::Receiver<ConnEvent>>,
) -> Result<ConnEvent, broadcast::error::RecvError> {
    match events {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPIRES: Duration = Duration::from_secs(5);

    /// The count asks for more at half a batch, and only then. Mutation seen failing: `wants`
    /// comparing with the whole batch.
    #[test]
    fn a_loop_asks_again_once_half_a_batch_is_left() {
        let now = Instant::now();
        let mut owed = Owed::new(200, EXPIRES);
        assert!(owed.wants(now), "a new stream asks at once");
        owed.asked(now);
        for _ in 0..99 {
            owed.brought();
        }
        assert!(!owed.wants(now), "101 of 200 still to come");
        owed.brought();
        assert!(owed.wants(now), "100 of 200 still to come");
    }

    /// What a request was counted for and will not bring is taken off when it ends, and a
    /// refused request's whole batch with a pause before the next. Mutation seen failing:
    /// `refused` not setting the pause.
    #[test]
    fn an_ended_request_gives_back_its_rest_and_a_refused_one_pauses_the_loop() {
        let now = Instant::now();
        let mut owed = Owed::new(200, EXPIRES);
        owed.asked(now);
        owed.asked(now);
        assert_eq!(owed.messages(), 400);
        owed.ended(200);
        assert_eq!(owed.messages(), 200);
        owed.refused(now);
        assert_eq!(owed.messages(), 0);
        assert!(!owed.wants(now), "a refusal holds the next request");
        assert!(owed.wants(now + PULL_REFUSED_PAUSE));
        assert_eq!(owed.held_until(), Some(now + PULL_REFUSED_PAUSE));
    }

    fn status(code: u16, description: &str, left: Option<usize>) -> async_nats::Message {
        let headers = left.map(|n| {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Pending-Messages", n.to_string().as_str());
            h
        });
        async_nats::Message {
            subject: "_INBOX.x".into(),
            reply: None,
            payload: Bytes::new(),
            headers,
            status: Some(StatusCode::from_u16(code).unwrap()),
            description: Some(description.to_string()),
            length: 0,
        }
    }

    /// The broker's words on the inbox, as the count takes them: an expiry gives back what its
    /// request will not bring; a new leader voids every request at once (the next is asked
    /// now, not after a pause); no responders refuses one request and pauses the loop; a
    /// deleted consumer ends the stream. Mutation seen failing: "Leadership Change" judged as
    /// a refusal (one batch taken off, the next request held 1 s).
    #[test]
    fn the_brokers_statuses_move_the_count_as_they_say() {
        let now = Instant::now();
        let mut owed = Owed::new(200, EXPIRES);
        owed.asked(now);
        owed.asked(now);
        assert!(judge_status(&mut owed, &status(408, "Request Timeout", Some(150)), now).is_none());
        assert_eq!(owed.messages(), 250);
        assert!(judge_status(&mut owed, &status(100, "Idle Heartbeat", None), now).is_none());
        assert_eq!(owed.messages(), 250);
        assert!(judge_status(&mut owed, &status(409, "Leadership Change", None), now).is_none());
        assert_eq!(owed.messages(), 0);
        assert!(owed.wants(now), "asked again at once after a leader change");
        owed.asked(now);
        let refused = judge_status(&mut owed, &status(503, "", None), now).expect("a refusal");
        assert!(!refused.ends);
        assert!(!owed.wants(now), "a refusal holds the next request");
        let gone = judge_status(&mut owed, &status(409, "Consumer Deleted", None), now);
        assert!(gone.expect("the consumer's end").ends);
    }

    /// Requests nothing was heard about past their expiry and the margin are taken for lost;
    /// with nothing counted there is nothing to lose. Mutation seen failing: `lost_at` without
    /// the margin.
    #[test]
    fn requests_unheard_past_their_expiry_are_taken_for_lost() {
        let now = Instant::now();
        let mut owed = Owed::new(200, EXPIRES);
        assert_eq!(owed.lost_at(), None);
        owed.asked(now);
        assert_eq!(owed.lost_at(), Some(now + EXPIRES + PULL_LOST_MARGIN));
        owed.forget();
        assert_eq!(owed.lost_at(), None);
        assert!(owed.wants(now));
    }
}
