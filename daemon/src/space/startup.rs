//! `SpaceDaemon::start` as named phases: built first, then run.
//!
//! Why phases: a start opens things in an order (the resident connection, the `$SYS`
//! admission, the lease claim, the plane and the rails, the lease watch and the companions),
//! and every refusal must close exactly what was opened so far, releasing a claim it won. So
//! each phase is a value that holds what it opened and either hands on the next value or
//! refuses with a [`StartError`] naming it ([`StartPhase`]) after unwinding. [`Plan::build`]
//! derives every input before anything is dialed, as vector builds a topology's pieces before
//! `RunningTopology` runs them; [`Plan::run`] is the phases in order:
//!
//! ```text
//! build (inputs) → dial → admit → claim → wire → arm → companions → serving
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::future::{BoxFuture, FutureExt};
use tokio::sync::watch;

use crate::base::{
    self, CredentialCell, DialErrorKind, DialSpec, Journal, Resident, Rows, SweepLimits,
    SysAuthority,
};
use crate::plane::{PlaneConfig, PlaneCtx, ServingGate};
use crate::provision::Preflight;
use crate::rails::{AdminParts, EvictorKicker, LeaseSelf};
use crate::space::admission::{self, SysPair};
use crate::space::closed::{
    claim_outcome, stop_line, Closed, StartError, StartErrorKind, StartPhase,
};
use crate::space::daemon::{Serving, SpaceConfig, SpaceDaemon, Stop, Stops};
use crate::space::feed::{FeedParts, MembershipFeed};
use crate::space::health::{HealthHandle, Watchdog};
use crate::space::holder::{HolderState, NOT_RUNNING_HOLDER, NOT_RUNNING_PROOF};
use crate::space::keeper::Keeper;
use crate::space::lease::{self, ClaimError, Identity, Lease};
use crate::space::lease_watch::LeaseWatch;
use crate::space::renew::{Renewal, RenewalParts};
use crate::space::serving::Plane;
use crate::space::timer::{TimerWriter, TimerWriterParts};
use crate::wire::{Principal, Space, SpaceNames, LEASE_KEY, SHARD};

/// Bound on draining the resident connection when a start unwinds.
const CLOSE_DRAIN_BOUND: Duration = Duration::from_secs(2);

/// Writes the refusal's line and builds it.
fn refuse(journal: &Journal, phase: StartPhase, kind: StartErrorKind, text: String) -> StartError {
    journal.line(format!("✗ {text}"));
    StartError::new(kind, text).at(phase)
}

impl SpaceDaemon {
    /// Starts serving `cfg.space`. Returns once the lease is ready, the fan-out writer, the
    /// trusted reader and both rails are bound, and the lease watch is bound; refuses with a
    /// [`StartError`] otherwise, after closing what it opened and releasing a claim it won.
    /// (Here rather than beside the handle: start-up builds the handle, so only this file names
    /// both.)
    pub async fn start(cfg: SpaceConfig, stop: Stop) -> Result<SpaceDaemon, StartError> {
        Plan::build(cfg, stop)?.run().await
    }
}

/// A start's inputs, derived before anything is dialed.
pub(super) struct Plan {
    cfg: SpaceConfig,
    stops: Stops,
    /// The handle's own `close()`, handed to the running daemon.
    close: watch::Sender<Option<&'static str>>,
    journal: Journal,
    space: Space,
    me: Principal,
    /// The data account the credential belongs to.
    account: String,
    spec: DialSpec,
    plane: PlaneConfig,
    names: SpaceNames,
}

impl Plan {
    /// The phase before any dial: the credential names this daemon and its account.
    pub(super) fn build(cfg: SpaceConfig, stop: Stop) -> Result<Plan, StartError> {
        let (close, own) = Stop::channel();
        let journal = cfg.journal.clone();
        let config = |e: &dyn std::fmt::Display| {
            refuse(
                &journal,
                StartPhase::Inputs,
                StartErrorKind::Config,
                format!("delivery: {e}"),
            )
        };
        let (nkey, account) = match (cfg.credential.public_key(), cfg.credential.claims()) {
            (Ok(k), Ok(c)) => (k, c.account().to_string()),
            (Err(e), _) | (_, Err(e)) => return Err(config(&e)),
        };
        let me = Principal::for_nkey(&nkey).map_err(|e| config(&e))?;
        let spec = DialSpec::new(cfg.server.clone())
            .tls(cfg.tls, cfg.tls_ca.clone())
            .ping_interval(cfg.tuning.ping_interval)
            .name(cfg.connection_name.clone());
        let space = cfg.space.clone();
        Ok(Plan {
            plane: PlaneConfig::of(&cfg.tuning),
            names: SpaceNames::new(&space),
            stops: Stops { host: stop, own },
            close,
            journal,
            space,
            me,
            account,
            spec,
            cfg,
        })
    }

    /// The phases in order; the first refusal ends the start.
    pub(super) async fn run(self) -> Result<SpaceDaemon, StartError> {
        let dialed = self.dial().await?;
        let admitted = dialed.admit().await?;
        let claimed = admitted.claim().await?;
        let wired = claimed.wire().await?;
        let armed = wired.arm().await?;
        armed.companions().await
    }

    fn stopped(&self, phase: StartPhase, by: &str) -> StartError {
        stopped_at(phase, by)
    }

    /// Reachability: the first dial of the resident connection; from here on the broker is
    /// watched through its events only.
    async fn dial(mut self) -> Result<Dialed, StartError> {
        let dialed = tokio::select! {
            r = base::dial(&self.spec, CredentialCell::new(self.cfg.credential.clone())) => r,
            by = self.stops.stopped() => {
                self.journal.line(stop_line(by, &self.space));
                return Err(self.stopped(StartPhase::Dial, by));
            }
        };
        let resident = match dialed {
            Ok(r) => r,
            Err(e) => {
                let server = &self.cfg.server;
                let text = match e.kind() {
                    DialErrorKind::Unreachable => {
                        format!("delivery: can't reach NATS at {server}. Start its broker (a local mesh: cotal-delivery up --space {}) ({e})", self.cfg.space)
                    }
                    DialErrorKind::PlaintextRefused => format!("delivery: {e}"),
                    DialErrorKind::Refused => format!(
                        "delivery: the broker at {server} refused this daemon's connection ({e})"
                    ),
                };
                return Err(refuse(
                    &self.journal,
                    StartPhase::Dial,
                    StartErrorKind::Unreachable,
                    text,
                ));
            }
        };
        // Open dev mode is live-only: with no authentication there is no trusted reader to
        // stand behind (any client could read the store), so there is no durable backstop.
        if !resident.client.server_info().auth_required {
            let err = refuse(
                &self.journal,
                StartPhase::Dial,
                StartErrorKind::OpenMode,
                format!(
                    "delivery: the broker at {} requires no authentication (open dev mode); open mode is live-only and has no delivery daemon, so this daemon refuses to serve it. Run an auth mesh if you need durable channels (cotal-delivery up)",
                    self.cfg.server
                ),
            );
            resident.close(CLOSE_DRAIN_BOUND).await;
            return Err(err);
        }

        let health = Watchdog::spawn(
            self.cfg.tuning.health,
            resident.events.subscribe(),
            resident.client.clone(),
            self.journal.clone(),
            self.space.to_string(),
        );
        Ok(Dialed {
            plan: self,
            resident,
            health,
        })
    }
}

/// The resident connection is up and watched; nothing is claimed.
struct Dialed {
    plan: Plan,
    resident: Resident,
    health: HealthHandle,
}

impl Dialed {
    /// Closes what the start opened before the lease was claimed.
    async fn unwind(self, err: StartError) -> StartError {
        self.health.stand_down();
        self.resident.close(CLOSE_DRAIN_BOUND).await;
        err
    }

    fn refuse(&self, phase: StartPhase, kind: StartErrorKind, text: String) -> StartError {
        refuse(&self.plan.journal, phase, kind, text)
    }

    /// The claim lost to a live row: whose, judged from the broker. A holder with a connection
    /// on the broker is another daemon running (the refusal says so); a holder with none is not
    /// running, and its row expires with the bucket TTL (the refusal says when, and never that
    /// another daemon runs); a holder that could not be judged is named with why.
    async fn refuse_held(&self, lease: &Lease, ttl: Duration) -> StartError {
        const PHASE: StartPhase = StartPhase::Claim;
        let plan = &self.plan;
        // A read only: a standby host names the holder it stands by for.
        let by = match lease.read_own().await {
            lease::Reading::Taken { by } => Some(by),
            _ => None,
        };
        let row = super::holder::held_row(lease.rows(), ttl).await;
        let authority = SysAuthority {
            store: plan.cfg.sys_store.clone(),
            space: plan.space.clone(),
            account: plan.account.clone(),
            server_url: plan.cfg.server.clone(),
            tls_ca: plan.cfg.tls_ca.clone(),
            limits: SweepLimits::of(&plan.cfg.tuning),
        };
        let info = self.resident.client.server_info();
        let own = (info.server_id.as_str(), info.client_id);
        let state = match &row {
            Some(r) => {
                Some(super::holder::holder_state(&authority, &r.info.holder, Some(own)).await)
            }
            None => None,
        };
        let held = StartErrorKind::LeaseHeld;
        match (row, state) {
            (Some(row), Some(HolderState::NotRunning { account })) => self
                .refuse(
                    PHASE,
                    held,
                    format!(
                        "delivery: the lease row for shard {SHARD} {NOT_RUNNING_HOLDER} ({}, incarnation {}): {NOT_RUNNING_PROOF} ($SYS CONNZ of account {account}); the row expires in {} s. Not binding; start the daemon again once it has expired.",
                        row.info.holder,
                        if row.info.incarnation.is_empty() { "-" } else { &row.info.incarnation },
                        row.expires_in_secs()
                    ),
                )
                .held_by(by)
                .holder_not_running(row.expires_in),
            (Some(row), Some(HolderState::Unproved { why })) => self
                .refuse(
                    PHASE,
                    held,
                    format!(
                        "delivery: a live lease already exists for shard {SHARD}, held by {} (incarnation {}); whether its holder runs could not be proved ({why}); the row expires in {} s unless it is renewed. Not binding.",
                        row.info.holder,
                        if row.info.incarnation.is_empty() { "-" } else { &row.info.incarnation },
                        row.expires_in_secs()
                    ),
                )
                .held_by(by),
            // A connected holder, or a row gone by the time it was read (taken or expired
            // since): the claim lost to a live daemon.
            _ => self
                .refuse(
                    PHASE,
                    held,
                    format!("delivery: a live lease already exists for shard {SHARD} — another delivery daemon is running. Not binding."),
                )
                .held_by(by),
        }
    }

    /// `$SYS` observer admission, before the endpoint or the lease. The store read runs off the
    /// async workers (a store may be a remote backend); a health fault during it rejects the
    /// start once it returned.
    async fn admit(self) -> Result<Admitted, StartError> {
        const PHASE: StartPhase = StartPhase::Admit;
        let sys_store = self.plan.cfg.sys_store.clone();
        let for_space = self.plan.space.clone();
        let pair =
            tokio::task::spawn_blocking(move || SysPair::read(&*sys_store, &for_space)).await;
        if let Some(verdict) = self.health.verdict_now() {
            return Err(self.unwind(StartError::of_verdict(verdict).at(PHASE)).await);
        }
        let pair = match pair {
            Ok(p) => p,
            Err(e) => {
                let err = self.refuse(
                    PHASE,
                    StartErrorKind::Fault,
                    format!("delivery: the $SYS credential read failed ({e})"),
                );
                return Err(self.unwind(err).await);
            }
        };
        match admission::admit(&pair, &self.plan.account) {
            Ok(a) => {
                let journal = &self.plan.journal;
                journal.line(format!(
                    "• delivery: $SYS sweeps bound to {} (account {})",
                    self.plan.cfg.sweeps_bound_to, a.account
                ));
                if !a.evictor_present {
                    journal.line(format!(
                        "• delivery: no connection-evictor credential at {}: deny-new-only posture, eviction unavailable until it is provisioned",
                        pair.evictor.at
                    ));
                }
                Ok(Admitted(self))
            }
            Err(e) => {
                let err = self.refuse(PHASE, StartErrorKind::Admission, e.to_string());
                Err(self.unwind(err).await)
            }
        }
    }
}

/// Admitted by `$SYS`; the lease is not claimed yet.
struct Admitted(Dialed);

impl Admitted {
    /// The single-flight lease. A stop during the claim waits for the broker's answer; its line
    /// is written when the signal lands (before the release), not after.
    async fn claim(self) -> Result<Claimed, StartError> {
        const PHASE: StartPhase = StartPhase::Claim;
        let Admitted(mut d) = self;
        let js = jetstream::context::ContextBuilder::new()
            .timeout(d.plan.plane.request_bound)
            .build(d.resident.client.clone());
        let ttl = super::holder::lease_ttl(&js, &d.plan.names).await;
        let bucket = d.plan.names.delivery_bucket();
        let rows = match Rows::open(&js, &bucket, d.plan.plane.request_bound).await {
            Ok(r) => r,
            Err(e) => {
                let err = d.refuse(
                    PHASE,
                    StartErrorKind::LeaseRefused,
                    format!(
                        "delivery: acquiring the lease for shard {SHARD} failed: {e}. Not binding."
                    ),
                );
                return Err(d.unwind(err).await);
            }
        };
        let identity = Identity {
            holder: d.plan.me.dot_form(),
            incarnation: uuid::Uuid::new_v4().simple().to_string(),
        };
        let mut lease = Lease::new(rows, identity.clone(), d.resident.violations.clone());
        let mut announced: Option<&'static str> = None;
        let claimed = {
            let claim = lease.claim();
            tokio::pin!(claim);
            loop {
                tokio::select! {
                    r = &mut claim => break r,
                    by = d.plan.stops.stopped(), if announced.is_none() => {
                        d.plan.journal.line(stop_line(by, &d.plan.space));
                        announced = Some(by);
                    }
                }
            }
        };
        if let Err(e) = claimed {
            let err = match &e {
                ClaimError::Held { .. } => d.refuse_held(&lease, ttl).await,
                ClaimError::Denied { operation, subject } => d.refuse(PHASE, claim_outcome(&e).0, format!("delivery: the lease write for shard {SHARD} was refused ({operation} \"{subject}\") — this credential cannot write {bucket}.{LEASE_KEY}. Not binding. Use a credential holding the \"delivery\" profile.")),
                ClaimError::Refused { detail } => d.refuse(PHASE, claim_outcome(&e).0, format!("delivery: acquiring the lease for shard {SHARD} failed: {detail}. Not binding.")),
            };
            return Err(d.unwind(err).await);
        }
        Ok(Claimed {
            dialed: d,
            js,
            ttl,
            lease,
            identity,
            announced,
        })
    }
}

/// The claim won: from here every refusal releases it (the keeper's way out).
struct Claimed {
    dialed: Dialed,
    js: jetstream::Context,
    ttl: Duration,
    lease: Lease,
    identity: Identity,
    /// A stop that landed during the claim (its line is written).
    announced: Option<&'static str>,
}

impl Claimed {
    /// The daemon's parts under the lease: the renewal, the plane context, the `$SYS`
    /// authority, the admin parts and the keeper that owns them.
    async fn wire(self) -> Result<Wired, StartError> {
        const PHASE: StartPhase = StartPhase::Wire;
        let Claimed {
            dialed:
                Dialed {
                    plan,
                    resident,
                    health,
                },
            js,
            ttl,
            lease,
            identity,
            announced,
        } = self;
        if let Some(won) = &plan.cfg.on_lease_won {
            won();
        }
        let startup_complete = Arc::new(AtomicBool::new(false));
        // Renewal of the standing credential (75 % re-read, `reloadCreds`).
        let renewal = Arc::new(Renewal::new(RenewalParts {
            store: plan.cfg.store.clone(),
            space: plan.space.clone(),
            cell: resident.credential.clone(),
            preflight: Preflight::new(plan.cfg.server.clone(), plan.cfg.tls_ca.clone()),
            client: resident.client.clone(),
            events: resident.events.clone(),
            link: resident.link.clone(),
            health: health.clone(),
            journal: plan.journal.clone(),
            retry: plan.cfg.tuning.remint_retry,
        }));
        let ctx = PlaneCtx {
            client: resident.client.clone(),
            js: js.clone(),
            names: plan.names.clone(),
            journal: plan.journal.clone(),
            me: plan.me.clone(),
            gate: ServingGate::default(),
            config: plan.plane.clone(),
            startup_complete: startup_complete.clone(),
            caches: crate::plane::Caches::new(&plan.names),
            handoffs: Arc::default(),
            metrics: plan.cfg.metrics.clone(),
            conn: resident.events.clone(),
        };
        // The `$SYS` pair the eviction and liveness verbs sweep with (re-read and re-checked on
        // every call, from the store admission read).
        let sys = Arc::new(SysAuthority {
            store: plan.cfg.sys_store.clone(),
            space: plan.space.clone(),
            account: plan.account.clone(),
            server_url: plan.cfg.server.clone(),
            tls_ca: plan.cfg.tls_ca.clone(),
            limits: SweepLimits::of(&plan.cfg.tuning),
        });
        let admin = AdminParts {
            credentials: Some(renewal.clone()),
            sys: Some(sys.clone()),
            kicker: Some(
                plan.cfg
                    .kicker
                    .clone()
                    .unwrap_or_else(|| Arc::new(EvictorKicker { authority: sys })),
            ),
            ..AdminParts::default()
        };
        let lease_self = LeaseSelf {
            holder: identity.holder.clone(),
            incarnation: identity.incarnation.clone(),
        };
        let keeper = Keeper {
            journal: plan.journal.clone(),
            space: plan.space.clone(),
            lease,
            plane: Plane::new(ctx, admin, lease_self),
            noted: "held",
            quiesced: false,
            connected: true,
            events: resident.events.subscribe(),
            resident,
            health: health.clone(),
            redial_wait: plan.cfg.redial_wait,
            ttl,
        };
        if let Some(verdict) = health.verdict_now() {
            keeper.abandon(verdict).await;
            return Err(StartError::of_verdict(verdict).at(PHASE));
        }
        if let Some(by) = plan.stops.cause() {
            match announced {
                // Its line was written when it landed during the claim.
                Some(_) => keeper.stop(by).await,
                None => keeper.stop_signalled(by).await,
            };
            return Err(plan.stopped(PHASE, by));
        }
        Ok(Wired {
            plan,
            keeper,
            renewal,
            health,
            js,
            identity,
            ttl,
            startup_complete,
        })
    }
}

/// The keeper owns the lease and the (unbound) plane.
struct Wired {
    plan: Plan,
    keeper: Keeper,
    renewal: Arc<Renewal>,
    health: HealthHandle,
    js: jetstream::Context,
    identity: Identity,
    ttl: Duration,
    startup_complete: Arc<AtomicBool>,
}

impl Wired {
    /// Binds the fan-out writer, the reader and both rails, then marks the lease ready. A stop
    /// wins over a binding still in flight: nothing is marked ready after it.
    async fn arm(mut self) -> Result<Armed, StartError> {
        const PHASE: StartPhase = StartPhase::Arm;
        let mut verdicts = self.health.clone();
        let bound = tokio::select! {
            biased;
            by = self.plan.stops.stopped() => Err(Err(by)),
            v = verdicts.verdict() => Err(Ok(v)),
            r = self.keeper.plane.arm() => Ok(r),
        };
        let journal = self.plan.journal.clone();
        match bound {
            Err(Err(by)) => {
                self.keeper.stop_signalled(by).await;
                return Err(self.plan.stopped(PHASE, by));
            }
            Err(Ok(verdict)) => {
                self.keeper.abandon(verdict).await;
                return Err(StartError::of_verdict(verdict).at(PHASE));
            }
            Ok(Err(e)) => {
                let detail = format!("delivery: {e}");
                return Err(fault_after_claim(&journal, self.keeper, PHASE, detail).await);
            }
            Ok(Ok(())) => {}
        }
        if let Some(by) = self.plan.stops.cause() {
            self.keeper.stop_signalled(by).await;
            return Err(self.plan.stopped(PHASE, by));
        }
        if let Err(e) = self.keeper.lease.mark_ready().await {
            journal.line(format!(
                "! delivery: bound but could not mark the lease ready ({e}); the next renew re-synchronises"
            ));
        }
        journal.line(format!(
            "✓ delivery daemon up (space {}) — stop with: {}",
            self.plan.space, self.plan.cfg.stop_with
        ));
        Ok(Armed(self))
    }
}

/// Serving under a ready lease; the lease watch is not bound yet.
struct Armed(Wired);

impl Armed {
    /// The lease watch (start-up is complete once it is bound), then the companions: the
    /// membership feed (fail-soft), the checkpoint timer writer (its own connection under the
    /// credential held now; its faults restart it and never reach the serve loop) and the
    /// metrics sampler; then the serve loop runs.
    async fn companions(self) -> Result<SpaceDaemon, StartError> {
        const PHASE: StartPhase = StartPhase::Companions;
        let Armed(Wired {
            plan,
            keeper,
            renewal,
            health,
            js,
            identity,
            ttl,
            startup_complete,
        }) = self;
        let Plan {
            cfg,
            mut stops,
            close,
            journal,
            space,
            account,
            spec,
            names,
            plane,
            ..
        } = plan;
        // A verdict ends the start where it waits, as it ends the serve loop: a bind or a dial
        // against a broker that is gone would only time out, and a start refused that way is
        // a fault (exit 1, after waiting to release) instead of the broker-gone exit at the
        // window. The bind itself outlives a blip: an attempt whose connection drops is made
        // again once it is back (`LeaseWatch::bind`), so only the verdict or a stop ends the
        // wait for it.
        let mut verdicts = health.clone();
        let bound = LeaseWatch::bind(
            &js,
            &names,
            &identity,
            journal.clone(),
            &keeper.resident.events,
            plane.request_bound,
        );
        let bound = tokio::select! {
            biased;
            v = verdicts.verdict() => Err(Ok(v)),
            by = stops.stopped() => Err(Err(by)),
            r = bound => Ok(r),
        };
        let watch = match bound {
            Ok(Ok(w)) => w,
            Ok(Err(e)) => {
                let detail = format!("delivery: the lease watch could not be bound ({e})");
                return Err(fault_after_claim(&journal, keeper, PHASE, detail).await);
            }
            Err(Ok(verdict)) => {
                keeper.abandon(verdict).await;
                return Err(StartError::of_verdict(verdict).at(PHASE));
            }
            Err(Err(by)) => {
                keeper.stop_signalled(by).await;
                return Err(stopped_at(PHASE, by));
            }
        };
        // A manual reconnect (the move onto an adopted credential) retires the watch first.
        renewal.attach_lease_watch(watch.retirement());
        startup_complete.store(true, Ordering::SeqCst);
        let mut feed_parts = FeedParts::new(
            spec.clone(),
            cfg.store.clone(),
            space.clone(),
            account,
            journal.clone(),
        );
        feed_parts.interval = cfg.tuning.membership_interval;
        feed_parts.members = Some(keeper.plane.proved_members());
        let feed = tokio::select! {
            biased;
            v = verdicts.verdict() => {
                drop(watch);
                keeper.abandon(v).await;
                return Err(StartError::of_verdict(v).at(PHASE));
            }
            f = MembershipFeed::start(feed_parts) => f,
        };
        if let Some(feed) = &feed {
            let (cell, client) = feed.rw();
            renewal.attach_membership(cell, client);
        }
        let mut timer_parts = TimerWriterParts::new(
            spec,
            keeper.resident.credential.clone(),
            space.clone(),
            journal.clone(),
        );
        timer_parts.retry = cfg.tuning.timer_retry;
        timer_parts.poll = cfg.tuning.timer_poll;
        let timer = TimerWriter::start(timer_parts);

        // Lags and states for `--metrics-addr`, sampled off the hot path until the end; not at
        // all when no endpoint serves them (nobody reads them, and each sample is five broker
        // requests on the resident connection).
        let gate = keeper.plane.gate();
        let caches = keeper.plane.caches();
        let sampler = cfg.metrics.is_served().then(|| {
            crate::base::Sampler {
                js: js.clone(),
                names,
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
                        crate::base::CacheCounts {
                            cache,
                            fences: s.fences,
                            fallbacks: s.fallbacks,
                            resets: s.resets,
                        }
                    })
                    .collect()
                }),
            }
            .spawn()
        });
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
            reread: cfg.reread.clone(),
        };
        let end = tokio::spawn(serving.run());
        let end: BoxFuture<'static, Closed> = Box::pin(async move {
            let closed = end.await.unwrap_or_else(|e| Closed::Fault {
                detail: format!("the keeper task ended abnormally ({e})"),
            });
            if let Some(sampler) = &sampler {
                sampler.abort();
            }
            metrics.lease_held(false);
            // What was only counted is said before the end.
            flush.flush_repeats();
            closed
        });
        Ok(SpaceDaemon::running(space, close, end.shared(), health))
    }
}

/// A start ended by a stop in `phase`.
fn stopped_at(phase: StartPhase, by: &str) -> StartError {
    StartError::new(StartErrorKind::Stopped, format!("stopped by {by}")).at(phase)
}

/// A fault after the claim won: said, the claim released (the keeper's way out), refused.
async fn fault_after_claim(
    journal: &Journal,
    keeper: Keeper,
    phase: StartPhase,
    detail: String,
) -> StartError {
    journal.line("✗ delivery: start-up failed - releasing the shard before exiting");
    journal.line(format!("✗ {detail}"));
    keeper
        .leave(Closed::Fault {
            detail: detail.clone(),
        })
        .await;
    StartError::new(StartErrorKind::Fault, detail).at(phase)
}
