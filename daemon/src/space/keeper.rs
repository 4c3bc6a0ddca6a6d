//! The keeper: holds the lease of a serving daemon and arbitrates every doubt about it.
//!
//! Why: the daemon serves only under its lease. When a renew fails or the watch sees a write that
//! is not its own, the keeper quiesces first (nothing admitted before acts after), then re-reads
//! the key from the leader and decides: still ours (resume), gone (re-create), taken (leave).

use std::time::Duration;

use tokio::sync::broadcast;

use crate::base::{ConnEvent, Journal, Resident};
use crate::space::closed::{claim_outcome, stop_line, Closed};
use crate::space::health::{HealthHandle, Verdict};
use crate::space::serving::Plane;
use crate::space::{
    lease::ClaimError, lease::Lease, lease::Reading, lease::ReleaseError, lease::ReleaseErrorKind,
    lease::Released,
};
use crate::wire::Space;
use crate::wire::SHARD;

/// How long a signalled release waits for a redialing connection, counted from the drop (five
/// seconds, docs/operations.md). Not [`crate::base::BROKER_BOUND`]: it waits for a
/// reconnect, and the release's own request is bounded by that after it.
pub const RELEASE_REDIAL_BOUND: Duration = Duration::from_secs(5);
/// Bound on the whole signalled shutdown; past it the daemon closes anyway.
pub const SHUTDOWN_BOUND: Duration = Duration::from_secs(10);
/// Bound on draining the resident connection at the close.
const DRAIN_BOUND: Duration = Duration::from_secs(2);
// The default redial wait and the release after it fit the shutdown bound.
const _: () = assert!(
    RELEASE_REDIAL_BOUND.as_millis() + crate::base::BROKER_BOUND.as_millis()
        <= SHUTDOWN_BOUND.as_millis()
);

/// The lease, the plane it guards, and what has been said about them.
pub(crate) struct Keeper {
    pub(crate) journal: Journal,
    pub(crate) space: Space,
    pub(crate) lease: Lease,
    pub(crate) plane: Plane,
    /// Last lease state reported (`held`, `held-unrenewed`, `unknown`), so lines print on change.
    pub(crate) noted: &'static str,
    pub(crate) quiesced: bool,
    pub(crate) connected: bool,
    pub(crate) events: broadcast::Receiver<ConnEvent>,
    pub(crate) resident: Resident,
    /// Told to stand down when the daemon leaves on its own account.
    pub(crate) health: HealthHandle,
    /// How long a release waits for a dropped connection to come back, from the drop.
    pub(crate) redial_wait: Duration,
    /// The lease bucket's TTL: a renew not answered within it of our last write is given up.
    pub(crate) ttl: Duration,
}

impl Keeper {
    pub(crate) fn note(&mut self, state: &'static str, what: &str) {
        if self.noted == state {
            return;
        }
        self.noted = state;
        let mark = if state == "held" { "✓" } else { "!" };
        self.journal.line(format!(
            "{mark} delivery: {what} (space {}, shard {SHARD})",
            self.space
        ));
    }

    pub(crate) async fn quiesce(&mut self) {
        self.plane.stop_serving();
        // Said as the gate closes, the moment nothing admitted acts any more (what "unbound"
        // means to a request), before the tasks wind down (up to their bound while the broker
        // does not answer) and before the not-ready write, which waits for the broker: a reader
        // of the log times the end of serving by this line. Found by the simulation's seed 6013,
        // whose takeover overlapped a line written 2 s after the gate closed.
        if !self.quiesced {
            self.quiesced = true;
            self.journal.line(format!(
                "! delivery: stopped serving shard {SHARD} (fan-out, reader and control unbound) while it re-checks who owns the lease (space {})",
                self.space
            ));
        }
        self.plane.unbind().await;
        let _ = self.lease.mark_not_ready().await;
    }

    pub(crate) async fn resume(&mut self, why: &str) {
        if let Err(e) = self.plane.arm().await {
            self.journal.line(format!(
                "! delivery: {why} but could not resume Plane-3 ({e})"
            ));
            return;
        }
        if let Err(e) = self.lease.mark_ready().await {
            self.journal.line(format!(
                "! delivery: resumed serving but could not mark the lease ready ({e}); the next renew re-synchronises"
            ));
        }
        if self.quiesced {
            self.quiesced = false;
            self.journal.line(format!(
                "✓ delivery: serving shard {SHARD} again, {why} (space {})",
                self.space
            ));
        }
    }

    /// Renew at TTL/2; on failure quiesce first, then arbitrate on a re-read. A renew still
    /// unanswered when the row may have expired counts as failed there and then: a standby may
    /// take the row from that moment on, and this daemon must not be serving beside it.
    pub(crate) async fn on_renew_tick(&mut self) -> Option<Closed> {
        match self.lease.renew_within(self.ttl).await {
            Ok(_) => {
                self.plane.metrics().lease_renewed();
                if self.quiesced {
                    self.resume("it renewed its lease").await;
                }
                self.note("held", "renews its delivery lease again");
                None
            }
            Err(e) => {
                let why = e.to_string();
                self.quiesce().await;
                match self.lease.read_own().await {
                    Reading::Held { revision } => {
                        self.lease.adopt_revision(revision);
                        self.resume("re-reading the key showed the lease is still its own")
                            .await;
                        self.note(
                            "held-unrenewed",
                            &format!("could not renew its lease ({why}) but the key is still its own; serving, retrying"),
                        );
                        None
                    }
                    Reading::Unknown { why: unknown } => {
                        self.note(
                            "unknown",
                            &format!("could not renew its lease ({why}) or re-read it ({unknown}); staying quiet, retrying until the broker answers"),
                        );
                        None
                    }
                    Reading::Gone => self.reacquire(&format!("renew: {why}"), false).await,
                    Reading::Taken { by } => {
                        self.lease.forget();
                        self.journal.line(format!(
                            "✗ delivery: the lease for shard {SHARD} is held by {by}, not by this process (renew: {why}), exiting so the holder is single"
                        ));
                        Some(Closed::LeaseTaken { by })
                    }
                }
            }
        }
    }

    /// A change of the key that is not our own write: quiesce first, then arbitrate.
    pub(crate) async fn on_watch_event(&mut self) -> Option<Closed> {
        self.quiesce().await;
        match self.lease.read_own().await {
            Reading::Held { revision } => {
                self.lease.adopt_revision(revision);
                self.resume("a lease watch event fired but the key is still its own")
                    .await;
                None
            }
            Reading::Unknown { why } => {
                self.note(
                    "unknown",
                    &format!("a lease watch event fired and the key could not be re-read ({why}); staying quiet until the broker answers"),
                );
                None
            }
            Reading::Gone => self.reacquire("a lease watch event", true).await,
            Reading::Taken { by } => {
                self.lease.forget();
                self.journal.line(format!(
                    "✗ delivery: a lease watch event read the key as held by {by}, not by this process, exiting so the holder is single"
                ));
                Some(Closed::LeaseTaken { by })
            }
        }
    }

    pub(crate) async fn reacquire(&mut self, cause: &str, from_watch: bool) -> Option<Closed> {
        match self.lease.reacquire().await {
            Ok(revision) => {
                self.resume(&format!("it won the atomic create at revision {revision}"))
                    .await;
                let what = if from_watch {
                    format!("a lease watch event found its lease key gone and re-acquired it at revision {revision}")
                } else {
                    format!("found its lease key gone ({cause}) and re-acquired it at revision {revision}")
                };
                self.noted = "";
                self.note("held", &what);
                None
            }
            Err(e) => {
                self.lease.forget();
                let line = match &e {
                    ClaimError::Held { detail } if from_watch => format!("✗ delivery: a lease watch event found the key gone and another daemon has taken shard {SHARD} ({detail}), exiting so the holder is single"),
                    ClaimError::Held { detail } => format!("✗ delivery: lost the lease ({cause}) and another daemon has taken shard {SHARD} ({detail}), exiting so the holder is single"),
                    _ => format!("✗ delivery: could not re-acquire the lease for shard {SHARD} ({e}); it serves only under its lease, exiting"),
                };
                self.journal.line(line);
                Some(claim_outcome(&e).1)
            }
        }
    }

    pub(crate) fn on_conn_event(&mut self, ev: Result<ConnEvent, broadcast::error::RecvError>) {
        match ev {
            Ok(ConnEvent::Connected) => self.connected = true,
            Ok(ConnEvent::Disconnected) | Ok(ConnEvent::Closed) => self.connected = false,
            _ => {}
        }
    }

    /// Leaves on a transport-health verdict: the broker cannot take a release now (it is gone,
    /// or this credential expired), so the lease is left to the bucket TTL and nothing waits
    /// for a redial.
    pub(crate) async fn abandon(mut self, verdict: Verdict) -> Closed {
        self.lease.forget();
        // Nothing is flushed to a broker that is gone: the gate closes (nothing admitted before
        // acts after) and the plane's tasks are ended where they wait, not waited for.
        self.plane.abort();
        // An expired credential can flush nothing: the broker is closing this connection, and
        // a drain would wait out its bound past a host's grace (the lane would be reopened
        // while its daemon is still closing).
        let drain = match verdict {
            Verdict::CredentialExpired | Verdict::CredentialLapsed => Duration::ZERO,
            Verdict::BrokerGone | Verdict::Backstop => DRAIN_BOUND,
        };
        self.resident.close(drain).await;
        Closed::of_verdict(verdict)
    }

    pub(crate) async fn stop_signalled(self, by: &'static str) -> Closed {
        self.journal.line(stop_line(by, &self.space));
        self.stop(by).await
    }

    /// Stopped by request: withdraw serving, release the row this instance owns, close.
    pub(crate) async fn stop(mut self, by: &'static str) -> Closed {
        let release = self.shutdown().await;
        Closed::Stopped { by, release }
    }

    /// Leaves for `closed`, releasing what this instance still owns on the way out.
    pub(crate) async fn leave(mut self, closed: Closed) -> Closed {
        let _ = self.shutdown().await;
        closed
    }

    /// Stop serving, release the lease at the broker's revision (if still ours), close the
    /// connection so it never reconnects. Bounded by [`SHUTDOWN_BOUND`].
    async fn shutdown(&mut self) -> Result<Released, ReleaseError> {
        // From here the connection's events are this daemon closing it, not the broker.
        self.health.stand_down();
        let bound = SHUTDOWN_BOUND.max(self.redial_wait + crate::base::BROKER_BOUND);
        let work = async {
            self.plane.quiesce().await;
            let release = self.release().await;
            if let Err(e) = &release {
                if e.kind() != ReleaseErrorKind::Foreign {
                    self.journal.line(format!(
                        "! delivery: could not release the lease for shard {SHARD} ({e}); the bucket TTL will expire it"
                    ));
                }
            }
            release
        };
        let release = match tokio::time::timeout(bound, work).await {
            Ok(release) => release,
            Err(_) => {
                self.journal.line(format!(
                    "! delivery: shutdown did not finish within {} s; exiting anyway",
                    bound.as_secs()
                ));
                Err(ReleaseError::new(
                    ReleaseErrorKind::Unconfirmed,
                    format!("the shutdown did not finish within {} s", bound.as_secs()),
                ))
            }
        };
        self.resident.close(DRAIN_BOUND).await;
        release
    }

    /// The release of the row this instance owns. When the connection is down, or drops while
    /// the release is in flight, it waits for the redial up to `redial_wait` counted from the
    /// drop, repeats the release once on the reconnected connection, then decides.
    pub(crate) async fn release(&mut self) -> Result<Released, ReleaseError> {
        if self.lease.revision().is_none() {
            return Ok(Released::NotHeld);
        }
        if self.is_down() {
            self.journal.line(format!(
                "! delivery: the broker connection is down at the release of shard {SHARD}; waiting up to {} ms from the drop for it to come back (space {})",
                self.redial_wait.as_millis(),
                self.space
            ));
        }
        self.wait_redial().await?;
        let attempt_at = tokio::time::Instant::now();
        match self.lease.release().await {
            Ok(r) => Ok(r),
            Err(e) if e.kind() == ReleaseErrorKind::Foreign => Err(e),
            Err(e) => {
                let dropped = self.resident.link.dropped_at();
                let dropped_in_flight = dropped.is_some_and(|at| at >= attempt_at.into_std());
                if !dropped_in_flight && !self.is_down() {
                    return Err(e);
                }
                self.journal.line(format!(
                    "! delivery: the broker connection dropped while the release of shard {SHARD} was in flight ({e}); waiting up to {} ms from the drop to repeat it once (space {})",
                    self.redial_wait.as_millis(),
                    self.space
                ));
                self.wait_redial().await?;
                self.lease.release().await
            }
        }
    }

    fn is_down(&self) -> bool {
        use async_nats::connection::State;
        self.resident.client.connection_state() != State::Connected
    }

    /// Waits while the connection is down, up to `redial_wait` from the moment it dropped.
    async fn wait_redial(&mut self) -> Result<(), ReleaseError> {
        if !self.is_down() {
            return Ok(());
        }
        let since = self
            .resident
            .link
            .dropped_at()
            .unwrap_or_else(std::time::Instant::now);
        let deadline = tokio::time::Instant::from_std(since + self.redial_wait);
        while self.is_down() {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => {
                    return Err(ReleaseError::new(
                        ReleaseErrorKind::Unconfirmed,
                        format!(
                            "the connection dropped and did not come back within {} ms of the drop",
                            self.redial_wait.as_millis()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
