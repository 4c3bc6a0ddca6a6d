//! Start-up of one space's daemon, from the workspace root to serving under the lease.
//!
//! Start-up order is the seeds': workspace root, credential, reachability, `$SYS` admission, then
//! the single-flight lease; the pid record only once the lease is held; `ready` only once every
//! binding is established; start-up complete only once the lease watch is bound. After that the
//! keeper holds the lease (renew at TTL/2, watch every change of the key) and quiesces before it
//! arbitrates any doubt. Every way out releases what it holds and says why, with an exit code a
//! supervisor can act on (`docs/operations.md`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;

use crate::conn::{self, CredentialCell, DialErrorKind, DialSpec};
use crate::creds::{read_creds_file, CredsErrorKind};
use crate::files::{self, PidRecord};
use crate::journal::Journal;
use crate::kv::Rows;
use crate::plane::{PlaneConfig, PlaneCtx, ServingGate};
use crate::space::admission;
use crate::space::exit::Exit;
use crate::space::health::{HealthConfig, HealthHandle, Watchdog};
use crate::space::keeper::Keeper;
use crate::space::lease::{self, ClaimError, Identity, Lease, SHARD};
use crate::space::lease_watch::{LeaseWatch, WatchEvent};
use crate::space::renew::{Preflight, Renewal, RenewalParts};
use crate::space::serving::Plane;
use crate::space::signal::StopSignal;
use crate::store::{CredsFileStore, FsStore, SecretStore};
use crate::wire::{Principal, Space, SpaceNames, LEASE_KEY};

/// Default broker when `--server` is not given.
pub const DEFAULT_SERVER: &str = "nats://127.0.0.1:4222";
/// Lease TTL when the bucket declares no `max_age` (the reference `LEASE_TTL_MS`).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// Everything `deliver` is started with.
#[derive(Debug, Clone)]
pub struct DeliverConfig {
    pub space: Space,
    pub server: String,
    pub root: Option<PathBuf>,
    pub creds: Option<PathBuf>,
    pub tls: bool,
    pub tls_ca: Option<PathBuf>,
    pub cwd: PathBuf,
    pub ping_interval: Duration,
    pub plane: PlaneConfig,
}

impl DeliverConfig {
    pub fn new(space: Space, cwd: PathBuf) -> DeliverConfig {
        DeliverConfig {
            space,
            server: DEFAULT_SERVER.into(),
            root: None,
            creds: None,
            tls: false,
            tls_ca: None,
            cwd,
            ping_interval: Duration::from_millis(conn::DEFAULT_PING_INTERVAL_MS),
            plane: PlaneConfig::default(),
        }
    }
}

/// Runs the daemon to its exit.
pub async fn run(cfg: DeliverConfig) -> Exit {
    let journal = Journal::stderr_only();
    let mut stop = match StopSignal::install() {
        Ok(s) => s,
        Err(e) => {
            journal.line(format!(
                "✗ delivery: could not install signal handlers ({e})"
            ));
            return Exit::Fault;
        }
    };
    let space = cfg.space.clone();

    // 1. The workspace root, before any credential is read or any broker dialed.
    let root = match files::resolve_root(cfg.root.as_deref(), &cfg.cwd) {
        Ok(r) => r,
        Err(e) => {
            journal.line(format!("✗ {e}"));
            return Exit::Config;
        }
    };
    match files::open_log(&files::log_path(&root, &space)) {
        Ok(Some(f)) => journal.attach_file(f),
        Ok(None) => {}
        Err(e) => journal.line(format!("! {e}")),
    }
    if let Some(creds) = &cfg.creds {
        if let Err(e) = files::check_creds_root(creds, &root, &cfg.cwd) {
            journal.line(format!("✗ {e}"));
            return Exit::Config;
        }
    }
    let space_dir = root.join(files::COTAL_DIR).join(space.segment());
    let creds_path = cfg
        .creds
        .as_ref()
        .map(|p| files::absolute(p, &cfg.cwd))
        .unwrap_or_else(|| space_dir.join("delivery.creds"));

    // 2. The standing credential.
    let credential = match read_creds_file(&creds_path) {
        Ok(c) => c,
        Err(e) if e.kind() == CredsErrorKind::Io && !creds_path.exists() => {
            journal.line(format!(
                "✗ delivery: no scoped creds at {}. Provision the space (cotal-delivery up) or pass --creds <file>",
                creds_path.display()
            ));
            return Exit::Config;
        }
        Err(e) => {
            journal.line(format!("✗ delivery: {e}"));
            return Exit::Config;
        }
    };
    let (nkey, account) = match (credential.public_key(), credential.claims()) {
        (Ok(k), Ok(c)) => (k, c.account().to_string()),
        (Err(e), _) | (_, Err(e)) => {
            journal.line(format!("✗ delivery: {e}"));
            return Exit::Config;
        }
    };
    let me = match Principal::for_nkey(&nkey) {
        Ok(p) => p,
        Err(e) => {
            journal.line(format!("✗ delivery: {e}"));
            return Exit::Config;
        }
    };

    // 3. Reachability: the first dial of the resident connection.
    let spec = DialSpec::new(cfg.server.clone())
        .tls(cfg.tls, cfg.tls_ca.clone())
        .ping_interval(cfg.ping_interval);
    let cell = CredentialCell::new(credential);
    // the source renewals are re-read from: the workspace store, or the --creds file.
    let store: Arc<dyn SecretStore> = match &cfg.creds {
        None => Arc::new(FsStore::new(root.clone())),
        Some(_) => match CredsFileStore::new(creds_path.clone(), space.clone()) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                journal.line(format!("✗ delivery: {e}"));
                return Exit::Config;
            }
        },
    };
    let resident = tokio::select! {
        r = conn::dial(&spec, cell) => r,
        name = stop.wait() => {
            journal.line(format!("• delivery: received {name}, exiting (space {space}, shard {SHARD})"));
            return Exit::Signalled;
        }
    };
    let resident = match resident {
        Ok(r) => r,
        Err(e) => {
            match e.kind() {
                DialErrorKind::Unreachable => journal.line(format!(
                    "✗ delivery: can't reach NATS at {}. Run: cotal up ({e})",
                    cfg.server
                )),
                DialErrorKind::PlaintextRefused => journal.line(format!("✗ delivery: {e}")),
                DialErrorKind::Refused => journal.line(format!(
                    "✗ delivery: the broker at {} refused this daemon's connection ({e})",
                    cfg.server
                )),
            }
            return Exit::Unreachable;
        }
    };

    // from here on the broker is watched through the resident connection only.
    let mut health: HealthHandle = Watchdog::spawn(
        HealthConfig::from_env(),
        resident.events.subscribe(),
        resident.client.clone(),
        journal.clone(),
        space.to_string(),
        true,
    );

    // 4. `$SYS` observer admission, before the endpoint or the lease.
    let (observer_path, evictor_path) = admission::sys_pair_paths(&space_dir);
    match admission::admit(&observer_path, &evictor_path, &account) {
        Ok(a) => {
            journal.line(format!(
                "• delivery: $SYS sweeps bound to {}/.cotal (account {})",
                root.display(),
                a.account
            ));
            if !a.evictor_present {
                journal.line(format!(
                    "• delivery: no connection-evictor credential at {}: deny-new-only posture, eviction unavailable until it is provisioned",
                    evictor_path.display()
                ));
            }
        }
        Err(e) => {
            journal.line(format!("✗ {e}"));
            health.stand_down();
            let _ = resident.client.drain().await;
            return Exit::Admission;
        }
    }

    let names = SpaceNames::new(&space);
    let js = jetstream::context::ContextBuilder::new()
        .timeout(cfg.plane.request_bound)
        .build(resident.client.clone());
    let ttl = lease_ttl(&js, &names).await;
    let rows = match Rows::open(&js, &names.delivery_bucket(), cfg.plane.request_bound).await {
        Ok(r) => r,
        Err(e) => {
            journal.line(format!(
                "✗ delivery: acquiring the lease for shard {SHARD} failed: {e}. Not binding."
            ));
            return Exit::LeaseRefused;
        }
    };
    let identity = Identity {
        holder: me.dot_form(),
        incarnation: uuid::Uuid::new_v4().simple().to_string(),
    };
    let mut lease = Lease::new(rows, identity.clone(), resident.violations.clone());

    // 5. The single-flight lease. A signal during the claim waits for the broker's answer.
    if let Err(e) = lease.claim().await {
        let bucket = names.delivery_bucket();
        let (line, exit) = match &e {
            ClaimError::Held { .. } => (
                format!("✗ delivery: a live lease already exists for shard {SHARD} — another delivery daemon is running. Not binding."),
                Exit::LeaseHeld,
            ),
            ClaimError::Denied { operation, subject } => (
                format!("✗ delivery: the lease write for shard {SHARD} was refused ({operation} \"{subject}\") — this credential cannot write {bucket}.{LEASE_KEY}. Not binding. Use a credential holding the \"delivery\" profile."),
                Exit::LeaseDenied,
            ),
            ClaimError::Refused { detail } => (
                format!("✗ delivery: acquiring the lease for shard {SHARD} failed: {detail}. Not binding."),
                Exit::LeaseRefused,
            ),
        };
        journal.line(line);
        health.stand_down();
        let _ = resident.client.drain().await;
        return exit;
    }

    // 6. It is the space's daemon now: record it.
    let pid_record = match PidRecord::write(files::pid_path(&root, &space), std::process::id()) {
        Ok(r) => Some(r),
        Err(e) => {
            journal.line(format!("! {e}"));
            None
        }
    };

    let startup_complete = Arc::new(AtomicBool::new(false));
    // renewal of the standing credential (75% re-read, reloadCreds).
    let renewal = Arc::new(Renewal::new(RenewalParts {
        store,
        space: space.clone(),
        cell: resident.credential.clone(),
        preflight: Preflight::new(cfg.server.clone(), cfg.tls_ca.clone()),
        client: resident.client.clone(),
        events: resident.events.clone(),
        health: health.clone(),
        journal: journal.clone(),
    }));
    let ctx = PlaneCtx {
        client: resident.client.clone(),
        js: js.clone(),
        names: names.clone(),
        journal: journal.clone(),
        me: me.clone(),
        gate: ServingGate::default(),
        config: cfg.plane.clone(),
        startup_complete: startup_complete.clone(),
    };
    let mut keeper = Keeper {
        journal: journal.clone(),
        space: space.clone(),
        lease,
        plane: Plane::new(ctx, Some(renewal.clone())),
        noted: "held",
        quiesced: false,
        connected: true,
        events: resident.events.subscribe(),
        client: resident.client.clone(),
        health: health.clone(),
    };

    if let Some(name) = stop.received() {
        return keeper.stop_signalled(name, pid_record.as_ref()).await;
    }

    // 7. Bind the reader, membership and administration, then mark the lease ready.
    // A signal wins over a binding that is still in flight: nothing is marked ready after it.
    let bound = tokio::select! {
        biased;
        _ = stop.wait() => None,
        r = keeper.plane.arm() => Some(r),
    };
    match bound {
        None => {
            let name = stop.received().unwrap_or("SIGTERM");
            return keeper.stop_signalled(name, pid_record.as_ref()).await;
        }
        Some(Err(e)) => {
            journal.line("✗ delivery: start-up failed - releasing the shard before exiting");
            journal.line(format!("✗ delivery: {e}"));
            return keeper.shutdown(Exit::Fault, pid_record.as_ref()).await;
        }
        Some(Ok(())) => {}
    }
    if let Some(name) = stop.received() {
        return keeper.stop_signalled(name, pid_record.as_ref()).await;
    }
    if let Err(e) = keeper.lease.mark_ready().await {
        journal.line(format!(
            "! delivery: bound but could not mark the lease ready ({e}); the next renew re-synchronises"
        ));
    }
    journal.line(format!(
        "✓ delivery daemon up (space {space}) — stop with: cotal down"
    ));

    // 8. The lease watch; start-up is complete once it is bound.
    let mut watch = match LeaseWatch::bind(&js, &names, &identity).await {
        Ok(w) => w,
        Err(e) => {
            journal.line("✗ delivery: start-up failed - releasing the shard before exiting");
            journal.line(format!(
                "✗ delivery: the lease watch could not be bound ({e})"
            ));
            return keeper.shutdown(Exit::Fault, pid_record.as_ref()).await;
        }
    };
    startup_complete.store(true, Ordering::SeqCst);

    // 9. Serve under the lease until a signal or a lost lease.
    let mut renew = tokio::time::interval(lease::renew_interval(ttl));
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    renew.tick().await;
    let exit = loop {
        tokio::select! {
            name = stop.wait() => {
                watch.retire().await;
                return keeper.stop_signalled(name, pid_record.as_ref()).await;
            }
            _ = renew.tick() => {
                if let Some(exit) = keeper.on_renew_tick().await { break exit; }
            }
            event = watch.next() => {
                match event {
                    Some(WatchEvent::Foreign) => {
                        if let Some(exit) = keeper.on_watch_event().await { break exit; }
                    }
                    Some(WatchEvent::Own) => {}
                    None => {
                        journal.line("! delivery: the lease watch trigger faulted (its consumer ended); the renew interval remains the arbiter");
                        watch.park();
                    }
                }
            }
            ev = keeper.events.recv() => keeper.on_conn_event(ev),
            // the 75% re-read, and the transport-health verdict that ends the process.
            _ = renewal.due() => {
                renewal.on_due().await;
            }
            verdict = health.verdict() => {
                return keeper.abandon(verdict, pid_record.as_ref()).await;
            }
        }
    };
    watch.retire().await;
    keeper.shutdown(exit, pid_record.as_ref()).await
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
