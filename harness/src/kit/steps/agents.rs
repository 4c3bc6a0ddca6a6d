//! Agents as actors: lifecycles provisioned as a manager would, connected with the agent client
//! (which speaks the wire), joining and leaving durably, posting, going offline and coming back,
//! and surfacing frames from their own `dlv_` durable. What they surfaced is judged against the
//! posts they made (each kept under its text), and what is pending for them is read on the
//! broker.

use super::read::{consumer_info, count_on};
use super::verb::toml_to_json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cotal_delivery::agent::{AgentErrorKind, Backstop, Frame};
use cotal_delivery::wire::{Plane3Entry, Reason, SpaceNames};
use serde::Deserialize;
use serde_json::Value;

use super::verb::{poll, Ctx, Kind, Profiled, Refs, DEFAULT_WITHIN};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::{AgentActor, Post, World};

pub const VERBS: &[&str] = &[
    "agent",
    "offline",
    "online",
    "announce",
    "join",
    "leave",
    "post",
    "surface",
    "expect_pending",
    "plant_entry",
];

/// What a join must come to.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum JoinExpect {
    #[default]
    Durable,
    Unestablished,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentStep {
    Agent {
        name: String,
        read: Vec<String>,
        #[serde(default)]
        roles: Vec<String>,
        #[serde(default)]
        offline: bool,
        /// Another space of the mesh (`[mesh] spaces`) the lifecycle lives in, instead of the
        /// case's space.
        #[serde(default)]
        space: Option<String>,
    },
    Offline {
        agent: String,
    },
    Online {
        agent: String,
    },
    Announce {
        agent: String,
        /// The `card.name` announced, when not the agent's own name (two agents may announce
        /// one name: a mention of it is ambiguous).
        #[serde(default)]
        card: Option<String>,
    },
    Join {
        agent: String,
        channel: String,
        #[serde(default)]
        expect: JoinExpect,
        /// The backstop's shortfall must contain this text.
        #[serde(default)]
        error: Option<String>,
    },
    Leave {
        agent: String,
        channel: String,
        /// Default: the generation the agent's last join of the channel returned.
        #[serde(default)]
        generation: Option<u64>,
        /// A refusal containing this text is expected.
        #[serde(default)]
        error: Option<String>,
        /// The exact answer expected.
        #[serde(default)]
        answer: Option<toml::Value>,
    },
    Post {
        agent: String,
        channel: String,
        text: String,
        /// The message id: a fresh one by default, `""` for an id-less post.
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        mentions: Vec<String>,
        /// Posts `<text>-0` … `<text>-<count-1>`, pipelined.
        #[serde(default)]
        count: Option<u64>,
    },
    Surface {
        agent: String,
        frames: Vec<String>,
        #[serde(default)]
        ordered: bool,
        /// How long to watch for any other frame once the expected ones arrived, ms.
        #[serde(default = "default_quiet_ms")]
        quiet: u64,
    },
    ExpectPending {
        agent: String,
        #[serde(default)]
        inbox: Option<u64>,
        #[serde(default)]
        dlv: Option<u64>,
        #[serde(default)]
        unsurfaced: Option<u64>,
    },
    PlantEntry {
        agent: String,
        channel: String,
        post: String,
        #[serde(default)]
        generation: Option<u64>,
    },
}

fn default_quiet_ms() -> u64 {
    1500
}

/// The default bound of a surface: frames handed off on a loaded 2-core machine.
const SURFACE_WITHIN: Duration = Duration::from_secs(10);
/// Bound on one join's answer (the agent's own wait).
const JOIN_WAIT: Duration = Duration::from_secs(15);
/// The default bound of a post's storing: a cluster that lost a node answers a publish with no
/// responders until its stream has a leader again.
const STORED_WITHIN: Duration = Duration::from_secs(10);
/// Pause between two sends of a post no stream took (the broker's no-responders answer).
const STORE_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Most posts one `post` step makes.
const MAX_COUNT: u64 = 10_000;

impl Profiled for AgentStep {
    fn wording(&self) -> Vec<&str> {
        match self {
            AgentStep::Join { error: Some(e), .. } | AgentStep::Leave { error: Some(e), .. } => {
                vec![e.as_str()]
            }
            _ => Vec::new(),
        }
    }
}

impl AgentStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            AgentStep::Surface { .. } => Some(SURFACE_WITHIN),
            AgentStep::ExpectPending { .. } => Some(SURFACE_WITHIN),
            AgentStep::Join { .. } => Some(JOIN_WAIT),
            AgentStep::Post { .. } => Some(STORED_WITHIN),
            AgentStep::Online { .. } | AgentStep::Agent { .. } => Some(DEFAULT_WITHIN),
            _ => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            AgentStep::Agent { name, .. } => Refs::default().creates(Kind::Agent, name),
            AgentStep::Offline { agent }
            | AgentStep::Online { agent }
            | AgentStep::Announce { agent, .. }
            | AgentStep::Join { agent, .. }
            | AgentStep::Leave { agent, .. }
            | AgentStep::ExpectPending { agent, .. } => Refs::default().uses(Kind::Agent, agent),
            AgentStep::Post {
                agent, text, count, ..
            } => {
                let mut refs = Refs::default().uses(Kind::Agent, agent);
                match count {
                    None => refs = refs.creates(Kind::Post, text),
                    Some(n) => {
                        for i in 0..(*n).min(MAX_COUNT) {
                            refs = refs.creates(Kind::Post, &format!("{text}-{i}"));
                        }
                    }
                }
                refs
            }
            AgentStep::Surface { agent, frames, .. } => {
                let mut refs = Refs::default().uses(Kind::Agent, agent);
                for f in frames {
                    refs = refs.uses(Kind::Post, f);
                }
                refs
            }
            AgentStep::PlantEntry { agent, post, .. } => Refs::default()
                .uses(Kind::Agent, agent)
                .uses(Kind::Post, post),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            AgentStep::Agent {
                name,
                read,
                roles,
                offline,
                space,
            } => {
                let read: Vec<&str> = read.iter().map(String::as_str).collect();
                let roles: Vec<&str> = roles.iter().map(String::as_str).collect();
                let material = match space {
                    None => {
                        crate::rig::agent::provision_holder(
                            &w.mesh,
                            &w.insp,
                            w.mesh.space(),
                            name,
                            &read,
                            &roles,
                        )
                        .await?
                    }
                    Some(s) => {
                        let other = w
                            .mesh
                            .spaces()
                            .iter()
                            .find(|x| x.as_str() == s)
                            .cloned()
                            .ok_or_else(|| {
                                Failure::could_not(format!("space = {s:?}: not in [mesh] spaces"))
                            })?;
                        let insp = w.mesh.inspector(&other).await?;
                        crate::rig::agent::provision_holder(
                            &w.mesh, &insp, &other, name, &read, &roles,
                        )
                        .await?
                    }
                };
                let client = if *offline {
                    None
                } else {
                    Some(crate::rig::agent::connect(&w.mesh, &material, name).await?)
                };
                w.agents.insert(
                    name.clone(),
                    AgentActor {
                        material,
                        client,
                        delivery: None,
                        generations: BTreeMap::new(),
                        surfaced: Vec::new(),
                    },
                );
                let roles = if roles.is_empty() {
                    String::new()
                } else {
                    format!(", serving {}", roles.join(", "))
                };
                let elsewhere = space
                    .as_ref()
                    .map(|s| format!(" in space {s}"))
                    .unwrap_or_default();
                Ok(format!(
                    "agent {name} provisioned{elsewhere} reading [{}]{roles}{}",
                    read.join(", "),
                    if *offline { ", offline" } else { "" }
                ))
            }
            AgentStep::Offline { agent } => {
                let a = w.agent(agent)?;
                a.delivery = None;
                if let Some(c) = a.client.take() {
                    let _ = c.client().drain().await;
                }
                Ok(format!("agent {agent} goes offline"))
            }
            AgentStep::Online { agent } => {
                let mesh = &w.mesh;
                let a = w
                    .agents
                    .get_mut(agent)
                    .ok_or_else(|| Failure::could_not(format!("no agent {agent:?}")))?;
                if a.client.is_none() {
                    a.client = Some(crate::rig::agent::connect(mesh, &a.material, agent).await?);
                }
                Ok(format!("agent {agent} comes back online"))
            }
            AgentStep::Announce { agent, card: None } => {
                let a = w.agent(agent)?;
                online(a, agent)?
                    .announce("idle")
                    .await
                    .map_err(|e| Failure::could_not(format!("announce {agent}: {e}")))?;
                Ok(format!("agent {agent} announces its presence"))
            }
            AgentStep::Announce {
                agent,
                card: Some(card),
            } => {
                // The agent's own credential on a connection whose card carries `card`.
                let material = w.agent(agent)?.material.clone();
                let client = crate::rig::agent::connect(&w.mesh, &material, card).await?;
                let announced = client.announce("idle").await;
                let _ = client.client().drain().await;
                announced.map_err(|e| Failure::could_not(format!("announce {agent}: {e}")))?;
                Ok(format!("agent {agent} announces its presence as {card:?}"))
            }
            AgentStep::Join {
                agent,
                channel,
                expect,
                error,
            } => {
                let left = ctx.left();
                let a = w.agent(agent)?;
                let joined = online(a, agent)?
                    .durable_join_within(channel, left)
                    .await
                    .map_err(|e| {
                        Failure::new(
                            format!("agent {agent}'s join of {channel:?} to be answered"),
                            e.to_string(),
                        )
                    })?;
                match (&joined.backstop, expect, error) {
                    (Backstop::Durable { generation }, JoinExpect::Durable, None) => {
                        a.generations.insert(channel.clone(), *generation);
                        Ok(format!(
                            "agent {agent} joins {channel:?} durably (generation {generation})"
                        ))
                    }
                    (Backstop::Unestablished { reason }, JoinExpect::Unestablished, want)
                    | (Backstop::Unestablished { reason }, JoinExpect::Durable, want @ Some(_)) => {
                        if let Some(want) = want {
                            if !reason.contains(want.as_str()) {
                                return Err(Failure::new(
                                    format!("the join refused with {want:?}"),
                                    reason.clone(),
                                ));
                            }
                            return Ok(format!(
                                "agent {agent}'s durable join of {channel:?} is refused: {want:?}"
                            ));
                        }
                        Ok(format!(
                            "agent {agent} joins {channel:?} live, the durable backstop unestablished"
                        ))
                    }
                    (got, _, _) => Err(Failure::new(
                        match (expect, error) {
                            (_, Some(e)) => format!("the join refused with {e:?}"),
                            (JoinExpect::Durable, None) => "a durable join".to_string(),
                            (JoinExpect::Unestablished, None) => {
                                "the backstop unestablished".to_string()
                            }
                        },
                        format!("{got:?}"),
                    )),
                }
            }
            AgentStep::Leave {
                agent,
                channel,
                generation,
                error,
                answer,
            } => {
                let a = w.agent(agent)?;
                let generation = match generation {
                    Some(g) => *g,
                    None => *a.generations.get(channel).ok_or_else(|| {
                        Failure::could_not(format!(
                            "agent {agent} has no generation of {channel:?} (no durable join)"
                        ))
                    })?,
                };
                let got = online(a, agent)?.durable_leave(channel, generation).await;
                match (got, error) {
                    (Ok(v), None) => {
                        if let Some(want) = answer {
                            let want = toml_to_json(want);
                            if v != want {
                                return Err(Failure::new(
                                    format!("the leave answered {want}"),
                                    v.to_string(),
                                ));
                            }
                            return Ok(format!(
                                "agent {agent} leaves {channel:?} (generation {generation}): {v}"
                            ));
                        }
                        Ok(format!(
                            "agent {agent} leaves {channel:?} (generation {generation})"
                        ))
                    }
                    (Err(e), Some(want)) if e.detail().contains(want.as_str()) => Ok(format!(
                        "agent {agent}'s leave of {channel:?} (generation {generation}) is refused: {want:?}"
                    )),
                    (got, want) => Err(Failure::new(
                        match want {
                            Some(w) => format!("the leave refused with {w:?}"),
                            None => "the leave answered".to_string(),
                        },
                        match got {
                            Ok(v) => v.to_string(),
                            Err(e) => e.to_string(),
                        },
                    )),
                }
            }
            AgentStep::Post {
                agent,
                channel,
                text,
                id,
                mentions,
                count,
            } => {
                let left = ctx.left();
                post(
                    w,
                    left,
                    agent,
                    channel,
                    text,
                    id.as_deref(),
                    mentions,
                    *count,
                )
                .await
            }
            AgentStep::Surface {
                agent,
                frames,
                ordered,
                quiet,
            } => {
                surface(
                    w,
                    ctx,
                    agent,
                    frames,
                    *ordered,
                    Duration::from_millis(*quiet),
                )
                .await
            }
            AgentStep::ExpectPending {
                agent,
                inbox,
                dlv,
                unsurfaced,
            } => {
                let a = w.agent(agent)?;
                let (p, u) = (
                    a.material.principal.clone(),
                    a.material.lifecycle_uid.clone(),
                );
                let insp = &w.insp;
                let names = insp.names.clone();
                let durable = SpaceNames::dlv_durable(&p, &u);
                let want = (*inbox, *dlv, *unsurfaced);
                poll(
                    ctx,
                    &format!("what the broker holds for {agent}"),
                    || async {
                        let got_inbox =
                            count_on(insp, &names.inbox_stream(), &names.dinbox_subject(&p, &u))
                                .await?;
                        let got_dlv =
                            count_on(insp, &names.dlv_stream(), &names.dlv_subject(&p, &u)).await?;
                        let c = consumer_info(insp, &names.dlv_stream(), &durable).await?;
                        let got_unsurfaced = c.num_pending + c.num_ack_pending as u64;
                        let got = (got_inbox, got_dlv, got_unsurfaced);
                        let matches = want.0.is_none_or(|n| n == got.0)
                            && want.1.is_none_or(|n| n == got.1)
                            && want.2.is_none_or(|n| n == got.2);
                        if matches {
                            Ok(())
                        } else {
                            Err(format!(
                                "INBOX {} entries, DLV {} frames, {} unsurfaced",
                                got.0, got.1, got.2
                            ))
                        }
                    },
                )
                .await?;
                let mut what = Vec::new();
                if let Some(n) = inbox {
                    what.push(format!("{n} INBOX entries"));
                }
                if let Some(n) = dlv {
                    what.push(format!("{n} DLV frames"));
                }
                if let Some(n) = unsurfaced {
                    what.push(format!("{n} unsurfaced"));
                }
                Ok(format!("the broker holds for {agent}: {}", what.join(", ")))
            }
            AgentStep::PlantEntry {
                agent,
                channel,
                post,
                generation,
            } => {
                let p = w.post(post)?.clone();
                let a = w.agent(agent)?;
                let generation = match generation {
                    Some(g) => *g,
                    None => *a.generations.get(channel).ok_or_else(|| {
                        Failure::could_not(format!(
                            "agent {agent} has no generation of {channel:?}"
                        ))
                    })?,
                };
                let (member, uid) = (
                    a.material.principal.clone(),
                    a.material.lifecycle_uid.clone(),
                );
                let entry = Plane3Entry {
                    msg: p.msg.clone(),
                    channel: channel.clone(),
                    seq: p.seq,
                    reason: Reason::DurableChannel,
                    generation,
                };
                let body = serde_json::to_vec(&entry)
                    .map_err(|e| Failure::could_not(format!("encode the entry: {e}")))?;
                let mut headers = async_nats::HeaderMap::new();
                if let Some(id) = cotal_delivery::wire::dedup_id(&p.msg, &member, &uid, generation)
                {
                    headers.insert("Nats-Msg-Id", id.as_str());
                }
                let subject = w.insp.names.dinbox_subject(&member, &uid);
                w.insp
                    .js
                    .publish_with_headers(subject, headers, body.into())
                    .await
                    .map_err(|e| Failure::could_not(format!("plant the entry: {e}")))?
                    .await
                    .map_err(|e| Failure::could_not(format!("plant the entry: {e}")))?;
                Ok(format!(
                    "a fan-out copy of {post:?} (CHAT seq above nothing it knew) is stored in {agent}'s INBOX as a writer that had not seen the latest row would"
                ))
            }
        }
    }
}

/// The agent's connection, or the refusal of a step that needs it online.
fn online<'a>(
    a: &'a mut AgentActor,
    name: &str,
) -> Result<&'a cotal_delivery::agent::Agent, Failure> {
    a.client
        .as_ref()
        .ok_or_else(|| Failure::could_not(format!("agent {name} is offline")))
}

#[allow(clippy::too_many_arguments)]
async fn post(
    w: &mut World,
    left: Duration,
    agent: &str,
    channel: &str,
    text: &str,
    id: Option<&str>,
    mentions: &[String],
    count: Option<u64>,
) -> StepResult {
    if count.is_some_and(|n| n == 0 || n > MAX_COUNT) {
        return Err(Failure::could_not(format!(
            "count must be 1 to {MAX_COUNT}"
        )));
    }
    if count.is_some() && id.is_some_and(|i| !i.is_empty()) {
        return Err(Failure::could_not(
            "a counted post has fresh ids, or none (`id = \"\"`)",
        ));
    }
    let a = w.agent(agent)?;
    let client = online(a, agent)?;
    let labels: Vec<String> = match count {
        None => vec![text.to_string()],
        Some(n) => (0..n).map(|i| format!("{text}-{i}")).collect(),
    };
    let mut made = Vec::with_capacity(labels.len());
    if labels.len() == 1 {
        let mut msg = client.message(channel, &labels[0], id);
        if !mentions.is_empty() {
            msg["mentions"] = Value::from(mentions.to_vec());
        }
        // A no-responders answer stored nothing (no stream took the post), so the same post,
        // with the same id, is sent again until the step's bound: a cluster that lost a node
        // answers so until its stream has a leader again. Every other failure fails the step.
        let until = tokio::time::Instant::now() + left;
        let seq = loop {
            match client.post(channel, &msg).await {
                Ok(seq) => break seq,
                Err(e)
                    if e.kind() == AgentErrorKind::NoResponders
                        && tokio::time::Instant::now() + STORE_RETRY_PAUSE < until =>
                {
                    tokio::time::sleep(STORE_RETRY_PAUSE).await;
                }
                Err(e) => {
                    return Err(Failure::new(
                        format!("{agent}'s post to be stored"),
                        e.to_string(),
                    ))
                }
            }
        };
        made.push((labels[0].clone(), seq, msg));
    } else {
        // Pipelined from the agent's own connection: a sender outrunning the fan-out writer.
        let js = async_nats::jetstream::new(client.client().clone());
        let subject = client.names().chat_subject(client.principal(), channel);
        let mut acks = Vec::with_capacity(labels.len());
        for label in &labels {
            let mut msg = client.message(channel, label, id);
            if !mentions.is_empty() {
                msg["mentions"] = Value::from(mentions.to_vec());
            }
            let mut headers = async_nats::HeaderMap::new();
            let mid = cotal_delivery::wire::message_id(&msg).to_string();
            if !mid.is_empty() {
                headers.insert("Nats-Msg-Id", mid.as_str());
            }
            let body = serde_json::to_vec(&msg).unwrap_or_default();
            let ack = js
                .publish_with_headers(subject.clone(), headers, body.into())
                .await
                .map_err(|e| Failure::new("the burst published", e.to_string()))?;
            acks.push((label.clone(), ack, msg));
        }
        for (label, ack, msg) in acks {
            let seq = ack
                .await
                .map_err(|e| Failure::new("every post of the burst stored", e.to_string()))?
                .sequence;
            made.push((label, seq, msg));
        }
    }
    for (label, seq, msg) in made {
        let id = cotal_delivery::wire::message_id(&msg).to_string();
        w.posts.insert(
            label,
            Post {
                seq,
                channel: channel.to_string(),
                id,
                msg,
                agent: agent.to_string(),
            },
        );
    }
    let kind = match id {
        Some("") => " id-less",
        _ => "",
    };
    let mention = if mentions.is_empty() {
        String::new()
    } else {
        format!(" mentioning {}", mentions.join(", "))
    };
    Ok(match count {
        None => format!("agent {agent} posts{kind} {text:?} on {channel:?}{mention}"),
        Some(n) => {
            format!("agent {agent} posts {n}{kind} posts {text:?}-0… on {channel:?}{mention}")
        }
    })
}

/// The text a frame carries (its first part), which names the post it came from.
pub fn frame_text(f: &Frame) -> String {
    f.msg["parts"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn surface(
    w: &mut World,
    ctx: Ctx,
    agent: &str,
    frames: &[String],
    ordered: bool,
    quiet: Duration,
) -> StepResult {
    let a = w.agent(agent)?;
    if a.delivery.is_none() {
        let d = online(a, agent)?
            .bind_delivery()
            .await
            .map_err(|e| Failure::new(format!("{agent}'s dlv_ durable bound"), e.to_string()))?;
        a.delivery = Some(d);
    }
    let delivery = a
        .delivery
        .as_mut()
        .ok_or_else(|| Failure::could_not("no delivery bound"))?;
    let mut got: Vec<Frame> = Vec::new();
    let enough = |got: &[Frame]| got.len() >= frames.len();
    // The expected frames, within the step's bound.
    while !enough(&got) {
        let left = ctx.left();
        if left.is_zero() {
            break;
        }
        match delivery.surface(left, |_| {}).await {
            Ok(Some(f)) => got.push(f),
            Ok(None) => break,
            Err(e) => {
                return Err(Failure::new(
                    format!("{agent} to surface {frames:?}"),
                    format!("its delivery ended: {e}"),
                ))
            }
        }
    }
    // Then nothing else for `quiet`.
    let quiet_until = Instant::now() + quiet;
    loop {
        let left = quiet_until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match delivery.surface(left, |_| {}).await {
            Ok(Some(f)) => got.push(f),
            Ok(None) => break,
            Err(_) => break,
        }
    }
    let texts: Vec<String> = got.iter().map(frame_text).collect();
    a.surfaced.extend(got);
    let (mut want, mut have) = (frames.to_vec(), texts.clone());
    if !ordered {
        want.sort();
        have.sort();
    }
    if want != have {
        return Err(Failure::new(
            format!(
                "{agent} to surface exactly {frames:?}{}",
                if ordered { " in this order" } else { "" }
            ),
            format!("{texts:?}"),
        ));
    }
    Ok(if frames.is_empty() {
        format!("agent {agent} surfaces nothing")
    } else {
        format!("agent {agent} surfaces {frames:?}")
    })
}
