//! Prometheus metrics of the daemon: what an operator needs to see whether the backstop keeps
//! up (lags), what it did (copies, handoffs, give-ups, retention discards) and how its lease,
//! connection and credential stand, without reading the broker by hand.
//!
//! Off by default: only `deliver --metrics-addr` serves them ([`serve`]). Counters are one-line
//! increments through a [`Metrics`] handle (cheap to clone, always present: a daemon without
//! the flag counts into a registry nobody reads). Lags, lease, connection and credential state
//! are sampled on a timer ([`Sampler`]) from consumer and stream info, so the hot path carries
//! no extra broker request. Every series carries `space`, so a multi-space host serves one
//! series set per lane on one endpoint. The exposition is `prometheus-client`'s own encoder.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::conn::{ConnEvent, CredentialCell};
use crate::wire::{SpaceNames, FANOUT_DURABLE, READER_DURABLE};

/// Bound on one sample's broker requests (a slow broker skips a sample, never piles them up).
const SAMPLE_BOUND: Duration = Duration::from_secs(2);
/// Bound on reading one scrape request's head (a stuck client never holds a task for long).
const SCRAPE_BOUND: Duration = Duration::from_secs(10);
/// At most this many scrape connections are served at once; more wait in the listen backlog.
const SCRAPES_IN_FLIGHT: usize = 8;

/// The verbs of both control rails, the `verb` label's values (anything else is `other`).
pub const RAIL_VERBS: &[&str] = &[
    "durableJoin",
    "durableLeave",
    "listMemberships",
    "anycastStatus",
    "anycastCancel",
    "reloadCreds",
    "reloadStoreIdentity",
    "lifecycleMemberships",
    "evictPrincipal",
    "evictPrincipals",
    "principalLiveness",
    "planeConnLiveness",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpaceLabel {
    space: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    space: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamLabel {
    space: String,
    stream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabel {
    space: String,
    cache: String,
}

/// One fenced row cache's running totals, as the plane reports them to the sampler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// `acl`, `members`, `channels` or `presence`.
    pub cache: &'static str,
    pub fences: u64,
    pub fallbacks: u64,
    pub resets: u64,
}

/// Reads every cache's totals (the space ring wires it to the plane's caches).
pub type CacheSource = Arc<dyn Fn() -> Vec<CacheCounts> + Send + Sync>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabel {
    space: String,
    verb: String,
}

/// Why the reader (or the fan-out writer) gave an entry up: the `reason` label of
/// `cotal_delivery_give_ups_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// The entry's owner has no (or a garbled) ACL row.
    UnknownOwner,
    /// The handoff publish failed on every delivery.
    Handoff,
    /// Deleting a retired lifecycle's entry failed on every delivery.
    RetiredDelete,
    /// The entry or post does not parse.
    Malformed,
}

impl GiveUp {
    pub fn label(self) -> &'static str {
        match self {
            GiveUp::UnknownOwner => "unknown_owner",
            GiveUp::Handoff => "handoff_failed",
            GiveUp::RetiredDelete => "retired_delete_failed",
            GiveUp::Malformed => "malformed",
        }
    }
}

/// Which retained store lost messages before they were read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    Chat,
    Inbox,
    Dlv,
}

impl Store {
    /// The store a consumer's stream name is (`CHAT_<s>` or else `INBOX_<s>`, the two streams
    /// the daemon consumes; DLV is named only by retention sampling).
    pub fn of(names: &SpaceNames, stream: &str) -> Store {
        if stream == names.chat_stream() {
            Store::Chat
        } else if stream == names.dlv_stream() {
            Store::Dlv
        } else {
            Store::Inbox
        }
    }

    fn label(self) -> &'static str {
        match self {
            Store::Chat => "chat",
            Store::Inbox => "inbox",
            Store::Dlv => "dlv",
        }
    }
}

/// Every metric family of the process. One set, shared by all lanes; the `space` label keeps
/// the lanes apart.
struct Families {
    fanout_lag: Family<SpaceLabel, Gauge>,
    reader_lag: Family<SpaceLabel, Gauge>,
    posts_copied: Family<SpaceLabel, Counter>,
    handed_off: Family<SpaceLabel, Counter>,
    redeliveries: Family<StreamLabel, Counter>,
    give_ups: Family<ReasonLabel, Counter>,
    retention_discards: Family<StreamLabel, Counter>,
    dlv_discarded: Family<SpaceLabel, Gauge>,
    lease_held: Family<SpaceLabel, Gauge>,
    lease_renewals: Family<SpaceLabel, Counter>,
    broker_connected: Family<SpaceLabel, Gauge>,
    reconnects: Family<SpaceLabel, Counter>,
    credential_expiry: Family<SpaceLabel, Gauge>,
    rail_requests: Family<VerbLabel, Counter>,
    rail_refusals: Family<VerbLabel, Counter>,
    cache_fences: Family<CacheLabel, Counter>,
    cache_fallbacks: Family<CacheLabel, Counter>,
    cache_resets: Family<CacheLabel, Counter>,
}

impl Families {
    fn new() -> Families {
        Families {
            fanout_lag: Family::default(),
            reader_lag: Family::default(),
            posts_copied: Family::default(),
            handed_off: Family::default(),
            redeliveries: Family::default(),
            give_ups: Family::default(),
            retention_discards: Family::default(),
            dlv_discarded: Family::default(),
            lease_held: Family::default(),
            lease_renewals: Family::default(),
            broker_connected: Family::default(),
            reconnects: Family::default(),
            credential_expiry: Family::default(),
            rail_requests: Family::default(),
            rail_refusals: Family::default(),
            cache_fences: Family::default(),
            cache_fallbacks: Family::default(),
            cache_resets: Family::default(),
        }
    }

    /// Registers every family under the `cotal_delivery` prefix (names and help texts are the
    /// table of `docs/operations.md`).
    fn register(&self, r: &mut Registry) {
        r.register(
            "fanout_lag",
            "CHAT last sequence minus the fan-out durable's ack floor (posts not yet fanned out)",
            self.fanout_lag.clone(),
        );
        r.register(
            "reader_lag",
            "INBOX last sequence minus the reader durable's ack floor (entries not yet settled)",
            self.reader_lag.clone(),
        );
        r.register(
            "posts_copied",
            "INBOX entries written by the fan-out writer (one per recipient of a post)",
            self.posts_copied.clone(),
        );
        r.register(
            "handed_off",
            "INBOX entries handed off to a member's DLV store by the trusted reader",
            self.handed_off.clone(),
        );
        r.register(
            "redeliveries",
            "messages delivered again to the fan-out writer (stream chat) or reader (stream inbox)",
            self.redeliveries.clone(),
        );
        r.register(
            "give_ups",
            "entries given up (terminated) by reason",
            self.give_ups.clone(),
        );
        r.register(
            "retention_discards",
            "messages retention discarded before the daemon read them, by stream",
            self.retention_discards.clone(),
        );
        r.register(
            "dlv_discarded",
            "frames DLV retention removed so far, surfaced or not (last sequence minus frames held; nothing else deletes DLV frames)",
            self.dlv_discarded.clone(),
        );
        r.register(
            "lease_held",
            "1 while this daemon holds the lease and serves, else 0",
            self.lease_held.clone(),
        );
        r.register(
            "lease_renewals",
            "lease renewals the broker acknowledged",
            self.lease_renewals.clone(),
        );
        r.register(
            "broker_connected",
            "1 while the resident broker connection is up, else 0",
            self.broker_connected.clone(),
        );
        r.register(
            "reconnects",
            "times the resident broker connection came back after a drop",
            self.reconnects.clone(),
        );
        r.register(
            "credential_expiry_seconds",
            "seconds until the live delivery credential expires (absent for a credential without exp)",
            self.credential_expiry.clone(),
        );
        r.register(
            "rail_requests",
            "control-rail requests by verb",
            self.rail_requests.clone(),
        );
        r.register(
            "rail_refusals",
            "control-rail requests refused by verb",
            self.rail_refusals.clone(),
        );
        r.register(
            "cache_fences",
            "leader fences a fenced row cache sent to prove itself current, by cache",
            self.cache_fences.clone(),
        );
        r.register(
            "cache_fallbacks",
            "decisions that found a cache not proved and read per key from the leader, by cache",
            self.cache_fallbacks.clone(),
        );
        r.register(
            "cache_resets",
            "times a cache was emptied and re-fed (consumer error, purge, recreated stream), by cache",
            self.cache_resets.clone(),
        );
    }
}

/// The registry a `--metrics-addr` endpoint serves; hands each lane its [`Metrics`].
#[derive(Clone)]
pub struct MetricsRegistry {
    registry: Arc<Mutex<Registry>>,
    families: Arc<Families>,
    /// Set once an endpoint serves this registry ([`serve`]): only then are the gauges sampled.
    served: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for MetricsRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsRegistry")
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Metrics({})", self.space)
    }
}

impl Default for MetricsRegistry {
    fn default() -> Self {
        MetricsRegistry::new()
    }
}

impl MetricsRegistry {
    pub fn new() -> MetricsRegistry {
        let families = Arc::new(Families::new());
        let mut registry = Registry::with_prefix("cotal_delivery");
        families.register(&mut registry);
        MetricsRegistry {
            registry: Arc::new(Mutex::new(registry)),
            families,
            served: Arc::default(),
        }
    }

    /// The handle one space's daemon counts through.
    pub fn for_space(&self, space: &str) -> Metrics {
        Metrics {
            families: self.families.clone(),
            space: Arc::from(space),
            hot: Arc::default(),
            served: self.served.clone(),
        }
    }

    /// The OpenMetrics text of every series.
    pub fn encode(&self) -> Result<String, MetricsError> {
        let mut out = String::new();
        let registry = self
            .registry
            .lock()
            .map_err(|_| MetricsError::new(MetricsErrorKind::Encode, "the registry is poisoned"))?;
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .map_err(|e| MetricsError::new(MetricsErrorKind::Encode, e.to_string()))?;
        Ok(out)
    }
}

/// One space's counting handle. Cheap to clone; every call is a lock-free increment after the
/// first (the family map is read-locked).
#[derive(Clone)]
pub struct Metrics {
    families: Arc<Families>,
    space: Arc<str>,
    /// The counters the data path bumps per copy and per frame, resolved from their family at
    /// the first bump (the series appears then, as before) instead of per bump.
    hot: Arc<HotCounters>,
    /// Whether an endpoint serves the registry this handle counts into.
    served: Arc<std::sync::atomic::AtomicBool>,
}

/// This space's series of the per-message counters, once resolved (a clone shares the series).
#[derive(Default)]
struct HotCounters {
    posts_copied: std::sync::OnceLock<Counter>,
    handed_off: std::sync::OnceLock<Counter>,
}

impl Default for Metrics {
    /// A handle counting into a registry nobody serves (no `--metrics-addr`).
    fn default() -> Self {
        MetricsRegistry::new().for_space("")
    }
}

impl Metrics {
    /// Whether an endpoint serves these series (`--metrics-addr`): the gauges are sampled from
    /// the broker only then, since nobody else reads them.
    pub fn is_served(&self) -> bool {
        self.served.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn space(&self) -> SpaceLabel {
        SpaceLabel {
            space: self.space.to_string(),
        }
    }
    fn stream(&self, stream: &str) -> StreamLabel {
        StreamLabel {
            space: self.space.to_string(),
            stream: stream.to_string(),
        }
    }
    fn verb(&self, verb: &str) -> VerbLabel {
        VerbLabel {
            space: self.space.to_string(),
            verb: verb.to_string(),
        }
    }

    /// The fan-out writer wrote `n` INBOX entries for one post.
    pub fn posts_copied(&self, n: u64) {
        self.hot
            .posts_copied
            .get_or_init(|| {
                self.families
                    .posts_copied
                    .get_or_create(&self.space())
                    .clone()
            })
            .inc_by(n);
    }
    /// The reader handed one entry off to a DLV store.
    pub fn handed_off(&self) {
        self.hot
            .handed_off
            .get_or_init(|| {
                self.families
                    .handed_off
                    .get_or_create(&self.space())
                    .clone()
            })
            .inc();
    }
    /// A message reached the fan-out writer (`chat`) or the reader (`inbox`) again.
    pub fn redelivered(&self, store: Store) {
        self.families
            .redeliveries
            .get_or_create(&self.stream(store.label()))
            .inc();
    }
    /// An entry was given up.
    pub fn gave_up(&self, why: GiveUp) {
        let label = ReasonLabel {
            space: self.space.to_string(),
            reason: why.label().to_string(),
        };
        self.families.give_ups.get_or_create(&label).inc();
    }
    /// Retention discarded `n` messages of `store` before they were read.
    pub fn discarded(&self, store: Store, n: u64) {
        self.families
            .retention_discards
            .get_or_create(&self.stream(store.label()))
            .inc_by(n);
    }
    /// Whether this daemon holds the lease and serves.
    pub fn lease_held(&self, held: bool) {
        self.families
            .lease_held
            .get_or_create(&self.space())
            .set(i64::from(held));
    }
    /// A lease renewal the broker acknowledged.
    pub fn lease_renewed(&self) {
        self.families
            .lease_renewals
            .get_or_create(&self.space())
            .inc();
    }
    /// A control-rail request for `verb`, and whether it was refused.
    /// Verbs outside [`RAIL_VERBS`] count as `other`, so a caller cannot grow the series set.
    pub fn rail_request(&self, verb: &str, refused: bool) {
        let verb = if RAIL_VERBS.contains(&verb) {
            verb
        } else {
            "other"
        };
        let label = self.verb(verb);
        self.families.rail_requests.get_or_create(&label).inc();
        if refused {
            self.families.rail_refusals.get_or_create(&label).inc();
        }
    }
    /// Adds what the caches did since the last sample (`now` minus `seen`, per cache).
    fn cache_deltas(&self, now: &[CacheCounts], seen: &mut Vec<CacheCounts>) {
        for c in now {
            let before = seen
                .iter()
                .find(|s| s.cache == c.cache)
                .copied()
                .unwrap_or(CacheCounts {
                    cache: c.cache,
                    ..CacheCounts::default()
                });
            let label = CacheLabel {
                space: self.space.to_string(),
                cache: c.cache.to_string(),
            };
            let f = &self.families;
            f.cache_fences
                .get_or_create(&label)
                .inc_by(c.fences.saturating_sub(before.fences));
            f.cache_fallbacks
                .get_or_create(&label)
                .inc_by(c.fallbacks.saturating_sub(before.fallbacks));
            f.cache_resets
                .get_or_create(&label)
                .inc_by(c.resets.saturating_sub(before.resets));
        }
        *seen = now.to_vec();
    }

    fn set_lag(&self, family: &Family<SpaceLabel, Gauge>, lag: u64) {
        family
            .get_or_create(&self.space())
            .set(i64::try_from(lag).unwrap_or(i64::MAX));
    }
}

/// What kind of metrics fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsErrorKind {
    /// `--metrics-addr` does not parse as `host:port`.
    Address,
    /// The address could not be bound.
    Bind,
    /// The exposition could not be written.
    Encode,
}

/// A metrics fault: typed kind and the words.
#[derive(Debug, Clone)]
pub struct MetricsError {
    kind: MetricsErrorKind,
    detail: String,
}

impl MetricsError {
    pub fn new(kind: MetricsErrorKind, detail: impl Into<String>) -> MetricsError {
        MetricsError {
            kind,
            detail: detail.into(),
        }
    }
    pub fn kind(&self) -> MetricsErrorKind {
        self.kind
    }
}

impl std::fmt::Display for MetricsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for MetricsError {}

/// Parses a `--metrics-addr` value (`host:port`, e.g. `127.0.0.1:9464`).
pub fn parse_addr(text: &str) -> Result<SocketAddr, MetricsError> {
    text.parse().map_err(|e| {
        MetricsError::new(
            MetricsErrorKind::Address,
            format!("--metrics-addr {text:?} is not an address like 127.0.0.1:9464 ({e})"),
        )
    })
}

/// A bound metrics endpoint; dropping it stops serving.
pub struct Endpoint {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `addr` and serves `GET /metrics` (anything else is 404) from `registry`, with hyper's
/// HTTP/1 server. Returns once the listener is bound.
pub async fn serve(addr: SocketAddr, registry: MetricsRegistry) -> Result<Endpoint, MetricsError> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        MetricsError::new(
            MetricsErrorKind::Bind,
            format!("the metrics address {addr} could not be bound ({e})"),
        )
    })?;
    let bound = listener.local_addr().unwrap_or(addr);
    registry
        .served
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let slots = Arc::new(tokio::sync::Semaphore::new(SCRAPES_IN_FLIGHT));
    let task = tokio::spawn(async move {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let registry = registry.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let service = hyper::service::service_fn(move |req| {
                    let registry = registry.clone();
                    async move { Ok::<_, std::convert::Infallible>(respond(&req, &registry)) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .header_read_timeout(SCRAPE_BOUND)
                    .timer(hyper_util::rt::TokioTimer::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                let _ = tokio::time::timeout(SCRAPE_BOUND * 3, conn).await;
            });
        }
    });
    Ok(Endpoint { addr: bound, task })
}

type Body = http_body_util::Full<bytes::Bytes>;

fn respond<B>(req: &hyper::Request<B>, registry: &MetricsRegistry) -> hyper::Response<Body> {
    let reply = |status: u16, content_type: &str, body: String| {
        let mut resp = hyper::Response::new(Body::from(body));
        *resp.status_mut() =
            hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
            resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        resp
    };
    if req.method() != hyper::Method::GET || req.uri().path() != "/metrics" {
        return reply(404, "text/plain", "not found: GET /metrics\n".into());
    }
    match registry.encode() {
        Ok(text) => reply(
            200,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            text,
        ),
        Err(e) => reply(500, "text/plain", format!("{e}\n")),
    }
}

/// The sampler of one serving daemon: lags from stream and consumer info, connection state and
/// reconnects from the resident connection's events, seconds to credential expiry.
pub struct Sampler {
    pub js: async_nats::jetstream::Context,
    pub names: SpaceNames,
    pub credential: CredentialCell,
    pub client: async_nats::Client,
    pub events: tokio::sync::broadcast::Receiver<ConnEvent>,
    pub metrics: Metrics,
    pub period: Duration,
    /// Whether the daemon serves under its lease right now (the space ring's gate).
    pub serving: Arc<dyn Fn() -> bool + Send + Sync>,
    /// The fenced row caches' totals (fences, fallbacks, resets).
    pub caches: CacheSource,
}

impl Sampler {
    /// Runs until the task is aborted (the daemon's close aborts it).
    pub fn spawn(mut self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut was_down = false;
            let mut seen = Vec::new();
            let mut expiry = Expiry::default();
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        self.metrics.cache_deltas(&(self.caches)(), &mut seen);
                        self.sample(&mut expiry).await;
                    }
                    ev = self.events.recv() => match ev {
                        Ok(ConnEvent::Disconnected) => {
                            was_down = true;
                            self.set_connected(false);
                        }
                        Ok(ConnEvent::Connected) => {
                            if was_down {
                                self.metrics.families.reconnects.get_or_create(&self.metrics.space()).inc();
                            }
                            was_down = false;
                            self.set_connected(true);
                        }
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
        })
    }

    fn set_connected(&self, up: bool) {
        self.metrics
            .families
            .broker_connected
            .get_or_create(&self.metrics.space())
            .set(i64::from(up));
    }

    async fn sample(&self, expiry: &mut Expiry) {
        use async_nats::connection::State;
        self.set_connected(self.client.connection_state() == State::Connected);
        self.metrics.lease_held((self.serving)());
        if let Some(exp) = expiry.of(&self.credential.get()) {
            let now = (super::journal::epoch_ms() / 1000) as i64;
            self.metrics
                .families
                .credential_expiry
                .get_or_create(&self.metrics.space())
                .set(exp - now);
        }
        let chat = self.names.chat_stream();
        let inbox = self.names.inbox_stream();
        if let Ok(Some(lag)) =
            tokio::time::timeout(SAMPLE_BOUND, lag(&self.js, &chat, FANOUT_DURABLE)).await
        {
            self.metrics.set_lag(&self.metrics.families.fanout_lag, lag);
        }
        if let Ok(Some(lag)) =
            tokio::time::timeout(SAMPLE_BOUND, lag(&self.js, &inbox, READER_DURABLE)).await
        {
            self.metrics.set_lag(&self.metrics.families.reader_lag, lag);
        }
        let dlv = self.names.dlv_stream();
        if let Ok(Some(gone)) = tokio::time::timeout(SAMPLE_BOUND, removed(&self.js, &dlv)).await {
            self.metrics
                .set_lag(&self.metrics.families.dlv_discarded, gone);
        }
    }
}

/// The credential's expiry (`exp`, seconds since the epoch), decoded once per JWT: a sample
/// compares the JWT instead of decoding it every period.
#[derive(Default)]
struct Expiry {
    jwt: String,
    exp: Option<i64>,
}

impl Expiry {
    fn of(&mut self, credential: &super::Credential) -> Option<i64> {
        if self.jwt != credential.jwt {
            self.exp = credential.claims().ok().and_then(|c| c.exp);
            self.jwt.clone_from(&credential.jwt);
        }
        self.exp
    }
}

/// What the gauges read of a `STREAM.INFO` answer (an error answer has no `state`). Only these
/// fields are decoded: the rest of the answer (config, cluster) is skipped, not built, since
/// the sampler asks five of them every period.
#[derive(serde::Deserialize)]
struct StreamInfoState {
    state: Option<StreamCounts>,
}

#[derive(serde::Deserialize)]
struct StreamCounts {
    messages: u64,
    last_seq: u64,
}

/// What the gauges read of a `CONSUMER.INFO` answer (an error answer has no `ack_floor`).
#[derive(serde::Deserialize)]
struct ConsumerInfoFloor {
    ack_floor: Option<AckFloor>,
}

#[derive(serde::Deserialize)]
struct AckFloor {
    stream_seq: u64,
}

/// An info request's body, `{}` (the broker refuses any other body on `CONSUMER.INFO`).
#[derive(serde::Serialize)]
struct EmptyRequest {}

/// `stream`'s message counts from one `STREAM.INFO` (`None` on a failed read or an error answer).
async fn stream_counts(js: &async_nats::jetstream::Context, stream: &str) -> Option<StreamCounts> {
    js.request::<_, _, StreamInfoState>(format!("STREAM.INFO.{stream}"), &EmptyRequest {})
        .await
        .ok()?
        .state
}

/// How many messages `stream` no longer holds: its last sequence minus the messages it holds
/// (every message ever stored took one sequence; `None` on a failed read).
async fn removed(js: &async_nats::jetstream::Context, stream: &str) -> Option<u64> {
    let state = stream_counts(js, stream).await?;
    Some(state.last_seq.saturating_sub(state.messages))
}

/// `stream`'s last sequence minus `durable`'s ack floor (stream sequence); `None` on a failed
/// read (the gauge keeps its last value). Two requests: the stream's info, then the consumer's.
async fn lag(js: &async_nats::jetstream::Context, stream: &str, durable: &str) -> Option<u64> {
    let last = stream_counts(js, stream).await?.last_seq;
    let floor = js
        .request::<_, _, ConsumerInfoFloor>(
            format!("CONSUMER.INFO.{stream}.{durable}"),
            &EmptyRequest {},
        )
        .await
        .ok()?
        .ack_floor?
        .stream_seq;
    Some(last.saturating_sub(floor))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two lanes count into one registry, each under its own `space` label. Mutation seen
    /// caught: `for_space` ignoring its argument (both lanes under one label, 5 instead of 2).
    #[test]
    fn lanes_are_kept_apart_by_the_space_label() {
        let reg = MetricsRegistry::new();
        let a = reg.for_space("alpha");
        let b = reg.for_space("beta");
        a.posts_copied(2);
        b.posts_copied(3);
        a.gave_up(GiveUp::UnknownOwner);
        a.rail_request("durableJoin", true);
        let text = reg.encode().unwrap();
        assert!(
            text.contains("cotal_delivery_posts_copied_total{space=\"alpha\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("cotal_delivery_posts_copied_total{space=\"beta\"} 3\n"),
            "{text}"
        );
        assert!(text.contains(
            "cotal_delivery_give_ups_total{space=\"alpha\",reason=\"unknown_owner\"} 1\n"
        ));
        assert!(text.contains(
            "cotal_delivery_rail_refusals_total{space=\"alpha\",verb=\"durableJoin\"} 1\n"
        ));
    }

    #[test]
    fn a_malformed_address_is_a_typed_refusal() {
        let e = parse_addr("localhost").unwrap_err();
        assert_eq!(e.kind(), MetricsErrorKind::Address);
        assert!(parse_addr("127.0.0.1:0").is_ok());
    }
}
