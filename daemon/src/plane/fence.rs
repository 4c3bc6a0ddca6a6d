//! The daemon's own join/leave fence for retiring lifecycles.
//!
//! A manager that does not narrow a retiring lifecycle's read-ACL row before it asks for the
//! lifecycle's inventory would otherwise race a durable join: the join could write a row after
//! the inventory's read, and that row would be neither in the inventory nor gone. So an
//! inventory that arrives while the row still allows reads *fences* the lifecycle on this
//! daemon process: every later durable join and leave of it is refused. Either way the
//! inventory's read waits until the joins and leaves already running for the lifecycle have
//! finished. The registry lives for the process (a retired lifecycle never comes back; the fence
//! is scoped to "that daemon process", docs/admin.md). The durable join and leave transactions
//! (`plane::durable`) register here; the inventory verb (the rails ring) sets the fence.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

use crate::wire::{LifecycleUid, Principal};

/// Most fenced lifecycles one process remembers; beyond it an inventory that would fence is
/// refused (a restart clears the registry, and a narrowed row needs no mark).
pub const MAX_FENCED: usize = 1_000_000;

type Key = (Principal, LifecycleUid);

#[derive(Default)]
struct State {
    fenced: HashSet<Key>,
    /// Durable joins and leaves running now, per lifecycle.
    running: HashMap<Key, usize>,
}

/// The fence registry one daemon process shares between both rails.
#[derive(Default)]
pub struct Fences {
    state: Mutex<State>,
    /// Woken whenever a running write finishes.
    finished: Notify,
}

/// Why a fence operation refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceError {
    /// The lifecycle is fenced: its durable joins and leaves are refused on this process.
    Fenced,
    /// The registry is full.
    Full,
    /// The running writes did not finish within the bound.
    StillRunning { running: usize, bound_ms: u128 },
}

/// A running durable join or leave; dropping it marks the write finished.
pub struct Running<'a> {
    fences: &'a Fences,
    key: Key,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut state = self.fences.lock();
        if let Some(n) = state.running.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                state.running.remove(&self.key);
            }
        }
        drop(state);
        self.fences.finished.notify_waiters();
    }
}

impl Fences {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a durable join or leave of `(member, uid)`, refused when the lifecycle is
    /// fenced. The check and the registration are one step, so a fence set after this returns
    /// waits for the write, and a write that starts after the fence is refused.
    pub fn begin(&self, member: &Principal, uid: &LifecycleUid) -> Result<Running<'_>, FenceError> {
        let key = (member.clone(), uid.clone());
        let mut state = self.lock();
        if state.fenced.contains(&key) {
            return Err(FenceError::Fenced);
        }
        *state.running.entry(key.clone()).or_insert(0) += 1;
        Ok(Running { fences: self, key })
    }

    /// Fences `(member, uid)` from now on (idempotent).
    pub fn fence(&self, member: &Principal, uid: &LifecycleUid) -> Result<(), FenceError> {
        let key = (member.clone(), uid.clone());
        let mut state = self.lock();
        if !state.fenced.contains(&key) && state.fenced.len() >= MAX_FENCED {
            return Err(FenceError::Full);
        }
        state.fenced.insert(key);
        Ok(())
    }

    pub fn is_fenced(&self, member: &Principal, uid: &LifecycleUid) -> bool {
        self.lock().fenced.contains(&(member.clone(), uid.clone()))
    }

    /// Waits, at most `bound`, until no durable join or leave of `(member, uid)` is running.
    pub async fn settled(
        &self,
        member: &Principal,
        uid: &LifecycleUid,
        bound: Duration,
    ) -> Result<(), FenceError> {
        let key = (member.clone(), uid.clone());
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            // Register interest before checking, so a finish between the check and the wait
            // still wakes this waiter.
            let notified = self.finished.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let running = self.lock().running.get(&key).copied().unwrap_or(0);
            if running == 0 {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(FenceError::StillRunning {
                    running,
                    bound_ms: bound.as_millis(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (Principal, LifecycleUid) {
        (
            Principal::parse("local.alice").unwrap(),
            LifecycleUid::parse(&"a".repeat(26)).unwrap(),
        )
    }

    /// Mutation: dropping the `fenced.contains` check in `begin` lets a join through after the
    /// fence, and this test fails.
    #[test]
    fn a_fenced_lifecycle_refuses_later_writes_only() {
        let f = Fences::default();
        let (p, u) = key();
        let other = LifecycleUid::parse(&"b".repeat(26)).unwrap();
        let before = f.begin(&p, &u).expect("not fenced yet");
        f.fence(&p, &u).unwrap();
        assert_eq!(f.begin(&p, &u).err(), Some(FenceError::Fenced));
        assert!(
            f.begin(&p, &other).is_ok(),
            "another lifecycle is untouched"
        );
        drop(before);
        assert!(f.is_fenced(&p, &u));
    }

    /// Mutation: making `settled` return at once (skip the running count) fails this test: the
    /// wait must end only after the running write finished.
    #[tokio::test]
    async fn settled_waits_for_the_running_writes() {
        let f = std::sync::Arc::new(Fences::default());
        let (p, u) = key();
        let running = f.begin(&p, &u).unwrap();
        let err = f
            .settled(&p, &u, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(matches!(err, FenceError::StillRunning { running: 1, .. }));
        let f2 = f.clone();
        let (p2, u2) = (p.clone(), u.clone());
        let waiter =
            tokio::spawn(async move { f2.settled(&p2, &u2, Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(running);
        assert_eq!(waiter.await.unwrap(), Ok(()));
    }
}
