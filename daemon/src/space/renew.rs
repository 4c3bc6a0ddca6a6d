//! Standing-credential renewal: the daemon's own 75 % re-read, `reloadCreds` adoption, and the
//! renewal owner's `remint_daemon_creds`.
//!
//! Why: the daemon never signs. A renewal owner re-signs the same nkey into the store the daemon
//! reads; the daemon re-reads that store at 75 % of its JWT's lifetime (and when asked on the
//! admin rail), proves each candidate on a disposable connection, and only then moves its
//! resident connection onto it. A candidate the broker refuses never replaces the live one, and
//! a store still holding the previous generation is reported (the remint was missed) and read
//! again after a retry interval while the current credential stays live until it expires.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use crate::conn::{ConnEvent, CredentialCell};
use crate::creds::{Credential, JwtClaims};
use crate::journal::Journal;
use crate::provision::jwt::{encode_user, UserClaimsSpec};
use crate::provision::Profile;
use crate::rails::admin::RECONNECT_WAIT_BOUND;
use crate::space::health::HealthHandle;
use crate::store::{
    account_signer_key, delivery_creds_key, membership_rw_creds_key, FsStore, SecretStore,
};
use crate::wire::{Space, SpaceNames};

/// `COTAL_DELIVERY_REMINT_RETRY_MS`: the retry after a missed remint (default 60 s).
pub const ENV_REMINT_RETRY_MS: &str = "COTAL_DELIVERY_REMINT_RETRY_MS";
pub const DEFAULT_REMINT_RETRY: Duration = Duration::from_secs(60);
/// The renewal point, as a share of the JWT's `iat → exp` lifetime.
pub const RENEW_AT_SHARE: f64 = 0.75;
/// The resident connection moves onto an adopted credential this long after the reply.
pub const RECONNECT_AFTER_REPLY: Duration = Duration::from_millis(250);
/// Bound on a disposable preflight connection.
pub const PREFLIGHT_BOUND: Duration = Duration::from_secs(5);

/// The unix second at which a credential with these claims is due for renewal (`None` when it
/// never expires). `iat`/`exp` come from a JWT, so they may be anything: a lifetime or renewal
/// point outside `i64` is refused, never wrapped.
pub fn renew_point_secs(claims: &JwtClaims) -> Result<Option<i64>, String> {
    let Some(exp) = claims.exp else {
        return Ok(None);
    };
    let unusable = || {
        format!(
            "its lifetime cannot be computed (iat {}, exp {exp})",
            claims.iat
        )
    };
    let life = exp.checked_sub(claims.iat).ok_or_else(unusable)?.max(0);
    let share = (life as f64 * RENEW_AT_SHARE).floor() as i64;
    claims.iat.checked_add(share).map(Some).ok_or_else(unusable)
}

/// What the broker accepted: the user nkey and the JWT's expiry (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAccepted {
    pub identity: String,
    pub exp: Option<i64>,
}

impl BrokerAccepted {
    pub fn to_json(&self) -> Value {
        json!({"identity": self.identity, "exp": self.exp})
    }
    fn of(cred: &Credential) -> BrokerAccepted {
        BrokerAccepted {
            identity: cred.public_key().unwrap_or_default(),
            exp: cred.claims().ok().and_then(|c| c.exp),
        }
    }
}

/// Proves a candidate against the broker on a disposable connection (never the resident one).
#[derive(Debug, Clone)]
pub struct Preflight {
    pub server: String,
    pub tls_ca: Option<PathBuf>,
    pub bound: Duration,
}

impl Preflight {
    pub fn new(server: impl Into<String>, tls_ca: Option<PathBuf>) -> Preflight {
        Preflight {
            server: server.into(),
            tls_ca,
            bound: PREFLIGHT_BOUND,
        }
    }

    /// `Ok` once the broker answered the candidate's CONNECT with its PONG.
    pub async fn prove(&self, cred: &Credential) -> Result<BrokerAccepted, String> {
        let client = crate::provision::connect_with_credential(
            &self.server,
            self.tls_ca.as_deref(),
            cred,
            "cotal-delivery-preflight",
            self.bound,
        )
        .await
        .map_err(|e| format!("the broker did not accept the candidate credential ({e})"))?;
        let _ = tokio::time::timeout(self.bound, client.drain()).await;
        Ok(BrokerAccepted::of(cred))
    }
}

/// The post-adoption reconnect, as something admin requests can wait out.
#[derive(Clone)]
pub struct ReconnectGate {
    in_flight: Arc<watch::Sender<bool>>,
    /// True from a `reloadCreds` adoption until the rail says its reply was published: the
    /// reconnect counts its 250 ms from the reply, not from the adoption decision.
    awaiting_reply: Arc<watch::Sender<bool>>,
}

impl Default for ReconnectGate {
    fn default() -> Self {
        ReconnectGate {
            in_flight: Arc::new(watch::channel(false).0),
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

    /// Reconnects `client` (after the admin reply plus [`RECONNECT_AFTER_REPLY`] when
    /// `after_reply`, at once otherwise), marking the gate busy until the `Connected` event
    /// (bounded by [`RECONNECT_WAIT_BOUND`]). The wait for the reply is bounded by the same 5 s.
    fn schedule(
        &self,
        client: async_nats::Client,
        events: broadcast::Sender<ConnEvent>,
        after_reply: bool,
    ) {
        self.in_flight.send_replace(true);
        if after_reply {
            self.awaiting_reply.send_replace(true);
        }
        let mut replied = self.awaiting_reply.subscribe();
        let gate = self.in_flight.clone();
        tokio::spawn(async move {
            if after_reply {
                let _ = tokio::time::timeout(RECONNECT_WAIT_BOUND, replied.wait_for(|w| !*w)).await;
                tokio::time::sleep(RECONNECT_AFTER_REPLY).await;
            }
            let mut rx = events.subscribe();
            if client.force_reconnect().await.is_ok() {
                let _ = tokio::time::timeout(RECONNECT_WAIT_BOUND, async {
                    loop {
                        match rx.recv().await {
                            Ok(ConnEvent::Connected) => return,
                            Err(broadcast::error::RecvError::Closed) => return,
                            _ => {}
                        }
                    }
                })
                .await;
            }
            gate.send_replace(false);
        });
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
    if at_ms == i64::MAX {
        return std::future::pending().await;
    }
    let now_ms = crate::journal::epoch_ms() as i64;
    let wait = Duration::from_millis(at_ms.saturating_sub(now_ms).max(0) as u64);
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
    health: HealthHandle,
    journal: Journal,
    retry: Duration,
    /// The generation the source last returned (the live one).
    last: Mutex<Credential>,
    /// When the timer re-reads next (unix ms).
    next_due_ms: Mutex<i64>,
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
    pub health: HealthHandle,
    pub journal: Journal,
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
            health: parts.health,
            journal: parts.journal,
            retry: crate::env::env_ms(ENV_REMINT_RETRY_MS, DEFAULT_REMINT_RETRY),
            last: Mutex::new(live),
            next_due_ms: Mutex::new(due),
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
            Ok(Err(_)) | Err(_) => crate::journal::epoch_ms() as i64,
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

    /// Sleeps until the timer's next re-read is due.
    pub async fn due(&self) {
        sleep_until_ms(&self.next_due_ms).await
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
        self.set_membership_due_ms(
            crate::journal::epoch_ms() as i64 + self.retry.as_millis() as i64,
        );
    }

    fn where_(&self) -> String {
        self.store.locate(&delivery_creds_key(&self.space))
    }

    /// The timer's re-read: one store read; adopts a proved renewal, reports a missed remint.
    pub async fn on_due(&self) -> Reread {
        let outcome = self.reread(false, None).await;
        let now_ms = crate::journal::epoch_ms() as i64;
        let retry_ms = self.retry.as_millis() as i64;
        let retry_s = self.retry.as_millis() as f64 / 1000.0;
        match &outcome {
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

    /// `reloadCreds`' delivery component: `expected` is the fingerprint the caller just wrote.
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
        let raw = match self.store.get(&delivery_creds_key(&self.space)) {
            Ok(Some(raw)) => raw,
            Ok(None) => {
                return Reread::Unusable(format!(
                    "the scoped delivery cred is gone ({where_}) — restore it (locally: re-run `cotal up`) before the current JWT expires"
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
            if (crate::journal::epoch_ms() as i64) < due {
                return Reread::Fresh;
            }
            return Reread::Missed(format!(
                "{where_} still holds the previous cred — the renewal owner has not re-signed it (the manager re-signs + reloads every half-TTL); run `cotal doctor auth --fix`, or restart the mesh's manager, before this JWT expires"
            ));
        }
        if let Err(e) = candidate
            .claims()
            .map_err(|e| e.detail().to_string())
            .and_then(|c| renew_point_secs(&c))
        {
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
        self.reconnect
            .schedule(self.client.clone(), self.events.clone(), from_admin);
        Reread::Adopted(accepted)
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
    /// (`residentSwap: "best-effort"`: the reconnect is not awaited).
    pub async fn reload_membership(&self, expected: Option<&str>) -> Result<Value, String> {
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
                return Ok(json!({"skipped": format!("no membership-rw credential at {where_} (nothing to reload)")}))
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
        let accepted = self.preflight.prove(&candidate).await?;
        let feed = self
            .membership
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let swap = match feed {
            None => "none (the membership feed is not running)",
            Some((cell, client)) => {
                continuity(&cell.get(), &candidate)?;
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
        Ok(json!({
            "ok": true,
            "brokerAccepted": accepted.to_json(),
            "residentSwap": swap,
        }))
    }

    /// The store this daemon reloads from.
    pub fn store(&self) -> &Arc<dyn SecretStore> {
        &self.store
    }
}

/// A renewal keeps the nkey (the inbox grant and the lease holder) and the account.
fn continuity(live: &Credential, candidate: &Credential) -> Result<(), String> {
    let (Ok(a), Ok(b)) = (live.public_key(), candidate.public_key()) else {
        return Err("the candidate credential has no usable nkey".into());
    };
    if a != b {
        return Err(format!(
            "the candidate credential is for nkey {b}, but this daemon runs as {a}; a renewal re-signs the same nkey"
        ));
    }
    let (Ok(ca), Ok(cb)) = (live.claims(), candidate.claims()) else {
        return Err("the candidate JWT claims are unreadable".into());
    };
    if ca.account() != cb.account() {
        return Err(format!(
            "the candidate credential belongs to account {}, but this daemon serves account {}",
            cb.account(),
            ca.account()
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The renewal owner.

/// One file's result of [`remint_daemon_creds`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemintOutcome {
    /// Written atomically; the broker accepted it (with a preflight) or its `iss` matched.
    Written { identity: String, exp: Option<i64> },
    /// Nothing to do (`"no-auth"`: no signer in the store).
    Skipped(String),
    /// Refused; the last good credential is untouched.
    Refused(String),
}

/// The per-file results (the caller must inspect them: a completed call is not a renewal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemintReport {
    pub files: Vec<(String, RemintOutcome)>,
}

impl RemintReport {
    pub fn all_written(&self) -> bool {
        self.files
            .iter()
            .all(|(_, o)| matches!(o, RemintOutcome::Written { .. }))
    }
    pub fn outcome(&self, key_suffix: &str) -> Option<&RemintOutcome> {
        self.files
            .iter()
            .find(|(k, _)| k.ends_with(key_suffix))
            .map(|(_, o)| o)
    }
}

/// The signer's data-account file (`auth/account.<key>.json`).
#[derive(serde::Deserialize)]
struct AccountSigner {
    space: String,
    account_seed: String,
}

/// Re-signs the daemon's standing credentials (`delivery`, `membership-rw`) for `space` with the
/// default standing lifetime. See [`remint_daemon_creds_for`].
pub async fn remint_daemon_creds(
    root: &Path,
    space: &Space,
    store: Option<&dyn SecretStore>,
    preflight: Option<&Preflight>,
) -> RemintReport {
    remint_daemon_creds_for(
        root,
        space,
        store,
        preflight,
        crate::provision::authority::STANDING_TTL,
    )
    .await
}

/// The renewal owner. Reads the signer through the same store it writes (`store`, else the
/// workspace store of `root`); refuses a signer of another space; re-signs each credential's
/// own nkey; with a `preflight` proves each candidate before overwriting the last good one,
/// without one permits the overwrite only when the candidate's `iss` matches the current
/// credential's. Never throws: every file gets an outcome.
pub async fn remint_daemon_creds_for(
    root: &Path,
    space: &Space,
    store: Option<&dyn SecretStore>,
    preflight: Option<&Preflight>,
    lifetime: Duration,
) -> RemintReport {
    let workspace = FsStore::new(root);
    let store: &dyn SecretStore = match store {
        Some(s) => s,
        None => &workspace,
    };
    let keys = [
        (delivery_creds_key(space), Profile::Delivery),
        (membership_rw_creds_key(space), Profile::MembershipRw),
    ];
    let all = |outcome: RemintOutcome| RemintReport {
        files: keys
            .iter()
            .map(|(k, _)| (k.clone(), outcome.clone()))
            .collect(),
    };
    let signer = match store.get(&account_signer_key(space)) {
        Ok(Some(raw)) => raw,
        Ok(None) => return all(RemintOutcome::Skipped("no-auth".into())),
        Err(e) => return all(RemintOutcome::Refused(format!("the signer: {e}"))),
    };
    let signer: AccountSigner = match serde_json::from_str(&signer) {
        Ok(s) => s,
        Err(e) => {
            return all(RemintOutcome::Refused(format!(
                "{} is not a signer account file ({e})",
                store.locate(&account_signer_key(space))
            )))
        }
    };
    if signer.space != space.as_str() {
        return all(RemintOutcome::Refused(format!(
            "the store's signer holds space {:?}, not {:?}; it cannot overwrite this space's credentials",
            signer.space,
            space.as_str()
        )));
    }
    let account = match nkeys::KeyPair::from_seed(&signer.account_seed) {
        Ok(kp) if kp.key_pair_type() == nkeys::KeyPairType::Account => kp,
        _ => {
            return all(RemintOutcome::Refused(
                "the signer's account seed is not an account seed".into(),
            ))
        }
    };
    let names = SpaceNames::new(space);
    let mut files = Vec::new();
    for (key, profile) in keys {
        let outcome =
            remint_one(store, &key, &profile, &account, &names, preflight, lifetime).await;
        files.push((key, outcome));
    }
    RemintReport { files }
}

async fn remint_one(
    store: &dyn SecretStore,
    key: &str,
    profile: &Profile,
    account: &nkeys::KeyPair,
    names: &SpaceNames,
    preflight: Option<&Preflight>,
    lifetime: Duration,
) -> RemintOutcome {
    let where_ = store.locate(key);
    let current = match store.get(key) {
        Ok(Some(raw)) => match Credential::parse(&raw) {
            Ok(c) => Some(c),
            Err(e) => {
                return RemintOutcome::Refused(format!(
                    "{where_} holds no usable credential to re-sign ({})",
                    e.detail()
                ))
            }
        },
        Ok(None) => None,
        Err(e) => return RemintOutcome::Refused(e.to_string()),
    };
    let user = match &current {
        Some(c) => match c.key_pair() {
            Ok(kp) => kp,
            Err(e) => return RemintOutcome::Refused(e.to_string()),
        },
        None => nkeys::KeyPair::new_user(),
    };
    let spec = UserClaimsSpec::new(profile.name())
        .permissions(profile.permissions(names, &user.public_key()))
        .expires_in(Some(lifetime));
    let candidate = match encode_user(account, &user.public_key(), &spec)
        .map_err(|e| e.to_string())
        .and_then(|jwt| {
            let seed = user.seed().map_err(|e| e.to_string())?;
            Credential::new(jwt, seed).map_err(|e| e.to_string())
        }) {
        Ok(c) => c,
        Err(e) => return RemintOutcome::Refused(format!("signing failed: {e}")),
    };
    match preflight {
        Some(p) => {
            if let Err(e) = p.prove(&candidate).await {
                return RemintOutcome::Refused(format!("{e}; {where_} keeps the last good one"));
            }
        }
        None => {
            if let Some(cur) = &current {
                let (Ok(a), Ok(b)) = (cur.claims(), candidate.claims()) else {
                    return RemintOutcome::Refused("unreadable JWT claims".into());
                };
                if a.iss != b.iss {
                    return RemintOutcome::Refused(format!(
                        "offline re-sign refused: the candidate's account signing key (iss {}) is not the current credential's ({}); without a broker preflight only a continuous re-sign may overwrite {where_}",
                        b.iss, a.iss
                    ));
                }
            }
        }
    }
    if let Err(e) = store.put(key, &candidate.to_creds_text()) {
        return RemintOutcome::Refused(format!("writing {where_}: {e}"));
    }
    let acc = BrokerAccepted::of(&candidate);
    RemintOutcome::Written {
        identity: acc.identity,
        exp: acc.exp,
    }
}

/// The admin rail's credential verbs, served by this renewal.
impl crate::rails::admin::CredentialAdmin for Renewal {
    fn settled(&self, bound: Duration) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(self.reconnect.settled(bound))
    }
    fn replied(&self) {
        self.reconnect.replied();
    }
    fn reload_delivery<'a>(
        &'a self,
        expected: Option<&'a str>,
    ) -> futures::future::BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move { self.reload(expected).await.map(|a| a.to_json()) })
    }
    fn reload_membership<'a>(
        &'a self,
        expected: Option<&'a str>,
    ) -> futures::future::BoxFuture<'a, Result<Value, String>> {
        Box::pin(Renewal::reload_membership(self, expected))
    }
    fn store_identity(&self) -> Result<crate::store::StoreIdentity, String> {
        self.store()
            .identity()
            .map_err(|e| format!("delivery: the store identity is unusable: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::{MeshAuthority, MintOptions};
    use crate::store::MemoryStore;

    fn demo() -> Space {
        Space::parse("demo").unwrap()
    }

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
            nats: Value::Null,
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
            nats: Value::Null,
        };
        let e = renew_point_secs(&c).unwrap_err();
        assert!(e.contains("cannot be computed"), "{e}");
        let reversed = JwtClaims {
            iat: i64::MAX,
            exp: Some(i64::MIN),
            ..c
        };
        assert!(renew_point_secs(&reversed).is_err());
    }

    fn signer_store(a: &MeshAuthority, s: &Space) -> (tempfile::TempDir, MemoryStore) {
        let dir = tempfile::tempdir().unwrap();
        a.save(dir.path()).unwrap();
        let store = MemoryStore::new("mem:test");
        let name = format!("account.{}.json", s.key());
        let raw = std::fs::read_to_string(dir.path().join(&name)).unwrap();
        store.put(&format!("auth/{name}"), &raw).unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn no_signer_is_skipped_no_auth() {
        let store = MemoryStore::new("mem:x");
        let r = remint_daemon_creds(Path::new("/nonexistent"), &demo(), Some(&store), None).await;
        assert_eq!(r.files.len(), 2);
        assert!(r
            .files
            .iter()
            .all(|(_, o)| *o == RemintOutcome::Skipped("no-auth".into())));
    }

    #[tokio::test]
    async fn offline_resign_keeps_the_nkey_and_needs_the_same_iss() {
        let mut a = MeshAuthority::new();
        a.add_space(&demo());
        let (_dir, store) = signer_store(&a, &demo());
        let first = a
            .mint(&demo(), &Profile::Delivery, MintOptions::new())
            .unwrap();
        store
            .put(&delivery_creds_key(&demo()), &first.to_creds_text())
            .unwrap();
        let r = remint_daemon_creds_for(
            Path::new("/x"),
            &demo(),
            Some(&store),
            None,
            Duration::from_secs(60),
        )
        .await;
        assert!(r.all_written(), "{r:?}");
        let now =
            Credential::parse(&store.get(&delivery_creds_key(&demo())).unwrap().unwrap()).unwrap();
        assert_eq!(now.public_key().unwrap(), first.public_key().unwrap());
        assert_ne!(now, first);
        // A store whose current credential comes from another account chain: refused offline.
        let mut rogue = MeshAuthority::new();
        rogue.add_space(&demo());
        let foreign = rogue
            .mint(&demo(), &Profile::Delivery, MintOptions::new())
            .unwrap();
        store
            .put(&delivery_creds_key(&demo()), &foreign.to_creds_text())
            .unwrap();
        let r = remint_daemon_creds(Path::new("/x"), &demo(), Some(&store), None).await;
        match r.outcome("delivery.creds") {
            Some(RemintOutcome::Refused(e)) => assert!(e.contains("offline re-sign refused")),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            store.get(&delivery_creds_key(&demo())).unwrap().unwrap(),
            foreign.to_creds_text()
        );
    }

    #[tokio::test]
    async fn a_signer_of_another_space_is_refused() {
        let other = Space::parse("other").unwrap();
        let mut a = MeshAuthority::new();
        a.add_space(&other);
        let (dir, store) = signer_store(&a, &other);
        // The other space's signer file placed under this space's key.
        let raw = std::fs::read_to_string(dir.path().join(format!("account.{}.json", other.key())))
            .unwrap();
        store.put(&account_signer_key(&demo()), &raw).unwrap();
        let r = remint_daemon_creds(Path::new("/x"), &demo(), Some(&store), None).await;
        assert!(r.files.iter().all(|(_, o)| matches!(
            o,
            RemintOutcome::Refused(e) if e.contains("holds space \"other\"")
        )));
    }
}
