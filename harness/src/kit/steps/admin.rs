//! The admin rail as a manager meets it, and what the broker shows of it: requests sent without
//! waiting (so several are in flight at once, each reply kept with the order it arrived in), the
//! connections the broker lists for a principal (`/connz`), one-shot connections that stay gone
//! once kicked (a retired seat whose credential the manager's deny-new revoked), the `$SYS`
//! CONNZ answers an eviction sweep drew (counted by a watcher with the space's own observer
//! credential), and the member rows a lifecycle holds on the broker.

use std::time::{Duration, Instant};

use cotal_delivery::wire::MEMBERSHIP_OBSERVER_INBOX_PREFIX;
use serde::Deserialize;
use serde_json::Value;

use super::call::{call, check, parse_reply, Expect, Fill, Rail};
use super::verb::toml_to_json;
use super::verb::{poll, Ctx, Kind, Profiled, Refs};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::watch::{Collector, Sent};
use crate::kit::world::World;
use crate::rig::connz::ConnState;

pub const VERBS: &[&str] = &[
    "send",
    "expect_reply",
    "reply_order",
    "connect_once",
    "expect_connz",
    "expect_named_connections",
    "watch_sweeps",
    "expect_sweeps",
    "expect_member_rows",
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum AdminStep {
    Send {
        name: String,
        rail: Rail,
        #[serde(default, rename = "as")]
        caller: Option<String>,
        #[serde(default)]
        op: Option<String>,
        #[serde(default)]
        args: Option<toml::Value>,
        #[serde(default)]
        raw: Option<String>,
        #[serde(default)]
        fill: Option<Fill>,
    },
    ExpectReply {
        name: String,
        /// Not answered so far (checked at once).
        #[serde(default)]
        pending: bool,
        #[serde(default)]
        ok: Option<bool>,
        #[serde(default)]
        answer: Option<toml::Value>,
        #[serde(default)]
        includes: Option<toml::Value>,
        #[serde(default)]
        error: Option<String>,
    },
    ReplyOrder {
        /// Sent requests whose replies arrived in exactly this order.
        names: Vec<String>,
    },
    ConnectOnce {
        agent: String,
    },
    ExpectConnz {
        agent: String,
        count: usize,
    },
    /// The connections the broker lists, open or closed, whose client name is `name`, on every
    /// node: exactly `count` (waits with `within`). A name is this distribution's own: a
    /// distribution step.
    ExpectNamedConnections {
        name: String,
        count: usize,
    },
    WatchSweeps {
        name: String,
    },
    ExpectSweeps {
        name: String,
        answers: usize,
    },
    ExpectMemberRows {
        agent: String,
        /// Exactly these channels.
        #[serde(default)]
        channels: Option<Vec<String>>,
        /// Exactly this many rows.
        #[serde(default)]
        count: Option<usize>,
    },
}

/// Default bound of a reply awaited by `expect_reply`: the reference agent's request timeout.
const REPLY_WITHIN: Duration = Duration::from_secs(5);
/// How long `expect_sweeps` watches for one more answer once the count is reached.
const SWEEPS_QUIET: Duration = Duration::from_millis(500);

impl Profiled for AdminStep {
    fn wording(&self) -> Vec<&str> {
        match self {
            AdminStep::ExpectReply { error: Some(e), .. } => vec![e.as_str()],
            _ => Vec::new(),
        }
    }

    fn distribution_only(&self) -> Option<&'static str> {
        match self {
            AdminStep::ExpectNamedConnections { .. } => {
                Some("a connection's client name is this distribution's own")
            }
            _ => None,
        }
    }
}

impl AdminStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            AdminStep::ExpectReply { pending: false, .. } => Some(REPLY_WITHIN),
            AdminStep::ExpectConnz { .. }
            | AdminStep::ExpectSweeps { .. }
            | AdminStep::ExpectNamedConnections { .. } => Some(REPLY_WITHIN),
            AdminStep::ExpectMemberRows { .. } => Some(Duration::ZERO),
            _ => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            AdminStep::Send {
                name,
                rail,
                caller,
                args,
                ..
            } => {
                let mut refs = Refs::default().creates(Kind::Request, name);
                if *rail == Rail::Delivery {
                    refs = refs.uses_opt(Kind::Agent, caller.as_ref());
                }
                for a in args.iter().flat_map(super::call::placeholder_agents) {
                    refs = refs.uses(Kind::Agent, &a);
                }
                refs
            }
            AdminStep::ExpectReply { name, .. } => Refs::default().uses(Kind::Request, name),
            AdminStep::ReplyOrder { names } => names
                .iter()
                .fold(Refs::default(), |r, n| r.uses(Kind::Request, n)),
            AdminStep::ConnectOnce { agent }
            | AdminStep::ExpectConnz { agent, .. }
            | AdminStep::ExpectMemberRows { agent, .. } => Refs::default().uses(Kind::Agent, agent),
            AdminStep::ExpectNamedConnections { .. } => Refs::default(),
            AdminStep::WatchSweeps { name } => Refs::default().creates(Kind::Sweeps, name),
            AdminStep::ExpectSweeps { name, .. } => Refs::default().uses(Kind::Sweeps, name),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            AdminStep::Send {
                name,
                rail,
                caller,
                op,
                args,
                raw,
                fill,
            } => {
                let c = call(
                    w,
                    *rail,
                    caller.as_ref(),
                    op.as_ref(),
                    args.as_ref(),
                    raw.as_ref(),
                    fill.as_ref(),
                    None,
                )
                .await?;
                if !w.admin.collectors.contains_key(&c.subject) {
                    let sub = c
                        .client
                        .subscribe(format!("{}.reply.>", c.subject))
                        .await
                        .map_err(|e| Failure::could_not(format!("subscribe the replies: {e}")))?;
                    c.client
                        .flush()
                        .await
                        .map_err(|e| Failure::could_not(format!("flush: {e}")))?;
                    w.admin
                        .collectors
                        .insert(c.subject.clone(), Collector::start(sub));
                }
                let reply = format!("{}.reply.{}", c.subject, uuid::Uuid::new_v4().simple());
                c.client
                    .publish_with_reply(c.subject.clone(), reply.clone(), c.body.into())
                    .await
                    .map_err(|e| Failure::could_not(format!("publish {}: {e}", c.subject)))?;
                // On the wire before the next step: requests sent one after another reach the
                // broker in that order.
                c.client
                    .flush()
                    .await
                    .map_err(|e| Failure::could_not(format!("flush: {e}")))?;
                w.admin.sent.insert(
                    name.clone(),
                    Sent {
                        collector: c.subject,
                        reply,
                        at: Instant::now(),
                    },
                );
                Ok(format!(
                    "{} sends {} on {} as request {name}, not waiting for its reply",
                    c.who,
                    c.what,
                    rail.name()
                ))
            }
            AdminStep::ExpectReply {
                name,
                pending,
                ok,
                answer,
                includes,
                error,
            } => {
                let (sent, collector) = w.admin.sent(name)?;
                if *pending {
                    if ok.is_some() || answer.is_some() || includes.is_some() || error.is_some() {
                        return Err(Failure::could_not(
                            "a `pending` reply has nothing to judge yet",
                        ));
                    }
                    return match collector.reply(&sent.reply) {
                        None => Ok(format!("request {name} is not answered so far")),
                        Some((_, a)) => Err(Failure::new(
                            format!("request {name} not answered yet"),
                            String::from_utf8_lossy(&a.payload).into_owned(),
                        )),
                    };
                }
                let (reply, at) = (sent.reply.clone(), sent.at);
                let expect = Expect::new(w, ok, answer, includes, error)?;
                let arrival = poll(ctx, &format!("request {name}'s reply"), || async {
                    collector
                        .reply(&reply)
                        .map(|(_, a)| a)
                        .ok_or_else(|| "no reply".to_string())
                })
                .await?;
                if arrival.no_responders {
                    return Err(Failure::new(
                        format!("request {name} answered"),
                        "no responders (no daemon serves the rail)",
                    ));
                }
                let v = parse_reply(&arrival.payload, at)?;
                check(&v, &expect)?;
                let verdict = match (ok, answer, includes, error) {
                    (_, _, _, Some(e)) => format!("refused: {e:?}"),
                    (_, Some(_), _, _) => {
                        format!("answered {}", v.get("data").cloned().unwrap_or(Value::Null))
                    }
                    (_, _, Some(i), _) => format!("answered, including {}", toml_to_json(i)),
                    (Some(false), ..) => "refused".to_string(),
                    _ => "answered".to_string(),
                };
                Ok(format!("request {name} is {verdict}"))
            }
            AdminStep::ReplyOrder { names } => {
                let mut places = Vec::with_capacity(names.len());
                for n in names {
                    let (sent, collector) = w.admin.sent(n)?;
                    if places
                        .first()
                        .is_some_and(|(c, _): &(String, usize)| *c != sent.collector)
                    {
                        return Err(Failure::could_not(
                            "replies are ordered only among one caller's requests on one rail",
                        ));
                    }
                    let (i, _) = collector.reply(&sent.reply).ok_or_else(|| {
                        Failure::new(format!("request {n} answered"), "no reply yet")
                    })?;
                    places.push((sent.collector.clone(), i));
                }
                let order: Vec<usize> = places.iter().map(|(_, i)| *i).collect();
                if order.windows(2).any(|p| p[0] >= p[1]) {
                    let mut got: Vec<(usize, &String)> = order.iter().copied().zip(names).collect();
                    got.sort();
                    return Err(Failure::new(
                        format!("the replies in the order {names:?}"),
                        format!("{:?}", got.into_iter().map(|(_, n)| n).collect::<Vec<_>>()),
                    ));
                }
                Ok(format!(
                    "the replies arrived in the order {}",
                    names.join(", ")
                ))
            }
            AdminStep::ConnectOnce { agent } => {
                let a = w.agent(agent)?;
                let cred = a.material.credential.clone();
                let client = w.mesh.connect(&cred, &format!("once-{agent}")).await?;
                w.admin.once.insert(agent.clone(), client);
                Ok(format!(
                    "a one-shot connection of {agent}'s credential (it never redials once closed)"
                ))
            }
            AdminStep::ExpectNamedConnections { name, count } => {
                let mesh = &w.mesh;
                let got = poll(
                    ctx,
                    &format!("the broker to list {count} connection(s) named {name}"),
                    || async {
                        let n = super::read::count_connections(mesh, |c| c.name == *name).await?;
                        if n == *count {
                            Ok(n)
                        } else {
                            Err(format!("{n} connection(s) named {name}"))
                        }
                    },
                )
                .await?;
                Ok(format!(
                    "the broker lists {got} connection(s) named {name}, open or closed"
                ))
            }
            AdminStep::ExpectConnz { agent, count } => {
                let principal = w.agent(agent)?.material.principal.dot_form();
                let mesh = &w.mesh;
                let got = poll(
                    ctx,
                    &format!("the broker to list {count} connections of {principal}"),
                    || async {
                        let mut n = 0;
                        for i in 0..mesh.node_count() {
                            if let Some(node) = mesh.node(i) {
                                let rows = node
                                    .connz(ConnState::Open)
                                    .await
                                    .map_err(|e| format!("/connz: {e}"))?;
                                n += rows.iter().filter(|c| c.is_principal(&principal)).count();
                            }
                        }
                        if n == *count {
                            Ok(n)
                        } else {
                            Err(format!("{n} connections"))
                        }
                    },
                )
                .await?;
                Ok(format!(
                    "the broker lists {got} open connection{} of {agent} (/connz)",
                    if got == 1 { "" } else { "s" }
                ))
            }
            AdminStep::WatchSweeps { name } => {
                let path = w
                    .mesh
                    .workspace()
                    .membership_observer_creds_path(w.mesh.space());
                let observer = cotal_delivery::base::read_creds_file(&path).map_err(|e| {
                    Failure::could_not(format!("read the $SYS observer credential: {e}"))
                })?;
                let client = cotal_delivery::base::connect_with_inbox(
                    &w.mesh.url(),
                    w.mesh.tls_ca().as_deref(),
                    &observer,
                    "harness-sweep-watcher",
                    MEMBERSHIP_OBSERVER_INBOX_PREFIX,
                    Duration::from_secs(5),
                )
                .await
                .map_err(|e| Failure::could_not(format!("connect the watcher: {e}")))?;
                // Eviction sweeps answer under `.evict.`; the membership feed's own sweeps under
                // the same prefix are not counted.
                let sub = client
                    .subscribe(format!("{MEMBERSHIP_OBSERVER_INBOX_PREFIX}.evict.>"))
                    .await
                    .map_err(|e| Failure::could_not(format!("subscribe: {e}")))?;
                client
                    .flush()
                    .await
                    .map_err(|e| Failure::could_not(format!("flush: {e}")))?;
                let collector = Collector::start(sub);
                // The watcher's connection lives as long as its subscription's task needs it.
                w.admin.once.insert(format!("sweeps:{name}"), client);
                w.admin.sweeps.insert(name.clone(), collector);
                Ok(format!(
                    "watch {name}: the $SYS CONNZ answers of eviction sweeps, counted with the space's observer credential"
                ))
            }
            AdminStep::ExpectSweeps { name, answers } => {
                let c = w
                    .admin
                    .sweeps
                    .get(name)
                    .ok_or_else(|| Failure::could_not(format!("no watch {name:?}")))?;
                poll(ctx, &format!("{answers} CONNZ answers"), || async {
                    let n = c.snapshot().len();
                    if n >= *answers {
                        Ok(())
                    } else {
                        Err(format!("{n} answers"))
                    }
                })
                .await?;
                tokio::time::sleep(SWEEPS_QUIET).await;
                let n = c.snapshot().len();
                if n != *answers {
                    return Err(Failure::new(
                        format!("exactly {answers} CONNZ answers"),
                        format!("{n}"),
                    ));
                }
                Ok(format!(
                    "{name} counted exactly {answers} CONNZ answer{} to eviction sweeps",
                    if *answers == 1 { "" } else { "s" }
                ))
            }
            AdminStep::ExpectMemberRows {
                agent,
                channels,
                count,
            } => {
                if channels.is_some() == count.is_some() {
                    return Err(Failure::could_not(
                        "`expect_member_rows` takes `channels` or `count`, one of them",
                    ));
                }
                let a = w.agent(agent)?;
                let suffix = format!(
                    "/{}.{}",
                    a.material.principal.dot_form(),
                    a.material.lifecycle_uid
                );
                let insp = &w.insp;
                let bucket = insp.names.members_bucket();
                let mut want = channels.clone();
                if let Some(w) = want.as_mut() {
                    w.sort();
                }
                let got = poll(
                    ctx,
                    &format!("{agent}'s member rows on the broker"),
                    || async {
                        let keys = cotal_delivery::base::keys(
                            &insp.js,
                            &bucket,
                            ">",
                            Duration::from_secs(5),
                        )
                        .await
                        .map_err(|e| format!("list the members bucket: {e}"))?;
                        let mut have = Vec::new();
                        for k in keys.iter().filter(|k| k.ends_with(&suffix)) {
                            if let Some(row) = super::read::read_row(&insp.js, &bucket, k).await? {
                                have.push(row["channel"].as_str().unwrap_or_default().to_string());
                            }
                        }
                        have.sort();
                        let matches = match (&want, count) {
                            (Some(w), _) => have == *w,
                            (None, Some(n)) => have.len() == *n,
                            (None, None) => false,
                        };
                        if matches {
                            Ok(have)
                        } else {
                            Err(format!("{} rows, of {have:?}", have.len()))
                        }
                    },
                )
                .await?;
                Ok(if got.is_empty() {
                    format!("the broker holds no member row of {agent}'s lifecycle")
                } else if count.is_some() {
                    format!(
                        "the broker holds {} member rows of {agent}'s lifecycle",
                        got.len()
                    )
                } else {
                    format!(
                        "the broker holds {agent}'s member rows of exactly [{}]",
                        got.join(", ")
                    )
                })
            }
        }
    }
}
