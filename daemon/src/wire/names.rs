//! Every subject, stream, consumer, bucket and key the daemon touches, spelled here and only
//! here, so that a TypeScript Cotal agent and this daemon agree byte for byte.

use async_nats::Subject;

use super::grammar::{LifecycleUid, Principal, Role, Space};

/// Every name derived from one space: streams, buckets, subjects and durables.
#[derive(Debug, Clone)]
pub struct SpaceNames {
    space: Space,
    /// `cotal.<s>`, spelled once: the data path builds subjects from it per message.
    prefix: String,
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
            prefix: space.prefix(),
        }
    }
    pub fn space(&self) -> &Space {
        &self.space
    }
    /// `cotal.<s>` (the space's [`Space::prefix`]).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    fn s(&self) -> &str {
        self.space.token()
    }
    fn p(&self) -> &str {
        &self.prefix
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
    /// Every name the data path spells for one member lifecycle, built at once.
    pub fn lifecycle(&self, member: &Principal, uid: &LifecycleUid) -> LifecycleNames {
        let acl_key = concat(&[member.owner(), ".", member.actor(), ".", uid.as_str()]);
        let subject = |stream: &str| Subject::from(concat(&[self.p(), stream, &acl_key]));
        LifecycleNames {
            dinbox: subject(".dinbox."),
            dlv: subject(".dlv."),
            dedup_tail: concat(&[
                ":",
                member.owner(),
                ".",
                member.actor(),
                ":",
                uid.as_str(),
                ":",
            ]),
            member: member.clone(),
            uid: uid.clone(),
            acl_key,
        }
    }
}

/// The names of one member lifecycle on the data path, built once (per member row revision in
/// the fan-out writer, per INBOX subject in the trusted reader) rather than per copy and per
/// frame: they are a function of the space, the member and the lifecycle only, so building
/// them once changes no decision (docs/performance-history.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleNames {
    pub member: Principal,
    pub uid: LifecycleUid,
    /// [`SpaceNames::acl_key`]: `<o>.<a>.<uid>`.
    pub acl_key: String,
    /// [`SpaceNames::dinbox_subject`].
    pub dinbox: Subject,
    /// [`SpaceNames::dlv_subject`].
    pub dlv: Subject,
    /// `:<o>.<a>:<uid>:`, the dedup id between the message id and the generation.
    dedup_tail: String,
}

impl LifecycleNames {
    /// [`SpaceNames::member_key`] on `channel`.
    pub fn member_key(&self, channel: &str) -> String {
        concat(&[channel, "/", &self.acl_key])
    }

    /// [`crate::wire::dedup_id_of`]: `<id>:<o>.<a>:<uid>:<generation>`, `None` for an id-less
    /// message.
    pub fn dedup_id(&self, id: &str, generation: u64) -> Option<String> {
        if id.is_empty() {
            return None;
        }
        let mut out = String::with_capacity(id.len() + self.dedup_tail.len() + 20);
        out.push_str(id);
        out.push_str(&self.dedup_tail);
        push_decimal(&mut out, generation);
        Some(out)
    }
}

/// `parts` joined, in one allocation of the exact size.
fn concat(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        out.push_str(p);
    }
    out
}

/// Appends `n` in decimal (what `format!("{n}")` writes, without the formatting machinery).
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[at..].iter().map(|d| char::from(*d)));
}

/// Per-connection reply inbox prefix `_INBOX_<connId>` (no trailing dot). The matching grant is
/// `_INBOX_<connId>.>`; for a credential holder the connId is its own user nkey.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::dedup_id_of;

    /// Mutations seen failing: the dedup tail without its trailing `:` (the dedup id at
    /// generation 0), `push_decimal` stopping before a number's leading digit (generation 10),
    /// the DLV subject built on `.dinbox.` (the DLV subject).
    #[test]
    fn a_lifecycles_names_built_once_are_the_names_spelled_one_by_one() {
        let names = SpaceNames::new(&Space::parse("eng-1").unwrap());
        let member = Principal::parse("local.alice").unwrap();
        let uid = LifecycleUid::parse("abcdefghijklmnopqrstuvwxyz").unwrap();
        let built = names.lifecycle(&member, &uid);
        assert_eq!(built.member, member);
        assert_eq!(built.uid, uid);
        assert_eq!(built.acl_key, SpaceNames::acl_key(&member, &uid));
        assert_eq!(
            built.dinbox.as_str(),
            names.dinbox_subject(&member, &uid).as_str()
        );
        assert_eq!(
            built.dlv.as_str(),
            names.dlv_subject(&member, &uid).as_str()
        );
        assert_eq!(
            built.member_key("eng.alerts"),
            SpaceNames::member_key("eng.alerts", &member, &uid)
        );
        for generation in [0, 7, 10, 1_000_000, u64::MAX] {
            assert_eq!(
                built.dedup_id("m-1", generation),
                dedup_id_of("m-1", &member, &uid, generation),
                "generation {generation}"
            );
        }
        assert_eq!(
            built.dedup_id("", 3),
            None,
            "an id-less message has no dedup id"
        );
        assert_eq!(names.prefix(), names.space().prefix());
    }
}
