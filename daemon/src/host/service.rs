//! `start_delivery_service`: one space's delivery daemon embedded in another program.
//!
//! Why a host of its own: an embedding program (a manager, a platform worker) assigns the
//! account, the lifecycle, the store and the state directory itself. So this host never
//! resolves a workspace root, never reads `.cotal/` or a mesh registry, writes no pid record and
//! never exits the process; it refuses locally, naming the mismatch, when the injected store
//! declares no stable identity or another one than assigned, or when the initial delivery
//! credential belongs to another account. Everything else is the [`SpaceDaemon`]'s: a failed
//! start closes what it opened and releases a claim it won, and `close()` releases only the
//! row this instance owns.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, Shared};

use crate::base::{delivery_creds_key, Credential, Journal, SecretStore, StoreIdentity, Tuning};
use crate::space::{
    CloseError, Closed, SpaceConfig, SpaceDaemon, StartError, StartErrorKind, Stop,
};
use crate::wire::{LifecycleUid, Space};

/// What an embedding host assigns to one delivery service (docs/embedding.md).
#[derive(Clone)]
pub struct HostedContextInputs {
    /// The assigned data account's public key (`A…`): the delivery credential must be its.
    pub account: String,
    /// The lifecycle UID of this service instance (26–32 of `[a-z0-9]`); it names the
    /// connection (`cotal:delivery:<uid>`) so the broker's view tells instances apart.
    pub lifecycle_uid: String,
    pub space: Space,
    /// Broker URL (`nats://` or `tls://`).
    pub server: String,
    /// The injected store: the delivery credential (`space.<key>/delivery.creds`), its
    /// renewals and the `$SYS` pair are read from it, and nothing else.
    pub store: Arc<dyn SecretStore>,
    /// The stable identity assigned to that store; the store must declare exactly this
    /// injected identity.
    pub store_identity: StoreIdentity,
    /// Where this service keeps its own files (its log, `delivery.<key>.log`).
    pub state_dir: PathBuf,
    pub tls: bool,
    pub tls_ca: Option<PathBuf>,
    /// The service's timing. [`HostedContextInputs::new`] reads it from the environment
    /// once (the documented overrides, e.g. `COTAL_DELIVERY_BROKER_GONE_MS`); an embedder
    /// may set its own. `close()` waits up to `tuning.health`'s window, from the drop, for a
    /// dropped connection to come back before it decides its release.
    pub tuning: Tuning,
}

impl HostedContextInputs {
    /// The assigned inputs, with the documented timing defaults and the environment's
    /// overrides ([`Tuning::from_env`], read here once: the embedder's edge).
    pub fn new(
        account: impl Into<String>,
        lifecycle_uid: impl Into<String>,
        space: Space,
        server: impl Into<String>,
        store: Arc<dyn SecretStore>,
        store_identity: StoreIdentity,
        state_dir: impl Into<PathBuf>,
    ) -> HostedContextInputs {
        HostedContextInputs {
            account: account.into(),
            lifecycle_uid: lifecycle_uid.into(),
            space,
            server: server.into(),
            store,
            store_identity,
            state_dir: state_dir.into(),
            tls: false,
            tls_ca: None,
            tuning: Tuning::from_env(),
        }
    }
}

/// A running embedded delivery service.
pub struct DeliveryService {
    daemon: SpaceDaemon,
    lifecycle_uid: LifecycleUid,
    log_path: PathBuf,
}

impl DeliveryService {
    pub fn space(&self) -> &Space {
        self.daemon.space()
    }
    pub fn lifecycle_uid(&self) -> &LifecycleUid {
        &self.lifecycle_uid
    }
    /// This service's log file under the state dir.
    pub fn log_path(&self) -> &std::path::Path {
        &self.log_path
    }
    /// Withdraws serving, releases only the lease row this instance owns, closes its
    /// connection so it never reconnects. Rejects when the release did not commit, could not
    /// be confirmed, or another instance's row is there (named).
    pub fn close(&self) -> BoxFuture<'static, Result<Closed, CloseError>> {
        self.daemon.close()
    }
    /// The same future as [`DeliveryService::close`].
    pub fn drain(&self) -> BoxFuture<'static, Result<Closed, CloseError>> {
        self.daemon.drain()
    }
    /// Resolves with the reason once the service has ended on its own (a fault, a lost lease).
    pub fn closed(&self) -> Shared<BoxFuture<'static, Closed>> {
        self.daemon.closed()
    }
}

fn refuse(journal: &Journal, kind: StartErrorKind, text: String) -> StartError {
    journal.line(format!("✗ {text}"));
    StartError::new(kind, text)
}

/// Starts an embedded delivery service for one space; returns once it serves (the lease ready,
/// every binding and the lease watch bound). A refusal never exits the process and leaves
/// nothing claimed or connected behind.
pub async fn start_delivery_service(
    inputs: HostedContextInputs,
) -> Result<DeliveryService, StartError> {
    let journal = Journal::with_repeat_window(inputs.tuning.log_repeat_window);
    let space = inputs.space.clone();
    let lifecycle_uid = LifecycleUid::parse(&inputs.lifecycle_uid).map_err(|e| {
        refuse(
            &journal,
            StartErrorKind::Config,
            format!("delivery: lifecycle uid: {e}"),
        )
    })?;
    std::fs::create_dir_all(&inputs.state_dir).map_err(|e| {
        refuse(
            &journal,
            StartErrorKind::Config,
            format!(
                "delivery: the state dir {} cannot be created ({e})",
                inputs.state_dir.display()
            ),
        )
    })?;
    let log_path = inputs
        .state_dir
        .join(format!("delivery.{}.log", space.key()));
    match crate::base::open_log(&log_path) {
        Ok(Some(f)) => journal.attach_file(f),
        Ok(None) => {}
        Err(e) => journal.line(format!("! {e}")),
    }

    // The store must declare the assigned injected identity.
    let declared = match inputs.store.identity() {
        Ok(StoreIdentity::Injected { coordinate }) if coordinate.trim().is_empty() => {
            Err("it declares an empty coordinate".to_string())
        }
        Ok(id) => Ok(id),
        Err(e) => Err(e.to_string()),
    };
    let declared = declared.map_err(|why| {
        refuse(
            &journal,
            StartErrorKind::StoreIdentity,
            format!(
                "delivery: the injected store declares no stable identity ({why}); the {} was assigned. Declare it on SecretStore::identity or name it in COTAL_SECRET_STORE",
                inputs.store_identity
            ),
        )
    })?;
    if !matches!(declared, StoreIdentity::Injected { .. })
        || !declared.same_store(&inputs.store_identity)
    {
        return Err(refuse(
            &journal,
            StartErrorKind::StoreIdentity,
            format!(
                "delivery: the injected store declares the {declared}, but the {} was assigned",
                inputs.store_identity
            ),
        ));
    }

    // The initial delivery credential, read off the async workers (a store may be remote).
    let key = delivery_creds_key(&space);
    let store = inputs.store.clone();
    let read_key = key.clone();
    let raw = tokio::task::spawn_blocking(move || store.get(&read_key))
        .await
        .map_err(|e| {
            refuse(
                &journal,
                StartErrorKind::Fault,
                format!("delivery: the store read failed ({e})"),
            )
        })?;
    let where_ = inputs.store.locate(&key);
    let credential = match raw {
        Ok(Some(text)) => Credential::parse(&text).map_err(|e| {
            refuse(
                &journal,
                StartErrorKind::Config,
                format!(
                    "delivery: {where_} does not hold a usable credential ({})",
                    e.detail()
                ),
            )
        })?,
        Ok(None) => {
            return Err(refuse(
                &journal,
                StartErrorKind::Config,
                format!("delivery: no scoped creds at {where_}"),
            ))
        }
        Err(e) => {
            return Err(refuse(
                &journal,
                StartErrorKind::Config,
                format!("delivery: {e}"),
            ))
        }
    };
    let account = credential
        .claims()
        .map(|c| c.account().to_string())
        .map_err(|e| refuse(&journal, StartErrorKind::Config, format!("delivery: {e}")))?;
    if account != inputs.account {
        return Err(refuse(
            &journal,
            StartErrorKind::Account,
            format!(
                "delivery: the delivery credential at {where_} belongs to account {account}, but account {} was assigned",
                inputs.account
            ),
        ));
    }

    let mut cfg = SpaceConfig::new(
        space.clone(),
        inputs.server.clone(),
        credential,
        inputs.store.clone(),
    );
    cfg.sweeps_bound_to = declared.to_string();
    cfg.stop_with = "the embedder's DeliveryService::close()".to_string();
    cfg.tls = inputs.tls;
    cfg.tls_ca = inputs.tls_ca.clone();
    cfg.redial_wait = Duration::from_millis(inputs.tuning.health.window_ms());
    cfg.tuning = inputs.tuning;
    cfg.connection_name = format!("cotal:delivery:{lifecycle_uid}");
    cfg.journal = journal;
    let daemon = SpaceDaemon::start(cfg, Stop::never()).await?;
    Ok(DeliveryService {
        daemon,
        lifecycle_uid,
        log_path,
    })
}
