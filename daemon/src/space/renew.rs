//! Standing-credential renewal: the daemon's own 75 % re-read and `reloadCreds` adoption.
//!
//! Why: the daemon never signs (the renewal owner's re-sign is `provision::remint`). A renewal owner re-signs the same nkey into the store the daemon
//! reads; the daemon re-reads that store at 75 % of its JWT's lifetime (and when asked on the
//! admin rail), proves each candidate on a disposable connection, and only then moves its
//! resident connection onto it. A candidate the broker refuses never replaces the live one, and
//! a store still holding the previous generation is reported (the remint was missed) and read
//! again after a retry interval while the current credential stays live until it expires.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use crate::base::{
    delivery_creds_key, membership_rw_creds_key, ConnEvent, Credential, CredentialCell, Journal,
    JwtClaims, Link, SecretStore,
};
use crate::provision::{BrokerAccepted, Preflight};
use crate::rails::RECONNECT_WAIT_BOUND;
use crate::space::health::HealthHandle;
use crate::space::lease_watch::WatchRetirement;
use crate::wire::{Accepted, CredentialOutcome, Skipped, Space};

/// The renewal point, as a share of the JWT's `iat → exp` lifetime.
pub const RENEW_AT_SHARE: f64 = 0.75;
/// The resident connection moves onto an adopted credential this long after the reply.
pub const RECONNECT_AFTER_REPLY: Duration = Duration::from_millis(250);
/// While the credential has expired, the store is read at most this long after the last read
/// (or after the retry interval, when that is shorter). The broker closed the connection the
/// admin rail rides on, so a renewal owner's `reloadCreds` finds no responder; this read is how
/// its re-sign is adopted before the backstop (60 s by default: twelve reads, not one a second).
pub const EXPIRED_REREAD: Duration = Duration::from_secs(5);
// Several reads fit in the default backstop.
const _: () = assert!(
    4 * EXPIRED_REREAD.as_millis()
        <= (crate::base::DEFAULT_BROKER_GONE_WINDOW_MS * crate::base::BACKSTOP_WINDOWS) as u128
);
// An admin request waiting for that reconnect outlives its start.
const _: () = assert!(RECONNECT_AFTER_REPLY.as_millis() < RECONNECT_WAIT_BOUND.as_millis());

/// The unix second at which a credential with these claims is due for renewal (`None` when it
/// never expires). `iat`/`exp` come from a JWT, so they may be anything: a lifetime or renewal
/// point outside `i64` is refused, never wrapped.
pub fn renew_point_secs(claims: &JwtClaims) -> Result<Option<i64>, LifetimeError> {
    let Some(exp) = claims.exp else {
        return Ok(None);
    };
    let unusable = || LifetimeError {
        iat: claims.iat,
        exp,
    };
    let life = exp.checked_sub(claims.iat).ok_or_else(unusable)?.max(0);
    let share = (life as f64 * RENEW_AT_SHARE).floor() as i64;
    claims.iat.checked_add(share).map(Some).ok_or_else(unusable)
}

/// A JWT whose `iat → exp` lifetime or renewal point is outside `i64` (one cause, so no kind):
/// the times it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LifetimeError {
    pub iat: i64,
    pub exp: i64,
}

impl std::fmt::Display for LifetimeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "its lifetime cannot be computed (iat {}, exp {})",
            self.iat, self.exp
        )
    }
}

impl std::error::Error for LifetimeError {}

/// The post-adoption reconnect, as something admin requests can wait out.
#[derive(Clone)]
pub struct ReconnectGate {
    in_flight: Arc<watch::Sender<bool>>,
    /// The lease watch, retired before the reconnect closes the connection it is bound on.
    lease_watch: Arc<Mutex<Option<WatchRetirement>>>,
    /// True from a `reloadCreds` adoption until the rail says its reply was published: the
    /// reconnect counts its 250 ms from the reply, not from the adoption decision.
    awaiting_reply: Arc<watch::Sender<bool>>,
}

impl Default for ReconnectGate {
    fn default() -> Self {
        ReconnectGate {
            in_flight: Arc::new(watch::channel(false).0),
            lease_watch: Arc::default(),
            awaiting_reply: Arc::new(watch::channel(false).0),
        }
    }
}

impl ReconnectGate {
    /// Waits (at most `bound`) while a reconnect onto an adopted credential is in flight.
    pub async fn settled(&self, bound: Duration) {
        let mut rx = self.in_flight.subscribe();
        let _ = tokio::time::timeout(bound, rx.wait_for(|busy| !*busy)).await;
    }

    /// The reply to the admin request being answered was published.
    pub fn replied(&self) {
        self.awaiting_reply.send_replace(false);
    }

    /// Moves `client` onto the credential of generation `adopted` (after the admin reply plus
    /// [`RECONNECT_AFTER_REPLY`] when `after_reply`, at once otherwise), marking the gate busy
    /// until the `Connected` event (bounded by [`RECONNECT_WAIT_BOUND`]). The wait for the reply
    /// is bounded by the same 5 s.
    ///
    /// Only a live connection that presented an older generation is reconnected. A connection
    /// that is down redials with the held credential, which is the adopted one: after an expiry
    /// its redial waited for exactly this adoption (`CredentialCell::wait_unexpired`). It is
    /// awaited (the same bound), and moved only if it came back on an older credential (a
    /// redial whose handshake began before the adoption). Reconnecting it again would open a
    /// second gap in the rails, in which a reply sent on the first connection is lost.
    fn schedule(
        &self,
        client: async_nats::Client,
        events: broadcast::Sender<ConnEvent>,
        link: Link,
        adopted: u64,
        after_reply: bool,
    ) {
        self.in_flight.send_replace(true);
        if after_reply {
            self.awaiting_reply.send_replace(true);
        }
        let mut replied = self.awaiting_reply.subscribe();
        let gate = self.in_flight.clone();
        let lease_watch = self
            .lease_watch
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        tokio::spawn(async move {
            if after_reply {
                let _ = tokio::time::timeout(RECONNECT_WAIT_BOUND, replied.wait_for(|w| !*w)).await;
                tokio::time::sleep(RECONNECT_AFTER_REPLY).await;
            }
            use async_nats::connection::State;
            let mut rx = events.subscribe();
            if client.connection_state() != State::Connected {
                let _ = tokio::time::timeout(RECONNECT_WAIT_BOUND, connected(&mut rx)).await;
            }
            let presents_adopted = link.presented() >= adopted;
            if client.connection_state() != State::Connected || presents_adopted {
                // Down still: its next redial presents the adopted credential. Or back on it.
                gate.send_replace(false);
                return;
            }
            // A manual reconnect of a live connection: the lease watch finishes a bind in flight
            // and deletes its consumer while this connection can still carry the delete (bounded
            // by the JetStream request timeout); it binds again once reconnected.
            if let Some(w) = lease_watch {
                w.before_reconnect().await;
            }
            let mut rx = events.subscribe();
            if client.force_reconnect().await.is_ok() {
                let _ = tokio::time::timeout(RECONNECT_WAIT_BOUND, connected(&mut rx)).await;
            }
            gate.send_replace(false);
        });
    }
}

/// Resolves at the connection's next `Connected` (or when its event feed ended).
async fn connected(rx: &mut broadcast::Receiver<ConnEvent>) {
    loop {
        match rx.recv().await {
            Ok(ConnEvent::Connected) | Err(broadcast::error::RecvError::Closed) => return,
            _ => {}
        }
    }
}

/// What one re-read of the store decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reread {
    /// Unchanged and not yet due.
    Fresh,
    /// A renewed credential was proved and adopted.
    Adopted(BrokerAccepted),
    /// Unchanged past the renewal point: the remint was missed.
    Missed(String),
    /// The store has no credential, or one that is not usable.
    Unusable(String),
    /// The broker (or a continuity check) refused the candidate.
    Refused(String),
}

/// Sleeps until the unix-ms instant held in `at` (forever for `i64::MAX`).
async fn sleep_until_ms(at: &Mutex<i64>) {
    let at_ms = *at.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    sleep_until_at_ms(at_ms).await
}

/// Sleeps until the unix-ms instant `at_ms` (forever for `i64::MAX`).
async fn sleep_until_at_ms(at_ms: i64) {
    if at_ms == i64::MAX {
        return std::future::pending().await;
    }
    let now_ms = crate::base::epoch_ms() as i64;
    // Due already: ready at the first poll. A zero sleep is not (it waits for the timer's next
    // tick), and the serve loop's renew tick, missed while a renew waited out its bounds, is:
    // the re-read would lose every race to it.
    if at_ms <= now_ms {
        return;
    }
    let wait = Duration::from_millis((at_ms - now_ms) as u64);
    tokio::time::sleep(wait).await;
}

/// The daemon side of renewal: one per resident connection.
pub struct Renewal {
    store: Arc<dyn SecretStore>,
    space: Space,
    cell: CredentialCell,
    preflight: Preflight,
    client: async_nats::Client,
    events: broadcast::Sender<ConnEvent>,
    /// The resident connection's link: which credential generation it presented.
    link: Link,
    health: HealthHandle,
    journal: Journal,
    retry: Duration,
    /// The generation the source last returned (the live one).
    last: Mutex<Credential>,
    /// When the timer re-reads next (unix ms).
    next_due_ms: Mutex<i64>,
    /// When the store was last read for the delivery credential (unix ms).
    last_read_ms: Mutex<i64>,
    adopting: tokio::sync::Mutex<()>,
    pub reconnect: ReconnectGate,
    /// The membership feed's rw connection and its credential cell, once the feed runs.
    membership: Mutex<Option<(CredentialCell, async_nats::Client)>>,
    /// When the feed's own timer re-reads its `membership-rw` credential next (unix ms; never
    /// while no feed runs): 75 % of that credential's lifetime, like the daemon's own.
    membership_due_ms: Mutex<i64>,
}

/// How a [`Renewal`] is wired into the daemon.
pub struct RenewalParts {
    pub store: Arc<dyn SecretStore>,
    pub space: Space,
    pub cell: CredentialCell,
    pub preflight: Preflight,
    pub client: async_nats::Client,
    pub events: broadcast::Sender<ConnEvent>,
    pub link: Link,
    pub health: HealthHandle,
    pub journal: Journal,
    /// The re-read's retry after a missed remint or a refused candidate.
    pub retry: Duration,
}

impl Renewal {
    pub fn new(parts: RenewalParts) -> Renewal {
        let live = parts.cell.get();
        let due = Self::due_ms_for(&live);
        Renewal {
            store: parts.store,
            space: parts.space,
            cell: parts.cell,
            preflight: parts.preflight,
            client: parts.client,
            events: parts.events,
            link: parts.link,
            health: parts.health,
            journal: parts.journal,
            retry: parts.retry,
            last: Mutex::new(live),
            next_due_ms: Mutex::new(due),
            last_read_ms: Mutex::new(crate::base::epoch_ms() as i64),
            adopting: tokio::sync::Mutex::new(()),
            reconnect: ReconnectGate::default(),
            membership: Mutex::new(None),
            membership_due_ms: Mutex::new(i64::MAX),
        }
    }

    /// When the timer re-reads for `cred` (unix ms): its renewal point, never for a credential
    /// that does not expire, at once when its times are unusable (the re-read then reports it).
    fn due_ms_for(cred: &Credential) -> i64 {
        match cred.claims().map(|c| renew_point_secs(&c)) {
            Ok(Ok(Some(s))) => s.saturating_mul(1000),
            Ok(Ok(None)) => i64::MAX,
            Ok(Err(_)) | Err(_) => crate::base::epoch_ms() as i64,
        }
    }

    fn live(&self) -> Credential {
        self.last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn set_due_ms(&self, at_ms: i64) {
        *self
            .next_due_ms
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = at_ms;
    }

    fn set_membership_due_ms(&self, at_ms: i64) {
        *self
            .membership_due_ms
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = at_ms;
    }

    /// Sleeps until the timer's next re-read is due: the renewal point or the retry; while the
    /// credential has expired, at once when the store was not read since the expiry, then at
    /// most [`Renewal::expired_retry`] after the last read (an expiry that begins during the
    /// sleep brings it forward).
    pub async fn due(&self) {
        let mut expiry = self.health.expiry();
        loop {
            let at_ms = self.due_at_ms(*expiry.borrow_and_update());
            tokio::select! {
                _ = sleep_until_at_ms(at_ms) => return,
                changed = expiry.changed() => {
                    if changed.is_err() {
                        return sleep_until_at_ms(at_ms).await;
                    }
                }
            }
        }
    }

    /// When the timer re-reads next (unix ms), given since when the credential has expired.
    fn due_at_ms(&self, expired_since_ms: Option<i64>) -> i64 {
        let due = *self
            .next_due_ms
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(since) = expired_since_ms else {
            return due;
        };
        let last = *self
            .last_read_ms
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if last < since {
            return due.min(since);
        }
        due.min(last.saturating_add(self.expired_retry().as_millis() as i64))
    }

    /// The re-read's interval while the credential has expired: [`EXPIRED_REREAD`], or the
    /// retry interval when that is shorter.
    fn expired_retry(&self) -> Duration {
        self.retry.min(EXPIRED_REREAD)
    }

    /// Sleeps until the membership feed's own re-read of its rw credential is due.
    pub async fn membership_due(&self) {
        sleep_until_ms(&self.membership_due_ms).await
    }

    /// The feed's own timer: re-reads the store's `membership-rw` credential (where the renewal
    /// owner re-mints it) and moves the feed's rw connection onto a proved renewal; a store
    /// still holding the live generation, or a refused candidate, is reported and read again
    /// after the retry interval while the live one stays until it expires.
    pub async fn on_membership_due(&self) {
        let feed = self
            .membership
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let Some((cell, _)) = feed else {
            self.set_membership_due_ms(i64::MAX);
            return;
        };
        let before = cell.get();
        let where_ = self.store.locate(&membership_rw_creds_key(&self.space));
        let retry_s = self.retry.as_millis() as f64 / 1000.0;
        let problem = match self.reload_membership(None).await {
            Ok(_) if cell.get() != before => {
                self.journal.line(format!(
                    "✓ membership: adopted the renewed membership-rw credential from {where_}; reconnecting the feed onto it"
                ));
                return;
            }
            Ok(_) => format!(
                "{where_} still holds the previous membership-rw credential — the renewal owner has not re-signed it"
            ),
            Err(e) => e,
        };
        self.journal.repeated(
            &format!("membership-renew:{}:{problem}", self.space),
            format!(
                "! membership: {problem}; the feed keeps its live credential until it expires (retrying in {retry_s} s)"
            ),
        );
        self.set_membership_due_ms(crate::base::epoch_ms() as i64 + self.retry.as_millis() as i64);
    }

    /// What to run about a missed remint: the command that re-signs into this store.
    fn remint_hint(&self) -> String {
        match self.store.remint_target() {
            None => "its renewal owner must re-sign it into that store before this JWT expires"
                .to_string(),
            Some(target) => format!(
                "run `{}` before this JWT expires",
                target.command(&self.space)
            ),
        }
    }

    fn where_(&self) -> String {
        self.store.locate(&delivery_creds_key(&self.space))
    }

    /// The timer's re-read: one store read; adopts a proved renewal, reports a missed remint.
    pub async fn on_due(&self) -> Reread {
        let outcome = self.reread(false, None).await;
        let now_ms = crate::base::epoch_ms() as i64;
        let expired = self.health.expired_now();
        let retry = if expired {
            self.expired_retry()
        } else {
            self.retry
        };
        let retry_ms = retry.as_millis() as i64;
        let retry_s = retry.as_millis() as f64 / 1000.0;
        match &outcome {
            // Expired: the broker closed the connection, so no `reloadCreds` can reach this
            // daemon; the store is read again soon instead, until a renewal or the backstop.
            Reread::Missed(_) if expired => {
                self.journal.repeated(
                    &format!("remint-expired:{}", self.space),
                    format!(
                        "! delivery: the credential has expired and {} still holds it; awaiting the renewal owner's re-sign (reading it again every {retry_s} s until the backstop)",
                        self.where_()
                    ),
                );
                self.set_due_ms(now_ms + retry_ms);
            }
            Reread::Fresh => self.set_due_ms(Self::due_ms_for(&self.live())),
            Reread::Adopted(acc) => {
                self.journal.line(format!(
                    "✓ delivery: adopted the renewed credential from {} (the broker accepted {}, exp {}); reconnecting onto it",
                    self.where_(),
                    acc.identity,
                    acc.exp.unwrap_or(0)
                ));
                self.set_due_ms(Self::due_ms_for(&self.live()));
            }
            Reread::Missed(text) => {
                // The same missed remint, retried: one line per window with its count.
                self.journal.repeated(
                    &format!("remint-missed:{}:{text}", self.space),
                    format!("! delivery: {text} (retrying in {retry_s} s)"),
                );
                self.set_due_ms(now_ms + retry_ms);
            }
            Reread::Unusable(text) | Reread::Refused(text) => {
                self.journal.repeated(
                    &format!("remint-refused:{}:{text}", self.space),
                    format!(
                        "! delivery: {text}; the live credential stays until it expires (retrying in {retry_s} s)"
                    ),
                );
                self.set_due_ms(now_ms + retry_ms);
            }
        }
        outcome
    }

    /// A re-read the host asked for (SIGHUP): one store read of each standing credential, a
    /// changed one proved against the broker before it is adopted, every outcome said in one
    /// line. The 75 % timer is moved only by an adoption (to the new credential's point).
    pub async fn on_signal(&self, by: &str) {
        let exp = |c: &Credential| {
            c.claims()
                .ok()
                .and_then(|c| c.exp)
                .map_or_else(|| "never".to_string(), |e| e.to_string())
        };
        match self.reread(false, None).await {
            Reread::Fresh => self.journal.line(format!(
                "• delivery: received {by}: {} holds the credential in use (exp {}); nothing to adopt (space {})",
                self.where_(),
                exp(&self.live()),
                self.space
            )),
            Reread::Adopted(acc) => {
                self.journal.line(format!(
                    "✓ delivery: received {by}: adopted the renewed credential from {} (the broker accepted {}, exp {}); reconnecting onto it",
                    self.where_(),
                    acc.identity,
                    acc.exp.unwrap_or(0)
                ));
                self.set_due_ms(Self::due_ms_for(&self.live()));
            }
            // Each says the live credential is unchanged and stays until it expires.
            Reread::Missed(text) | Reread::Unusable(text) | Reread::Refused(text) => self
                .journal
                .line(format!("! delivery: received {by}: {text}")),
        }
        // The membership feed's rw credential, from the same store: said only when it moved
        // or was refused (an unchanged one is the common case).
        let feed = self
            .membership
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if let Some((cell, _)) = feed {
            let before = cell.get();
            let where_ = self.store.locate(&membership_rw_creds_key(&self.space));
            match self.reload_membership(None).await {
                Ok(_) if cell.get() != before => self.journal.line(format!(
                    "✓ membership: received {by}: adopted the renewed membership-rw credential from {where_}; reconnecting the feed onto it"
                )),
                Ok(_) => {}
                Err(e) => self.journal.line(format!(
                    "! membership: received {by}: {e}; the feed keeps its live credential until it expires"
                )),
            }
        }
    }

    /// `reloadCreds`' delivery component: `expected` is the fingerprint the caller just wrote.
    /// The `Err` is a `String` because the text is the value: the component's reply `error`.
    pub async fn reload(&self, expected: Option<&str>) -> Result<BrokerAccepted, String> {
        match self.reread(true, expected).await {
            Reread::Fresh => Ok(BrokerAccepted::of(&self.live())),
            Reread::Adopted(acc) => {
                self.journal.line(format!(
                    "✓ delivery: reloadCreds adopted the renewed credential from {} (the broker accepted {}, exp {}); reconnecting onto it in {} ms",
                    self.where_(),
                    acc.identity,
                    acc.exp.unwrap_or(0),
                    RECONNECT_AFTER_REPLY.as_millis()
                ));
                self.set_due_ms(Self::due_ms_for(&self.live()));
                Ok(acc)
            }
            Reread::Missed(text) | Reread::Unusable(text) | Reread::Refused(text) => Err(text),
        }
    }

    async fn reread(&self, from_admin: bool, expected: Option<&str>) -> Reread {
        let _one_at_a_time = self.adopting.lock().await;
        let where_ = self.where_();
        *self
            .last_read_ms
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = crate::base::epoch_ms() as i64;
        let raw = match self.store.get(&delivery_creds_key(&self.space)) {
            Ok(Some(raw)) => raw,
            Ok(None) => {
                return Reread::Unusable(format!(
                    "the scoped delivery cred is gone ({where_}) — restore it before the current JWT expires{}",
                    self.store
                        .remint_target()
                        .map(|t| format!(" (`{}` re-signs it)", t.command(&self.space)))
                        .unwrap_or_default()
                ))
            }
            Err(e) => return Reread::Unusable(format!("the delivery credential store: {e}")),
        };
        let candidate = match Credential::parse(&raw) {
            Ok(c) => c,
            Err(e) => {
                return Reread::Unusable(format!(
                    "{where_} does not hold a usable credential ({})",
                    e.detail()
                ))
            }
        };
        if let Some(fp) = expected {
            if candidate.fingerprint() != fp {
                return Reread::Refused(format!(
                    "{where_} does not hold the delivery generation the caller expected - nothing adopted"
                ));
            }
        }
        let live = self.live();
        if candidate == live {
            let due = Self::due_ms_for(&live);
            if (crate::base::epoch_ms() as i64) < due {
                return Reread::Fresh;
            }
            return Reread::Missed(format!(
                "{where_} still holds the previous cred — the renewal owner has not re-signed it (it re-signs + reloads every half-TTL); {}",
                self.remint_hint()
            ));
        }
        let unusable_times = match candidate.claims() {
            Ok(c) => renew_point_secs(&c).err().map(|e| e.to_string()),
            Err(e) => Some(e.detail().to_string()),
        };
        if let Some(e) = unusable_times {
            return Reread::Refused(format!(
                "{where_} holds a credential whose times are unusable ({e}); the live credential is unchanged"
            ));
        }
        let accepted = match self.preflight.prove(&candidate).await {
            Ok(a) => a,
            Err(e) => return Reread::Refused(format!("{e}; the live credential is unchanged")),
        };
        if let Err(e) = continuity(&live, &candidate) {
            return Reread::Refused(format!("{e}; the live credential is unchanged"));
        }
        // Proved: the resident connection presents it from its next (re)connect on.
        self.cell.set(candidate.clone());
        *self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = candidate;
        self.health.adopted();
        self.reconnect.schedule(
            self.client.clone(),
            self.events.clone(),
            self.link.clone(),
            self.cell.generation(),
            from_admin,
        );
        Reread::Adopted(accepted)
    }

    /// The lease watch a reconnect onto an adopted credential retires first.
    pub(crate) fn attach_lease_watch(&self, watch: WatchRetirement) {
        *self
            .reconnect
            .lease_watch
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(watch);
    }

    /// Hands the running membership feed's rw connection to `reloadCreds`.
    pub fn attach_membership(&self, cell: CredentialCell, client: async_nats::Client) {
        self.set_membership_due_ms(Self::due_ms_for(&cell.get()));
        *self
            .membership
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((cell, client));
    }

    /// `reloadCreds`' membership component: proves the store's `membership-rw` credential on a
    /// disposable connection, then, when the feed runs, moves its rw connection onto it
    /// (`residentSwap: "best-effort"`: the reconnect is not awaited). The `Err` is a `String`
    /// because the text is the value: the component's reply `error` and the feed's renewal line.
    pub async fn reload_membership(
        &self,
        expected: Option<&str>,
    ) -> Result<CredentialOutcome, String> {
        let key = membership_rw_creds_key(&self.space);
        let where_ = self.store.locate(&key);
        let raw = match self.store.get(&key) {
            Ok(Some(raw)) => raw,
            Ok(None) if expected.is_some() => {
                return Err(format!(
                    "no membership-rw credential at {where_}, but a membership generation was expected - nothing adopted"
                ))
            }
            Ok(None) => {
                return Ok(CredentialOutcome::Skipped(Skipped {
                    skipped: format!(
                        "no membership-rw credential at {where_} (nothing to reload)"
                    ),
                }))
            }
            Err(e) => return Err(format!("the membership credential store: {e}")),
        };
        let candidate = Credential::parse(&raw).map_err(|e| {
            format!(
                "{where_} does not hold a usable credential ({})",
                e.detail()
            )
        })?;
        if let Some(fp) = expected {
            if candidate.fingerprint() != fp {
                return Err(format!(
                    "{where_} does not hold the membership generation the caller expected - nothing adopted"
                ));
            }
        }
        let accepted = self
            .preflight
            .prove(&candidate)
            .await
            .map_err(|e| e.to_string())?;
        let feed = self
            .membership
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let swap = match feed {
            None => "none (the membership feed is not running)",
            Some((cell, client)) => {
                continuity(&cell.get(), &candidate).map_err(|e| e.to_string())?;
                if cell.get() != candidate {
                    self.set_membership_due_ms(Self::due_ms_for(&candidate));
                    cell.set(candidate);
                    tokio::spawn(async move {
                        let _ = client.force_reconnect().await;
                    });
                }
                "best-effort"
            }
        };
        Ok(CredentialOutcome::Accepted(Accepted {
            ok: true,
            broker_accepted: accepted.reply(),
            resident_swap: Some(swap),
        }))
    }

    /// The store this daemon reloads from.
    pub fn store(&self) -> &Arc<dyn SecretStore> {
        &self.store
    }
}

/// A renewal keeps the nkey (the inbox grant and the lease holder) and the account.
fn continuity(live: &Credential, candidate: &Credential) -> Result<(), ContinuityError> {
    use ContinuityErrorKind as K;
    let (Ok(a), Ok(b)) = (live.public_key(), candidate.public_key()) else {
        let text = "the candidate credential has no usable nkey";
        return Err(ContinuityError::new(K::Unreadable, text));
    };
    if a != b {
        return Err(ContinuityError::new(K::OtherNkey, format!(
            "the candidate credential is for nkey {b}, but this daemon runs as {a}; a renewal re-signs the same nkey"
        )));
    }
    let (Ok(ca), Ok(cb)) = (live.claims(), candidate.claims()) else {
        let text = "the candidate JWT claims are unreadable";
        return Err(ContinuityError::new(K::Unreadable, text));
    };
    if ca.account() != cb.account() {
        return Err(ContinuityError::new(
            K::OtherAccount,
            format!(
                "the candidate credential belongs to account {}, but this daemon serves account {}",
                cb.account(),
                ca.account()
            ),
        ));
    }
    Ok(())
}

/// Why a candidate is not a renewal of the live credential: its kind and the text the refusal
/// quotes (`Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContinuityError {
    kind: ContinuityErrorKind,
    text: String,
}

/// What a candidate does not keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContinuityErrorKind {
    /// Its nkey or its claims cannot be read, so nothing can be compared.
    Unreadable,
    /// It is for another nkey (a renewal re-signs the same one).
    OtherNkey,
    /// It belongs to another account.
    OtherAccount,
}

impl ContinuityError {
    fn new(kind: ContinuityErrorKind, text: impl Into<String>) -> ContinuityError {
        ContinuityError {
            kind,
            text: text.into(),
        }
    }
    pub fn kind(&self) -> ContinuityErrorKind {
        self.kind
    }
}

impl std::fmt::Display for ContinuityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for ContinuityError {}

/// The admin rail's credential verbs, served by this renewal.
impl crate::rails::CredentialAdmin for Renewal {
    fn settled(&self, bound: Duration) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(self.reconnect.settled(bound))
    }
    fn replied(&self) {
        self.reconnect.replied();
    }
    // `String` in both reloads: the text is the value (the component's reply `error`).
    fn reload_delivery<'a>(
        &'a self,
        expected: Option<&'a str>,
    ) -> futures::future::BoxFuture<'a, Result<crate::wire::BrokerAccepted, String>> {
        Box::pin(async move { self.reload(expected).await.map(|a| a.reply()) })
    }
    fn reload_membership<'a>(
        &'a self,
        expected: Option<&'a str>,
    ) -> futures::future::BoxFuture<'a, Result<CredentialOutcome, String>> {
        Box::pin(Renewal::reload_membership(self, expected))
    }
    fn store_identity(&self) -> Result<crate::base::StoreIdentity, crate::wire::Refusal> {
        self.store().identity().map_err(|e| {
            crate::wire::Refusal::new(
                crate::wire::RefusalKind::Unavailable,
                format!("delivery: the store identity is unusable: {e}"),
            )
            .source(e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_renewal_point_is_three_quarters_of_the_lifetime() {
        let c = JwtClaims {
            jti: String::new(),
            iat: 1_000,
            exp: Some(1_100),
            iss: String::new(),
            sub: String::new(),
            name: String::new(),
            issuer_account: None,
            nats: serde_json::Value::Null,
        };
        assert_eq!(renew_point_secs(&c), Ok(Some(1_075)));
        let never = JwtClaims { exp: None, ..c };
        assert_eq!(renew_point_secs(&never), Ok(None));
    }

    /// Mutation caught: `exp - iat` and `iat + share` unchecked (a JWT with `iat` far below 0
    /// and `exp` near `i64::MAX` panics in a debug build and wraps in a release one).
    #[test]
    fn a_lifetime_outside_the_integer_range_is_refused_not_wrapped() {
        let c = JwtClaims {
            jti: String::new(),
            iat: -10,
            exp: Some(i64::MAX),
            iss: String::new(),
            sub: String::new(),
            name: String::new(),
            issuer_account: None,
            nats: serde_json::Value::Null,
        };
        let e = renew_point_secs(&c).unwrap_err();
        assert_eq!(
            e,
            LifetimeError {
                iat: -10,
                exp: i64::MAX
            }
        );
        assert_eq!(
            e.to_string(),
            format!(
                "its lifetime cannot be computed (iat -10, exp {})",
                i64::MAX
            )
        );
        let reversed = JwtClaims {
            iat: i64::MAX,
            exp: Some(i64::MIN),
            ..c
        };
        assert!(renew_point_secs(&reversed).is_err());
    }

    /// A renewal keeps the nkey and the account; each other candidate is refused by its kind,
    /// in the words the re-read's refusal quotes. Mutation seen failing: the account check's
    /// kind set to `OtherNkey`.
    #[test]
    fn a_candidate_for_another_nkey_or_account_is_refused_by_its_kind() {
        use crate::provision::{MeshAuthority, MintOptions, Profile};
        let space = Space::parse("demo").unwrap();
        let mut ours = MeshAuthority::new();
        ours.add_space(&space);
        let mut theirs = MeshAuthority::new();
        theirs.add_space(&space);
        let mint =
            |a: &MeshAuthority, o: MintOptions| a.mint(&space, &Profile::Delivery, o).unwrap();
        let live = mint(&ours, MintOptions::new());
        assert_eq!(
            continuity(&live, &mint(&ours, MintOptions::new().renewal_of(&live))),
            Ok(())
        );
        let other_nkey = continuity(&live, &mint(&ours, MintOptions::new())).unwrap_err();
        assert_eq!(other_nkey.kind(), ContinuityErrorKind::OtherNkey);
        assert!(other_nkey
            .to_string()
            .ends_with("a renewal re-signs the same nkey"));
        let other_account =
            continuity(&live, &mint(&theirs, MintOptions::new().renewal_of(&live))).unwrap_err();
        assert_eq!(other_account.kind(), ContinuityErrorKind::OtherAccount);
        assert!(other_account
            .to_string()
            .starts_with("the candidate credential belongs to account"));
    }
}
