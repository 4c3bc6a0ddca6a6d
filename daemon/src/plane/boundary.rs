//! The strict leave boundary between the trusted reader and `durableLeave`.
//!
//! Why: the reader decides an entry from a proved cache and then publishes its handoff. A leave
//! written between that decision and the handoff would otherwise be answered while a copy the
//! old row admitted is still on its way to the member. Every reader decision holds a [`Ticket`]
//! from before its fence until its handoff is acknowledged (or it decided not to surface); a
//! leave, after its row write, waits until every ticket taken before the write finished, so
//! once the leave is answered every later decision sees the leave.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Default)]
struct State {
    next: u64,
    active: BTreeSet<u64>,
}

/// Reader decisions in flight.
#[derive(Default)]
pub struct Handoffs {
    state: Mutex<State>,
    finished: Notify,
}

/// One reader decision in flight; dropping it marks it finished.
pub struct Ticket {
    owner: Arc<Handoffs>,
    id: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.owner.lock().active.remove(&self.id);
        self.owner.finished.notify_waiters();
    }
}

impl Handoffs {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A ticket for a decision about to be made.
    pub fn ticket(self: &Arc<Self>) -> Ticket {
        let mut st = self.lock();
        let id = st.next;
        st.next += 1;
        st.active.insert(id);
        Ticket {
            owner: self.clone(),
            id,
        }
    }

    /// The mark of this moment: tickets taken before it are below it.
    pub fn mark(&self) -> u64 {
        self.lock().next
    }

    /// Waits until every ticket below `mark` finished; `false` when `bound` passed first.
    pub async fn drain_before(&self, mark: u64, bound: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let notified = self.finished.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self
                .lock()
                .active
                .first()
                .is_none_or(|first| *first >= mark)
            {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation: comparing with `>` instead of `>=` (waiting for the ticket at the mark, taken
    /// after it) fails the second assertion.
    #[tokio::test]
    async fn a_leave_waits_for_earlier_decisions_only() {
        let h = Arc::new(Handoffs::default());
        let early = h.ticket();
        let mark = h.mark();
        let _late = h.ticket();
        assert!(
            !h.drain_before(mark, Duration::from_millis(30)).await,
            "an earlier decision is in flight"
        );
        let waiter = {
            let h = h.clone();
            tokio::spawn(async move { h.drain_before(mark, Duration::from_secs(5)).await })
        };
        drop(early);
        assert!(waiter.await.unwrap(), "later decisions are not waited for");
    }
}
