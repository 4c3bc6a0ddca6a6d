//! The keeper: holds the lease of a serving daemon and arbitrates every doubt about it.
//!
//! Why: the daemon serves only under its lease. When a renew fails or the watch sees a write that
//! is not its own, the keeper quiesces first (nothing admitted before acts after), then re-reads
//! the key from the leader and decides: still ours (resume), gone (re-create), taken (leave).

use std::time::Duration;

use tokio::sync::broadcast;

use crate::conn::ConnEvent;
use crate::files::PidRecord;
use crate::journal::Journal;
use crate::space::exit::Exit;
use crate::space::health::{HealthHandle, Verdict};
use crate::space::lease::{ClaimError, Lease, Reading, SHARD};
use crate::space::serving::Plane;
use crate::wire::Space;

/// How long a signalled release waits for a redialing connection (seeds: five seconds).
pub const RELEASE_REDIAL_BOUND: Duration = Duration::from_secs(5);
/// Bound on the whole signalled shutdown; past it the process exits anyway.
pub const SHUTDOWN_BOUND: Duration = Duration::from_secs(10);

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
    pub(crate) client: async_nats::Client,
    /// Told to stand down when the daemon leaves on its own account.
    pub(crate) health: HealthHandle,
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
        self.plane.quiesce().await;
        let _ = self.lease.mark_not_ready().await;
        if !self.quiesced {
            self.quiesced = true;
            self.journal.line(format!(
                "! delivery: stopped serving shard {SHARD} (fan-out, reader and control unbound) while it re-checks who owns the lease (space {})",
                self.space
            ));
        }
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

    /// Renew at TTL/2; on failure quiesce first, then arbitrate on a re-read.
    pub(crate) async fn on_renew_tick(&mut self) -> Option<Exit> {
        match self.lease.renew().await {
            Ok(_) => {
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
                        Some(Exit::LeaseHeld)
                    }
                }
            }
        }
    }

    /// A change of the key that is not our own write: quiesce first, then arbitrate.
    pub(crate) async fn on_watch_event(&mut self) -> Option<Exit> {
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
                Some(Exit::LeaseHeld)
            }
        }
    }

    pub(crate) async fn reacquire(&mut self, cause: &str, from_watch: bool) -> Option<Exit> {
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
            Err(ClaimError::Held { detail }) => {
                self.lease.forget();
                let line = if from_watch {
                    format!("✗ delivery: a lease watch event found the key gone and another daemon has taken shard {SHARD} ({detail}), exiting so the holder is single")
                } else {
                    format!("✗ delivery: lost the lease ({cause}) and another daemon has taken shard {SHARD} ({detail}), exiting so the holder is single")
                };
                self.journal.line(line);
                Some(Exit::LeaseHeld)
            }
            Err(e) => {
                self.lease.forget();
                self.journal.line(format!(
                    "✗ delivery: could not re-acquire the lease for shard {SHARD} ({e}); it serves only under its lease, exiting"
                ));
                Some(match e {
                    ClaimError::Denied { .. } => Exit::LeaseDenied,
                    _ => Exit::LeaseRefused,
                })
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
    pub(crate) async fn abandon(mut self, verdict: Verdict, pid: Option<&PidRecord>) -> Exit {
        if let Some(p) = pid {
            p.remove();
        }
        self.lease.forget();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.plane.quiesce()).await;
        verdict.exit()
    }

    pub(crate) async fn stop_signalled(self, name: &'static str, pid: Option<&PidRecord>) -> Exit {
        self.journal.line(format!(
            "• delivery: received {name}, exiting (space {}, shard {SHARD})",
            self.space
        ));
        self.shutdown(Exit::Signalled, pid).await
    }

    /// Unrecord, stop serving, release the lease at the broker's revision (if still ours), close.
    pub(crate) async fn shutdown(mut self, exit: Exit, pid: Option<&PidRecord>) -> Exit {
        // From here the connection's events are this process closing it, not the broker.
        self.health.stand_down();
        if let Some(p) = pid {
            p.remove();
        }
        let work = async {
            self.plane.quiesce().await;
            if self.lease.revision().is_some() {
                self.wait_connected(RELEASE_REDIAL_BOUND).await;
                if let Err(e) = self.lease.release().await {
                    self.journal.line(format!(
                        "! delivery: could not release the lease for shard {SHARD} ({e}); the bucket TTL will expire it"
                    ));
                }
            }
            let _ = self.client.drain().await;
        };
        if tokio::time::timeout(SHUTDOWN_BOUND, work).await.is_err() {
            self.journal.line(format!(
                "! delivery: shutdown did not finish within {} s; exiting anyway",
                SHUTDOWN_BOUND.as_secs()
            ));
        }
        exit
    }

    /// Waits (bounded) for the resident connection to be up, so a release is not sent into a
    /// connection that is redialing and would never be answered.
    pub(crate) async fn wait_connected(&mut self, bound: Duration) {
        use async_nats::connection::State;
        let deadline = tokio::time::Instant::now() + bound;
        while self.client.connection_state() != State::Connected {
            if tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .is_err()
            {
                return;
            }
        }
    }
}
