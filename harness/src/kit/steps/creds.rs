//! Credentials as their owner and a rogue handle them: a remint of the daemon's delivery
//! credential (same nkey) into its store, with a lifetime of the case's choosing, or by another
//! account's key; the JWT the broker holds for the daemon's connection; and `reloadCreds`
//! asking the daemon to adopt the latest remint.

use std::time::Duration;

use cotal_delivery::base::{read_creds_file, write_creds_file_atomic};
use cotal_delivery::provision::{MeshAuthority, MintOptions, Profile};
use serde::Deserialize;
use serde_json::json;

use super::call::{check_reply, exchange, supervisor, supervisor_principal};
use super::verb::{poll, Ctx, Kind, Profiled, Refs};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;
use crate::rig::connz::{BrokerConn, ConnState};

pub const VERBS: &[&str] = &["remint", "expect_broker_jwt", "reload_creds"];

/// What the broker holds for the daemon's connection.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum BrokerJwt {
    Original,
    Latest,
    /// No open connection of the daemon at all (closed for an expiry, not redialed).
    None,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum AdoptionExpect {
    #[default]
    Ok,
    Refused,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CredStep {
    Remint {
        /// ms from now.
        lifetime: u64,
        /// Signed by another account's key with the same space label.
        #[serde(default)]
        rogue: bool,
    },
    ExpectBrokerJwt {
        is: BrokerJwt,
    },
    ReloadCreds {
        #[serde(default)]
        expect: AdoptionExpect,
        #[serde(default)]
        error: Option<String>,
        /// A proxy holding the daemon's bytes: the reply is expected among them (answered while
        /// held), then released so it reaches the caller.
        #[serde(default)]
        release: Option<String>,
    },
}

impl Profiled for CredStep {
    fn wording(&self) -> Vec<&str> {
        match self {
            CredStep::ReloadCreds { error: Some(e), .. } => vec![e.as_str()],
            _ => Vec::new(),
        }
    }
}

impl CredStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            CredStep::ExpectBrokerJwt { .. } => Some(Duration::ZERO),
            CredStep::ReloadCreds { .. } => Some(Duration::from_secs(15)),
            CredStep::Remint { .. } => None,
        }
    }

    /// Every credential step runs under a template: the remint is the owner's write into the
    /// workspace's store the template names with `{root}`, the adoption is asked on the rail or
    /// left to the daemon's 75 % re-read, and the broker is read by the daemon's credential.
    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            CredStep::ReloadCreds { release, .. } => {
                Refs::default().uses_opt(Kind::Proxy, release.as_ref())
            }
            _ => Refs::default(),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            CredStep::Remint { lifetime, rogue } => {
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
                    w.remints.written.push(next);
                }
                Ok(if *rogue {
                    "a rogue signer (another account, the same space label) remints the delivery credential into the store".to_string()
                } else {
                    "the owner remints the delivery credential (same nkey) into the store"
                        .to_string()
                })
            }
            CredStep::ExpectBrokerJwt { is } => {
                let want = match is {
                    BrokerJwt::Original => w.remints.original.clone(),
                    BrokerJwt::Latest => w.remints.written.last().cloned(),
                    BrokerJwt::None => None,
                };
                if *is != BrokerJwt::None && want.is_none() {
                    return Err(Failure::could_not(format!("no {is:?} credential")));
                }
                let want_jwt = want.map(|c| c.jwt);
                let original = w.remints.original.as_ref().map(|c| c.jwt.clone());
                let latest = w.remints.written.last().map(|c| c.jwt.clone());
                // The daemon's connection is the one that serves its rails: authenticated as its
                // delivery credential's user (a remint keeps the nkey) and subscribed where the
                // owner's reloadCreds is published. The seeds give it no name, and the timer
                // writer's "own connection under the same delivery credential" moves onto a
                // renewal on its own schedule.
                let space = w.mesh.space().clone();
                let user = read_creds_file(&w.mesh.workspace().delivery_creds_path(&space))
                    .and_then(|c| c.public_key())
                    .map_err(|e| Failure::could_not(format!("read the credential: {e}")))?;
                let rail = w.insp.names.ctl_subject(
                    cotal_delivery::wire::CtlService::DeliveryAdmin,
                    &supervisor_principal()?,
                );
                let broker = &w.mesh.broker;
                let started = poll(
                    ctx,
                    "the broker to hold that for the daemon's connection (the one under its delivery credential serving its admin rail)",
                    || async {
                        let mut conns = broker
                            .connz_subscribed(ConnState::Open)
                            .await
                            .map_err(|e| e.to_string())?;
                        conns.retain(|c| {
                            c.user.as_deref() == Some(user.as_str()) && c.subscribes_to(&rail)
                        });
                        let jwt_of = |c: &BrokerConn| match c.jwt.as_deref() {
                            j if j.is_some() && j == original.as_deref() => "the original JWT",
                            j if j.is_some() && j == latest.as_deref() => "the reminted JWT",
                            _ => "another JWT",
                        };
                        let Some(jwt) = &want_jwt else {
                            return match conns.as_slice() {
                                [] => Ok(None),
                                [c, ..] => Err(format!(
                                    "{} open, cid {} presenting {}",
                                    conns.len(),
                                    c.cid,
                                    jwt_of(c)
                                )),
                            };
                        };
                        let [conn] = conns.as_slice() else {
                            return Err(format!("{} open daemon connections", conns.len()));
                        };
                        if conn.jwt.as_deref() != Some(jwt.as_str()) {
                            return Err(format!(
                                "the daemon's connection (cid {}) presents {}",
                                conn.cid,
                                jwt_of(conn)
                            ));
                        }
                        conn.start_unix_us()
                            .map(|us| Some(us / 1000))
                            .ok_or_else(|| format!("an unreadable start {:?}", conn.start))
                    },
                )
                .await?;
                // Timed at the broker's own stamp of that connection's start.
                if let Some(ms) = started {
                    w.happened_at = Some(super::verb::instant_at_unix_ms(ms)?);
                }
                Ok(match is {
                    BrokerJwt::Original => {
                        "the broker holds the original credential's JWT for the daemon's connection"
                    }
                    BrokerJwt::Latest => {
                        "the broker holds the reminted credential's JWT for the daemon's connection"
                    }
                    BrokerJwt::None => "the broker holds no connection of the daemon",
                }
                .to_string())
            }
            CredStep::ReloadCreds {
                expect,
                error,
                release,
            } => {
                let expected = w
                    .remints
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
                let request =
                    exchange(&client, &subject, body.to_string().into_bytes(), ctx.left());
                let reply = match release {
                    None => request.await?,
                    Some(p) => {
                        let proxy = w.proxy(p)?;
                        let held = format!("{subject}.reply.");
                        let (reply, held) = tokio::join!(request, async {
                            let seen = proxy.wait_held(&held, ctx.left()).await;
                            proxy.release();
                            seen
                        });
                        held.map_err(|_| {
                            Failure::new(
                                format!("the reply held by proxy {p} before its release"),
                                "it held no reply",
                            )
                        })?;
                        reply?
                    }
                };
                check_reply(
                    &reply,
                    Some(*expect == AdoptionExpect::Ok),
                    None,
                    error.as_deref(),
                )?;
                let held = release
                    .as_ref()
                    .map(|p| format!(" (the reply held by proxy {p}, then released)"))
                    .unwrap_or_default();
                Ok(match expect {
                    AdoptionExpect::Ok => format!("reloadCreds is answered ok{held}"),
                    AdoptionExpect::Refused => format!(
                        "reloadCreds is refused{}{held}",
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
