//! The daemon's rails as their callers meet them: any verb on `ctl.delivery` (as an agent, on
//! its own subject with the reply under its own subtree) or `ctl.delivery-admin` (as a
//! supervisor), the reply judged as it arrived, within a bound the case states: a refusal that
//! comes at once is not a refusal after the caller's timeout. A request can also be sent with its
//! reply target under another caller's subtree (a forged target, watched from that caller's own
//! connection, where nothing may arrive), repeated with a round number in its arguments, or with
//! a long generated list in one argument.

use super::call::{
    agent_of, answered, call, check, placeholder_agents, receive, Expect, Fill, Rail, MAX_GENERATED,
};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use super::verb::toml_to_json;
use super::verb::{Ctx, Kind, Profiled, Refs};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;

pub const VERBS: &[&str] = &["request"];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RailStep {
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
        fill: Option<Fill>,
        /// Sent this many times, one after the other, each reply judged; `{i}` in the
        /// arguments' strings stands for the round.
        #[serde(default)]
        repeat: Option<u64>,
        /// The reply target lies under this agent's own subtree of the rail (a forged target),
        /// watched from that agent's connection.
        #[serde(default)]
        reply_under: Option<String>,
        /// Nothing may arrive on the reply subject within the step's bound.
        #[serde(default)]
        silent: bool,
        #[serde(default)]
        ok: Option<bool>,
        /// The reply's `data`, exactly.
        #[serde(default)]
        answer: Option<toml::Value>,
        /// The reply's `data` has these fields with these values (objects: the keys given,
        /// recursively; arrays: as many elements, each matched in order).
        #[serde(default)]
        includes: Option<toml::Value>,
        /// The reply's `error` contains this text.
        #[serde(default)]
        error: Option<String>,
    },
}

/// Default bound of a request's answer: the reference agent's request timeout.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

impl Profiled for RailStep {
    fn wording(&self) -> Vec<&str> {
        match self {
            RailStep::Request { error: Some(e), .. } => vec![e.as_str()],
            _ => Vec::new(),
        }
    }
}

impl RailStep {
    pub fn default_within(&self) -> Option<Duration> {
        Some(ANSWER_WITHIN)
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        let RailStep::Request {
            caller,
            rail,
            args,
            reply_under,
            ..
        } = self;
        let mut refs = match rail {
            Rail::Delivery => Refs::default().uses_opt(Kind::Agent, caller.as_ref()),
            Rail::Admin => Refs::default(),
        };
        refs = refs.uses_opt(Kind::Agent, reply_under.as_ref());
        for name in args.iter().flat_map(placeholder_agents) {
            refs = refs.uses(Kind::Agent, &name);
        }
        refs
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        let RailStep::Request {
            rail,
            caller,
            op,
            args,
            raw,
            fill,
            repeat,
            reply_under,
            silent,
            ok,
            answer,
            includes,
            error,
        } = self;
        let rounds = repeat.unwrap_or(1);
        if rounds == 0 || rounds > MAX_GENERATED {
            return Err(Failure::could_not(format!(
                "repeat is 1 to {MAX_GENERATED}"
            )));
        }
        let judged = ok.is_some() || answer.is_some() || includes.is_some() || error.is_some();
        if *silent && judged {
            return Err(Failure::could_not(
                "a `silent` request expects no reply to judge",
            ));
        }
        let expect = Expect::new(w, ok, answer, includes, error)?;
        let mut last = Value::Null;
        let mut first_call = None;
        for round in 0..rounds {
            let round_no = repeat.map(|_| round);
            let c = call(
                w,
                *rail,
                caller.as_ref(),
                op.as_ref(),
                args.as_ref(),
                raw.as_ref(),
                fill.as_ref(),
                round_no,
            )
            .await?;
            // The reply target: the caller's own subtree, or a forged one under another
            // agent's, watched from that agent's connection.
            let (watcher, target) = match reply_under {
                Some(victim) => {
                    let a = agent_of(w, victim)?;
                    let watcher = a
                        .client
                        .as_ref()
                        .ok_or_else(|| Failure::could_not(format!("agent {victim} is offline")))?
                        .client()
                        .clone();
                    let subject = w
                        .insp
                        .names
                        .ctl_subject(rail.service(), &a.material.principal);
                    (watcher, subject)
                }
                None => (c.client.clone(), c.subject.clone()),
            };
            let target = format!("{target}.reply.{}", uuid::Uuid::new_v4().simple());
            let (sent, bound) = (Instant::now(), ctx.left());
            let got = receive(&c.client, &watcher, &c.subject, &target, c.body, bound).await?;
            match (got, *silent) {
                (None, true) => {}
                (Some(m), true) => {
                    return Err(Failure::new(
                        format!("nothing on {target}"),
                        format!(
                            "{}{}",
                            String::from_utf8_lossy(&m.payload),
                            m.status
                                .map(|s| format!(" (status {s})"))
                                .unwrap_or_default()
                        ),
                    ))
                }
                (got, false) => {
                    let reply = answered(got, bound, sent)?;
                    check(&reply, &expect)?;
                    last = reply;
                }
            }
            first_call.get_or_insert((c.who, c.what));
        }
        let (who, what) = first_call.unwrap_or_default();
        let times = match repeat {
            Some(n) => format!(" {n} times"),
            None => String::new(),
        };
        let target = match reply_under {
            Some(v) => format!(" with its reply target under {v}'s subtree"),
            None => String::new(),
        };
        let verdict = match (silent, ok, answer, includes, error) {
            (true, ..) => "nothing arrives".to_string(),
            (_, _, _, _, Some(e)) => format!("refused: {e:?}"),
            (_, _, Some(_), _, _) => format!(
                "answered {}",
                last.get("data").cloned().unwrap_or(Value::Null)
            ),
            (_, _, _, Some(i), _) => format!("answered, including {}", toml_to_json(i)),
            (_, Some(true), ..) => "answered ok".to_string(),
            (_, Some(false), ..) => "refused".to_string(),
            _ => "answered".to_string(),
        };
        Ok(format!(
            "{who} sends {what} on {}{target}{times}: {verdict}",
            rail.name()
        ))
    }
}
