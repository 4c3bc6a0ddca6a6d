//! The checkpoint timer writer (docs/timer-writer.md): the standing pump that turns workflow `.schedule`
//! requests into armed broker schedules. Without it no workflow pause on the space ever expires.
//!
//! Why a component of its own: it runs inside the space daemon but must never take delivery
//! down, so it owns its connection (under the daemon's *current* credential, moved onto each
//! adopted renewal), its durable `timerw_<s>`, and a restart loop with a bounded, doubling
//! backoff that logs while it is down. Stopping it ends a pending fetch and wakes the backoff
//! at once. It only ever publishes `.armed`: the `.fire` target is derived from the request
//! subject's own tokens and published by the broker's scheduler, never by the writer.
//! Request, status and armed shapes are in `docs/timer-writer.md`.

use std::time::{Duration, Instant, UNIX_EPOCH};

use async_nats::jetstream::consumer::{pull, AckPolicy, Consumer, DeliverPolicy};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, AckKind, Message};
use async_nats::HeaderMap;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::base::{
    self, broker_words, utc_timestamp, CredentialCell, DialSpec, Journal, Read, Rows,
};
use crate::wire::{Space, SpaceNames};

/// Client name of the writer's own connection (what `/connz` shows).
pub const CONNECTION_NAME: &str = "cotal-delivery-timer-writer";
/// The backoff doubles after each failed start up to this cap (the reference's 300 s).
pub const RETRY_CAP: Duration = Duration::from_millis(300_000);
const _: () = assert!(crate::base::DEFAULT_TIMER_RETRY.as_millis() <= RETRY_CAP.as_millis());
/// `ack_wait` of `timerw_<s>` (docs/timer-writer.md).
pub const ACK_WAIT: Duration = Duration::from_secs(60);
/// Requests pulled per fetch.
pub const FETCH_BATCH: usize = 16;
/// Fenced `.armed` publishes per request before it is handed back for redelivery.
pub const ARM_ATTEMPTS: usize = 3;
/// Bound on each JetStream request (status read, last-seq read, publish ack).
pub const REQUEST_BOUND: Duration = crate::base::BROKER_BOUND;
/// Redelivery delay of a request that could not be decided now (a read or publish failed).
pub const RETRY_REQUEST_AFTER: Duration = Duration::from_secs(5);
/// How long a connection that dropped (or was moved onto a renewed credential) may take to
/// come back before the writer counts it as a fault and restarts.
pub const RECONNECT_GRACE: Duration = Duration::from_secs(5);
/// Bound on draining the writer's connection when it stops or restarts.
pub const DRAIN_BOUND: Duration = Duration::from_millis(1_000);
/// Bound on waiting for the loop to end after a stop (it ends at the next await).
pub const STOP_BOUND: Duration = Duration::from_millis(2_000);
/// Headers a `.schedule` request may never carry: only the writer schedules.
pub const SCHEDULING_HEADERS: [&str; 4] = [
    "Nats-Schedule",
    "Nats-Schedule-Target",
    "Nats-Schedule-Rollup",
    "Nats-Scheduler",
];
/// The latest deadline a request may name: `Date.UTC(9999, 11, 31, 23, 59, 59, 999)`.
pub const MAX_DEADLINE_MS: i64 = 253_402_300_799_999;

/// A `.schedule` request body. `plane`, `phase` and `space` are optional; when present they must
/// say `timer`, `schedule` and the daemon's space.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleRequest {
    pub v: u32,
    pub timer_id: String,
    pub generation: u64,
    /// Unix milliseconds.
    pub deadline: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plane: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<String>,
}

/// The authoritative timer status (`cotal_records_<s>`, key [`status_key`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimerStatus {
    /// `waiting` while the pause runs; anything else means settled.
    pub state: String,
    pub generation: u64,
    pub deadline: i64,
}

/// The `.armed` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Armed {
    pub v: u32,
    pub timer_id: String,
    pub generation: u64,
    pub deadline: i64,
}

/// Records key of a timer's status: `cp.<endpoint>.<timerId>.status`.
pub fn status_key(endpoint: &str, timer_id: &str) -> String {
    format!("cp.{endpoint}.{timer_id}.status")
}

/// Why a `.schedule` request is refused for good (terminated, never redelivered): its kind,
/// the reason the writer's line quotes (`Display`), and the parser's error behind it.
#[derive(Debug)]
pub struct ScheduleRefusal {
    kind: ScheduleRefusalKind,
    text: String,
    source: Option<serde_json::Error>,
}

/// What is wrong with a refused `.schedule` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleRefusalKind {
    /// It carries a scheduling header: only the writer schedules.
    Header,
    /// Its subject is not `<endpoint>.<instance>.<epoch>.<timerId>.schedule` of this space.
    Subject,
    /// Its body is not a schedule request.
    Body,
    /// Its `v` is not 1.
    Version,
    /// Its `timerId` differs from the subject's.
    TimerId,
    /// Its `generation` is below 1.
    Generation,
    /// Its `deadline` is outside `0..=MAX_DEADLINE_MS`.
    Deadline,
    /// Its `plane`, `phase` or `space` says something else than `timer`, `schedule`, this space.
    Field,
}

impl ScheduleRefusal {
    fn new(kind: ScheduleRefusalKind, text: impl Into<String>) -> ScheduleRefusal {
        ScheduleRefusal {
            kind,
            text: text.into(),
            source: None,
        }
    }
    pub fn kind(&self) -> ScheduleRefusalKind {
        self.kind
    }
}

impl std::fmt::Display for ScheduleRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for ScheduleRefusal {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A fault of the writer: the session ends and restarts after the backoff, or (a read or a
/// publish of one request) the request is handed back for redelivery. Its kind, the text the
/// writer's line quotes (`Display`), and the broker's or the client's error behind it.
#[derive(Debug)]
pub struct WriterFault {
    kind: WriterFaultKind,
    text: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// What the writer could not do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriterFaultKind {
    /// Its own connection could not be dialed.
    Dial,
    /// `EPT_REQ_<s>` or `EPT_<s>` could not be looked up.
    Stream,
    /// `timerw_<s>` could not be bound, fetched from, or is gone.
    Durable,
    /// The records bucket could not be opened.
    Bucket,
    /// The last `.armed` sequence could not be read.
    Read,
    /// The `.armed` publish failed.
    Publish,
    /// No answer within the bound.
    TimedOut,
}

impl WriterFault {
    fn new(kind: WriterFaultKind, text: impl Into<String>) -> WriterFault {
        WriterFault {
            kind,
            text: text.into(),
            source: None,
        }
    }
    /// The same fault, keeping `source` as its cause.
    fn source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> WriterFault {
        self.source = Some(source.into());
        self
    }
    /// The same fault named in its context: `context(text)` says where, this one is its cause.
    fn within(self, context: impl FnOnce(&str) -> String) -> WriterFault {
        WriterFault::new(self.kind, context(&self.text)).source(self)
    }
    /// An answer that did not come within `bound`.
    fn timed_out(bound: Duration) -> WriterFault {
        WriterFault::new(
            WriterFaultKind::TimedOut,
            format!("no answer within {} ms", bound.as_millis()),
        )
    }
    pub fn kind(&self) -> WriterFaultKind {
        self.kind
    }
}

impl std::fmt::Display for WriterFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for WriterFault {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A broker refusal of `kind`, in the broker's words (`what: words`).
fn broker_fault<E: std::error::Error + Send + Sync + 'static>(
    kind: WriterFaultKind,
    what: impl FnOnce(&str) -> String,
) -> impl FnOnce(E) -> WriterFault {
    move |e| WriterFault::new(kind, what(&broker_words(&e))).source(e)
}

/// The coordinate a `.schedule` subject names: `cotal.<s>.ept.<endpoint>.<instance>.<epoch>.<timerId>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerSubject {
    /// `cotal.<s>.ept.<endpoint>.<instance>.<epoch>.<timerId>` (no leaf).
    base: String,
    pub endpoint: String,
    pub timer_id: String,
}

impl TimerSubject {
    /// Parses a request subject of `space`; only the six tokens after the prefix and the
    /// `schedule` leaf are accepted.
    pub fn parse(space: &Space, subject: &str) -> Result<TimerSubject, ScheduleRefusal> {
        let refused = |text: String| ScheduleRefusal::new(ScheduleRefusalKind::Subject, text);
        let prefix = format!("{}.ept.", space.prefix());
        let rest = subject
            .strip_prefix(&prefix)
            .ok_or_else(|| refused(format!("{subject} is not an ept subject of space {space}")))?;
        let tokens: Vec<&str> = rest.split('.').collect();
        match tokens.as_slice() {
            [endpoint, instance, epoch, timer, "schedule"]
                if [endpoint, instance, epoch, timer]
                    .iter()
                    .all(|t| !t.is_empty() && !t.contains(['*', '>'])) =>
            {
                Ok(TimerSubject {
                    base: format!("{prefix}{endpoint}.{instance}.{epoch}.{timer}"),
                    endpoint: endpoint.to_string(),
                    timer_id: timer.to_string(),
                })
            }
            _ => Err(refused(format!(
                "{subject} is not <endpoint>.<instance>.<epoch>.<timerId>.schedule"
            ))),
        }
    }
    /// The sibling the writer publishes: `….armed`.
    pub fn armed(&self) -> String {
        format!("{}.armed", self.base)
    }
    /// The sibling the broker's scheduler publishes: `….fire`.
    pub fn fire(&self) -> String {
        format!("{}.fire", self.base)
    }
}

/// Checks a request body against its subject; the reason on refusal.
pub fn check_request(
    space: &Space,
    subject: &TimerSubject,
    body: &[u8],
) -> Result<ScheduleRequest, ScheduleRefusal> {
    use ScheduleRefusalKind as K;
    let req: ScheduleRequest = serde_json::from_slice(body).map_err(|e| ScheduleRefusal {
        kind: K::Body,
        text: format!("the body is not a schedule request ({e})"),
        source: Some(e),
    })?;
    let refused = |kind, text: String| Err(ScheduleRefusal::new(kind, text));
    if req.v != 1 {
        return refused(K::Version, format!("version {} is not 1", req.v));
    }
    if req.timer_id != subject.timer_id {
        return refused(
            K::TimerId,
            format!(
                "timerId {:?} differs from the subject's {:?}",
                req.timer_id, subject.timer_id
            ),
        );
    }
    if req.generation < 1 {
        return refused(K::Generation, "generation must be at least 1".into());
    }
    if !(0..=MAX_DEADLINE_MS).contains(&req.deadline) {
        return refused(
            K::Deadline,
            format!("deadline {} is out of range", req.deadline),
        );
    }
    let fields = [
        ("plane", req.plane.as_deref(), "timer"),
        ("phase", req.phase.as_deref(), "schedule"),
        ("space", req.space.as_deref(), space.as_str()),
    ];
    for (name, got, want) in fields {
        if let Some(got) = got {
            if got != want {
                return refused(K::Field, format!("{name} {got:?} is not {want:?}"));
            }
        }
    }
    Ok(req)
}

/// The decision after an arm: the coordinate to arm again when the re-read status is still
/// `waiting` at a different (generation, deadline) that does not go back in generation (a
/// heartbeat moved it); `None` when the armed coordinate is still live, the status settled or
/// vanished, or the re-read went back.
pub fn live_coordinate(
    armed: &ScheduleRequest,
    reread: Option<&TimerStatus>,
) -> Option<ScheduleRequest> {
    let st = reread?;
    if st.state != "waiting" || st.generation < armed.generation {
        return None;
    }
    if st.generation == armed.generation && st.deadline == armed.deadline {
        return None;
    }
    if !(0..=MAX_DEADLINE_MS).contains(&st.deadline) {
        return None;
    }
    Some(ScheduleRequest {
        generation: st.generation,
        deadline: st.deadline,
        ..armed.clone()
    })
}

/// The scheduling header a request carries, if any.
pub fn scheduling_header(headers: Option<&HeaderMap>) -> Option<&'static str> {
    let headers = headers?;
    SCHEDULING_HEADERS
        .into_iter()
        .find(|h| headers.get(*h).is_some())
}

/// What the writer is doing (observable by its host and by tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriterState {
    Starting,
    Up,
    /// Sleeping through a restart backoff.
    Down,
    Stopped,
}

/// How to run a writer.
#[derive(Clone)]
pub struct TimerWriterParts {
    /// Dial spec of the writer's own connection (named [`CONNECTION_NAME`]).
    pub dial: DialSpec,
    /// The daemon's credential cell: the writer presents what it holds now and reconnects when
    /// a renewal is adopted into it.
    pub credential: CredentialCell,
    pub space: Space,
    pub journal: Journal,
    pub retry: Duration,
    pub poll: Duration,
}

impl TimerWriterParts {
    /// Parts with the retry and poll intervals from the environment overrides.
    pub fn new(
        dial: DialSpec,
        credential: CredentialCell,
        space: Space,
        journal: Journal,
    ) -> TimerWriterParts {
        TimerWriterParts {
            dial: dial.name(CONNECTION_NAME),
            credential,
            space,
            journal,
            retry: crate::base::DEFAULT_TIMER_RETRY,
            poll: crate::base::DEFAULT_TIMER_POLL,
        }
    }
}

/// A running writer. Dropping it asks it to stop without waiting.
pub struct TimerWriter {
    stop: watch::Sender<bool>,
    state: watch::Receiver<WriterState>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TimerWriter {
    /// Starts the writer's restart loop in the background.
    pub fn start(parts: TimerWriterParts) -> TimerWriter {
        let (stop, stop_rx) = watch::channel(false);
        let (state_tx, state) = watch::channel(WriterState::Starting);
        let task = tokio::spawn(run(parts, stop_rx, state_tx));
        TimerWriter {
            stop,
            state,
            task: Some(task),
        }
    }

    pub fn state(&self) -> WriterState {
        *self.state.borrow()
    }

    /// Waits (at most `bound`) until the writer is in `want`; whether it got there.
    pub async fn wait_state(&self, want: WriterState, bound: Duration) -> bool {
        let mut rx = self.state.clone();
        tokio::time::timeout(bound, rx.wait_for(|s| *s == want))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }

    /// Stops the writer: ends a pending fetch, wakes a backoff, drains its connection
    /// (bounded by [`DRAIN_BOUND`]) and waits for the loop (bounded by [`STOP_BOUND`]).
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(STOP_BOUND, task).await;
        }
    }
}

impl Drop for TimerWriter {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The restart loop: a session until it faults, then the logged backoff.
async fn run(
    parts: TimerWriterParts,
    mut stop: watch::Receiver<bool>,
    state: watch::Sender<WriterState>,
) {
    let mut backoff = parts.retry;
    loop {
        if *stop.borrow() {
            break;
        }
        state.send_replace(WriterState::Starting);
        let Some(fault) = session(&parts, &mut stop, &state, &mut backoff).await else {
            break;
        };
        if *stop.borrow() {
            break;
        }
        state.send_replace(WriterState::Down);
        parts.journal.line(format!(
            "! timer writer: down ({fault}) — retrying in {}s; pauses on this space do not expire until it is back",
            (backoff.as_millis() as f64 / 1000.0).round() as u64
        ));
        tokio::select! {
            _ = stopped(&mut stop) => break,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RETRY_CAP);
    }
    state.send_replace(WriterState::Stopped);
}

/// One connection's life: dial, bind the durable, pump. `None` when stopped, else the fault.
async fn session(
    parts: &TimerWriterParts,
    stop: &mut watch::Receiver<bool>,
    state: &watch::Sender<WriterState>,
    backoff: &mut Duration,
) -> Option<WriterFault> {
    let dialed = tokio::select! {
        _ = stopped(stop) => return None,
        r = base::dial(&parts.dial, parts.credential.clone()) => r,
    };
    let resident = match dialed {
        Ok(r) => r,
        Err(e) => {
            return Some(WriterFault::new(WriterFaultKind::Dial, format!("dial: {e}")).source(e))
        }
    };
    // The pump watches the stop itself (between requests), so a request being armed settles.
    let outcome = pump(parts, &resident.client, stop.clone(), state, backoff).await;
    // Retired before the drain: a connection that is down never redials after the session.
    resident.close(DRAIN_BOUND).await;
    outcome
}

/// Binds `timerw_<s>` and arms each request until a fault (or the stop, `None`).
async fn pump(
    parts: &TimerWriterParts,
    client: &async_nats::Client,
    mut stop: watch::Receiver<bool>,
    state: &watch::Sender<WriterState>,
    backoff: &mut Duration,
) -> Option<WriterFault> {
    let names = SpaceNames::new(&parts.space);
    let js = jetstream::context::ContextBuilder::new()
        .timeout(REQUEST_BOUND)
        .build(client.clone());
    let setup = async {
        let consumer = bind(&js, &names).await?;
        let arming = Arming::open(&js, &names, &parts.space).await?;
        Ok::<_, WriterFault>((consumer, arming))
    };
    let (consumer, arming) = tokio::select! {
        _ = stopped(&mut stop) => return None,
        r = setup => match r {
            Ok(pair) => pair,
            Err(e) => return Some(e),
        },
    };
    parts.journal.line(format!(
        "✓ timer writer up (space {}) — workflow pauses on this space expire",
        parts.space
    ));
    state.send_replace(WriterState::Up);
    *backoff = parts.retry;

    let mut renewals = parts.credential.changes();
    renewals.borrow_and_update();
    // A reconnect the writer forced (onto a renewed credential) may fail the fetch in flight.
    let mut forced_at: Option<Instant> = None;
    loop {
        let began = Instant::now();
        let fetched = tokio::select! {
            _ = stopped(&mut stop) => return None,
            changed = renewals.changed() => {
                if changed.is_ok() {
                    // Present the adopted credential now, long before the old one expires.
                    let _ = client.force_reconnect().await;
                    forced_at = Some(Instant::now());
                }
                continue;
            }
            b = fetch(&consumer, parts.poll) => b.map_err(|e| {
                e.within(|e| format!("fetching from its durable {}: {e}", names.timer_writer_durable()))
            }),
        };
        let result = match fetched {
            Ok(batch) if batch.is_empty() => {
                // An idle fetch does not prove the durable still exists: ask.
                let mut c = consumer.clone();
                c.info()
                    .await
                    .map(|_| ())
                    .map_err(broker_fault(WriterFaultKind::Durable, |words| {
                        format!("its durable {}: {words}", names.timer_writer_durable())
                    }))
            }
            Ok(batch) => {
                for msg in batch {
                    if *stop.borrow() {
                        return None;
                    }
                    arming.settle(&parts.journal, &msg).await;
                }
                Ok(())
            }
            Err(e) => Err(e),
        };
        if let Err(fault) = result {
            // Judged by when the failed round began: a request lost in the forced reconnect
            // fails only once its own bound (5 s) has run, past the grace counted from the force.
            let forced = forced_at
                .take()
                .is_some_and(|t| began.saturating_duration_since(t) < RECONNECT_GRACE);
            let dropped = client.connection_state() != async_nats::connection::State::Connected;
            if (forced || dropped) && reconnected(client, &mut stop).await {
                continue;
            }
            return Some(fault);
        }
    }
}

/// Waits (bounded by [`RECONNECT_GRACE`]) for the client to be connected again.
async fn reconnected(client: &async_nats::Client, stop: &mut watch::Receiver<bool>) -> bool {
    let deadline = Instant::now() + RECONNECT_GRACE;
    while Instant::now() < deadline {
        if *stop.borrow() {
            return false;
        }
        if client.connection_state() == async_nats::connection::State::Connected {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Creates (or accepts) `timerw_<s>` on `EPT_REQ_<s>`.
async fn bind(
    js: &jetstream::Context,
    names: &SpaceNames,
) -> Result<Consumer<pull::Config>, WriterFault> {
    let stream = js
        .get_stream_no_info(names.ept_req_stream())
        .await
        .map_err(broker_fault(WriterFaultKind::Stream, |words| {
            format!("{}: {words}", names.ept_req_stream())
        }))?;
    let durable = names.timer_writer_durable();
    let config = pull::Config {
        durable_name: Some(durable.clone()),
        filter_subject: names.ept_schedule_filter(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        deliver_policy: DeliverPolicy::All,
        ..Default::default()
    };
    stream
        .create_consumer(config)
        .await
        .map_err(broker_fault(WriterFaultKind::Durable, |words| {
            format!("binding its durable {durable}: {words}")
        }))
}

/// The client ends a pull whose answer never came (a pull written to a socket that a reconnect
/// then replaced is lost) this long after its expiry, as an empty batch (async-nats 0.51:
/// `expires + 5 s`).
const CLIENT_PULL_GRACE: Duration = Duration::from_secs(5);
/// Our own bound on a fetch outlasts the client's by this much, so a lost pull ends as the
/// empty batch it is (the writer pulls again), never as a fault; the bound is left for a fetch
/// that hangs. With equal bounds the two raced, and the writer restarted on a lost pull.
const FETCH_MARGIN: Duration = Duration::from_secs(1);

/// One fetch, bounded by the poll plus the client's own pull grace plus a margin.
async fn fetch(
    consumer: &Consumer<pull::Config>,
    poll: Duration,
) -> Result<Vec<Message>, WriterFault> {
    let failed = |e: Box<dyn std::error::Error + Send + Sync>| {
        WriterFault::new(WriterFaultKind::Durable, e.to_string()).source(e)
    };
    let pull = async {
        let mut batch = consumer
            .fetch()
            .max_messages(FETCH_BATCH)
            .expires(poll)
            .messages()
            .await
            .map_err(|e| failed(e.into()))?;
        let mut out = Vec::new();
        while let Some(m) = batch.next().await {
            out.push(m.map_err(failed)?);
        }
        Ok(out)
    };
    let bound = poll + CLIENT_PULL_GRACE + FETCH_MARGIN;
    tokio::time::timeout(bound, pull)
        .await
        .unwrap_or_else(|_| Err(WriterFault::timed_out(bound)))
}

/// What one request came to.
#[derive(Debug)]
pub enum Outcome {
    /// `.armed` published at this stream sequence.
    Armed(u64),
    /// Not armed, and never will be: `unknown`, `settled` or `stale`.
    Discarded(&'static str),
    /// Malformed or carrying scheduling headers: terminated, never redelivered.
    Refused(ScheduleRefusal),
    /// Could not be decided now (a read or publish failed, or the pin moved every time).
    Retry(String),
}

/// The arming side: the status bucket and the `.armed` stream.
struct Arming {
    js: jetstream::Context,
    space: Space,
    records: Rows,
    ept: jetstream::stream::Stream<()>,
}

impl Arming {
    async fn open(
        js: &jetstream::Context,
        names: &SpaceNames,
        space: &Space,
    ) -> Result<Arming, WriterFault> {
        let records = Rows::open(js, &names.records_bucket(), REQUEST_BOUND)
            .await
            .map_err(|e| {
                WriterFault::new(
                    WriterFaultKind::Bucket,
                    format!("{}: {e}", names.records_bucket()),
                )
                .source(e)
            })?;
        let ept = js
            .get_stream_no_info(names.ept_stream())
            .await
            .map_err(broker_fault(WriterFaultKind::Stream, |words| {
                format!("{}: {words}", names.ept_stream())
            }))?;
        Ok(Arming {
            js: js.clone(),
            space: space.clone(),
            records,
            ept,
        })
    }

    /// Decides `msg` and settles it: ack when armed or discarded, term when refused, nak
    /// (after [`RETRY_REQUEST_AFTER`]) when it could not be decided now.
    async fn settle(&self, journal: &Journal, msg: &Message) {
        let outcome = self.decide(msg).await;
        let kind = match &outcome {
            Outcome::Armed(seq) => {
                tracing::debug!(subject = %msg.subject, seq, "timer armed");
                AckKind::Ack
            }
            Outcome::Discarded(reason) => {
                journal.line(format!(
                    "• timer writer: discarded {} ({reason}); not armed",
                    msg.subject
                ));
                AckKind::Ack
            }
            Outcome::Refused(why) => {
                journal.line(format!(
                    "! timer writer: refused a .schedule request permanently ({}: {why})",
                    msg.subject
                ));
                AckKind::Term
            }
            Outcome::Retry(why) => {
                journal.line(format!("! timer writer: {why}"));
                AckKind::Nak(Some(RETRY_REQUEST_AFTER))
            }
        };
        if let Err(e) = msg.ack_with(kind).await {
            tracing::warn!(subject = %msg.subject, error = %e, "settling a .schedule request failed; it will redeliver");
        }
    }

    async fn decide(&self, msg: &Message) -> Outcome {
        if let Some(h) = scheduling_header(msg.headers.as_ref()) {
            return Outcome::Refused(ScheduleRefusal::new(
                ScheduleRefusalKind::Header,
                format!("it carries the scheduling header {h}"),
            ));
        }
        // The target comes from the authenticated subject only, never from body or headers.
        let subject = match TimerSubject::parse(&self.space, msg.subject.as_str()) {
            Ok(s) => s,
            Err(e) => return Outcome::Refused(e),
        };
        let req = match check_request(&self.space, &subject, &msg.payload) {
            Ok(r) => r,
            Err(e) => return Outcome::Refused(e),
        };
        self.arm(&subject, &req).await
    }

    /// The fenced arm: pin `.armed`'s last sequence, fresh-check the status leader-served,
    /// publish with the pin; a lost pin retries (at most [`ARM_ATTEMPTS`]).
    async fn arm(&self, subject: &TimerSubject, req: &ScheduleRequest) -> Outcome {
        let armed = subject.armed();
        let key = status_key(&subject.endpoint, &subject.timer_id);
        for _ in 0..ARM_ATTEMPTS {
            let pin = match self.last_seq(&armed).await {
                Ok(seq) => seq,
                Err(e) => return Outcome::Retry(format!("reading {armed}: {e}; retrying")),
            };
            match self.records.read(&key).await {
                Ok(Read::Absent { .. }) => return Outcome::Discarded("unknown"),
                Ok(Read::Present(row)) => match serde_json::from_slice::<TimerStatus>(&row.value) {
                    Ok(st) if st.state != "waiting" => return Outcome::Discarded("settled"),
                    Ok(st) if st.generation != req.generation || st.deadline != req.deadline => {
                        return Outcome::Discarded("stale")
                    }
                    Ok(_) => {}
                    Err(_) => return Outcome::Discarded("unknown"),
                },
                Err(e) => {
                    return Outcome::Retry(format!(
                        "the status {key} is unavailable ({e}); retrying"
                    ))
                }
            }
            match self.publish_armed(subject, req, pin).await {
                Ok(seq) => return self.rearm_if_moved(subject, req, &key, seq).await,
                Err(ArmError::Moved) => continue,
                Err(ArmError::Failed(e)) => {
                    return Outcome::Retry(format!("publishing {armed}: {e}; retrying"))
                }
            }
        }
        Outcome::Retry(format!(
            "the .armed subject for {} moved on every fenced attempt; re-deliver the request and retry (SPEC 13.6)",
            subject.base
        ))
    }

    /// The re-read after the arm (docs/timer-writer.md): the status is read once more,
    /// leader-served; if a heartbeat moved the live coordinate while the arm was in flight,
    /// that live coordinate is armed too, pinned on the `.armed` just published. A failed
    /// re-read or a lost pin keeps the first arm: the fire of a stale generation is discarded by
    /// its consumer, and a lost pin means a newer arm already landed.
    async fn rearm_if_moved(
        &self,
        subject: &TimerSubject,
        req: &ScheduleRequest,
        key: &str,
        seq: u64,
    ) -> Outcome {
        let live = match self.records.read(key).await {
            Ok(Read::Present(row)) => serde_json::from_slice::<TimerStatus>(&row.value).ok(),
            Ok(Read::Absent { .. }) => None,
            Err(e) => {
                tracing::warn!(%key, error = %e, "re-reading the timer status after the arm failed; the first arm stands");
                None
            }
        };
        let Some(live) = live_coordinate(req, live.as_ref()) else {
            return Outcome::Armed(seq);
        };
        match self.publish_armed(subject, &live, seq).await {
            Ok(rearmed) => Outcome::Armed(rearmed),
            Err(ArmError::Moved) => Outcome::Armed(seq),
            Err(ArmError::Failed(e)) => {
                tracing::warn!(subject = %subject.armed(), error = %e, "arming the moved coordinate failed; the first arm stands");
                Outcome::Armed(seq)
            }
        }
    }

    /// Leader-served last sequence of `subject` on `EPT_<s>` (0 when none).
    async fn last_seq(&self, subject: &str) -> Result<u64, WriterFault> {
        match tokio::time::timeout(
            REQUEST_BOUND,
            self.ept.get_last_raw_message_by_subject(subject),
        )
        .await
        {
            Ok(Ok(m)) => Ok(m.sequence),
            Ok(Err(e)) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(0),
            Ok(Err(e)) => Err(broker_fault(WriterFaultKind::Read, str::to_string)(e)),
            Err(_) => Err(WriterFault::timed_out(REQUEST_BOUND)),
        }
    }

    async fn publish_armed(
        &self,
        subject: &TimerSubject,
        req: &ScheduleRequest,
        pin: u64,
    ) -> Result<u64, ArmError> {
        let at = utc_timestamp(UNIX_EPOCH + Duration::from_millis(req.deadline.max(0) as u64));
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Schedule", format!("@at {at}").as_str());
        headers.insert("Nats-Schedule-Target", subject.fire().as_str());
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence",
            pin.to_string().as_str(),
        );
        let body = serde_json::to_vec(&Armed {
            v: 1,
            timer_id: req.timer_id.clone(),
            generation: req.generation,
            deadline: req.deadline,
        })
        .unwrap_or_default();
        let send = async {
            let ack = self
                .js
                .publish_with_headers(subject.armed(), headers, body.into())
                .await?;
            ack.await
        };
        match tokio::time::timeout(REQUEST_BOUND, send).await {
            Ok(Ok(ack)) => Ok(ack.sequence),
            Ok(Err(e)) if e.kind() == PublishErrorKind::WrongLastSequence => Err(ArmError::Moved),
            Ok(Err(e)) => Err(ArmError::Failed(broker_fault(
                WriterFaultKind::Publish,
                str::to_string,
            )(e))),
            Err(_) => Err(ArmError::Failed(WriterFault::timed_out(REQUEST_BOUND))),
        }
    }
}

enum ArmError {
    /// The pin lost: another `.armed` landed since it was read.
    Moved,
    Failed(WriterFault),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo() -> Space {
        Space::parse("demo").expect("space")
    }

    #[test]
    fn the_fire_target_comes_from_the_subject_tokens_only() {
        let s = TimerSubject::parse(&demo(), "cotal.demo.ept.wf.i1.3.t9.schedule").expect("parse");
        assert_eq!(s.armed(), "cotal.demo.ept.wf.i1.3.t9.armed");
        assert_eq!(s.fire(), "cotal.demo.ept.wf.i1.3.t9.fire");
        assert_eq!(status_key(&s.endpoint, &s.timer_id), "cp.wf.t9.status");
        for bad in [
            "cotal.other.ept.wf.i1.3.t9.schedule",
            "cotal.demo.ept.wf.i1.3.schedule",
            "cotal.demo.ept.wf.i1.3.t9.armed",
            "cotal.demo.ept.wf.i1.3.t9.x.schedule",
        ] {
            let e = TimerSubject::parse(&demo(), bad).expect_err(bad);
            assert_eq!(e.kind(), ScheduleRefusalKind::Subject, "{bad}");
        }
    }

    /// Each refusal names what is wrong (its kind) in the writer's words. Mutation seen failing:
    /// the deadline check refusing with the generation's kind.
    #[test]
    fn request_bodies_are_checked_against_the_subject() {
        use ScheduleRefusalKind as K;
        let s = TimerSubject::parse(&demo(), "cotal.demo.ept.wf.i1.3.t9.schedule").expect("parse");
        let ok = br#"{"v":1,"timerId":"t9","generation":2,"deadline":1000}"#;
        assert_eq!(check_request(&demo(), &s, ok).expect("ok").generation, 2);
        for (bad, kind) in [
            (
                &br#"{"v":2,"timerId":"t9","generation":2,"deadline":1000}"#[..],
                K::Version,
            ),
            (
                br#"{"v":1,"timerId":"other","generation":2,"deadline":1000}"#,
                K::TimerId,
            ),
            (
                br#"{"v":1,"timerId":"t9","generation":0,"deadline":1000}"#,
                K::Generation,
            ),
            (
                br#"{"v":1,"timerId":"t9","generation":1,"deadline":-1}"#,
                K::Deadline,
            ),
            (
                br#"{"v":1,"timerId":"t9","generation":1,"deadline":253402300800000}"#,
                K::Deadline,
            ),
            (
                br#"{"v":1,"timerId":"t9","generation":1,"deadline":1,"space":"other"}"#,
                K::Field,
            ),
            (
                br#"{"v":1,"timerId":"t9","generation":1,"deadline":1,"plane":"chat"}"#,
                K::Field,
            ),
            (b"not json", K::Body),
        ] {
            let e = check_request(&demo(), &s, bad).expect_err("refused");
            assert_eq!(e.kind(), kind, "{e}");
        }
        let e = check_request(
            &demo(),
            &s,
            br#"{"v":1,"timerId":"t9","generation":1,"deadline":-1}"#,
        )
        .expect_err("refused");
        assert_eq!(e.to_string(), "deadline -1 is out of range");
        let e = check_request(&demo(), &s, b"not json").expect_err("refused");
        assert!(
            std::error::Error::source(&e).is_some(),
            "the parser's error is kept"
        );
    }

    /// The re-read after the arm: only a still-waiting status at a moved, not older coordinate
    /// is armed again. Mutations seen failing: dropping the `state != "waiting"` check (the
    /// settled case re-armed), and comparing only the generation (the heartbeat-moved deadline
    /// at the same generation left unarmed).
    #[test]
    fn the_re_read_after_the_arm_arms_only_a_moved_live_coordinate() {
        let armed = ScheduleRequest {
            v: 1,
            timer_id: "t9".into(),
            generation: 3,
            deadline: 1_000,
            plane: None,
            phase: None,
            space: None,
        };
        let st = |state: &str, generation, deadline| TimerStatus {
            state: state.into(),
            generation,
            deadline,
        };
        assert_eq!(live_coordinate(&armed, None), None, "vanished");
        assert_eq!(
            live_coordinate(&armed, Some(&st("waiting", 3, 1_000))),
            None,
            "unmoved"
        );
        assert_eq!(
            live_coordinate(&armed, Some(&st("done", 4, 2_000))),
            None,
            "settled"
        );
        assert_eq!(
            live_coordinate(&armed, Some(&st("waiting", 2, 2_000))),
            None,
            "older"
        );
        let moved =
            live_coordinate(&armed, Some(&st("waiting", 3, 2_000))).expect("deadline moved");
        assert_eq!(
            (moved.timer_id.as_str(), moved.generation, moved.deadline),
            ("t9", 3, 2_000)
        );
        let bumped =
            live_coordinate(&armed, Some(&st("waiting", 4, 5_000))).expect("generation bumped");
        assert_eq!((bumped.generation, bumped.deadline), (4, 5_000));
    }

    #[test]
    fn every_scheduling_header_is_recognised() {
        for h in SCHEDULING_HEADERS {
            let mut m = HeaderMap::new();
            m.insert(h, "x");
            assert_eq!(scheduling_header(Some(&m)), Some(h));
        }
        assert_eq!(scheduling_header(Some(&HeaderMap::new())), None);
        assert_eq!(scheduling_header(None), None);
    }
}
