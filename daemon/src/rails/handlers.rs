//! The request handlers of one bound rail: at most [`RAIL_IN_FLIGHT_REQUESTS`] at once, each
//! in a `JoinSet` the rail joins when it is unbound.
//!
//! Why bounded: a rail used to spawn one task per request with nothing that limited or joined
//! them, so a flood of slow requests (a join's catch-up, a leave's boundary wait) grew without
//! bound and outlived the binding. A request that finds every permit taken waits in the
//! subscription (the broker's and the client's buffers), not in a task. Why joined with a
//! bound and then detached rather than aborted: a handler admitted before the stop sees the
//! closed gate at its next step and refuses, taking back what it wrote; aborting it between its
//! write and its undo would leave the row it was about to take back. Each handler is bounded by
//! its own waits (the broker bound, the leave's boundary, the inventory's wait), so a detached
//! one still ends; the count is reported (`RUST_LOG=cotal_delivery=info`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::plane::{stopped, StopRx};

/// Requests one rail handles at once; the next one waits for a permit.
pub const RAIL_IN_FLIGHT_REQUESTS: usize = 64;
/// How long an unbound rail waits for its running handlers before it leaves the rest to end on
/// their own: a handler past the closed gate refuses at its next step, and two seconds cover a
/// refusal's steps (its undo included) on a healthy broker.
pub const HANDLER_JOIN_BOUND: Duration = Duration::from_secs(2);

/// How a rail's handlers ended at its unbind (vector's stop reports the same way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Unbound {
    /// Handlers that finished within [`HANDLER_JOIN_BOUND`].
    pub joined: usize,
    /// Handlers still running after it, left to end on their own.
    pub detached: usize,
}

/// The running handlers of one rail.
pub struct Handlers {
    limit: Arc<Semaphore>,
    tasks: JoinSet<()>,
}

impl Handlers {
    pub fn new() -> Handlers {
        Handlers {
            limit: Arc::new(Semaphore::new(RAIL_IN_FLIGHT_REQUESTS)),
            tasks: JoinSet::new(),
        }
    }

    /// Runs `work` once a permit is free. Hands `work` back, unstarted, when `stop` fires
    /// first (the rail answers it while it drains).
    pub async fn spawn<F>(&mut self, stop: &mut StopRx, work: F) -> Result<(), F>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let permit = match self.limit.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => tokio::select! {
                p = self.limit.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return Err(work),
                },
                _ = stopped(stop) => return Err(work),
            },
        };
        self.tasks.spawn(async move {
            let _permit = permit;
            work.await;
        });
        Ok(())
    }

    /// Runs `work` beside the bounded handlers (the admin rail's one serial worker).
    pub fn spawn_worker<F>(&mut self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(work);
    }

    /// Resolves once a finished handler is reaped; `None` at once while none runs.
    pub async fn reaped(&mut self) -> Option<()> {
        self.tasks.join_next().await.map(|_| ())
    }

    /// Waits up to [`HANDLER_JOIN_BOUND`] for every handler, then leaves the rest running and
    /// reports both counts under `what`.
    pub async fn join(mut self, what: &str) -> Unbound {
        let mut report = Unbound::default();
        let deadline = tokio::time::Instant::now() + HANDLER_JOIN_BOUND;
        while !self.tasks.is_empty() {
            match tokio::time::timeout_at(deadline, self.tasks.join_next()).await {
                Ok(Some(_)) => report.joined += 1,
                Ok(None) => break,
                Err(_) => {
                    report.detached = self.tasks.len();
                    self.tasks.detach_all();
                    break;
                }
            }
        }
        if report.detached > 0 {
            tracing::info!(
                rail = what,
                joined = report.joined,
                detached = report.detached,
                "unbound with requests still running after {} ms; they end on their own",
                HANDLER_JOIN_BOUND.as_millis()
            );
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::{watch, Notify};

    /// Every permit held by a blocked handler: the next request waits, and runs once one ends.
    /// Mutation seen failing: the semaphore sized `RAIL_IN_FLIGHT_REQUESTS + 1`.
    #[tokio::test]
    async fn the_request_after_the_bound_waits_for_a_permit() {
        let (_tx, mut stop) = watch::channel(false);
        let mut handlers = Handlers::new();
        let release = Arc::new(Notify::new());
        for _ in 0..RAIL_IN_FLIGHT_REQUESTS {
            let release = release.clone();
            let spawned = handlers
                .spawn(&mut stop, async move { release.notified().await })
                .await;
            assert!(spawned.is_ok());
        }
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        {
            let next = handlers.spawn(&mut stop, async move {
                r.fetch_add(1, Ordering::SeqCst);
            });
            tokio::pin!(next);
            let early = tokio::time::timeout(Duration::from_millis(200), &mut next).await;
            assert!(early.is_err(), "spawned past the bound");
            release.notify_one();
            assert!(next.await.is_ok(), "spawned once a permit was free");
        }
        let report = handlers.join("test").await;
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(report.detached, RAIL_IN_FLIGHT_REQUESTS - 1);
        release.notify_waiters();
    }

    /// At the unbind a finished handler is joined and one still running is left to end on its
    /// own (not aborted: it finishes after the join). A stop while a request waits for a permit
    /// hands the request back. Mutation seen failing: `abort_all()` instead of `detach_all()`
    /// (the late handler never sets its flag).
    #[tokio::test]
    async fn an_unbind_joins_what_finished_and_leaves_the_rest_running() {
        let (tx, mut stop) = watch::channel(false);
        let mut handlers = Handlers::new();
        let late = Arc::new(Notify::new());
        let finished = Arc::new(AtomicUsize::new(0));
        assert!(handlers.spawn(&mut stop, async {}).await.is_ok());
        let (l, f) = (late.clone(), finished.clone());
        let slow = async move {
            l.notified().await;
            f.fetch_add(1, Ordering::SeqCst);
        };
        assert!(handlers.spawn(&mut stop, slow).await.is_ok());
        for _ in 0..RAIL_IN_FLIGHT_REQUESTS - 1 {
            let l = late.clone();
            let held = async move { l.notified().await };
            assert!(handlers.spawn(&mut stop, held).await.is_ok());
        }
        let _ = tx.send(true);
        assert!(
            handlers.spawn(&mut stop, async {}).await.is_err(),
            "handed back at the stop"
        );
        let report = handlers.join("test").await;
        assert_eq!(report.joined, 1);
        assert_eq!(report.detached, RAIL_IN_FLIGHT_REQUESTS);
        late.notify_waiters();
        for _ in 0..100 {
            if finished.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            finished.load(Ordering::SeqCst),
            1,
            "the detached handler ran on"
        );
    }
}
