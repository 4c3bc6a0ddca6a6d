//! The membership registry and the per-member store judged from the broker: which posts a
//! member's row puts inside its interval (the post's CHAT sequence between the row's join and
//! leave cursors), how far the fan-out writer has got (its durable's ack floor against a post's
//! sequence), and what an agent may not do with its own credential, which the broker must
//! refuse: write its own member row (the registry is broker-known truth, not self-reported), or
//! read its own store (agents hold no content-bearing read on it; the trusted reader reads it
//! on their behalf).

use std::time::Duration;

use cotal_delivery::base::Rows;
use cotal_delivery::wire::SpaceNames;
use serde::Deserialize;
use serde_json::json;

use super::read::consumer_info;
use super::read::read_row;
use super::verb::{poll, Ctx, Kind, Profiled, Refs};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;

pub const VERBS: &[&str] = &[
    "expect_interval",
    "expect_routed",
    "forge_member_row",
    "read_own_store",
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RegistryStep {
    ExpectInterval {
        agent: String,
        channel: String,
        /// Posts whose CHAT sequence the row's current interval admits.
        #[serde(default)]
        admits: Vec<String>,
        /// Posts it does not.
        #[serde(default)]
        excludes: Vec<String>,
    },
    ExpectRouted {
        posts: Vec<String>,
    },
    ForgeMemberRow {
        agent: String,
        channel: String,
    },
    ReadOwnStore {
        agent: String,
    },
}

/// Default bound of `expect_routed`: posts routed on a loaded 2-core machine.
const ROUTED_WITHIN: Duration = Duration::from_secs(10);
/// How long the broker has to refuse an agent's forbidden request (its `-ERR`).
const REFUSAL_BOUND: Duration = Duration::from_secs(5);
/// Bound of one row read.
const ROW_BOUND: Duration = Duration::from_secs(5);

impl Profiled for RegistryStep {}

impl RegistryStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            RegistryStep::ExpectInterval { .. } => Some(Duration::ZERO),
            RegistryStep::ExpectRouted { .. } => Some(ROUTED_WITHIN),
            RegistryStep::ForgeMemberRow { .. } | RegistryStep::ReadOwnStore { .. } => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            RegistryStep::ExpectInterval {
                agent,
                admits,
                excludes,
                ..
            } => {
                let mut refs = Refs::default().uses(Kind::Agent, agent);
                for p in admits.iter().chain(excludes) {
                    refs = refs.uses(Kind::Post, p);
                }
                refs
            }
            RegistryStep::ExpectRouted { posts } => posts
                .iter()
                .fold(Refs::default(), |r, p| r.uses(Kind::Post, p)),
            RegistryStep::ForgeMemberRow { agent, .. } | RegistryStep::ReadOwnStore { agent } => {
                Refs::default().uses(Kind::Agent, agent)
            }
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            RegistryStep::ExpectInterval {
                agent,
                channel,
                admits,
                excludes,
            } => interval(w, ctx, agent, channel, admits, excludes).await,
            RegistryStep::ExpectRouted { posts } => {
                let mut seqs = Vec::with_capacity(posts.len());
                for p in posts {
                    seqs.push(w.post(p)?.seq);
                }
                let top = seqs.iter().copied().max().unwrap_or(0);
                let insp = &w.insp;
                let chat = insp.names.chat_stream();
                poll(ctx, "the fan-out writer past the posts", || async {
                    let f = consumer_info(insp, &chat, "fanout").await?;
                    if f.ack_floor.stream_sequence >= top {
                        Ok(())
                    } else {
                        Err(format!(
                            "its ack floor at CHAT sequence {} of {top}",
                            f.ack_floor.stream_sequence
                        ))
                    }
                })
                .await?;
                Ok(format!(
                    "the fan-out writer has acked {posts:?} (its ack floor on the broker at or above their CHAT sequences)"
                ))
            }
            RegistryStep::ForgeMemberRow { agent, channel } => forge(w, agent, channel).await,
            RegistryStep::ReadOwnStore { agent } => read_store(w, agent).await,
        }
    }
}

async fn interval(
    w: &mut World,
    ctx: Ctx,
    agent: &str,
    channel: &str,
    admits: &[String],
    excludes: &[String],
) -> StepResult {
    let mut want = Vec::new();
    for (posts, inside) in [(admits, true), (excludes, false)] {
        for p in posts {
            want.push((p.clone(), w.post(p)?.seq, inside));
        }
    }
    let a = w.agent(agent)?;
    let key = SpaceNames::member_key(channel, &a.material.principal, &a.material.lifecycle_uid);
    let bucket = w.insp.names.members_bucket();
    let js = w.insp.js.clone();
    poll(
        ctx,
        &format!("{agent}'s member row of {channel:?} to place each post"),
        || async {
            let row = read_row(&js, &bucket, &key)
                .await?
                .ok_or_else(|| "no member row".to_string())?;
            let join = row["joinCursor"]
                .as_u64()
                .ok_or_else(|| format!("a row without a join cursor: {row}"))?;
            let leave = row["leaveCursor"].as_u64();
            let wrong: Vec<String> = want
                .iter()
                .filter(|(_, seq, inside)| {
                    (*seq > join && leave.is_none_or(|l| *seq <= l)) != *inside
                })
                .map(|(p, seq, inside)| {
                    format!(
                        "{p:?} (CHAT {seq}) {}",
                        if *inside { "outside" } else { "inside" }
                    )
                })
                .collect();
            if wrong.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "join cursor {join}, leave cursor {leave:?}: {}",
                    wrong.join(", ")
                ))
            }
        },
    )
    .await?;
    let mut parts = Vec::new();
    if !admits.is_empty() {
        parts.push(format!("admits {admits:?}"));
    }
    if !excludes.is_empty() {
        parts.push(format!("excludes {excludes:?}"));
    }
    Ok(format!(
        "{agent}'s member row of {channel:?} {} (join cursor < CHAT sequence <= leave cursor)",
        parts.join(" and ")
    ))
}

/// The agent, on a connection of its own credential, writes the member row it would have as an
/// open durable member: the broker must refuse the publish, and the row must stay as it was
/// (absent, or at its revision).
async fn forge(w: &mut World, agent: &str, channel: &str) -> StepResult {
    let a = w.agent(agent)?;
    let (p, u) = (
        a.material.principal.clone(),
        a.material.lifecycle_uid.clone(),
    );
    let credential = a.material.credential.clone();
    let key = SpaceNames::member_key(channel, &p, &u);
    let bucket = w.insp.names.members_bucket();
    let subject = format!("$KV.{bucket}.{key}");
    let rows = Rows::open(&w.insp.js, &bucket, ROW_BOUND)
        .await
        .map_err(|e| Failure::could_not(format!("bucket {bucket}: {e}")))?;
    let read = || async {
        rows.read(&key)
            .await
            .map_err(|e| Failure::could_not(format!("read {key}: {e}")))
    };
    let before = read().await?;
    // What a daemon writes for an open durable member (`plane/membership.rs`).
    let row = json!({
        "channel": channel,
        "owner": p.dot_form(),
        "lifecycleUid": u.as_str(),
        "state": "durable-active",
        "joinCursor": 0,
        "activated": true,
        "generation": 1,
        "writerIdentity": p.dot_form(),
        "updatedAt": 0,
    });
    let (client, mut events) = w
        .mesh
        .connect_watched(&credential, &format!("{agent} forging"))
        .await?;
    client
        .publish(subject.clone(), row.to_string().into())
        .await
        .map_err(|e| Failure::could_not(format!("publish {subject}: {e}")))?;
    let refused = events
        .expect_denied(REFUSAL_BOUND, "Publish", &subject)
        .await;
    let _ = client.drain().await;
    refused.map_err(|_| {
        Failure::new(
            format!("the broker to refuse {agent}'s own write of its member row"),
            format!("no refusal; events {:?}", events.seen()),
        )
    })?;
    let after = read().await?;
    if after != before {
        return Err(Failure::new(
            "the member row as it was before the refused write",
            format!("{before:?} became {after:?}"),
        ));
    }
    Ok(format!(
        "agent {agent} writes its own member row of {channel:?}: the broker refuses it, and the row is as it was"
    ))
}

/// The agent, on a connection of its own credential, asks the broker for the entries of its own
/// store two ways (a leader read of its last entry, a consumer over its subject): the broker must
/// refuse both requests.
async fn read_store(w: &mut World, agent: &str) -> StepResult {
    let a = w.agent(agent)?;
    let (p, u) = (
        a.material.principal.clone(),
        a.material.lifecycle_uid.clone(),
    );
    let credential = a.material.credential.clone();
    let names = w.insp.names.clone();
    let stream = names.inbox_stream();
    let subject = names.dinbox_subject(&p, &u);
    let get = format!("$JS.API.STREAM.MSG.GET.{stream}");
    let create = format!("$JS.API.CONSUMER.CREATE.{stream}");
    let (client, mut events) = w
        .mesh
        .connect_watched(&credential, &format!("{agent} reading its store"))
        .await?;
    let reply = client.new_inbox();
    let mut answers = client
        .subscribe(reply.clone())
        .await
        .map_err(|e| Failure::could_not(format!("subscribe {reply}: {e}")))?;
    let requests = [
        (get.clone(), json!({ "last_by_subj": subject })),
        (
            create.clone(),
            json!({ "stream_name": stream, "config": { "filter_subject": subject, "ack_policy": "none", "deliver_policy": "all" } }),
        ),
    ];
    let mut refused = Ok(());
    for (to, body) in requests {
        client
            .publish_with_reply(to.clone(), reply.clone(), body.to_string().into())
            .await
            .map_err(|e| Failure::could_not(format!("publish {to}: {e}")))?;
        if refused.is_ok() {
            refused = events.expect_denied(REFUSAL_BOUND, "Publish", &to).await;
        }
    }
    let _ = client.flush().await;
    // Whatever the broker said, no answer may carry an entry: a denied request has none.
    let answered = tokio::time::timeout(
        Duration::from_millis(200),
        futures::StreamExt::next(&mut answers),
    )
    .await
    .ok()
    .flatten();
    let _ = client.drain().await;
    refused.map_err(|_| {
        Failure::new(
            format!("the broker to refuse {agent}'s reads of its own store"),
            format!("events {:?}", events.seen()),
        )
    })?;
    if let Some(m) = answered {
        return Err(Failure::new(
            format!("no answer to {agent}'s reads of its own store"),
            String::from_utf8_lossy(&m.payload).to_string(),
        ));
    }
    Ok(format!(
        "agent {agent} asks the broker for its own store's entries: both reads refused"
    ))
}
