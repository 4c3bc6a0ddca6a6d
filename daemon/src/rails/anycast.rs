//! The anycast verbs (docs/anycast.md): `take` on a holder's own take subject
//! `cotal.<s>.ctl.anycast.<o>.<a>`, `anycastStatus` and `anycastCancel` on `ctl.delivery`, and
//! the sweeper task. The row logic lives in [`crate::plane::anycast`]; a fault here is answered
//! or logged and never reaches the rest of delivery.

use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::plane::{stopped, PlaneCtx, StopRx};
use crate::plane::{Anycast, SweepConfig};
use crate::wire::{LifecycleUid, Principal};

/// The `seq` argument: a positive integer.
fn seq_arg(op: &str, args: &Value) -> Result<u64, String> {
    args.get("seq")
        .and_then(Value::as_u64)
        .filter(|s| *s > 0)
        .ok_or_else(|| format!("{op}: seq must be a positive integer"))
}

/// `take {seq, streamCreated, delivered, lifecycleUid}` on the take rail.
pub async fn take(
    ctx: &PlaneCtx,
    holder: &Principal,
    op: &str,
    args: &Value,
) -> Result<Value, String> {
    if op != "take" {
        return Err(format!(
            "op \"{op}\" not supported on the anycast take rail"
        ));
    }
    let seq = seq_arg("take", args)?;
    let created = args
        .get("streamCreated")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()))
        .ok_or("take: streamCreated must be the task stream's creation time in unix nanoseconds (a decimal string)")?;
    let delivered = args
        .get("delivered")
        .and_then(Value::as_u64)
        .filter(|d| *d > 0)
        .ok_or("take: delivered must be the copy's delivery count (a positive integer)")?;
    let lifecycle = args
        .get("lifecycleUid")
        .and_then(Value::as_str)
        .and_then(|u| LifecycleUid::parse(u).ok())
        .ok_or("take: lifecycleUid must be the holder's lifecycle uid (its ACL row names the roles it serves)")?;
    let anycast = Anycast::open(ctx).await.map_err(|e| e.to_string())?;
    let (took, row) = anycast
        .take(holder, &lifecycle, seq, created, delivered)
        .await
        .map_err(|e| e.to_string())?;
    Ok(json!({"seq": seq, "took": took.as_str(), "holder": row.holder, "sender": row.sender}))
}

/// `anycastStatus {seq}` and `anycastCancel {seq}` on `ctl.delivery`.
pub async fn delivery(
    ctx: &PlaneCtx,
    caller: &Principal,
    op: &str,
    args: &Value,
) -> Result<Value, String> {
    let seq = seq_arg(op, args)?;
    let anycast = Anycast::open(ctx).await.map_err(|e| e.to_string())?;
    let result = if op == "anycastCancel" {
        anycast.cancel(caller, seq).await
    } else {
        anycast.status(caller, seq).await
    };
    result.map_err(|e| e.to_string())
}

/// The sweeper: once when serving starts, then every `every`, until `stop`. A failed sweep is
/// logged and retried at the next tick.
pub fn bind_sweeper(ctx: &PlaneCtx, mut stop: StopRx) -> JoinHandle<()> {
    let ctx = ctx.clone();
    let config = SweepConfig::of(&ctx.config);
    tokio::spawn(async move {
        loop {
            let outcome = async { Anycast::open(&ctx).await?.sweep(config.row_age).await }.await;
            if let Err(e) = outcome {
                ctx.journal.repeated(
                    &format!("anycast-sweep:{}", ctx.names.space().as_str()),
                    format!(
                        "! anycast records: sweep failed ({e}); retrying in {} s; delivery is unaffected",
                        config.every.as_secs()
                    ),
                );
            }
            tokio::select! {
                _ = stopped(&mut stop) => break,
                _ = tokio::time::sleep(config.every) => {}
            }
        }
    })
}
