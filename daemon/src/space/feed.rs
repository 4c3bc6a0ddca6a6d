//! The membership feed: broker-sourced channel membership for the graph (docs/operations.md).
//!
//! Why a component of its own: it runs inside the space daemon on two connections of its own
//! (the `$SYS` membership observer and the `membership-rw` writer, each under its own
//! credential), and it is fail-soft: a missing piece or a fault logs the reference line and
//! leaves delivery untouched. It sweeps the account's CONNZ (every interval, and shortly after
//! a connect or disconnect event), attributes each connection to an `owner.actor` principal,
//! joins the live channel subscriptions with the durable rows of the members registry, and
//! writes one display row per principal to `cotal_membership_<s>` plus the `=feed` heartbeat;
//! a row it would write unchanged is not written again, after a restart either (its first sweep
//! reads what the bucket holds). An incomplete sweep neither writes nor prunes. Its own 75 %
//! timer (`space::renew`) and `reloadCreds` move the rw connection onto a renewed credential. `close()` retires both
//! connections before it drains them, so a drain that fails (a connection that is down cannot
//! flush one) never leaves either redialing after the close.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::HeaderMap;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::base::{
    self, credential_expired, epoch_ms, membership_rw_creds_key, Credential, CredentialCell,
    DialSpec, DrainError, Journal, Read, Resident, RowError, Rows, SecretStore,
};
use crate::plane::{ProvedRows, Since, Stamp};
use crate::space::admission::{self, SysPair};
use crate::wire::{Principal, Space, SpaceNames, MEMBERSHIP_OBSERVER_INBOX_PREFIX};

pub const OBSERVER_NAME: &str = "cotal-membership-observer";
pub const RW_NAME: &str = "cotal-membership-rw";
/// Connect/disconnect events re-sweep once none has come for this long (one sweep per burst).
pub const DEBOUNCE: Duration = Duration::from_millis(400);
/// Collection stops this long after the last CONNZ reply …
pub const SETTLE: Duration = Duration::from_millis(250);
/// … and never later than this after the request.
pub const MAX_WAIT: Duration = Duration::from_millis(1_500);
const _: () = assert!(SETTLE.as_millis() < MAX_WAIT.as_millis());
pub const PAGE_LIMIT: usize = 1024;
pub const MAX_PAGES: usize = 64;
/// The freshness heartbeat key.
pub const HEARTBEAT_KEY: &str = "=feed";
/// Bound on dials, writes and each drain at close.
pub const BOUND: Duration = crate::base::BROKER_BOUND;
pub const CLOSE_BOUND: Duration = Duration::from_millis(1_000);
/// How often a sweep lists the display bucket's keys (and reads those it did not write) to
/// prune rows it does not know of (another daemon's, before this one held the lease); between
/// listings it prunes the rows it wrote itself, so a quiet sweep costs the broker nothing
/// that grows with the rows.
pub const RELIST_PERIOD: Duration = Duration::from_secs(600);
/// How long the first sweep waits for the plane's members cache to load (100,000 rows load in
/// a few seconds) before it reads every row from the leader instead; later sweeps never wait.
pub const LOAD_WAIT: Duration = Duration::from_secs(30);

/// One principal's row (`cotal_membership_<s>`, key `<o>.<a>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FeedRow {
    pub live: Vec<String>,
    pub durable: Vec<String>,
    pub observed_at: u64,
}

/// What the feed needs from the daemon.
#[derive(Clone)]
pub struct FeedParts {
    /// The daemon's dial spec (server, TLS); the feed renames it per connection.
    pub dial: DialSpec,
    pub store: Arc<dyn SecretStore>,
    pub space: Space,
    /// The data account the daemon serves (the observer must be scoped to it).
    pub account: String,
    pub journal: Journal,
    pub interval: Duration,
    /// The members registry as the plane's proved cache holds it; without it (or while it is
    /// not proved) each sweep reads every members row from the leader.
    pub members: Option<ProvedRows>,
}

impl FeedParts {
    pub fn new(
        dial: DialSpec,
        store: Arc<dyn SecretStore>,
        space: Space,
        account: String,
        journal: Journal,
    ) -> FeedParts {
        FeedParts {
            dial,
            store,
            space,
            account,
            journal,
            interval: crate::base::DEFAULT_MEMBERSHIP_INTERVAL,
            members: None,
        }
    }
}

/// A running feed.
pub struct MembershipFeed {
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
    observer: Resident,
    rw: Resident,
}

/// How each connection's drain went at [`MembershipFeed::close`] (both are retired either way).
#[derive(Debug)]
pub struct FeedClosed {
    pub observer: Result<(), DrainError>,
    pub rw: Result<(), DrainError>,
}

/// Why a sweep wrote nothing, or stopped part-way: its kind, the problem the degraded line
/// quotes (`Display`), and the broker's or the client's error behind it (`source()`).
#[derive(Debug)]
pub struct FeedError {
    kind: FeedErrorKind,
    text: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// What a sweep could not do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedErrorKind {
    /// The CONNZ sweep had no responder, was truncated, or did not list the feed's own rw
    /// connection: nothing is written.
    UnderReported,
    /// The CONNZ request (its inbox or its publish) failed.
    Connz,
    /// A bucket could not be opened or its keys listed.
    Bucket,
    /// A row or the heartbeat was not written (refused, or no answer within [`BOUND`]).
    Write,
}

impl FeedError {
    fn new(kind: FeedErrorKind, text: impl Into<String>) -> FeedError {
        FeedError {
            kind,
            text: text.into(),
            source: None,
        }
    }
    /// The same error, keeping `source` as its cause.
    fn source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> FeedError {
        self.source = Some(Box::new(source));
        self
    }
    pub fn kind(&self) -> FeedErrorKind {
        self.kind
    }
}

impl std::fmt::Display for FeedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for FeedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A bucket that could not be opened or listed, as the degraded line names it.
fn bucket_error(text: String, e: RowError) -> FeedError {
    FeedError::new(FeedErrorKind::Bucket, text).source(e)
}

/// Where a feed that did not start says why (the reference's lines, written by `start`).
fn down(journal: &Journal, why: &str) {
    journal.line(format!(
        "• membership: {why}. The graph falls back to traffic-only; delivery is unaffected."
    ));
}
fn degraded(journal: &Journal, problem: &str) {
    journal.line(format!(
        "! membership: {problem}; graph membership degraded, delivery unaffected"
    ));
}

impl MembershipFeed {
    /// Starts the feed, or logs why it is down and returns `None`. Never fails delivery.
    pub async fn start(parts: FeedParts) -> Option<MembershipFeed> {
        let j = parts.journal.clone();
        let key = membership_rw_creds_key(&parts.space);
        let at = parts.store.locate(&key);
        let rw_cred = match parts.store.get(&key) {
            Ok(None) => {
                down(&j, &format!("no membership-rw credential at {at}"));
                return None;
            }
            Ok(Some(text)) => match Credential::parse(&text) {
                Ok(c) => c,
                Err(e) => {
                    degraded(
                        &j,
                        &format!(
                            "the membership-rw credential at {at} is unreadable ({})",
                            e.detail()
                        ),
                    );
                    return None;
                }
            },
            Err(e) => {
                degraded(
                    &j,
                    &format!("the membership-rw credential at {at} is unreadable ({e})"),
                );
                return None;
            }
        };
        let pair = SysPair::read(parts.store.as_ref(), &parts.space);
        let observer_cred = match &pair.observer.value {
            Ok(None) => {
                down(
                    &j,
                    &format!(
                        "no $SYS membership-observer credential at {}",
                        pair.observer.at
                    ),
                );
                return None;
            }
            _ => match admission::admit(&pair, &parts.account) {
                Ok(_) => match &pair.observer.value {
                    Ok(Some(c)) => c.clone(),
                    _ => return None,
                },
                Err(e) => {
                    degraded(&j, &e.to_string());
                    return None;
                }
            },
        };
        if credential_expired(&observer_cred) {
            degraded(
                &j,
                &format!(
                    "the $SYS membership-observer credential at {} has expired",
                    pair.observer.at
                ),
            );
            return None;
        }
        let observer_dial = parts
            .dial
            .clone()
            .name(OBSERVER_NAME)
            .inbox(MEMBERSHIP_OBSERVER_INBOX_PREFIX);
        let observer = match base::dial(&observer_dial, CredentialCell::new(observer_cred)).await {
            Ok(r) => r,
            Err(e) => {
                j.line(format!("! membership: failed to start (the observer connection: {e}); graph membership degraded, delivery unaffected"));
                return None;
            }
        };
        let rw_cell = CredentialCell::new(rw_cred);
        let rw = match base::dial(&parts.dial.clone().name(RW_NAME), rw_cell.clone()).await {
            Ok(r) => r,
            Err(e) => {
                j.line(format!("! membership: failed to start (the rw connection: {e}); graph membership degraded, delivery unaffected"));
                let _ = observer.close_drained(CLOSE_BOUND).await;
                return None;
            }
        };
        let events = async {
            let c = observer
                .client
                .subscribe(format!("$SYS.ACCOUNT.{}.CONNECT", parts.account))
                .await?;
            let d = observer
                .client
                .subscribe(format!("$SYS.ACCOUNT.{}.DISCONNECT", parts.account))
                .await?;
            Ok::<_, async_nats::SubscribeError>(futures::stream::select(c, d))
        };
        let events = match events.await {
            Ok(e) => e,
            Err(e) => {
                j.line(format!("! membership: failed to start (the connect/disconnect events: {e}); graph membership degraded, delivery unaffected"));
                close_both(&observer, &rw).await;
                return None;
            }
        };
        j.line(format!(
            "✓ membership feed up (broker-sourced channel membership) — space {}",
            parts.space
        ));
        let (stop, stop_rx) = watch::channel(false);
        let sweeper = Sweeper {
            names: SpaceNames::new(&parts.space),
            account: parts.account.clone(),
            observer: observer.client.clone(),
            js: jetstream::context::ContextBuilder::new()
                .timeout(BOUND)
                .build(rw.client.clone()),
            rw_self: rw_cell.get().public_key().unwrap_or_default(),
            rw_cell: rw_cell.clone(),
            written: BTreeMap::new(),
            listed_at: None,
            members: parts.members.clone(),
            derived: None,
            waited_for_load: false,
            seeded: false,
            swept: None,
        };
        let task = tokio::spawn(run(sweeper, events, parts.interval, j, stop_rx));
        Some(MembershipFeed {
            stop,
            task: Some(task),
            observer,
            rw,
        })
    }

    /// The rw connection and its credential cell (what `reloadCreds` moves).
    pub fn rw(&self) -> (CredentialCell, async_nats::Client) {
        (self.rw.credential.clone(), self.rw.client.clone())
    }

    /// Stops the sweeps and closes both connections, each retired before its drain whatever
    /// the other's drain did, so neither reconnects after the close even when a drain fails
    /// (a disconnected connection cannot flush one) or hangs (each is bounded by
    /// [`CLOSE_BOUND`]). Says how each drain went.
    pub async fn close(mut self) -> FeedClosed {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(CLOSE_BOUND, task).await;
        }
        let closed = close_both(&self.observer, &self.rw).await;
        for (name, r) in [(OBSERVER_NAME, &closed.observer), (RW_NAME, &closed.rw)] {
            if let Err(e) = r {
                tracing::warn!(connection = name, error = %e, "membership feed: a drain failed at close; the connection is closed all the same");
            }
        }
        closed
    }
}

impl Drop for MembershipFeed {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// Closes both connections side by side; neither outcome gates the other.
async fn close_both(observer: &Resident, rw: &Resident) -> FeedClosed {
    let (observer, rw) = tokio::join!(
        observer.close_drained(CLOSE_BOUND),
        rw.close_drained(CLOSE_BOUND)
    );
    FeedClosed { observer, rw }
}

/// The sweep loop: every interval and after connect/disconnect events (debounced). A failing
/// sweep is reported once per episode.
///
/// Debounced means one sweep per burst: the events that come within [`DEBOUNCE`] of each other
/// are taken together and swept once, when [`DEBOUNCE`] has passed without one (or when the
/// interval falls due first, so churn that never pauses is still swept every interval). A
/// sweep per event instead would queue one sweep (a CONNZ and a leader read per registry row)
/// behind another for every agent of a mesh that reconnects at once, for minutes.
async fn run(
    mut s: Sweeper,
    mut events: impl futures::Stream<Item = async_nats::Message> + Unpin,
    interval: Duration,
    journal: Journal,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        let event = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tick.tick() => false,
            Some(_) = events.next() => true,
        };
        if event {
            let quiet = tokio::time::sleep(DEBOUNCE);
            tokio::pin!(quiet);
            // Set when the events end: then only the quiet time is waited out.
            let mut ended = false;
            loop {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    _ = &mut quiet => break,
                    _ = tick.tick() => break,
                    more = events.next(), if !ended => match more {
                        Some(_) => quiet.as_mut().reset(tokio::time::Instant::now() + DEBOUNCE),
                        None => ended = true,
                    },
                }
            }
        }
        let outcome = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            r = s.sweep() => r,
        };
        match outcome {
            Ok(()) if failing => {
                failing = false;
                journal.line("✓ membership feed: sweeping again; graph membership restored");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                degraded(&journal, &e.to_string());
            }
            Err(_) => {}
        }
    }
}

struct Sweeper {
    names: SpaceNames,
    account: String,
    observer: async_nats::Client,
    js: jetstream::Context,
    rw_self: String,
    rw_cell: CredentialCell,
    /// A digest of each row this feed last wrote (its `live` and `durable`, without
    /// `observedAt`), so unchanged rows are not rewritten.
    written: BTreeMap<String, u64>,
    /// When the display bucket's keys were last listed ([`RELIST_PERIOD`]).
    listed_at: Option<tokio::time::Instant>,
    members: Option<ProvedRows>,
    /// The durable channels last derived from the cache, and the cache's stamp then: a sweep
    /// that finds the same stamp derives nothing again.
    derived: Option<(Stamp, Arc<Durable>)>,
    waited_for_load: bool,
    /// Whether [`Sweeper::written`] was seeded from the bucket (once, at the first sweep).
    seeded: bool,
    /// What the last complete sweep derived its rows from: a sweep that finds the same live
    /// channels and the same durable view (the very `Arc`, so the members cache did not move)
    /// has nothing to write or prune and skips the per-principal pass.
    swept: Option<(Live, Arc<Durable>)>,
}

/// Live channels per principal (`<o>.<a>`), from CONNZ.
type Live = BTreeMap<String, BTreeSet<String>>;

/// Durable channels per principal (`<o>.<a>`).
type Durable = BTreeMap<String, BTreeSet<String>>;

/// The digest [`Sweeper::written`] keeps of a row.
fn digest(live: &[String], durable: &[String]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (live, durable).hash(&mut h);
    h.finish()
}

/// One CONNZ connection as the feed reads it.
struct Conn {
    principal: Option<Principal>,
    user: String,
    channels: Vec<String>,
}

impl Sweeper {
    async fn sweep(&mut self) -> Result<(), FeedError> {
        let started = tokio::time::Instant::now();
        // The rw nkey can change only with a renewal of another nkey; follow the cell.
        self.rw_self = self.rw_cell.get().public_key().unwrap_or_default();
        let conns = self.connz().await?;
        if !conns.iter().any(|c| c.user == self.rw_self) {
            return Err(FeedError::new(FeedErrorKind::UnderReported, "CONNZ sweep under-reported (the feed's own rw connection was not listed) - nothing written"));
        }
        let mut live = Live::new();
        for c in &conns {
            if let Some(p) = &c.principal {
                if !c.channels.is_empty() {
                    live.entry(p.dot_form())
                        .or_default()
                        .extend(c.channels.iter().cloned());
                }
            }
        }
        let durable = self.durable().await?;
        if !self.seeded {
            self.seeded = true;
            self.seed_written().await;
        }
        let now = epoch_ms();
        let bucket = self.names.membership_bucket();
        // Whether this sweep lists the bucket to prune rows it never wrote ([`RELIST_PERIOD`]).
        let relist = self
            .listed_at
            .is_none_or(|at| at.elapsed() >= RELIST_PERIOD);
        // The same inputs as the last complete sweep: every row it would derive carries the
        // digest it wrote, and it pruned every row it no longer derives. Only the heartbeat
        // is due (at 10,000 principals the pass cost the idle daemon about as much as the
        // rest of its idle work: docs/performance-history.md).
        let unchanged = !relist
            && self
                .swept
                .as_ref()
                .is_some_and(|(l, d)| *l == live && Arc::ptr_eq(d, &durable));
        let (mut wrote, mut pruned, mut compared) = (0usize, 0usize, 0usize);
        if !unchanged {
            self.swept = None;
            (wrote, pruned, compared) = self.rows(&bucket, &live, &durable, relist, now).await?;
            self.swept = Some((live, durable));
        }
        let beat = json!({"observedAt": now}).to_string().into_bytes();
        self.put(&bucket, HEARTBEAT_KEY, beat, false).await?;
        let ms = started.elapsed().as_millis() as u64;
        tracing::debug!(compared, wrote, pruned, ms, "membership sweep");
        Ok(())
    }

    /// The per-principal pass: puts each row whose digest changed, prunes the rows no longer
    /// derived (listing the bucket when `relist`). Returns (written, pruned, principals
    /// compared).
    async fn rows(
        &mut self,
        bucket: &str,
        live: &Live,
        durable: &Durable,
        relist: bool,
        now: u64,
    ) -> Result<(usize, usize, usize), FeedError> {
        let mut principals: BTreeSet<String> = live.keys().cloned().collect();
        principals.extend(durable.keys().cloned());
        let (mut wrote, mut pruned) = (0usize, 0usize);
        for p in &principals {
            let l: Vec<String> = live
                .get(p)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            let d: Vec<String> = durable
                .get(p)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            let sum = digest(&l, &d);
            if self.written.get(p) == Some(&sum) {
                continue;
            }
            let row = FeedRow {
                live: l.clone(),
                durable: d.clone(),
                observed_at: now,
            };
            self.put(
                bucket,
                p,
                serde_json::to_vec(&row).unwrap_or_default(),
                false,
            )
            .await?;
            self.written.insert(p.clone(), sum);
            wrote += 1;
        }
        if relist {
            let existing = crate::base::keys(&self.js, bucket, ">", BOUND)
                .await
                .map_err(|e| bucket_error(format!("listing {bucket}: {e}"), e))?;
            let rows = Rows::open(&self.js, bucket, BOUND)
                .await
                .map_err(|e| bucket_error(format!("{bucket}: {e}"), e))?;
            for key in existing {
                if key == HEARTBEAT_KEY || principals.contains(&key) {
                    continue;
                }
                if let Ok(Read::Present(_)) = rows.read(&key).await {
                    self.put(bucket, &key, Vec::new(), true).await?;
                    pruned += 1;
                }
                self.written.remove(&key);
            }
            self.listed_at = Some(tokio::time::Instant::now());
        } else {
            // Only this feed writes the bucket under the lease: a row it wrote and no longer
            // derives is present, and goes without a read.
            let stale: Vec<String> = self
                .written
                .keys()
                .filter(|k| !principals.contains(*k))
                .cloned()
                .collect();
            for key in stale {
                self.put(bucket, &key, Vec::new(), true).await?;
                self.written.remove(&key);
                pruned += 1;
            }
        }
        Ok((wrote, pruned, principals.len()))
    }

    /// Seeds [`Sweeper::written`] with the digest of every row the bucket holds, so a daemon
    /// that starts (or takes the lease over) in front of rows it would write again unchanged
    /// does not rewrite them: without it the first sweep put one row per principal (10,000
    /// serial puts at `bench-scale`'s 100,000-row point), whatever had changed. Read with one
    /// ordered consumer (the last message per key, one stream of messages rather than a
    /// request per key), bounded by [`BOUND`]; a row that is not read here is written as
    /// before, so an error or a timeout costs only the puts.
    async fn seed_written(&mut self) {
        let bucket = self.names.membership_bucket();
        match tokio::time::timeout(BOUND, self.last_rows(&bucket)).await {
            Ok(Ok(held)) => self.written.extend(held),
            Ok(Err(e)) => {
                tracing::info!(%bucket, error = %e, "membership feed: rows not read before the first sweep; it writes them all")
            }
            Err(_) => {
                tracing::info!(%bucket, "membership feed: rows not read within the bound before the first sweep; it writes them all")
            }
        }
    }

    /// The digests of `bucket`'s rows (the last message of each key; deleted keys, the
    /// heartbeat and rows that are not the feed's shape left out).
    async fn last_rows(
        &self,
        bucket: &str,
    ) -> Result<BTreeMap<String, u64>, Box<dyn std::error::Error + Send + Sync>> {
        /// The part of a row the digest covers (`observedAt` is not in it).
        #[derive(Deserialize)]
        struct Held {
            live: Vec<String>,
            durable: Vec<String>,
        }
        let stream = self
            .js
            .get_stream_no_info(SpaceNames::kv_stream(bucket))
            .await?;
        let prefix = format!("$KV.{bucket}.");
        let name = format!("feedseed_{}", uuid::Uuid::new_v4().simple());
        let mut held = BTreeMap::new();
        let consumer = stream
            .create_consumer(jetstream::consumer::push::OrderedConfig {
                name: Some(name.clone()),
                deliver_subject: self.js.client().new_inbox(),
                filter_subject: format!("{prefix}>"),
                deliver_policy: jetstream::consumer::DeliverPolicy::LastPerSubject,
                ..Default::default()
            })
            .await?;
        if consumer.cached_info().num_pending > 0 {
            let mut messages = consumer.messages().await?;
            while let Some(msg) = messages.next().await {
                let msg = msg?;
                let pending = msg.info()?.pending;
                let key = msg.subject.strip_prefix(&prefix).unwrap_or_default();
                if key != HEARTBEAT_KEY && base::row_op(msg.headers.as_ref()).is_row() {
                    if let Ok(row) = serde_json::from_slice::<Held>(&msg.payload) {
                        held.insert(key.to_string(), digest(&row.live, &row.durable));
                    }
                }
                if pending == 0 {
                    break;
                }
            }
        }
        // The ordered consumer is ephemeral; deleting it now spares the broker its idle wait.
        let _ = stream.delete_consumer(&name).await;
        Ok(held)
    }

    async fn put(
        &self,
        bucket: &str,
        key: &str,
        body: Vec<u8>,
        delete: bool,
    ) -> Result<(), FeedError> {
        let mut headers = HeaderMap::new();
        if delete {
            headers.insert("KV-Operation", "DEL");
        }
        let send = async {
            let ack = self
                .js
                .publish_with_headers(format!("$KV.{bucket}.{key}"), headers, body.into())
                .await?;
            ack.await.map(|_| ())
        };
        let write = |text: String| FeedError::new(FeedErrorKind::Write, text);
        match tokio::time::timeout(BOUND, send).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(write(format!("writing {bucket}.{key}: {e}")).source(e)),
            Err(elapsed) => Err(write(format!(
                "writing {bucket}.{key}: no answer within {} ms",
                BOUND.as_millis()
            ))
            .source(elapsed)),
        }
    }

    /// Durable channels per principal from the members registry (rows in a `durable-*` state):
    /// from the plane's members cache, proved current now (one leader fence) and derived again
    /// only when the cache changed since the last sweep, or, when it is not proved, every row
    /// read from the leader. The first sweep waits for the cache to load ([`LOAD_WAIT`]).
    async fn durable(&mut self) -> Result<Arc<Durable>, FeedError> {
        if let Some(view) = &self.members {
            let wait = if self.waited_for_load {
                Duration::ZERO
            } else {
                LOAD_WAIT
            };
            self.waited_for_load = true;
            if view.loaded(wait).await {
                let since = self.derived.as_ref().map(|(stamp, _)| *stamp);
                match view.scan_since("", since).await {
                    Some(Since::Unchanged) => {
                        if let Some((_, d)) = &self.derived {
                            return Ok(d.clone());
                        }
                    }
                    Some(Since::Rows(rows, stamp)) => {
                        let mut out = Durable::new();
                        for (key, row) in rows {
                            if let Some((principal, channel)) = durable_of(&key, &row.value) {
                                out.entry(principal.to_string())
                                    .or_default()
                                    .insert(channel.to_string());
                            }
                        }
                        let out = Arc::new(out);
                        self.derived = Some((stamp, out.clone()));
                        return Ok(out);
                    }
                    None => {}
                }
            }
        }
        self.derived = None;
        let bucket = self.names.members_bucket();
        let keys = crate::base::keys(&self.js, &bucket, ">", BOUND)
            .await
            .map_err(|e| bucket_error(format!("listing {bucket}: {e}"), e))?;
        let rows = Rows::open(&self.js, &bucket, BOUND)
            .await
            .map_err(|e| bucket_error(format!("{bucket}: {e}"), e))?;
        let mut out = Durable::new();
        for key in keys {
            if let Ok(Read::Present(row)) = rows.read(&key).await {
                if let Some((principal, channel)) = durable_of(&key, &row.value) {
                    out.entry(principal.to_string())
                        .or_default()
                        .insert(channel.to_string());
                }
            }
        }
        Ok(Arc::new(out))
    }

    /// Every connection of the account, paged; an under-reported sweep is an error.
    async fn connz(&self) -> Result<Vec<Conn>, FeedError> {
        let connz = |text: String| FeedError::new(FeedErrorKind::Connz, text);
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let inbox = format!("{MEMBERSHIP_OBSERVER_INBOX_PREFIX}.{nonce}");
        let mut replies = self
            .observer
            .subscribe(format!("{inbox}.>"))
            .await
            .map_err(|e| connz(format!("CONNZ inbox: {e}")).source(e))?;
        let mut out = Vec::new();
        let mut got_any = false;
        let mut complete = false;
        for page in 0..MAX_PAGES {
            let offset = page * PAGE_LIMIT;
            let body =
                json!({"subscriptions": true, "auth": true, "offset": offset, "limit": PAGE_LIMIT});
            self.observer
                .publish_with_reply(
                    format!("$SYS.REQ.ACCOUNT.{}.CONNZ", self.account),
                    format!("{inbox}.{page}"),
                    body.to_string().into(),
                )
                .await
                .map_err(|e| connz(format!("CONNZ request: {e}")).source(e))?;
            let started = tokio::time::Instant::now();
            let mut owes = false;
            let mut deadline = started + MAX_WAIT;
            loop {
                let next = tokio::time::timeout_at(deadline, replies.next()).await;
                let Ok(Some(msg)) = next else { break };
                got_any = true;
                let v: Value = serde_json::from_slice(&msg.payload).unwrap_or_default();
                let data = &v["data"];
                let conns = data["connections"].as_array().cloned().unwrap_or_default();
                let total = data["total"].as_u64().unwrap_or(0) as usize;
                if conns.len() >= PAGE_LIMIT && offset + conns.len() < total {
                    owes = true;
                }
                out.extend(conns.iter().map(|c| self.conn(c)));
                deadline = (tokio::time::Instant::now() + SETTLE).min(started + MAX_WAIT);
            }
            if !owes {
                complete = true;
                break;
            }
        }
        let _ = replies.unsubscribe().await;
        if !got_any || !complete {
            return Err(FeedError::new(
                FeedErrorKind::UnderReported,
                "CONNZ sweep under-reported (no responder or truncated) - nothing written",
            ));
        }
        Ok(out)
    }

    fn conn(&self, c: &Value) -> Conn {
        let user = c["authorized_user"].as_str().unwrap_or("").to_string();
        let tagged = c["tags"].as_array().and_then(|tags| {
            tags.iter()
                .filter_map(Value::as_str)
                .find_map(|t| t.strip_prefix("principal:"))
                .map(str::to_string)
        });
        let principal = match tagged {
            Some(dot) => attributable(&dot),
            None => user
                .split_once('-')
                .and_then(|(o, a)| attributable(&format!("{o}.{a}"))),
        };
        let prefix = format!("{}.chat.", self.names.space().prefix());
        let channels = c["subscriptions_list"]
            .as_array()
            .map(|subs| {
                subs.iter()
                    .filter_map(Value::as_str)
                    .filter_map(|s| channel_of(s, &prefix))
                    .collect()
            })
            .unwrap_or_default();
        Conn {
            principal,
            user,
            channels,
        }
    }
}

/// The principal (`<o>.<a>`) and channel of a members row `<channel>/<o>.<a>.<uid>` whose
/// state is `durable-*`; `None` for another state, a key that does not split or a value that
/// does not parse. Reads the `state` field alone.
fn durable_of<'k>(key: &'k str, value: &[u8]) -> Option<(&'k str, &'k str)> {
    #[derive(Deserialize)]
    struct State<'a> {
        #[serde(borrow, default)]
        state: std::borrow::Cow<'a, str>,
    }
    let (channel, member) = key.split_once('/')?;
    // `<o>.<a>.<uid>` → `<o>.<a>`
    let (principal, _uid) = member.rsplit_once('.')?;
    let state: State = serde_json::from_slice(value).ok()?;
    state
        .state
        .starts_with("durable")
        .then_some((principal, channel))
}

/// A dot-form key CONNZ attribution accepts: owner `local` or a derived `u_` + 26 base32.
pub fn attributable(dot: &str) -> Option<Principal> {
    let p = Principal::parse(dot).ok()?;
    let o = p.owner();
    let derived = o.len() == 28
        && o.starts_with("u_")
        && o[2..]
            .chars()
            .all(|c| c.is_ascii_lowercase() || ('2'..='7').contains(&c));
    (o == "local" || derived).then_some(p)
}

/// The channel of a live chat subscription `cotal.<s>.chat.*.*.<channel>`.
pub fn channel_of(subject: &str, chat_prefix: &str) -> Option<String> {
    let rest = subject.strip_prefix(chat_prefix)?;
    let rest = rest.strip_prefix("*.*.")?;
    (!rest.is_empty()).then(|| rest.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribution_accepts_local_and_derived_owners_only() {
        assert!(attributable("local.alice").is_some());
        assert!(attributable("u_abcdefghijklmnopqrstuvwxyz.bot").is_some());
        assert!(attributable("someone.alice").is_none());
        assert!(attributable("u_short.bot").is_none());
        assert!(attributable("nodot").is_none());
    }

    #[test]
    fn channels_come_from_live_chat_subscriptions_only() {
        let p = "cotal.demo.chat.";
        assert_eq!(
            channel_of("cotal.demo.chat.*.*.general", p).as_deref(),
            Some("general")
        );
        assert_eq!(channel_of("cotal.demo.chat.local.alice.>", p), None);
        assert_eq!(channel_of("_INBOX_U.>", p), None);
    }
}
