//! The renewal owner of a space's standing credentials (`delivery`, `membership-rw`): it
//! re-signs them into the store the daemon reads (with a preflight against the broker, so a
//! candidate the broker refuses never replaces the last good one; offline only under `iss`
//! continuity) and asks the daemon to adopt them with `reloadCreds` over `ctl.delivery-admin`.
//! One pass is `cotal-delivery remint`; [`RenewalOwner::watch`] repeats it at half of the
//! credentials' lifetime (`remint --watch`, the process a detached `up` leaves running), and a
//! foreground `up` runs the same loop as a task ([`RenewalOwner::spawn`]). Without an owner a
//! mesh stops at the credential lifetime.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::base::{
    self, delivery_creds_key, membership_rw_creds_key, Credential, FilesError, FsStore, Journal,
    MeshRecord, PidRecord, RemintTarget, SecretStore, BROKER_BOUND,
};
use crate::provision::{self, Profile, SpaceSigner};
use crate::provision::{remint_daemon_creds_for, Preflight, RemintOutcome, RemintReport};
use crate::wire::{CtlService, Principal, Space, SpaceNames};

/// Share of a credential's lifetime after which the owner re-signs: ahead of the daemon's own
/// 75 % re-read, as the reference's renewal owner does.
const RENEW_AT_SHARE: f64 = 0.5;
/// A failed pass is retried after a quarter of what is left of the lifetime, never sooner than
/// this (no spin) ...
const RETRY_FLOOR: Duration = Duration::from_secs(1);
/// ... and never later than this (a broker back from an outage is asked again soon).
const RETRY_CEILING: Duration = Duration::from_secs(60);
/// How long the owner waits before it looks again for standing credentials that are not there
/// (a `down` removed them; the next `up` mints them).
const ABSENT_RECHECK: Duration = Duration::from_secs(60);
/// Bound on the `reloadCreds` answer (the daemon answers after its own preflight).
const RELOAD_BOUND: Duration = Duration::from_secs(15);
/// Lifetime of the supervisor credential a `reloadCreds` request is sent with.
const SUPERVISOR_LIFETIME: Duration = Duration::from_secs(300);

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The broker a renewal owner proves its candidates against, and why that one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerBroker {
    pub url: String,
    pub tls_ca: Option<PathBuf>,
    /// `--server`, `meshes entry`, `.cotal/mesh.json` or `the local default`.
    pub source: &'static str,
}

/// Why the broker of the preflight could not be decided: its kind, the text the refused pass
/// quotes (`Display`), and the registry's read error behind it (`source()`).
#[derive(Debug)]
pub struct OwnerBrokerError {
    kind: OwnerBrokerErrorKind,
    text: String,
    source: Option<FilesError>,
}

/// What keeps the owner from choosing a broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerBrokerErrorKind {
    /// The space's registry record could not be read.
    Registry,
    /// The registry records the space for another root.
    OtherRoot,
    /// `--server` names another broker than the registry's.
    OtherServer,
}

impl OwnerBrokerError {
    fn new(kind: OwnerBrokerErrorKind, text: impl Into<String>) -> OwnerBrokerError {
        OwnerBrokerError {
            kind,
            text: text.into(),
            source: None,
        }
    }
    /// The same error, keeping `source` as its cause.
    fn source(mut self, source: FilesError) -> OwnerBrokerError {
        self.source = Some(source);
        self
    }
    pub fn kind(&self) -> OwnerBrokerErrorKind {
        self.kind
    }
}

impl std::fmt::Display for OwnerBrokerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for OwnerBrokerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Why a request on `ctl.delivery-admin` got no answer: its kind, the text the pass's
/// `unanswered` quotes (`Display`), and the error behind it (`source()`).
#[derive(Debug)]
pub struct AdminRequestError {
    kind: AdminRequestErrorKind,
    text: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// Where the request stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRequestErrorKind {
    /// The supervisor credential could not be minted (no usable signer in the store).
    Supervisor,
    /// The broker refused the supervisor's connection, subscription or request.
    Broker,
    /// No daemon serves the rail (the broker's no-responders answer).
    NoDaemon,
    /// No answer within the bound.
    TimedOut,
    /// The answer is not JSON.
    Reply,
}

impl AdminRequestError {
    fn new(kind: AdminRequestErrorKind, text: impl Into<String>) -> AdminRequestError {
        AdminRequestError {
            kind,
            text: text.into(),
            source: None,
        }
    }
    /// The same error, keeping `source` as its cause.
    fn source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> AdminRequestError {
        self.source = Some(Box::new(source));
        self
    }
    pub fn kind(&self) -> AdminRequestErrorKind {
        self.kind
    }
}

impl std::fmt::Display for AdminRequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for AdminRequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// What one pass's `reloadCreds` came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The daemon proved and adopted the renewal.
    Adopted,
    /// The daemon answered with a refusal (quoted).
    Refused(String),
    /// No daemon answered (none running, or not within the bound).
    Unanswered(String),
    /// Not asked: offline, or nothing was renewed.
    NotAsked(&'static str),
}

/// One pass: the per-file re-sign and the adoption request.
#[derive(Debug, Clone)]
pub struct Pass {
    pub broker: Option<OwnerBroker>,
    pub report: RemintReport,
    pub reload: Reload,
    /// Why no file was even tried: the broker of the preflight could not be decided.
    unresolved: Option<String>,
}

impl Pass {
    /// The refusal that came before any file was read (the registry contradicts `--server`,
    /// or names another root).
    pub fn refused_before(&self) -> Option<String> {
        self.unresolved.clone()
    }
    /// Every file was renewed.
    pub fn renewed(&self) -> bool {
        self.report.all_written()
    }
    /// The earliest `exp` among the files written.
    pub fn exp(&self) -> Option<i64> {
        self.report
            .files
            .iter()
            .filter_map(|(_, o)| match o {
                RemintOutcome::Written { exp, .. } => *exp,
                _ => None,
            })
            .min()
    }
    /// `<file>: <why>` for every file that was not renewed.
    pub fn failures(&self) -> Vec<String> {
        self.report
            .files
            .iter()
            .filter_map(|(key, o)| {
                let file = key.rsplit('/').next().unwrap_or(key);
                match o {
                    RemintOutcome::Written { .. } => None,
                    RemintOutcome::Skipped(why) => Some(format!("{file}: skipped ({why})")),
                    RemintOutcome::Refused(why) => Some(format!("{file}: {why}")),
                }
            })
            .collect()
    }
}

/// What the owner's loop is told by its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerEvent {
    /// Stop (the signal's name).
    Stop(&'static str),
    /// Re-sign now (SIGHUP).
    RenewNow,
}

/// The renewal owner of one space's standing credentials in one store.
#[derive(Debug, Clone)]
pub struct RenewalOwner {
    space: Space,
    target: RemintTarget,
    /// `--server` / `--tls-ca`, else resolved at each pass from the records of the root.
    server: Option<String>,
    tls_ca: Option<PathBuf>,
    /// `None`: each pass keeps the delivery credential's own lifetime (24 h without one).
    lifetime: Option<Duration>,
    offline: bool,
    /// Who the lines name (`up`, `remint`).
    who: &'static str,
}

impl RenewalOwner {
    pub fn new(space: &Space, target: RemintTarget, who: &'static str) -> RenewalOwner {
        RenewalOwner {
            space: space.clone(),
            target,
            server: None,
            tls_ca: None,
            lifetime: None,
            offline: false,
            who,
        }
    }
    /// Proves against this broker instead of the one the records name.
    pub fn server(mut self, url: Option<String>, tls_ca: Option<PathBuf>) -> Self {
        self.server = url;
        self.tls_ca = tls_ca;
        self
    }
    pub fn lifetime(mut self, lifetime: Option<Duration>) -> Self {
        self.lifetime = lifetime;
        self
    }
    /// No preflight and no `reloadCreds`: a re-sign is written only under `iss` continuity.
    pub fn offline(mut self, offline: bool) -> Self {
        self.offline = offline;
        self
    }

    fn store(&self) -> FsStore {
        match &self.target {
            RemintTarget::Workspace(root) => FsStore::new(root),
            RemintTarget::Dir(dir) => FsStore::at_dir(dir),
        }
    }

    fn root(&self) -> &Path {
        match &self.target {
            RemintTarget::Workspace(root) | RemintTarget::Dir(root) => root,
        }
    }

    /// The broker of the preflight: `--server`; else, for a workspace, the registry record of
    /// the space (refused when it names another root, or another broker than `--server`), else
    /// the root's `.cotal/mesh.json` (where `up` records its mesh); else the local default. An
    /// injected directory store never consults the registry.
    pub fn broker(&self) -> Result<OwnerBroker, OwnerBrokerError> {
        use OwnerBrokerErrorKind as K;
        let space = &self.space;
        let RemintTarget::Workspace(root) = &self.target else {
            return Ok(OwnerBroker {
                url: self
                    .server
                    .clone()
                    .unwrap_or_else(|| base::DEFAULT_SERVER.to_string()),
                tls_ca: self.tls_ca.clone(),
                source: if self.server.is_some() {
                    "--server"
                } else {
                    "the local default"
                },
            });
        };
        let registered = base::cotal_home()
            .map(|home| MeshRecord::read(&base::registry_path(&home, space)))
            .transpose()
            .map_err(|e| OwnerBrokerError::new(K::Registry, e.to_string()).source(e))?
            .flatten();
        if let Some(rec) = &registered {
            if &rec.root != root {
                return Err(OwnerBrokerError::new(K::OtherRoot, format!(
                    "space \"{space}\" is registered for root {} but this renewal owner serves root {} - the recorded broker belongs to another workspace",
                    rec.root.display(),
                    root.display()
                )));
            }
            if let Some(flag) = self.server.as_deref().filter(|f| *f != rec.server) {
                return Err(OwnerBrokerError::new(K::OtherServer, format!(
                    "--server {flag} does not match registered space \"{space}\" at {} - the preflight must ask the broker the daemon serves",
                    rec.server
                )));
            }
        }
        let (record, source) = match registered {
            Some(rec) => (Some(rec), "meshes entry"),
            None => (
                MeshRecord::read(&base::mesh_state_path(root))
                    .ok()
                    .flatten(),
                ".cotal/mesh.json",
            ),
        };
        Ok(match (&self.server, record) {
            (Some(url), rec) => OwnerBroker {
                url: url.clone(),
                tls_ca: self.tls_ca.clone().or(rec.and_then(|r| r.tls_ca)),
                source: "--server",
            },
            (None, Some(rec)) => OwnerBroker {
                url: rec.server,
                tls_ca: self.tls_ca.clone().or(rec.tls_ca),
                source,
            },
            (None, None) => OwnerBroker {
                url: base::DEFAULT_SERVER.to_string(),
                tls_ca: self.tls_ca.clone(),
                source: "the local default",
            },
        })
    }

    /// The standing credentials as they are now (absent or unreadable ones left out).
    fn current(&self) -> Vec<Credential> {
        let store = self.store();
        [
            delivery_creds_key(&self.space),
            membership_rw_creds_key(&self.space),
        ]
        .iter()
        .filter_map(|k| store.get(k).ok().flatten())
        .filter_map(|raw| Credential::parse(&raw).ok())
        .collect()
    }

    /// How long until the earliest standing credential is due for re-signing (half its
    /// lifetime); `None` when there is none, or none that expires.
    pub fn due_in(&self) -> Option<Duration> {
        self.current()
            .iter()
            .filter_map(|c| c.claims().ok())
            .filter_map(|c| {
                let exp = c.exp?;
                let life = (exp - c.iat).max(0) as f64;
                Some(c.iat + (life * RENEW_AT_SHARE).floor() as i64)
            })
            .min()
            .map(|at| Duration::from_secs((at - now_secs()).max(0) as u64))
    }

    /// Seconds until the earliest standing credential expires (0 once it has).
    fn left(&self) -> Duration {
        let exp = self
            .current()
            .iter()
            .filter_map(|c| c.claims().ok()?.exp)
            .min();
        Duration::from_secs(exp.map(|e| (e - now_secs()).max(0) as u64).unwrap_or(0))
    }

    /// The lifetime of a re-sign: the flag's, else the delivery credential's own, else 24 h.
    fn lifetime_now(&self) -> Duration {
        self.lifetime.unwrap_or_else(|| {
            self.current()
                .first()
                .and_then(|c| c.claims().ok()?.lifetime_secs())
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(s as u64))
                .unwrap_or(provision::STANDING_TTL)
        })
    }

    /// One pass: re-sign both standing credentials (preflight first unless offline), then
    /// `reloadCreds` for what was written.
    pub async fn pass(&self) -> Pass {
        let store = self.store();
        let broker = if self.offline {
            None
        } else {
            match self.broker() {
                Ok(b) => Some(b),
                Err(e) => {
                    let e = e.to_string();
                    let files = [
                        delivery_creds_key(&self.space),
                        membership_rw_creds_key(&self.space),
                    ]
                    .into_iter()
                    .map(|k| (k, RemintOutcome::Refused(e.clone())))
                    .collect();
                    return Pass {
                        broker: None,
                        report: RemintReport {
                            files,
                            signer: None,
                            notes: Vec::new(),
                        },
                        reload: Reload::NotAsked("nothing was renewed"),
                        unresolved: Some(e),
                    };
                }
            }
        };
        let preflight = broker
            .as_ref()
            .map(|b| Preflight::new(b.url.clone(), b.tls_ca.clone()));
        let report = remint_daemon_creds_for(
            self.root(),
            &self.space,
            Some(&store),
            preflight.as_ref(),
            self.lifetime_now(),
        )
        .await;
        let reload = match &broker {
            None => Reload::NotAsked("offline: the daemon adopts them at its own 75 % re-read"),
            Some(_)
                if !report
                    .files
                    .iter()
                    .any(|(_, o)| matches!(o, RemintOutcome::Written { .. })) =>
            {
                Reload::NotAsked("nothing was renewed")
            }
            Some(b) => self.reload(&store, b, &report).await,
        };
        Pass {
            broker,
            report,
            reload,
            unresolved: None,
        }
    }

    /// `reloadCreds` naming the fingerprints just written, as the supervisor
    /// `local.cotal_<who>` minted from the store's own signer.
    async fn reload(&self, store: &FsStore, broker: &OwnerBroker, report: &RemintReport) -> Reload {
        let mut expected = serde_json::Map::new();
        for (key, outcome) in &report.files {
            if !matches!(outcome, RemintOutcome::Written { .. }) {
                continue;
            }
            let component = if key.ends_with(crate::base::DELIVERY_CREDS_FILE) {
                "delivery"
            } else {
                "membership"
            };
            if let Some(c) = store
                .get(key)
                .ok()
                .flatten()
                .and_then(|raw| Credential::parse(&raw).ok())
            {
                expected.insert(component.into(), c.fingerprint().into());
            }
        }
        let args = serde_json::json!({ "expected": expected });
        match self.admin_request(store, broker, "reloadCreds", args).await {
            Ok(reply) if reply["ok"] == true => Reload::Adopted,
            Ok(reply) => Reload::Refused(
                reply["error"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| reply.to_string()),
            ),
            Err(e) => Reload::Unanswered(e.to_string()),
        }
    }

    /// One request on `ctl.delivery-admin`.
    async fn admin_request(
        &self,
        store: &FsStore,
        broker: &OwnerBroker,
        op: &str,
        args: serde_json::Value,
    ) -> Result<serde_json::Value, AdminRequestError> {
        use AdminRequestErrorKind as K;
        let principal = Principal::parse(&format!("local.cotal_{}", self.who))
            .map_err(|e| AdminRequestError::new(K::Supervisor, e.to_string()).source(e))?;
        let signer = SpaceSigner::read(store, &self.space)
            .map_err(|e| AdminRequestError::new(K::Supervisor, e.to_string()).source(e))?
            .ok_or_else(|| {
                let text = "the store holds no signer to mint the supervisor with";
                AdminRequestError::new(K::Supervisor, text)
            })?;
        let cred = signer
            .mint(
                &self.space,
                &Profile::Supervisor {
                    principal: principal.clone(),
                },
                SUPERVISOR_LIFETIME,
            )
            .map_err(|e| AdminRequestError::new(K::Supervisor, e.to_string()).source(e))?;
        let broker_error =
            |e: &dyn std::fmt::Display| AdminRequestError::new(K::Broker, e.to_string());
        let client = crate::base::connect_with_credential(
            &broker.url,
            broker.tls_ca.as_deref(),
            &cred,
            &format!("cotal-{}-renewal", self.who),
            BROKER_BOUND,
        )
        .await
        .map_err(|e| broker_error(&e).source(e))?;
        let subject =
            SpaceNames::new(&self.space).ctl_subject(CtlService::DeliveryAdmin, &principal);
        let reply = format!("{subject}.reply.{}", crate::base::epoch_ms());
        let mut sub = client
            .subscribe(reply.clone())
            .await
            .map_err(|e| broker_error(&e).source(e))?;
        let body = serde_json::json!({
            "op": op,
            "args": args,
            "from": {"id": principal.dot_form()},
        });
        client
            .publish_with_reply(subject, reply, body.to_string().into())
            .await
            .map_err(|e| broker_error(&e).source(e))?;
        let answer = tokio::time::timeout(RELOAD_BOUND, sub.next()).await;
        let _ = tokio::time::timeout(BROKER_BOUND, client.drain()).await;
        match answer {
            // The broker's no-responders status: nobody serves the rail.
            Ok(Some(msg)) if msg.status.is_some() => Err(AdminRequestError::new(
                K::NoDaemon,
                "no delivery daemon answers on ctl.delivery-admin",
            )),
            Ok(Some(msg)) => serde_json::from_slice(&msg.payload)
                .map_err(|e| AdminRequestError::new(K::Reply, e.to_string()).source(e)),
            _ => Err(AdminRequestError::new(
                K::TimedOut,
                format!(
                    "{op}: no answer on ctl.delivery-admin within {} s",
                    RELOAD_BOUND.as_secs()
                ),
            )),
        }
    }

    /// Writes a pass's outcome as one line and returns when to retry (`None`: renewed).
    fn report(&self, pass: &Pass, journal: &Journal) -> Option<Duration> {
        let (who, space) = (self.who, &self.space);
        let exp = pass
            .exp()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "none".into());
        for note in &pass.report.notes {
            journal.line(format!("• {who}: {note}"));
        }
        if pass.renewed() {
            match &pass.reload {
                Reload::Adopted => journal.line(format!(
                    "✓ {who}: standing credentials of space {space} re-signed and adopted (exp {exp})"
                )),
                Reload::Refused(why) | Reload::Unanswered(why) => journal.line(format!(
                    "! {who}: standing credentials of space {space} re-signed (exp {exp}), not adopted yet ({why}); the daemon adopts them at its own 75 % re-read"
                )),
                Reload::NotAsked(why) => journal.line(format!(
                    "✓ {who}: standing credentials of space {space} re-signed (exp {exp}); {why}"
                )),
            }
            return None;
        }
        let retry = (self.left() / 4).clamp(RETRY_FLOOR, RETRY_CEILING);
        let failures = pass.failures().join("; ");
        journal.repeated(
            &format!("renewal-failed:{space}:{failures}"),
            format!(
                "! {who}: credential renewal of space {space} failed: {failures}; the last good credentials are kept (retrying in {} s)",
                retry.as_secs()
            ),
        );
        Some(retry)
    }

    /// The owner's loop: re-sign at half of the credentials' lifetime (at once on
    /// [`OwnerEvent::RenewNow`]), retry a failed pass after a quarter of what is left (1 to 60 s),
    /// until told to stop; returns the stop's name.
    pub async fn watch(
        &self,
        journal: &Journal,
        events: &mut mpsc::Receiver<OwnerEvent>,
    ) -> &'static str {
        let mut retry: Option<Duration> = None;
        loop {
            let wait = match (retry, self.due_in()) {
                (Some(r), _) => r,
                (None, Some(due)) => due,
                (None, None) => {
                    journal.repeated(
                        &format!("renewal-absent:{}", self.space),
                        format!(
                            "• {}: no standing credential of space {} to renew at {}; looking again in {} s",
                            self.who,
                            self.space,
                            self.store().locate(&delivery_creds_key(&self.space)),
                            ABSENT_RECHECK.as_secs()
                        ),
                    );
                    ABSENT_RECHECK
                }
            };
            tokio::select! {
                event = events.recv() => match event {
                    Some(OwnerEvent::Stop(by)) => return by,
                    None => return "the end of its host",
                    Some(OwnerEvent::RenewNow) => journal.line(format!(
                        "• {}: received SIGHUP, re-signing now",
                        self.who
                    )),
                },
                _ = tokio::time::sleep(wait) => {}
            }
            if self.current().is_empty() {
                retry = None;
                continue;
            }
            let pass = self.pass().await;
            retry = self.report(&pass, journal);
        }
    }

    /// Runs the loop as a task of a foreground `up`, recorded in `.cotal/remint.<key>.pid`
    /// under `up`'s own pid (so `status` sees the owner and a bare `up` starts no other).
    pub fn spawn(self) -> RenewalTask {
        let (events, mut rx) = mpsc::channel(1);
        if let RemintTarget::Workspace(root) = &self.target {
            let recorded = base::pid_liveness_of(
                &base::remint_pid_path(root, &self.space),
                base::argv_names_remint_watch,
            );
            if let Some(pid) = recorded.daemon_pid() {
                Journal::stderr_only().line(format!(
                    "• {}: a renewal owner already runs for space {} (pid {pid}); the renewal is left to it",
                    self.who, self.space
                ));
                return RenewalTask {
                    handle: tokio::spawn(async {}),
                    record: None,
                    _events: events,
                };
            }
        }
        let record = match &self.target {
            RemintTarget::Workspace(root) => {
                PidRecord::write(base::remint_pid_path(root, &self.space), std::process::id()).ok()
            }
            RemintTarget::Dir(_) => None,
        };
        let handle = tokio::spawn(async move {
            let journal = Journal::stderr_only();
            self.watch(&journal, &mut rx).await;
        });
        RenewalTask {
            handle,
            record,
            _events: events,
        }
    }
}

/// A foreground `up`'s renewal owner: aborted, and its record removed, at [`RenewalTask::abort`]
/// or when dropped.
pub struct RenewalTask {
    handle: JoinHandle<()>,
    record: Option<PidRecord>,
    _events: mpsc::Sender<OwnerEvent>,
}

impl RenewalTask {
    pub fn abort(&self) {
        self.handle.abort();
        if let Some(r) = &self.record {
            r.remove();
        }
    }
}

impl Drop for RenewalTask {
    fn drop(&mut self) {
        self.abort();
    }
}
