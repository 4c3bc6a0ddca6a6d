//! The wire ring, at the bottom of the house: what a TypeScript Cotal agent and this daemon must
//! agree on byte for byte.
//!
//! Owns the token grammar and its refusals ([`grammar`]), every subject, stream, consumer, bucket
//! and key name ([`names`]), the rows several rings read and write ([`rows`]), the INBOX entry and
//! the DLV frame ([`frames`]), the control rails' envelope and refusals ([`control`]), their
//! requests as types ([`requests`]) and their replies in the reference's key order
//! ([`replies`]). Invariant: a name is spelled only here, a malformed token is refused with the
//! value and the rule it broke, and a request is parsed once, where a rail receives it.
//! Imports nothing of this crate; every other ring may import it.

mod control;
mod frames;
mod grammar;
mod names;
mod replies;
mod requests;
mod rows;

pub use control::{ControlReply, ControlRequest, Refusal, RefusalKind, SENDER_MISMATCH};
pub use frames::{
    authenticated_channel_message, dedup_id, dedup_id_of, mentions, message_id, parse_chat_subject,
    parse_dinbox_subject, sender_id, EntryRead, Plane3DeliveryFrame, Plane3Entry, Reason,
};
pub use grammar::{
    channel_matches, space_key, space_segment, token, validate_actor, validate_channel,
    validate_owner, LifecycleUid, Principal, Role, Space, WireError, WireErrorKind,
    MAX_ACTOR_LENGTH, MAX_CHANNEL_LENGTH, MAX_ROLE_LENGTH, MAX_SPACE_LENGTH,
};
pub use names::{
    inbox_prefix, CtlService, LifecycleNames, SpaceNames, DELIVERY_FRAME_HEADER, FANOUT_DURABLE,
    LEASE_KEY, MEMBERSHIP_OBSERVER_INBOX_PREFIX, READER_DURABLE,
};
pub use replies::{
    Accepted, AnycastCancelled, AnycastRowStatus, AnycastStatus, BrokerAccepted, ConnTuple,
    CredentialOutcome, EvictionResult, Failed, Inventory, InventoryRow, Joined, Left,
    LivenessAnswer, Membership, Memberships, PlaneLiveness, PrincipalLiveness, ReloadedCredentials,
    ReplyData, Skipped, StoreIdentityReply, Took, TupleState,
};
pub use requests::{
    AdminRequest, AnycastSeq, DeliveryRequest, DurableJoin, DurableLeave, EvictPrincipal,
    EvictPrincipals, LifecycleMemberships, ListMemberships, PlaneConnQuery, PrincipalLivenessQuery,
    ReloadCreds, ReloadStoreIdentity, StoreChallenge, Take, TakeRequest, EVICT_PRINCIPALS_MAX,
    JOIN_TIMEOUT,
};
pub use rows::{AclRecord, LeaseInfo, SHARD};

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
