//! Rows of the space's buckets written as their owners write them: a channel's delivery class,
//! a lifecycle's read ACL narrowed or widened, its retirement tombstone, its deletion; and the
//! membership registry's rows read back from the broker (or deleted, as an operator would).

use super::read::{read_row, ROW_BOUND};
use std::time::Duration;

use cotal_delivery::base::{Read, Rows};
use cotal_delivery::provision::{remove_acl, retire, set_read_acl};
use cotal_delivery::wire::SpaceNames;
use serde::Deserialize;

use super::verb::{poll, Ctx, Kind, Profiled, Refs};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;

pub const VERBS: &[&str] = &[
    "channel",
    "acl",
    "retire",
    "delete_acl",
    "expect_member",
    "delete_member",
];

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RowClass {
    Durable,
    Live,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RowStep {
    Channel {
        name: String,
        class: RowClass,
    },
    Acl {
        agent: String,
        read: Vec<String>,
    },
    Retire {
        agent: String,
    },
    DeleteAcl {
        agent: String,
    },
    ExpectMember {
        agent: String,
        channel: String,
        #[serde(default)]
        absent: bool,
        #[serde(default)]
        state: Option<String>,
        #[serde(default)]
        generation: Option<u64>,
    },
    DeleteMember {
        agent: String,
        channel: String,
    },
}

impl Profiled for RowStep {}

impl RowStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            RowStep::ExpectMember { .. } => Some(Duration::ZERO),
            _ => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            RowStep::Channel { .. } => Refs::default(),
            RowStep::Acl { agent, .. }
            | RowStep::Retire { agent }
            | RowStep::DeleteAcl { agent }
            | RowStep::ExpectMember { agent, .. }
            | RowStep::DeleteMember { agent, .. } => Refs::default().uses(Kind::Agent, agent),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            RowStep::Channel { name, class } => {
                let config = match class {
                    RowClass::Durable => serde_json::json!({"deliveryClass": "durable"}),
                    RowClass::Live => serde_json::json!({"deliveryClass": "live"}),
                };
                let subject = format!("$KV.{}.{name}", w.insp.names.channels_bucket());
                w.insp
                    .js
                    .publish(subject, config.to_string().into())
                    .await
                    .map_err(|e| Failure::could_not(format!("write channel row: {e}")))?
                    .await
                    .map_err(|e| Failure::could_not(format!("channel row stored: {e}")))?;
                Ok(format!("channel row {name:?}: {class:?}"))
            }
            RowStep::Acl { agent, read } => {
                let (p, u) = who(w, agent)?;
                set_read_acl(&w.insp.js, &w.insp.names, &p, &u, read.clone())
                    .await
                    .map_err(|e| Failure::could_not(format!("write the ACL row: {e}")))?;
                Ok(format!(
                    "{agent}'s read ACL is now [{}] (acknowledged by the broker)",
                    read.join(", ")
                ))
            }
            RowStep::Retire { agent } => {
                let (p, u) = who(w, agent)?;
                retire(&w.insp.js, &w.insp.names, &p, &u)
                    .await
                    .map_err(|e| Failure::could_not(format!("retire: {e}")))?;
                Ok(format!(
                    "{agent}'s lifecycle is retired (tombstone on its ACL row)"
                ))
            }
            RowStep::DeleteAcl { agent } => {
                let (p, u) = who(w, agent)?;
                remove_acl(&w.insp.js, &w.insp.names, &p, &u)
                    .await
                    .map_err(|e| Failure::could_not(format!("delete the ACL row: {e}")))?;
                Ok(format!("{agent}'s ACL row is deleted"))
            }
            RowStep::ExpectMember {
                agent,
                channel,
                absent,
                state,
                generation,
            } => {
                let (p, u) = who(w, agent)?;
                let key = SpaceNames::member_key(channel, &p, &u);
                let bucket = w.insp.names.members_bucket();
                let js = w.insp.js.clone();
                poll(
                    ctx,
                    &format!("{agent}'s member row of {channel:?}"),
                    || async {
                        let row = read_row(&js, &bucket, &key).await?;
                        match (row, absent) {
                            (None, true) => Ok(()),
                            (None, false) => Err("no member row".into()),
                            (Some(r), true) => Err(format!("a member row: {r}")),
                            (Some(r), false) => {
                                if let Some(s) = state {
                                    if r["state"] != serde_json::Value::String(s.clone()) {
                                        return Err(format!("the row {r}"));
                                    }
                                }
                                if let Some(g) = generation {
                                    if r["generation"].as_u64() != Some(*g) {
                                        return Err(format!("the row {r}"));
                                    }
                                }
                                Ok(())
                            }
                        }
                    },
                )
                .await?;
                let mut what = Vec::new();
                if *absent {
                    what.push("absent".to_string());
                }
                if let Some(s) = state {
                    what.push(format!("state {s}"));
                }
                if let Some(g) = generation {
                    what.push(format!("generation {g}"));
                }
                Ok(format!(
                    "{agent}'s member row of {channel:?}: {}",
                    if what.is_empty() {
                        "present".to_string()
                    } else {
                        what.join(", ")
                    }
                ))
            }
            RowStep::DeleteMember { agent, channel } => {
                let (p, u) = who(w, agent)?;
                let key = SpaceNames::member_key(channel, &p, &u);
                let rows = Rows::open(&w.insp.js, &w.insp.names.members_bucket(), ROW_BOUND)
                    .await
                    .map_err(|e| Failure::could_not(format!("members bucket: {e}")))?;
                match rows
                    .read(&key)
                    .await
                    .map_err(|e| Failure::could_not(format!("read the row: {e}")))?
                {
                    Read::Present(r) => {
                        rows.delete_expecting(&key, r.revision)
                            .await
                            .map_err(|e| Failure::could_not(format!("delete the row: {e}")))?;
                    }
                    Read::Absent { .. } => {
                        return Err(Failure::new("a member row to delete", "none"));
                    }
                }
                Ok(format!("{agent}'s member row of {channel:?} is deleted"))
            }
        }
    }
}

fn who(
    w: &mut World,
    agent: &str,
) -> Result<
    (
        cotal_delivery::wire::Principal,
        cotal_delivery::wire::LifecycleUid,
    ),
    Failure,
> {
    let a = w.agent(agent)?;
    Ok((
        a.material.principal.clone(),
        a.material.lifecycle_uid.clone(),
    ))
}
