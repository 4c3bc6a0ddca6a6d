//! `lifecycleMemberships`: the inventory a retirement reads before it deletes the retired
//! lifecycle's membership rows (our design: the reference has no such verb; `docs/admin.md`).
//!
//! It is answered beside the serialized admin verbs, never behind them. Each request first reads
//! the lifecycle's ACL row: while that row still allows reads, the lifecycle is fenced on this
//! process (`plane/fence.rs`). It then waits for the durable joins and leaves already
//! running for the lifecycle, and only then joins the next shared read of the members bucket:
//! requests that are ready together share one read, and a read never started before a request
//! sharing it was ready.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::oneshot;

use crate::base::RowError;
use crate::plane::PlaneCtx;
use crate::plane::{
    split_member_key, MemberRead, MemberRow, Members, MembershipRecord, ProvedRows,
};
use crate::plane::{AclRow, Acls};
use crate::plane::{FenceError, Fences, MAX_FENCED};
use crate::wire::{
    Inventory, InventoryRow, LifecycleMemberships, LifecycleUid, Principal, Refusal, RefusalKind,
};

/// Bound on waiting for the joins and leaves already running for the lifecycle (a join may run
/// its activation catch-up, which the agent waits 30 s for).
pub const RUNNING_WRITES_BOUND: Duration = Duration::from_secs(35);
/// Row reads of one shared read kept in flight together.
const READS_IN_FLIGHT: usize = 32;

/// What one shared read answers a waiter: the read's number and the lifecycle's rows, or the
/// read's refusal, shared by every request that joined it.
type Shared = Result<(u64, Vec<MemberRow>), Arc<Refusal>>;

/// One lifecycle waiting for the next shared read.
struct Waiter {
    member: Principal,
    uid: LifecycleUid,
    answer: oneshot::Sender<Shared>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiter>,
    reading: bool,
}

/// The shared reads of the members bucket.
#[derive(Default)]
pub struct Inventories {
    queue: Mutex<Queue>,
    /// Number of shared reads started (the reply's `read`).
    reads: AtomicU64,
}

impl Inventories {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The rows of `(member, uid)` from the next shared read that starts after this call, with
    /// that read's number.
    async fn rows_of(
        self: &Arc<Self>,
        ctx: &PlaneCtx,
        member: &Principal,
        uid: &LifecycleUid,
    ) -> Result<(u64, Vec<MemberRow>), Refusal> {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut q = self.lock();
            q.waiting.push(Waiter {
                member: member.clone(),
                uid: uid.clone(),
                answer: tx,
            });
            !std::mem::replace(&mut q.reading, true)
        };
        if lead {
            // Detached from the request, so a cancelled caller never strands the others.
            let this = self.clone();
            let ctx = ctx.clone();
            tokio::spawn(async move { this.read_loop(&ctx).await });
        }
        match rx.await {
            Ok(answer) => answer.map_err(|shared| {
                // One refusal per request, caused by the read it shared.
                Refusal::new(shared.kind(), shared.text()).source(shared)
            }),
            Err(abandoned) => Err(Refusal::new(
                RefusalKind::Unavailable,
                "lifecycleMemberships: the shared read was abandoned",
            )
            .source(abandoned)),
        }
    }

    /// Serves batches until none is waiting: each batch is everything that waited when its read
    /// began.
    async fn read_loop(&self, ctx: &PlaneCtx) {
        loop {
            let batch = {
                let mut q = self.lock();
                if q.waiting.is_empty() {
                    q.reading = false;
                    return;
                }
                std::mem::take(&mut q.waiting)
            };
            let n = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
            let wanted: Vec<String> = batch
                .iter()
                .map(|w| format!("/{}.{}", w.member.dot_form(), w.uid))
                .collect();
            let read = shared_read(ctx, &wanted).await.map_err(Arc::new);
            for w in batch {
                let mine = read.as_ref().map(|rows| {
                    let rows = rows
                        .iter()
                        .filter(|r| r.member == w.member && r.uid == w.uid)
                        .cloned()
                        .collect();
                    (n, rows)
                });
                let _ = w.answer.send(mine.map_err(Clone::clone));
            }
        }
    }
}

/// One read of the members bucket, the rows whose key ends with one of `suffixes`
/// (`/<o>.<a>.<uid>`): from the plane's members cache, proved current by a leader fence asked
/// after every request of the batch was ready (the same moment a leader read started now
/// reads at), or, when the cache is not proved, every key listed and the wanted rows read from
/// the leader.
async fn shared_read(ctx: &PlaneCtx, suffixes: &[String]) -> Result<Vec<MemberRow>, Refusal> {
    let fail = |e: &dyn std::fmt::Display| {
        Refusal::new(
            RefusalKind::Unavailable,
            format!("lifecycleMemberships: could not read the members registry: {e}"),
        )
    };
    let wanted = |k: &str| suffixes.iter().any(|s| k.ends_with(s.as_str()));
    let proved = ProvedRows::new(ctx.caches.members.clone(), ctx.clone());
    if let Some(rows) = proved.scan_matching(wanted).await {
        let mut out = Vec::new();
        for (key, row) in rows {
            let (_, member, uid) = split_member_key(&key)
                .ok_or_else(|| fail(&format!("a member key does not parse: {key}")))?;
            match serde_json::from_slice::<MembershipRecord>(&row.value) {
                Ok(record) => out.push(MemberRow {
                    member,
                    uid,
                    record,
                    revision: row.revision,
                }),
                Err(e) => {
                    let e = crate::plane::RowDecodeError::from(e);
                    return Err(fail(&format!("a member row does not parse ({e})")).source(e));
                }
            }
        }
        return Ok(out);
    }
    let broker = |e: RowError| fail(&e).source(e);
    let members = Members::open(ctx).await.map_err(broker)?;
    let keys = crate::base::keys(
        &ctx.js,
        members.rows().bucket(),
        ">",
        ctx.config.request_bound,
    )
    .await
    .map_err(broker)?;
    let wanted: Vec<String> = keys.into_iter().filter(|k| wanted(k)).collect();
    let work: Vec<_> = wanted
        .into_iter()
        .map(|key| {
            let members = members.clone();
            async move {
                let (channel, member, uid) = split_member_key(&key)
                    .ok_or_else(|| fail(&format!("a member key does not parse: {key}")))?;
                let read = members.read(&channel, &member, &uid).await;
                Ok::<_, Refusal>((member, uid, read))
            }
        })
        .collect();
    let reads: Vec<_> = futures::stream::iter(work)
        .buffered(READS_IN_FLIGHT)
        .collect()
        .await;
    let mut out = Vec::new();
    for r in reads {
        let (member, uid, read) = r?;
        match read.map_err(broker)? {
            MemberRead::Present(record, revision) => out.push(MemberRow {
                member,
                uid,
                record,
                revision,
            }),
            MemberRead::Absent { .. } => {}
            MemberRead::Garbled(e) => {
                return Err(fail(&format!("a member row does not parse ({e})")).source(e))
            }
        }
    }
    Ok(out)
}

/// `lifecycleMemberships {principal, lifecycleUid}` →
/// `{principal, lifecycleUid, fenced, read, memberships: [{channel, generation, activated,
/// joinCursor, leaveCursor?, revision}]}` (every row of the lifecycle, tombstones included).
pub async fn lifecycle_memberships(
    ctx: &PlaneCtx,
    fences: &Fences,
    inventories: &Arc<Inventories>,
    args: &LifecycleMemberships,
) -> Result<Inventory, Refusal> {
    let (member, uid) = (&args.principal, &args.lifecycle_uid);
    // The fence: set the moment the request is handled, if the row still allows reads. A row
    // that cannot be read is fenced too (it might allow reads).
    let acls = Acls::open(ctx).await;
    let allows_reads = match &acls {
        Ok(acls) => match acls.read(member, uid).await {
            Ok(AclRow::Present { record, .. }) => {
                !record.is_retired() && !record.allow_subscribe.is_empty()
            }
            Ok(AclRow::Absent) | Ok(AclRow::Garbled(_)) => false,
            Err(_) => true,
        },
        Err(_) => true,
    };
    if allows_reads {
        fences.fence(member, uid).map_err(|e| match e {
            FenceError::Full => Refusal::new(
                RefusalKind::Busy,
                format!(
                    "lifecycleMemberships: this daemon already fences {MAX_FENCED} lifecycles; narrow the row to no reads first, or restart the daemon"
                ),
            ),
            other => Refusal::new(
                RefusalKind::Conflict,
                format!("lifecycleMemberships: {other:?}"),
            ),
        })?;
    }
    fences
        .settled(member, uid, RUNNING_WRITES_BOUND)
        .await
        .map_err(|e| match e {
            FenceError::StillRunning { running, bound_ms } => Refusal::new(
                RefusalKind::Conflict,
                format!(
                    "lifecycleMemberships: {running} durable join/leave of {member} lifecycle {uid} still running after {bound_ms} ms; retry"
                ),
            ),
            other => Refusal::new(
                RefusalKind::Conflict,
                format!("lifecycleMemberships: {other:?}"),
            ),
        })?;
    let (read, rows) = inventories.rows_of(ctx, member, uid).await?;
    Ok(Inventory {
        principal: member.dot_form(),
        lifecycle_uid: uid.as_str().to_string(),
        fenced: fences.is_fenced(member, uid),
        read,
        memberships: rows
            .iter()
            .map(|r| InventoryRow {
                channel: r.record.channel.clone(),
                generation: r.record.generation,
                activated: r.record.activated.unwrap_or(false),
                join_cursor: r.record.join_cursor,
                leave_cursor: r.record.leave_cursor,
                revision: r.revision,
            })
            .collect(),
    })
}
