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
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::base::{Read, Rows, Sweep, SysAuthority};
use crate::plane::{stopped, PlaneCtx, PlaneError, PlaneErrorKind, StopRx};
use crate::rails::Handlers;
use crate::wire::{
    ConnTuple, LivenessAnswer, PlaneConnQuery, PlaneLiveness, PrincipalLiveness,
    PrincipalLivenessQuery, Refusal, TupleState, LEASE_KEY,
};

const UNDER_REPORTED: &str = "CONNZ sweep under-reported (no responder, truncation, an API error, or a malformed reply) - liveness UNKNOWN";

/// The note of a sweep that cannot prove `gone`, for `decision`; `None` when it can.
pub(crate) fn shortfall(sweep: &Sweep, decision: &str) -> Option<String> {
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

pub(crate) async fn observed_sweep(verb: &str, authority: &SysAuthority) -> Result<Sweep, Refusal> {
    let client = authority.observer(verb).await?;
    let sweep = authority.sweep(&client).await;
    let _ = client.drain().await;
    Ok(sweep)
}

/// `principalLiveness {principal}` → `{principal, state, sweepComplete, note?}`.
pub async fn principal_liveness(
    authority: &SysAuthority,
    args: &PrincipalLivenessQuery,
) -> Result<PrincipalLiveness, Refusal> {
    const VERB: &str = "principalLiveness";
    let principal = &args.principal;
    let sweep = observed_sweep(VERB, authority).await?;
    let live = sweep
        .rows
        .iter()
        .any(|r| r.principal.as_ref() == Some(principal));
    let note = shortfall(&sweep, "a freeze-holder repair");
    let state = if live {
        "live"
    } else if note.is_none() {
        "gone"
    } else {
        "unknown"
    };
    Ok(PrincipalLiveness {
        principal: principal.dot_form(),
        state,
        sweep_complete: sweep.complete(),
        note: if live { None } else { note },
    })
}

/// `planeConnLiveness {query: {ledger, records}}` →
/// `{ledger: {tuple, state}, records: {tuple, state}, sweepComplete, note?}`.
pub async fn plane_conn_liveness(
    authority: &SysAuthority,
    query: &PlaneConnQuery,
) -> Result<PlaneLiveness, Refusal> {
    const VERB: &str = "planeConnLiveness";
    let sweep = observed_sweep(VERB, authority).await?;
    let note = shortfall(&sweep, "a plane reclaim");
    let verdict = |t: &ConnTuple| {
        let live = sweep.rows.iter().any(|r| {
            r.user_nkey.as_deref() == Some(t.user_nkey.as_str())
                || (r.server_id == t.server_id && r.cid == t.cid)
        });
        let state = if live {
            "live"
        } else if note.is_none() {
            "gone"
        } else {
            "unknown"
        };
        TupleState {
            tuple: t.clone(),
            state,
        }
    };
    Ok(PlaneLiveness {
        ledger: verdict(&query.ledger),
        records: verdict(&query.records),
        sweep_complete: sweep.complete(),
        note: note.clone(),
    })
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
    const WHAT: &str = "live.delivery responder";
    let mut sub = crate::rails::queue_subscribe(ctx, &serve, LIVE_QUEUE_GROUP, WHAT).await?;
    let rows = Rows::open(
        &ctx.js,
        &ctx.names.delivery_bucket(),
        ctx.config.request_bound,
    )
    .await
    .map_err(|e| {
        PlaneError::new(
            PlaneErrorKind::Bucket,
            WHAT,
            format!("open the lease bucket: {e}"),
        )
    })?;
    let ctx = ctx.clone();
    Ok(tokio::spawn(async move {
        let mut probes = Handlers::new();
        loop {
            tokio::select! {
                _ = stopped(&mut stop) => break,
                Some(()) = probes.reaped() => {}
                msg = sub.next() => {
                    let Some(msg) = msg else { break };
                    let (ctx, rows, me, instance) = (ctx.clone(), rows.clone(), me.clone(), instance.clone());
                    let probe = async move { answer_probe(&ctx, &rows, &me, &instance, msg).await };
                    if probes.spawn(&mut stop, probe).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = sub.unsubscribe().await;
        probes.join(WHAT).await;
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
    let answer = LivenessAnswer {
        plane: "delivery",
        responder: grade(row, me),
        instance: instance.to_string(),
    };
    if let Ok(body) = serde_json::to_vec(&answer) {
        let _ = ctx.client.publish(reply, body.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
