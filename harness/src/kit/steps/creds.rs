//! Credentials as the renewal owner and a rogue handle them: a re-sign of the daemon's delivery
//! credential (same nkey) into its store, with a lifetime of the case's choosing, or by another
//! account's key; the JWT the broker holds for the daemon's connection; and `reloadCreds`
//! asking the daemon to adopt the latest re-sign.

use std::time::Duration;

use cotal_delivery::base::{read_creds_file, write_creds_file_atomic};
use cotal_delivery::provision::{MeshAuthority, MintOptions, Profile};
use serde::Deserialize;
use serde_json::json;

use super::rails::{check_reply, exchange, supervisor, supervisor_principal};
use super::{poll, Ctx, Refs};
use crate::connz::ConnState;
use crate::kit::world::{DaemonUnderTest, Failure, StepResult, World};

pub const VERBS: &[&str] = &["resign", "expect_broker_jwt", "reload_creds"];

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Which {
    /// The credential the daemon was provisioned (or first re-signed) with.
    Original,
    /// The latest re-sign of the renewal owner.
    Latest,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ReloadExpect {
    #[default]
    Ok,
    Refused,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    Resign {
        /// ms from now.
        lifetime: u64,
        /// Signed by another account's key with the same space label.
        #[serde(default)]
        rogue: bool,
    },
    ExpectBrokerJwt {
        is: Which,
    },
    ReloadCreds {
        #[serde(default)]
        expect: ReloadExpect,
        #[serde(default)]
        error: Option<String>,
    },
}

/// The name the daemon's resident connection gives the broker.
const DAEMON_CONNECTION: &str = "cotal:delivery";

impl Step {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            Step::ExpectBrokerJwt { .. } => Some(Duration::ZERO),
            Step::ReloadCreds { .. } => Some(Duration::from_secs(15)),
            Step::Resign { .. } => None,
        }
    }

    pub fn unsupported(&self, daemon: &DaemonUnderTest) -> Option<String> {
        match self {
            Step::ExpectBrokerJwt { .. } => super::only_here(
                daemon,
                "the daemon's connection is found by this distribution's connection name",
            ),
            Step::Resign { .. } | Step::ReloadCreds { .. } => None,
        }
    }

    pub fn refs(&self) -> Refs {
        Refs::default()
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            Step::Resign { lifetime, rogue } => {
                let space = w.mesh.space().clone();
                let path = w.mesh.workspace().delivery_creds_path(&space);
                let live = read_creds_file(&path)
                    .map_err(|e| Failure::could_not(format!("read the credential: {e}")))?;
                let options = MintOptions::new()
                    .renewal_of(&live)
                    .expires_in(Duration::from_millis(*lifetime));
                let next = if *rogue {
                    let mut other = MeshAuthority::new();
                    other.add_space(&space);
                    other
                        .mint(&space, &Profile::Delivery, options)
                        .map_err(|e| Failure::could_not(e.to_string()))?
                } else {
                    w.mesh.mint(&space, &Profile::Delivery, options)?
                };
                write_creds_file_atomic(&path, &next)
                    .map_err(|e| Failure::could_not(format!("write the credential: {e}")))?;
                if !*rogue {
                    w.resigns.written.push(next);
                }
                Ok(if *rogue {
                    "a rogue signer (another account, the same space label) re-signs the delivery credential into the store".to_string()
                } else {
                    "the renewal owner re-signs the delivery credential (same nkey) into the store"
                        .to_string()
                })
            }
            Step::ExpectBrokerJwt { is } => {
                let want = match is {
                    Which::Original => w.resigns.original.clone(),
                    Which::Latest => w.resigns.written.last().cloned(),
                }
                .ok_or_else(|| Failure::could_not(format!("no {is:?} credential")))?;
                let broker = &w.mesh.broker;
                poll(
                    ctx,
                    "the broker to hold that JWT for the daemon's connection",
                    || async {
                        let conns = broker
                            .connz_named(ConnState::Open, DAEMON_CONNECTION)
                            .await
                            .map_err(|e| e.to_string())?;
                        if conns.is_empty() {
                            return Err("no open daemon connection".into());
                        }
                        if conns
                            .iter()
                            .all(|c| c.jwt.as_deref() == Some(want.jwt.as_str()))
                        {
                            Ok(())
                        } else {
                            Err("the daemon's connection presents another JWT".into())
                        }
                    },
                )
                .await?;
                Ok(format!(
                    "the broker holds the {} credential's JWT for the daemon's connection",
                    match is {
                        Which::Original => "original",
                        Which::Latest => "re-signed",
                    }
                ))
            }
            Step::ReloadCreds { expect, error } => {
                let expected = w
                    .resigns
                    .written
                    .last()
                    .map(|c| json!({"expected": {"delivery": c.fingerprint()}}))
                    .unwrap_or_else(|| json!({}));
                let client = supervisor(w).await?;
                let principal = supervisor_principal()?;
                let subject = w
                    .insp
                    .names
                    .ctl_subject(cotal_delivery::wire::CtlService::DeliveryAdmin, &principal);
                let body = json!({
                    "op": "reloadCreds",
                    "args": expected,
                    "from": {"id": principal.dot_form(), "name": "manager", "kind": "endpoint"},
                });
                let reply =
                    exchange(&client, &subject, body.to_string().into_bytes(), ctx.left()).await?;
                check_reply(
                    &reply,
                    Some(*expect == ReloadExpect::Ok),
                    None,
                    error.as_deref(),
                )?;
                Ok(match expect {
                    ReloadExpect::Ok => "reloadCreds is answered ok".to_string(),
                    ReloadExpect::Refused => format!(
                        "reloadCreds is refused{}",
                        error
                            .as_ref()
                            .map(|e| format!(": {e:?}"))
                            .unwrap_or_default()
                    ),
                })
            }
        }
    }
}
