//! Requests in flight and the windows they leave open. An agent's durable join or leave can be
//! sent without waiting for its answer (the agent's connection belongs to that request until
//! `expect_answer` reads the answer), and a proxy can delay whole frames of the daemon's
//! connection (`proxy.rs`, "delay"): the broker's replies to requests on a subject (the request
//! reaches the broker and is answered at once, only the answer is late, as a slow JetStream API
//! answer is), or the daemon's own publishes on a subject, while every other frame flows.
//! Together they open a window deterministically, e.g. between a join's or a leave's cursor
//! read (a JetStream API read the daemon makes before it writes the member row) and the row's
//! write, so a case can post into it and prove from the broker that it opened.

use std::time::Duration;

use cotal_delivery::agent::{Agent, Backstop};
use serde::Deserialize;
use serde_json::Value;
use tokio::task::JoinHandle;

use super::{Ctx, Kind, Refs, DEFAULT_WITHIN};
use crate::kit::world::{DaemonUnderTest, Failure, StepResult, World};

pub const VERBS: &[&str] = &[
    "send_join",
    "send_leave",
    "expect_answer",
    "delay_frames",
    "expect_delayed",
    "release_delayed",
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    SendJoin {
        agent: String,
        channel: String,
    },
    SendLeave {
        agent: String,
        channel: String,
        /// Default: the generation the agent's last join of the channel returned.
        #[serde(default)]
        generation: Option<u64>,
    },
    ExpectAnswer {
        agent: String,
        /// A refusal (or, for a join, the unestablished backstop's reason) containing this text.
        #[serde(default)]
        error: Option<String>,
    },
    DelayFrames {
        proxy: String,
        /// Delay the broker's replies to requests on subjects this matches (e.g.
        /// `$JS.API.STREAM.INFO.CHAT_demo`; `*` one token, a trailing `>` the rest).
        #[serde(default)]
        replies_to: Option<String>,
        /// Delay the client's publishes on subjects this matches.
        #[serde(default)]
        publishes_to: Option<String>,
    },
    ExpectDelayed {
        proxy: String,
        count: usize,
    },
    ReleaseDelayed {
        proxy: String,
    },
}

/// A request an agent sent and has not read the answer of: the task owns the agent's connection
/// and gives it back with the answer.
pub struct InFlight {
    op: Op,
    task: JoinHandle<(Agent, Result<Answer, String>)>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug, Clone)]
enum Op {
    Join { channel: String },
    Leave { channel: String, generation: u64 },
}

impl Op {
    fn describe(&self) -> String {
        match self {
            Op::Join { channel } => format!("join of {channel:?}"),
            Op::Leave {
                channel,
                generation,
            } => format!("leave of {channel:?} (generation {generation})"),
        }
    }
}

enum Answer {
    Joined(Backstop),
    Left(Value),
}

/// The agent's own wait for the daemon's answer: longer than any case's window, bounded.
const AGENT_WAIT: Duration = Duration::from_secs(15);

impl Step {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            Step::ExpectAnswer { .. } => Some(AGENT_WAIT),
            Step::ExpectDelayed { .. } => Some(DEFAULT_WITHIN),
            _ => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            Step::SendJoin { agent, .. }
            | Step::SendLeave { agent, .. }
            | Step::ExpectAnswer { agent, .. } => Refs::default().uses(Kind::Agent, agent),
            Step::DelayFrames { proxy, .. }
            | Step::ExpectDelayed { proxy, .. }
            | Step::ReleaseDelayed { proxy } => Refs::default().uses(Kind::Proxy, proxy),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            Step::SendJoin { agent, channel } => {
                let op = Op::Join {
                    channel: channel.clone(),
                };
                send(w, agent, op).await
            }
            Step::SendLeave {
                agent,
                channel,
                generation,
            } => {
                let generation = match generation {
                    Some(g) => *g,
                    None => *w.agent(agent)?.generations.get(channel).ok_or_else(|| {
                        Failure::could_not(format!(
                            "agent {agent} has no generation of {channel:?} (no durable join)"
                        ))
                    })?,
                };
                let op = Op::Leave {
                    channel: channel.clone(),
                    generation,
                };
                send(w, agent, op).await
            }
            Step::ExpectAnswer { agent, error } => answer(w, ctx, agent, error.as_deref()).await,
            Step::DelayFrames {
                proxy,
                replies_to,
                publishes_to,
            } => {
                let p = w.proxy(proxy)?;
                let mut what = Vec::new();
                if let Some(r) = replies_to {
                    p.delay_replies_to(r);
                    what.push(format!("the broker's replies to requests on {r}"));
                }
                if let Some(s) = publishes_to {
                    p.delay_publishes_to(s);
                    what.push(format!("publishes on {s}"));
                }
                if what.is_empty() {
                    return Err(Failure::could_not(
                        "a delay names `replies_to`, `publishes_to` or both",
                    ));
                }
                Ok(format!("proxy {proxy} delays {}", what.join(" and ")))
            }
            Step::ExpectDelayed { proxy, count } => {
                let p = w.proxy(proxy)?;
                p.wait_delayed(*count, ctx.left()).await.map_err(|_| {
                    Failure::new(
                        format!("proxy {proxy} to hold {count} delayed frames"),
                        format!("it holds {}", p.delayed_count()),
                    )
                })?;
                Ok(format!(
                    "proxy {proxy} holds {count} delayed frame{}",
                    if *count == 1 { "" } else { "s" }
                ))
            }
            Step::ReleaseDelayed { proxy } => {
                w.proxy(proxy)?.release_delayed();
                Ok(format!("proxy {proxy} releases what it delayed"))
            }
        }
    }
}

/// Sends `op` as `agent` in a task that owns the agent's connection until the answer is read.
async fn send(w: &mut World, agent: &str, op: Op) -> StepResult {
    if w.requests.contains_key(agent) {
        return Err(Failure::could_not(format!(
            "agent {agent} already has a request in flight"
        )));
    }
    let a = w.agent(agent)?;
    let client = a
        .client
        .take()
        .ok_or_else(|| Failure::could_not(format!("agent {agent} is offline")))?;
    let what = op.describe();
    let task_op = op.clone();
    let task = tokio::spawn(async move {
        let answer = match &task_op {
            Op::Join { channel } => client
                .durable_join_within(channel, AGENT_WAIT)
                .await
                .map(|j| Answer::Joined(j.backstop))
                .map_err(|e| e.to_string()),
            Op::Leave {
                channel,
                generation,
            } => client
                .durable_leave(channel, *generation)
                .await
                .map(Answer::Left)
                .map_err(|e| e.to_string()),
        };
        (client, answer)
    });
    w.requests.insert(agent.to_string(), InFlight { op, task });
    Ok(format!(
        "agent {agent} sends its durable {what}, its answer read later"
    ))
}

/// Reads the answer of `agent`'s request in flight and judges it.
async fn answer(w: &mut World, ctx: Ctx, agent: &str, error: Option<&str>) -> StepResult {
    let mut flight = w
        .requests
        .remove(agent)
        .ok_or_else(|| Failure::could_not(format!("agent {agent} has no request in flight")))?;
    let what = flight.op.describe();
    let (client, got) = match tokio::time::timeout(ctx.left(), &mut flight.task).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => return Err(Failure::could_not(format!("the request's task: {e}"))),
        Err(_) => {
            return Err(Failure::new(
                format!("agent {agent}'s {what} answered"),
                "no answer within the bound",
            ))
        }
    };
    let a = w.agent(agent)?;
    a.client = Some(client);
    match (&flight.op, got, error) {
        (Op::Join { channel }, Ok(Answer::Joined(Backstop::Durable { generation })), None) => {
            a.generations.insert(channel.clone(), generation);
            Ok(format!(
                "agent {agent}'s {what} is answered: joined durably (generation {generation})"
            ))
        }
        (Op::Leave { .. }, Ok(Answer::Left(v)), None) => {
            Ok(format!("agent {agent}'s {what} is answered: {v}"))
        }
        (_, Ok(Answer::Joined(Backstop::Unestablished { reason })), Some(want))
        | (_, Err(reason), Some(want))
            if reason.contains(want) =>
        {
            Ok(format!("agent {agent}'s {what} is refused: {want:?}"))
        }
        (_, got, want) => Err(Failure::new(
            match want {
                Some(w) => format!("agent {agent}'s {what} refused with {w:?}"),
                None => format!("agent {agent}'s {what} answered ok"),
            },
            match got {
                Ok(Answer::Joined(b)) => format!("{b:?}"),
                Ok(Answer::Left(v)) => v.to_string(),
                Err(e) => e,
            },
        )),
    }
}
