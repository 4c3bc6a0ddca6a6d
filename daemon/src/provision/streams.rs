//! A space's JetStream topology: streams, KV buckets and the per-agent `dlv_` durable.
//!
//! Names and configs are the reference's (docs/data-path.md lists them). Every
//! operation is idempotent so that a half-finished run leaves nothing a second run trips over:
//! a missing stream is created; an existing one with the same managed fields is accepted; one
//! that differs only in fields the broker can change in place (limits, ages, windows, direct
//! get, replicas, subjects, the lease bucket's expiry markers) is updated; one that differs in a field that cannot change safely
//! (retention, storage, deny-delete/purge, turning schedules off) is refused, naming the stream,
//! the field and both values. KV buckets are created as their backing streams with the exact
//! config async-nats's `create_key_value` would produce, so one comparison path covers both.

use std::fmt;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::context::{
    ConsumerInfoErrorKind, CreateStreamErrorKind, GetStreamErrorKind,
};
use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType};
use async_nats::jetstream::Context;
use async_nats::jetstream::ErrorCode;

use crate::wire::{LifecycleUid, Principal, Role, SpaceNames};

/// Reference lease TTL, applied as the lease bucket's `max_age`.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// Reference presence TTL (liveness window), the presence bucket's `max_age`.
pub const DEFAULT_PRESENCE_TTL: Duration = Duration::from_secs(6);
/// Per-subject retention of `INBOX_`/`DLV_`: the bound of the at-least-once guarantee (docs/data-path.md).
pub const DEFAULT_BACKSTOP_MAX_MSGS_PER_SUBJECT: i64 = 1000;
/// Per-subject retention of `CHAT_`.
pub const DEFAULT_CHAT_MAX_MSGS_PER_SUBJECT: i64 = 1000;
/// Dedup horizon of `INBOX_`/`DLV_` (the cross-path exactly-once window).
pub const BACKSTOP_DUPLICATE_WINDOW: Duration = Duration::from_secs(2 * 3600);
/// `EPT_REQ_` retention: at least the timer writer's recovery lag.
pub const EPT_REQ_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// `EPT_` retention: at least the longest deadline plus margin.
pub const EPT_MAX_AGE: Duration = Duration::from_secs(31 * 24 * 3600);
/// Membership feed size bound.
pub const MEMBERSHIP_MAX_BYTES: i64 = 64 * 1024 * 1024;
/// The broker's default duplicate window.
const SERVER_DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// The agent handoff durable's ack wait.
pub const AGENT_CONSUMER_ACK_WAIT: Duration = Duration::from_secs(60);

/// Tunables of provisioning. Tests shrink windows here; production keeps the defaults.
#[derive(Debug, Clone)]
pub struct ProvisionOptions {
    lease_ttl: Duration,
    presence_ttl: Duration,
    backstop_max_msgs_per_subject: i64,
    chat_max_msgs_per_subject: i64,
    replicas: usize,
    request_timeout: Duration,
    connect_timeout: Duration,
}

impl Default for ProvisionOptions {
    fn default() -> Self {
        ProvisionOptions {
            lease_ttl: DEFAULT_LEASE_TTL,
            presence_ttl: DEFAULT_PRESENCE_TTL,
            backstop_max_msgs_per_subject: DEFAULT_BACKSTOP_MAX_MSGS_PER_SUBJECT,
            chat_max_msgs_per_subject: DEFAULT_CHAT_MAX_MSGS_PER_SUBJECT,
            replicas: 1,
            request_timeout: Duration::from_secs(10),
            connect_timeout: crate::base::BROKER_BOUND,
        }
    }
}

impl ProvisionOptions {
    pub fn new() -> ProvisionOptions {
        ProvisionOptions::default()
    }
    /// Lease bucket `max_age` (the delivery lease TTL). Minimum 1 s.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl.max(Duration::from_secs(1));
        self
    }
    /// Presence bucket `max_age`. Minimum 1 s.
    pub fn presence_ttl(mut self, ttl: Duration) -> Self {
        self.presence_ttl = ttl.max(Duration::from_secs(1));
        self
    }
    /// `max_msgs_per_subject` of `INBOX_`/`DLV_` (at least 1).
    pub fn backstop_max_msgs_per_subject(mut self, n: i64) -> Self {
        self.backstop_max_msgs_per_subject = n.max(1);
        self
    }
    /// `max_msgs_per_subject` of `CHAT_` (at least 1).
    pub fn chat_max_msgs_per_subject(mut self, n: i64) -> Self {
        self.chat_max_msgs_per_subject = n.max(1);
        self
    }
    /// Replicas of every stream and bucket (1 on a single server, 3 on a cluster).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n.max(1);
        self
    }
    /// Bound of each JetStream API request.
    pub fn request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }
    /// Bound of the provisioner's connect.
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }
    pub fn lease_ttl_value(&self) -> Duration {
        self.lease_ttl
    }
    pub fn request_timeout_value(&self) -> Duration {
        self.request_timeout
    }
    pub fn connect_timeout_value(&self) -> Duration {
        self.connect_timeout
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProvisionErrorKind {
    /// Could not reach or authenticate to the broker.
    Connect,
    /// Minting the provisioner credential failed.
    Credential,
    /// A JetStream API request failed or timed out (a denied request also times out).
    JetStream,
    /// An existing stream or consumer differs in a way provisioning will not change.
    Conflict,
}

/// A failed provisioning step, naming the stream/consumer and what went wrong.
#[derive(Debug)]
pub struct ProvisionError {
    kind: ProvisionErrorKind,
    detail: String,
}

impl ProvisionError {
    pub(crate) fn new(kind: ProvisionErrorKind, detail: impl Into<String>) -> ProvisionError {
        ProvisionError {
            kind,
            detail: detail.into(),
        }
    }
    pub fn kind(&self) -> ProvisionErrorKind {
        self.kind
    }
}

impl From<crate::base::ClientError> for ProvisionError {
    fn from(e: crate::base::ClientError) -> ProvisionError {
        let kind = match e.kind() {
            crate::base::ClientErrorKind::Credential => ProvisionErrorKind::Credential,
            crate::base::ClientErrorKind::Connect => ProvisionErrorKind::Connect,
        };
        ProvisionError::new(kind, e.detail())
    }
}

impl fmt::Display for ProvisionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "provisioning: {}", self.detail)
    }
}

impl std::error::Error for ProvisionError {}

/// What `ensure_*` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ensured {
    Created,
    Unchanged,
    /// Updated in place; the names of the fields that differed.
    Updated(Vec<&'static str>),
}

/// The outcome of provisioning a space, stream by stream.
#[derive(Debug, Clone, Default)]
pub struct ProvisionReport {
    pub streams: Vec<(String, Ensured)>,
}

impl ProvisionReport {
    pub fn created(&self) -> usize {
        self.streams
            .iter()
            .filter(|(_, e)| *e == Ensured::Created)
            .count()
    }
    pub fn all_unchanged(&self) -> bool {
        self.streams.iter().all(|(_, e)| *e == Ensured::Unchanged)
    }
    /// What `up` says it did: `N created, the rest already in place`, and each stream updated in
    /// place with its fields (an existing lease bucket migrated to expiry markers, for one).
    pub fn summary(&self) -> String {
        let mut out = format!("{} created, the rest already in place", self.created());
        for (name, outcome) in &self.streams {
            if let Ensured::Updated(fields) = outcome {
                out.push_str(&format!(
                    "; {name} updated in place ({})",
                    fields.join(", ")
                ));
            }
        }
        out
    }
}

/// The broker's effective duplicate window for a stream with `max_age`.
fn duplicate_window_for(max_age: Duration, wanted: Option<Duration>) -> Duration {
    let base = wanted.unwrap_or(SERVER_DEFAULT_DUPLICATE_WINDOW);
    if max_age.is_zero() {
        base
    } else {
        base.min(max_age)
    }
}

fn stream(name: String, subjects: Vec<String>, opts: &ProvisionOptions) -> Config {
    Config {
        name,
        subjects,
        retention: RetentionPolicy::Limits,
        storage: StorageType::File,
        discard: DiscardPolicy::Old,
        num_replicas: opts.replicas,
        max_bytes: -1,
        max_messages: -1,
        max_messages_per_subject: -1,
        duplicate_window: SERVER_DEFAULT_DUPLICATE_WINDOW,
        ..Default::default()
    }
}

/// The backing stream of a KV bucket, as async-nats `create_key_value` builds it.
fn kv_stream(bucket: &str, history: i64, max_age: Duration, opts: &ProvisionOptions) -> Config {
    Config {
        name: SpaceNames::kv_stream(bucket),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: history,
        max_age,
        duplicate_window: duplicate_window_for(max_age, None),
        allow_rollup: true,
        deny_delete: true,
        deny_purge: false,
        allow_direct: true,
        discard: DiscardPolicy::New,
        retention: RetentionPolicy::Limits,
        storage: StorageType::File,
        num_replicas: opts.replicas,
        max_bytes: -1,
        max_messages: -1,
        ..Default::default()
    }
}

/// Every stream and bucket of a space, in creation order, with its reference config.
pub fn space_stream_configs(n: &SpaceNames, opts: &ProvisionOptions) -> Vec<Config> {
    let mut out = Vec::new();

    let mut chat = stream(n.chat_stream(), vec![n.chat_all()], opts);
    chat.max_messages_per_subject = opts.chat_max_msgs_per_subject;
    chat.allow_direct = true;
    out.push(chat);

    // DM and TASK must not enable Direct Get (docs/data-path.md).
    out.push(stream(n.dm_stream(), vec![n.dm_all()], opts));
    let mut task = stream(n.task_stream(), vec![n.task_all()], opts);
    task.retention = RetentionPolicy::WorkQueue;
    out.push(task);

    for (name, subject) in [
        (n.inbox_stream(), n.dinbox_all()),
        (n.dlv_stream(), n.dlv_all()),
    ] {
        let mut s = stream(name, vec![subject], opts);
        s.max_messages_per_subject = opts.backstop_max_msgs_per_subject;
        s.duplicate_window = BACKSTOP_DUPLICATE_WINDOW;
        out.push(s);
    }

    // Timer requests: message schedules stay disabled here.
    let mut ept_req = stream(n.ept_req_stream(), vec![n.ept_schedule_filter()], opts);
    ept_req.max_age = EPT_REQ_MAX_AGE;
    ept_req.duplicate_window = duplicate_window_for(EPT_REQ_MAX_AGE, None);
    out.push(ept_req);

    // Armed schedules and fires: schedules on (the broker forces rollup with them).
    let mut ept = stream(
        n.ept_stream(),
        vec![n.ept_armed_filter(), n.ept_fire_filter()],
        opts,
    );
    ept.max_age = EPT_MAX_AGE;
    ept.duplicate_window = duplicate_window_for(EPT_MAX_AGE, None);
    ept.allow_message_schedules = true;
    ept.allow_rollup = true;
    out.push(ept);

    out.push(kv_stream(&n.presence_bucket(), 1, opts.presence_ttl, opts));
    for bucket in [n.channels_bucket(), n.members_bucket(), n.acl_bucket()] {
        out.push(kv_stream(&bucket, 1, Duration::ZERO, opts));
    }
    // The lease bucket leaves a marker when a row runs out its TTL (a holder that died), so a
    // standby's watch sees the expiry as it happens, not on its next retry (docs/host.md,
    // "Standby hosts"). The marker lives one lease TTL: long enough for a watch whose consumer
    // was lost (noticed after two missed 5 s heartbeats) to find it when it is recreated.
    let mut lease = kv_stream(&n.delivery_bucket(), 1, opts.lease_ttl, opts);
    lease.allow_message_ttl = true;
    lease.subject_delete_marker_ttl = Some(opts.lease_ttl);
    out.push(lease);
    let mut membership = kv_stream(&n.membership_bucket(), 1, Duration::ZERO, opts);
    membership.max_bytes = MEMBERSHIP_MAX_BYTES;
    out.push(membership);
    // Authority records: primary, no limits; heads are read leader-served; no delete, no
    // purge, no rollup.
    let mut records = kv_stream(&n.records_bucket(), 1, Duration::ZERO, opts);
    records.deny_purge = true;
    records.allow_rollup = false;
    out.push(records);
    // Anycast take records (docs/anycast.md): rows are swept by the daemon, not by age.
    out.push(kv_stream(&n.anycast_bucket(), 1, Duration::ZERO, opts));
    out
}

/// 0 and negative limits both mean "unlimited" to the broker.
fn limit(x: i64) -> i64 {
    if x <= 0 {
        -1
    } else {
        x
    }
}

#[derive(Debug, PartialEq)]
enum Diff {
    Safe(&'static str),
    Unsafe(&'static str, String, String),
}

/// Differences in the fields provisioning manages.
fn diff(desired: &Config, existing: &Config) -> Vec<Diff> {
    let mut out = Vec::new();
    let mut want_subjects = desired.subjects.clone();
    let mut have_subjects = existing.subjects.clone();
    want_subjects.sort();
    have_subjects.sort();
    if want_subjects != have_subjects {
        out.push(Diff::Safe("subjects"));
    }
    if desired.retention != existing.retention {
        out.push(Diff::Unsafe(
            "retention",
            format!("{:?}", desired.retention),
            format!("{:?}", existing.retention),
        ));
    }
    if desired.storage != existing.storage {
        out.push(Diff::Unsafe(
            "storage",
            format!("{:?}", desired.storage),
            format!("{:?}", existing.storage),
        ));
    }
    if desired.deny_delete != existing.deny_delete {
        out.push(Diff::Unsafe(
            "deny_delete",
            desired.deny_delete.to_string(),
            existing.deny_delete.to_string(),
        ));
    }
    if desired.deny_purge != existing.deny_purge {
        out.push(Diff::Unsafe(
            "deny_purge",
            desired.deny_purge.to_string(),
            existing.deny_purge.to_string(),
        ));
    }
    if desired.allow_message_schedules != existing.allow_message_schedules {
        if desired.allow_message_schedules {
            out.push(Diff::Safe("allow_msg_schedules"));
        } else {
            out.push(Diff::Unsafe(
                "allow_msg_schedules",
                "false".into(),
                "true (it cannot be turned off)".into(),
            ));
        }
    }
    if limit(desired.max_messages_per_subject) != limit(existing.max_messages_per_subject) {
        out.push(Diff::Safe("max_msgs_per_subject"));
    }
    if limit(desired.max_messages) != limit(existing.max_messages) {
        out.push(Diff::Safe("max_msgs"));
    }
    if limit(desired.max_bytes) != limit(existing.max_bytes) {
        out.push(Diff::Safe("max_bytes"));
    }
    if desired.max_age != existing.max_age {
        out.push(Diff::Safe("max_age"));
    }
    if desired.discard != existing.discard {
        out.push(Diff::Safe("discard"));
    }
    if desired.duplicate_window != existing.duplicate_window {
        out.push(Diff::Safe("duplicate_window"));
    }
    if desired.allow_direct != existing.allow_direct {
        out.push(Diff::Safe("allow_direct"));
    }
    if desired.allow_rollup != existing.allow_rollup {
        out.push(Diff::Safe("allow_rollup"));
    }
    if desired.num_replicas.max(1) != existing.num_replicas.max(1) {
        out.push(Diff::Safe("num_replicas"));
    }
    // Per-message TTLs cannot be turned off once on (the broker refuses), and on they change
    // nothing for a stream whose writers set no `Nats-TTL`: only turning them on is a diff.
    if desired.allow_message_ttl && !existing.allow_message_ttl {
        out.push(Diff::Safe("allow_msg_ttl"));
    }
    if desired.subject_delete_marker_ttl != existing.subject_delete_marker_ttl {
        out.push(Diff::Safe("subject_delete_marker_ttl"));
    }
    out
}

/// `existing` with every managed field set from `desired`; server-side extras (metadata,
/// consumer limits, …) are kept.
fn merged(desired: &Config, existing: &Config) -> Config {
    let mut c = existing.clone();
    c.subjects = desired.subjects.clone();
    c.max_messages_per_subject = desired.max_messages_per_subject;
    c.max_messages = desired.max_messages;
    c.max_bytes = desired.max_bytes;
    c.max_age = desired.max_age;
    c.discard = desired.discard;
    c.duplicate_window = desired.duplicate_window;
    c.allow_direct = desired.allow_direct;
    c.allow_rollup = desired.allow_rollup;
    c.allow_message_schedules = desired.allow_message_schedules || existing.allow_message_schedules;
    c.allow_message_ttl = desired.allow_message_ttl || existing.allow_message_ttl;
    c.subject_delete_marker_ttl = desired.subject_delete_marker_ttl;
    c.num_replicas = desired.num_replicas;
    c
}

fn js_failed(what: &str, name: &str, err: impl fmt::Display) -> ProvisionError {
    ProvisionError::new(
        ProvisionErrorKind::JetStream,
        format!(
            "{what} {name:?} failed: {err} (a request the credential may not make also times out)"
        ),
    )
}

/// Times a stream creation the assigned node could not store (`10049`) is sent again.
const STORE_RACE_RETRIES: u32 = 3;
/// Pause before such a retry.
const STORE_RACE_PAUSE: std::time::Duration = std::time::Duration::from_millis(250);

/// `js.create_stream`, sent again (at most [`STORE_RACE_RETRIES`] times) when the node the meta
/// leader assigned it to answered `10049`. On a cluster that has just formed, a node may be
/// assigned a stream of an account whose JetStream it has not yet enabled, and fails to make the
/// account's store directory (CI of 251fdb0, `admin::liveness::on_a_cluster_liveness_is_unknown_never_gone`:
/// "could not create storage directory ... no such file or directory"); the meta leader drops
/// the assignment, so a second request starts clean. A store that stays unwritable fails every
/// try and is reported as before.
async fn create_stream(
    js: &Context,
    desired: &Config,
) -> Result<async_nats::jetstream::stream::Stream, async_nats::jetstream::context::CreateStreamError>
{
    let mut tries = 0;
    loop {
        match js.create_stream(desired.clone()).await {
            Err(e)
                if tries < STORE_RACE_RETRIES
                    && matches!(e.kind(), CreateStreamErrorKind::JetStream(je)
                        if je.error_code() == ErrorCode::STREAM_CREATE) =>
            {
                tries += 1;
                tracing::debug!(stream = %desired.name, tries, error = %e, "stream create not stored; sending it again");
                tokio::time::sleep(STORE_RACE_PAUSE).await;
            }
            done => return done,
        }
    }
}

/// Creates `desired`, or accepts/updates the existing stream of that name (see module docs).
pub async fn ensure_stream(js: &Context, desired: &Config) -> Result<Ensured, ProvisionError> {
    let name = desired.name.as_str();
    let existing = match js.get_stream(name).await {
        Ok(s) => Some(s.cached_info().config.clone()),
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(je) if je.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                None
            }
            _ => return Err(js_failed("stream info of", name, e)),
        },
    };
    let existing = match existing {
        Some(c) => c,
        None => match create_stream(js, desired).await {
            Ok(_) => return Ok(Ensured::Created),
            Err(e) => match e.kind() {
                // Lost a race with another provisioner: compare with what it created.
                CreateStreamErrorKind::JetStream(je)
                    if je.error_code() == ErrorCode::STREAM_NAME_EXIST =>
                {
                    js.get_stream(name)
                        .await
                        .map_err(|e| js_failed("stream info of", name, e))?
                        .cached_info()
                        .config
                        .clone()
                }
                _ => return Err(js_failed("creating stream", name, e)),
            },
        },
    };
    let diffs = diff(desired, &existing);
    if diffs.is_empty() {
        return Ok(Ensured::Unchanged);
    }
    let refusals: Vec<String> = diffs
        .iter()
        .filter_map(|d| match d {
            Diff::Unsafe(field, want, have) => Some(format!("{field} is {have}, wanted {want}")),
            Diff::Safe(_) => None,
        })
        .collect();
    if !refusals.is_empty() {
        return Err(ProvisionError::new(
            ProvisionErrorKind::Conflict,
            format!(
                "stream {name:?} exists with a config provisioning will not change in place: {}; \
                 delete it (losing its data) or fix it by hand",
                refusals.join("; ")
            ),
        ));
    }
    let fields: Vec<&'static str> = diffs
        .iter()
        .filter_map(|d| match d {
            Diff::Safe(f) => Some(*f),
            Diff::Unsafe(..) => None,
        })
        .collect();
    js.update_stream(merged(desired, &existing))
        .await
        .map_err(|e| js_failed("updating stream", name, e))?;
    Ok(Ensured::Updated(fields))
}

/// Creates (or accepts) every stream and bucket of the space, in order.
pub async fn ensure_space(
    js: &Context,
    names: &SpaceNames,
    opts: &ProvisionOptions,
) -> Result<ProvisionReport, ProvisionError> {
    let mut report = ProvisionReport::default();
    for config in space_stream_configs(names, opts) {
        let outcome = ensure_stream(js, &config).await?;
        report.streams.push((config.name.clone(), outcome));
    }
    Ok(report)
}

/// The agent's handoff durable `dlv_<o>-<a>-<uid>` on `DLV_<s>`: its own dlv subject, explicit
/// acks, 60 s ack wait, deliver all.
pub fn agent_consumer_config(
    names: &SpaceNames,
    member: &Principal,
    uid: &LifecycleUid,
) -> pull::Config {
    pull::Config {
        durable_name: Some(SpaceNames::dlv_durable(member, uid)),
        filter_subject: names.dlv_subject(member, uid),
        ack_policy: AckPolicy::Explicit,
        ack_wait: AGENT_CONSUMER_ACK_WAIT,
        deliver_policy: DeliverPolicy::All,
        ..Default::default()
    }
}

/// Pre-creates an agent's bind-only `dlv_` durable (idempotent). An existing durable with a
/// different filter, ack policy, ack wait or deliver policy is refused, never rewritten: it may
/// hold the agent's pending frames.
pub async fn create_agent_consumer(
    js: &Context,
    names: &SpaceNames,
    member: &Principal,
    uid: &LifecycleUid,
) -> Result<Ensured, ProvisionError> {
    let desired = agent_consumer_config(names, member, uid);
    ensure_durable(js, &names.dlv_stream(), desired, true).await
}

/// A role's shared durable `svc_<role>` on `TASK_<s>` (the reference `taskDurableConfig`):
/// filter `cotal.<s>.svc.<role>.>`, explicit acks, 60 s ack wait, no deliver policy.
pub fn role_consumer_config(names: &SpaceNames, role: &Role) -> pull::Config {
    pull::Config {
        durable_name: Some(SpaceNames::task_durable(role)),
        filter_subject: names.task_role_filter(role),
        ack_policy: AckPolicy::Explicit,
        ack_wait: AGENT_CONSUMER_ACK_WAIT,
        ..Default::default()
    }
}

/// Pre-creates a role's `svc_<role>` durable (idempotent; agents only bind it). The durable is
/// shared by every holder of the role, so an existing one is accepted whatever its ack wait (the
/// role's own setting, which one holder's provisioning must not fight over); a different filter,
/// ack policy or deliver policy is refused, never rewritten: it may hold queued requests.
pub async fn create_role_consumer(
    js: &Context,
    names: &SpaceNames,
    role: &Role,
) -> Result<Ensured, ProvisionError> {
    let desired = role_consumer_config(names, role);
    ensure_durable(js, &names.task_stream(), desired, false).await
}

/// Creates `desired` on `stream_name` when absent; accepts an existing durable whose config
/// matches (the ack wait only when `fixed_ack_wait`), and refuses one that does not.
async fn ensure_durable(
    js: &Context,
    stream_name: &str,
    desired: pull::Config,
    fixed_ack_wait: bool,
) -> Result<Ensured, ProvisionError> {
    let durable = desired.durable_name.clone().unwrap_or_default();
    let stream = js
        .get_stream(stream_name)
        .await
        .map_err(|e| js_failed("stream info of", stream_name, e))?;
    match stream.consumer_info(&durable).await {
        Ok(info) => {
            let c = &info.config;
            let mut bad = Vec::new();
            if c.filter_subject != desired.filter_subject {
                bad.push(format!(
                    "filter_subject is {:?}, wanted {:?}",
                    c.filter_subject, desired.filter_subject
                ));
            }
            if c.ack_policy != desired.ack_policy {
                bad.push(format!("ack_policy is {:?}, wanted Explicit", c.ack_policy));
            }
            if fixed_ack_wait && c.ack_wait != desired.ack_wait {
                bad.push(format!(
                    "ack_wait is {} ms, wanted {} ms",
                    c.ack_wait.as_millis(),
                    desired.ack_wait.as_millis()
                ));
            }
            if c.deliver_policy != desired.deliver_policy {
                bad.push(format!(
                    "deliver_policy is {:?}, wanted {:?}",
                    c.deliver_policy, desired.deliver_policy
                ));
            }
            if bad.is_empty() {
                Ok(Ensured::Unchanged)
            } else {
                Err(ProvisionError::new(
                    ProvisionErrorKind::Conflict,
                    format!(
                        "consumer {durable:?} on {stream_name:?} exists with another config: {}",
                        bad.join("; ")
                    ),
                ))
            }
        }
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {
            stream
                .create_consumer(desired)
                .await
                .map_err(|e| js_failed("creating consumer", &durable, e))?;
            Ok(Ensured::Created)
        }
        Err(e) => Err(js_failed("consumer info of", &durable, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Space;

    fn names() -> SpaceNames {
        SpaceNames::new(&Space::parse("demo").unwrap())
    }

    fn by_name(configs: &[Config], name: &str) -> Config {
        configs
            .iter()
            .find(|c| c.name == name)
            .cloned()
            .unwrap_or_else(|| panic!("no stream {name}"))
    }

    #[test]
    fn reference_configs() {
        let opts = ProvisionOptions::new().backstop_max_msgs_per_subject(50);
        let all = space_stream_configs(&names(), &opts);
        assert_eq!(all.len(), 15);
        let chat = by_name(&all, "CHAT_demo");
        assert_eq!(chat.subjects, vec!["cotal.demo.chat.>"]);
        assert!(chat.allow_direct);
        assert_eq!(chat.max_messages_per_subject, 1000);
        let task = by_name(&all, "TASK_demo");
        assert_eq!(task.retention, RetentionPolicy::WorkQueue);
        assert!(!task.allow_direct && !by_name(&all, "DM_demo").allow_direct);
        let dlv = by_name(&all, "DLV_demo");
        assert_eq!(dlv.max_messages_per_subject, 50);
        assert_eq!(dlv.discard, DiscardPolicy::Old);
        assert_eq!(dlv.duplicate_window, Duration::from_secs(7200));
        let ept = by_name(&all, "EPT_demo");
        assert!(ept.allow_message_schedules);
        assert!(!by_name(&all, "EPT_REQ_demo").allow_message_schedules);
        let lease = by_name(&all, "KV_cotal_delivery_demo");
        assert_eq!(lease.max_age, Duration::from_secs(30));
        assert_eq!(lease.duplicate_window, Duration::from_secs(30));
        assert_eq!(lease.subjects, vec!["$KV.cotal_delivery_demo.>"]);
        assert!(lease.allow_message_ttl);
        assert_eq!(
            lease.subject_delete_marker_ttl,
            Some(Duration::from_secs(30))
        );
        // Only the lease bucket leaves expiry markers.
        let with_markers: Vec<&str> = all
            .iter()
            .filter(|c| c.subject_delete_marker_ttl.is_some() || c.allow_message_ttl)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(with_markers, vec!["KV_cotal_delivery_demo"]);
        assert_eq!(
            by_name(&all, "KV_cotal_presence_demo").max_age,
            Duration::from_secs(6)
        );
        let acl = by_name(&all, "KV_cotal_acl_demo");
        assert_eq!(acl.max_messages_per_subject, 1);
        assert_eq!(acl.discard, DiscardPolicy::New);
        assert_eq!(
            by_name(&all, "KV_cotal_membership_demo").max_bytes,
            64 * 1024 * 1024
        );
        let rec = by_name(&all, "KV_cotal_records_demo");
        assert!(rec.deny_purge && rec.deny_delete && !rec.allow_rollup);
        // The provisioner profile covers exactly these streams.
        let listed = crate::provision::profiles::space_stream_names(&names());
        let mut have: Vec<String> = all.iter().map(|c| c.name.clone()).collect();
        have.sort();
        let mut want = listed;
        want.sort();
        assert_eq!(have, want);
    }

    #[test]
    fn lease_ttl_is_configurable() {
        let all = space_stream_configs(
            &names(),
            &ProvisionOptions::new().lease_ttl(Duration::from_secs(5)),
        );
        let lease = by_name(&all, "KV_cotal_delivery_demo");
        assert_eq!(lease.max_age, Duration::from_secs(5));
        assert_eq!(
            lease.subject_delete_marker_ttl,
            Some(Duration::from_secs(5))
        );
        assert!(lease.allow_message_ttl);
    }

    /// A lease bucket provisioned before expiry markers is updated in place with both fields;
    /// a bucket whose markers are on already is unchanged, and a stream that has per-message
    /// TTLs on (which the broker cannot turn off) is never asked to turn them off.
    /// Mutation seen failing: the two marker entries of `diff` removed (no update).
    #[test]
    fn an_old_lease_bucket_differs_only_in_its_markers() {
        let all = space_stream_configs(&names(), &ProvisionOptions::new());
        let want = by_name(&all, "KV_cotal_delivery_demo");
        let mut old = want.clone();
        old.allow_message_ttl = false;
        old.subject_delete_marker_ttl = None;
        assert_eq!(
            diff(&want, &old),
            vec![
                Diff::Safe("allow_msg_ttl"),
                Diff::Safe("subject_delete_marker_ttl")
            ]
        );
        let m = merged(&want, &old);
        assert!(m.allow_message_ttl);
        assert_eq!(m.subject_delete_marker_ttl, Some(Duration::from_secs(30)));
        assert!(diff(&want, &m).is_empty());
        let acl = by_name(&all, "KV_cotal_acl_demo");
        let mut ttl_on = acl.clone();
        ttl_on.allow_message_ttl = true;
        assert!(diff(&acl, &ttl_on).is_empty());
        assert!(merged(&acl, &ttl_on).allow_message_ttl);
    }

    #[test]
    fn diff_classifies_safe_and_unsafe_fields() {
        let all = space_stream_configs(&names(), &ProvisionOptions::new());
        let want = by_name(&all, "TASK_demo");
        let mut have = want.clone();
        have.max_bytes = 0; // the broker's spelling of "unlimited" also matches
        have.max_messages_per_subject = 0;
        assert!(diff(&want, &have).is_empty());
        have.max_age = Duration::from_secs(1);
        assert_eq!(diff(&want, &have), vec![Diff::Safe("max_age")]);
        have.retention = RetentionPolicy::Limits;
        assert!(matches!(
            diff(&want, &have)[0],
            Diff::Unsafe("retention", ..)
        ));
        let m = merged(&want, &have);
        assert_eq!(m.max_age, Duration::ZERO);
        assert_eq!(
            m.retention,
            RetentionPolicy::Limits,
            "merge never touches unsafe fields"
        );
    }

    /// Mutation seen failing: `summary` without the updated streams (the migration unsaid).
    #[test]
    fn the_summary_names_each_stream_updated_in_place() {
        let report = ProvisionReport {
            streams: vec![
                ("CHAT_demo".into(), Ensured::Unchanged),
                ("KV_cotal_acl_demo".into(), Ensured::Created),
                (
                    "KV_cotal_delivery_demo".into(),
                    Ensured::Updated(vec!["allow_msg_ttl", "subject_delete_marker_ttl"]),
                ),
            ],
        };
        assert_eq!(
            report.summary(),
            "1 created, the rest already in place; KV_cotal_delivery_demo updated in place (allow_msg_ttl, subject_delete_marker_ttl)"
        );
    }

    #[test]
    fn agent_consumer_is_the_reference_durable() {
        let p = Principal::parse("local.alice").unwrap();
        let uid = LifecycleUid::parse("abcdefghijklmnopqrstuvwxyz").unwrap();
        let c = agent_consumer_config(&names(), &p, &uid);
        assert_eq!(
            c.durable_name.as_deref(),
            Some("dlv_local-alice-abcdefghijklmnopqrstuvwxyz")
        );
        assert_eq!(
            c.filter_subject,
            "cotal.demo.dlv.local.alice.abcdefghijklmnopqrstuvwxyz"
        );
        assert_eq!(c.ack_policy, AckPolicy::Explicit);
        assert_eq!(c.ack_wait, Duration::from_secs(60));
        assert_eq!(c.deliver_policy, DeliverPolicy::All);
    }
}
