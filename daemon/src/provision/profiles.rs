//! Permission profiles: the exact publish/subscribe allow and deny lists each credential
//! carries.
//!
//! The lists are the reference `provision.ts` profiles with the corrections found by running
//! them against a real broker (each named at its profile below). Every Cotal name comes from
//! [`SpaceNames`]; only NATS protocol subjects (`$JS.API…`, `$KV…`, `$SYS…`) are spelled here,
//! through the small builders at the top of this file. Grants are never wider than the
//! reference: a profile that needs more adds it together with the feature.

use crate::wire::{
    inbox_prefix, validate_channel, CtlService, LifecycleUid, Principal, Role, SpaceNames,
    WireError, MEMBERSHIP_OBSERVER_INBOX_PREFIX,
};

/// The four lists of a user JWT's `pub`/`sub` permissions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    pub pub_allow: Vec<String>,
    pub pub_deny: Vec<String>,
    pub sub_allow: Vec<String>,
    pub sub_deny: Vec<String>,
}

impl Permissions {
    fn allow_pub(&mut self, subject: impl Into<String>) -> &mut Self {
        push_unique(&mut self.pub_allow, subject.into());
        self
    }
    fn allow_sub(&mut self, subject: impl Into<String>) -> &mut Self {
        push_unique(&mut self.sub_allow, subject.into());
        self
    }
    fn deny_pub(&mut self, subject: impl Into<String>) -> &mut Self {
        push_unique(&mut self.pub_deny, subject.into());
        self
    }
    /// The read-only KV grant set of the reference `kvRead(B)`: stream info, leader-served last
    /// message get, and consumer create/info/delete (watch and key listing).
    fn kv_read(&mut self, bucket: &str) -> &mut Self {
        let stream = SpaceNames::kv_stream(bucket);
        self.allow_pub(js::stream_info(&stream))
            .allow_pub(js::stream_msg_get(&stream))
            .allow_pub(js::consumer_create_any(&stream))
            .allow_pub(js::consumer_info_any(&stream))
            .allow_pub(js::consumer_delete_any(&stream))
    }
}

fn push_unique(list: &mut Vec<String>, subject: String) {
    if !list.contains(&subject) {
        list.push(subject);
    }
}

/// NATS protocol subjects (JetStream API, KV, `$SYS`). Not Cotal names.
pub mod js {
    pub const API_INFO: &str = "$JS.API.INFO";
    /// Flow-control replies of push consumers.
    pub const FLOW_CONTROL: &str = "$JS.FC.>";

    pub fn stream_info(stream: &str) -> String {
        format!("$JS.API.STREAM.INFO.{stream}")
    }
    pub fn stream_create(stream: &str) -> String {
        format!("$JS.API.STREAM.CREATE.{stream}")
    }
    pub fn stream_update(stream: &str) -> String {
        format!("$JS.API.STREAM.UPDATE.{stream}")
    }
    pub fn stream_msg_get(stream: &str) -> String {
        format!("$JS.API.STREAM.MSG.GET.{stream}")
    }
    pub fn stream_msg_delete(stream: &str) -> String {
        format!("$JS.API.STREAM.MSG.DELETE.{stream}")
    }
    /// The bare create (ephemeral, multi-filter): `$JS.API.CONSUMER.CREATE.<stream>`.
    pub fn consumer_create_bare(stream: &str) -> String {
        format!("$JS.API.CONSUMER.CREATE.{stream}")
    }
    pub fn consumer_create_any(stream: &str) -> String {
        format!("$JS.API.CONSUMER.CREATE.{stream}.>")
    }
    /// Create of one named consumer in every filter form: `….CREATE.<stream>.<name>.>`.
    pub fn consumer_create_named(stream: &str, name: &str) -> String {
        format!("$JS.API.CONSUMER.CREATE.{stream}.{name}.>")
    }
    /// Create of one named consumer with exactly this filter subject.
    pub fn consumer_create_filtered(stream: &str, name: &str, filter: &str) -> String {
        format!("$JS.API.CONSUMER.CREATE.{stream}.{name}.{filter}")
    }
    pub fn consumer_durable_create(stream: &str, name: &str) -> String {
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{name}")
    }
    pub fn consumer_durable_create_any(stream: &str) -> String {
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>")
    }
    pub fn consumer_info(stream: &str, name: &str) -> String {
        format!("$JS.API.CONSUMER.INFO.{stream}.{name}")
    }
    pub fn consumer_info_any(stream: &str) -> String {
        format!("$JS.API.CONSUMER.INFO.{stream}.>")
    }
    pub fn consumer_next(stream: &str, name: &str) -> String {
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}")
    }
    pub fn consumer_next_any(stream: &str) -> String {
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.>")
    }
    pub fn consumer_delete(stream: &str, name: &str) -> String {
        format!("$JS.API.CONSUMER.DELETE.{stream}.{name}")
    }
    pub fn consumer_delete_any(stream: &str) -> String {
        format!("$JS.API.CONSUMER.DELETE.{stream}.>")
    }
    pub fn ack(stream: &str, consumer: &str) -> String {
        format!("$JS.ACK.{stream}.{consumer}.>")
    }
    pub fn ack_any(stream: &str) -> String {
        format!("$JS.ACK.{stream}.>")
    }
    /// A KV write subject `$KV.<bucket>.<key>` (`key` may be a wildcard pattern).
    pub fn kv_key(bucket: &str, key: &str) -> String {
        format!("$KV.{bucket}.{key}")
    }
    pub fn sys_account_connz(account: &str) -> String {
        format!("$SYS.REQ.ACCOUNT.{account}.CONNZ")
    }
    pub fn sys_account_connect(account: &str) -> String {
        format!("$SYS.ACCOUNT.{account}.CONNECT")
    }
    pub fn sys_account_disconnect(account: &str) -> String {
        format!("$SYS.ACCOUNT.{account}.DISCONNECT")
    }
    pub const SYS_SERVER_KICK_ANY: &str = "$SYS.REQ.SERVER.*.KICK";
    /// KICK on one server (the multi-space host's kick-only user).
    pub fn sys_server_kick(server_id: &str) -> String {
        format!("$SYS.REQ.SERVER.{server_id}.KICK")
    }
    pub const INBOX_ANY: &str = "_INBOX.>";
}

/// The `_INBOX_<connId>.>` grant for a credential holder whose connId is its user nkey.
fn own_inbox(user_nkey: &str) -> String {
    format!("{}.>", inbox_prefix(user_nkey))
}

/// An agent's read ACL, validated at the boundary: each entry is a channel pattern (wildcards
/// allowed as whole segments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadChannels(Vec<String>);

impl ReadChannels {
    pub fn new<I, S>(channels: I) -> Result<ReadChannels, WireError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out = Vec::new();
        for ch in channels {
            let ch = ch.as_ref();
            validate_channel(ch, false)?;
            push_unique(&mut out, ch.to_string());
        }
        Ok(ReadChannels(out))
    }
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

/// The anycast roles an agent serves (docs/anycast.md), validated at the boundary and
/// deduplicated. Each one grants bind-only access to the role's `svc_<role>` durable and is
/// written to the lifecycle's ACL row, where the daemon checks a take against it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roles(Vec<Role>);

impl Roles {
    /// No role: the agent sends anycast requests but takes none.
    pub fn none() -> Roles {
        Roles(Vec::new())
    }
    pub fn new<I, S>(roles: I) -> Result<Roles, WireError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out: Vec<Role> = Vec::new();
        for r in roles {
            let role = Role::parse(r.as_ref())?;
            if !out.contains(&role) {
                out.push(role);
            }
        }
        Ok(Roles(out))
    }
    pub fn as_slice(&self) -> &[Role] {
        &self.0
    }
    /// The role names, as the ACL row stores them.
    pub fn names(&self) -> Vec<String> {
        self.0.iter().map(|r| r.as_str().to_string()).collect()
    }
}

/// A data-account credential profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Profile {
    /// The delivery daemon.
    Delivery,
    /// The derived membership-feed reader/writer.
    MembershipRw,
    /// One agent instance: a principal in one lifecycle, reading `read` channels and serving
    /// `roles` (anycast).
    Agent {
        principal: Principal,
        lifecycle_uid: LifecycleUid,
        read: ReadChannels,
        roles: Roles,
    },
    /// The admin-rail caller (`reloadCreds`, `evictPrincipal`, …) speaking as `principal`.
    Supervisor { principal: Principal },
    /// One-shot stream/bucket/consumer creation for one space.
    Provisioner,
    /// The operator's read-only inspection (`pending`, `members`): stream and consumer info,
    /// leader-served message gets on the stores and rows those commands read; no publish to any
    /// data subject, no consumer create, no subscription but its own inbox.
    Inspector,
    /// The space account's unrestricted user: an operator's own inspection and repair (read a
    /// lease row, delete it, look at consumers), and the harness's test-side checks. Never given
    /// to a daemon or an agent.
    Operator,
}

impl Profile {
    /// The name the reference uses for this profile (also the default JWT `name`).
    pub fn name(&self) -> &'static str {
        match self {
            Profile::Delivery => "delivery",
            Profile::MembershipRw => "membership-rw",
            Profile::Agent { .. } => "agent",
            Profile::Supervisor { .. } => "supervisor",
            Profile::Provisioner => "provisioner",
            Profile::Inspector => "inspector",
            Profile::Operator => "operator",
        }
    }

    /// JWT tags of a principal-bearing profile (the reference's static mint): `owner:<o>`,
    /// `actor:<a>`, `principal:<o>.<a>`, so CONNZ attributes its connections (the membership
    /// feed keys rows by them). Infra profiles carry none: they are unattributable by design.
    pub fn tags(&self) -> Vec<String> {
        match self {
            Profile::Agent { principal, .. } | Profile::Supervisor { principal } => vec![
                format!("owner:{}", principal.owner()),
                format!("actor:{}", principal.actor()),
                format!("principal:{}", principal.dot_form()),
            ],
            _ => Vec::new(),
        }
    }

    /// The profile's grants for a holder with user nkey `user_nkey` (its inbox connId).
    pub fn permissions(&self, names: &SpaceNames, user_nkey: &str) -> Permissions {
        match self {
            Profile::Delivery => delivery(names, user_nkey),
            Profile::MembershipRw => membership_rw(names, user_nkey),
            Profile::Agent {
                principal,
                lifecycle_uid,
                read,
                roles,
            } => agent(names, user_nkey, principal, lifecycle_uid, read, roles),
            Profile::Supervisor { principal } => supervisor(names, user_nkey, principal),
            Profile::Provisioner => provisioner(names, user_nkey),
            Profile::Inspector => inspector(names, user_nkey),
            // Empty lists: the JWT carries no restriction.
            Profile::Operator => Permissions::default(),
        }
    }
}

/// A system-account (`$SYS`) credential profile, scoped to one data account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemProfile {
    /// CONNZ scans and connect/disconnect events of one account.
    MembershipObserver,
    /// Per-server KICK, nothing else.
    ConnectionEvictor,
}

impl SystemProfile {
    pub fn name(self) -> &'static str {
        match self {
            SystemProfile::MembershipObserver => "membership-observer",
            SystemProfile::ConnectionEvictor => "connection-evictor",
        }
    }

    /// Grants scoped to the data account `account` (its public key).
    pub fn permissions(self, account: &str) -> Permissions {
        let mut p = Permissions::default();
        match self {
            SystemProfile::MembershipObserver => {
                p.allow_pub(js::sys_account_connz(account))
                    .allow_sub(format!("{MEMBERSHIP_OBSERVER_INBOX_PREFIX}.>"))
                    .allow_sub(js::sys_account_connect(account))
                    .allow_sub(js::sys_account_disconnect(account));
            }
            SystemProfile::ConnectionEvictor => {
                p.allow_pub(js::SYS_SERVER_KICK_ANY)
                    .allow_sub(js::INBOX_ANY);
            }
        }
        p
    }
}

/// `delivery`: the reference `deliveryPermissions` (latest stored version), with the inbox on the
/// user nkey, the lease-bucket watch (consumer create/info/delete on `KV_cotal_delivery_<s>`)
/// and `STREAM.MSG.DELETE` on `INBOX_<s>` for retired lifecycles (docs/data-path.md).
fn delivery(n: &SpaceNames, user_nkey: &str) -> Permissions {
    let chat = n.chat_stream();
    let inbox = n.inbox_stream();
    let dlv = n.dlv_stream();
    let reader = crate::wire::READER_DURABLE;
    let lease_stream = SpaceNames::kv_stream(&n.delivery_bucket());
    let records_stream = SpaceNames::kv_stream(&n.records_bucket());
    let ept_req = n.ept_req_stream();
    let timerw = n.timer_writer_durable();

    let mut p = Permissions::default();
    p.allow_pub(js::API_INFO)
        .allow_pub(js::stream_info(&chat))
        .allow_pub(js::stream_info(&inbox))
        .allow_pub(js::stream_info(&dlv))
        // CHAT: fan-out durable, activation catch-up ephemerals, mediated readHistory.
        .allow_pub(js::consumer_create_bare(&chat))
        .allow_pub(js::consumer_create_any(&chat))
        .allow_pub(js::consumer_durable_create_any(&chat))
        .allow_pub(js::consumer_info_any(&chat))
        .allow_pub(js::consumer_next_any(&chat))
        .allow_pub(js::consumer_delete_any(&chat))
        .allow_pub(js::ack_any(&chat))
        // INBOX: name-pinned to `reader` (created with exactly one filter subject).
        .allow_pub(js::consumer_create_named(&inbox, reader))
        .allow_pub(js::consumer_durable_create(&inbox, reader))
        .allow_pub(js::consumer_info(&inbox, reader))
        .allow_pub(js::consumer_next(&inbox, reader))
        .allow_pub(js::consumer_delete(&inbox, reader))
        .allow_pub(js::ack(&inbox, reader))
        .allow_pub(js::FLOW_CONTROL);
    for bucket in [
        n.presence_bucket(),
        n.channels_bucket(),
        n.members_bucket(),
        n.acl_bucket(),
    ] {
        p.kv_read(&bucket);
    }
    p.allow_pub(js::kv_key(&n.members_bucket(), ">"))
        // Lease bucket: leader-served reads, the lease keys, and the watch.
        .allow_pub(js::stream_info(&lease_stream))
        .allow_pub(js::stream_msg_get(&lease_stream))
        .allow_pub(js::consumer_create_any(&lease_stream))
        .allow_pub(js::consumer_info_any(&lease_stream))
        .allow_pub(js::consumer_delete_any(&lease_stream))
        .allow_pub(js::kv_key(&n.delivery_bucket(), "lease.*"))
        // Checkpoint timer writer, hosted in the daemon.
        .allow_pub(js::consumer_create_filtered(
            &ept_req,
            &timerw,
            &n.ept_schedule_filter(),
        ))
        .allow_pub(js::consumer_info(&ept_req, &timerw))
        .allow_pub(js::consumer_next(&ept_req, &timerw))
        .allow_pub(js::ack(&ept_req, &timerw))
        .allow_pub(js::consumer_durable_create(&ept_req, &timerw))
        .allow_pub(js::stream_info(&ept_req))
        .allow_pub(js::stream_info(&n.ept_stream()))
        .allow_pub(js::stream_msg_get(&n.ept_stream()))
        .allow_pub(js::stream_info(&records_stream))
        .allow_pub(js::stream_msg_get(&records_stream))
        .allow_pub(n.ept_armed_filter())
        // Plane-3 data writes, any member and lifecycle.
        .allow_pub(n.dinbox_any_member())
        .allow_pub(n.dlv_any_member())
        // Delete entries of retired lifecycles from the fan-out store.
        .allow_pub(js::stream_msg_delete(&inbox))
        // Control replies only, never the request subjects.
        .allow_pub(n.ctl_reply_grant(CtlService::Delivery))
        .allow_pub(n.ctl_reply_grant(CtlService::DeliveryAdmin))
        // The `live.delivery` responder's replies (reply leaf only).
        .allow_pub(n.live_delivery_reply_grant());
    anycast_records(&mut p, n, user_nkey);
    p.allow_sub(own_inbox(user_nkey))
        .allow_sub(n.ctl_serve(CtlService::Delivery))
        .allow_sub(n.ctl_serve(CtlService::DeliveryAdmin))
        // The anycast take rail (queue group `anycast`).
        .allow_sub(n.ctl_serve(CtlService::Anycast))
        // The `live.delivery` responder (queue group `live.delivery`).
        .allow_sub(n.live_delivery_serve());
    p
}

/// Anycast take records (docs/anycast.md): leader-served reads of `TASK_<s>` (stream info
/// for its creation time, message get by seq, never Direct Get) and deletes there (a cancel);
/// the `cotal_anycast_<s>` rows (read leader-served, written by compare-and-set); DMs from the
/// daemon's own principal `local.<user nkey>` only; the take rail's serve and reply leaf.
fn anycast_records(p: &mut Permissions, n: &SpaceNames, user_nkey: &str) {
    let task = n.task_stream();
    p.kv_read(&n.anycast_bucket())
        .allow_pub(js::stream_info(&task))
        .allow_pub(js::stream_msg_get(&task))
        .allow_pub(js::stream_msg_delete(&task))
        .allow_pub(js::kv_key(&n.anycast_bucket(), ">"))
        .allow_pub(n.ctl_reply_grant(CtlService::Anycast));
    if let Ok(me) = Principal::for_nkey(user_nkey) {
        p.allow_pub(n.dm_from_any(&me));
    }
}

/// `membership-rw`: reads the members registry and the feed, writes the feed.
fn membership_rw(n: &SpaceNames, user_nkey: &str) -> Permissions {
    let mut p = Permissions::default();
    p.allow_pub(js::API_INFO)
        .kv_read(&n.members_bucket())
        .kv_read(&n.membership_bucket())
        .allow_pub(js::kv_key(&n.membership_bucket(), ">"))
        .allow_pub(js::FLOW_CONTROL);
    p.allow_sub(own_inbox(user_nkey));
    p
}

/// `agent`: one principal in one lifecycle. Choices:
///
/// - **Posts**: publish on its own chat subtree `cotal.<s>.chat.<o>.<a>.>` only (the broker
///   enforces sender authenticity). Publish acks arrive on its inbox `_INBOX_<user nkey>.>`,
///   the same connId rule as every other data-account profile.
/// - **Live reads**: a core subscription `cotal.<s>.chat.*.*.<ch>` per allowed read channel; no
///   native `dinbox`/`dlv` subscription, and no grant at all on `INBOX_<s>`.
/// - **Delivery rail**: publish its own `ctl.delivery.<o>.<a>` request subject and subscribe
///   its own `….reply.>` subtree; nothing on `ctl.delivery-admin`.
/// - **Liveness probe**: publish its own `live.delivery.<o>.<a>` and subscribe its own
///   `….reply.>` subtree (docs/admin.md).
/// - **Handoff**: bind-only on its own `dlv_<o>-<a>-<uid>` durable (INFO, MSG.NEXT, ACK). The
///   provisioner pre-creates it; creating any DLV consumer is explicitly denied, so a bug in an
///   agent cannot create a consumer that reads another member's frames.
/// - **Lease health**: read-only `STREAM.INFO` and `STREAM.MSG.GET` on the lease bucket
///   (non-gating health).
/// - **Presence**: `STREAM.INFO` on the presence bucket (to open it) and a KV write of its own
///   key `<o>.<a>` only.
/// - **Anycast** (docs/anycast.md): publish requests as their own sender
///   `cotal.<s>.svc.*.<o>.<a>`, its own take subject, `STREAM.INFO` on `TASK_<s>` (the creation
///   time a take names); for each role it serves, bind-only on the role's shared `svc_<role>`
///   durable (INFO, MSG.NEXT, ACK), which the provisioner pre-creates. Creating any TASK
///   consumer is denied, like DLV: an agent never reads another role's requests.
/// - No `$JS.API.INFO` and no `$JS.FC.>`: a pull consumer and JetStream publishes need neither.
fn agent(
    n: &SpaceNames,
    user_nkey: &str,
    principal: &Principal,
    uid: &LifecycleUid,
    read: &ReadChannels,
    roles: &Roles,
) -> Permissions {
    let dlv = n.dlv_stream();
    let durable = SpaceNames::dlv_durable(principal, uid);
    let lease_stream = SpaceNames::kv_stream(&n.delivery_bucket());
    let presence = n.presence_bucket();
    let mut p = Permissions::default();
    p.allow_pub(format!(
        "{}.chat.{}.{}.>",
        n.space().prefix(),
        principal.owner(),
        principal.actor()
    ))
    .allow_pub(n.ctl_subject(CtlService::Delivery, principal))
    .allow_pub(n.live_delivery_subject(principal))
    // Anycast (docs/anycast.md): requests as their own sender, its own take subject, and the
    // task stream's creation time.
    .allow_pub(n.ctl_subject(CtlService::Anycast, principal))
    .allow_pub(n.anycast_send_grant(principal))
    .allow_pub(js::stream_info(&n.task_stream()))
    .allow_pub(js::consumer_info(&dlv, &durable))
    .allow_pub(js::consumer_next(&dlv, &durable))
    .allow_pub(js::ack(&dlv, &durable))
    .allow_pub(js::stream_info(&lease_stream))
    .allow_pub(js::stream_msg_get(&lease_stream))
    .allow_pub(js::stream_info(&SpaceNames::kv_stream(&presence)))
    .allow_pub(js::kv_key(&presence, &SpaceNames::presence_key(principal)));
    let task = n.task_stream();
    for role in roles.as_slice() {
        let svc = SpaceNames::task_durable(role);
        p.allow_pub(js::consumer_info(&task, &svc))
            .allow_pub(js::consumer_next(&task, &svc))
            .allow_pub(js::ack(&task, &svc));
    }
    for stream in [&dlv, &task] {
        p.deny_pub(js::consumer_create_bare(stream))
            .deny_pub(js::consumer_create_any(stream))
            .deny_pub(js::consumer_durable_create_any(stream));
    }
    p.allow_sub(own_inbox(user_nkey))
        .allow_sub(n.ctl_reply_subtree(CtlService::Delivery, principal))
        .allow_sub(n.live_delivery_reply_subtree(principal))
        .allow_sub(n.ctl_reply_subtree(CtlService::Anycast, principal));
    for ch in read.as_slice() {
        p.allow_sub(n.chat_read_subject(ch));
    }
    p
}

/// `supervisor`: the admin-rail caller (reference `endpoint-evictor` shape): its own
/// `ctl.delivery-admin.<o>.<a>` request subject, `$JS.API.INFO`, its reply subtree and inbox.
fn supervisor(n: &SpaceNames, user_nkey: &str, principal: &Principal) -> Permissions {
    let mut p = Permissions::default();
    p.allow_pub(n.ctl_subject(CtlService::DeliveryAdmin, principal))
        .allow_pub(js::API_INFO);
    p.allow_sub(n.ctl_reply_subtree(CtlService::DeliveryAdmin, principal))
        .allow_sub(own_inbox(user_nkey));
    p
}

/// `inspector`: what `pending` and `members` read, nothing else. `INBOX_<s>` and `DLV_<s>`:
/// stream info, leader-served message gets (an owed entry's channel and age), the `reader`
/// durable's info and the `dlv_` durables' info (their ack floors). The members, ACL and presence
/// buckets: stream info (key listing, [`crate::kv`]) and message gets (rows). No
/// `$JS.API.INFO`, no consumer create, no publish to any data subject or `$KV` key.
fn inspector(n: &SpaceNames, user_nkey: &str) -> Permissions {
    let inbox = n.inbox_stream();
    let dlv = n.dlv_stream();
    let mut p = Permissions::default();
    p.allow_pub(js::stream_info(&inbox))
        .allow_pub(js::stream_msg_get(&inbox))
        .allow_pub(js::consumer_info(&inbox, crate::wire::READER_DURABLE))
        .allow_pub(js::stream_info(&dlv))
        .allow_pub(js::stream_msg_get(&dlv))
        .allow_pub(js::consumer_info_any(&dlv));
    for bucket in [n.members_bucket(), n.acl_bucket(), n.presence_bucket()] {
        let stream = SpaceNames::kv_stream(&bucket);
        p.allow_pub(js::stream_info(&stream))
            .allow_pub(js::stream_msg_get(&stream));
    }
    p.allow_sub(own_inbox(user_nkey));
    p
}

/// `provisioner`: the JetStream API for this space's streams, buckets and consumers only:
/// stream create/update/info and consumer create/info on each, never delete or purge, and no
/// data subjects.
fn provisioner(n: &SpaceNames, user_nkey: &str) -> Permissions {
    let mut p = Permissions::default();
    p.allow_pub(js::API_INFO);
    for stream in space_stream_names(n) {
        p.allow_pub(js::stream_create(&stream))
            .allow_pub(js::stream_update(&stream))
            .allow_pub(js::stream_info(&stream))
            .allow_pub(js::consumer_create_bare(&stream))
            .allow_pub(js::consumer_create_any(&stream))
            .allow_pub(js::consumer_durable_create_any(&stream))
            .allow_pub(js::consumer_info_any(&stream));
    }
    p.allow_sub(own_inbox(user_nkey));
    p
}

/// Every stream a space owns, KV backing streams included, in provisioning order.
pub fn space_stream_names(n: &SpaceNames) -> Vec<String> {
    let mut out = vec![
        n.chat_stream(),
        n.dm_stream(),
        n.task_stream(),
        n.inbox_stream(),
        n.dlv_stream(),
        n.ept_req_stream(),
        n.ept_stream(),
    ];
    out.extend(
        space_bucket_names(n)
            .iter()
            .map(|b| SpaceNames::kv_stream(b)),
    );
    out
}

/// Every KV bucket a space owns, in provisioning order.
pub fn space_bucket_names(n: &SpaceNames) -> Vec<String> {
    vec![
        n.presence_bucket(),
        n.channels_bucket(),
        n.members_bucket(),
        n.acl_bucket(),
        n.delivery_bucket(),
        n.membership_bucket(),
        n.records_bucket(),
        n.anycast_bucket(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Space;

    const NKEY: &str = "UABC";

    fn names() -> SpaceNames {
        SpaceNames::new(&Space::parse("demo").unwrap())
    }

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn delivery_profile_is_the_reference_list_plus_design_corrections() {
        let p = Profile::Delivery.permissions(&names(), NKEY);
        let mut expected = v(&[
            "$JS.API.INFO",
            "$JS.API.STREAM.INFO.CHAT_demo",
            "$JS.API.STREAM.INFO.INBOX_demo",
            "$JS.API.STREAM.INFO.DLV_demo",
            "$JS.API.CONSUMER.CREATE.CHAT_demo",
            "$JS.API.CONSUMER.CREATE.CHAT_demo.>",
            "$JS.API.CONSUMER.DURABLE.CREATE.CHAT_demo.>",
            "$JS.API.CONSUMER.INFO.CHAT_demo.>",
            "$JS.API.CONSUMER.MSG.NEXT.CHAT_demo.>",
            "$JS.API.CONSUMER.DELETE.CHAT_demo.>",
            "$JS.ACK.CHAT_demo.>",
            "$JS.API.CONSUMER.CREATE.INBOX_demo.reader.>",
            "$JS.API.CONSUMER.DURABLE.CREATE.INBOX_demo.reader",
            "$JS.API.CONSUMER.INFO.INBOX_demo.reader",
            "$JS.API.CONSUMER.MSG.NEXT.INBOX_demo.reader",
            "$JS.API.CONSUMER.DELETE.INBOX_demo.reader",
            "$JS.ACK.INBOX_demo.reader.>",
            "$JS.FC.>",
        ]);
        for b in ["presence", "channels", "members", "acl"] {
            let s = format!("KV_cotal_{b}_demo");
            expected.extend([
                format!("$JS.API.STREAM.INFO.{s}"),
                format!("$JS.API.STREAM.MSG.GET.{s}"),
                format!("$JS.API.CONSUMER.CREATE.{s}.>"),
                format!("$JS.API.CONSUMER.INFO.{s}.>"),
                format!("$JS.API.CONSUMER.DELETE.{s}.>"),
            ]);
        }
        expected.extend(v(&[
            "$KV.cotal_members_demo.>",
            "$JS.API.STREAM.INFO.KV_cotal_delivery_demo",
            "$JS.API.STREAM.MSG.GET.KV_cotal_delivery_demo",
            "$JS.API.CONSUMER.CREATE.KV_cotal_delivery_demo.>",
            "$JS.API.CONSUMER.INFO.KV_cotal_delivery_demo.>",
            "$JS.API.CONSUMER.DELETE.KV_cotal_delivery_demo.>",
            "$KV.cotal_delivery_demo.lease.*",
            "$JS.API.CONSUMER.CREATE.EPT_REQ_demo.timerw_demo.cotal.demo.ept.*.*.*.*.schedule",
            "$JS.API.CONSUMER.INFO.EPT_REQ_demo.timerw_demo",
            "$JS.API.CONSUMER.MSG.NEXT.EPT_REQ_demo.timerw_demo",
            "$JS.ACK.EPT_REQ_demo.timerw_demo.>",
            "$JS.API.CONSUMER.DURABLE.CREATE.EPT_REQ_demo.timerw_demo",
            "$JS.API.STREAM.INFO.EPT_REQ_demo",
            "$JS.API.STREAM.INFO.EPT_demo",
            "$JS.API.STREAM.MSG.GET.EPT_demo",
            "$JS.API.STREAM.INFO.KV_cotal_records_demo",
            "$JS.API.STREAM.MSG.GET.KV_cotal_records_demo",
            "cotal.demo.ept.*.*.*.*.armed",
            "cotal.demo.dinbox.*.*.*",
            "cotal.demo.dlv.*.*.*",
            "$JS.API.STREAM.MSG.DELETE.INBOX_demo",
            "cotal.demo.ctl.delivery.*.*.reply.>",
            "cotal.demo.ctl.delivery-admin.*.*.reply.>",
            "cotal.demo.live.delivery.*.*.reply.>",
            // Anycast take records (docs/anycast.md).
            "$JS.API.STREAM.INFO.KV_cotal_anycast_demo",
            "$JS.API.STREAM.MSG.GET.KV_cotal_anycast_demo",
            "$JS.API.CONSUMER.CREATE.KV_cotal_anycast_demo.>",
            "$JS.API.CONSUMER.INFO.KV_cotal_anycast_demo.>",
            "$JS.API.CONSUMER.DELETE.KV_cotal_anycast_demo.>",
            "$JS.API.STREAM.INFO.TASK_demo",
            "$JS.API.STREAM.MSG.GET.TASK_demo",
            "$JS.API.STREAM.MSG.DELETE.TASK_demo",
            "$KV.cotal_anycast_demo.>",
            "cotal.demo.ctl.anycast.*.*.reply.>",
            "cotal.demo.inst.*.*.local.UABC",
        ]));
        assert_eq!(p.pub_allow, expected);
        assert_eq!(
            p.sub_allow,
            v(&[
                "_INBOX_UABC.>",
                "cotal.demo.ctl.delivery.*.*",
                "cotal.demo.ctl.delivery-admin.*.*",
                "cotal.demo.ctl.anycast.*.*",
                "cotal.demo.live.delivery.*.*",
            ])
        );
        assert!(p.pub_deny.is_empty() && p.sub_deny.is_empty());
        // Confinement: no native chat/dinbox/dlv subscription, no request-subject publish.
        assert!(!p
            .sub_allow
            .iter()
            .any(|s| s.contains(".chat.") || s.contains(".dinbox.") || s.contains(".dlv.")));
        assert!(!p
            .pub_allow
            .iter()
            .any(|s| s == "cotal.demo.ctl.delivery.*.*"));
    }

    #[test]
    fn membership_rw_profile_is_exact() {
        let p = Profile::MembershipRw.permissions(&names(), NKEY);
        let mut expected = v(&["$JS.API.INFO"]);
        for b in ["members", "membership"] {
            let s = format!("KV_cotal_{b}_demo");
            expected.extend([
                format!("$JS.API.STREAM.INFO.{s}"),
                format!("$JS.API.STREAM.MSG.GET.{s}"),
                format!("$JS.API.CONSUMER.CREATE.{s}.>"),
                format!("$JS.API.CONSUMER.INFO.{s}.>"),
                format!("$JS.API.CONSUMER.DELETE.{s}.>"),
            ]);
        }
        expected.extend(v(&["$KV.cotal_membership_demo.>", "$JS.FC.>"]));
        assert_eq!(p.pub_allow, expected);
        assert_eq!(p.sub_allow, v(&["_INBOX_UABC.>"]));
    }

    /// The agent's grants, exactly; with a role, bind-only on that role's durable and nothing
    /// on another's. Mutation seen caught: granting `consumer_info_any(&task)` instead of the
    /// role's own durable (the list differs).
    #[test]
    fn agent_profile_is_scoped_to_principal_and_lifecycle() {
        let principal = Principal::parse("local.alice").unwrap();
        let uid = LifecycleUid::parse("abcdefghijklmnopqrstuvwxyz").unwrap();
        let read = ReadChannels::new(["general", "eng.>", "general"]).unwrap();
        let p = Profile::Agent {
            principal,
            lifecycle_uid: uid,
            read,
            roles: Roles::new(["review", "review"]).unwrap(),
        }
        .permissions(&names(), NKEY);
        let d = "dlv_local-alice-abcdefghijklmnopqrstuvwxyz";
        assert_eq!(
            p.pub_allow,
            vec![
                "cotal.demo.chat.local.alice.>".to_string(),
                "cotal.demo.ctl.delivery.local.alice".to_string(),
                "cotal.demo.live.delivery.local.alice".to_string(),
                "cotal.demo.ctl.anycast.local.alice".to_string(),
                "cotal.demo.svc.*.local.alice".to_string(),
                "$JS.API.STREAM.INFO.TASK_demo".to_string(),
                format!("$JS.API.CONSUMER.INFO.DLV_demo.{d}"),
                format!("$JS.API.CONSUMER.MSG.NEXT.DLV_demo.{d}"),
                format!("$JS.ACK.DLV_demo.{d}.>"),
                "$JS.API.STREAM.INFO.KV_cotal_delivery_demo".to_string(),
                "$JS.API.STREAM.MSG.GET.KV_cotal_delivery_demo".to_string(),
                "$JS.API.STREAM.INFO.KV_cotal_presence_demo".to_string(),
                "$KV.cotal_presence_demo.local.alice".to_string(),
                "$JS.API.CONSUMER.INFO.TASK_demo.svc_review".to_string(),
                "$JS.API.CONSUMER.MSG.NEXT.TASK_demo.svc_review".to_string(),
                "$JS.ACK.TASK_demo.svc_review.>".to_string(),
            ]
        );
        assert_eq!(
            p.pub_deny,
            v(&[
                "$JS.API.CONSUMER.CREATE.DLV_demo",
                "$JS.API.CONSUMER.CREATE.DLV_demo.>",
                "$JS.API.CONSUMER.DURABLE.CREATE.DLV_demo.>",
                "$JS.API.CONSUMER.CREATE.TASK_demo",
                "$JS.API.CONSUMER.CREATE.TASK_demo.>",
                "$JS.API.CONSUMER.DURABLE.CREATE.TASK_demo.>",
            ])
        );
        assert_eq!(
            p.sub_allow,
            v(&[
                "_INBOX_UABC.>",
                "cotal.demo.ctl.delivery.local.alice.reply.>",
                "cotal.demo.live.delivery.local.alice.reply.>",
                "cotal.demo.ctl.anycast.local.alice.reply.>",
                "cotal.demo.chat.*.*.general",
                "cotal.demo.chat.*.*.eng.>",
            ])
        );
        assert!(!p.pub_allow.iter().any(|s| s.contains("INBOX_demo")));
        // Without a role: no grant on any TASK consumer at all.
        let none = Profile::Agent {
            principal: Principal::parse("local.alice").unwrap(),
            lifecycle_uid: LifecycleUid::parse("abcdefghijklmnopqrstuvwxyz").unwrap(),
            read: ReadChannels::new(["general"]).unwrap(),
            roles: Roles::none(),
        }
        .permissions(&names(), NKEY);
        assert!(!none
            .pub_allow
            .iter()
            .any(|s| s.contains("CONSUMER") && s.contains("TASK_demo")
                || s.starts_with("$JS.ACK.TASK")));
    }

    /// Roles are single tokens; a wildcard or dotted role is refused, never rewritten.
    #[test]
    fn roles_refuse_wildcards_and_dots() {
        for bad in ["*", ">", "a.b", "", "re view"] {
            assert_eq!(
                Roles::new([bad]).unwrap_err().kind(),
                crate::wire::WireErrorKind::Role,
                "{bad:?}"
            );
        }
        assert_eq!(Roles::new(["a-b_1"]).unwrap().names(), vec!["a-b_1"]);
    }

    /// The inspector reads and never writes: exactly these grants. Mutation seen caught: adding
    /// `consumer_create_any(&dlv)` to `inspector` (the list differs).
    #[test]
    fn inspector_profile_is_read_only() {
        let p = Profile::Inspector.permissions(&names(), NKEY);
        assert_eq!(
            p.pub_allow,
            v(&[
                "$JS.API.STREAM.INFO.INBOX_demo",
                "$JS.API.STREAM.MSG.GET.INBOX_demo",
                "$JS.API.CONSUMER.INFO.INBOX_demo.reader",
                "$JS.API.STREAM.INFO.DLV_demo",
                "$JS.API.STREAM.MSG.GET.DLV_demo",
                "$JS.API.CONSUMER.INFO.DLV_demo.>",
                "$JS.API.STREAM.INFO.KV_cotal_members_demo",
                "$JS.API.STREAM.MSG.GET.KV_cotal_members_demo",
                "$JS.API.STREAM.INFO.KV_cotal_acl_demo",
                "$JS.API.STREAM.MSG.GET.KV_cotal_acl_demo",
                "$JS.API.STREAM.INFO.KV_cotal_presence_demo",
                "$JS.API.STREAM.MSG.GET.KV_cotal_presence_demo",
            ])
        );
        assert!(p.pub_deny.is_empty() && p.sub_deny.is_empty());
        assert_eq!(p.sub_allow, v(&["_INBOX_UABC.>"]));
        assert!(Profile::Inspector.tags().is_empty());
    }

    /// Mutation: dropping the tags from `Profile::tags` (or tagging the daemon) fails here.
    #[test]
    fn principals_carry_owner_actor_and_principal_tags() {
        let principal = Principal::parse("local.alice").unwrap();
        let agent = Profile::Agent {
            roles: Roles::none(),
            principal: principal.clone(),
            lifecycle_uid: LifecycleUid::parse("abcdefghijklmnopqrstuvwxyz").unwrap(),
            read: ReadChannels::new(["general"]).unwrap(),
        };
        let want = v(&["owner:local", "actor:alice", "principal:local.alice"]);
        assert_eq!(agent.tags(), want);
        assert_eq!(Profile::Supervisor { principal }.tags(), want);
        assert!(Profile::Delivery.tags().is_empty());
        assert!(Profile::Operator.tags().is_empty());
    }

    #[test]
    fn bad_read_channels_are_refused_with_value_and_rule() {
        let err = ReadChannels::new(["ok", "eng.>.x"]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("\"eng.>.x\""), "{msg}");
        assert!(msg.contains("last segment"), "{msg}");
        assert!(ReadChannels::new(["a b"]).is_err());
    }

    #[test]
    fn supervisor_provisioner_and_system_profiles() {
        let principal = Principal::parse("local.boss").unwrap();
        let p = Profile::Supervisor { principal }.permissions(&names(), NKEY);
        assert_eq!(
            p.pub_allow,
            v(&["cotal.demo.ctl.delivery-admin.local.boss", "$JS.API.INFO"])
        );
        assert_eq!(
            p.sub_allow,
            v(&[
                "cotal.demo.ctl.delivery-admin.local.boss.reply.>",
                "_INBOX_UABC.>"
            ])
        );

        let p = Profile::Provisioner.permissions(&names(), NKEY);
        assert!(p
            .pub_allow
            .contains(&"$JS.API.STREAM.CREATE.KV_cotal_records_demo".into()));
        assert!(p
            .pub_allow
            .contains(&"$JS.API.CONSUMER.CREATE.DLV_demo.>".into()));
        assert!(!p
            .pub_allow
            .iter()
            .any(|s| s.contains("DELETE") || s.contains("PURGE")));
        assert!(!p.pub_allow.iter().any(|s| s.starts_with("cotal.")));
        assert_eq!(p.pub_allow.len(), 1 + 7 * 15);

        let o = SystemProfile::MembershipObserver.permissions("AACC");
        assert_eq!(o.pub_allow, v(&["$SYS.REQ.ACCOUNT.AACC.CONNZ"]));
        assert_eq!(
            o.sub_allow,
            v(&[
                "_INBOX.cotal-membership.>",
                "$SYS.ACCOUNT.AACC.CONNECT",
                "$SYS.ACCOUNT.AACC.DISCONNECT"
            ])
        );
        let e = SystemProfile::ConnectionEvictor.permissions("AACC");
        assert_eq!(e.pub_allow, v(&["$SYS.REQ.SERVER.*.KICK"]));
        assert_eq!(e.sub_allow, v(&["_INBOX.>"]));
    }
}
