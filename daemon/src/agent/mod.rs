//! The agent side of Plane-3, as a library client (used by the harness, the demo and Rust
//! integrators).
//!
//! An [`Agent`] is one principal in one lifecycle, connected with its own `agent` credential
//! and the inbox prefix `_INBOX_<its nkey>`. It posts through JetStream (`Nats-Msg-Id` = the
//! message id, none for an id-less post), joins channels live (a broker-enforced core
//! subscription) and asks the daemon for the durable backstop over `ctl.delivery`. A join whose
//! backstop cannot be established is reported as [`Backstop::Unestablished`] ("joined live with
//! the durable backstop unestablished"), never as durable and never silently. Its [`Delivery`]
//! binds the pre-created `dlv_<o>-<a>-<uid>` durable even when no delivery lease is ready
//! (with a warning naming the durable, space and condition), surfaces each frame, acks it only
//! after surfacing, and terminates anything without the `Cotal-Delivery-Frame` header.
//!
//! A control request whose connection closes before the answer is rejected at once and never
//! re-sent: the client opens no reconnect for it.

mod anycast;
mod liveness;

pub use anycast::{TakeVerdict, NO_DAEMON, PREDATES_FIX};
pub use liveness::{Probe, ProbeWhy};

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, AckKind};
use async_nats::HeaderMap;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::base::{epoch_ms, Credential, Read, Rows};
use crate::wire::ControlReply;
use crate::wire::LeaseInfo;
use crate::wire::{
    inbox_prefix, CtlService, LifecycleUid, Principal, Space, SpaceNames, DELIVERY_FRAME_HEADER,
    LEASE_KEY,
};

/// What a request answered by the broker's no-responders status says: no daemon subscribed to
/// the rail when it was published, so none received it (it certainly did not run).
pub const NO_DAEMON_SERVING: &str = "no delivery daemon is serving the rail";

/// Client timeout of `durableJoin` (activation may run first): the wire's, which the daemon's
/// catch-up is bounded by.
pub use crate::wire::JOIN_TIMEOUT;
/// Client timeout of the other verbs (the reference's 5 s list timeout). Its own bound, not
/// [`BROKER_BOUND`]: it waits for the daemon's work, not only the broker's answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on a publish being acknowledged and on other single broker round trips.
pub const BROKER_BOUND: Duration = crate::base::BROKER_BOUND;

/// What went wrong on the agent side. `kind()` lets a caller decide.
#[derive(Debug, Clone)]
pub struct AgentError {
    kind: AgentErrorKind,
    detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentErrorKind {
    /// Connecting failed.
    Connect,
    /// The daemon answered with a refusal (`detail` is its text).
    Refused,
    /// No answer within the client timeout.
    TimedOut,
    /// No daemon is serving the rail, or no stream took a post (the broker's no-responders
    /// answer: nothing was stored, so the same post may be sent again).
    NoResponders,
    /// The connection closed while the request was pending: rejected, not replayed.
    ConnectionClosed,
    /// The broker refused a publish, subscribe or consumer operation.
    Broker,
    /// An answer or frame that does not parse.
    Malformed,
}

impl AgentError {
    fn new(kind: AgentErrorKind, detail: impl Into<String>) -> AgentError {
        AgentError {
            kind,
            detail: detail.into(),
        }
    }
    pub fn kind(&self) -> AgentErrorKind {
        self.kind
    }
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for AgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for AgentError {}

/// Who the agent is and where it connects.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    pub server_url: String,
    pub tls_ca: Option<PathBuf>,
    pub credential: Credential,
    pub space: Space,
    pub principal: Principal,
    pub lifecycle_uid: LifecycleUid,
    /// `card.name` (what mentions resolve).
    pub name: String,
}

impl AgentSpec {
    /// The agent `material` provisioned, connecting to `server_url`, named `name`.
    pub fn of_material(
        server_url: impl Into<String>,
        tls_ca: Option<PathBuf>,
        material: &crate::provision::AgentMaterial,
        name: &str,
    ) -> AgentSpec {
        AgentSpec {
            server_url: server_url.into(),
            tls_ca,
            credential: material.credential.clone(),
            space: material.space.clone(),
            principal: material.principal.clone(),
            lifecycle_uid: material.lifecycle_uid.clone(),
            name: name.to_string(),
        }
    }
}

/// Warnings the client surfaced (also sent to `tracing`).
#[derive(Clone, Default, Debug)]
pub struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    fn push(&self, line: String) {
        tracing::warn!("{line}");
        if let Ok(mut w) = self.0.lock() {
            w.push(line);
        }
    }
    pub fn all(&self) -> Vec<String> {
        self.0.lock().map(|w| w.clone()).unwrap_or_default()
    }
}

/// One connected agent.
pub struct Agent {
    client: async_nats::Client,
    js: jetstream::Context,
    names: SpaceNames,
    spec: AgentSpec,
    /// Bumped on every disconnect or close: a pending request compares it.
    connection_losses: watch::Receiver<u64>,
    /// Server errors (permission violations) seen on the connection.
    server_errors: Arc<Mutex<Vec<String>>>,
    warnings: Warnings,
}

/// The durable side of a join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backstop {
    /// `joined durable`: the daemon recorded the membership.
    Durable { generation: u64 },
    /// "joined live with the durable backstop unestablished": the live subscription is active
    /// and the shortfall is this exceptional state, with the reason.
    Unestablished { reason: String },
}

/// A join: the live subscription plus the state of the backstop.
pub struct Joined {
    pub channel: String,
    pub live: async_nats::Subscriber,
    pub backstop: Backstop,
}

impl Agent {
    /// Connects as `spec` (inbox prefix `_INBOX_<nkey>`, TLS with the CA when given).
    pub async fn connect(spec: AgentSpec) -> Result<Agent, AgentError> {
        let nkey = spec
            .credential
            .public_key()
            .map_err(|e| AgentError::new(AgentErrorKind::Connect, e.to_string()))?;
        let client_name = format!("agent {}", spec.principal);
        let options = crate::base::standing_credential_options(
            &spec.credential,
            spec.tls_ca.as_deref(),
            &client_name,
            &inbox_prefix(&nkey),
            BROKER_BOUND,
        )
        .map_err(|e| AgentError::new(AgentErrorKind::Connect, e.to_string()))?;
        let (loss_tx, connection_losses) = watch::channel(0u64);
        let server_errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let errors = server_errors.clone();
        let options = options.event_callback(move |event| {
            let loss_tx = loss_tx.clone();
            let errors = errors.clone();
            async move {
                match event {
                    async_nats::Event::Disconnected | async_nats::Event::Closed => {
                        loss_tx.send_modify(|n| *n += 1);
                    }
                    async_nats::Event::ServerError(e) => {
                        if let Ok(mut v) = errors.lock() {
                            v.push(e.to_string());
                        }
                    }
                    _ => {}
                }
            }
        });
        let client =
            crate::base::connect_options(options, &spec.server_url, &client_name, BROKER_BOUND)
                .await
                .map_err(|e| AgentError::new(AgentErrorKind::Connect, e.to_string()))?;
        let js = jetstream::context::ContextBuilder::new()
            .timeout(BROKER_BOUND)
            .build(client.clone());
        Ok(Agent {
            client,
            js,
            names: SpaceNames::new(&spec.space),
            spec,
            connection_losses,
            server_errors,
            warnings: Warnings::default(),
        })
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }
    pub fn principal(&self) -> &Principal {
        &self.spec.principal
    }
    pub fn lifecycle_uid(&self) -> &LifecycleUid {
        &self.spec.lifecycle_uid
    }
    pub fn names(&self) -> &SpaceNames {
        &self.names
    }
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.all()
    }

    /// A `CotalMessage` for `channel` from this agent (fresh id unless `id` is given).
    pub fn message(&self, channel: &str, text: &str, id: Option<&str>) -> Value {
        let id = id
            .map(str::to_string)
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
        json!({
            "id": id,
            "ts": epoch_ms(),
            "space": self.spec.space.as_str(),
            "from": {"id": self.spec.principal.dot_form(), "name": self.spec.name},
            "channel": channel,
            "parts": [{"kind": "text", "text": text}],
        })
    }

    /// Posts `msg` on `channel` through JetStream; returns the CHAT sequence.
    pub async fn post(&self, channel: &str, msg: &Value) -> Result<u64, AgentError> {
        let subject = self.names.chat_subject(&self.spec.principal, channel);
        let mut headers = HeaderMap::new();
        let id = crate::wire::message_id(msg);
        if !id.is_empty() {
            headers.insert("Nats-Msg-Id", id);
        }
        let body = serde_json::to_vec(msg)
            .map_err(|e| AgentError::new(AgentErrorKind::Malformed, e.to_string()))?;
        let broker = |e: &dyn std::error::Error| {
            AgentError::new(AgentErrorKind::Broker, format!("post on {subject}: {e}"))
        };
        let work = async {
            let ack = self
                .js
                .publish_with_headers(subject.clone(), headers, body.into())
                .await
                .map_err(|e| broker(&e))?;
            ack.await.map_err(|e| {
                if e.kind() == async_nats::jetstream::context::PublishErrorKind::StreamNotFound {
                    AgentError::new(
                        AgentErrorKind::NoResponders,
                        format!("post on {subject}: {e}"),
                    )
                } else {
                    broker(&e)
                }
            })
        };
        match tokio::time::timeout(BROKER_BOUND, work).await {
            Ok(Ok(ack)) => Ok(ack.sequence),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(AgentError::new(
                AgentErrorKind::TimedOut,
                format!(
                    "post on {subject}: no ack within {} ms",
                    BROKER_BOUND.as_millis()
                ),
            )),
        }
    }

    /// Writes this instance's presence row (`card.name` is what mentions resolve).
    pub async fn announce(&self, status: &str) -> Result<(), AgentError> {
        let me = self.spec.principal.dot_form();
        let body = json!({
            "card": {"id": me, "name": self.spec.name, "kind": "agent", "protocolVersion": "0.5"},
            "status": status,
            "lifecycleUid": self.spec.lifecycle_uid.as_str(),
            "ts": epoch_ms(),
        });
        let subject = format!("$KV.{}.{me}", self.names.presence_bucket());
        let broker = |e: &dyn std::error::Error| {
            AgentError::new(AgentErrorKind::Broker, format!("presence {subject}: {e}"))
        };
        let work = async {
            let ack = self
                .js
                .publish(subject.clone(), body.to_string().into())
                .await
                .map_err(|e| broker(&e))?;
            ack.await.map_err(|e| broker(&e))
        };
        match tokio::time::timeout(BROKER_BOUND, work).await {
            Ok(r) => r.map(|_| ()),
            Err(_) => Err(AgentError::new(
                AgentErrorKind::TimedOut,
                format!("presence {subject}: no ack"),
            )),
        }
    }

    /// One `ctl.delivery` request: reply on `<request>.reply.<uuid>`, answered within
    /// `timeout`. A connection that closes while it is pending rejects it; it is never re-sent.
    pub async fn request(
        &self,
        op: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<Value, AgentError> {
        self.request_on(CtlService::Delivery, op, args, timeout)
            .await
    }

    /// [`Agent::request`] on any rail the agent may call (`ctl.delivery`, its take subject).
    pub(crate) async fn request_on(
        &self,
        service: CtlService,
        op: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<Value, AgentError> {
        let subject = self.names.ctl_subject(service, &self.spec.principal);
        let reply = format!("{subject}.reply.{}", uuid::Uuid::new_v4().simple());
        let body = json!({
            "op": op,
            "args": args,
            "from": {"id": self.spec.principal.dot_form(), "name": self.spec.name, "kind": "agent"},
        });
        self.request_raw(&subject, &reply, body.to_string().into_bytes(), timeout)
            .await
    }

    /// [`Agent::request`] with an explicit reply subject and body (for tests of the rail's
    /// guards: a forged reply target, a malformed body).
    pub async fn request_raw(
        &self,
        subject: &str,
        reply: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Value, AgentError> {
        let msg = self.exchange(subject, reply, body, timeout).await?;
        let reply: ControlReply = serde_json::from_slice(&msg.payload).map_err(|e| {
            AgentError::new(
                AgentErrorKind::Malformed,
                format!("{subject}: unreadable reply: {e}"),
            )
        })?;
        if reply.ok {
            Ok(reply.data.unwrap_or(Value::Null))
        } else {
            Err(AgentError::new(
                AgentErrorKind::Refused,
                reply
                    .error
                    .unwrap_or_else(|| "refused without a reason".into()),
            ))
        }
    }

    /// One request/reply exchange on `reply`: a connection that closes while it is pending
    /// rejects it (never re-sent); a broker no-responders answer is its own error kind.
    pub(crate) async fn exchange(
        &self,
        subject: &str,
        reply: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<async_nats::Message, AgentError> {
        let closed = || {
            AgentError::new(
                AgentErrorKind::ConnectionClosed,
                format!("{subject}: the connection closed while the request was pending; it is rejected, not replayed"),
            )
        };
        let mut losses = self.connection_losses.clone();
        losses.mark_unchanged();
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return Err(closed());
        }
        let mut sub = self
            .client
            .subscribe(reply.to_string())
            .await
            .map_err(|e| AgentError::new(AgentErrorKind::Broker, e.to_string()))?;
        self.client
            .publish_with_reply(subject.to_string(), reply.to_string(), body.into())
            .await
            .map_err(|e| AgentError::new(AgentErrorKind::Broker, e.to_string()))?;
        let answer = tokio::select! {
            m = sub.next() => m,
            _ = losses.changed() => return Err(closed()),
            _ = tokio::time::sleep(timeout) => {
                return Err(AgentError::new(
                    AgentErrorKind::TimedOut,
                    format!("{subject}: no answer within {} ms", timeout.as_millis()),
                ))
            }
        };
        let _ = sub.unsubscribe().await;
        let Some(msg) = answer else {
            return Err(closed());
        };
        if msg.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            return Err(AgentError::new(
                AgentErrorKind::NoResponders,
                format!("{subject}: {NO_DAEMON_SERVING}"),
            ));
        }
        Ok(msg)
    }

    /// How many server errors (permission violations) the connection has seen so far.
    pub(crate) fn server_errors_seen(&self) -> usize {
        self.server_errors.lock().map(|v| v.len()).unwrap_or(0)
    }

    /// Returns once a server error naming `subject` arrives after the first `before` errors
    /// (a broker denial of a publish or subscribe); never on its own, so the caller bounds it.
    pub(crate) async fn denied(&self, before: usize, subject: &str) {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tick.tick().await;
            if self.denied_since(before, subject) {
                return;
            }
        }
    }

    /// Whether a server error naming `subject` arrived after the first `before` errors.
    pub(crate) fn denied_since(&self, before: usize, subject: &str) -> bool {
        self.server_errors
            .lock()
            .map(|v| v[before.min(v.len())..].iter().any(|e| e.contains(subject)))
            .unwrap_or(false)
    }

    /// Joins `channel`: a broker-confirmed live subscription, then the durable backstop.
    pub async fn durable_join(&self, channel: &str) -> Result<Joined, AgentError> {
        self.durable_join_within(channel, JOIN_TIMEOUT).await
    }

    /// [`Agent::durable_join`] with an explicit wait for the daemon's answer.
    pub async fn durable_join_within(
        &self,
        channel: &str,
        timeout: Duration,
    ) -> Result<Joined, AgentError> {
        let subject = self.names.chat_read_subject(channel);
        let errors_before = self.server_errors_seen();
        let live = self
            .client
            .subscribe(subject.clone())
            .await
            .map_err(|e| AgentError::new(AgentErrorKind::Broker, e.to_string()))?;
        // The broker answers a refused subscribe before the flush's PONG.
        tokio::time::timeout(BROKER_BOUND, self.client.flush())
            .await
            .map_err(|_| AgentError::new(AgentErrorKind::TimedOut, "flush after subscribe"))?
            .map_err(|e| AgentError::new(AgentErrorKind::Broker, e.to_string()))?;
        if self.denied_since(errors_before, &subject) {
            return Err(AgentError::new(
                AgentErrorKind::Broker,
                format!("the broker refused the live subscription {subject}"),
            ));
        }
        let args = json!({"channel": channel, "lifecycleUid": self.spec.lifecycle_uid.as_str()});
        let backstop = match self.request("durableJoin", args, timeout).await {
            Ok(data) if data.get("durable").and_then(Value::as_bool) == Some(true) => {
                match data.get("generation").and_then(Value::as_u64) {
                    Some(generation) => Backstop::Durable { generation },
                    None => Backstop::Unestablished {
                        reason: "the daemon's answer carries no generation".into(),
                    },
                }
            }
            Ok(data) => Backstop::Unestablished {
                reason: data
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("the daemon did not establish the membership")
                    .to_string(),
            },
            Err(e) => Backstop::Unestablished {
                reason: e.detail().to_string(),
            },
        };
        // The join is atomic across the broker-confirmed live subscribe and the membership
        // write. `flush()` only writes the socket, but the daemon's reply travelled the same
        // connection after the SUB, so a refusal of the SUB has arrived by now: a late refusal
        // takes the membership back and fails the join.
        if self.denied_since(errors_before, &subject) {
            let undone = match &backstop {
                Backstop::Durable { generation } => {
                    match self.durable_leave(channel, *generation).await {
                        Ok(_) => format!("the membership (generation {generation}) was removed"),
                        Err(e) => format!(
                            "removing the membership (generation {generation}) failed: {}",
                            e.detail()
                        ),
                    }
                }
                Backstop::Unestablished { .. } => "no membership was written".to_string(),
            };
            return Err(AgentError::new(
                AgentErrorKind::Broker,
                format!("the broker refused the live subscription {subject}; {undone}"),
            ));
        }
        if let Backstop::Unestablished { reason } = &backstop {
            self.warnings.push(format!(
                "! delivery: {} joined \"{channel}\" live with the durable backstop unestablished ({reason})",
                self.spec.principal
            ));
        }
        Ok(Joined {
            channel: channel.to_string(),
            live,
            backstop,
        })
    }

    /// `durableLeave {channel, generation, lifecycleUid}`.
    pub async fn durable_leave(&self, channel: &str, generation: u64) -> Result<Value, AgentError> {
        self.request(
            "durableLeave",
            json!({"channel": channel, "generation": generation, "lifecycleUid": self.spec.lifecycle_uid.as_str()}),
            REQUEST_TIMEOUT,
        )
        .await
    }

    /// `listMemberships {lifecycleUid}`.
    pub async fn list_memberships(&self) -> Result<Value, AgentError> {
        self.request(
            "listMemberships",
            json!({"lifecycleUid": self.spec.lifecycle_uid.as_str()}),
            REQUEST_TIMEOUT,
        )
        .await
    }

    /// Binds this lifecycle's `dlv_` durable. A missing or not-ready delivery lease does not
    /// stop the bind (a daemon that starts later delivers through it); it is a warning naming
    /// the durable, the space and the condition.
    pub async fn bind_delivery(&self) -> Result<Delivery, AgentError> {
        let durable = SpaceNames::dlv_durable(&self.spec.principal, &self.spec.lifecycle_uid);
        if let Some(condition) = self.lease_condition().await {
            self.warnings.push(format!(
                "! delivery: binding {durable} in space {} while {condition}; a daemon that starts later delivers through it. If another plane serves space {}, reconnect against it to re-bind the durable there.",
                self.spec.space, self.spec.space
            ));
        }
        let stream = self
            .js
            .get_stream_no_info(self.names.dlv_stream())
            .await
            .map_err(|e| AgentError::new(AgentErrorKind::Broker, e.to_string()))?;
        let consumer: jetstream::consumer::Consumer<pull::Config> =
            tokio::time::timeout(BROKER_BOUND, stream.get_consumer(&durable))
                .await
                .map_err(|_| {
                    AgentError::new(
                        AgentErrorKind::TimedOut,
                        format!("bind {durable}: no answer"),
                    )
                })?
                .map_err(|e| {
                    AgentError::new(AgentErrorKind::Broker, format!("bind {durable}: {e}"))
                })?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| AgentError::new(AgentErrorKind::Broker, format!("bind {durable}: {e}")))?;
        Ok(Delivery {
            durable,
            messages,
            terminated: 0,
        })
    }

    /// `None` when a ready lease is on record; otherwise the condition, in words.
    async fn lease_condition(&self) -> Option<String> {
        let rows = match Rows::open(&self.js, &self.names.delivery_bucket(), BROKER_BOUND).await {
            Ok(r) => r,
            Err(e) => return Some(format!("the delivery lease is unreadable ({e})")),
        };
        match rows.read(LEASE_KEY).await {
            Ok(Read::Absent { .. }) => {
                Some("no delivery lease exists (no delivery daemon holds it)".into())
            }
            Ok(Read::Present(row)) => match serde_json::from_slice::<LeaseInfo>(&row.value) {
                Ok(info) if info.ready => None,
                Ok(info) => Some(format!(
                    "the delivery lease is not ready (held by {})",
                    info.holder
                )),
                Err(e) => Some(format!("the delivery lease row does not parse ({e})")),
            },
            Err(e) => Some(format!("the delivery lease is unreadable ({e})")),
        }
    }
}

/// A surfaced frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub channel: String,
    pub msg: Value,
    /// `DLV_<s>` stream sequence of the frame.
    pub dlv_sequence: u64,
    /// When the broker stored the frame (its stamp of the `DLV_<s>` message): the moment of
    /// the hand-off, as the broker saw it. `None` when the delivery carried no metadata.
    pub handed_off: Option<std::time::SystemTime>,
}

/// The bound `dlv_` durable.
pub struct Delivery {
    durable: String,
    messages: pull::Stream,
    terminated: u64,
}

impl Delivery {
    pub fn durable(&self) -> &str {
        &self.durable
    }
    /// Frames terminated because they lacked the header or did not parse.
    pub fn terminated(&self) -> u64 {
        self.terminated
    }

    /// Waits up to `bound` for the next frame, hands it to `surface`, then acks it (so a crash
    /// before surfacing redelivers it). `Ok(None)` when nothing arrived in time.
    pub async fn surface<F>(
        &mut self,
        bound: Duration,
        surface: F,
    ) -> Result<Option<Frame>, AgentError>
    where
        F: FnOnce(&Frame),
    {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let next = match tokio::time::timeout_at(deadline, self.messages.next()).await {
                Err(_) => return Ok(None),
                Ok(None) => {
                    return Err(AgentError::new(
                        AgentErrorKind::ConnectionClosed,
                        format!("{}: the pull stream ended", self.durable),
                    ))
                }
                Ok(Some(Err(e))) => {
                    tracing::debug!(error = %e, "dlv pull stream event");
                    continue;
                }
                Ok(Some(Ok(m))) => m,
            };
            let has_header = next
                .headers
                .as_ref()
                .and_then(|h| h.get(DELIVERY_FRAME_HEADER))
                .map(|v| v.as_str() == "1")
                .unwrap_or(false);
            let frame = if has_header {
                serde_json::from_slice::<crate::wire::Plane3DeliveryFrame>(&next.payload).ok()
            } else {
                None
            };
            let Some(frame) = frame else {
                self.terminated += 1;
                let _ = next.ack_with(AckKind::Term).await;
                continue;
            };
            let info = next.info().ok();
            let surfaced = Frame {
                channel: frame.channel,
                msg: frame.msg,
                dlv_sequence: info.as_ref().map(|i| i.stream_sequence).unwrap_or(0),
                handed_off: info.map(|i| std::time::SystemTime::from(i.published)),
            };
            surface(&surfaced);
            next.double_ack()
                .await
                .map_err(|e| AgentError::new(AgentErrorKind::Broker, format!("ack: {e}")))?;
            return Ok(Some(surfaced));
        }
    }
}
