//! Anycast take records as their parties meet them (docs/anycast.md): a sender publishes a role
//! request on the task stream; an operator creates a role's shared durable with the ack wait of
//! its choice, remembers the task stream's creation time, or recreates the stream; a holder pulls
//! its copy with its own credential, asks the daemon to record its take on its own take subject,
//! acks the copy; a sender reads and cancels its own request on `ctl.delivery`. What the daemon
//! did is judged from the broker: the rows of the `cotal_anycast_<s>` bucket, the requests the
//! task stream still holds, and the DMs `DM_<s>` stored for a sender from the daemon's own
//! principal.

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::{self, stream};
use cotal_delivery::agent::Agent;
use cotal_delivery::plane::row_key;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;

use super::read::{read_row, ROW_BOUND};
use super::verb::{poll, Ctx, Kind, Profiled, Refs};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::holdings::{RoleCopy, TaskRequest};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;

pub const VERBS: &[&str] = &[
    "anycast_send",
    "anycast_unsent",
    "role_queue",
    "remember_task_stream",
    "recreate_task_stream",
    "anycast_pull",
    "anycast_ack",
    "anycast_take",
    "send_take",
    "anycast_status",
    "anycast_cancel",
    "anycast_race",
    "expect_anycast_row",
    "expect_anycast_rows",
    "expect_queued",
    "expect_dms",
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum AnycastStep {
    AnycastSend {
        agent: String,
        role: String,
        /// The request's name for later steps.
        name: String,
    },
    /// Names a request the task stream never stored: the seq one past its last.
    AnycastUnsent {
        role: String,
        sender: String,
        name: String,
    },
    RoleQueue {
        role: String,
        /// The durable's ack wait, ms.
        ack_wait: u64,
    },
    RememberTaskStream {
        name: String,
    },
    RecreateTaskStream {},
    AnycastPull {
        holder: String,
        role: String,
        request: String,
        /// The copy's delivery count (1: the first delivery).
        #[serde(default = "one")]
        delivered: u64,
    },
    AnycastAck {
        holder: String,
        request: String,
    },
    AnycastTake {
        holder: String,
        request: String,
        /// A remembered creation time (`remember_task_stream`); default: the one the request
        /// was stored under.
        #[serde(default)]
        created: Option<String>,
        /// Default: the pulled copy's delivery count, else 1.
        #[serde(default)]
        delivered: Option<u64>,
        /// The answer's `took`: `taken`, `moved` or `already-held`.
        #[serde(default)]
        took: Option<String>,
        /// The take is refused.
        #[serde(default)]
        refused: bool,
        /// The refusal contains this text.
        #[serde(default)]
        error: Option<String>,
    },
    /// A take sent and not waited for (its answer goes unread).
    SendTake {
        holder: String,
        request: String,
    },
    AnycastStatus {
        agent: String,
        request: String,
        #[serde(default)]
        state: Option<String>,
        /// The holder named (an agent).
        #[serde(default)]
        holder: Option<String>,
        #[serde(default)]
        refused: bool,
        #[serde(default)]
        error: Option<String>,
    },
    AnycastCancel {
        agent: String,
        request: String,
        #[serde(default)]
        refused: bool,
        #[serde(default)]
        error: Option<String>,
    },
    AnycastRace {
        holder: String,
        sender: String,
        role: String,
        trials: u64,
    },
    ExpectAnycastRow {
        request: String,
        /// `taken` or `cancelled`.
        #[serde(default)]
        state: Option<String>,
        #[serde(default)]
        holder: Option<String>,
        #[serde(default)]
        absent: bool,
    },
    ExpectAnycastRows {
        count: u64,
    },
    ExpectQueued {
        request: String,
        queued: bool,
    },
    ExpectDms {
        /// The sender they are addressed to.
        to: String,
        /// The daemon whose principal sends them.
        from: String,
        count: u64,
        /// The holder each DM names, in order.
        #[serde(default)]
        names: Vec<String>,
    },
}

fn one() -> u64 {
    1
}

/// Most trials one race runs.
const MAX_TRIALS: u64 = 1_000;
/// How long `expect_dms` keeps watching for one more once the count arrived.
const DM_QUIET: Duration = Duration::from_millis(500);

impl Profiled for AnycastStep {
    fn wording(&self) -> Vec<&str> {
        match self {
            AnycastStep::AnycastTake { error: Some(e), .. }
            | AnycastStep::AnycastStatus { error: Some(e), .. }
            | AnycastStep::AnycastCancel { error: Some(e), .. } => vec![e.as_str()],
            _ => Vec::new(),
        }
    }
}

impl AnycastStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            AnycastStep::ExpectAnycastRow { .. }
            | AnycastStep::ExpectAnycastRows { .. }
            | AnycastStep::ExpectQueued { .. }
            | AnycastStep::ExpectDms { .. }
            | AnycastStep::AnycastPull { .. } => Some(Duration::from_secs(10)),
            AnycastStep::AnycastTake { .. }
            | AnycastStep::AnycastStatus { .. }
            | AnycastStep::AnycastCancel { .. } => Some(Duration::from_secs(5)),
            AnycastStep::AnycastRace { .. } => Some(Duration::from_secs(120)),
            _ => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            AnycastStep::AnycastSend { agent, name, .. } => Refs::default()
                .uses(Kind::Agent, agent)
                .creates(Kind::Task, name),
            AnycastStep::AnycastUnsent { sender, name, .. } => Refs::default()
                .uses(Kind::Agent, sender)
                .creates(Kind::Task, name),
            AnycastStep::RoleQueue { .. } | AnycastStep::RecreateTaskStream {} => Refs::default(),
            AnycastStep::RememberTaskStream { name } => {
                Refs::default().creates(Kind::TaskStream, name)
            }
            AnycastStep::AnycastPull {
                holder, request, ..
            }
            | AnycastStep::AnycastAck { holder, request } => Refs::default()
                .uses(Kind::Agent, holder)
                .uses(Kind::Task, request),
            AnycastStep::AnycastTake {
                holder,
                request,
                created,
                ..
            } => Refs::default()
                .uses(Kind::Agent, holder)
                .uses(Kind::Task, request)
                .uses_opt(Kind::TaskStream, created.as_ref()),
            AnycastStep::AnycastStatus {
                agent,
                request,
                holder,
                ..
            } => Refs::default()
                .uses(Kind::Agent, agent)
                .uses(Kind::Task, request)
                .uses_opt(Kind::Agent, holder.as_ref()),
            AnycastStep::SendTake { holder, request } => Refs::default()
                .uses(Kind::Agent, holder)
                .uses(Kind::Task, request),
            AnycastStep::AnycastCancel { agent, request, .. } => Refs::default()
                .uses(Kind::Agent, agent)
                .uses(Kind::Task, request),
            AnycastStep::AnycastRace { holder, sender, .. } => Refs::default()
                .uses(Kind::Agent, holder)
                .uses(Kind::Agent, sender),
            AnycastStep::ExpectAnycastRow {
                request, holder, ..
            } => Refs::default()
                .uses(Kind::Task, request)
                .uses_opt(Kind::Agent, holder.as_ref()),
            AnycastStep::ExpectAnycastRows { .. } => Refs::default(),
            AnycastStep::ExpectQueued { request, .. } => Refs::default().uses(Kind::Task, request),
            AnycastStep::ExpectDms {
                to, from, names, ..
            } => {
                let mut refs = Refs::default()
                    .uses(Kind::Agent, to)
                    .uses(Kind::Daemon, from);
                for n in names {
                    refs = refs.uses(Kind::Agent, n);
                }
                refs
            }
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            AnycastStep::AnycastSend { agent, role, name } => {
                let created = task_created(w).await?;
                let a = online(w, agent)?;
                let subject = a.names().anycast_subject(role, a.principal());
                let js = jetstream::new(a.client().clone());
                let seq = js
                    .publish(subject.clone(), "{\"parts\":[]}".into())
                    .await
                    .map_err(|e| Failure::could_not(format!("publish on {subject}: {e}")))?
                    .await
                    .map_err(|e| Failure::new(format!("{subject} stored"), e.to_string()))?
                    .sequence;
                w.holdings.tasks.insert(
                    name.clone(),
                    TaskRequest {
                        seq,
                        role: role.clone(),
                        sender: agent.clone(),
                        created,
                    },
                );
                Ok(format!("{agent} sends an @{role} request ({name})"))
            }
            AnycastStep::AnycastUnsent { role, sender, name } => {
                let created = task_created(w).await?;
                let (js, task) = (w.insp.js.clone(), w.insp.names.task_stream());
                let last = js
                    .get_stream(task.clone())
                    .await
                    .map_err(|e| Failure::could_not(format!("{task}: {e}")))?
                    .cached_info()
                    .state
                    .last_sequence;
                w.holdings.tasks.insert(
                    name.clone(),
                    TaskRequest {
                        seq: last + 1,
                        role: role.clone(),
                        sender: sender.clone(),
                        created,
                    },
                );
                Ok(format!(
                    "{name} names seq {} of the task stream, which it never stored",
                    last + 1
                ))
            }
            AnycastStep::RoleQueue { role, ack_wait } => {
                let names = w.insp.names.clone();
                let r = cotal_delivery::wire::Role::parse(role)
                    .map_err(|e| Failure::could_not(e.to_string()))?;
                w.insp
                    .js
                    .get_stream_no_info(names.task_stream())
                    .await
                    .map_err(|e| Failure::could_not(format!("the task stream: {e}")))?
                    .create_consumer(pull::Config {
                        durable_name: Some(cotal_delivery::wire::SpaceNames::task_durable(&r)),
                        filter_subject: names.task_role_filter(&r),
                        ack_policy: AckPolicy::Explicit,
                        ack_wait: Duration::from_millis(*ack_wait),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| Failure::could_not(format!("create the @{role} durable: {e}")))?;
                Ok(format!(
                    "the operator creates @{role}'s durable with a {ack_wait} ms ack wait"
                ))
            }
            AnycastStep::RememberTaskStream { name } => {
                let created = task_created(w).await?;
                w.holdings.created.insert(name.clone(), created);
                Ok(format!(
                    "the task stream's creation time is remembered as {name}"
                ))
            }
            AnycastStep::RecreateTaskStream {} => {
                let before = task_created(w).await?;
                let task = w.insp.names.task_stream();
                let config = w
                    .insp
                    .js
                    .get_stream(task.clone())
                    .await
                    .map_err(|e| Failure::could_not(format!("{task}: {e}")))?
                    .cached_info()
                    .config
                    .clone();
                w.insp
                    .js
                    .delete_stream(task.clone())
                    .await
                    .map_err(|e| Failure::could_not(format!("delete {task}: {e}")))?;
                w.insp
                    .js
                    .create_stream(stream::Config { ..config })
                    .await
                    .map_err(|e| Failure::could_not(format!("create {task}: {e}")))?;
                let after = task_created(w).await?;
                if after == before {
                    return Err(Failure::could_not(
                        "the recreated task stream kept its creation time",
                    ));
                }
                Ok("the operator recreates the task stream (same configuration)".to_string())
            }
            AnycastStep::AnycastPull {
                holder,
                role,
                request,
                delivered,
            } => {
                let seq = task(w, request)?.seq;
                let left = ctx.left();
                let a = online(w, holder)?;
                let queue = a.role_queue(role).await.map_err(|e| {
                    Failure::could_not(format!("{holder} binds @{role}'s durable: {e}"))
                })?;
                let mut batch = queue
                    .fetch()
                    .max_messages(1)
                    .expires(left)
                    .messages()
                    .await
                    .map_err(|e| Failure::could_not(format!("{holder}'s pull: {e}")))?;
                let copy = match tokio::time::timeout(left, batch.next()).await {
                    Ok(Some(Ok(m))) => m,
                    Ok(Some(Err(e))) => {
                        return Err(Failure::new(
                            format!("{holder} to be handed a copy of {request}"),
                            e.to_string(),
                        ))
                    }
                    _ => {
                        return Err(Failure::new(
                            format!(
                                "{holder} to be handed a copy of {request} within {} ms",
                                left.as_millis()
                            ),
                            "no copy",
                        ))
                    }
                };
                let info = copy
                    .info()
                    .map_err(|e| Failure::could_not(format!("the copy's metadata: {e}")))?;
                let (got_seq, got_delivered) = (info.stream_sequence, info.delivered as u64);
                if (got_seq, got_delivered) != (seq, *delivered) {
                    return Err(Failure::new(
                        format!("{request} (seq {seq}) in delivery {delivered}"),
                        format!("seq {got_seq} in delivery {got_delivered}"),
                    ));
                }
                let ack_subject = copy
                    .reply
                    .as_ref()
                    .map(|r| r.to_string())
                    .ok_or_else(|| Failure::could_not("the copy has no ack subject"))?;
                w.holdings.copies.insert(
                    (holder.clone(), request.clone()),
                    RoleCopy {
                        ack_subject,
                        seq: got_seq,
                        delivered: got_delivered,
                    },
                );
                Ok(format!(
                    "{holder} is handed its copy of {request} from @{role}'s durable (delivery {delivered})"
                ))
            }
            AnycastStep::AnycastAck { holder, request } => {
                let copy = w
                    .holdings
                    .copies
                    .get(&(holder.clone(), request.clone()))
                    .ok_or_else(|| {
                        Failure::could_not(format!("{holder} pulled no copy of {request}"))
                    })?
                    .clone();
                // A double ack: the broker answers once the ack is recorded.
                online(w, holder)?
                    .client()
                    .request(copy.ack_subject.clone(), "+ACK".into())
                    .await
                    .map_err(|e| Failure::could_not(format!("{holder}'s ack: {e}")))?;
                Ok(format!("{holder} acks its copy of {request}"))
            }
            AnycastStep::AnycastTake {
                holder,
                request,
                created,
                delivered,
                took,
                refused,
                error,
            } => {
                let t = task(w, request)?.clone();
                let seen = match created {
                    Some(name) => w.holdings.created.get(name).cloned().ok_or_else(|| {
                        Failure::could_not(format!("no creation time remembered as {name}"))
                    })?,
                    None => t.created.clone(),
                };
                let delivered = match delivered {
                    Some(d) => *d,
                    None => w
                        .holdings
                        .copies
                        .get(&(holder.clone(), request.clone()))
                        .map(|c| c.delivered)
                        .unwrap_or(1),
                };
                let a = online(w, holder)?;
                let answer = a.anycast_take(t.seq, &seen, delivered).await;
                let of = match created {
                    Some(name) => format!(" naming the creation time {name}"),
                    None => String::new(),
                };
                let what = format!("{holder}'s take of {request}{of} (delivery {delivered})");
                judge(&what, answer, took.as_deref(), "took", *refused, error)
            }
            AnycastStep::SendTake { holder, request } => {
                let t = task(w, request)?.clone();
                let a = online(w, holder)?;
                let subject = a
                    .names()
                    .ctl_subject(cotal_delivery::wire::CtlService::Anycast, a.principal());
                let reply = format!("{subject}.reply.{}", uuid::Uuid::new_v4().simple());
                let body = serde_json::json!({
                    "op": "take",
                    "args": {
                        "seq": t.seq,
                        "streamCreated": t.created,
                        "delivered": 1,
                        "lifecycleUid": a.lifecycle_uid().to_string(),
                    },
                    "from": {"id": a.principal().dot_form(), "name": holder, "kind": "agent"},
                });
                let client = a.client().clone();
                client
                    .publish_with_reply(subject, reply, body.to_string().into())
                    .await
                    .map_err(|e| Failure::could_not(format!("send {holder}'s take: {e}")))?;
                client
                    .flush()
                    .await
                    .map_err(|e| Failure::could_not(format!("flush {holder}'s take: {e}")))?;
                Ok(format!(
                    "{holder} sends its take of {request} and does not wait for the answer"
                ))
            }
            AnycastStep::AnycastStatus {
                agent,
                request,
                state,
                holder,
                refused,
                error,
            } => {
                let seq = task(w, request)?.seq;
                let holder_id = holder.as_ref().map(|h| principal_of(w, h)).transpose()?;
                let a = online(w, agent)?;
                let answer = a.anycast_status(seq).await;
                let what = format!("{agent}'s anycastStatus of {request}");
                if let (Ok(v), Some(h)) = (&answer, &holder_id) {
                    if v["holder"].as_str() != Some(h.as_str()) {
                        return Err(Failure::new(
                            format!("{what} to name the holder {h}"),
                            v.to_string(),
                        ));
                    }
                }
                let line = judge(&what, answer, state.as_deref(), "state", *refused, error)?;
                Ok(match holder {
                    Some(h) => format!("{line}, holder {h}"),
                    None => line,
                })
            }
            AnycastStep::AnycastCancel {
                agent,
                request,
                refused,
                error,
            } => {
                let seq = task(w, request)?.seq;
                let a = online(w, agent)?;
                let answer = a.anycast_cancel(seq).await;
                let what = format!("{agent}'s anycastCancel of {request}");
                let want = (!*refused && error.is_none()).then_some("cancelled");
                judge(&what, answer, want, "state", *refused, error)
            }
            AnycastStep::AnycastRace {
                holder,
                sender,
                role,
                trials,
            } => race(w, ctx, holder, sender, role, *trials).await,
            AnycastStep::ExpectAnycastRow {
                request,
                state,
                holder,
                absent,
            } => {
                let t = task(w, request)?.clone();
                let holder_id = holder.as_ref().map(|h| principal_of(w, h)).transpose()?;
                let (js, bucket) = (w.insp.js.clone(), w.insp.names.anycast_bucket());
                let key = row_key(&t.created, t.seq);
                let what = match (absent, state, holder) {
                    (true, ..) => format!("no row of {request}"),
                    (false, s, h) => format!(
                        "a row of {request}{}{}",
                        s.as_ref().map(|s| format!(", {s}")).unwrap_or_default(),
                        h.as_ref().map(|h| format!(", by {h}")).unwrap_or_default()
                    ),
                };
                poll(ctx, &format!("{what} in {bucket}"), || async {
                    let row = read_row(&js, &bucket, &key).await?;
                    match (row, absent) {
                        (None, true) => Ok(()),
                        (Some(r), true) => Err(format!("the row {r}")),
                        (None, false) => Err("no row".to_string()),
                        (Some(r), false) => {
                            if state.as_ref().is_some_and(|s| r["state"] != s.as_str()) {
                                return Err(format!("the row {r}"));
                            }
                            if holder_id
                                .as_ref()
                                .is_some_and(|h| r["holder"] != h.as_str())
                            {
                                return Err(format!("the row {r}"));
                            }
                            Ok(())
                        }
                    }
                })
                .await?;
                Ok(format!("the broker holds {what}"))
            }
            AnycastStep::ExpectAnycastRows { count } => {
                let (js, bucket) = (w.insp.js.clone(), w.insp.names.anycast_bucket());
                poll(ctx, &format!("{count} rows in {bucket}"), || async {
                    let n = live_rows(&js, &bucket).await?;
                    if n == *count {
                        Ok(())
                    } else {
                        Err(format!("{n} rows"))
                    }
                })
                .await?;
                Ok(format!("the broker holds {count} anycast rows"))
            }
            AnycastStep::ExpectQueued { request, queued } => {
                let seq = task(w, request)?.seq;
                let (js, stream) = (w.insp.js.clone(), w.insp.names.task_stream());
                let what = if *queued {
                    format!("the task stream holds {request}")
                } else {
                    format!("the task stream no longer holds {request}")
                };
                poll(ctx, &what, || async {
                    let s = js
                        .get_stream_no_info(stream.clone())
                        .await
                        .map_err(|e| format!("{stream}: {e}"))?;
                    let held = s.get_raw_message(seq).await.is_ok();
                    if held == *queued {
                        Ok(())
                    } else if held {
                        Err(format!("seq {seq} is still there"))
                    } else {
                        Err(format!("seq {seq} is gone"))
                    }
                })
                .await?;
                Ok(what)
            }
            AnycastStep::ExpectDms {
                to,
                from,
                count,
                names,
            } => expect_dms(w, ctx, to, from, *count, names).await,
        }
    }
}

/// The agent's connection.
fn online<'a>(w: &'a World, name: &str) -> Result<&'a Agent, Failure> {
    w.agents
        .get(name)
        .ok_or_else(|| Failure::could_not(format!("no agent named {name:?}")))?
        .client
        .as_ref()
        .ok_or_else(|| Failure::could_not(format!("agent {name} is offline")))
}

fn task<'a>(w: &'a World, name: &str) -> Result<&'a TaskRequest, Failure> {
    w.holdings
        .tasks
        .get(name)
        .ok_or_else(|| Failure::could_not(format!("no request named {name:?} was sent")))
}

/// `local.<agent>` as the wire names it.
fn principal_of(w: &World, agent: &str) -> Result<String, Failure> {
    w.agents
        .get(agent)
        .map(|a| a.material.principal.dot_form())
        .ok_or_else(|| Failure::could_not(format!("no agent named {agent:?}")))
}

/// `TASK_<s>`'s creation time in unix ns, as a holder reads it (leader-served stream info).
fn task_created(w: &World) -> impl std::future::Future<Output = Result<String, Failure>> {
    let (task, js) = (w.insp.names.task_stream(), w.insp.js.clone());
    created_of(js, task)
}

async fn created_of(js: jetstream::Context, task: String) -> Result<String, Failure> {
    let s = js
        .get_stream(task.clone())
        .await
        .map_err(|e| Failure::could_not(format!("{task}: {e}")))?;
    Ok(s.cached_info().created.unix_timestamp_nanos().to_string())
}

/// Judges a reply of a verb on the daemon: answered with `field` = `want`, or refused (with
/// `error` in its text).
fn judge(
    what: &str,
    answer: Result<Value, cotal_delivery::agent::AgentError>,
    want: Option<&str>,
    field: &str,
    refused: bool,
    error: &Option<String>,
) -> StepResult {
    let expect_refusal = refused || error.is_some();
    match answer {
        Ok(v) if expect_refusal => Err(Failure::new(
            format!("{what} refused"),
            format!("answered {v}"),
        )),
        Ok(v) => match want {
            Some(want) if v[field].as_str() != Some(want) => Err(Failure::new(
                format!("{what} answered with {field} {want:?}"),
                format!("answered {v}"),
            )),
            Some(want) => Ok(format!("{what} is answered: {field} {want}")),
            None => Ok(format!("{what} is answered")),
        },
        Err(e) if !expect_refusal => Err(Failure::new(
            format!("{what} answered"),
            format!("{:?}: {}", e.kind(), e.detail()),
        )),
        Err(e) => {
            if e.kind() != cotal_delivery::agent::AgentErrorKind::Refused {
                return Err(Failure::new(
                    format!("{what} refused by the daemon"),
                    format!("{:?}: {}", e.kind(), e.detail()),
                ));
            }
            match error {
                Some(text) if !e.detail().contains(text.as_str()) => Err(Failure::new(
                    format!("{what} refused with {text:?}"),
                    e.detail().to_string(),
                )),
                Some(text) => Ok(format!("{what} is refused: {text:?}")),
                None => Ok(format!("{what} is refused")),
            }
        }
    }
}

/// The keys of `bucket` that hold a row now (delete and purge markers left out), read from the
/// stream leader's last message per subject.
async fn live_rows(js: &jetstream::Context, bucket: &str) -> Result<u64, String> {
    let stream = format!("KV_{bucket}");
    let s = js
        .get_stream_no_info(stream.clone())
        .await
        .map_err(|e| format!("{stream}: {e}"))?;
    let mut info = s
        .info_with_subjects(format!("$KV.{bucket}.>"))
        .await
        .map_err(|e| format!("{stream} info: {e}"))?;
    let mut subjects = Vec::new();
    while let Some(entry) = futures::TryStreamExt::try_next(&mut info)
        .await
        .map_err(|e| format!("{stream} subjects: {e}"))?
    {
        subjects.push(entry.0);
    }
    let mut n = 0;
    for subject in subjects {
        let key = subject
            .strip_prefix(&format!("$KV.{bucket}."))
            .unwrap_or(&subject)
            .to_string();
        if read_row(js, bucket, &key).await?.is_some() {
            n += 1;
        }
    }
    Ok(n)
}

/// Take and cancel of one request sent at once, `trials` times: exactly one wins each trial,
/// and what the broker holds agrees with the winner (taken: the row names the holder and the
/// request is still queued; cancelled: the row says so and the request is deleted).
async fn race(
    w: &mut World,
    ctx: Ctx,
    holder: &str,
    sender: &str,
    role: &str,
    trials: u64,
) -> StepResult {
    if trials == 0 || trials > MAX_TRIALS {
        return Err(Failure::could_not(format!("trials is 1 to {MAX_TRIALS}")));
    }
    let (holder_id, sender_id) = (principal_of(w, holder)?, principal_of(w, sender)?);
    let created = task_created(w).await?;
    let names = w.insp.names.clone();
    let (js, bucket) = (w.insp.js.clone(), names.anycast_bucket());
    let (h, s) = (online(w, holder)?, online(w, sender)?);
    let subject = s.names().anycast_subject(role, s.principal());
    let send_js = jetstream::new(s.client().clone());
    let (mut takes, mut cancels) = (0u64, 0u64);
    for trial in 0..trials {
        if ctx.left().is_zero() {
            return Err(Failure::new(
                format!("{trials} trials within the step's bound"),
                format!("{trial} run"),
            ));
        }
        let seq = send_js
            .publish(subject.clone(), "{\"parts\":[]}".into())
            .await
            .map_err(|e| Failure::could_not(format!("publish: {e}")))?
            .await
            .map_err(|e| Failure::could_not(format!("stored: {e}")))?
            .sequence;
        let (t, c) = tokio::join!(h.anycast_take(seq, &created, 1), s.anycast_cancel(seq));
        let row = read_row(&js, &bucket, &row_key(&created, seq))
            .await
            .map_err(Failure::could_not)?;
        let queued = js
            .get_stream_no_info(names.task_stream())
            .await
            .map_err(|e| Failure::could_not(e.to_string()))?
            .get_raw_message(seq)
            .await
            .is_ok();
        let seen = |t: &Result<Value, _>, c: &Result<Value, _>| {
            format!(
                "trial {trial} (seq {seq}): take {}, cancel {}, row {}, {}",
                outcome(t),
                outcome(c),
                row.as_ref()
                    .map(|r| r.to_string())
                    .unwrap_or("absent".into()),
                if queued { "still queued" } else { "deleted" }
            )
        };
        match (&t, &c) {
            (Ok(_), Err(_))
                if row.as_ref().is_some_and(|r| {
                    r["state"] == "taken" && r["holder"] == holder_id.as_str()
                }) && queued =>
            {
                takes += 1
            }
            (Err(_), Ok(_))
                if row.as_ref().is_some_and(|r| r["state"] == "cancelled") && !queued =>
            {
                cancels += 1
            }
            _ => {
                return Err(Failure::new(
                    format!(
                        "exactly one of {holder}'s take ({holder_id}) and {sender}'s cancel ({sender_id}) to win, as the broker holds it"
                    ),
                    seen(&t, &c),
                ))
            }
        }
    }
    // The split varies with scheduling: printed for the reader, never in the transcript.
    eprintln!("anycast_race: {takes} takes and {cancels} cancels won");
    Ok(format!(
        "{trials} take/cancel races of one request each: exactly one winner every time, as the broker holds it"
    ))
}

fn outcome(r: &Result<Value, cotal_delivery::agent::AgentError>) -> String {
    match r {
        Ok(v) => format!("answered {v}"),
        Err(e) => format!("refused ({})", e.detail()),
    }
}

/// DMs stored on `DM_<s>` for `recipient`, oldest first, each with its subject.
async fn dms_for(
    js: &jetstream::Context,
    names: &cotal_delivery::wire::SpaceNames,
    recipient: &cotal_delivery::wire::Principal,
) -> Result<Vec<Value>, String> {
    let filter = format!(
        "{}.inst.{}.{}.>",
        names.space().prefix(),
        recipient.owner(),
        recipient.actor()
    );
    let st = js
        .get_stream_no_info(names.dm_stream())
        .await
        .map_err(|e| format!("{}: {e}", names.dm_stream()))?;
    let c = st
        .create_consumer(pull::Config {
            filter_subject: filter,
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("a consumer of {}: {e}", names.dm_stream()))?;
    let pending = c.cached_info().num_pending as usize;
    let mut out = Vec::new();
    if pending == 0 {
        return Ok(out);
    }
    let mut msgs = c.messages().await.map_err(|e| format!("pull: {e}"))?;
    for _ in 0..pending {
        let m = match tokio::time::timeout(ROW_BOUND, msgs.next()).await {
            Ok(Some(Ok(m))) => m,
            other => return Err(format!("reading the DMs back: {other:?}")),
        };
        let mut v: Value = serde_json::from_slice(&m.payload).unwrap_or(Value::Null);
        v["subject"] = Value::String(m.subject.to_string());
        out.push(v);
    }
    Ok(out)
}

async fn expect_dms(
    w: &mut World,
    ctx: Ctx,
    to: &str,
    from: &str,
    count: u64,
    names: &[String],
) -> StepResult {
    let creds = w
        .daemon_creds
        .get(from)
        .ok_or_else(|| Failure::could_not(format!("no daemon {from:?} was started")))?;
    let daemon = World::holder_of_creds(creds)?;
    let to_id = principal_of(w, to)?;
    let named: Vec<String> = names
        .iter()
        .map(|n| principal_of(w, n))
        .collect::<Result<_, _>>()?;
    let what = format!(
        "{count} DM{} to {to} from daemon {from}'s own principal{}",
        if count == 1 { "" } else { "s" },
        if named.is_empty() {
            String::new()
        } else {
            format!(" naming {}", names.join(", then "))
        }
    );
    let judge = |dms: &[Value]| -> Result<(), String> {
        if dms.len() as u64 != count {
            return Err(format!("{} DMs: {dms:?}", dms.len()));
        }
        for (i, dm) in dms.iter().enumerate() {
            let subject = dm["subject"].as_str().unwrap_or_default();
            if dm["from"]["id"].as_str() != Some(daemon.as_str())
                || !subject.ends_with(&format!(".inst.{to_id}.{daemon}"))
            {
                return Err(format!("DM {i} not from {daemon}: {dm}"));
            }
            if let Some(holder) = named.get(i) {
                let text = dm["parts"][0]["text"].as_str().unwrap_or_default();
                if !text.contains(holder.as_str()) {
                    return Err(format!("DM {i} does not name {holder}: {dm}"));
                }
            }
        }
        Ok(())
    };
    let recipient = w
        .agents
        .get(to)
        .map(|a| a.material.principal.clone())
        .ok_or_else(|| Failure::could_not(format!("no agent {to:?}")))?;
    let (js, names) = (w.insp.js.clone(), w.insp.names.clone());
    poll(ctx, &what, || async {
        let dms = dms_for(&js, &names, &recipient).await?;
        judge(&dms)
    })
    .await?;
    // None more may follow at once (a repeated take or a resent notice would).
    tokio::time::sleep(DM_QUIET).await;
    let dms = dms_for(&js, &names, &recipient)
        .await
        .map_err(Failure::could_not)?;
    judge(&dms).map_err(|seen| Failure::new(format!("{what}, and no more"), seen))?;
    Ok(format!("the broker holds {what}"))
}
