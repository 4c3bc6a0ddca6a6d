//! The daemon's rails as their callers meet them: any verb on `ctl.delivery` (as an agent, on
//! its own subject with the reply under its own subtree) or `ctl.delivery-admin` (as a
//! supervisor), the reply judged as it arrived, within a bound the case states: a refusal that
//! comes at once is not a refusal after the caller's timeout.

use std::time::{Duration, Instant};

use cotal_delivery::base::Credential;
use cotal_delivery::provision::{MintOptions, Profile};
use cotal_delivery::wire::{CtlService, Principal};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use super::agents::toml_to_json;
use super::{Ctx, Kind, Refs};
use crate::kit::world::{DaemonUnderTest, Failure, StepResult, World};

pub const VERBS: &[&str] = &["request"];

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Rail {
    Delivery,
    Admin,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    Request {
        rail: Rail,
        /// An agent's name on `delivery`; the admin rail's caller is the supervisor.
        #[serde(default, rename = "as")]
        caller: Option<String>,
        #[serde(default)]
        op: Option<String>,
        #[serde(default)]
        args: Option<toml::Value>,
        /// The request body's exact bytes instead of the `{op,args,from}` envelope.
        #[serde(default)]
        raw: Option<String>,
        #[serde(default)]
        ok: Option<bool>,
        /// The reply's `data`, exactly.
        #[serde(default)]
        answer: Option<toml::Value>,
        /// The reply's `error` contains this text.
        #[serde(default)]
        error: Option<String>,
    },
}

/// Default bound of a request's answer: the reference agent's request timeout.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// The admin rail's caller.
pub const SUPERVISOR: &str = "local.boss";

impl Step {
    pub fn default_within(&self) -> Option<Duration> {
        Some(ANSWER_WITHIN)
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        let Step::Request { caller, rail, .. } = self;
        match rail {
            Rail::Delivery => Refs::default().uses_opt(Kind::Agent, caller.as_ref()),
            Rail::Admin => Refs::default(),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        let Step::Request {
            rail,
            caller,
            op,
            args,
            raw,
            ok,
            answer,
            error,
        } = self;
        if op.is_some() == raw.is_some() {
            return Err(Failure::could_not(
                "a request has `op` or `raw`, one of them",
            ));
        }
        let (client, principal, service) = match rail {
            Rail::Delivery => {
                let name = caller.as_ref().ok_or_else(|| {
                    Failure::could_not("a `delivery` request names its agent (`as`)")
                })?;
                let a = w.agent(name)?;
                let c = a
                    .client
                    .as_ref()
                    .ok_or_else(|| Failure::could_not(format!("agent {name} is offline")))?;
                (
                    c.client().clone(),
                    a.material.principal.clone(),
                    CtlService::Delivery,
                )
            }
            Rail::Admin => {
                if caller.is_some() {
                    return Err(Failure::could_not(
                        "the admin rail's caller is the supervisor",
                    ));
                }
                (
                    supervisor(w).await?,
                    supervisor_principal()?,
                    CtlService::DeliveryAdmin,
                )
            }
        };
        let body = match (op, raw) {
            (Some(op), _) => json!({
                "op": op,
                "args": args.as_ref().map(toml_to_json).unwrap_or_else(|| json!({})),
                "from": {"id": principal.dot_form(), "name": "harness", "kind": "agent"},
            })
            .to_string()
            .into_bytes(),
            (None, Some(r)) => r.clone().into_bytes(),
            (None, None) => Vec::new(),
        };
        let subject = w.insp.names.ctl_subject(service, &principal);
        let reply = exchange(&client, &subject, body, ctx.left()).await?;
        check_reply(
            &reply,
            *ok,
            answer.as_ref().map(toml_to_json),
            error.as_deref(),
        )?;
        let what = op.clone().unwrap_or_else(|| "a raw body".into());
        let rail_name = match rail {
            Rail::Delivery => "ctl.delivery",
            Rail::Admin => "ctl.delivery-admin",
        };
        let who = caller.clone().unwrap_or_else(|| "the supervisor".into());
        let verdict = match (ok, answer, error) {
            (_, _, Some(e)) => format!("refused: {e:?}"),
            (_, Some(_), _) => format!(
                "answered {}",
                reply.get("data").cloned().unwrap_or(Value::Null)
            ),
            (Some(true), _, _) => "answered ok".to_string(),
            (Some(false), _, _) => "refused".to_string(),
            _ => "answered".to_string(),
        };
        Ok(format!("{who} sends {what} on {rail_name}: {verdict}"))
    }
}

/// Judges a `{ok, data?, error?}` reply.
pub fn check_reply(
    reply: &Value,
    ok: Option<bool>,
    answer: Option<Value>,
    error: Option<&str>,
) -> Result<(), Failure> {
    let got_ok = reply.get("ok").and_then(Value::as_bool);
    let want_ok = match (ok, &answer, error) {
        (Some(o), _, _) => Some(o),
        (None, Some(_), _) => Some(true),
        (None, None, Some(_)) => Some(false),
        (None, None, None) => None,
    };
    if let Some(o) = want_ok {
        if got_ok != Some(o) {
            return Err(Failure::new(
                format!("a reply with ok:{o}"),
                reply.to_string(),
            ));
        }
    }
    if let Some(a) = answer {
        if reply.get("data") != Some(&a) {
            return Err(Failure::new(format!("the data {a}"), reply.to_string()));
        }
    }
    if let Some(e) = error {
        let text = reply
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !text.contains(e) {
            return Err(Failure::new(
                format!("an error containing {e:?}"),
                reply.to_string(),
            ));
        }
    }
    Ok(())
}

/// The supervisor's principal on the admin rail.
pub fn supervisor_principal() -> Result<Principal, Failure> {
    Principal::parse(SUPERVISOR).map_err(|e| Failure::could_not(e.to_string()))
}

/// The supervisor's connection (made once per run).
pub async fn supervisor(w: &mut World) -> Result<async_nats::Client, Failure> {
    if let Some(c) = &w.supervisor {
        return Ok(c.clone());
    }
    let principal = supervisor_principal()?;
    let cred: Credential = w.mesh.mint(
        w.mesh.space(),
        &Profile::Supervisor { principal },
        MintOptions::new().expires_in(Duration::from_secs(4 * 3600)),
    )?;
    let client = w.mesh.connect(&cred, "harness-supervisor").await?;
    w.supervisor = Some(client.clone());
    Ok(client)
}

/// One request on `subject` with its reply under the subject's own `.reply.` subtree; the
/// reply as JSON, or what happened instead (no responders, silence, an unreadable body).
pub async fn exchange(
    client: &async_nats::Client,
    subject: &str,
    body: Vec<u8>,
    bound: Duration,
) -> Result<Value, Failure> {
    let reply = format!("{subject}.reply.{}", uuid::Uuid::new_v4().simple());
    let mut sub = client
        .subscribe(reply.clone())
        .await
        .map_err(|e| Failure::could_not(format!("subscribe {reply}: {e}")))?;
    client
        .flush()
        .await
        .map_err(|e| Failure::could_not(format!("flush: {e}")))?;
    let sent = Instant::now();
    client
        .publish_with_reply(subject.to_string(), reply, body.into())
        .await
        .map_err(|e| Failure::could_not(format!("publish {subject}: {e}")))?;
    let got = tokio::time::timeout(bound, sub.next()).await;
    let _ = sub.unsubscribe().await;
    match got {
        Err(_) => Err(Failure::new(
            format!("an answer within {} ms", bound.as_millis()),
            "no answer",
        )),
        Ok(None) => Err(Failure::new("an answer", "the subscription ended")),
        Ok(Some(m)) if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) => Err(
            Failure::new("an answer", "no responders (no daemon serves the rail)"),
        ),
        Ok(Some(m)) => serde_json::from_slice(&m.payload).map_err(|e| {
            Failure::new(
                "a JSON reply",
                format!(
                    "{} after {} ms: {e}",
                    String::from_utf8_lossy(&m.payload),
                    sent.elapsed().as_millis()
                ),
            )
        }),
    }
}
