//! Readiness as the broker shows it, for any implementation: a daemon serves when the broker
//! holds its lease row ready under its holder (the holder its start credential names) and its
//! `ctl.delivery` responder answers a request. A contract case waits for this, never for a line
//! of this distribution's wording ("Delivery reports ready only after its lease and reader,
//! membership, and administration bindings are established. A lease alone proves no serving
//! responder.").

use std::time::Duration;

use cotal_delivery::wire::{CtlService, Principal};
use serde::Deserialize;
use serde_json::json;

use super::call::exchange;
use super::verb::{poll, Ctx, Kind, Profiled, Refs, DEFAULT_WITHIN};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;

pub const VERBS: &[&str] = &["expect_serving"];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ServingStep {
    ExpectServing { daemon: String },
}

/// The caller of the readiness request: a principal no case provisions, so the request (a
/// membership list) changes nothing the case judges; any answer, a refusal included, proves the
/// responder bound.
const PROBE: &str = "local.kitprobe";

/// Bound of one readiness request's answer (the poll asks again until the step's bound).
const PROBE_ANSWER: Duration = Duration::from_secs(2);

impl Profiled for ServingStep {}

impl ServingStep {
    pub fn default_within(&self) -> Option<Duration> {
        Some(DEFAULT_WITHIN)
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            ServingStep::ExpectServing { daemon } => Refs::default().uses(Kind::Daemon, daemon),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        let ServingStep::ExpectServing { daemon } = self;
        let path = w
            .daemon_creds
            .get(daemon)
            .ok_or_else(|| Failure::could_not(format!("no daemon {daemon:?} was started")))?;
        let holder = World::holder_of_creds(path)?;
        let probe = Principal::parse(PROBE).map_err(|e| Failure::could_not(e.to_string()))?;
        let subject = w.insp.names.ctl_subject(CtlService::Delivery, &probe);
        let body = json!({
            "op": "listMemberships",
            "args": {},
            "from": {"id": PROBE, "name": "harness", "kind": "agent"},
        })
        .to_string()
        .into_bytes();
        let insp = &w.insp;
        poll(
            ctx,
            &format!("daemon {daemon} serving: its lease row ready under its holder and its ctl.delivery responder answering"),
            || {
                let (subject, body, holder) = (subject.clone(), body.clone(), holder.clone());
                async move {
                    match insp.lease().await.map_err(|e| e.to_string())? {
                        None => return Err("no lease row".into()),
                        Some(r) if r.info.holder != holder => {
                            return Err(format!("the lease row is held by {}", r.info.holder))
                        }
                        Some(r) if !r.info.ready => {
                            return Err("its lease row is not ready".into())
                        }
                        Some(_) => {}
                    }
                    let bound = PROBE_ANSWER.min(ctx.left().max(Duration::from_millis(100)));
                    let reply = exchange(&insp.client, &subject, body, bound)
                        .await
                        .map_err(|f| format!("its lease row is ready; ctl.delivery: {}", f.actual))?;
                    match reply.get("ok").and_then(|o| o.as_bool()) {
                        Some(_) => Ok(()),
                        None => Err(format!("ctl.delivery answered {reply}, not a reply")),
                    }
                }
            },
        )
        .await?;
        Ok(format!(
            "daemon {daemon} serves (its lease row ready under its holder, ctl.delivery answering)"
        ))
    }
}
