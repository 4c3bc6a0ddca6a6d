//! The control rails' requests as types: one enum per rail, one argument struct per verb.
//!
//! A rail parses a request once, where it arrives ([`DeliveryRequest::parse`],
//! [`AdminRequest::parse`], [`TakeRequest::parse`]); the verb then runs on its typed
//! arguments. A malformed request is a [`Refusal`] of kind [`RefusalKind::Argument`] (an
//! unknown verb [`RefusalKind::UnknownOp`]) whose text is the one the rail has always answered
//! with (docs/admin.md, docs/anycast.md, the reference's texts).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Map, Value};

/// How long an agent waits for its `durableJoin` to be answered (the reference agent's 30 s;
/// the daemon's activation catch-up runs inside it, so the daemon bounds its own work by it).
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(30);

use crate::wire::control::{ControlRequest, Refusal, RefusalKind};
use crate::wire::grammar::{validate_channel, LifecycleUid, Principal};
use crate::wire::replies::ConnTuple;

/// Most principals one `evictPrincipals` request may name (the reference
/// `EVICT_PRINCIPALS_MAX`).
pub const EVICT_PRINCIPALS_MAX: usize = 256;

fn argument(text: String) -> Refusal {
    Refusal::new(RefusalKind::Argument, text)
}

/// `ctl.delivery` (agent-callable).
#[derive(Debug, Clone, PartialEq)]
pub enum DeliveryRequest {
    DurableJoin(DurableJoin),
    DurableLeave(DurableLeave),
    ListMemberships(ListMemberships),
    AnycastStatus(AnycastSeq),
    AnycastCancel(AnycastSeq),
}

/// `durableJoin {channel, lifecycleUid?}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurableJoin {
    /// A concrete, valid channel (trimmed).
    pub channel: String,
    /// Without it, the caller's single live ACL row names the lifecycle.
    pub lifecycle_uid: Option<LifecycleUid>,
}

/// `durableLeave {channel, generation, lifecycleUid?}`.
#[derive(Debug, Clone, PartialEq)]
pub struct DurableLeave {
    pub channel: String,
    /// The membership's current generation as the caller knows it (a finite number: the
    /// fail-closed stale-leave guard compares it as the reference does).
    pub generation: f64,
    pub lifecycle_uid: Option<LifecycleUid>,
}

/// `listMemberships {lifecycleUid?}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListMemberships {
    pub lifecycle_uid: Option<LifecycleUid>,
}

/// `anycastStatus {seq}` / `anycastCancel {seq}`: a positive sequence of `TASK_<s>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnycastSeq {
    pub seq: u64,
}

impl DeliveryRequest {
    /// The verb and its arguments; an unknown verb is refused.
    pub fn parse(request: &ControlRequest) -> Result<DeliveryRequest, Refusal> {
        let (op, args) = (request.op.as_str(), &request.args);
        Ok(match op {
            "durableJoin" => DeliveryRequest::DurableJoin(DurableJoin {
                channel: channel_arg(op, args)?,
                lifecycle_uid: lifecycle_arg(op, args)?,
            }),
            "durableLeave" => {
                let channel = channel_arg(op, args)?;
                let generation = object(op, args)?
                    .and_then(|m| m.get("generation"))
                    .and_then(Value::as_f64)
                    .filter(|g| g.is_finite())
                    .ok_or_else(|| {
                        argument(
                            "durableLeave: a finite generation is required (fail-closed stale-leave guard)"
                                .to_string(),
                        )
                    })?;
                DeliveryRequest::DurableLeave(DurableLeave {
                    channel,
                    generation,
                    lifecycle_uid: lifecycle_arg(op, args)?,
                })
            }
            "listMemberships" => DeliveryRequest::ListMemberships(ListMemberships {
                lifecycle_uid: lifecycle_arg(op, args)?,
            }),
            "anycastStatus" => DeliveryRequest::AnycastStatus(seq_arg(op, args)?),
            "anycastCancel" => DeliveryRequest::AnycastCancel(seq_arg(op, args)?),
            _ => {
                return Err(Refusal::new(
                    RefusalKind::UnknownOp,
                    format!("op \"{op}\" not supported on the delivery control service"),
                ))
            }
        })
    }

    pub fn op(&self) -> &'static str {
        match self {
            DeliveryRequest::DurableJoin(_) => "durableJoin",
            DeliveryRequest::DurableLeave(_) => "durableLeave",
            DeliveryRequest::ListMemberships(_) => "listMemberships",
            DeliveryRequest::AnycastStatus(_) => "anycastStatus",
            DeliveryRequest::AnycastCancel(_) => "anycastCancel",
        }
    }
}

/// `args` must be an object (or absent).
fn object<'a>(op: &str, args: &'a Value) -> Result<Option<&'a Map<String, Value>>, Refusal> {
    match args {
        Value::Null => Ok(None),
        Value::Object(m) => Ok(Some(m)),
        _ => Err(argument(format!("{op}: args must be an object"))),
    }
}

/// The concrete channel argument.
fn channel_arg(op: &str, args: &Value) -> Result<String, Refusal> {
    let raw = object(op, args)?
        .and_then(|m| m.get("channel"))
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| argument(format!("{op}: channel must be a non-blank string")))?;
    if validate_channel(raw, false).is_ok() && validate_channel(raw, true).is_err() {
        return Err(argument(format!(
            "{op}: \"{raw}\" must be a concrete channel (durable membership is per-concrete-channel, not wildcard)"
        )));
    }
    validate_channel(raw, true).map_err(|e| argument(format!("{op}: {e}")).source(e))?;
    Ok(raw.to_string())
}

/// The explicit `lifecycleUid`, when given.
fn lifecycle_arg(op: &str, args: &Value) -> Result<Option<LifecycleUid>, Refusal> {
    match object(op, args)?.and_then(|m| m.get("lifecycleUid")) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => LifecycleUid::parse(s)
            .map(Some)
            .map_err(|e| argument(format!("{op}: {e}")).source(e)),
        Some(_) => Err(argument(format!("{op}: lifecycleUid must be a string"))),
    }
}

/// The `seq` argument: a positive integer.
fn seq_arg(op: &str, args: &Value) -> Result<AnycastSeq, Refusal> {
    args.get("seq")
        .and_then(Value::as_u64)
        .filter(|s| *s > 0)
        .map(|seq| AnycastSeq { seq })
        .ok_or_else(|| argument(format!("{op}: seq must be a positive integer")))
}

/// `ctl.delivery-admin` (supervisor-callable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminRequest {
    ReloadCreds(ReloadCreds),
    ReloadStoreIdentity(ReloadStoreIdentity),
    LifecycleMemberships(LifecycleMemberships),
    EvictPrincipal(EvictPrincipal),
    EvictPrincipals(EvictPrincipals),
    PrincipalLiveness(PrincipalLivenessQuery),
    PlaneConnLiveness(PlaneConnQuery),
}

/// `reloadCreds {expected?: {delivery?, membership?}}`: sha256 fingerprints of the JWTs the
/// caller just wrote.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReloadCreds {
    pub expected_delivery: Option<String>,
    pub expected_membership: Option<String>,
}

/// `reloadStoreIdentity {expected?}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadStoreIdentity {
    pub expected: Option<StoreChallenge>,
}

/// A store identity as a peer writes it: `{kind: "fs", root, storeId?}` or `{kind:
/// "injected", coordinate}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChallenge {
    Fs {
        root: String,
        store_id: Option<String>,
    },
    Injected {
        coordinate: String,
    },
}

impl StoreChallenge {
    /// Parses an identity; the refusal (of kind [`RefusalKind::Argument`]) names what is missing.
    pub fn parse(v: &Value) -> Result<StoreChallenge, Refusal> {
        let bad = |what: &str| argument(format!("a store identity needs {what}"));
        match v.get("kind").and_then(Value::as_str) {
            Some("fs") => Ok(StoreChallenge::Fs {
                root: v
                    .get("root")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a \"root\" string"))?
                    .to_string(),
                store_id: v.get("storeId").and_then(Value::as_str).map(str::to_string),
            }),
            Some("injected") => Ok(StoreChallenge::Injected {
                coordinate: v
                    .get("coordinate")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a \"coordinate\" string"))?
                    .to_string(),
            }),
            _ => Err(bad("\"kind\": \"fs\" or \"injected\"")),
        }
    }
}

/// `lifecycleMemberships {principal, lifecycleUid}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleMemberships {
    pub principal: Principal,
    pub lifecycle_uid: LifecycleUid,
}

/// `evictPrincipal {principal}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictPrincipal {
    pub principal: Principal,
}

/// `evictPrincipals {principals}`: 1 to [`EVICT_PRINCIPALS_MAX`] distinct principals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictPrincipals {
    pub principals: Vec<Principal>,
}

/// `principalLiveness {principal}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrincipalLivenessQuery {
    pub principal: Principal,
}

/// `planeConnLiveness {query: {ledger, records}}`, each a closed connection tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaneConnQuery {
    pub ledger: ConnTuple,
    pub records: ConnTuple,
}

impl AdminRequest {
    /// The verb and its arguments (absent `args` read as `{}`); an unknown verb is refused.
    pub fn parse(request: &ControlRequest) -> Result<AdminRequest, Refusal> {
        let empty = Value::Object(Map::new());
        let args = match &request.args {
            Value::Null => &empty,
            other => other,
        };
        Ok(match request.op.as_str() {
            "reloadCreds" => {
                let expected = |component: &str| {
                    args.get("expected")
                        .and_then(|e| e.get(component))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                };
                AdminRequest::ReloadCreds(ReloadCreds {
                    expected_delivery: expected("delivery"),
                    expected_membership: expected("membership"),
                })
            }
            "reloadStoreIdentity" => AdminRequest::ReloadStoreIdentity(ReloadStoreIdentity {
                expected: match args.get("expected").filter(|v| !v.is_null()) {
                    None => None,
                    Some(v) => Some(StoreChallenge::parse(v).map_err(|e| {
                        e.map_text(|t| format!("delivery: reloadStoreIdentity: {t}"))
                    })?),
                },
            }),
            "lifecycleMemberships" => AdminRequest::LifecycleMemberships(inventory_args(args)?),
            "evictPrincipal" => AdminRequest::EvictPrincipal(EvictPrincipal {
                principal: principal_arg("evictPrincipal", args.get("principal"))?,
            }),
            "evictPrincipals" => AdminRequest::EvictPrincipals(EvictPrincipals {
                principals: principals_arg(args)?,
            }),
            "principalLiveness" => AdminRequest::PrincipalLiveness(PrincipalLivenessQuery {
                principal: principal_arg("principalLiveness", args.get("principal"))?,
            }),
            "planeConnLiveness" => AdminRequest::PlaneConnLiveness(plane_query(args)?),
            op => {
                return Err(Refusal::new(
                    RefusalKind::UnknownOp,
                    format!("op \"{op}\" not supported on the delivery admin service"),
                ))
            }
        })
    }

    pub fn op(&self) -> &'static str {
        match self {
            AdminRequest::ReloadCreds(_) => "reloadCreds",
            AdminRequest::ReloadStoreIdentity(_) => "reloadStoreIdentity",
            AdminRequest::LifecycleMemberships(_) => "lifecycleMemberships",
            AdminRequest::EvictPrincipal(_) => "evictPrincipal",
            AdminRequest::EvictPrincipals(_) => "evictPrincipals",
            AdminRequest::PrincipalLiveness(_) => "principalLiveness",
            AdminRequest::PlaneConnLiveness(_) => "planeConnLiveness",
        }
    }
}

fn inventory_args(args: &Value) -> Result<LifecycleMemberships, Refusal> {
    let arg = |name: &str| args.get(name).and_then(Value::as_str).map(str::trim);
    let principal = arg("principal").filter(|p| !p.is_empty()).ok_or_else(|| {
        argument("lifecycleMemberships: a principal (owner.actor dot-form) is required".to_string())
    })?;
    let member = Principal::parse(principal).map_err(|e| {
        argument(format!(
            "lifecycleMemberships: \"{principal}\" is not a principal: {e}"
        ))
        .source(e)
    })?;
    let raw_uid = arg("lifecycleUid").filter(|u| !u.is_empty()).ok_or_else(|| {
        argument(
            "lifecycleMemberships: the lifecycleUid is required (membership rows are lifecycle-keyed)"
                .to_string(),
        )
    })?;
    let uid = LifecycleUid::parse(raw_uid)
        .map_err(|e| argument(format!("lifecycleMemberships: {e}")).source(e))?;
    Ok(LifecycleMemberships {
        principal: member,
        lifecycle_uid: uid,
    })
}

/// The principal argument of `evictPrincipal` / `principalLiveness`, trimmed and checked.
pub fn principal_arg(verb: &str, raw: Option<&Value>) -> Result<Principal, Refusal> {
    let p = raw.and_then(Value::as_str).map(str::trim).unwrap_or("");
    if p.is_empty() {
        return Err(argument(format!(
            "{verb}: a principal (owner.actor dot-form) is required"
        )));
    }
    Principal::parse(p).map_err(|e| {
        argument(format!(
            "{verb}: \"{p}\" is not a real owner.actor principal (owner must be `local` or a derived `u_…` token — the only shapes CONNZ attribution can surface)"
        ))
        .source(e)
    })
}

/// The `principals` of `evictPrincipals`: 1 to 256 distinct, each a real principal.
fn principals_arg(args: &Value) -> Result<Vec<Principal>, Refusal> {
    const VERB: &str = "evictPrincipals";
    let Some(list) = args.get("principals").and_then(Value::as_array) else {
        return Err(argument(format!(
            "{VERB}: principals must be an array of 1 to {EVICT_PRINCIPALS_MAX} owner.actor principals"
        )));
    };
    if list.is_empty() || list.len() > EVICT_PRINCIPALS_MAX {
        return Err(argument(format!(
            "{VERB}: {} principals in one request; send 1 to {EVICT_PRINCIPALS_MAX} distinct holders per request",
            list.len()
        )));
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(list.len());
    for raw in list {
        let p = principal_arg(VERB, Some(raw))?;
        if !seen.insert(p.clone()) {
            return Err(argument(format!(
                "{VERB}: \"{p}\" is named twice; send distinct holders"
            )));
        }
        out.push(p);
    }
    Ok(out)
}

/// `planeConnLiveness`'s query: exactly `{ledger, records}`, each a closed tuple.
fn plane_query(args: &Value) -> Result<PlaneConnQuery, Refusal> {
    let malformed = || {
        argument("planeConnLiveness: the query must be exactly { ledger, records } connection tuples ({ serverId, cid, userNkey }); refusing a malformed or wider query".to_string())
    };
    let query = args
        .get("query")
        .and_then(Value::as_object)
        .ok_or_else(malformed)?;
    if query.len() != 2 {
        return Err(malformed());
    }
    Ok(PlaneConnQuery {
        ledger: query.get("ledger").and_then(tuple).ok_or_else(malformed)?,
        records: query.get("records").and_then(tuple).ok_or_else(malformed)?,
    })
}

/// One connection tuple, closed-parsed: exactly `{serverId (1..128), cid (a safe integer >
/// 0), userNkey (^U[A-Z2-7]{55}$)}`.
fn tuple(v: &Value) -> Option<ConnTuple> {
    let m = v.as_object()?;
    if m.len() != 3 {
        return None;
    }
    let server_id = m.get("serverId")?.as_str()?;
    if server_id.is_empty() || server_id.len() > 128 {
        return None;
    }
    let cid = m
        .get("cid")?
        .as_u64()
        .filter(|c| *c > 0 && *c < (1u64 << 53))?;
    let nkey = m.get("userNkey")?.as_str()?;
    let nkey_ok = nkey.len() == 56
        && nkey.starts_with('U')
        && nkey
            .chars()
            .skip(1)
            .all(|c| c.is_ascii_uppercase() || ('2'..='7').contains(&c));
    if !nkey_ok {
        return None;
    }
    Some(ConnTuple {
        server_id: server_id.to_string(),
        cid,
        user_nkey: nkey.to_string(),
    })
}

/// The anycast take rail, `cotal.<s>.ctl.anycast.<o>.<a>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeRequest {
    Take(Take),
}

/// `take {seq, streamCreated, delivered, lifecycleUid}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Take {
    pub seq: u64,
    /// The task stream's creation time in unix nanoseconds (a decimal string).
    pub stream_created: String,
    /// The copy's delivery count.
    pub delivered: u64,
    /// The holder's lifecycle (its ACL row names the roles it serves).
    pub lifecycle_uid: LifecycleUid,
}

impl TakeRequest {
    pub fn parse(request: &ControlRequest) -> Result<TakeRequest, Refusal> {
        let (op, args) = (request.op.as_str(), &request.args);
        if op != "take" {
            return Err(Refusal::new(
                RefusalKind::UnknownOp,
                format!("op \"{op}\" not supported on the anycast take rail"),
            ));
        }
        let seq = seq_arg("take", args)?.seq;
        let stream_created = args
            .get("streamCreated")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| argument("take: streamCreated must be the task stream's creation time in unix nanoseconds (a decimal string)".to_string()))?
            .to_string();
        let delivered = args
            .get("delivered")
            .and_then(Value::as_u64)
            .filter(|d| *d > 0)
            .ok_or_else(|| {
                argument(
                    "take: delivered must be the copy's delivery count (a positive integer)"
                        .to_string(),
                )
            })?;
        let lifecycle_uid = args
            .get("lifecycleUid")
            .and_then(Value::as_str)
            .and_then(|u| LifecycleUid::parse(u).ok())
            .ok_or_else(|| argument("take: lifecycleUid must be the holder's lifecycle uid (its ACL row names the roles it serves)".to_string()))?;
        Ok(TakeRequest::Take(Take {
            seq,
            stream_created,
            delivered,
            lifecycle_uid,
        }))
    }

    pub fn op(&self) -> &'static str {
        "take"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(op: &str, args: Value) -> ControlRequest {
        ControlRequest {
            op: op.into(),
            args,
            from: Value::Null,
        }
    }

    fn refused(r: Result<impl std::fmt::Debug, Refusal>) -> (RefusalKind, String) {
        match r {
            Ok(v) => panic!("accepted: {v:?}"),
            Err(e) => (e.kind(), e.text().to_string()),
        }
    }

    /// Each malformed request is refused with the rail's text and a kind. Mutation seen
    /// failing: the concrete-channel check removed (the wildcard is refused with the grammar's
    /// text instead of the rail's).
    #[test]
    fn malformed_delivery_requests_are_refused_with_their_texts() {
        let r = |op: &str, args: Value| refused(DeliveryRequest::parse(&req(op, args)));
        assert_eq!(
            r("durableJoin", json!([1])),
            (
                RefusalKind::Argument,
                "durableJoin: args must be an object".into()
            )
        );
        assert_eq!(
            r("durableJoin", json!({"channel": "  "})),
            (
                RefusalKind::Argument,
                "durableJoin: channel must be a non-blank string".into()
            )
        );
        assert_eq!(
            r("durableJoin", json!({"channel": "a.*"})).1,
            "durableJoin: \"a.*\" must be a concrete channel (durable membership is per-concrete-channel, not wildcard)"
        );
        assert_eq!(
            r("listMemberships", json!({"lifecycleUid": 7})).1,
            "listMemberships: lifecycleUid must be a string"
        );
        assert_eq!(
            r("durableLeave", json!({"channel": "c"})).1,
            "durableLeave: a finite generation is required (fail-closed stale-leave guard)"
        );
        assert_eq!(
            r("anycastCancel", json!({"seq": 0})).1,
            "anycastCancel: seq must be a positive integer"
        );
        assert_eq!(
            r("nope", Value::Null),
            (
                RefusalKind::UnknownOp,
                "op \"nope\" not supported on the delivery control service".into()
            )
        );
        let ok = DeliveryRequest::parse(&req("durableJoin", json!({"channel": " c "})));
        assert_eq!(
            ok.ok(),
            Some(DeliveryRequest::DurableJoin(DurableJoin {
                channel: "c".into(),
                lifecycle_uid: None
            }))
        );
    }

    /// Mutation seen failing: dropping the length check lets 257 through; dropping the
    /// distinct check lets a duplicate through.
    #[test]
    fn principals_are_one_to_256_distinct_real_principals() {
        let p = |args: Value| AdminRequest::parse(&req("evictPrincipals", args));
        let many: Vec<String> = (0..257).map(|i| format!("local.a{i}")).collect();
        assert!(refused(p(json!({"principals": many})))
            .1
            .contains("257 principals"));
        assert!(p(json!({"principals": []})).is_err());
        let dup = refused(p(json!({"principals": ["local.a", "local.a"]}))).1;
        assert!(dup.contains("named twice"), "{dup}");
        let bad = refused(p(json!({"principals": ["evil.x"]}))).1;
        assert!(bad.contains("is not a real owner.actor principal"), "{bad}");
        let all: Vec<String> = (0..256).map(|i| format!("local.a{i}")).collect();
        match p(json!({ "principals": all })) {
            Ok(AdminRequest::EvictPrincipals(e)) => assert_eq!(e.principals.len(), 256),
            other => panic!("{other:?}"),
        }
    }

    /// Mutation: accepting an extra key or a zero cid in a tuple fails here.
    #[test]
    fn tuples_are_closed() {
        let nkey = format!("U{}", "A".repeat(55));
        assert!(tuple(&json!({"serverId": "S", "cid": 1, "userNkey": nkey})).is_some());
        assert!(tuple(&json!({"serverId": "S", "cid": 0, "userNkey": nkey})).is_none());
        assert!(tuple(&json!({"serverId": "S", "cid": 1, "userNkey": nkey, "x": 1})).is_none());
        assert!(tuple(&json!({"serverId": "", "cid": 1, "userNkey": nkey})).is_none());
        assert!(tuple(&json!({"serverId": "S", "cid": 1, "userNkey": "Ubad"})).is_none());
    }
}
