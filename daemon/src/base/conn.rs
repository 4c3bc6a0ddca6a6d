//! The daemon's resident broker connection.
//!
//! One connection carries the lease, the rails and the data path, and its events are the only
//! broker watch after start-up (no probe connections while healthy). It always presents the
//! credential the daemon holds *now* (an auth callback reads the shared cell on every
//! (re)connect, so an adopted renewal is what the next redial sends), uses the `_INBOX_<nkey>`
//! reply prefix the `delivery` grant allows (`provision/profiles.rs`), and, when TLS is demanded, refuses a
//! plaintext listener instead of upgrading on the server's greeting.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_nats::{AuthError, ConnectOptions, Event, ServerError};
use tokio::io::AsyncBufReadExt;
use tokio::sync::broadcast;

use super::creds::Credential;

/// Shared cell holding what the next (re)connect presents. Setting it wakes a redial that is
/// waiting for a credential that has not expired (see [`CredentialCell::wait_unexpired`]).
#[derive(Clone, Debug)]
pub struct CredentialCell {
    held: Arc<RwLock<Credential>>,
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

impl CredentialCell {
    pub fn new(p: Credential) -> Self {
        CredentialCell {
            held: Arc::new(RwLock::new(p)),
            generation: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
    pub fn get(&self) -> Credential {
        match self.held.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
    pub fn set(&self, p: Credential) {
        match self.held.write() {
            Ok(mut g) => *g = p,
            Err(poisoned) => *poisoned.into_inner() = p,
        }
        self.generation.send_modify(|g| *g += 1);
    }
    /// A receiver that changes each time a credential is set (an adopted renewal), so a second
    /// connection under the same credential can move onto it.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }
    /// How many wait on this cell now: redials held in [`CredentialCell::wait_unexpired`] plus
    /// the [`CredentialCell::changes`] receivers alive (what a test observes to know a redial
    /// is waiting for a renewal).
    pub fn waiting(&self) -> usize {
        self.generation.receiver_count()
    }
    /// The held credential once it has not expired. A redial must never present an expired JWT:
    /// the broker answers it with an authorization violation, after which the client gives up
    /// reconnecting for good, so no renewal adopted later could bring the connection back. The
    /// wait ends when a credential is set; the handshake's own timeout bounds it (the client then
    /// retries, which is what a redial during an expiry should do).
    pub async fn wait_unexpired(&self) -> Credential {
        self.wait_unexpired_generation().await.1
    }
    /// [`CredentialCell::wait_unexpired`] with the generation it belongs to, or an older one: the
    /// generation is read before the credential, so a credential set in between is counted as
    /// the older generation (a connection that presented it is then moved once more, never
    /// taken for one that presents the latest when it does not).
    pub async fn wait_unexpired_generation(&self) -> (u64, Credential) {
        let mut changes = self.generation.subscribe();
        loop {
            let generation = *changes.borrow_and_update();
            let p = self.get();
            if !credential_expired(&p) {
                return (generation, p);
            }
            if changes.changed().await.is_err() {
                return (generation, p);
            }
        }
    }
    /// The generation of the credential held now: 0 for the first, one more at each
    /// [`CredentialCell::set`].
    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }
}

/// Whether the broker would refuse `p` as expired now (`exp` at or before the current second).
pub fn credential_expired(p: &Credential) -> bool {
    let now_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    matches!(p.claims().ok().and_then(|c| c.exp), Some(exp) if exp <= now_secs)
}

/// How to dial.
#[derive(Debug, Clone)]
pub struct DialSpec {
    pub server: String,
    pub tls_required: bool,
    pub tls_ca: Option<PathBuf>,
    pub name: String,
    pub ping_interval: Duration,
    pub connect_bound: Duration,
    /// Inbox prefix of the connection; `None` is the delivery principal's `_INBOX_<nkey>`.
    pub inbox_prefix: Option<String>,
}

impl DialSpec {
    pub fn new(server: impl Into<String>) -> DialSpec {
        DialSpec {
            server: server.into(),
            tls_required: false,
            tls_ca: None,
            name: "cotal:delivery".into(),
            ping_interval: super::tuning::DEFAULT_PING_INTERVAL,
            connect_bound: super::tuning::BROKER_BOUND,
            inbox_prefix: None,
        }
    }
    pub fn tls(mut self, required: bool, ca: Option<PathBuf>) -> Self {
        self.tls_required = required;
        self.tls_ca = ca;
        self
    }
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    pub fn ping_interval(mut self, every: Duration) -> Self {
        self.ping_interval = every;
        self
    }
    /// Another inbox prefix (a credential whose grants name its own, e.g. the `$SYS` observer).
    pub fn inbox(mut self, prefix: impl Into<String>) -> Self {
        self.inbox_prefix = Some(prefix.into());
        self
    }
}

/// A connection event as the daemon sees it, stamped when it happened.
#[derive(Debug, Clone)]
pub enum ConnEvent {
    Connected,
    Disconnected,
    /// The broker refused the credential as expired.
    CredentialExpired,
    /// The broker denied an operation on a subject.
    PermissionDenied {
        operation: String,
        subject: String,
    },
    Closed,
    Other(String),
}

/// Permission violations seen on the connection (bounded), so an operation that timed out can be
/// told apart from one the broker refused.
#[derive(Clone, Default)]
pub struct Violations {
    seen: Arc<Mutex<Vec<(Instant, String, String)>>>,
    notify: Arc<tokio::sync::Notify>,
}

/// At most this many violations are remembered.
const VIOLATIONS_KEPT: usize = 64;

impl Violations {
    fn record(&self, operation: String, subject: String) {
        if let Ok(mut v) = self.seen.lock() {
            if v.len() >= VIOLATIONS_KEPT {
                v.remove(0);
            }
            v.push((Instant::now(), operation, subject));
        }
        self.notify.notify_waiters();
    }

    /// Resolves with the denied operation once the broker denies one on `subject` at or after
    /// `since`; never resolves otherwise (callers race it against the operation itself).
    pub async fn denied(&self, subject: &str, since: Instant) -> String {
        loop {
            let notified = self.notify.notified();
            if let Some(op) = self.denied_since(subject, since) {
                return op;
            }
            notified.await;
        }
    }
    /// The operation denied on `subject` at or after `since`, if any.
    pub fn denied_since(&self, subject: &str, since: Instant) -> Option<String> {
        let v = self.seen.lock().ok()?;
        v.iter()
            .rev()
            .find(|(at, _, s)| *at >= since && s == subject)
            .map(|(_, op, _)| op.clone())
    }
}

/// Parses the broker's `Permissions Violation for Publish to "subj"` text.
pub fn parse_permission_violation(text: &str) -> Option<(String, String)> {
    let rest = text
        .to_ascii_lowercase()
        .find("permissions violation for ")
        .map(|i| &text[i + "permissions violation for ".len()..])?;
    let (op, tail) = rest.split_once(" to ")?;
    let tail = tail.trim();
    let subject = tail
        .strip_prefix('"')
        .and_then(|t| t.split('"').next())
        .unwrap_or_else(|| tail.split_whitespace().next().unwrap_or(tail));
    let operation = match op.trim().to_ascii_lowercase().as_str() {
        "publish" => "publish",
        "subscription" => "subscribe",
        other => return Some((other.to_string(), subject.to_string())),
    };
    Some((operation.to_string(), subject.to_string()))
}

fn classify(event: &Event) -> ConnEvent {
    match event {
        Event::Connected => ConnEvent::Connected,
        Event::Disconnected => ConnEvent::Disconnected,
        Event::Closed => ConnEvent::Closed,
        Event::ServerError(ServerError::Other(text)) => {
            if text.to_ascii_lowercase().contains("authentication expired") {
                ConnEvent::CredentialExpired
            } else if let Some((operation, subject)) = parse_permission_violation(text) {
                ConnEvent::PermissionDenied { operation, subject }
            } else {
                ConnEvent::Other(event.to_string())
            }
        }
        other => ConnEvent::Other(other.to_string()),
    }
}

/// Why a dial failed: its kind, the text the start-up line quotes (`Display`), and the
/// client's or the socket's error behind it (`source()`).
#[derive(Debug)]
pub struct DialError {
    kind: DialErrorKind,
    detail: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialErrorKind {
    /// Nothing answered (refused, unreachable, timed out).
    Unreachable,
    /// TLS was demanded and the listener offers none.
    PlaintextRefused,
    /// The broker answered and refused the credential or the TLS handshake.
    Refused,
}

impl DialError {
    fn new(kind: DialErrorKind, detail: impl Into<String>) -> DialError {
        DialError {
            kind,
            detail: detail.into(),
            source: None,
        }
    }
    /// The same error, keeping `source` as its cause.
    fn source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> DialError {
        self.source = Some(Box::new(source));
        self
    }
    pub fn kind(&self) -> DialErrorKind {
        self.kind
    }
}

impl fmt::Display for DialError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for DialError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Why [`Resident::close_drained`] could not drain (the connection is retired all the same).
#[derive(Debug)]
pub struct DrainError {
    kind: DrainErrorKind,
    text: String,
    source: Option<async_nats::client::DrainError>,
}

/// What kept a drain from completing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainErrorKind {
    /// The connection is down, so a drain cannot be flushed.
    Down,
    /// The client refused the drain.
    Refused,
    /// The connection's event feed ended before the drain closed it.
    EventsEnded,
    /// The drain did not close the connection within its bound.
    TimedOut,
}

impl DrainError {
    fn new(kind: DrainErrorKind, text: impl Into<String>) -> DrainError {
        DrainError {
            kind,
            text: text.into(),
            source: None,
        }
    }
    pub fn kind(&self) -> DrainErrorKind {
        self.kind
    }
}

impl fmt::Display for DrainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for DrainError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The daemon's resident connection with its event feed.
pub struct Resident {
    pub client: async_nats::Client,
    pub events: broadcast::Sender<ConnEvent>,
    pub violations: Violations,
    pub credential: CredentialCell,
    pub link: Link,
}

/// After [`Link::retire`], the pause before each redial attempt (each attempt is then refused
/// by the auth callback before CONNECT, so a retired connection never comes back).
const RETIRED_REDIAL_PAUSE: Duration = Duration::from_secs(24 * 3600);

/// The resident connection's link state, kept where the client's events arrive: when it last
/// dropped (so a wait for the redial is counted from the drop, not from whoever asks) and
/// whether its owner retired it (so it never reconnects after a close).
#[derive(Clone, Default)]
pub struct Link {
    dropped_at: Arc<Mutex<Option<Instant>>>,
    retired: Arc<std::sync::atomic::AtomicBool>,
    /// The [`CredentialCell`] generation the connection's last (re)connect presented.
    presented: Arc<std::sync::atomic::AtomicU64>,
}

impl Link {
    /// When the connection dropped, while it is down; `None` while it is up.
    pub fn dropped_at(&self) -> Option<Instant> {
        self.dropped_at.lock().ok().and_then(|g| *g)
    }
    fn on_event(&self, ev: &ConnEvent) {
        if let Ok(mut g) = self.dropped_at.lock() {
            match ev {
                ConnEvent::Connected => *g = None,
                ConnEvent::Disconnected | ConnEvent::Closed => {
                    g.get_or_insert_with(Instant::now);
                }
                _ => {}
            }
        }
    }
    /// From now on every redial is refused before it authenticates.
    pub fn retire(&self) {
        self.retired
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
    pub fn is_retired(&self) -> bool {
        self.retired.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// The credential generation the last (re)connect presented (see
    /// [`CredentialCell::wait_unexpired_generation`]): once connected, what the live connection
    /// carries. A connection that presents the latest generation needs no move onto it.
    pub fn presented(&self) -> u64 {
        self.presented.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn present(&self, generation: u64) {
        self.presented
            .store(generation, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Resident {
    /// Closes the connection for good: no redial authenticates after this, and a live
    /// connection is drained (bounded). A connection that is down is not waited for.
    pub async fn close(&self, bound: Duration) {
        let _ = self.close_drained(bound).await;
    }

    /// [`Resident::close`], saying whether the drain completed: the connection is retired
    /// first, whatever the drain then does, so a failed drain never leaves it redialing. A
    /// connection that is down cannot flush a drain (the client would only queue it until a
    /// redial that the retirement refuses): that is a failed drain, reported at once.
    pub async fn close_drained(&self, bound: Duration) -> Result<(), DrainError> {
        use DrainErrorKind as K;
        self.link.retire();
        use async_nats::connection::State;
        if self.client.connection_state() != State::Connected {
            return Err(DrainError::new(
                K::Down,
                "the connection is down, so its drain cannot be flushed",
            ));
        }
        let mut events = self.events.subscribe();
        self.client.drain().await.map_err(|e| DrainError {
            kind: K::Refused,
            text: format!("the drain was refused ({e})"),
            source: Some(e),
        })?;
        let closed = async {
            while let Ok(ev) = events.recv().await {
                if matches!(ev, ConnEvent::Closed) {
                    return true;
                }
            }
            false
        };
        match tokio::time::timeout(bound, closed).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(DrainError::new(
                K::EventsEnded,
                "its event feed ended before the drain closed it",
            )),
            Err(_) => Err(DrainError::new(
                K::TimedOut,
                format!("the drain did not close it within {} ms", bound.as_millis()),
            )),
        }
    }
}

/// The user public key (`U…`) of a seed; an unusable seed is a refused dial.
fn user_public_key(seed: &str) -> Result<String, DialError> {
    nkeys::KeyPair::from_seed(seed)
        .map(|kp| kp.public_key())
        .map_err(|e| {
            DialError::new(
                DialErrorKind::Refused,
                format!("the credential's nkey seed is unusable: {e}"),
            )
            .source(e)
        })
}

/// Reads the listener's INFO greeting and refuses when TLS is demanded but not offered, so the
/// refusal names the cause instead of a failed handshake. Bounded by `spec.connect_bound`.
pub async fn check_listener_offers_tls(spec: &DialSpec) -> Result<(), DialError> {
    let hostport = host_port(&spec.server);
    let probe = async {
        let stream = tokio::net::TcpStream::connect(&hostport).await?;
        let mut reader = tokio::io::BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).await?;
        Ok::<String, std::io::Error>(line)
    };
    let line = match tokio::time::timeout(spec.connect_bound, probe).await {
        Ok(Ok(line)) => line,
        Ok(Err(e)) => {
            return Err(DialError::new(DialErrorKind::Unreachable, e.to_string()).source(e))
        }
        Err(_) => {
            return Err(DialError::new(
                DialErrorKind::Unreachable,
                format!("no greeting within {} ms", spec.connect_bound.as_millis()),
            ))
        }
    };
    let info: serde_json::Value = line
        .strip_prefix("INFO ")
        .and_then(|j| serde_json::from_str(j.trim()).ok())
        .unwrap_or_default();
    let offers = info["tls_required"].as_bool().unwrap_or(false)
        || info["tls_available"].as_bool().unwrap_or(false);
    if offers {
        Ok(())
    } else {
        Err(DialError::new(
            DialErrorKind::PlaintextRefused,
            format!(
                "TLS is required but the listener at {} offers none (its greeting has no tls_required); refusing a plaintext connection",
                spec.server
            ),
        ))
    }
}

fn host_port(server: &str) -> String {
    let rest = server.split_once("://").map(|(_, r)| r).unwrap_or(server);
    let rest = rest.rsplit_once('@').map(|(_, r)| r).unwrap_or(rest);
    let rest = rest.trim_end_matches('/');
    if rest.contains(':') {
        rest.to_string()
    } else {
        format!("{rest}:4222")
    }
}

/// Dials the resident connection. The first connect is the start-up reachability check: it
/// must succeed within `spec.connect_bound`; afterwards the client redials unattended.
pub async fn dial(spec: &DialSpec, credential: CredentialCell) -> Result<Resident, DialError> {
    if spec.tls_required {
        check_listener_offers_tls(spec).await?;
    }
    let nkey = user_public_key(&credential.get().seed)?;
    if credential_expired(&credential.get()) {
        return Err(DialError::new(
            DialErrorKind::Refused,
            "the credential has expired; renew it before starting the daemon",
        ));
    }
    let (events, _) = broadcast::channel(256);
    let violations = Violations::default();
    let cell = credential.clone();
    let link = Link::default();
    let retired = link.clone();
    let pause = link.clone();
    let mut options = ConnectOptions::with_auth_callback(move |nonce: Vec<u8>| {
        let cell = cell.clone();
        let retired = retired.clone();
        async move {
            if retired.is_retired() {
                return Err(AuthError::new("this connection was closed by its owner"));
            }
            let (generation, p) = cell.wait_unexpired_generation().await;
            // Retired while it waited for an unexpired credential: still never comes back.
            if retired.is_retired() {
                return Err(AuthError::new("this connection was closed by its owner"));
            }
            retired.present(generation);
            let kp = nkeys::KeyPair::from_seed(&p.seed).map_err(AuthError::new)?;
            let sig = kp.sign(&nonce).map_err(AuthError::new)?;
            let mut auth = async_nats::Auth::new();
            auth.jwt = Some(p.jwt);
            auth.signature = Some(sig);
            Ok(auth)
        }
    })
    .custom_inbox_prefix(
        spec.inbox_prefix
            .clone()
            .unwrap_or_else(|| format!("_INBOX_{nkey}")),
    )
    .name(spec.name.clone())
    .ping_interval(spec.ping_interval)
    .connection_timeout(spec.connect_bound)
    .max_reconnects(None)
    .reconnect_delay_callback(move |attempts| {
        if pause.is_retired() {
            return RETIRED_REDIAL_PAUSE;
        }
        // the client's own default: 0, then 2^(n-1) ms, at most 4 s.
        let exp = u32::try_from(attempts.saturating_sub(1)).unwrap_or(u32::MAX);
        if attempts <= 1 {
            Duration::ZERO
        } else {
            Duration::from_millis(2_u64.saturating_pow(exp)).min(Duration::from_secs(4))
        }
    });
    if spec.tls_required {
        options = options.require_tls(true);
    }
    if let Some(ca) = &spec.tls_ca {
        options = options.add_root_certificates(ca.clone());
    }
    let tx = events.clone();
    let seen = violations.clone();
    let stamp = link.clone();
    options = options.event_callback(move |event| {
        let tx = tx.clone();
        let seen = seen.clone();
        let stamp = stamp.clone();
        async move {
            let ev = classify(&event);
            stamp.on_event(&ev);
            if let ConnEvent::PermissionDenied { operation, subject } = &ev {
                seen.record(operation.clone(), subject.clone());
            }
            let _ = tx.send(ev);
        }
    });
    let connect = options.connect(spec.server.as_str());
    match tokio::time::timeout(spec.connect_bound + Duration::from_secs(1), connect).await {
        Ok(Ok(client)) => Ok(Resident {
            client,
            events,
            violations,
            credential,
            link,
        }),
        Ok(Err(e)) => {
            let text = e.to_string();
            let kind = match e.kind() {
                async_nats::ConnectErrorKind::AuthorizationViolation
                | async_nats::ConnectErrorKind::Authentication
                | async_nats::ConnectErrorKind::Tls => DialErrorKind::Refused,
                _ => DialErrorKind::Unreachable,
            };
            Err(DialError::new(kind, text).source(e))
        }
        Err(_) => Err(DialError::new(
            DialErrorKind::Unreachable,
            format!("no connection within {} ms", spec.connect_bound.as_millis()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_violations_are_parsed() {
        assert_eq!(
            parse_permission_violation(
                "Permissions Violation for Publish to \"$KV.cotal_delivery_x.lease.0\""
            ),
            Some(("publish".into(), "$KV.cotal_delivery_x.lease.0".into()))
        );
        assert_eq!(
            parse_permission_violation("Permissions Violation for Subscription to \"a.>\""),
            Some(("subscribe".into(), "a.>".into()))
        );
        assert_eq!(parse_permission_violation("Stale Connection"), None);
    }

    #[test]
    fn host_port_strips_scheme_and_defaults_the_port() {
        assert_eq!(host_port("nats://127.0.0.1:4222"), "127.0.0.1:4222");
        assert_eq!(host_port("tls://localhost:1"), "localhost:1");
        assert_eq!(host_port("localhost"), "localhost:4222");
    }
}
