//! `cotal-delivery status`: what a space's delivery looks like from outside, checked rather
//! than assumed: the broker (reachable, URL), the lease row (holder, incarnation, ready, age),
//! the pid record's verdict, the credential's expiry and whether `ctl.delivery` answers. Healthy
//! only when all of them say so; the exit code tells scripts which.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use serde_json::{json, Value};

use crate::base::{
    self, epoch_ms, read_creds_file, utc_timestamp, FsStore, MeshRecord, PidLiveness, Rows,
    SysAuthority,
};
use crate::provision::{MeshAuthority, MintOptions, Profile, Workspace};
use crate::space::HolderState;
use crate::wire::{CtlService, Principal, Space, SpaceNames};

/// Bound on each broker check (connect, row read, rail request).
const CHECK_BOUND: Duration = Duration::from_secs(2);

/// The lease row as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub holder: String,
    pub incarnation: String,
    pub ready: bool,
    pub age_ms: u64,
    /// Seconds until the bucket's TTL expires the row unless its holder renews it.
    pub expires_in_secs: Option<u64>,
    /// What the broker shows of the holder (`None`: not checked).
    pub holder_state: Option<HolderState>,
}

impl LeaseView {
    /// The holder was proved not running: its row only waits for the TTL.
    fn holder_gone(&self) -> bool {
        matches!(self.holder_state, Some(HolderState::NotRunning { .. }))
    }
}

/// Everything `status` found.
#[derive(Debug, Clone)]
pub struct StatusReport {
    pub space: Space,
    pub root: PathBuf,
    pub server: String,
    /// `Err` says why the broker could not be checked or reached (a `String`: the text is the
    /// value, the report's `broker.error` and its line; callers only ask `is_err`).
    pub broker: Result<(), String>,
    pub lease: Option<LeaseView>,
    pub pid: PidLiveness,
    /// Expiry (unix seconds) of the delivery credential; `Err` when it cannot be read (a
    /// `String`: the text is the value, the report's `credential.error` and its line).
    pub credential_exp: Result<Option<i64>, String>,
    pub ctl_answers: bool,
    /// The renewal owner's record (`.cotal/remint.<key>.pid`): a `remint --watch`, or a
    /// foreground `up` running the owner itself. Shown, not part of `healthy`.
    pub renewal: PidLiveness,
    /// The live owner is a foreground `up` (not a `remint --watch`).
    pub renewal_by_up: bool,
}

impl StatusReport {
    /// Healthy: broker reachable, lease ready, record alive, credential valid, rail answering.
    pub fn healthy(&self) -> bool {
        let now = (epoch_ms() / 1000) as i64;
        self.broker.is_ok()
            && self
                .lease
                .as_ref()
                .is_some_and(|l| l.ready && !l.holder_gone())
            && self.pid.daemon_pid().is_some()
            && matches!(self.credential_exp, Ok(exp) if exp.is_none_or(|e| e > now))
            && self.ctl_answers
    }

    pub fn to_json(&self) -> Value {
        json!({
            "space": self.space.as_str(),
            "root": self.root,
            "healthy": self.healthy(),
            "broker": {
                "url": self.server,
                "reachable": self.broker.is_ok(),
                "error": self.broker.as_ref().err(),
            },
            "lease": self.lease.as_ref().map(|l| json!({
                "holder": l.holder,
                "incarnation": l.incarnation,
                "ready": l.ready,
                "ageMs": l.age_ms,
                "expiresInS": l.expires_in_secs,
                "holderRunning": match &l.holder_state {
                    Some(HolderState::Connected) => json!(true),
                    Some(HolderState::NotRunning { .. }) => json!(false),
                    _ => Value::Null,
                },
            })),
            "pidRecord": {
                "verdict": self.pid.verdict(),
                "pid": self.pid.recorded_pid(),
            },
            "credential": match &self.credential_exp {
                Ok(exp) => json!({"expires": exp}),
                Err(e) => json!({"error": e}),
            },
            "ctlDelivery": {"answers": self.ctl_answers},
            "renewalOwner": {
                "verdict": self.renewal.verdict(),
                "pid": self.renewal.recorded_pid(),
                "foregroundUp": self.renewal_by_up,
            },
        })
    }

    /// The human lines.
    pub fn lines(&self) -> Vec<String> {
        let [broker, lease, cred, ctl] = self.check_lines();
        vec![
            format!("space {} at {}", self.space, self.root.display()),
            broker,
            lease,
            self.pid_line(),
            cred,
            self.renewal_line(),
            ctl,
            format!(
                "status: {}",
                if self.healthy() {
                    "healthy"
                } else {
                    "not healthy"
                }
            ),
        ]
    }

    /// The human lines of what was checked beside the pid record: broker, lease row, delivery
    /// credential, `ctl.delivery` (also a multi-space host's block per space).
    pub fn check_lines(&self) -> [String; 4] {
        let broker = match &self.broker {
            Ok(()) => format!("broker:       reachable at {}", self.server),
            Err(e) => format!("broker:       not reachable at {} ({e})", self.server),
        };
        let lease = match &self.lease {
            Some(l) => {
                let expires = l
                    .expires_in_secs
                    .map(|s| format!("; the row expires in {s} s"))
                    .unwrap_or_default();
                let judged = match &l.holder_state {
                    Some(HolderState::NotRunning { .. }) => format!(
                        " - its holder is not running ({}){expires}",
                        crate::space::NOT_RUNNING_PROOF
                    ),
                    Some(HolderState::Unproved { why }) => {
                        format!(" - whether its holder runs could not be proved ({why}){expires}")
                    }
                    Some(HolderState::Connected) | None => String::new(),
                };
                format!(
                    "lease:        held by {}, incarnation {}, {}, age {} s{judged}",
                    l.holder,
                    if l.incarnation.is_empty() {
                        "-"
                    } else {
                        &l.incarnation
                    },
                    if l.ready { "ready" } else { "not ready" },
                    l.age_ms / 1000
                )
            }
            // No row read is not "no row" when the broker was never reached.
            None if self.broker.is_err() => {
                "lease:        not checked (the broker was not reached)".to_string()
            }
            None => "lease:        no row".to_string(),
        };
        let cred = match &self.credential_exp {
            Ok(Some(exp)) => {
                let t = UNIX_EPOCH + Duration::from_secs((*exp).max(0) as u64);
                let left = t
                    .duration_since(SystemTime::now())
                    .map(|d| format!("in {} s", d.as_secs()))
                    .unwrap_or_else(|_| "expired".into());
                format!(
                    "credential:   delivery expires {} ({left})",
                    utc_timestamp(t)
                )
            }
            Ok(None) => "credential:   delivery never expires".to_string(),
            Err(e) => format!("credential:   {e}"),
        };
        let ctl = format!(
            "ctl.delivery: {}",
            if self.ctl_answers {
                "answers"
            } else {
                "no answer"
            }
        );
        [broker, lease, cred, ctl]
    }

    /// The renewal owner's line: who re-signs the standing credentials, or that nobody does.
    fn renewal_line(&self) -> String {
        let nobody = format!(
            "nothing re-signs the credentials before they expire; run cotal-delivery remint --space {space} --root {root}, or a bare cotal-delivery up --space {space} --root {root} to relaunch a detached mesh's owner",
            space = self.space,
            root = self.root.display()
        );
        match &self.renewal {
            PidLiveness::Alive(p) | PidLiveness::Unverified(p) if self.renewal_by_up => {
                format!("renewal:      owner running in the foreground up (pid {p})")
            }
            PidLiveness::Alive(p) => format!("renewal:      owner running (pid {p})"),
            PidLiveness::Unverified(p) => format!(
                "renewal:      owner alive-unverified (pid {p}); its command line could not be read, trusted"
            ),
            PidLiveness::Stale(p) => {
                format!("renewal:      no owner (stale record, pid {p} is not running) - {nobody}")
            }
            PidLiveness::Foreign(p) => format!(
                "renewal:      no owner (stale record, pid {p} is now another program) - {nobody}"
            ),
            PidLiveness::Absent | PidLiveness::Unreadable => {
                format!("renewal:      no owner - {nobody}")
            }
        }
    }

    /// The pid record's line.
    fn pid_line(&self) -> String {
        // Each verdict also says, in words scripts have matched since the first `status`,
        // whether a delivery daemon is running.
        match &self.pid {
            PidLiveness::Alive(p) => format!("pid record:   alive (pid {p}) - delivery daemon running"),
            PidLiveness::Unverified(p) => format!(
                "pid record:   alive-unverified (pid {p}) - running; its command line could not be read, trusted"
            ),
            PidLiveness::Stale(p) => {
                format!("pid record:   stale (pid {p}) - stale record, pid {p} is not running")
            }
            PidLiveness::Foreign(p) => format!(
                "pid record:   foreign (pid {p}) - stale record, pid {p} is now another program"
            ),
            PidLiveness::Absent => "pid record:   absent - not running".to_string(),
            PidLiveness::Unreadable => "pid record:   unreadable - not running".to_string(),
        }
    }
}

/// The broker of `root`'s mesh: `.cotal/mesh.json`, else the registry record, else the default.
fn mesh_of(root: &Path, space: &Space) -> (String, Option<PathBuf>) {
    let record = MeshRecord::read(&base::mesh_state_path(root))
        .ok()
        .flatten()
        .or_else(|| {
            let home = base::cotal_home()?;
            MeshRecord::read(&base::registry_path(&home, space))
                .ok()
                .flatten()
        });
    match record {
        Some(r) => (r.server, r.tls_ca),
        None => (crate::base::DEFAULT_SERVER.to_string(), None),
    }
}

/// Checks the space's delivery at `root`.
pub async fn status(root: &Path, space: &Space) -> StatusReport {
    let workspace = Workspace::new(root);
    let (server, tls_ca) = mesh_of(root, space);
    let pid = base::pid_liveness(&workspace.pid_path(space));
    let renewal = base::pid_liveness_of(
        &base::remint_pid_path(root, space),
        base::argv_names_renewal_owner,
    );
    let renewal_by_up = renewal
        .daemon_pid()
        .and_then(base::process_argv)
        .is_some_and(|argv| !base::argv_names_remint_watch(&argv));
    let credential_exp = read_creds_file(&workspace.delivery_creds_path(space))
        .map_err(|_| {
            format!(
                "no delivery credential at {}",
                workspace.delivery_creds_path(space).display()
            )
        })
        .and_then(|c| c.claims().map(|c| c.exp).map_err(|e| e.to_string()));
    let mut report = StatusReport {
        space: space.clone(),
        root: root.to_path_buf(),
        server: server.clone(),
        broker: Ok(()),
        lease: None,
        pid,
        credential_exp,
        ctl_answers: false,
        renewal,
        renewal_by_up,
    };
    let client = match connect(&workspace, space, &server, tls_ca.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            report.broker = Err(e);
            return report;
        }
    };
    let js = async_nats::jetstream::new(client.clone());
    let names = SpaceNames::new(space);
    if let Ok(rows) = Rows::open(&js, &names.delivery_bucket(), CHECK_BOUND).await {
        let ttl = crate::space::lease_ttl(&js, &names).await;
        if let Some(row) = crate::space::held_row(&rows, ttl).await {
            let holder_state = match sys_authority(root, space, &server, tls_ca.as_deref()) {
                Some(authority) => {
                    crate::space::holder_state(&authority, &row.info.holder, None).await
                }
                None => HolderState::Unproved {
                    why: "no $SYS observer credential of the space's account in this root".into(),
                },
            };
            report.lease = Some(LeaseView {
                expires_in_secs: Some(row.expires_in_secs()),
                age_ms: epoch_ms().saturating_sub(row.info.since),
                holder: row.info.holder,
                incarnation: row.info.incarnation,
                ready: row.info.ready,
                holder_state: Some(holder_state),
            });
        }
    }
    report.ctl_answers = ctl_delivery_answers(&client, space).await;
    let _ = client.drain().await;
    report
}

/// The `$SYS` observer of the root's space, to judge a lease row's holder by CONNZ: its
/// account is the one the observer's scan grant names.
fn sys_authority(
    root: &Path,
    space: &Space,
    server: &str,
    tls_ca: Option<&Path>,
) -> Option<SysAuthority> {
    let store = std::sync::Arc::new(FsStore::new(root.to_path_buf()));
    let observer = crate::base::SysPair::read(&*store, space)
        .observer
        .value
        .ok()??;
    let claims = observer.claims().ok()?;
    let [account] = crate::base::connz_accounts(&claims.nats).try_into().ok()?;
    Some(SysAuthority {
        store,
        space: space.clone(),
        account,
        server_url: server.to_string(),
        tls_ca: tls_ca.map(Path::to_path_buf),
        limits: crate::base::SweepLimits::default(),
    })
}

/// An operator connection minted from the root's signer (status reads, it never writes). The
/// `Err` is a `String` because the text is the value: it is the report's `broker` text.
async fn connect(
    workspace: &Workspace,
    space: &Space,
    server: &str,
    tls_ca: Option<&Path>,
) -> Result<async_nats::Client, String> {
    let authority = MeshAuthority::load(&workspace.auth_dir())
        .map_err(|e| format!("no signer to check it with: {e}"))?;
    let cred = authority
        .mint(
            space,
            &Profile::Operator,
            MintOptions::new().expires_in(Duration::from_secs(60)),
        )
        .map_err(|e| e.to_string())?;
    crate::base::connect_with_credential(server, tls_ca, &cred, "cotal-status", CHECK_BOUND)
        .await
        .map_err(|e| e.to_string())
}

/// Whether the `ctl.delivery` responder answers. The probe is a verb the rail does not serve, so
/// the answer (a refusal naming the verb) is immediate and changes nothing.
async fn ctl_delivery_answers(client: &async_nats::Client, space: &Space) -> bool {
    let Ok(caller) = Principal::parse("local.cotal_status") else {
        return false;
    };
    let subject = SpaceNames::new(space).ctl_subject(CtlService::Delivery, &caller);
    let reply = format!("{subject}.reply.{}", epoch_ms());
    let Ok(mut sub) = client.subscribe(reply.clone()).await else {
        return false;
    };
    let body = json!({"op": "statusProbe", "args": {}, "from": {"id": caller.dot_form()}});
    if client
        .publish_with_reply(subject, reply, body.to_string().into())
        .await
        .is_err()
    {
        return false;
    }
    // The broker's own no-responders status is not an answer: only the rail's JSON reply is.
    match tokio::time::timeout(CHECK_BOUND, sub.next()).await {
        Ok(Some(msg)) => {
            msg.status.is_none()
                && serde_json::from_slice::<Value>(&msg.payload)
                    .is_ok_and(|v| v.get("ok").is_some())
        }
        _ => false,
    }
}
