//! Wire names and token grammar shared with the reference implementation.
//!
//! Every subject, stream, consumer, bucket and key the daemon touches is spelled here and only
//! here, so that a TypeScript Cotal agent and this daemon agree byte for byte. Validation lives at
//! this boundary too: a malformed space, principal, lifecycle or channel is refused with the value
//! and the rule it broke, never silently sanitized into some other name.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest channel name the spec admits (`MAX_CHANNEL_LENGTH`).
pub const MAX_CHANNEL_LENGTH: usize = 4096;
/// Longest space name we accept; it is embedded in stream, bucket and subject names.
pub const MAX_SPACE_LENGTH: usize = 64;
/// Longest actor token we accept (an nkey is 56 characters).
pub const MAX_ACTOR_LENGTH: usize = 128;
/// Longest role token we accept; it is embedded in the `svc_<role>` durable name.
pub const MAX_ROLE_LENGTH: usize = 64;

/// Why a wire token was refused. `kind()` lets a caller match; `Display` names the value and rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    kind: WireErrorKind,
    value: String,
    rule: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireErrorKind {
    Space,
    Owner,
    Actor,
    Principal,
    LifecycleUid,
    Channel,
    Role,
}

impl WireError {
    fn new(kind: WireErrorKind, value: &str, rule: &'static str) -> Self {
        WireError {
            kind,
            value: value.to_string(),
            rule,
        }
    }
    pub fn kind(&self) -> WireErrorKind {
        self.kind
    }
    pub fn value(&self) -> &str {
        &self.value
    }
    pub fn rule(&self) -> &'static str {
        self.rule
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            WireErrorKind::Space => "space name",
            WireErrorKind::Owner => "owner token",
            WireErrorKind::Actor => "actor token",
            WireErrorKind::Principal => "principal",
            WireErrorKind::LifecycleUid => "lifecycle uid",
            WireErrorKind::Channel => "channel",
            WireErrorKind::Role => "role",
        };
        write!(f, "invalid {what} {:?}: {}", self.value, self.rule)
    }
}

impl std::error::Error for WireError {}

/// The reference `token()`: every character outside `[A-Za-z0-9_-]` becomes `_`, empty becomes `_`.
/// Lossy by design and never decoded back.
pub fn token(raw: &str) -> String {
    if raw.is_empty() {
        return "_".to_string();
    }
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `spaceKey(space)`: the space name's UTF-8 bytes in lowercase hex. Injective and case-safe.
pub fn space_key(space: &str) -> String {
    space.bytes().map(|b| format!("{b:02x}")).collect()
}

/// `spaceSegment(space)`: the per-space material directory name under `.cotal/`.
pub fn space_segment(space: &str) -> String {
    format!("space.{}", space_key(space))
}

/// A validated space name. We accept only names that are already tokens, so that two spaces can
/// never sanitize onto the same streams and buckets.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Space(String);

impl Space {
    pub const RULE: &'static str =
        "a space name is 1 to 64 characters from [A-Za-z0-9_-]; it names streams, buckets and subjects verbatim";

    pub fn parse(raw: &str) -> Result<Space, WireError> {
        let ok = !raw.is_empty()
            && raw.len() <= MAX_SPACE_LENGTH
            && raw
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if ok {
            Ok(Space(raw.to_string()))
        } else {
            Err(WireError::new(WireErrorKind::Space, raw, Self::RULE))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The sanitized token used in stream and bucket names (equal to the name, by construction).
    pub fn token(&self) -> &str {
        &self.0
    }
    pub fn key(&self) -> String {
        space_key(&self.0)
    }
    pub fn segment(&self) -> String {
        space_segment(&self.0)
    }
    /// Subject prefix `cotal.<s>`.
    pub fn prefix(&self) -> String {
        format!("cotal.{}", self.0)
    }
}

impl fmt::Display for Space {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Owner token rule: `u_` + 26 base32 (derived user), `p_` + 26 base32 (platform), or `local`.
pub fn validate_owner(raw: &str) -> Result<(), WireError> {
    const RULE: &str =
        "an owner token is `local`, or `u_`/`p_` followed by 26 characters of [a-z2-7]";
    let derived = |prefix: &str| {
        raw.strip_prefix(prefix).is_some_and(|rest| {
            rest.len() == 26
                && rest
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || ('2'..='7').contains(&c))
        })
    };
    if raw == "local" || derived("u_") || derived("p_") {
        Ok(())
    } else {
        Err(WireError::new(WireErrorKind::Owner, raw, RULE))
    }
}

/// Actor token rule: `[A-Za-z0-9_]`, non-empty; `-` is reserved as the dash-form separator.
pub fn validate_actor(raw: &str) -> Result<(), WireError> {
    const RULE: &str =
        "an actor token is 1 to 128 characters from [A-Za-z0-9_] (`-` is reserved as the dash-form separator)";
    let ok = !raw.is_empty()
        && raw.len() <= MAX_ACTOR_LENGTH
        && raw.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(WireError::new(WireErrorKind::Actor, raw, RULE))
    }
}

/// A principal `<owner>.<actor>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Principal {
    owner: String,
    actor: String,
}

impl Principal {
    pub fn new(owner: &str, actor: &str) -> Result<Principal, WireError> {
        validate_owner(owner)?;
        validate_actor(actor)?;
        Ok(Principal {
            owner: owner.to_string(),
            actor: actor.to_string(),
        })
    }
    /// Parses the dot-form `<owner>.<actor>`.
    pub fn parse(dot_form: &str) -> Result<Principal, WireError> {
        match dot_form.split_once('.') {
            Some((owner, actor)) if !actor.contains('.') => Principal::new(owner, actor),
            _ => Err(WireError::new(
                WireErrorKind::Principal,
                dot_form,
                "a principal is `<owner>.<actor>` with exactly one dot",
            )),
        }
    }
    /// The principal a daemon or endpoint holding user nkey `U…` speaks as: `local.<nkey>`.
    pub fn for_nkey(user_public_key: &str) -> Result<Principal, WireError> {
        Principal::new("local", user_public_key)
    }
    pub fn owner(&self) -> &str {
        &self.owner
    }
    pub fn actor(&self) -> &str {
        &self.actor
    }
    pub fn dot_form(&self) -> String {
        format!("{}.{}", self.owner, self.actor)
    }
    pub fn dash_form(&self) -> String {
        format!("{}-{}", self.owner, self.actor)
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.owner, self.actor)
    }
}

/// A lifecycle UID `[a-z0-9]{26,32}`, never reused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LifecycleUid(String);

impl LifecycleUid {
    pub fn parse(raw: &str) -> Result<LifecycleUid, WireError> {
        let ok = (26..=32).contains(&raw.len())
            && raw
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if ok {
            Ok(LifecycleUid(raw.to_string()))
        } else {
            Err(WireError::new(
                WireErrorKind::LifecycleUid,
                raw,
                "a lifecycle uid is 26 to 32 characters from [a-z0-9]",
            ))
        }
    }
    /// A fresh 32-character uid from 128 random bits (lowercase hex).
    pub fn generate() -> LifecycleUid {
        LifecycleUid(uuid::Uuid::new_v4().simple().to_string())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LifecycleUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An anycast role: one `[A-Za-z0-9_-]` token (the reference's 0.71 role grammar; `*` and any
/// other wildcard are refused, never rewritten). It names the request subject's role token and
/// the role's shared durable `svc_<role>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Role(String);

impl Role {
    pub fn parse(raw: &str) -> Result<Role, WireError> {
        if raw.is_empty() || raw.len() > MAX_ROLE_LENGTH {
            return Err(WireError::new(
                WireErrorKind::Role,
                raw,
                "a role is 1 to 64 characters",
            ));
        }
        if !raw
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(WireError::new(
                WireErrorKind::Role,
                raw,
                "a role is one token of [A-Za-z0-9_-] (no `.`, `*` or `>`)",
            ));
        }
        Ok(Role(raw.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A channel name: dotted segments of `[A-Za-z0-9_-]`; `*` and `>` only as whole segments, `>`
/// only last. `concrete` additionally forbids wildcards (publish targets, membership rows).
pub fn validate_channel(raw: &str, concrete: bool) -> Result<(), WireError> {
    let fail = |rule: &'static str| Err(WireError::new(WireErrorKind::Channel, raw, rule));
    if raw.is_empty() || raw.len() > MAX_CHANNEL_LENGTH {
        return fail("a channel is 1 to 4096 characters");
    }
    let segments: Vec<&str> = raw.split('.').collect();
    for (i, seg) in segments.iter().enumerate() {
        if seg.is_empty() {
            return fail("a channel is dot-separated non-empty segments");
        }
        if *seg == "*" || *seg == ">" {
            if concrete {
                return fail("a concrete channel has no `*` or `>` segment");
            }
            if *seg == ">" && i + 1 != segments.len() {
                return fail("`>` is allowed only as the last segment");
            }
            continue;
        }
        if !seg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return fail("channel segments use [A-Za-z0-9_-]; `*` and `>` only as whole segments");
        }
    }
    Ok(())
}

/// NATS-style subject match of a channel against a grant pattern (`*` one segment, `>` the rest).
pub fn channel_matches(pattern: &str, channel: &str) -> bool {
    let mut p = pattern.split('.');
    let mut c = channel.split('.');
    loop {
        match (p.next(), c.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Every name derived from one space: streams, buckets, subjects and durables.
#[derive(Debug, Clone)]
pub struct SpaceNames {
    space: Space,
}

/// Durable name of the fan-out writer on `CHAT_<s>`.
pub const FANOUT_DURABLE: &str = "fanout";
/// Durable name of the trusted reader on `INBOX_<s>`.
pub const READER_DURABLE: &str = "reader";
/// The lease key for the only shard (N=1).
pub const LEASE_KEY: &str = "lease.0";
/// Header that marks an authorized handoff frame on `DLV_<s>`.
pub const DELIVERY_FRAME_HEADER: &str = "Cotal-Delivery-Frame";

impl SpaceNames {
    pub fn new(space: &Space) -> SpaceNames {
        SpaceNames {
            space: space.clone(),
        }
    }
    pub fn space(&self) -> &Space {
        &self.space
    }
    fn s(&self) -> &str {
        self.space.token()
    }
    fn p(&self) -> String {
        self.space.prefix()
    }

    pub fn chat_stream(&self) -> String {
        format!("CHAT_{}", self.s())
    }
    pub fn dm_stream(&self) -> String {
        format!("DM_{}", self.s())
    }
    pub fn task_stream(&self) -> String {
        format!("TASK_{}", self.s())
    }
    pub fn inbox_stream(&self) -> String {
        format!("INBOX_{}", self.s())
    }
    pub fn dlv_stream(&self) -> String {
        format!("DLV_{}", self.s())
    }
    pub fn ept_req_stream(&self) -> String {
        format!("EPT_REQ_{}", self.s())
    }
    pub fn ept_stream(&self) -> String {
        format!("EPT_{}", self.s())
    }

    pub fn presence_bucket(&self) -> String {
        format!("cotal_presence_{}", self.s())
    }
    pub fn channels_bucket(&self) -> String {
        format!("cotal_channels_{}", self.s())
    }
    pub fn members_bucket(&self) -> String {
        format!("cotal_members_{}", self.s())
    }
    pub fn acl_bucket(&self) -> String {
        format!("cotal_acl_{}", self.s())
    }
    pub fn delivery_bucket(&self) -> String {
        format!("cotal_delivery_{}", self.s())
    }
    pub fn membership_bucket(&self) -> String {
        format!("cotal_membership_{}", self.s())
    }
    /// One row per anycast request a holder took or a sender cancelled (docs/anycast.md).
    pub fn anycast_bucket(&self) -> String {
        format!("cotal_anycast_{}", self.s())
    }
    pub fn records_bucket(&self) -> String {
        format!("cotal_records_{}", self.s())
    }
    /// Backing stream of a KV bucket.
    pub fn kv_stream(bucket: &str) -> String {
        format!("KV_{bucket}")
    }

    /// `cotal.<s>.chat.>`
    pub fn chat_all(&self) -> String {
        format!("{}.chat.>", self.p())
    }
    /// `cotal.<s>.chat.<o>.<a>.<channel>`
    pub fn chat_subject(&self, sender: &Principal, channel: &str) -> String {
        format!(
            "{}.chat.{}.{}.{}",
            self.p(),
            sender.owner(),
            sender.actor(),
            channel
        )
    }
    pub fn dm_all(&self) -> String {
        format!("{}.inst.>", self.p())
    }
    /// Unicast subject `cotal.<s>.inst.<recipO>.<recipA>.<sndO>.<sndA>`.
    pub fn dm_subject(&self, recipient: &Principal, sender: &Principal) -> String {
        format!(
            "{}.inst.{}.{}.{}.{}",
            self.p(),
            recipient.owner(),
            recipient.actor(),
            sender.owner(),
            sender.actor()
        )
    }
    /// DMs from `sender` to anyone: `cotal.<s>.inst.*.*.<sndO>.<sndA>` (the daemon's grant).
    pub fn dm_from_any(&self, sender: &Principal) -> String {
        format!(
            "{}.inst.*.*.{}.{}",
            self.p(),
            sender.owner(),
            sender.actor()
        )
    }
    /// A sender's anycast requests to any role: `cotal.<s>.svc.*.<o>.<a>` (its publish grant).
    pub fn anycast_send_grant(&self, sender: &Principal) -> String {
        format!("{}.svc.*.{}.{}", self.p(), sender.owner(), sender.actor())
    }
    /// An anycast request of `sender` to `role`: `cotal.<s>.svc.<role>.<o>.<a>`.
    pub fn anycast_subject(&self, role: &str, sender: &Principal) -> String {
        format!(
            "{}.svc.{role}.{}.{}",
            self.p(),
            sender.owner(),
            sender.actor()
        )
    }
    pub fn task_all(&self) -> String {
        format!("{}.svc.>", self.p())
    }
    /// The role's shared durable on `TASK_<s>`: `svc_<role>`.
    pub fn task_durable(role: &Role) -> String {
        format!("svc_{role}")
    }
    /// The role durable's filter: `cotal.<s>.svc.<role>.>`.
    pub fn task_role_filter(&self, role: &Role) -> String {
        format!("{}.svc.{role}.>", self.p())
    }
    pub fn dinbox_all(&self) -> String {
        format!("{}.dinbox.>", self.p())
    }
    /// `cotal.<s>.dinbox.<o>.<a>.<uid>`
    pub fn dinbox_subject(&self, member: &Principal, uid: &LifecycleUid) -> String {
        format!(
            "{}.dinbox.{}.{}.{}",
            self.p(),
            member.owner(),
            member.actor(),
            uid
        )
    }
    pub fn dlv_all(&self) -> String {
        format!("{}.dlv.>", self.p())
    }
    /// `cotal.<s>.dlv.<o>.<a>.<uid>`
    pub fn dlv_subject(&self, member: &Principal, uid: &LifecycleUid) -> String {
        format!(
            "{}.dlv.{}.{}.{}",
            self.p(),
            member.owner(),
            member.actor(),
            uid
        )
    }
    /// The agent's own handoff durable `dlv_<o>-<a>-<uid>`.
    pub fn dlv_durable(member: &Principal, uid: &LifecycleUid) -> String {
        format!("dlv_{}-{}", member.dash_form(), uid)
    }
    pub fn ept_schedule_filter(&self) -> String {
        format!("{}.ept.*.*.*.*.schedule", self.p())
    }
    pub fn ept_armed_filter(&self) -> String {
        format!("{}.ept.*.*.*.*.armed", self.p())
    }
    pub fn ept_fire_filter(&self) -> String {
        format!("{}.ept.*.*.*.*.fire", self.p())
    }

    /// Request subject `cotal.<s>.ctl.<service>.<o>.<a>` for a caller.
    pub fn ctl_subject(&self, service: CtlService, caller: &Principal) -> String {
        format!(
            "{}.ctl.{}.{}.{}",
            self.p(),
            service.as_str(),
            caller.owner(),
            caller.actor()
        )
    }
    /// What the daemon serves, queue-grouped: `cotal.<s>.ctl.<service>.*.*`.
    pub fn ctl_serve(&self, service: CtlService) -> String {
        format!("{}.ctl.{}.*.*", self.p(), service.as_str())
    }
    /// Reply leaf the daemon may publish on: `cotal.<s>.ctl.<service>.*.*.reply.>`.
    pub fn ctl_reply_grant(&self, service: CtlService) -> String {
        format!("{}.ctl.{}.*.*.reply.>", self.p(), service.as_str())
    }

    /// Liveness probe subject of a caller: `cotal.<s>.live.delivery.<o>.<a>`.
    pub fn live_delivery_subject(&self, caller: &Principal) -> String {
        format!(
            "{}.live.delivery.{}.{}",
            self.p(),
            caller.owner(),
            caller.actor()
        )
    }
    /// What the daemon's `live.delivery` responder serves: `cotal.<s>.live.delivery.*.*`.
    pub fn live_delivery_serve(&self) -> String {
        format!("{}.live.delivery.*.*", self.p())
    }
    /// Reply leaf the responder may publish on: `cotal.<s>.live.delivery.*.*.reply.>`.
    pub fn live_delivery_reply_grant(&self) -> String {
        format!("{}.live.delivery.*.*.reply.>", self.p())
    }
    /// A caller's probe reply subtree: `cotal.<s>.live.delivery.<o>.<a>.reply.>`.
    pub fn live_delivery_reply_subtree(&self, caller: &Principal) -> String {
        format!("{}.reply.>", self.live_delivery_subject(caller))
    }

    /// Every member's fan-out store subject `cotal.<s>.dinbox.*.*.*` (the daemon's publish grant).
    pub fn dinbox_any_member(&self) -> String {
        format!("{}.dinbox.*.*.*", self.p())
    }
    /// Every member's handoff subject `cotal.<s>.dlv.*.*.*` (the daemon's publish grant).
    pub fn dlv_any_member(&self) -> String {
        format!("{}.dlv.*.*.*", self.p())
    }
    /// Live read of one channel from any sender: `cotal.<s>.chat.*.*.<channel>` (a core
    /// subscription bounded by an agent's `sub.allow`; the channel may hold wildcards).
    pub fn chat_read_subject(&self, channel: &str) -> String {
        format!("{}.chat.*.*.{channel}", self.p())
    }
    /// Reply subtree of one caller on a rail: `cotal.<s>.ctl.<service>.<o>.<a>.reply.>`.
    pub fn ctl_reply_subtree(&self, service: CtlService, caller: &Principal) -> String {
        format!("{}.reply.>", self.ctl_subject(service, caller))
    }
    /// Durable of the checkpoint timer writer on `EPT_REQ_<s>`: `timerw_<s>`.
    pub fn timer_writer_durable(&self) -> String {
        format!("timerw_{}", self.s())
    }
    /// Presence key of an instance: its principal dot-form `<o>.<a>` (= `card.id`).
    pub fn presence_key(member: &Principal) -> String {
        member.dot_form()
    }
    /// Members registry key `<channel>/<o>.<a>.<uid>`.
    pub fn member_key(channel: &str, member: &Principal, uid: &LifecycleUid) -> String {
        format!("{channel}/{}.{uid}", member.dot_form())
    }
    /// ACL row key `<o>.<a>.<uid>`.
    pub fn acl_key(member: &Principal, uid: &LifecycleUid) -> String {
        format!("{}.{uid}", member.dot_form())
    }
}

/// Per-connection reply inbox prefix `_INBOX_<connId>` (no trailing dot). The matching grant is
/// `_INBOX_<connId>.>`; for a credential holder the connId is its own user nkey (DESIGN §6.1).
pub fn inbox_prefix(conn_id: &str) -> String {
    format!("_INBOX_{conn_id}")
}

/// Reply inbox prefix of the `$SYS` membership observer (`_INBOX.cotal-membership.…`).
pub const MEMBERSHIP_OBSERVER_INBOX_PREFIX: &str = "_INBOX.cotal-membership";

/// The two control rails the daemon serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtlService {
    Delivery,
    DeliveryAdmin,
    /// The anycast take rail: a holder's own take subject `cotal.<s>.ctl.anycast.<o>.<a>`
    /// (docs/anycast.md).
    Anycast,
}

impl CtlService {
    pub fn as_str(self) -> &'static str {
        match self {
            CtlService::Delivery => "delivery",
            CtlService::DeliveryAdmin => "delivery-admin",
            CtlService::Anycast => "anycast",
        }
    }
    /// The queue group the daemon serves the rail in.
    pub fn queue_group(self) -> &'static str {
        self.as_str()
    }
}

/// The read-ACL row of one lifecycle (`cotal_acl_<s>`, key `<o>.<a>.<uid>`):
/// `AclRecord` of the reference, plus the retirement tombstone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AclRecord {
    pub allow_subscribe: Vec<String>,
    /// Ceiling from the last credential issue; absent means equal to `allow_subscribe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_allow_subscribe: Option<Vec<String>>,
    #[serde(default)]
    pub revision: u64,
    #[serde(default)]
    pub updated_at: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retired: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_at: Option<u64>,
    /// The anycast roles this lifecycle serves (docs/anycast.md), written with the credential
    /// that grants their `svc_<role>` durables; absent means none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
}

impl AclRecord {
    pub fn new(allow_subscribe: Vec<String>, revision: u64, updated_at: u64) -> AclRecord {
        AclRecord {
            allow_subscribe,
            issued_allow_subscribe: None,
            revision,
            updated_at,
            retired: false,
            retired_at: None,
            roles: Vec::new(),
        }
    }
    /// Whether this lifecycle serves `role`: the row lists it and is not retired.
    pub fn serves(&self, role: &str) -> bool {
        !self.is_retired() && self.roles.iter().any(|r| r == role)
    }
    /// Whether the row carries the retirement tombstone.
    pub fn is_retired(&self) -> bool {
        self.retired || self.retired_at.is_some()
    }
    /// Whether the current read ACL covers `channel`: some `allowSubscribe` pattern matches it,
    /// and so does some pattern of the issued ceiling when there is one.
    pub fn covers(&self, channel: &str) -> bool {
        let allowed = self
            .allow_subscribe
            .iter()
            .any(|p| channel_matches(p, channel));
        let under_ceiling = match &self.issued_allow_subscribe {
            None => true,
            Some(ceiling) => ceiling.iter().any(|p| channel_matches(p, channel)),
        };
        allowed && under_ceiling && !self.is_retired()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_maps_outside_chars_to_underscore() {
        assert_eq!(token("a.b c"), "a_b_c");
        assert_eq!(token(""), "_");
        assert_eq!(token("Ok-1_x"), "Ok-1_x");
    }

    #[test]
    fn space_key_is_lowercase_hex_of_utf8() {
        assert_eq!(space_key("demo"), "64656d6f");
        assert_eq!(space_segment("A"), "space.41");
    }

    #[test]
    fn space_refusal_names_value_and_rule() {
        let e = Space::parse("bad.space").unwrap_err();
        assert_eq!(e.kind(), WireErrorKind::Space);
        assert!(e.to_string().contains("\"bad.space\""));
        assert!(e.to_string().contains("[A-Za-z0-9_-]"));
        assert!(Space::parse("").is_err());
        assert!(Space::parse(&"x".repeat(65)).is_err());
        assert!(Space::parse("team-1_a").is_ok());
    }

    #[test]
    fn principals_follow_the_owner_and_actor_grammar() {
        assert!(Principal::parse("local.alice").is_ok());
        assert!(Principal::parse("u_abcdefghijklmnopqrstuvwxyz.bot").is_ok());
        assert!(Principal::parse("u_short.bot").is_err());
        assert_eq!(
            Principal::parse("local.al-ice").unwrap_err().kind(),
            WireErrorKind::Actor
        );
        assert_eq!(
            Principal::parse("nodot").unwrap_err().kind(),
            WireErrorKind::Principal
        );
        assert_eq!(
            Principal::parse("a.b.c").unwrap_err().kind(),
            WireErrorKind::Principal
        );
        let p = Principal::parse("local.alice").unwrap();
        assert_eq!(p.dash_form(), "local-alice");
    }

    #[test]
    fn lifecycle_uids_are_26_to_32_lowercase_alnum() {
        assert!(LifecycleUid::parse(&"a".repeat(26)).is_ok());
        assert!(LifecycleUid::parse(&"a".repeat(25)).is_err());
        assert!(LifecycleUid::parse(&"A".repeat(26)).is_err());
        let g = LifecycleUid::generate();
        assert!(LifecycleUid::parse(g.as_str()).is_ok());
    }

    #[test]
    fn channel_grammar() {
        assert!(validate_channel("eng.alerts", true).is_ok());
        assert!(validate_channel("eng.*", false).is_ok());
        assert!(validate_channel("eng.*", true).is_err());
        assert!(validate_channel("eng.>.x", false).is_err());
        assert!(validate_channel("eng..x", false).is_err());
        assert!(validate_channel("eng.a b", false).is_err());
        assert!(validate_channel(&"a".repeat(4097), false).is_err());
    }

    #[test]
    fn channel_match_follows_nats_wildcards() {
        assert!(channel_matches("eng.>", "eng.a.b"));
        assert!(!channel_matches("eng.>", "eng"));
        assert!(channel_matches("eng.*", "eng.a"));
        assert!(!channel_matches("eng.*", "eng.a.b"));
        assert!(channel_matches("general", "general"));
    }

    #[test]
    fn names_match_the_reference() {
        let n = SpaceNames::new(&Space::parse("demo").unwrap());
        let p = Principal::parse("local.alice").unwrap();
        let uid = LifecycleUid::parse("abcdefghijklmnopqrstuvwxyz").unwrap();
        assert_eq!(n.chat_stream(), "CHAT_demo");
        assert_eq!(n.delivery_bucket(), "cotal_delivery_demo");
        assert_eq!(
            n.dinbox_subject(&p, &uid),
            "cotal.demo.dinbox.local.alice.abcdefghijklmnopqrstuvwxyz"
        );
        assert_eq!(
            SpaceNames::dlv_durable(&p, &uid),
            "dlv_local-alice-abcdefghijklmnopqrstuvwxyz"
        );
        assert_eq!(
            n.ctl_subject(CtlService::DeliveryAdmin, &p),
            "cotal.demo.ctl.delivery-admin.local.alice"
        );
        assert_eq!(
            SpaceNames::member_key("eng", &p, &uid),
            "eng/local.alice.abcdefghijklmnopqrstuvwxyz"
        );
    }
}
