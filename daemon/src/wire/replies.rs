//! The control rails' reply shapes and the `live.delivery` answer, as typed structs in the
//! reference's key order.
//!
//! Why structs, not `serde_json::Value`: serde_json without `preserve_order` writes a `Value`
//! map with its keys sorted, so `evictPrincipals` came out as `kicked, principal, …` while the
//! reference writes `principal, kicked, remaining, verifiedGone, scanComplete, note?`. A struct
//! serializes its fields in declaration order, so each shape below is declared in the order the
//! reference (or, for our own verbs, docs/admin.md and docs/anycast.md) writes it. A field that
//! today's reply writes as `null` when absent keeps doing so; one that it leaves out is
//! `skip_serializing_if`.

use serde::Serialize;

/// Every reply `data` a rail answers with (serialized as the variant's own shape).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ReplyData {
    Joined(Joined),
    Left(Left),
    Memberships(Memberships),
    AnycastStatus(AnycastStatus),
    AnycastCancelled(AnycastCancelled),
    Took(Took),
    Credentials(ReloadedCredentials),
    StoreIdentity(StoreIdentityReply),
    Eviction(EvictionResult),
    Evictions(Vec<EvictionResult>),
    PrincipalLiveness(PrincipalLiveness),
    PlaneLiveness(PlaneLiveness),
    Inventory(Inventory),
}

/// `durableJoin`: `{durable, reason?, generation}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Joined {
    pub durable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub generation: u64,
}

/// `durableLeave`: `{channel, alreadyLeft?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Left {
    pub channel: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub already_left: bool,
}

/// `listMemberships`: `{memberships: [{channel, generation, activated}]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Memberships {
    pub memberships: Vec<Membership>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Membership {
    pub channel: String,
    pub generation: u64,
    pub activated: bool,
}

/// `anycastStatus`: `{seq, state, holder, previousHolder, moves, takenAt, cancelledAt, inQueue}`
/// for a request with a row (absent values written `null`), `{seq, state: "queued", inQueue}`
/// for one only queued (docs/anycast.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AnycastStatus {
    pub seq: u64,
    pub state: String,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub row: Option<AnycastRowStatus>,
    pub in_queue: bool,
}

/// The row's part of an [`AnycastStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AnycastRowStatus {
    pub holder: Option<String>,
    pub previous_holder: Option<String>,
    pub moves: u32,
    pub taken_at: Option<u64>,
    pub cancelled_at: Option<u64>,
}

/// `anycastCancel`: `{seq, state: "cancelled", deleted}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AnycastCancelled {
    pub seq: u64,
    pub state: &'static str,
    pub deleted: bool,
}

/// `take` on the take rail: `{seq, took, holder, sender}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Took {
    pub seq: u64,
    pub took: &'static str,
    pub holder: Option<String>,
    pub sender: String,
}

/// `reloadCreds`: `{delivery, membership}`, both always reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReloadedCredentials {
    pub delivery: CredentialOutcome,
    pub membership: CredentialOutcome,
}

/// One component of `reloadCreds`: `{ok, brokerAccepted?, residentSwap?}`, `{ok: false,
/// error}`, or `{skipped}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum CredentialOutcome {
    Accepted(Accepted),
    Failed(Failed),
    Skipped(Skipped),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Accepted {
    pub ok: bool,
    pub broker_accepted: BrokerAccepted,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resident_swap: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failed {
    pub ok: bool,
    pub error: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub skipped: String,
}

/// What the broker accepted on a disposable connection: `{identity, exp}` (`exp` `null` for a
/// JWT without one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BrokerAccepted {
    pub identity: String,
    pub exp: Option<i64>,
}

/// `reloadStoreIdentity`: `{kind: "fs", root, storeId?}` or `{kind: "injected", coordinate}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum StoreIdentityReply {
    Fs {
        root: String,
        #[serde(rename = "storeId", skip_serializing_if = "Option::is_none")]
        store_id: Option<String>,
    },
    Injected {
        coordinate: String,
    },
}

/// The reference `EvictionResult`: `{principal, kicked, remaining, verifiedGone, scanComplete,
/// note?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictionResult {
    pub principal: String,
    pub kicked: u64,
    pub remaining: u64,
    pub verified_gone: bool,
    pub scan_complete: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// `principalLiveness`: `{principal, state, sweepComplete, note?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PrincipalLiveness {
    pub principal: String,
    pub state: &'static str,
    pub sweep_complete: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// `planeConnLiveness`: `{ledger: {tuple, state}, records: {tuple, state}, sweepComplete,
/// note?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlaneLiveness {
    pub ledger: TupleState,
    pub records: TupleState,
    pub sweep_complete: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One judged connection tuple: `{tuple: {serverId, cid, userNkey}, state}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TupleState {
    pub tuple: ConnTuple,
    pub state: &'static str,
}

/// A plane claim's connection tuple, closed: `{serverId, cid, userNkey}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnTuple {
    pub server_id: String,
    pub cid: u64,
    pub user_nkey: String,
}

/// `lifecycleMemberships`: `{principal, lifecycleUid, fenced, read, memberships: [...]}`
/// (docs/admin.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    pub principal: String,
    pub lifecycle_uid: String,
    pub fenced: bool,
    pub read: u64,
    pub memberships: Vec<InventoryRow>,
}

/// `{channel, generation, activated, joinCursor, leaveCursor?, revision}` (tombstones
/// included).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryRow {
    pub channel: String,
    pub generation: u64,
    pub activated: bool,
    pub join_cursor: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leave_cursor: Option<u64>,
    pub revision: u64,
}

/// The `live.delivery` answer: `{plane, responder, instance}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LivenessAnswer {
    pub plane: &'static str,
    pub responder: &'static str,
    pub instance: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(v: &impl Serialize) -> String {
        serde_json::to_string(v).unwrap_or_default()
    }

    /// The shapes write their keys in the reference's order. Mutation seen failing: building
    /// the eviction result through `serde_json::to_value` (keys sorted).
    #[test]
    fn replies_keep_the_reference_key_order() {
        let r = EvictionResult {
            principal: "local.a".into(),
            kicked: 1,
            remaining: 0,
            verified_gone: true,
            scan_complete: true,
            note: None,
        };
        assert_eq!(
            json(&ReplyData::Evictions(vec![r])),
            r#"[{"principal":"local.a","kicked":1,"remaining":0,"verifiedGone":true,"scanComplete":true}]"#
        );
        let j = Joined {
            durable: false,
            reason: Some("why".into()),
            generation: 3,
        };
        assert_eq!(
            json(&j),
            r#"{"durable":false,"reason":"why","generation":3}"#
        );
        let l = Left {
            channel: "c".into(),
            already_left: true,
        };
        assert_eq!(json(&l), r#"{"channel":"c","alreadyLeft":true}"#);
        let q = AnycastStatus {
            seq: 4,
            state: "queued".into(),
            row: None,
            in_queue: true,
        };
        assert_eq!(json(&q), r#"{"seq":4,"state":"queued","inQueue":true}"#);
        let t = AnycastStatus {
            seq: 4,
            state: "taken".into(),
            row: Some(AnycastRowStatus {
                holder: Some("local.h".into()),
                previous_holder: None,
                moves: 0,
                taken_at: Some(9),
                cancelled_at: None,
            }),
            in_queue: false,
        };
        assert_eq!(
            json(&t),
            r#"{"seq":4,"state":"taken","holder":"local.h","previousHolder":null,"moves":0,"takenAt":9,"cancelledAt":null,"inQueue":false}"#
        );
        let fs = StoreIdentityReply::Fs {
            root: "/r".into(),
            store_id: Some("u".into()),
        };
        assert_eq!(json(&fs), r#"{"kind":"fs","root":"/r","storeId":"u"}"#);
        let a = LivenessAnswer {
            plane: "delivery",
            responder: "bound",
            instance: "i".into(),
        };
        assert_eq!(
            json(&a),
            r#"{"plane":"delivery","responder":"bound","instance":"i"}"#
        );
    }
}
