//! Time as the timed families meet it: a host that starves the daemon in cycles until it exits
//! (stall credit against a backstop no credit defers), a credential's own clock (its JWT's
//! `iat` and `exp` as events a bound is measured from), start-up complete as the broker shows
//! it, an earlier event judged against another, and lines that must not follow a verdict.

use super::verb::instant_at_unix_ms;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::verb::Which;
use super::verb::{poll, Ctx, Kind, Profiled, Refs, DEFAULT_WITHIN};
use crate::kit::expr;
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;
use crate::rig::connz::ConnState;

pub const VERBS: &[&str] = &[
    "starve",
    "credential_time",
    "expect_started",
    "expect_event",
    "no_line_after",
];

/// Which instant of a credential's JWT.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum JwtTime {
    Iat,
    Exp,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TimedStep {
    Starve {
        daemon: String,
        /// How long each freeze lasts (ms, or an expression of the case's variables).
        frozen: expr::Duration,
        /// How long the daemon runs between two freezes.
        awake: expr::Duration,
    },
    CredentialTime {
        event: String,
        of: Which,
        at: JwtTime,
    },
    ExpectStarted {},
    ExpectEvent {
        event: String,
    },
    NoLineAfter {
        daemon: String,
        after: String,
        contains: String,
    },
}

/// The connection this distribution's checkpoint timer writer dials once start-up is complete
/// (after the lease watch is bound and the membership feed's two connections are up).
const TIMER_WRITER_CONNECTION: &str = "cotal-delivery-timer-writer";

impl Profiled for TimedStep {
    fn wording(&self) -> Vec<&str> {
        match self {
            TimedStep::NoLineAfter {
                after, contains, ..
            } => vec![after.as_str(), contains.as_str()],
            _ => Vec::new(),
        }
    }
}

impl TimedStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            TimedStep::Starve { .. } | TimedStep::ExpectStarted {} => Some(DEFAULT_WITHIN),
            // Judged at the event's instant: a bound is a check, not a wait.
            TimedStep::ExpectEvent { .. } => Some(Duration::ZERO),
            _ => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            TimedStep::Starve { daemon, .. } | TimedStep::NoLineAfter { daemon, .. } => {
                Refs::default().uses(Kind::Daemon, daemon)
            }
            TimedStep::CredentialTime { event, .. } => Refs::default().creates(Kind::Event, event),
            TimedStep::ExpectEvent { event } => Refs::default().uses(Kind::Event, event),
            TimedStep::ExpectStarted {} => Refs::default(),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            TimedStep::Starve {
                daemon,
                frozen,
                awake,
            } => starve(w, ctx, daemon, frozen, awake).await,
            TimedStep::CredentialTime { event, of, at } => {
                let cred = match of {
                    Which::Original => w.remints.original.clone(),
                    Which::Latest => w.remints.written.last().cloned(),
                }
                .ok_or_else(|| Failure::could_not(format!("no {of:?} credential")))?;
                let claims = cred
                    .claims()
                    .map_err(|e| Failure::could_not(format!("read the JWT: {e}")))?;
                let secs = match at {
                    JwtTime::Iat => claims.iat,
                    JwtTime::Exp => claims.exp.ok_or_else(|| {
                        Failure::could_not("the credential never expires: it has no exp")
                    })?,
                };
                let instant = instant_at_unix_ms(secs.saturating_mul(1000))?;
                w.marks.insert(event.clone(), instant);
                Ok(format!(
                    "event {event}: the {} credential's {}",
                    match of {
                        Which::Original => "original",
                        Which::Latest => "reminted",
                    },
                    match at {
                        JwtTime::Iat => "issue time (iat)",
                        JwtTime::Exp => "expiry (exp)",
                    }
                ))
            }
            TimedStep::ExpectStarted {} => {
                // Any implementation: its lease watch bound (a push consumer on the lease
                // bucket's stream). This distribution's daemon also dials its timer writer
                // once start-up is complete, after the membership feed: that connection proves
                // the daemon itself saw the bind's answer, which the consumer alone does not.
                let own = !matches!(w.opts.daemon, DaemonUnderTest::Cmd(_));
                let stream_name =
                    cotal_delivery::wire::SpaceNames::kv_stream(&w.insp.names.delivery_bucket());
                let (js, broker) = (&w.insp.js, &w.mesh.broker);
                poll(ctx, "the daemon's start-up to complete", || async {
                    let mut stream = js
                        .get_stream(&stream_name)
                        .await
                        .map_err(|e| format!("the lease bucket's stream: {e}"))?;
                    let info = stream
                        .info()
                        .await
                        .map_err(|e| format!("the lease bucket's stream: {e}"))?;
                    if info.state.consumer_count == 0 {
                        return Err("no consumer watches the lease bucket".to_string());
                    }
                    let mut bound = false;
                    let mut consumers = stream.consumers();
                    while let Some(c) = futures::StreamExt::next(&mut consumers).await {
                        bound |= c.map_err(|e| e.to_string())?.push_bound;
                    }
                    if !bound {
                        return Err("the lease bucket's watch consumer is not bound".to_string());
                    }
                    if own
                        && broker
                            .connz_named(ConnState::Open, TIMER_WRITER_CONNECTION)
                            .await
                            .map_err(|e| e.to_string())?
                            .is_empty()
                    {
                        return Err("the broker holds no timer writer connection".to_string());
                    }
                    Ok(())
                })
                .await?;
                Ok(
                    "the daemon's start-up is complete (its lease watch bound on the broker)"
                        .into(),
                )
            }
            TimedStep::ExpectEvent { event } => {
                let at = *w
                    .marks
                    .get(event)
                    .ok_or_else(|| Failure::could_not(format!("no event {event:?} happened")))?;
                w.happened_at = Some(at);
                Ok(format!("event {event}"))
            }
            TimedStep::NoLineAfter {
                daemon,
                after,
                contains,
            } => {
                let lines = w.daemon(daemon)?.lines();
                let from = lines
                    .iter()
                    .position(|l| l.contains(after.as_str()))
                    .ok_or_else(|| {
                        Failure::new(
                            format!("a line of daemon {daemon} containing {after:?}"),
                            "none",
                        )
                    })?;
                if let Some(l) = lines[from + 1..]
                    .iter()
                    .find(|l| l.contains(contains.as_str()))
                {
                    return Err(Failure::new(
                        format!("no line containing {contains:?} after {after:?}"),
                        l.clone(),
                    ));
                }
                Ok(format!(
                    "daemon {daemon} printed nothing containing {contains:?} after {after:?}"
                ))
            }
        }
    }
}

/// SIGSTOP, `frozen`, SIGCONT, `awake`, over and over until the daemon exits; the step ends at
/// the exit. A daemon the bound leaves running is thawed before the failure.
async fn starve(
    w: &mut World,
    ctx: Ctx,
    daemon: &str,
    frozen: &expr::Duration,
    awake: &expr::Duration,
) -> StepResult {
    let frozen = Duration::from_millis(frozen.eval(&w.vars).map_err(Failure::could_not)?);
    let awake = Duration::from_millis(awake.eval(&w.vars).map_err(Failure::could_not)?);
    if frozen.is_zero() || awake.is_zero() {
        return Err(Failure::could_not(
            "`frozen` and `awake` are both longer than 0 ms",
        ));
    }
    let d = w.daemon(daemon)?;
    loop {
        if d.freeze().is_err() {
            // It exited between two cycles: the signal found no process to stop.
            let status = d.wait_exit(ctx.left()).await.map_err(Failure::from)?;
            return Ok(exited(daemon, frozen, awake, status));
        }
        tokio::time::sleep(frozen).await;
        if let Err(e) = d.thaw() {
            // The stop reached a process already exiting (it decided to at the end of its
            // last awake spell): there is nothing to thaw, and its exit is the answer.
            if d.is_running() {
                return Err(Failure::could_not(format!("thaw daemon {daemon}: {e}")));
            }
            let status = d.wait_exit(ctx.left()).await.map_err(Failure::from)?;
            return Ok(exited(daemon, frozen, awake, status));
        }
        if let Ok(status) = d.wait_exit(awake).await {
            return Ok(exited(daemon, frozen, awake, status));
        }
        if Instant::now() >= ctx.deadline {
            return Err(Failure::new(
                format!(
                    "daemon {daemon} to exit while starved within {} ms",
                    ctx.deadline
                        .saturating_duration_since(ctx.started)
                        .as_millis()
                ),
                "it is still running",
            ));
        }
    }
}

fn exited(
    daemon: &str,
    frozen: Duration,
    awake: Duration,
    status: std::process::ExitStatus,
) -> String {
    format!(
        "daemon {daemon} starved (frozen {} ms, awake {} ms, over and over) until it exited ({})",
        frozen.as_millis(),
        awake.as_millis(),
        status
            .code()
            .map(|c| format!("code {c}"))
            .unwrap_or_else(|| status.to_string())
    )
}
