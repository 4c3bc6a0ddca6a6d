//! Liveness oracles: `principalLiveness` and `planeConnLiveness` on the admin rail, and the
//! `live.delivery` responder agents probe.
//!
//! The two admin verbs are read-only: they sweep through the `$SYS` observer only (the evictor is
//! never read) and answer `live`, `gone` or `unknown`. `gone` needs a complete sweep that proves
//! the single-server mode (no cluster declared, exactly one server answered), because on a
//! cluster a partitioned member could still hold the connection. Their replies are closed shapes
//! that echo what was asked.
//!
//! `live.delivery` answers an agent's "is a delivery daemon serving my space here?" from the
//! daemon's own lease row, read leader-served at probe time.

use futures::StreamExt;
use serde_json::{json, Map, Value};
use tokio::task::JoinHandle;

use crate::kv::{Read, Rows};
use crate::plane::{stopped, PlaneCtx, PlaneError, StopRx};
use crate::rails::evict::principal_arg;
use crate::sys::{Sweep, SysAuthority};
use crate::wire::LEASE_KEY;

const UNDER_REPORTED: &str = "CONNZ sweep under-reported (no responder, truncation, an API error, or a malformed reply) - liveness UNKNOWN";

/// The note of a sweep that cannot prove `gone`, for `decision`; `None` when it can.
fn shortfall(sweep: &Sweep, decision: &str) -> Option<String> {
    if !sweep.complete() {
        Some(UNDER_REPORTED.into())
    } else if sweep.cluster_declared {
        Some(format!("the broker DECLARES cluster membership - a partitioned member could still hold the connection, so CONNZ liveness cannot adjudicate {decision} outside the single-server mode (SPEC 13.13) - liveness UNKNOWN"))
    } else if sweep.servers.len() != 1 {
        Some(format!("{} distinct servers replied - the single-server mode the verdict requires is unproven (SPEC 13.13) - liveness UNKNOWN", sweep.servers.len()))
    } else {
        None
    }
}

async fn observed_sweep(verb: &str, authority: &SysAuthority) -> Result<Sweep, String> {
    let cred = authority.pair(verb).await?.observer;
    let client = authority
        .dial(
            &cred,
            crate::wire::MEMBERSHIP_OBSERVER_INBOX_PREFIX,
            "cotal-delivery-observer",
        )
        .await
        .map_err(|e| format!("{verb}: the $SYS observer could not connect ({e})"))?;
    let sweep = authority.sweep(&client).await;
    let _ = client.drain().await;
    Ok(sweep)
}

/// `principalLiveness {principal}` → `{principal, state, sweepComplete, note?}`.
pub async fn principal_liveness(authority: &SysAuthority, args: &Value) -> Result<Value, String> {
    const VERB: &str = "principalLiveness";
    let principal = principal_arg(VERB, args.get("principal"))?;
    let sweep = observed_sweep(VERB, authority).await?;
    let live = sweep
        .rows
        .iter()
        .any(|r| r.principal.as_ref() == Some(&principal));
    let note = shortfall(&sweep, "a freeze-holder repair");
    let state = if live {
        "live"
    } else if note.is_none() {
        "gone"
    } else {
        "unknown"
    };
    let mut out = Map::new();
    out.insert("principal".into(), json!(principal.dot_form()));
    out.insert("state".into(), json!(state));
    out.insert("sweepComplete".into(), json!(sweep.complete()));
    if !live {
        if let Some(n) = note {
            out.insert("note".into(), json!(n));
        }
    }
    Ok(Value::Object(out))
}

/// One connection tuple of a plane claim, closed-parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tuple {
    server_id: String,
    cid: u64,
    user_nkey: String,
}

fn tuple(v: &Value) -> Option<Tuple> {
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
        && nkey[1..]
            .chars()
            .all(|c| c.is_ascii_uppercase() || ('2'..='7').contains(&c));
    if !nkey_ok {
        return None;
    }
    Some(Tuple {
        server_id: server_id.to_string(),
        cid,
        user_nkey: nkey.to_string(),
    })
}

fn echo(t: &Tuple) -> Value {
    json!({"serverId": t.server_id, "cid": t.cid, "userNkey": t.user_nkey})
}

/// `planeConnLiveness {query: {ledger, records}}` →
/// `{ledger: {tuple, state}, records: {tuple, state}, sweepComplete, note?}`.
pub async fn plane_conn_liveness(authority: &SysAuthority, args: &Value) -> Result<Value, String> {
    const VERB: &str = "planeConnLiveness";
    let malformed = || {
        format!("{VERB}: the query must be exactly {{ ledger, records }} connection tuples ({{ serverId, cid, userNkey }}); refusing a malformed or wider query")
    };
    let query = args
        .get("query")
        .and_then(Value::as_object)
        .ok_or_else(malformed)?;
    if query.len() != 2 {
        return Err(malformed());
    }
    let ledger = query.get("ledger").and_then(tuple).ok_or_else(malformed)?;
    let records = query.get("records").and_then(tuple).ok_or_else(malformed)?;
    let sweep = observed_sweep(VERB, authority).await?;
    let note = shortfall(&sweep, "a plane reclaim");
    let verdict = |t: &Tuple| {
        let live = sweep.rows.iter().any(|r| {
            r.user_nkey.as_deref() == Some(t.user_nkey.as_str())
                || (r.server_id == t.server_id && r.cid == t.cid)
        });
        if live {
            "live"
        } else if note.is_none() {
            "gone"
        } else {
            "unknown"
        }
    };
    let mut out = Map::new();
    out.insert(
        "ledger".into(),
        json!({"tuple": echo(&ledger), "state": verdict(&ledger)}),
    );
    out.insert(
        "records".into(),
        json!({"tuple": echo(&records), "state": verdict(&records)}),
    );
    out.insert("sweepComplete".into(), json!(sweep.complete()));
    if let Some(n) = note {
        out.insert("note".into(), json!(n));
    }
    Ok(Value::Object(out))
}

/// Who this daemon is in its lease row, to grade a probe.
#[derive(Debug, Clone)]
pub struct LeaseSelf {
    pub holder: String,
    pub incarnation: String,
}

/// The queue group the responder serves in.
pub const LIVE_QUEUE_GROUP: &str = "live.delivery";

/// The responder verdict from the lease row: no row or not ready → `unbound`, another
/// instance's ready row → `stale`, this instance's ready row → `bound`, a failed read →
/// `unknown`.
pub fn grade(row: Result<Option<Value>, ()>, me: &LeaseSelf) -> &'static str {
    match row {
        Err(()) => "unknown",
        Ok(None) => "unbound",
        Ok(Some(v)) if v["ready"] != Value::Bool(true) => "unbound",
        Ok(Some(v)) => {
            let ours = v["holder"].as_str() == Some(me.holder.as_str())
                && v["incarnation"].as_str().unwrap_or("") == me.incarnation;
            if ours {
                "bound"
            } else {
                "stale"
            }
        }
    }
}

/// Binds the `live.delivery` responder (queue group `live.delivery`) until `stop`. `instance`
/// is minted by the caller on each bind.
pub async fn bind(
    ctx: &PlaneCtx,
    me: LeaseSelf,
    instance: String,
    mut stop: StopRx,
) -> Result<JoinHandle<()>, PlaneError> {
    let serve = ctx.names.live_delivery_serve();
    let fail = |detail: String| PlaneError {
        what: "live.delivery responder",
        detail,
    };
    let mut sub = ctx
        .client
        .queue_subscribe(serve.clone(), LIVE_QUEUE_GROUP.to_string())
        .await
        .map_err(|e| fail(format!("subscribe {serve}: {e}")))?;
    let rows = Rows::open(
        &ctx.js,
        &ctx.names.delivery_bucket(),
        ctx.config.request_bound,
    )
    .await
    .map_err(|e| fail(format!("open the lease bucket: {e}")))?;
    let ctx = ctx.clone();
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stopped(&mut stop) => break,
                msg = sub.next() => {
                    let Some(msg) = msg else { break };
                    let (ctx, rows, me, instance) = (ctx.clone(), rows.clone(), me.clone(), instance.clone());
                    tokio::spawn(async move { answer_probe(&ctx, &rows, &me, &instance, msg).await });
                }
            }
        }
        let _ = sub.unsubscribe().await;
    }))
}

async fn answer_probe(
    ctx: &PlaneCtx,
    rows: &Rows,
    me: &LeaseSelf,
    instance: &str,
    msg: async_nats::Message,
) {
    let subject = msg.subject.to_string();
    let Some(reply) = msg.reply.as_ref().map(|r| r.to_string()) else {
        return;
    };
    if !crate::rails::reply_is_bound(&subject, &reply) {
        ctx.journal.line(format!(
            "! delivery: live.delivery probe on {subject} asked for a reply outside its own .reply. subtree ({reply}); dropped"
        ));
        return;
    }
    let row = match rows.read(LEASE_KEY).await {
        Ok(Read::Present(r)) => serde_json::from_slice::<Value>(&r.value)
            .map(Some)
            .map_err(|_| ()),
        Ok(Read::Absent { .. }) => Ok(None),
        Err(_) => Err(()),
    };
    let body = json!({"plane": "delivery", "responder": grade(row, me), "instance": instance});
    let _ = ctx.client.publish(reply, body.to_string().into()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation: grading a not-ready row `bound`, or another instance's row `bound`, fails here.
    #[test]
    fn the_responder_grades_from_the_lease_row() {
        let me = LeaseSelf {
            holder: "local.U1".into(),
            incarnation: "i1".into(),
        };
        assert_eq!(grade(Err(()), &me), "unknown");
        assert_eq!(grade(Ok(None), &me), "unbound");
        let row = |h: &str, i: &str, ready: bool| {
            Ok(Some(
                json!({"holder": h, "since": 1, "ready": ready, "incarnation": i}),
            ))
        };
        assert_eq!(grade(row("local.U1", "i1", false), &me), "unbound");
        assert_eq!(grade(row("local.U1", "i1", true), &me), "bound");
        assert_eq!(grade(row("local.U1", "i0", true), &me), "stale");
        assert_eq!(grade(row("local.U2", "i1", true), &me), "stale");
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

    fn sweep(servers: &[&str], cluster: bool) -> Sweep {
        Sweep {
            got_reply: true,
            cluster_declared: cluster,
            servers: servers.iter().map(|s| s.to_string()).collect(),
            ..Sweep::default()
        }
    }

    /// Mutation: dropping the cluster or the server-count condition lets `gone` through on a
    /// cluster; this fails.
    #[test]
    fn gone_needs_a_complete_single_server_sweep() {
        assert_eq!(shortfall(&sweep(&["A"], false), "x"), None);
        assert!(shortfall(&sweep(&["A"], true), "a plane reclaim")
            .unwrap()
            .contains("DECLARES cluster membership"));
        assert!(shortfall(&sweep(&["A", "B"], false), "x")
            .unwrap()
            .starts_with("2 distinct servers replied"));
        let mut lost = sweep(&["A"], false);
        lost.lost_page = true;
        assert_eq!(shortfall(&lost, "x").as_deref(), Some(UNDER_REPORTED));
    }
}
