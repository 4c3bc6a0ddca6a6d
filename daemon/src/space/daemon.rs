//! The space daemon as a value: one space's delivery daemon, started from explicit inputs and
//! ended with a typed reason.
//!
//! Why: a process exit code cannot be the daemon's way out once a process hosts more than one
//! space (the multi-space host's lanes) or embeds one (`start_delivery_service`). So
//! [`SpaceDaemon::start`] returns only once its readiness holds (lease ready, fan-out,
//! reader and both rails bound, lease watch bound) or refuses with a [`StartError`] after
//! closing what it opened; a running daemon ends in a [`Closed`] reason that every waiter sees.
//! Nothing here reads a workspace root, writes a pid record or exits the process: those are
//! the host's (`host/process.rs` for `deliver --space`, `cli.rs` for the exit codes).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use tokio::sync::watch;

use crate::base::{Credential, Journal, SecretStore, Tuning};
use crate::rails::Kicker;
pub use crate::space::closed::{Closed, StartError, StartErrorKind, StartPhase, CLOSE_CAUSE};
use crate::space::feed::MembershipFeed;
use crate::space::health::{HealthHandle, Verdict};
use crate::space::keeper::{Keeper, RELEASE_REDIAL_BOUND};
use crate::space::lease::ReleaseErrorKind;
use crate::space::lease_watch::{LeaseWatch, WatchEvent};
use crate::space::renew::Renewal;
use crate::space::timer::TimerWriter;
use crate::wire::Space;

/// A host's request to stop, carrying its cause (`"SIGTERM"`, `"SIGINT"`, [`CLOSE_CAUSE`]).
///
/// A `watch`, so a task that starts waiting after the request still sees it, and the first
/// request decides the cause.
#[derive(Clone)]
pub struct Stop(watch::Receiver<Option<&'static str>>);

impl Stop {
    /// A stop and the sender that triggers it (`send_replace(Some(cause))`).
    pub fn channel() -> (watch::Sender<Option<&'static str>>, Stop) {
        let (tx, rx) = watch::channel(None);
        (tx, Stop(rx))
    }
    /// A stop that never fires (a host that only ever closes through the handle).
    pub fn never() -> Stop {
        Stop::channel().1
    }
    /// The cause, once stopped.
    pub fn cause(&self) -> Option<&'static str> {
        *self.0.borrow()
    }
    /// Resolves with the cause once stopped (never, if the sender is gone unfired).
    pub async fn stopped(&mut self) -> &'static str {
        loop {
            if let Some(cause) = *self.0.borrow() {
                return cause;
            }
            if self.0.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// A host's request to re-read the credential now (SIGHUP), as a count: every request the
/// serve loop has not yet seen is answered by one re-read, including one made while the daemon
/// was still starting.
#[derive(Clone)]
pub struct Reread(watch::Receiver<u64>);

impl Reread {
    /// A trigger and the sender that pulls it (`send_modify(|n| *n += 1)`).
    pub fn channel() -> (watch::Sender<u64>, Reread) {
        let (tx, rx) = watch::channel(0);
        (tx, Reread(rx))
    }
    /// A trigger that never fires (a host without process signals).
    pub fn never() -> Reread {
        Reread::channel().1
    }
    /// Resolves at the next request not seen yet (never, if the sender is gone).
    async fn requested(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The host's stop and the handle's own `close()`, as one.
pub(super) struct Stops {
    pub(super) host: Stop,
    pub(super) own: Stop,
}

impl Stops {
    pub(super) fn cause(&self) -> Option<&'static str> {
        self.host.cause().or_else(|| self.own.cause())
    }
    pub(super) async fn stopped(&mut self) -> &'static str {
        tokio::select! {
            c = self.host.stopped() => c,
            c = self.own.stopped() => c,
        }
    }
}

/// Everything one space's daemon is started with. No field names a workspace root: the host
/// resolved those inputs already.
#[derive(Clone)]
pub struct SpaceConfig {
    pub space: Space,
    /// Broker URL (`nats://` or `tls://`).
    pub server: String,
    /// Demand TLS: refuse a listener that offers none.
    pub tls: bool,
    pub tls_ca: Option<PathBuf>,
    /// The standing delivery credential to start with.
    pub credential: Credential,
    /// Where renewals of that credential are re-read from (the same source it came from).
    pub store: Arc<dyn SecretStore>,
    /// Where the `$SYS` observer/evictor pair is read from (`space.<key>/…creds`).
    pub sys_store: Arc<dyn SecretStore>,
    /// What the admission line names as the place the `$SYS` sweeps are bound to.
    pub sweeps_bound_to: String,
    /// How this daemon is stopped, as its serving line names it (`— stop with: …`): the host
    /// knows whether that is `cotal-delivery down`, its own SIGTERM or an embedder's close.
    pub stop_with: String,
    /// Every overridable timing (ping interval, broker-gone window, the plane's nak delay and
    /// ack wait, the re-read retry, the feed, timer writer, metrics and `$SYS` sweep knobs).
    pub tuning: Tuning,
    /// How long a release at the close waits for a dropped connection, counted from the drop.
    pub redial_wait: Duration,
    /// Where the daemon's human lines go.
    pub journal: Journal,
    /// Called once the claim won, before anything is bound: a process host records itself
    /// here (its pid record), so the record exists before the daemon reports itself up.
    pub on_lease_won: Option<Arc<dyn Fn() + Send + Sync>>,
    /// The resident connection's name as the broker shows it.
    pub connection_name: String,
    /// Who kicks the connections a verified eviction found. `None`: the daemon's own evictor
    /// credential, opened per call; a multi-space host's lane gets the host's kicker instead.
    pub kicker: Option<Arc<dyn Kicker>>,
    /// This space's metrics handle (`--metrics-addr` serves its registry).
    pub metrics: crate::base::Metrics,
    /// The host's SIGHUP: re-read the credential now, proved against the broker before it is
    /// adopted (the 75 % re-read, out of turn).
    pub reread: Reread,
}

impl SpaceConfig {
    /// The documented defaults around the given inputs; the `$SYS` pair is read from `store`.
    pub fn new(
        space: Space,
        server: impl Into<String>,
        credential: Credential,
        store: Arc<dyn SecretStore>,
    ) -> SpaceConfig {
        // The host names the place (reading a store's identity may create it).
        let sweeps_bound_to = "the injected store".to_string();
        SpaceConfig {
            space,
            server: server.into(),
            tls: false,
            tls_ca: None,
            credential,
            sys_store: store.clone(),
            store,
            sweeps_bound_to,
            stop_with: format!("SIGTERM to pid {}", std::process::id()),
            tuning: Tuning::default(),
            redial_wait: RELEASE_REDIAL_BOUND,
            journal: Journal::stderr_only(),
            on_lease_won: None,
            connection_name: "cotal:delivery".into(),
            kicker: None,
            metrics: crate::base::Metrics::default(),
            reread: Reread::never(),
        }
    }
}

/// A running space daemon. Dropping the handle does not stop it: ask with [`SpaceDaemon::stop`]
/// or [`SpaceDaemon::close`].
pub struct SpaceDaemon {
    space: Space,
    close: watch::Sender<Option<&'static str>>,
    end: Shared<BoxFuture<'static, Closed>>,
    health: HealthHandle,
}

impl SpaceDaemon {
    /// The handle of a daemon whose start completed (the last phase builds it).
    pub(super) fn running(
        space: Space,
        close: watch::Sender<Option<&'static str>>,
        end: Shared<BoxFuture<'static, Closed>>,
        health: HealthHandle,
    ) -> SpaceDaemon {
        SpaceDaemon {
            space,
            close,
            end,
            health,
        }
    }

    pub fn space(&self) -> &Space {
        &self.space
    }

    /// Asks the daemon to close (idempotent; returns at once). The first cause wins.
    pub fn stop(&self) {
        self.close.send_if_modified(|cause| {
            if cause.is_none() {
                *cause = Some(CLOSE_CAUSE);
                true
            } else {
                false
            }
        });
    }

    /// Resolves with the reason once the daemon has ended (without asking it to).
    pub fn closed(&self) -> Shared<BoxFuture<'static, Closed>> {
        self.end.clone()
    }

    /// Withdraws serving, releases only the row this instance owns, closes the connection so
    /// it never reconnects, and resolves with the outcome. Every call awaits the same end.
    pub fn close(&self) -> BoxFuture<'static, Result<Closed, CloseError>> {
        self.stop();
        let end = self.end.clone();
        Box::pin(async move { CloseError::judge(end.await) })
    }

    /// The same as [`SpaceDaemon::close`] (`drain()` returns the same promise, docs/embedding.md).
    pub fn drain(&self) -> BoxFuture<'static, Result<Closed, CloseError>> {
        self.close()
    }

    /// Resolves once the broker-gone watchdog (or the credential expiry) reached a verdict: a
    /// process host gives [`SpaceDaemon::closed`] a grace from here, then ends anyway.
    pub async fn verdict(&self) -> Verdict {
        let mut h = self.health.clone();
        h.verdict().await
    }
}

/// Why a `close()` was not proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseError {
    kind: ReleaseErrorKind,
    detail: String,
    holder: Option<String>,
    closed: Box<Closed>,
}

impl CloseError {
    /// `Ok` only when the daemon ended by the request and the row it owned is proved gone.
    fn judge(closed: Closed) -> Result<Closed, CloseError> {
        let (kind, detail, holder) = match &closed {
            Closed::Stopped { release: Ok(_), .. } => return Ok(closed),
            Closed::Stopped {
                release: Err(e), ..
            } => (
                e.kind(),
                e.to_string(),
                e.foreign_holder().map(str::to_string),
            ),
            Closed::LeaseTaken { by } => (
                ReleaseErrorKind::Foreign,
                format!("another instance's lease row is there ({by})"),
                Some(by.clone()),
            ),
            other => (
                ReleaseErrorKind::Unconfirmed,
                format!(
                    "the daemon had already closed ({other}); its row is left to the bucket TTL"
                ),
                None,
            ),
        };
        Err(CloseError {
            kind,
            detail,
            holder,
            closed: Box::new(closed),
        })
    }
    pub fn kind(&self) -> ReleaseErrorKind {
        self.kind
    }
    /// The other instance's holder, when its row is there.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref()
    }
    /// How the daemon ended.
    pub fn closed(&self) -> &Closed {
        &self.closed
    }
}

impl fmt::Display for CloseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "delivery: close() did not prove the release: {}",
            self.detail
        )
    }
}

impl std::error::Error for CloseError {}

/// What the serve loop owns once start-up is complete.
pub(super) struct Serving {
    pub(super) keeper: Keeper,
    pub(super) watch: LeaseWatch,
    pub(super) renewal: Arc<Renewal>,
    pub(super) timer: TimerWriter,
    pub(super) feed: Option<MembershipFeed>,
    pub(super) stops: Stops,
    pub(super) health: HealthHandle,
    pub(super) renew_every: Duration,
    pub(super) reread: Reread,
}

impl Serving {
    /// Serves under the lease until a stop, a lost lease or a transport verdict.
    pub(super) async fn run(self) -> Closed {
        let Serving {
            mut keeper,
            mut watch,
            renewal,
            timer,
            feed,
            mut stops,
            mut health,
            renew_every,
            mut reread,
        } = self;
        let mut renew = tokio::time::interval(renew_every);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        renew.tick().await;
        // Every handler below may wait on the broker (a renew, a re-read, a credential proof),
        // so each one is raced against the verdict: once the broker is judged gone nothing more
        // is asked of it, and the daemon leaves at the window instead of after the handler's
        // own bounds (a re-check of the lease against a broker that is gone, then the host's
        // hard-exit fallback).
        let way = loop {
            tokio::select! {
                biased;
                verdict = health.verdict() => break Way::Verdict(verdict),
                by = stops.stopped() => break Way::Stopped(by),
                // The 75% re-read (and its retry after a missed remint) before the renew tick:
                // while the credential is expired the connection is down, so each renew waits
                // out its bounds (the TTL, then the re-read of the key, 13 s at a 6 s TTL) and
                // the next tick is already due when it returns; below the tick, the re-read that
                // would adopt a renewal written after the expiry never ran before the backstop
                // (harness simulate, seed 2: "credential expired without renewal" 17 s after
                // the renewal was in the store). A due re-read is one store read (and one proof on a
                // disposable connection when the store changed), and it is due again only after
                // the retry interval or at the next 75 % point, so it cannot starve the renew.
                _ = renewal.due() => {
                    tokio::select! {
                        biased;
                        verdict = health.verdict() => break Way::Verdict(verdict),
                        _ = renewal.on_due() => {}
                    }
                }
                _ = renew.tick() => {
                    tokio::select! {
                        biased;
                        verdict = health.verdict() => break Way::Verdict(verdict),
                        closed = keeper.on_renew_tick() => {
                            if let Some(closed) = closed { break Way::Closed(closed); }
                        }
                    }
                }
                event = watch.next() => {
                    match event {
                        Some(WatchEvent::Foreign) => {
                            tokio::select! {
                                biased;
                                verdict = health.verdict() => break Way::Verdict(verdict),
                                closed = keeper.on_watch_event() => {
                                    if let Some(closed) = closed { break Way::Closed(closed); }
                                }
                            }
                        }
                        Some(WatchEvent::Own) => {}
                        None => {
                            keeper.journal.line("! delivery: the lease watch trigger faulted (its consumer ended); the renew interval remains the arbiter");
                            watch.park();
                        }
                    }
                }
                ev = keeper.events.recv() => keeper.on_conn_event(ev),
                // the host's SIGHUP: the same re-read, out of turn.
                _ = reread.requested() => {
                    tokio::select! {
                        biased;
                        verdict = health.verdict() => break Way::Verdict(verdict),
                        _ = renewal.on_signal("SIGHUP") => {}
                    }
                }
                // the membership feed's own 75 % re-read of its rw credential.
                _ = renewal.membership_due() => {
                    tokio::select! {
                        biased;
                        verdict = health.verdict() => break Way::Verdict(verdict),
                        _ = renewal.on_membership_due() => {}
                    }
                }
            }
        };
        let closed = match way {
            Way::Stopped(by) => {
                watch.retire().await;
                let closed = keeper.stop_signalled(by).await;
                timer.stop().await;
                closed
            }
            Way::Verdict(verdict) => {
                // Coupled to the broker: no drain to wait for and no row to release; dropping
                // the writer stops it (its connection retired). The feed's two are retired by
                // its close, which does not wait on a connection that is down.
                drop(timer);
                keeper.abandon(verdict).await
            }
            Way::Closed(closed) => {
                watch.retire().await;
                let closed = keeper.leave(closed).await;
                timer.stop().await;
                closed
            }
        };
        if let Some(feed) = feed {
            feed.close().await;
        }
        closed
    }
}

/// How the serve loop was left.
enum Way {
    Stopped(&'static str),
    Verdict(Verdict),
    Closed(Closed),
}
