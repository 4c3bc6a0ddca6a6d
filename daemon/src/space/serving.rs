//! Plane-3 bindings as one unit the lease can arm and quiesce.
//!
//! The daemon serves only under its lease. When the lease is in doubt it *quiesces*: the fan-out
//! writer, the trusted reader, both control rails and the `live.delivery` responder are unbound, nothing more is acked, and a
//! request admitted before the quiesce is refused rather than answered. The gate carries that
//! decision to every in-flight handler; `Plane` owns the bound tasks.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::plane::{PlaneCtx, PlaneError};
use crate::rails::AdminParts;
use crate::rails::LeaseSelf;

/// The bound components of one arming.
struct Bound {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// Bound on waiting for the bound tasks to wind down at a quiesce.
const QUIESCE_BOUND: Duration = Duration::from_secs(5);
// A rail's wait for its running handlers ends inside the bound its own task is given.
const _: () = assert!(crate::rails::HANDLER_JOIN_BOUND.as_millis() < QUIESCE_BOUND.as_millis());

/// Owner of the Plane-3 tasks.
pub struct Plane {
    ctx: PlaneCtx,
    /// What the rails serve beside the context (credential verbs, `$SYS` pair, fences).
    admin: AdminParts,
    /// This daemon in its lease row, which the `live.delivery` responder grades probes by.
    lease_self: LeaseSelf,
    bound: Option<Bound>,
}

impl Plane {
    pub fn new(ctx: PlaneCtx, admin: AdminParts, lease_self: LeaseSelf) -> Plane {
        Plane {
            ctx,
            admin,
            lease_self,
            bound: None,
        }
    }

    /// The counters of this space (the keeper counts renewals through them).
    pub fn metrics(&self) -> &crate::base::Metrics {
        &self.ctx.metrics
    }

    /// The fenced row caches (their totals are sampled as metrics).
    pub fn caches(&self) -> crate::plane::Caches {
        self.ctx.caches.clone()
    }

    /// The members registry as the membership feed reads it: the plane's members cache, proved
    /// at each read (one cached copy of the registry per daemon, not one per reader).
    pub fn proved_members(&self) -> crate::plane::ProvedRows {
        crate::plane::ProvedRows::new(self.ctx.caches.members.clone(), self.ctx.clone())
    }

    /// The serving gate (sampled as the lease-held gauge).
    pub fn gate(&self) -> crate::plane::ServingGate {
        self.ctx.gate.clone()
    }

    /// Binds the fan-out writer and the trusted reader, opens the gate, then binds both rails. On
    /// a failure everything bound so far is unbound again and the gate is closed.
    pub async fn arm(&mut self) -> Result<(), PlaneError> {
        if self.bound.is_some() {
            return Ok(());
        }
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let result = async {
            // The caches start empty (not proved: per-key reads) and fill while serving.
            tasks.push(self.ctx.caches.start(&self.ctx, stop_rx.clone()));
            tasks.push(crate::plane::bind_fanout(&self.ctx, stop_rx.clone()).await?);
            tasks.push(crate::plane::bind_reader(&self.ctx, stop_rx.clone()).await?);
            // Open before the rails: a request a rail takes between its binding and the end of
            // `arm` must be admitted, not refused as "not serving" by a gate about to open.
            self.ctx.gate.open();
            for service in [
                crate::wire::CtlService::Delivery,
                crate::wire::CtlService::DeliveryAdmin,
            ] {
                tasks.push(
                    crate::rails::bind(&self.ctx, self.admin.clone(), service, stop_rx.clone())
                        .await?,
                );
            }
            // Anycast records (docs/anycast.md) are fail-soft: a take rail that cannot bind is
            // logged and delivery serves on without it.
            match crate::rails::bind(
                &self.ctx,
                self.admin.clone(),
                crate::wire::CtlService::Anycast,
                stop_rx.clone(),
            )
            .await
            {
                Ok(task) => tasks.push(task),
                Err(e) => self.ctx.journal.line(format!(
                    "! anycast records: the take rail did not bind ({e}); takes go unrecorded until the next re-arm, delivery is unaffected"
                )),
            }
            tasks.push(crate::rails::bind_sweeper(&self.ctx, stop_rx.clone()));
            // A fresh opaque instance token per bind (re-minted on every re-arm).
            let instance = uuid::Uuid::new_v4().simple().to_string();
            tasks.push(
                crate::rails::bind_liveness(
                    &self.ctx,
                    self.lease_self.clone(),
                    instance,
                    stop_rx.clone(),
                )
                .await?,
            );
            Ok::<(), PlaneError>(())
        }
        .await;
        let bound = Bound { stop, tasks };
        match result {
            Ok(()) => {
                self.bound = Some(bound);
                Ok(())
            }
            Err(e) => {
                self.ctx.gate.close();
                unbind(bound).await;
                Err(e)
            }
        }
    }

    /// Closes the gate first (nothing admitted before acts after this), then unbinds.
    pub async fn quiesce(&mut self) {
        self.stop_serving();
        self.unbind().await;
    }

    /// Closes the gate: from here on nothing this plane admitted acts (acks, replies, writes).
    /// The moment this daemon stops serving, whatever its tasks still take to wind down.
    pub fn stop_serving(&mut self) {
        self.ctx.gate.close();
    }

    /// Ends the bound tasks, each within [`QUIESCE_BOUND`]; the gate is already closed.
    pub async fn unbind(&mut self) {
        if let Some(bound) = self.bound.take() {
            unbind(bound).await;
        }
    }
}

impl Plane {
    /// Closes the gate and ends the bound tasks where they are, without waiting for them to
    /// wind down: for a daemon leaving on a transport verdict, whose broker can take nothing.
    pub fn abort(&mut self) {
        self.ctx.gate.close();
        if let Some(bound) = self.bound.take() {
            let _ = bound.stop.send(true);
            for task in bound.tasks {
                task.abort();
            }
        }
    }
}

async fn unbind(bound: Bound) {
    let _ = bound.stop.send(true);
    for task in bound.tasks {
        let abort = task.abort_handle();
        if tokio::time::timeout(QUIESCE_BOUND, task).await.is_err() {
            abort.abort();
        }
    }
}
