//! Fenced row caches: the KV buckets the data path decides from, held in memory and *proved*
//! current before each use.
//!
//! Why: a per-key leader read per check costs the fan-out writer and the reader several serial
//! round trips per post and per copy. A copy of the bucket fed by an ordered push consumer (into
//! the daemon's own inbox, `kvRead` grants) in stream order, with the applied stream sequence
//! tracked, is as current as a leader read *once a leader-served fence finds nothing newer*:
//! `STREAM.MSG.GET` with `seq = applied + 1` and `next_by_subj = "$KV.<bucket>.>"` answers "no
//! message found" when the bucket holds nothing past what was applied, or the next message,
//! which is applied before fencing again. "Nothing newer than what I applied" at a moment after
//! the work was received is the same guarantee as a per-key leader read at that moment
//! (`docs/data-path.md`, "Fenced row caches").
//!
//! Fences are coalesced: one in flight per bucket, and it serves every caller that arrived
//! before it was sent. A cache that is not loaded (its consumer has not caught up), was reset
//! (consumer error), or whose fence failed or walked more than [`FENCE_MAX_STEPS`] messages is
//! not proved: callers fall back to per-key leader reads. A periodic audit ([`AUDIT_PERIOD`])
//! compares the cache with the stream's state and resets it when the stream lost something the
//! cache holds (a stream purge, a deleted message) or went backwards (recreated).

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::{push, DeliverPolicy};
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::watch;

use crate::base::{Read, Row};
use crate::plane::{stopped, BrokerError, BrokerErrorKind, PlaneCtx, StopRx};

/// Most messages one fence applies before it gives up proving (the watch is behind; the
/// callers fall back to per-key reads for this round).
pub const FENCE_MAX_STEPS: usize = 64;
/// How often a cache is compared with its stream's state (purge / reset detection).
pub const AUDIT_PERIOD: Duration = Duration::from_secs(2);
/// Pause before a reset cache re-creates its consumer.
const RESTART_PAUSE: Duration = Duration::from_millis(250);
/// Most a stopping cache waits to queue its consumer's delete (the connection's buffer full).
const RETIRE_BOUND: Duration = Duration::from_millis(100);

/// One key's latest message as applied: `value` is `None` for a delete/purge marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedRow {
    pub value: Option<Bytes>,
    pub revision: u64,
    /// Broker timestamp of the message (epoch ms), for local expiry of a bucket with max age.
    pub stored_at_ms: u64,
    /// `value` as the last typed read decoded it: made from these bytes at this revision and
    /// gone with them when a newer message of the key is applied.
    decoded: Option<Decoded>,
}

impl CachedRow {
    fn new(value: Option<Bytes>, revision: u64, stored_at_ms: u64) -> CachedRow {
        CachedRow {
            value,
            revision,
            stored_at_ms,
            decoded: None,
        }
    }

    /// The row's value decoded as a `T` by `decode` (from its key and bytes), decoded only the
    /// first time it is read as a `T` at this revision.
    fn decoded<T: Send + Sync + 'static>(
        &mut self,
        key: &str,
        decode: impl FnOnce(&str, &Bytes) -> T,
    ) -> Option<Arc<T>> {
        let value = self.value.as_ref()?;
        if let Some(held) = self
            .decoded
            .as_ref()
            .and_then(|d| d.0.clone().downcast::<T>().ok())
        {
            return Some(held);
        }
        let fresh = Arc::new(decode(key, value));
        self.decoded = Some(Decoded(fresh.clone()));
        Some(fresh)
    }
}

/// A decoded value kept beside its row's bytes.
#[derive(Clone)]
struct Decoded(Arc<dyn Any + Send + Sync>);

impl std::fmt::Debug for Decoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Decoded")
    }
}

/// Decodings of equal bytes are equal; only the bytes and the revision tell rows apart.
impl PartialEq for Decoded {
    fn eq(&self, _: &Decoded) -> bool {
        true
    }
}

impl Eq for Decoded {}

/// What a typed read of the cache found (as [`Read`], the value decoded).
#[derive(Debug)]
pub enum DecodedRead<T> {
    Present(Arc<T>, u64),
    Absent { marker_revision: Option<u64> },
}

#[derive(Debug, Default)]
struct State {
    rows: BTreeMap<String, CachedRow>,
    /// Every message of the stream at or below this sequence that still exists was applied.
    applied: u64,
    /// No held row's revision is below this (0 after a reset: not known). The audit walks the
    /// rows for their lowest revision only when the stream's first sequence passed it, and
    /// then raises it to what it found: a row is only ever replaced by a newer revision, and a
    /// new row's revision is past `applied`, so it stays a floor between walks.
    held_floor: u64,
    /// The consumer caught up once (fences are then short); until then callers fall back.
    loaded: bool,
    /// Bumped at every reset; work proved under an older one is not proved.
    incarnation: u64,
    /// Fence coalescing: fences handed out, fences finished, highest fence a caller waits for.
    sent: u64,
    done: u64,
    wanted: u64,
    running: bool,
    /// Outcome of fence `done` and the incarnation it ran under.
    last_ok: bool,
    last_incarnation: u64,
    /// Max age of the bucket's messages (presence), read from the stream at each start: older
    /// entries read as absent.
    max_age_ms: Option<u64>,
    /// The feed's current consumer (`rowcache_<uuid>`), deleted when its feed ends.
    consumer: Option<String>,
    /// Counters for the benchmark and tests.
    fences: u64,
    fallbacks: u64,
    resets: u64,
}

/// Counters of one cache (for tests, logs and the benchmark).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub fences: u64,
    pub fallbacks: u64,
    pub resets: u64,
    pub applied: u64,
    pub loaded: bool,
}

struct Inner {
    bucket: String,
    /// `$KV.<bucket>.`
    prefix: String,
    state: Mutex<State>,
    done_tx: watch::Sender<u64>,
    /// Whether the cache is loaded (set at the load, cleared at each reset).
    loaded_tx: watch::Sender<bool>,
}

/// One bucket's cache. Cheap to clone.
#[derive(Clone)]
pub struct RowCache {
    inner: Arc<Inner>,
}

/// A fence asked for ([`RowCache::ask`]): the first fence handed out after the ask, under the
/// cache's incarnation of that moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    want: u64,
    incarnation: u64,
}

/// Whether a decision may read the cache or must read per key from the leader.
pub enum View<'a> {
    /// Proved current at a moment after the work was received.
    Proved(&'a RowCache),
    /// Not proved: per-key leader reads.
    Leader,
}

impl RowCache {
    pub fn new(bucket: &str) -> RowCache {
        let (done_tx, _) = watch::channel(0);
        let (loaded_tx, _) = watch::channel(false);
        RowCache {
            inner: Arc::new(Inner {
                bucket: bucket.to_string(),
                prefix: format!("$KV.{bucket}."),
                state: Mutex::new(State::default()),
                done_tx,
                loaded_tx,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn bucket(&self) -> &str {
        &self.inner.bucket
    }

    /// Waits up to `bound` for the cache to be loaded; whether it is.
    pub async fn loaded_within(&self, bound: Duration) -> bool {
        let mut rx = self.inner.loaded_tx.subscribe();
        let waited = tokio::time::timeout(bound, rx.wait_for(|l| *l)).await;
        matches!(waited, Ok(Ok(_)))
    }

    pub fn stats(&self) -> CacheStats {
        let st = self.lock();
        CacheStats {
            fences: st.fences,
            fallbacks: st.fallbacks,
            resets: st.resets,
            applied: st.applied,
            loaded: st.loaded,
        }
    }

    /// Proves the cache current at a moment after this call (one coalesced leader fence), or
    /// says to fall back to per-key reads.
    pub async fn prove(&self, ctx: &PlaneCtx) -> View<'_> {
        let asked = self.ask(ctx);
        self.prove_asked(ctx, asked).await
    }

    /// Asks for a fence sent after this moment, without waiting for it: the first fence handed
    /// out from now on (sent at once when none is in flight). Work received before this call is
    /// proved by [`RowCache::prove_asked`] with what it returns; `None` when the cache is not
    /// loaded (that proof then falls back).
    pub fn ask(&self, ctx: &PlaneCtx) -> Option<Asked> {
        let (asked, spawn) = {
            let mut st = self.lock();
            if !st.loaded {
                return None;
            }
            // The next fence handed out is sent after this moment; an earlier one may not be.
            let want = st.sent + 1;
            st.wanted = st.wanted.max(want);
            let spawn = !st.running;
            st.running = true;
            let asked = Asked {
                want,
                incarnation: st.incarnation,
            };
            (asked, spawn)
        };
        if spawn {
            tokio::spawn(self.clone().run_fences(ctx.clone()));
        }
        Some(asked)
    }

    /// Proves the cache current at a moment after `asked` was asked for (the fence it names, or
    /// a later one, answered under the same incarnation), or says to fall back to per-key reads.
    pub async fn prove_asked(&self, ctx: &PlaneCtx, asked: Option<Asked>) -> View<'_> {
        let proved = match asked {
            Some(asked) => self.fence(ctx, asked).await,
            None => false,
        };
        if proved {
            View::Proved(self)
        } else {
            self.lock().fallbacks += 1;
            View::Leader
        }
    }

    async fn fence(&self, ctx: &PlaneCtx, Asked { want, incarnation }: Asked) -> bool {
        let mut rx = self.inner.done_tx.subscribe();
        let waited = tokio::time::timeout(
            ctx.config.request_bound * 2,
            rx.wait_for(|done| *done >= want),
        )
        .await;
        if !matches!(waited, Ok(Ok(_))) {
            return false;
        }
        let st = self.lock();
        st.loaded
            && st.last_ok
            && st.last_incarnation == incarnation
            && st.incarnation == incarnation
    }

    /// Sends fences while callers wait for one, one at a time.
    async fn run_fences(self, ctx: PlaneCtx) {
        loop {
            let n = {
                let mut st = self.lock();
                if st.wanted <= st.done {
                    st.running = false;
                    return;
                }
                st.sent += 1;
                st.fences += 1;
                st.sent
            };
            let (ok, incarnation) = self.fence_once(&ctx).await;
            tracing::debug!(bucket = %self.inner.bucket, n, ok, applied = self.lock().applied, "fence done");
            {
                let mut st = self.lock();
                st.done = n;
                st.last_ok = ok;
                st.last_incarnation = incarnation;
            }
            self.inner.done_tx.send_replace(n);
        }
    }

    /// One fence: apply whatever the leader holds past `applied`, until it says nothing newer.
    async fn fence_once(&self, ctx: &PlaneCtx) -> (bool, u64) {
        let Ok(stream) = ctx
            .js
            .get_stream_no_info(crate::wire::SpaceNames::kv_stream(&self.inner.bucket))
            .await
        else {
            return (false, 0);
        };
        let filter = format!("{}>", self.inner.prefix);
        let mut incarnation = 0;
        for _ in 0..FENCE_MAX_STEPS {
            let from = {
                let st = self.lock();
                if !st.loaded {
                    return (false, st.incarnation);
                }
                incarnation = st.incarnation;
                // Saturating: `applied` is a sequence read from the network.
                st.applied.saturating_add(1)
            };
            let got = tokio::time::timeout(
                ctx.config.request_bound,
                stream.get_first_raw_message_by_subject(&filter, from),
            )
            .await;
            match got {
                Ok(Ok(msg)) => {
                    let stored_at_ms = (msg.time.unix_timestamp_nanos() / 1_000_000) as u64;
                    let mut st = self.lock();
                    if st.incarnation != incarnation {
                        return (false, incarnation);
                    }
                    apply(
                        &mut st,
                        &self.inner.prefix,
                        &msg.subject,
                        msg.sequence,
                        Some(&msg.headers),
                        msg.payload,
                        stored_at_ms,
                    );
                }
                Ok(Err(e)) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
                    return (true, incarnation);
                }
                _ => return (false, incarnation),
            }
        }
        (false, incarnation)
    }

    /// The row at `key`, as a leader read would report it (a locally expired entry is absent).
    pub fn read(&self, key: &str) -> Read {
        let st = self.lock();
        let now = crate::base::epoch_ms();
        match st.rows.get(key) {
            None => Read::Absent {
                marker_revision: None,
            },
            Some(row) if expired(&st, row, now) => Read::Absent {
                marker_revision: None,
            },
            Some(CachedRow { value: None, .. }) => Read::Absent {
                marker_revision: Some(st.rows[key].revision),
            },
            Some(CachedRow {
                value: Some(v),
                revision,
                ..
            }) => Read::Present(Row {
                value: v.clone(),
                revision: *revision,
            }),
        }
    }

    /// Every live row whose key starts with `prefix`, in key order.
    pub fn scan(&self, prefix: &str) -> Vec<(String, Row)> {
        scan_locked(&self.lock(), prefix)
    }

    /// Every live row whose key `keep` accepts, in key order: one pass over the keys in
    /// memory (a suffix such as `/<o>.<a>.<uid>` is no subject filter the broker can apply).
    pub fn scan_matching(&self, keep: impl Fn(&str) -> bool) -> Vec<(String, Row)> {
        let st = self.lock();
        let now = crate::base::epoch_ms();
        st.rows
            .iter()
            .filter(|(k, r)| keep(k) && !expired(&st, r, now))
            .filter_map(live_row)
            .collect()
    }

    /// [`RowCache::read`] with the value decoded by `decode` (from the key and the bytes): each
    /// revision is decoded once and the decoding kept beside its bytes, so what a decision reads
    /// is always the decoding of the bytes the cache holds, only not parsed again.
    pub fn read_decoded<T: Send + Sync + 'static>(
        &self,
        key: &str,
        decode: impl FnOnce(&str, &Bytes) -> T,
    ) -> DecodedRead<T> {
        let mut st = self.lock();
        let (max_age, now) = (st.max_age_ms, crate::base::epoch_ms());
        match st.rows.get_mut(key) {
            None => DecodedRead::Absent {
                marker_revision: None,
            },
            Some(row) if expired_at(max_age, row, now) => DecodedRead::Absent {
                marker_revision: None,
            },
            Some(row) => {
                let revision = row.revision;
                match row.decoded(key, decode) {
                    Some(value) => DecodedRead::Present(value, revision),
                    None => DecodedRead::Absent {
                        marker_revision: Some(revision),
                    },
                }
            }
        }
    }

    /// [`RowCache::scan`] with every value decoded as [`RowCache::read_decoded`] does.
    pub fn scan_decoded<T: Send + Sync + 'static>(
        &self,
        prefix: &str,
        decode: impl Fn(&str, &Bytes) -> T,
    ) -> Vec<Arc<T>> {
        let mut st = self.lock();
        let (max_age, now) = (st.max_age_ms, crate::base::epoch_ms());
        st.rows
            .range_mut(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(_, r)| !expired_at(max_age, r, now))
            .filter_map(|(k, r)| r.decoded(k, &decode))
            .collect()
    }

    /// A write this daemon made, acknowledged at `revision`: applied at once when it is the very
    /// next message of the stream (nothing can be skipped), otherwise left to the watch and the
    /// fence (a later revision must not move `applied` past messages not yet seen).
    pub fn note_own_write(&self, key: &str, value: Option<Bytes>, revision: u64) {
        let mut st = self.lock();
        if st.loaded && Some(revision) == st.applied.checked_add(1) {
            st.applied = revision;
            st.rows.insert(
                key.to_string(),
                CachedRow::new(value, revision, crate::base::epoch_ms()),
            );
        }
    }

    fn mark_loaded(&self) {
        let applied = {
            let mut st = self.lock();
            st.loaded = true;
            st.applied
        };
        // The line before the wake-up: a pull loop waiting for the load pulls after the line's
        // stamp (the start-up test in `data_path::cache` compares the two).
        tracing::info!(bucket = %self.inner.bucket, applied, "row cache loaded");
        self.inner.loaded_tx.send_replace(true);
    }

    /// Forgets everything: not proved until the consumer has caught up again.
    fn reset(&self) {
        self.inner.loaded_tx.send_replace(false);
        let mut st = self.lock();
        st.rows.clear();
        st.applied = 0;
        st.held_floor = 0;
        st.loaded = false;
        st.incarnation += 1;
        st.resets += 1;
    }

    /// Feeds the cache from an ordered push consumer until `stop`; resets and re-creates it on a
    /// consumer error or when the audit finds the stream lost something the cache holds. The
    /// cache is emptied (not proved) when this returns.
    pub async fn run(self, ctx: PlaneCtx, mut stop: StopRx) {
        loop {
            self.reset();
            // The feed's requests (stream info, consumer create, the audit's info) each wait up
            // to the request bound while the broker is away; stop must not wait behind them, or
            // a release during an outage would run past its five seconds from the drop.
            let mut feed_stop = stop.clone();
            let fed = tokio::select! {
                _ = stopped(&mut stop) => None,
                fed = self.feed(&ctx, &mut feed_stop) => Some(fed),
            };
            self.retire_consumer(&ctx).await;
            let Some(fed) = fed else { break };
            if let Err(e) = fed {
                tracing::info!(bucket = %self.inner.bucket, why = %e, "row cache reset");
            }
            if *stop.borrow() {
                break;
            }
            tokio::select! {
                _ = stopped(&mut stop) => break,
                _ = tokio::time::sleep(RESTART_PAUSE) => {}
            }
        }
        self.reset();
    }

    /// Asks the broker to delete the feed's last consumer, without waiting for its answer:
    /// left alone, an ordered consumer nobody reads outlives its daemon by its inactivity
    /// threshold (30 s), the broker sending it heartbeats and flow control all the while, and a
    /// daemon restarted in front of a large registry would have its predecessor's consumers
    /// beside its own. The request is only queued on the connection (a stopping daemon drains
    /// it), so a broker that is away costs the stop nothing. A consumer the client recreated
    /// after a gap (`<name>_<n>`) is left to the threshold.
    async fn retire_consumer(&self, ctx: &PlaneCtx) {
        let Some(name) = self.lock().consumer.take() else {
            return;
        };
        let stream = crate::wire::SpaceNames::kv_stream(&self.inner.bucket);
        let subject = format!("$JS.API.CONSUMER.DELETE.{stream}.{name}");
        let queued = ctx
            .client
            .publish_with_reply(subject, ctx.client.new_inbox(), Bytes::new());
        if tokio::time::timeout(RETIRE_BOUND, queued).await.is_err() {
            tracing::debug!(bucket = %self.inner.bucket, %name, "row cache: its consumer's delete not queued");
        }
    }

    async fn feed(&self, ctx: &PlaneCtx, stop: &mut StopRx) -> Result<(), FeedEnd> {
        use BrokerErrorKind as K;
        let stream_name = crate::wire::SpaceNames::kv_stream(&self.inner.bucket);
        let stream = ctx
            .js
            .get_stream_no_info(&stream_name)
            .await
            .map_err(|e| BrokerError::quoting(K::Unsent, "", e))?;
        let info = tokio::time::timeout(ctx.config.request_bound, stream.get_info())
            .await
            .map_err(|elapsed| {
                let text = "stream info: no answer within the bound";
                BrokerError::new(K::TimedOut, text).source(elapsed)
            })?
            .map_err(|e| BrokerError::quoting(K::Refused, "", e))?;
        let max_age = info.config.max_age;
        self.lock().max_age_ms = (!max_age.is_zero()).then_some(max_age.as_millis() as u64);
        let name = format!("rowcache_{}", uuid::Uuid::new_v4().simple());
        self.lock().consumer = Some(name.clone());
        let consumer = tokio::time::timeout(
            ctx.config.request_bound,
            stream.create_consumer(push::OrderedConfig {
                name: Some(name),
                deliver_subject: ctx.client.new_inbox(),
                filter_subject: format!("{}>", self.inner.prefix),
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            }),
        )
        .await
        .map_err(|elapsed| {
            let text = "consumer create: no answer within the bound";
            BrokerError::new(K::TimedOut, text).source(elapsed)
        })?
        .map_err(|e| BrokerError::quoting(K::Refused, "", e))?;
        if consumer.cached_info().num_pending == 0 {
            self.mark_loaded();
        }
        let incarnation = self.lock().incarnation;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| BrokerError::quoting(K::Refused, "", e))?;
        let mut audit = tokio::time::interval(AUDIT_PERIOD);
        audit.tick().await;
        loop {
            tokio::select! {
                _ = stopped(stop) => return Ok(()),
                next = messages.next() => match next {
                    Some(Ok(msg)) => {
                        let Ok(info) = msg.info() else { continue };
                        let (seq, pending) = (info.stream_sequence, info.pending);
                        let stored_at_ms =
                            (info.published.unix_timestamp_nanos() / 1_000_000) as u64;
                        let mut st = self.lock();
                        if st.incarnation != incarnation {
                            return Err(FeedEnd::Reset);
                        }
                        apply(
                            &mut st,
                            &self.inner.prefix,
                            &msg.subject,
                            seq,
                            msg.headers.as_ref(),
                            msg.payload.clone(),
                            stored_at_ms,
                        );
                        if pending == 0 && !st.loaded {
                            drop(st);
                            self.mark_loaded();
                        }
                    }
                    Some(Err(e)) => return Err(FeedEnd::Consumer(Some(Box::new(e)))),
                    None => return Err(FeedEnd::Consumer(None)),
                },
                _ = audit.tick() => {
                    let info = tokio::time::timeout(ctx.config.request_bound, stream.get_info()).await;
                    let Ok(Ok(info)) = info else { continue };
                    let mut st = self.lock();
                    let facts = StreamFacts {
                        first_sequence: info.state.first_sequence,
                        last_sequence: info.state.last_sequence,
                        subjects_count: info.state.subjects_count,
                    };
                    let ages = st.max_age_ms.is_some();
                    if let Some(why) = audit_verdict(&mut st, &facts, ages) {
                        drop(st);
                        return Err(FeedEnd::Lost(why));
                    }
                }
            }
        }
    }
}

/// [`RowCache::scan`] on the state already locked.
fn scan_locked(st: &State, prefix: &str) -> Vec<(String, Row)> {
    let now = crate::base::epoch_ms();
    st.rows
        .range(prefix.to_string()..)
        .take_while(|(k, _)| k.starts_with(prefix))
        .filter(|(_, r)| !expired(st, r, now))
        .filter_map(live_row)
        .collect()
}

/// A held row as a scan hands it out: `None` for a delete or purge marker.
fn live_row((key, row): (&String, &CachedRow)) -> Option<(String, Row)> {
    let value = row.value.clone()?;
    Some((
        key.clone(),
        Row {
            value,
            revision: row.revision,
        },
    ))
}

fn expired(st: &State, row: &CachedRow, now_ms: u64) -> bool {
    expired_at(st.max_age_ms, row, now_ms)
}

fn expired_at(max_age_ms: Option<u64>, row: &CachedRow, now_ms: u64) -> bool {
    max_age_ms.is_some_and(|age| row.stored_at_ms.saturating_add(age) < now_ms)
}

/// Applies one message in stream order (older or equal sequences are already applied).
fn apply(
    st: &mut State,
    prefix: &str,
    subject: &str,
    seq: u64,
    headers: Option<&HeaderMap>,
    payload: Bytes,
    stored_at_ms: u64,
) {
    if seq <= st.applied {
        return;
    }
    st.applied = seq;
    let Some(key) = subject.strip_prefix(prefix) else {
        return;
    };
    // A copy of exactly the value: the client hands the payload out as a slice of its read
    // buffer, and a slice kept for as long as the row would keep the whole buffer (the
    // subjects, reply subjects and headers of every message read with it) alive.
    let value = crate::base::row_op(headers)
        .is_row()
        .then(|| Bytes::copy_from_slice(&payload));
    if st.rows.get(key).is_none_or(|r| r.revision < seq) {
        st.rows
            .insert(key.to_string(), CachedRow::new(value, seq, stored_at_ms));
    }
}

/// The parts of a stream's state the audit compares.
#[derive(Debug, Clone, Copy)]
struct StreamFacts {
    first_sequence: u64,
    last_sequence: u64,
    subjects_count: u64,
}

/// Why a cache's feed ended (the cache is reset and fed again): what the reset's line says.
#[derive(Debug)]
enum FeedEnd {
    /// A request of the feed (stream info, consumer create) failed or went unanswered.
    Broker(BrokerError),
    /// The ordered consumer failed (its error) or ended.
    Consumer(Option<Box<dyn std::error::Error + Send + Sync>>),
    /// The cache was reset under the feed.
    Reset,
    /// The audit found the stream lost what the cache holds ([`audit_verdict`]'s words).
    Lost(String),
}

impl From<BrokerError> for FeedEnd {
    fn from(e: BrokerError) -> FeedEnd {
        FeedEnd::Broker(e)
    }
}

impl std::fmt::Display for FeedEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FeedEnd::Broker(e) => e.fmt(f),
            FeedEnd::Consumer(Some(e)) => write!(f, "consumer: {e}"),
            FeedEnd::Consumer(None) => f.write_str("consumer ended"),
            FeedEnd::Reset => f.write_str("reset under the feed"),
            FeedEnd::Lost(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for FeedEnd {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FeedEnd::Broker(e) => Some(e),
            FeedEnd::Consumer(Some(e)) => Some(e.as_ref()),
            FeedEnd::Consumer(None) | FeedEnd::Reset | FeedEnd::Lost(_) => None,
        }
    }
}

/// Why the cache must be reset given the stream's state, if it must: the stream went back
/// (recreated), or, with nothing applied missing, it holds fewer keys than the cache or its first
/// sequence passed a row the cache holds (purged or deleted under the watch). A bucket with a max
/// age loses messages by design; only "went back" applies there.
///
/// The lowest held revision is found by a walk of every row only when the stream's first
/// sequence passed [`State::held_floor`]: at 100,000 members rows the walk every
/// [`AUDIT_PERIOD`] was the daemon's largest cost of its own while it served a workload with
/// nothing else changing (`smoke bench-scale`, docs/performance-history.md).
fn audit_verdict(st: &mut State, stream: &StreamFacts, ages: bool) -> Option<String> {
    if stream.last_sequence < st.applied {
        return Some(format!(
            "the stream's last sequence {} is below the applied {}",
            stream.last_sequence, st.applied
        ));
    }
    if ages || !st.loaded {
        return None;
    }
    if stream.first_sequence > st.held_floor {
        let min = st.rows.values().map(|r| r.revision).min();
        // Empty: every row applied from now on is past `applied`.
        st.held_floor = min.unwrap_or(st.applied);
        if let Some(min) = min {
            if stream.first_sequence > min {
                return Some(format!(
                    "the stream's first sequence {} passed a held revision {min}",
                    stream.first_sequence
                ));
            }
        }
    }
    if stream.last_sequence == st.applied && stream.subjects_count != st.rows.len() as u64 {
        return Some(format!(
            "the stream holds {} keys, the cache {}",
            stream.subjects_count,
            st.rows.len()
        ));
    }
    None
}

/// The caches the data path decides from, one per bucket. Cheap to clone.
#[derive(Clone)]
pub struct Caches {
    pub acl: RowCache,
    pub members: RowCache,
    pub channels: RowCache,
    pub presence: RowCache,
}

impl Caches {
    /// Caches of the space's buckets (presence expires locally with its bucket's max age).
    pub fn new(names: &crate::wire::SpaceNames) -> Caches {
        Caches {
            acl: RowCache::new(&names.acl_bucket()),
            members: RowCache::new(&names.members_bucket()),
            channels: RowCache::new(&names.channels_bucket()),
            presence: RowCache::new(&names.presence_bucket()),
        }
    }

    /// Starts feeding every cache until `stop` (each empties when stopped).
    pub fn start(&self, ctx: &PlaneCtx, stop: StopRx) -> tokio::task::JoinHandle<()> {
        let all = [
            self.acl.clone(),
            self.members.clone(),
            self.channels.clone(),
            self.presence.clone(),
        ];
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let runs = all.map(|c| c.run(ctx.clone(), stop.clone()));
            futures::future::join_all(runs).await;
        })
    }
}

/// One cache as a reader outside the data path reads it (the membership feed, inventories):
/// each read is proved current by a leader fence asked after it began, exactly as the data
/// path's are, or not made at all (`None`: the caller reads per key from the leader, as it
/// did before).
#[derive(Clone)]
pub struct ProvedRows {
    cache: RowCache,
    ctx: PlaneCtx,
}

/// What the cache held when a read was proved: its incarnation and applied sequence. Equal
/// stamps hold equal rows (every change is applied at a higher sequence, every reset is a new
/// incarnation), so a reader that derived something from the rows at one stamp may keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    incarnation: u64,
    applied: u64,
}

/// A proved read that may find nothing new ([`ProvedRows::scan_since`]).
pub enum Since {
    /// The rows are those of the stamp the caller gave.
    Unchanged,
    /// The rows now, and their stamp.
    Rows(Vec<(String, Row)>, Stamp),
}

impl ProvedRows {
    pub fn new(cache: RowCache, ctx: PlaneCtx) -> ProvedRows {
        ProvedRows { cache, ctx }
    }

    /// Waits up to `bound` for the cache to be loaded; whether it is.
    pub async fn loaded(&self, bound: Duration) -> bool {
        self.cache.loaded_within(bound).await
    }

    /// Every live row whose key starts with `prefix`, proved current at a moment after this
    /// call, unless the rows are still those of `since` ([`Since::Unchanged`]); `None` when the
    /// cache is not proved (not loaded, reset, its fence failed).
    pub async fn scan_since(&self, prefix: &str, since: Option<Stamp>) -> Option<Since> {
        let View::Proved(cache) = self.cache.prove(&self.ctx).await else {
            return None;
        };
        let st = cache.lock();
        let now = Stamp {
            incarnation: st.incarnation,
            applied: st.applied,
        };
        // The proof holds for this incarnation only (a reset since is not proved).
        if !st.loaded || st.last_incarnation != now.incarnation {
            return None;
        }
        if since == Some(now) {
            return Some(Since::Unchanged);
        }
        // Scanned under the same lock the stamp was read under: the rows are the stamp's.
        Some(Since::Rows(scan_locked(&st, prefix), now))
    }

    /// Every live row whose key `keep` accepts ([`RowCache::scan_matching`]), proved current
    /// at a moment after this call, or `None` as [`ProvedRows::scan_since`].
    pub async fn scan_matching(&self, keep: impl Fn(&str) -> bool) -> Option<Vec<(String, Row)>> {
        match self.cache.prove(&self.ctx).await {
            View::Proved(cache) => Some(cache.scan_matching(keep)),
            View::Leader => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_with(rows: &[(&str, u64)], applied: u64) -> State {
        let mut st = State {
            loaded: true,
            ..State::default()
        };
        for (k, rev) in rows {
            apply(
                &mut st,
                "$KV.b.",
                &format!("$KV.b.{k}"),
                *rev,
                None,
                Bytes::from_static(b"{}"),
                0,
            );
        }
        st.applied = applied;
        st
    }

    /// Mutation: dropping the `seq <= applied` skip lets an older message overwrite a newer row
    /// (second assertion).
    #[test]
    fn messages_apply_in_stream_order_and_older_ones_are_skipped() {
        let mut st = state_with(&[("a", 3), ("b", 5)], 5);
        let mut h = HeaderMap::new();
        h.insert("KV-Operation", "DEL");
        apply(&mut st, "$KV.b.", "$KV.b.a", 4, Some(&h), Bytes::new(), 0);
        assert_eq!(st.rows["a"].value.as_deref(), Some(&b"{}"[..]));
        apply(&mut st, "$KV.b.", "$KV.b.a", 7, Some(&h), Bytes::new(), 0);
        assert_eq!(st.rows["a"].value, None, "a delete marker applies");
        assert_eq!(st.applied, 7);
    }

    /// Mutations seen failing: `CachedRow::decoded` not keeping its decoding (the decode count),
    /// `apply` carrying the replaced row's decoding over to the newer message (a stale value).
    #[test]
    fn a_row_is_decoded_once_per_revision_and_never_served_stale() {
        let cache = RowCache::new("b");
        let decodes = std::sync::atomic::AtomicUsize::new(0);
        let number = |_: &str, v: &Bytes| {
            decodes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            serde_json::from_slice::<serde_json::Value>(v).unwrap()["n"].as_u64()
        };
        let put = |rev: u64, n: u64, op: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(op) = op {
                h.insert("KV-Operation", op);
            }
            let body = Bytes::from(format!("{{\"n\":{n}}}"));
            apply(
                &mut cache.lock(),
                "$KV.b.",
                "$KV.b.a",
                rev,
                Some(&h),
                body,
                0,
            );
        };
        let read = |f: &dyn Fn(&str, &Bytes) -> Option<u64>| match cache.read_decoded("a", f) {
            DecodedRead::Present(v, rev) => Some((*v, rev)),
            DecodedRead::Absent { marker_revision } => {
                assert!(marker_revision.is_some() || !cache.lock().rows.contains_key("a"));
                None
            }
        };
        put(3, 1, None);
        assert_eq!(read(&number), Some((Some(1), 3)));
        assert_eq!(read(&number), Some((Some(1), 3)));
        assert_eq!(decodes.load(std::sync::atomic::Ordering::SeqCst), 1);
        put(5, 2, None);
        assert_eq!(read(&number), Some((Some(2), 5)), "the newer revision");
        assert_eq!(decodes.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(
            cache
                .scan_decoded("", number)
                .iter()
                .map(|v| **v)
                .collect::<Vec<_>>(),
            vec![Some(2)]
        );
        put(6, 0, Some("DEL"));
        assert_eq!(read(&number), None, "a delete marker reads as absent");
        assert!(cache.scan_decoded("", number).is_empty());
    }

    /// Mutation: comparing `subjects_count` against rows without the `last == applied` guard
    /// resets on every write the watch has not applied yet (third assertion).
    #[test]
    fn the_audit_resets_only_on_a_loss_or_a_step_back() {
        let mut st = state_with(&[("a", 3), ("b", 5)], 5);
        let mut s = StreamFacts {
            first_sequence: 3,
            last_sequence: 5,
            subjects_count: 2,
        };
        assert_eq!(audit_verdict(&mut st, &s, false), None);
        s.subjects_count = 1;
        assert!(
            audit_verdict(&mut st, &s, false).is_some(),
            "a key gone (purged)"
        );
        s.last_sequence = 6;
        assert_eq!(
            audit_verdict(&mut st, &s, false),
            None,
            "a newer write pending"
        );
        s.first_sequence = 6;
        assert!(audit_verdict(&mut st, &s, false).is_some(), "purged below");
        assert_eq!(
            audit_verdict(&mut st, &s, true),
            None,
            "aging buckets lose by design"
        );
        s.last_sequence = 2;
        assert!(audit_verdict(&mut st, &s, true).is_some(), "recreated");
    }

    /// The audit walks the rows only when the stream's first sequence passed its floor, and a
    /// loss below a held row is still found after rows were replaced. Mutations: the floor
    /// raised past every held revision after a walk (`u64::MAX`): the loss in the last step is
    /// missed; the floor left as it was at a reset: a recreated stream's rows below it are
    /// never walked.
    #[test]
    fn the_audit_walks_the_rows_only_past_its_floor() {
        let mut st = state_with(&[("a", 3), ("b", 5)], 5);
        let mut s = StreamFacts {
            first_sequence: 3,
            last_sequence: 5,
            subjects_count: 2,
        };
        assert_eq!(audit_verdict(&mut st, &s, false), None);
        assert_eq!(st.held_floor, 3, "the walk found the lowest revision");
        // `a` rewritten at 6: the broker removed 3 (history 1).
        apply(
            &mut st,
            "$KV.b.",
            "$KV.b.a",
            6,
            None,
            Bytes::from_static(b"1"),
            0,
        );
        s.first_sequence = 5;
        s.last_sequence = 6;
        assert_eq!(audit_verdict(&mut st, &s, false), None);
        assert_eq!(st.held_floor, 5);
        assert_eq!(
            audit_verdict(&mut st, &s, false),
            None,
            "no walk, same floor"
        );
        s.first_sequence = 6;
        assert!(
            audit_verdict(&mut st, &s, false).is_some(),
            "b's revision 5 is gone from the stream"
        );
        let cache = RowCache::new("b");
        *cache.lock() = st;
        cache.reset();
        assert_eq!(cache.lock().held_floor, 0, "a reset forgets the floor");
    }
}
