//! The space daemon as a value: one space's delivery daemon, started from explicit inputs and
//! ended with a typed reason.
//!
//! Why: a process exit code cannot be the daemon's way out once a process hosts more than one
//! space (the multi-space host's lanes) or embeds one (`start_delivery_service`). So
//! [`SpaceDaemon::start`] returns only once the seeds' readiness holds (lease ready, fan-out,
//! reader and both rails bound, lease watch bound) or refuses with a [`StartError`] after
//! closing what it opened; a running daemon ends in a [`Closed`] reason that every waiter sees.
//! Nothing here reads a workspace root, writes a pid record or exits the process: those are
//! the host's (`host/process.rs` for `deliver --space`, `cli.rs` for the exit codes).

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::sync::watch;

use crate::conn::{self, CredentialCell, DialErrorKind, DialSpec, Resident};
use crate::creds::Credential;
use crate::journal::Journal;
use crate::kv::Rows;
use crate::plane::{PlaneConfig, PlaneCtx, ServingGate};
use crate::provision::Preflight;
use crate::rails::AdminParts;
use crate::rails::LeaseSelf;
use crate::rails::{EvictorKicker, Kicker};
use crate::space::admission::{self, SysPair};
use crate::space::closed::stop_line;
pub use crate::space::closed::{Closed, CLOSE_CAUSE};
use crate::space::feed::{FeedParts, MembershipFeed};
use crate::space::health::{HealthHandle, Verdict, Watchdog};
use crate::space::keeper::{Keeper, RELEASE_REDIAL_BOUND};
use crate::space::lease_watch::{LeaseWatch, WatchEvent};
use crate::space::serving::Plane;
use crate::space::timer::{TimerWriter, TimerWriterParts};
use crate::space::{
    lease, lease::ClaimError, lease::Identity, lease::Lease, lease::ReleaseErrorKind,
};
use crate::space::{renew::Renewal, renew::RenewalParts};
use crate::store::SecretStore;
use crate::sys::{SweepLimits, SysAuthority};
use crate::tuning::Tuning;
use crate::wire::SHARD;
use crate::wire::{Principal, Space, SpaceNames};

/// Lease TTL when the bucket declares no `max_age` (the reference `LEASE_TTL_MS`).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

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

/// The host's stop and the handle's own `close()`, as one.
struct Stops {
    host: Stop,
    own: Stop,
}

impl Stops {
    fn cause(&self) -> Option<&'static str> {
        self.host.cause().or_else(|| self.own.cause())
    }
    async fn stopped(&mut self) -> &'static str {
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
    pub metrics: crate::metrics::Metrics,
}

impl SpaceConfig {
    /// The seeds' defaults around the given inputs; the `$SYS` pair is read from `store`.
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
            tuning: Tuning::default(),
            redial_wait: RELEASE_REDIAL_BOUND,
            journal: Journal::stderr_only(),
            on_lease_won: None,
            connection_name: "cotal:delivery".into(),
            kicker: None,
            metrics: crate::metrics::Metrics::default(),
        }
    }
}

/// Why a start refused. Every refusal closed what the start had opened (connections, a won
/// claim) before it was returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartError {
    kind: StartErrorKind,
    detail: String,
    /// The live holder of the lease, when a `LeaseHeld` refusal could read its row.
    holder: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartErrorKind {
    /// Refused before dialing: the credential or another input is unusable.
    Config,
    /// The injected store declares no stable identity, or another one than assigned.
    StoreIdentity,
    /// The initial delivery credential belongs to another account than assigned.
    Account,
    /// The broker did not answer the reachability check, refused the connection, or offered no
    /// TLS while TLS was demanded.
    Unreachable,
    /// The broker requires no authentication: open dev mode, which has no delivery daemon.
    OpenMode,
    /// `$SYS` observer admission refused.
    Admission,
    /// Another daemon holds the lease.
    LeaseHeld,
    /// The credential may not write the lease.
    LeaseDenied,
    /// The broker refused the lease write for another reason.
    LeaseRefused,
    /// The broker-gone watchdog expired during the start.
    BrokerGone,
    /// The credential expired during the start.
    CredentialExpired,
    /// Stopped by request during the start (a won claim was released).
    Stopped,
    /// An unexpected fault (a won claim was released).
    Fault,
}

impl StartError {
    pub fn new(kind: StartErrorKind, detail: impl Into<String>) -> StartError {
        StartError {
            kind,
            detail: detail.into(),
            holder: None,
        }
    }
    pub fn kind(&self) -> StartErrorKind {
        self.kind
    }
    /// Who holds the lease, for a `LeaseHeld` refusal (read from the row after the claim lost;
    /// `None` when that read did not answer or the row was gone by then).
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref()
    }
    fn of_verdict(verdict: Verdict) -> StartError {
        let kind = match verdict {
            Verdict::CredentialExpired | Verdict::CredentialLapsed => {
                StartErrorKind::CredentialExpired
            }
            _ => StartErrorKind::BrokerGone,
        };
        StartError::new(kind, verdict.line().trim_start_matches("✗ "))
    }
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for StartError {}

/// A running space daemon. Dropping the handle does not stop it: ask with [`SpaceDaemon::stop`]
/// or [`SpaceDaemon::close`].
pub struct SpaceDaemon {
    space: Space,
    close: watch::Sender<Option<&'static str>>,
    end: Shared<BoxFuture<'static, Closed>>,
    health: HealthHandle,
}

impl SpaceDaemon {
    /// Starts serving `cfg.space`. Returns once the lease is ready, the fan-out writer, the
    /// trusted reader and both rails are bound, and the lease watch is bound; refuses with a
    /// [`StartError`] otherwise, after closing what it opened and releasing a claim it won.
    pub async fn start(cfg: SpaceConfig, stop: Stop) -> Result<SpaceDaemon, StartError> {
        let (close, own) = Stop::channel();
        let mut stops = Stops { host: stop, own };
        let journal = cfg.journal.clone();
        let space = cfg.space.clone();
        let refuse = |kind: StartErrorKind, text: String| {
            journal.line(format!("✗ {text}"));
            StartError::new(kind, text)
        };
        let stopped_line = |by: &str| {
            journal.line(stop_line(by, &space));
            StartError::new(StartErrorKind::Stopped, format!("stopped by {by}"))
        };

        let (nkey, account) = match (cfg.credential.public_key(), cfg.credential.claims()) {
            (Ok(k), Ok(c)) => (k, c.account().to_string()),
            (Err(e), _) | (_, Err(e)) => {
                return Err(refuse(StartErrorKind::Config, format!("delivery: {e}")))
            }
        };
        let me = Principal::for_nkey(&nkey)
            .map_err(|e| refuse(StartErrorKind::Config, format!("delivery: {e}")))?;

        // Reachability: the first dial of the resident connection.
        let spec = DialSpec::new(cfg.server.clone())
            .tls(cfg.tls, cfg.tls_ca.clone())
            .ping_interval(cfg.tuning.ping_interval)
            .name(cfg.connection_name.clone());
        let dialed = tokio::select! {
            r = conn::dial(&spec, CredentialCell::new(cfg.credential.clone())) => r,
            by = stops.stopped() => return Err(stopped_line(by)),
        };
        let resident = dialed.map_err(|e| {
            let text = match e.kind() {
                DialErrorKind::Unreachable => format!(
                    "delivery: can't reach NATS at {}. Run: cotal up ({e})",
                    cfg.server
                ),
                DialErrorKind::PlaintextRefused => format!("delivery: {e}"),
                DialErrorKind::Refused => format!(
                    "delivery: the broker at {} refused this daemon's connection ({e})",
                    cfg.server
                ),
            };
            refuse(StartErrorKind::Unreachable, text)
        })?;

        // Open dev mode is live-only: with no authentication there is no trusted reader to
        // stand behind (any client could read the store), so there is no durable backstop.
        if !resident.client.server_info().auth_required {
            let err = refuse(
                StartErrorKind::OpenMode,
                format!(
                    "delivery: the broker at {} requires no authentication (open dev mode); open mode is live-only and has no delivery daemon, so this daemon refuses to serve it. Run an auth mesh if you need durable channels (cotal-delivery up)",
                    cfg.server
                ),
            );
            resident.close(CLOSE_DRAIN_BOUND).await;
            return Err(err);
        }

        // From here on the broker is watched through the resident connection only.
        let health = Watchdog::spawn(
            cfg.tuning.health,
            resident.events.subscribe(),
            resident.client.clone(),
            journal.clone(),
            space.to_string(),
        );
        // Closes what the start opened before the lease was claimed.
        let unwind = |resident: Resident, health: HealthHandle, err: StartError| async move {
            health.stand_down();
            resident.close(CLOSE_DRAIN_BOUND).await;
            err
        };

        // `$SYS` observer admission, before the endpoint or the lease. The store read runs off
        // the async workers (a store may be a remote backend); a health fault during it rejects
        // the start once it returned.
        let sys_store = cfg.sys_store.clone();
        let for_space = space.clone();
        let pair =
            tokio::task::spawn_blocking(move || SysPair::read(&*sys_store, &for_space)).await;
        if let Some(verdict) = health.verdict_now() {
            return Err(unwind(resident, health, StartError::of_verdict(verdict)).await);
        }
        let pair = match pair {
            Ok(p) => p,
            Err(e) => {
                let err = refuse(
                    StartErrorKind::Fault,
                    format!("delivery: the $SYS credential read failed ({e})"),
                );
                return Err(unwind(resident, health, err).await);
            }
        };
        match admission::admit(&pair, &account) {
            Ok(a) => {
                journal.line(format!(
                    "• delivery: $SYS sweeps bound to {} (account {})",
                    cfg.sweeps_bound_to, a.account
                ));
                if !a.evictor_present {
                    journal.line(format!(
                        "• delivery: no connection-evictor credential at {}: deny-new-only posture, eviction unavailable until it is provisioned",
                        pair.evictor.at
                    ));
                }
            }
            Err(e) => {
                let err = refuse(StartErrorKind::Admission, e.to_string());
                return Err(unwind(resident, health, err).await);
            }
        }

        let names = SpaceNames::new(&space);
        let plane_config = PlaneConfig::of(&cfg.tuning);
        let js = jetstream::context::ContextBuilder::new()
            .timeout(plane_config.request_bound)
            .build(resident.client.clone());
        let ttl = lease_ttl(&js, &names).await;
        let rows = match Rows::open(&js, &names.delivery_bucket(), plane_config.request_bound).await
        {
            Ok(r) => r,
            Err(e) => {
                let err = refuse(
                    StartErrorKind::LeaseRefused,
                    format!(
                        "delivery: acquiring the lease for shard {SHARD} failed: {e}. Not binding."
                    ),
                );
                return Err(unwind(resident, health, err).await);
            }
        };
        let identity = Identity {
            holder: me.dot_form(),
            incarnation: uuid::Uuid::new_v4().simple().to_string(),
        };
        let mut lease = Lease::new(rows, identity.clone(), resident.violations.clone());

        // The single-flight lease. A stop during the claim waits for the broker's answer; its
        // line is written when the signal lands (the seeds: before the release), not after.
        let mut announced: Option<&'static str> = None;
        let claimed = {
            let claim = lease.claim();
            tokio::pin!(claim);
            loop {
                tokio::select! {
                    r = &mut claim => break r,
                    by = stops.stopped(), if announced.is_none() => {
                        journal.line(stop_line(by, &space));
                        announced = Some(by);
                    }
                }
            }
        };
        if let Err(e) = claimed {
            let bucket = names.delivery_bucket();
            let err = match &e {
                ClaimError::Held { .. } => {
                    // A read only: a standby host names the holder it stands by for.
                    let holder = match lease.read_own().await {
                        lease::Reading::Taken { by } => Some(by),
                        _ => None,
                    };
                    let mut err = refuse(
                        StartErrorKind::LeaseHeld,
                        format!("delivery: a live lease already exists for shard {SHARD} — another delivery daemon is running. Not binding."),
                    );
                    err.holder = holder;
                    err
                }
                ClaimError::Denied { operation, subject } => refuse(
                    StartErrorKind::LeaseDenied,
                    format!("delivery: the lease write for shard {SHARD} was refused ({operation} \"{subject}\") — this credential cannot write {bucket}.{}. Not binding. Use a credential holding the \"delivery\" profile.", crate::wire::LEASE_KEY),
                ),
                ClaimError::Refused { detail } => refuse(
                    StartErrorKind::LeaseRefused,
                    format!("delivery: acquiring the lease for shard {SHARD} failed: {detail}. Not binding."),
                ),
            };
            return Err(unwind(resident, health, err).await);
        }

        if let Some(won) = &cfg.on_lease_won {
            won();
        }
        let startup_complete = Arc::new(AtomicBool::new(false));
        let credential = resident.credential.clone();
        // Renewal of the standing credential (75 % re-read, `reloadCreds`).
        let renewal = Arc::new(Renewal::new(RenewalParts {
            store: cfg.store.clone(),
            space: space.clone(),
            cell: resident.credential.clone(),
            preflight: Preflight::new(cfg.server.clone(), cfg.tls_ca.clone()),
            client: resident.client.clone(),
            events: resident.events.clone(),
            health: health.clone(),
            journal: journal.clone(),
            retry: cfg.tuning.remint_retry,
        }));
        let ctx = PlaneCtx {
            client: resident.client.clone(),
            js: js.clone(),
            names: names.clone(),
            journal: journal.clone(),
            me: me.clone(),
            gate: ServingGate::default(),
            config: plane_config,
            startup_complete: startup_complete.clone(),
            caches: crate::plane::Caches::new(&names),
            handoffs: Arc::default(),
            metrics: cfg.metrics.clone(),
        };
        // The `$SYS` pair the eviction and liveness verbs sweep with (re-read and re-checked on
        // every call, from the store admission read).
        let sys = Arc::new(SysAuthority {
            store: cfg.sys_store.clone(),
            space: space.clone(),
            account: account.clone(),
            server_url: cfg.server.clone(),
            tls_ca: cfg.tls_ca.clone(),
            limits: SweepLimits::of(&cfg.tuning),
        });
        let admin = AdminParts {
            credentials: Some(renewal.clone()),
            sys: Some(sys.clone()),
            kicker: Some(
                cfg.kicker
                    .clone()
                    .unwrap_or_else(|| Arc::new(EvictorKicker { authority: sys })),
            ),
            ..AdminParts::default()
        };
        let lease_self = LeaseSelf {
            holder: identity.holder.clone(),
            incarnation: identity.incarnation.clone(),
        };
        let mut keeper = Keeper {
            journal: journal.clone(),
            space: space.clone(),
            lease,
            plane: Plane::new(ctx, admin, lease_self),
            noted: "held",
            quiesced: false,
            connected: true,
            events: resident.events.subscribe(),
            resident,
            health: health.clone(),
            redial_wait: cfg.redial_wait,
            ttl,
        };
        // From the claim on, every refusal releases it (the keeper's way out).
        if let Some(verdict) = health.verdict_now() {
            keeper.abandon(verdict).await;
            return Err(StartError::of_verdict(verdict));
        }
        if let Some(by) = stops.cause() {
            match announced {
                // Its line was written when it landed during the claim.
                Some(_) => keeper.stop(by).await,
                None => keeper.stop_signalled(by).await,
            };
            return Err(StartError::new(
                StartErrorKind::Stopped,
                format!("stopped by {by}"),
            ));
        }

        // Bind the fan-out writer, the reader and both rails, then mark the lease ready.
        // A stop wins over a binding still in flight: nothing is marked ready after it.
        let mut verdicts = health.clone();
        let bound = tokio::select! {
            biased;
            by = stops.stopped() => Err(Err(by)),
            v = verdicts.verdict() => Err(Ok(v)),
            r = keeper.plane.arm() => Ok(r),
        };
        match bound {
            Err(Err(by)) => {
                keeper.stop_signalled(by).await;
                return Err(StartError::new(
                    StartErrorKind::Stopped,
                    format!("stopped by {by}"),
                ));
            }
            Err(Ok(verdict)) => {
                keeper.abandon(verdict).await;
                return Err(StartError::of_verdict(verdict));
            }
            Ok(Err(e)) => {
                journal.line("✗ delivery: start-up failed - releasing the shard before exiting");
                journal.line(format!("✗ delivery: {e}"));
                let detail = format!("delivery: {e}");
                keeper
                    .leave(Closed::Fault {
                        detail: detail.clone(),
                    })
                    .await;
                return Err(StartError::new(StartErrorKind::Fault, detail));
            }
            Ok(Ok(())) => {}
        }
        if let Some(by) = stops.cause() {
            keeper.stop_signalled(by).await;
            return Err(StartError::new(
                StartErrorKind::Stopped,
                format!("stopped by {by}"),
            ));
        }
        if let Err(e) = keeper.lease.mark_ready().await {
            journal.line(format!(
                "! delivery: bound but could not mark the lease ready ({e}); the next renew re-synchronises"
            ));
        }
        journal.line(format!(
            "✓ delivery daemon up (space {space}) — stop with: cotal down"
        ));

        // The lease watch; start-up is complete once it is bound.
        let watch = match LeaseWatch::bind(&js, &names, &identity, journal.clone()).await {
            Ok(w) => w,
            Err(e) => {
                journal.line("✗ delivery: start-up failed - releasing the shard before exiting");
                journal.line(format!(
                    "✗ delivery: the lease watch could not be bound ({e})"
                ));
                let detail = format!("delivery: the lease watch could not be bound ({e})");
                keeper
                    .leave(Closed::Fault {
                        detail: detail.clone(),
                    })
                    .await;
                return Err(StartError::new(StartErrorKind::Fault, detail));
            }
        };
        startup_complete.store(true, Ordering::SeqCst);
        // The checkpoint timer writer: its own connection under the credential held now; its
        // faults restart it and never reach the serve loop.
        // The membership feed (fail-soft: a missing piece or a fault only logs).
        let mut feed_parts = FeedParts::new(
            spec.clone(),
            cfg.store.clone(),
            space.clone(),
            account.clone(),
            journal.clone(),
        );
        feed_parts.interval = cfg.tuning.membership_interval;
        let feed = MembershipFeed::start(feed_parts).await;
        if let Some(feed) = &feed {
            let (cell, client) = feed.rw();
            renewal.attach_membership(cell, client);
        }
        let mut timer_parts =
            TimerWriterParts::new(spec.clone(), credential, space.clone(), journal.clone());
        timer_parts.retry = cfg.tuning.timer_retry;
        timer_parts.poll = cfg.tuning.timer_poll;
        let timer = TimerWriter::start(timer_parts);

        // Lags and states for `--metrics-addr`, sampled off the hot path until the end.
        let gate = keeper.plane.gate();
        let caches = keeper.plane.caches();
        let sampler = crate::metrics::Sampler {
            js: js.clone(),
            names: names.clone(),
            credential: keeper.resident.credential.clone(),
            client: keeper.resident.client.clone(),
            events: keeper.resident.events.subscribe(),
            metrics: cfg.metrics.clone(),
            period: cfg.tuning.metrics_sample,
            serving: Arc::new(move || gate.is_serving()),
            caches: Arc::new(move || {
                [
                    ("acl", &caches.acl),
                    ("members", &caches.members),
                    ("channels", &caches.channels),
                    ("presence", &caches.presence),
                ]
                .into_iter()
                .map(|(cache, c)| {
                    let s = c.stats();
                    crate::metrics::CacheCounts {
                        cache,
                        fences: s.fences,
                        fallbacks: s.fallbacks,
                        resets: s.resets,
                    }
                })
                .collect()
            }),
        }
        .spawn();
        let metrics = cfg.metrics.clone();
        let flush = journal.clone();
        let serving = Serving {
            keeper,
            watch,
            renewal,
            timer,
            feed,
            stops,
            health: health.clone(),
            renew_every: lease::renew_interval(ttl),
        };
        let end = tokio::spawn(serving.run());
        let end: BoxFuture<'static, Closed> = Box::pin(async move {
            let closed = end.await.unwrap_or_else(|e| Closed::Fault {
                detail: format!("the keeper task ended abnormally ({e})"),
            });
            sampler.abort();
            metrics.lease_held(false);
            // What was only counted is said before the end.
            flush.flush_repeats();
            closed
        });
        Ok(SpaceDaemon {
            space,
            close,
            end: end.shared(),
            health,
        })
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

    /// The same as [`SpaceDaemon::close`] (the seeds' `drain()` returns the same promise).
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

/// Bound on draining the resident connection when a start unwinds.
const CLOSE_DRAIN_BOUND: Duration = Duration::from_secs(2);

/// What the serve loop owns once start-up is complete.
struct Serving {
    keeper: Keeper,
    watch: LeaseWatch,
    renewal: Arc<Renewal>,
    timer: TimerWriter,
    feed: Option<MembershipFeed>,
    stops: Stops,
    health: HealthHandle,
    renew_every: Duration,
}

impl Serving {
    /// Serves under the lease until a stop, a lost lease or a transport verdict.
    async fn run(self) -> Closed {
        let Serving {
            mut keeper,
            mut watch,
            renewal,
            timer,
            feed,
            mut stops,
            mut health,
            renew_every,
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
                // the 75% re-read.
                _ = renewal.due() => {
                    tokio::select! {
                        biased;
                        verdict = health.verdict() => break Way::Verdict(verdict),
                        _ = renewal.on_due() => {}
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

/// The lease TTL: the bucket's `max_age` (set at provisioning), or the reference default.
async fn lease_ttl(js: &jetstream::Context, names: &SpaceNames) -> Duration {
    let stream = SpaceNames::kv_stream(&names.delivery_bucket());
    match js.get_stream(stream).await {
        Ok(mut s) => match s.info().await {
            Ok(info) if info.config.max_age > Duration::ZERO => info.config.max_age,
            _ => DEFAULT_LEASE_TTL,
        },
        Err(_) => DEFAULT_LEASE_TTL,
    }
}
