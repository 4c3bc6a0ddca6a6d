//! The data plane: what a lease holder does with messages (Plane-3).
//!
//! Owns the fan-out writer, the trusted reader and the rows they read (ACLs, members, channels,
//! presence), and the context they share. Invariant: nothing here acks, replies ok or writes
//! unless [`ServingGate`] still shows the epoch the work was admitted at, so a quiesce (the lease
//! in doubt) stops every in-flight handler from acting. Imports only the base ring and
//! `provision`; never `rails/` or `space/` (the space ring arms and quiesces this one).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::watch;

use crate::base::Journal;
use crate::wire::{Principal, SpaceNames};

mod acl;
mod anycast;
mod boundary;
mod cache;
mod catchup;
mod channels;
mod durable;
mod fanout;
mod fence;
mod membership;
mod presence;
mod pull;
mod pump;
mod reader;

pub(crate) use acl::{AclRow, Acls};
pub use acl::{RowDecodeError, RowDecodeErrorKind};
pub use anycast::{row_key, AnycastError, AnycastErrorKind, AnycastRow, FAULT_HOLD_LINE};
pub(crate) use anycast::{Anycast, SweepConfig};
pub(crate) use cache::{Caches, ProvedRows, Since, Stamp};
pub(crate) use catchup::activate;
pub use catchup::{CatchUpError, CatchUpErrorKind};
pub(crate) use durable::{durable_join, durable_leave, list_memberships};
pub(crate) use fanout::bind as bind_fanout;
pub use fanout::MAX_COPIES_IN_FLIGHT;
pub(crate) use fence::{FenceError, Fences, MAX_FENCED};
pub(crate) use membership::{
    split_member_key, MemberRead, MemberRow, Members, MembershipRecord, PriorInterval,
};
pub(crate) use presence::live_entry;
pub use pull::{PULL_BATCH, PULL_LOST_MARGIN};
pub use pump::PULL_EXPIRES;
pub use reader::READER_LANES;
pub(crate) use reader::{bind as bind_reader, delete_inbox_entry};

/// Publish acks one async-nats 0.51 JetStream context keeps pending before a publish waits for
/// a slot (`ContextBuilder`'s default `max_ack_inflight`). The writer and the reader share the
/// daemon's one context, so their in-flight bounds together stay below it: a full writer never
/// makes a handoff wait on the client's semaphore instead of its own.
pub const CONTEXT_PENDING_ACKS: usize = 5_000;
const _: () =
    assert!(fanout::MAX_COPIES_IN_FLIGHT + reader::MAX_HANDOFFS_IN_FLIGHT < CONTEXT_PENDING_ACKS);

/// Refusal for a request that was admitted before a quiesce.
pub const STOPPED_SERVING: &str =
    "delivery: this daemon stopped serving this shard while the request was in flight (it is re-checking ownership); retry";
/// Refusal while quiesced.
pub const NOT_SERVING: &str =
    "delivery: this daemon is not serving this shard (it is re-checking ownership); retry";

/// Serving epoch shared with every handler: a handler admitted at one epoch may act (ack, reply
/// ok, write) only while the gate still shows that epoch and serving.
#[derive(Clone)]
pub struct ServingGate {
    epoch: Arc<AtomicU64>,
    serving: Arc<AtomicBool>,
    /// Mirrors `serving` for waiters: the pull loops pull only while it is open.
    opened: Arc<watch::Sender<bool>>,
}

impl Default for ServingGate {
    fn default() -> Self {
        ServingGate {
            epoch: Arc::default(),
            serving: Arc::default(),
            opened: Arc::new(watch::Sender::new(false)),
        }
    }
}

impl ServingGate {
    /// The epoch a handler is admitted at, or `None` while quiesced.
    pub fn admit(&self) -> Option<u64> {
        if self.serving.load(Ordering::SeqCst) {
            Some(self.epoch.load(Ordering::SeqCst))
        } else {
            None
        }
    }
    /// Whether a handler admitted at `epoch` may still act.
    pub fn still(&self, epoch: u64) -> bool {
        self.serving.load(Ordering::SeqCst) && self.epoch.load(Ordering::SeqCst) == epoch
    }
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }
    pub fn open(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.serving.store(true, Ordering::SeqCst);
        self.opened.send_replace(true);
    }
    pub fn close(&self) {
        self.serving.store(false, Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.opened.send_replace(false);
    }
    /// Returns once the gate is open (at once if it is). Unbounded on its own: callers race it
    /// against their stop signal.
    pub async fn opened(&self) {
        let mut rx = self.opened.subscribe();
        // The sender lives in `self`, so `wait_for` cannot fail while we wait.
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// Timing and sizing knobs of the data path.
#[derive(Debug, Clone)]
pub struct PlaneConfig {
    /// Bound on every JetStream API request of the data path.
    pub request_bound: Duration,
    /// `ack_wait` of the fan-out and reader durables ([`crate::base::ENV_ACK_WAIT_MS`]).
    pub ack_wait: Duration,
    /// Redeliveries after which the reader gives up an entry (`READER_MAX_REDELIVERIES`).
    pub reader_max_redeliveries: i64,
    /// Delay of a nak for a retry (2000 ms in the reference; `COTAL_DELIVERY_NAK_DELAY_MS`).
    pub nak_delay: Duration,
    /// `max_ack_pending` of the reader.
    pub reader_max_ack_pending: i64,
    /// Interval of the anycast records sweep.
    pub anycast_sweep: Duration,
    /// Age after which the sweep removes a row whose request left the queue.
    pub anycast_row_age: Duration,
    /// The anycast fault-injection hold (tests only, docs/anycast.md).
    pub anycast_fault_hold: bool,
}

impl PlaneConfig {
    /// The defaults with `tuning`'s overrides.
    pub fn of(tuning: &crate::base::Tuning) -> PlaneConfig {
        PlaneConfig {
            nak_delay: tuning.nak_delay,
            ack_wait: tuning.ack_wait,
            anycast_sweep: tuning.anycast_sweep,
            anycast_row_age: tuning.anycast_row_age,
            anycast_fault_hold: tuning.anycast_fault_hold,
            ..PlaneConfig::default()
        }
    }
}

impl Default for PlaneConfig {
    fn default() -> Self {
        use crate::base as t;
        PlaneConfig {
            request_bound: t::BROKER_BOUND,
            ack_wait: t::DEFAULT_ACK_WAIT,
            reader_max_redeliveries: 10,
            nak_delay: t::DEFAULT_NAK_DELAY,
            reader_max_ack_pending: 1000,
            anycast_sweep: t::DEFAULT_ANYCAST_SWEEP,
            anycast_row_age: t::DEFAULT_ANYCAST_ROW_AGE,
            anycast_fault_hold: false,
        }
    }
}

/// Everything a Plane-3 component needs. Cheap to clone.
#[derive(Clone)]
pub struct PlaneCtx {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub names: SpaceNames,
    pub journal: Journal,
    /// The daemon's own principal (`local.<nkey>`).
    pub me: Principal,
    pub gate: ServingGate,
    pub config: PlaneConfig,
    /// Flipped once start-up is complete (after the lease watch is bound).
    pub startup_complete: Arc<AtomicBool>,
    /// Fenced row caches the writer and the reader decide from (fed while serving).
    pub caches: cache::Caches,
    /// Reader decisions in flight, which a leave waits for (strict leave boundary).
    pub handoffs: Arc<boundary::Handoffs>,
    /// Counters of what the plane did (`--metrics-addr`; counted even when not served).
    pub metrics: crate::base::Metrics,
    /// The resident connection's events (a pull loop asks afresh after a reconnect).
    pub conn: tokio::sync::broadcast::Sender<crate::base::ConnEvent>,
}

/// Why a binding could not be established: its kind, the component (`what`) and the broker's
/// words.
#[derive(Debug, Clone)]
pub struct PlaneError {
    kind: PlaneErrorKind,
    what: &'static str,
    detail: String,
}

/// What could not be bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaneErrorKind {
    /// The stream a durable reads could not be looked up.
    Stream,
    /// The durable could not be created, bound or updated (or no answer within the bound).
    Consumer,
    /// A row bucket could not be opened.
    Bucket,
    /// A rail's subscription was refused.
    Subscribe,
    /// The round trip that proves a subscription bound failed or went unanswered.
    RoundTrip,
}

impl PlaneError {
    pub fn new(kind: PlaneErrorKind, what: &'static str, detail: impl Into<String>) -> PlaneError {
        PlaneError {
            kind,
            what,
            detail: detail.into(),
        }
    }
    pub fn kind(&self) -> PlaneErrorKind {
        self.kind
    }
    /// The component that did not bind (`fan-out writer`, `control rail`, …).
    pub fn what(&self) -> &'static str {
        self.what
    }
}

impl std::fmt::Display for PlaneError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.detail)
    }
}

impl std::error::Error for PlaneError {}

/// Why a broker operation of the daemon did not succeed (a copy or a handoff not stored, an
/// entry not deleted, a stream not read, the lease watch not bound): its kind, the text the warnings quote (`Display`) and
/// the client's or the broker's error behind it (`source()`).
#[derive(Debug)]
pub struct BrokerError {
    kind: BrokerErrorKind,
    text: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// What the broker operation could not do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerErrorKind {
    /// The request or publish was not sent (the client refused it, or its body could not be
    /// written).
    Unsent,
    /// The broker answered with an error.
    Refused,
    /// No answer within the bound.
    TimedOut,
}

impl BrokerError {
    pub(crate) fn new(kind: BrokerErrorKind, text: impl Into<String>) -> BrokerError {
        BrokerError {
            kind,
            text: text.into(),
            source: None,
        }
    }
    /// The same error, keeping `source` as its cause.
    pub(crate) fn source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> BrokerError {
        self.source = Some(Box::new(source));
        self
    }
    /// `kind`, said as `prefix` and the broker's own words ([`crate::base::broker_words`]) for `e`,
    /// which it keeps as its cause.
    pub(crate) fn quoting(
        kind: BrokerErrorKind,
        prefix: impl std::fmt::Display,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> BrokerError {
        let text = format!("{prefix}{}", crate::base::broker_words(&e));
        BrokerError::new(kind, text).source(e)
    }
    /// A publish's acknowledgement that came back an error: the client's own ack timeout is
    /// `TimedOut`, any other answer a refusal (said as `prefix` and the broker's words).
    pub(crate) fn ack(
        prefix: impl std::fmt::Display,
        e: async_nats::jetstream::context::PublishError,
    ) -> BrokerError {
        let kind = match e.kind() {
            async_nats::jetstream::context::PublishErrorKind::TimedOut => BrokerErrorKind::TimedOut,
            _ => BrokerErrorKind::Refused,
        };
        BrokerError::quoting(kind, prefix, e)
    }
    pub fn kind(&self) -> BrokerErrorKind {
        self.kind
    }
}

impl std::fmt::Display for BrokerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for BrokerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A stop signal every bound task selects on.
pub type StopRx = watch::Receiver<bool>;

/// Waits until `stop` turns true (or its sender is gone).
pub async fn stopped(stop: &mut StopRx) {
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}
