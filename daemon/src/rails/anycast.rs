//! The anycast verbs (docs/anycast.md): `take` on a holder's own take subject
//! `cotal.<s>.ctl.anycast.<o>.<a>`, `anycastStatus` and `anycastCancel` on `ctl.delivery`, and
//! the sweeper task. The row logic lives in [`crate::plane::anycast`]; a fault here is answered
//! or logged and never reaches the rest of delivery.

use tokio::task::JoinHandle;

use crate::plane::{stopped, PlaneCtx, StopRx};
use crate::plane::{Anycast, AnycastError, AnycastErrorKind, SweepConfig};
use crate::wire::{
    AnycastCancelled, AnycastSeq, AnycastStatus, Principal, Refusal, RefusalKind, Take, Took,
};

/// An anycast verb's failure as the rail's refusal (its text unchanged, the error kept).
fn refused(e: AnycastError) -> Refusal {
    let kind = match e.kind() {
        AnycastErrorKind::NotYours | AnycastErrorKind::NotHolder => RefusalKind::Denied,
        AnycastErrorKind::Unavailable => RefusalKind::Unavailable,
        AnycastErrorKind::Recreated
        | AnycastErrorKind::Cancelled
        | AnycastErrorKind::Taken
        | AnycastErrorKind::Gone => RefusalKind::Conflict,
    };
    Refusal::new(kind, e.to_string()).source(e)
}

/// `take {seq, streamCreated, delivered, lifecycleUid}` on the take rail.
pub async fn take(ctx: &PlaneCtx, holder: &Principal, args: &Take) -> Result<Took, Refusal> {
    let anycast = Anycast::open(ctx).await.map_err(refused)?;
    let (took, row) = anycast
        .take(
            holder,
            &args.lifecycle_uid,
            args.seq,
            &args.stream_created,
            args.delivered,
        )
        .await
        .map_err(refused)?;
    Ok(Took {
        seq: args.seq,
        took: took.as_str(),
        holder: row.holder,
        sender: row.sender,
    })
}

/// `anycastStatus {seq}` on `ctl.delivery`.
pub async fn status(
    ctx: &PlaneCtx,
    caller: &Principal,
    args: AnycastSeq,
) -> Result<AnycastStatus, Refusal> {
    let anycast = Anycast::open(ctx).await.map_err(refused)?;
    anycast.status(caller, args.seq).await.map_err(refused)
}

/// `anycastCancel {seq}` on `ctl.delivery`.
pub async fn cancel(
    ctx: &PlaneCtx,
    caller: &Principal,
    args: AnycastSeq,
) -> Result<AnycastCancelled, Refusal> {
    let anycast = Anycast::open(ctx).await.map_err(refused)?;
    anycast.cancel(caller, args.seq).await.map_err(refused)
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
