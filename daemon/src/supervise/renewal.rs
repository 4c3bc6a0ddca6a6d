//! `up` as the renewal owner of the standing credentials it minted (`delivery`,
//! `membership-rw`): before they expire it re-signs them (with a preflight against the broker,
//! so a candidate the broker refuses never replaces the last good one) and asks the daemon to
//! adopt them with `reloadCreds` over `ctl.delivery-admin`. Without an owner a mesh under `up`
//! would stop at the credential lifetime.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use tokio::task::JoinHandle;

use crate::creds::read_creds_file;
use crate::journal::Journal;
use crate::provision::{self, MeshAuthority, MintOptions, Profile, Workspace};
use crate::provision::{remint_daemon_creds_for, Preflight, RemintOutcome};
use crate::wire::{CtlService, Principal, Space, SpaceNames};

/// Share of the lifetime after which `up` re-signs: ahead of the daemon's own 75 % re-read.
const RENEW_AT_SHARE: f64 = 0.5;
/// Retry after a failed pass, never sooner (no spin) and never later than a quarter of what is
/// left of the lifetime.
const RETRY_FLOOR: Duration = Duration::from_secs(1);
/// Bound on the `reloadCreds` answer (the daemon answers after its own preflight).
const RELOAD_BOUND: Duration = Duration::from_secs(15);

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// When the delivery credential at `path` is due for re-signing (`None`: it never expires).
fn due_in(path: &Path) -> Option<Duration> {
    let claims = read_creds_file(path).ok()?.claims().ok()?;
    let exp = claims.exp?;
    let life = (exp - claims.iat).max(0) as f64;
    let at = claims.iat + (life * RENEW_AT_SHARE).floor() as i64;
    Some(Duration::from_secs((at - now_secs()).max(0) as u64))
}

/// The renewal owner of one space under a foreground `up`.
pub struct RenewalOwner {
    root: PathBuf,
    space: Space,
    url: String,
    tls_ca: Option<PathBuf>,
    lifetime: Duration,
}

impl RenewalOwner {
    pub fn new(
        root: &Path,
        space: &Space,
        url: &str,
        tls_ca: Option<PathBuf>,
        lifetime: Option<Duration>,
    ) -> RenewalOwner {
        RenewalOwner {
            root: root.to_path_buf(),
            space: space.clone(),
            url: url.to_string(),
            tls_ca,
            lifetime: lifetime.unwrap_or(provision::STANDING_TTL),
        }
    }

    /// Runs the owner as a task (aborted when `up` stops): sleep until due, re-sign, reload.
    pub fn spawn(self) -> JoinHandle<()> {
        tokio::spawn(async move {
            let journal = Journal::stderr_only();
            let creds = Workspace::new(&self.root).delivery_creds_path(&self.space);
            loop {
                let Some(wait) = due_in(&creds) else {
                    return;
                };
                tokio::time::sleep(wait).await;
                if let Err(e) = self.renew(&journal).await {
                    journal.line(format!("! up: credential renewal failed: {e}"));
                    let left = read_creds_file(&creds)
                        .ok()
                        .and_then(|c| c.claims().ok())
                        .and_then(|c| c.exp)
                        .map(|exp| (exp - now_secs()).max(0) as u64)
                        .unwrap_or(0);
                    tokio::time::sleep(RETRY_FLOOR.max(Duration::from_secs(left / 4))).await;
                }
            }
        })
    }

    /// One pass: re-sign both standing credentials with a preflight, then `reloadCreds`.
    async fn renew(&self, journal: &Journal) -> Result<(), String> {
        let preflight = Preflight::new(self.url.clone(), self.tls_ca.clone());
        let report = remint_daemon_creds_for(
            &self.root,
            &self.space,
            None,
            Some(&preflight),
            self.lifetime,
        )
        .await;
        if !report.all_written() {
            return Err(format!("re-signing refused: {:?}", report.files));
        }
        let mut expected = serde_json::Map::new();
        let mut exp = None;
        for (key, outcome) in &report.files {
            if let RemintOutcome::Written { exp: e, .. } = outcome {
                if key.ends_with("delivery.creds") {
                    exp = *e;
                    let fp = read_creds_file(
                        &Workspace::new(&self.root).delivery_creds_path(&self.space),
                    )
                    .map_err(|e| e.to_string())?
                    .fingerprint();
                    expected.insert("delivery".into(), fp.into());
                }
            }
        }
        let reply = self
            .admin_request("reloadCreds", serde_json::json!({ "expected": expected }))
            .await?;
        if reply["ok"] != true {
            return Err(format!("reloadCreds was refused: {}", reply["error"]));
        }
        journal.line(format!(
            "✓ up: standing credentials of space {} re-signed and adopted (exp {})",
            self.space,
            exp.map(|e| e.to_string()).unwrap_or_else(|| "none".into())
        ));
        Ok(())
    }

    /// One request on `ctl.delivery-admin` as the supervisor `local.cotal_up`.
    async fn admin_request(
        &self,
        op: &str,
        args: serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        let authority = MeshAuthority::load(&Workspace::new(&self.root).auth_dir())
            .map_err(|e| e.to_string())?;
        let principal = Principal::parse("local.cotal_up").map_err(|e| e.to_string())?;
        let cred = authority
            .mint(
                &self.space,
                &Profile::Supervisor {
                    principal: principal.clone(),
                },
                MintOptions::new().expires_in(Duration::from_secs(300)),
            )
            .map_err(|e| e.to_string())?;
        let client = crate::client::connect_with_credential(
            &self.url,
            self.tls_ca.as_deref(),
            &cred,
            "cotal-up-renewal",
            crate::tuning::BROKER_BOUND,
        )
        .await
        .map_err(|e| e.to_string())?;
        let subject =
            SpaceNames::new(&self.space).ctl_subject(CtlService::DeliveryAdmin, &principal);
        let reply = format!("{subject}.reply.{}", crate::journal::epoch_ms());
        let mut sub = client
            .subscribe(reply.clone())
            .await
            .map_err(|e| e.to_string())?;
        let body = serde_json::json!({
            "op": op,
            "args": args,
            "from": {"id": principal.dot_form()},
        });
        client
            .publish_with_reply(subject, reply, body.to_string().into())
            .await
            .map_err(|e| e.to_string())?;
        let answer = tokio::time::timeout(RELOAD_BOUND, sub.next()).await;
        let _ = client.drain().await;
        match answer {
            Ok(Some(msg)) => serde_json::from_slice(&msg.payload).map_err(|e| e.to_string()),
            _ => Err(format!(
                "{op}: no answer on ctl.delivery-admin within {} s",
                RELOAD_BOUND.as_secs()
            )),
        }
    }
}
