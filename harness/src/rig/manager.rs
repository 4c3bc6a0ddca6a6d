//! The `Manager` actor: the admin rail as a manager speaks it (docs/admin.md).
//!
//! A manager needs the daemon while it starts: it waits up to 60 s for `ctl.delivery-admin` to
//! answer, retrying only a request that timed out or found no responder, the first retry at
//! once and later ones at most one second apart, shortened as the wait runs out, and it sends
//! nothing once the wait is over. A refusal or an unreadable reply fails at once. A verified
//! eviction uses the same cadence within a 15 s total wait. A restart evicts the holders of its
//! credential family in requests of 256, recording each verified request in a ledger, so a
//! restart cut short resumes after the last recorded request. Every wait is overridable
//! ([`ManagerWaits`]) so tests can shrink it; the defaults are docs/admin.md's.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cotal_delivery::base::Credential;
use cotal_delivery::provision::{MintOptions, Profile};
use cotal_delivery::wire::ControlReply;
use cotal_delivery::wire::{CtlService, Principal, Space, SpaceNames};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::rig::error::HarnessError;
use crate::rig::mesh::Mesh;

/// The documented waits (docs/admin.md).
#[derive(Debug, Clone)]
pub struct ManagerWaits {
    /// How long start-up waits for the rail (60 s).
    pub startup: Duration,
    /// Bound on one start-up probe request.
    pub startup_attempt: Duration,
    /// Total wait for one verified-eviction request (15 s).
    pub evict: Duration,
    /// Longest gap between two retries (1 s).
    pub retry_gap: Duration,
}

impl Default for ManagerWaits {
    fn default() -> Self {
        ManagerWaits {
            startup: Duration::from_secs(60),
            startup_attempt: Duration::from_secs(1),
            evict: Duration::from_secs(15),
            retry_gap: Duration::from_secs(1),
        }
    }
}

/// Most principals one `evictPrincipals` request names.
pub const EVICT_BATCH: usize = 256;

/// How one request ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AdminAnswer {
    /// `{ok:true}`: the data.
    Answered(Value),
    /// `{ok:false}`: the refusal text.
    Refused(String),
    /// A reply that is not a `ControlReply`.
    Unreadable(String),
    /// The broker answered "no responders".
    NoResponders,
    /// Nothing within the attempt's bound.
    TimedOut,
}

impl AdminAnswer {
    /// Only silence is retried.
    fn retryable(&self) -> bool {
        matches!(self, AdminAnswer::NoResponders | AdminAnswer::TimedOut)
    }
}

/// Why a manager operation failed.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagerError {
    pub line: String,
}

impl std::fmt::Display for ManagerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.line)
    }
}

/// The restart ledger: how many `evictPrincipals` requests of the family were verified.
#[derive(Debug, Clone)]
pub struct Ledger {
    path: PathBuf,
}

impl Ledger {
    pub fn at(path: impl Into<PathBuf>) -> Ledger {
        Ledger { path: path.into() }
    }
    /// Requests already verified (0 when nothing is recorded).
    pub fn verified_batches(&self) -> usize {
        std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|s| serde_json::from_str::<Value>(&s).ok())
            .and_then(|v| v["verifiedBatches"].as_u64())
            .unwrap_or(0) as usize
    }
    fn record(&self, batches: usize) -> Result<(), HarnessError> {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, json!({"verifiedBatches": batches}).to_string())
            .and_then(|_| std::fs::rename(&tmp, &self.path))
            .map_err(|e| HarnessError::io("record the eviction ledger", e))
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A manager on the admin rail of one space.
pub struct Manager {
    client: async_nats::Client,
    principal: Principal,
    names: SpaceNames,
    pub waits: ManagerWaits,
    lines: Arc<Mutex<Vec<String>>>,
    /// When each request was sent (the test side checks the cadence).
    sent: Arc<Mutex<Vec<Instant>>>,
}

impl Manager {
    /// Connects a `supervisor` credential speaking as `principal` in `space`.
    pub async fn connect(
        mesh: &Mesh,
        space: &Space,
        principal: &Principal,
    ) -> Result<Manager, HarnessError> {
        let cred: Credential = mesh.mint(
            space,
            &Profile::Supervisor {
                principal: principal.clone(),
            },
            MintOptions::new(),
        )?;
        let client = mesh.connect(&cred, "harness-manager").await?;
        Ok(Manager::over(client, space, principal))
    }

    /// A manager speaking as `principal` over a connection the caller made (a `supervisor`
    /// credential of `space`), e.g. to one node of a cluster.
    pub fn over(client: async_nats::Client, space: &Space, principal: &Principal) -> Manager {
        Manager {
            client,
            principal: principal.clone(),
            names: SpaceNames::new(space),
            waits: ManagerWaits::default(),
            lines: Arc::default(),
            sent: Arc::default(),
        }
    }

    pub fn with_waits(mut self, waits: ManagerWaits) -> Self {
        self.waits = waits;
        self
    }

    /// The manager's log lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    /// When each request was sent.
    pub fn sent(&self) -> Vec<Instant> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn log(&self, line: String) {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line);
    }

    /// The admin rail's request subject for this manager.
    pub fn subject(&self) -> String {
        self.names
            .ctl_subject(CtlService::DeliveryAdmin, &self.principal)
    }

    /// One request, answered within `bound`.
    pub async fn request_once(&self, op: &str, args: &Value, bound: Duration) -> AdminAnswer {
        self.request_before(op, args, bound, None).await
    }

    /// [`Manager::request_once`], never sent at or after `deadline` (the subscribe before the
    /// send can take long enough under load to cross it).
    async fn request_before(
        &self,
        op: &str,
        args: &Value,
        bound: Duration,
        deadline: Option<Instant>,
    ) -> AdminAnswer {
        let subject = self.subject();
        let reply = format!("{subject}.reply.{}", uuid::Uuid::new_v4().simple());
        let Ok(mut sub) = self.client.subscribe(reply.clone()).await else {
            return AdminAnswer::TimedOut;
        };
        let body = json!({
            "op": op,
            "args": args,
            "from": {"id": self.principal.dot_form(), "name": "manager", "kind": "endpoint"},
        });
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            let _ = sub.unsubscribe().await;
            return AdminAnswer::TimedOut;
        }
        self.sent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(now);
        if self
            .client
            .publish_with_reply(subject, reply, body.to_string().into())
            .await
            .is_err()
        {
            return AdminAnswer::TimedOut;
        }
        let outcome = match tokio::time::timeout(bound, sub.next()).await {
            Err(_) | Ok(None) => AdminAnswer::TimedOut,
            Ok(Some(m)) if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) => {
                AdminAnswer::NoResponders
            }
            Ok(Some(m)) => match serde_json::from_slice::<ControlReply>(&m.payload) {
                Ok(r) if r.ok => AdminAnswer::Answered(r.data.unwrap_or(Value::Null)),
                Ok(r) => AdminAnswer::Refused(r.error.unwrap_or_default()),
                Err(e) => AdminAnswer::Unreadable(e.to_string()),
            },
        };
        let _ = sub.unsubscribe().await;
        outcome
    }

    /// Sends `op` until it is answered, refused or unreadable, retrying silence within `wait`:
    /// the first retry at once, later ones at most `retry_gap` apart and never past the end of
    /// the wait. `attempt` bounds each request (`None`: whatever is left of the wait). Returns
    /// the final outcome and the number of requests sent.
    pub async fn with_retries(
        &self,
        op: &str,
        args: &Value,
        wait: Duration,
        attempt: Option<Duration>,
    ) -> (AdminAnswer, usize) {
        let deadline = Instant::now() + wait;
        let mut sent = 0usize;
        let mut last = AdminAnswer::TimedOut;
        while Instant::now() < deadline {
            if sent >= 2 {
                // Later retries: at most `retry_gap` apart, shortened as the wait runs out.
                let left = deadline.saturating_duration_since(Instant::now());
                let gap = self.waits.retry_gap.min(left / 4);
                tokio::time::sleep(gap).await;
                if Instant::now() >= deadline {
                    break;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let bound = attempt.map_or(left, |a| a.min(left));
            sent += 1;
            // The wait ends on time even while this request is still in flight.
            last = match tokio::time::timeout_at(
                deadline,
                self.request_before(op, args, bound, Some(deadline)),
            )
            .await
            {
                Ok(o) => o,
                Err(_) => AdminAnswer::TimedOut,
            };
            if !last.retryable() {
                return (last, sent);
            }
        }
        (last, sent)
    }

    /// Start-up: waits for the rail (`reloadStoreIdentity` as the probe).
    pub async fn start(&self) -> Result<Value, ManagerError> {
        let rail = CtlService::DeliveryAdmin.as_str();
        let (outcome, sent) = self
            .with_retries(
                "reloadStoreIdentity",
                &json!({}),
                self.waits.startup,
                Some(self.waits.startup_attempt),
            )
            .await;
        self.finish(
            outcome,
            format!(
                "✗ manager: the delivery daemon did not answer on ctl.{rail} within {} ms ({sent} requests); not starting",
                self.waits.startup.as_millis()
            ),
            |e| format!("✗ manager: the delivery daemon refused on ctl.{rail} at start-up: {e}"),
            |e| format!("✗ manager: the delivery daemon's reply on ctl.{rail} at start-up is unreadable: {e}"),
            format!("✓ manager: ctl.{rail} answered"),
        )
    }

    fn finish(
        &self,
        outcome: AdminAnswer,
        silent: String,
        refused: impl Fn(&str) -> String,
        unreadable: impl Fn(&str) -> String,
        ok: String,
    ) -> Result<Value, ManagerError> {
        let line = match outcome {
            AdminAnswer::Answered(v) => {
                self.log(ok);
                return Ok(v);
            }
            AdminAnswer::Refused(e) => refused(&e),
            AdminAnswer::Unreadable(e) => unreadable(&e),
            AdminAnswer::NoResponders | AdminAnswer::TimedOut => silent,
        };
        self.log(line.clone());
        Err(ManagerError { line })
    }

    /// One verified-eviction request (`evictPrincipals`), within the 15 s wait; the results are
    /// checked closed: same length and order, real counts, and `verifiedGone` only with a
    /// complete scan and nothing remaining.
    pub async fn evict_batch(&self, principals: &[Principal]) -> Result<Vec<Value>, ManagerError> {
        let list: Vec<String> = principals.iter().map(Principal::dot_form).collect();
        let (outcome, _) = self
            .with_retries(
                "evictPrincipals",
                &json!({"principals": list}),
                self.waits.evict,
                None,
            )
            .await;
        let data = self.finish(
            outcome,
            format!(
                "✗ manager: no verified-eviction answer on ctl.delivery-admin within {} ms; the lifecycle stays held",
                self.waits.evict.as_millis()
            ),
            |e| format!("✗ manager: evictPrincipals refused: {e}"),
            |e| format!("✗ manager: evictPrincipals reply unreadable: {e}"),
            format!("• manager: evictPrincipals answered for {} holders", list.len()),
        )?;
        let unusable = |why: String| {
            let line = format!("✗ manager: evictPrincipals reply unusable: {why}");
            self.log(line.clone());
            ManagerError { line }
        };
        let results = data
            .as_array()
            .ok_or_else(|| unusable("not an array".into()))?;
        if results.len() != list.len() {
            return Err(unusable(format!(
                "{} results for {} principals",
                results.len(),
                list.len()
            )));
        }
        for (want, r) in list.iter().zip(results) {
            if r["principal"].as_str() != Some(want.as_str()) {
                return Err(unusable(format!(
                    "result for {} out of order",
                    r["principal"]
                )));
            }
            let gone = r["verifiedGone"].as_bool();
            let complete = r["scanComplete"].as_bool();
            let remaining = r["remaining"].as_u64();
            if gone.is_none()
                || complete.is_none()
                || remaining.is_none()
                || r["kicked"].as_u64().is_none()
            {
                return Err(unusable(format!("result for {want} is malformed")));
            }
            if gone == Some(true) && (complete != Some(true) || remaining != Some(0)) {
                return Err(unusable(format!(
                    "result for {want} claims verifiedGone without a complete scan"
                )));
            }
            if gone != Some(true) {
                let line = format!(
                    "✗ manager: eviction of {want} not verified: {}",
                    r["note"].as_str().unwrap_or("no note")
                );
                self.log(line.clone());
                return Err(ManagerError { line });
            }
        }
        Ok(results.clone())
    }

    /// A restart's family eviction: `holders` in requests of 256, each recorded in `ledger`
    /// once verified; requests the ledger already records are skipped. Returns how many
    /// requests this call sent.
    pub async fn evict_family(
        &self,
        holders: &[Principal],
        ledger: &Ledger,
    ) -> Result<usize, ManagerError> {
        let done = ledger.verified_batches();
        let mut sent = 0;
        for (i, batch) in holders.chunks(EVICT_BATCH).enumerate().skip(done) {
            self.evict_batch(batch).await?;
            sent += 1;
            ledger.record(i + 1).map_err(|e| ManagerError {
                line: format!("✗ manager: {e}"),
            })?;
        }
        Ok(sent)
    }

    /// `lifecycleMemberships` (one attempt within `bound`).
    pub async fn inventory(
        &self,
        principal: &Principal,
        uid: &cotal_delivery::wire::LifecycleUid,
        bound: Duration,
    ) -> AdminAnswer {
        self.request_once(
            "lifecycleMemberships",
            &json!({"principal": principal.dot_form(), "lifecycleUid": uid.as_str()}),
            bound,
        )
        .await
    }
}
