//! The checkpoint timer writer as a workflow and an operator meet it (docs/timer-writer.md): the
//! workflow writes a pause's authoritative status row and publishes its `.schedule` request;
//! the broker's own scheduler fires `.fire` at the deadline once the writer armed it; an
//! operator deletes the writer's durable (a writer fault) and sees it come back. Judged from
//! the broker: the `.fire` message the scheduler stored (stamped, with its `Nats-Scheduler`
//! header), the writer's durable `timerw_<s>` and the pull waiting on it.

use std::time::Duration;

use async_nats::HeaderMap;
use cotal_delivery::space::{status_key, ScheduleRequest, TimerStatus};
use serde::Deserialize;

use super::read::consumer_info;
use super::verb::{poll, Ctx, Kind, Profiled, Refs};
use crate::kit::expr::Duration as Expr;
use crate::kit::failure::{Failure, StepResult};
use crate::kit::holdings::TimerCoord;
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;

pub const VERBS: &[&str] = &[
    "arm_timer",
    "expect_fired",
    "delete_timer_durable",
    "expect_timer_durable",
    "expect_timer_pull",
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TimerStep {
    ArmTimer {
        /// The timer's id and its name for later steps.
        name: String,
        /// The pause's deadline, ms from now (an expression).
        deadline: Expr,
    },
    ExpectFired {
        timer: String,
    },
    DeleteTimerDurable {},
    ExpectTimerDurable {},
    ExpectTimerPull {},
}

impl Profiled for TimerStep {}

impl TimerStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            TimerStep::ExpectFired { .. } => Some(Duration::from_secs(15)),
            TimerStep::ExpectTimerDurable {} | TimerStep::ExpectTimerPull {} => {
                Some(Duration::from_secs(10))
            }
            _ => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            TimerStep::ArmTimer { name, .. } => Refs::default().creates(Kind::Timer, name),
            TimerStep::ExpectFired { timer } => Refs::default().uses(Kind::Timer, timer),
            _ => Refs::default(),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            TimerStep::ArmTimer { name, deadline } => {
                let ms = deadline.eval(&w.vars).map_err(Failure::could_not)?;
                let names = w.insp.names.clone();
                let t = TimerCoord {
                    base: format!("{}.ept.wf.i1.1.{name}", names.space().prefix()),
                    timer_id: name.clone(),
                    generation: 1,
                    deadline: now_ms() + ms as i64,
                };
                // The workflow's authoritative status row, which the writer reads leader-served.
                let status = serde_json::to_vec(&TimerStatus {
                    state: "waiting".into(),
                    generation: t.generation,
                    deadline: t.deadline,
                })
                .map_err(|e| Failure::could_not(e.to_string()))?;
                let key = status_key("wf", &t.timer_id);
                w.insp
                    .js
                    .publish(
                        format!("$KV.{}.{key}", names.records_bucket()),
                        status.into(),
                    )
                    .await
                    .map_err(|e| Failure::could_not(format!("publish the status: {e}")))?
                    .await
                    .map_err(|e| Failure::could_not(format!("the status stored: {e}")))?;
                let request = serde_json::to_vec(&ScheduleRequest {
                    v: 1,
                    timer_id: t.timer_id.clone(),
                    generation: t.generation,
                    deadline: t.deadline,
                    plane: Some("timer".into()),
                    phase: Some("schedule".into()),
                    space: Some(names.space().as_str().to_string()),
                })
                .map_err(|e| Failure::could_not(e.to_string()))?;
                w.insp
                    .js
                    .publish_with_headers(t.schedule(), HeaderMap::new(), request.into())
                    .await
                    .map_err(|e| Failure::could_not(format!("publish the request: {e}")))?
                    .await
                    .map_err(|e| Failure::could_not(format!("the request stored: {e}")))?;
                w.holdings.timers.insert(name.clone(), t);
                Ok(format!(
                    "a workflow pause {name} waits on its status row and publishes its .schedule request (deadline in {ms} ms)"
                ))
            }
            TimerStep::ExpectFired { timer } => {
                let t = w
                    .holdings
                    .timers
                    .get(timer)
                    .cloned()
                    .ok_or_else(|| Failure::could_not(format!("no timer {timer:?}")))?;
                let (js, stream) = (w.insp.js.clone(), w.insp.names.ept_stream());
                let (fire, armed) = (t.fire(), t.armed());
                let what = format!("the broker's scheduler to store {fire}, from {armed}");
                let fired_ms = poll(ctx, &what, || async {
                    let s = js
                        .get_stream_no_info(stream.clone())
                        .await
                        .map_err(|e| format!("{stream}: {e}"))?;
                    let m = s
                        .get_last_raw_message_by_subject(&fire)
                        .await
                        .map_err(|e| format!("no {fire} ({e})"))?;
                    let scheduler = m
                        .headers
                        .get("Nats-Scheduler")
                        .map(|v| v.as_str().to_string());
                    if scheduler.as_deref() != Some(armed.as_str()) {
                        return Err(format!("{fire} with Nats-Scheduler {scheduler:?}"));
                    }
                    Ok((m.time.unix_timestamp_nanos() / 1_000_000) as i64)
                })
                .await?;
                if fired_ms < t.deadline {
                    return Err(Failure::new(
                        format!("{fire} not before the deadline"),
                        format!("stored {} ms before it", t.deadline - fired_ms),
                    ));
                }
                // Timed at the broker's stamp of the `.fire` message.
                w.happened_at = Some(super::verb::instant_at_unix_ms(fired_ms)?);
                Ok(format!(
                    "the pause {timer} expires: the broker's scheduler stores its .fire from its .armed schedule, not before the deadline"
                ))
            }
            TimerStep::DeleteTimerDurable {} => {
                let names = w.insp.names.clone();
                let durable = names.timer_writer_durable();
                w.insp
                    .js
                    .get_stream_no_info(names.ept_req_stream())
                    .await
                    .map_err(|e| Failure::could_not(format!("{}: {e}", names.ept_req_stream())))?
                    .delete_consumer(&durable)
                    .await
                    .map_err(|e| Failure::could_not(format!("delete {durable}: {e}")))?;
                Ok("the operator deletes the timer writer's durable".to_string())
            }
            TimerStep::ExpectTimerDurable {} => {
                let names = w.insp.names.clone();
                let (stream, durable) = (names.ept_req_stream(), names.timer_writer_durable());
                let insp = &w.insp;
                poll(ctx, &format!("the broker to hold {durable}"), || async {
                    consumer_info(insp, &stream, &durable).await.map(|_| ())
                })
                .await?;
                Ok("the broker holds the timer writer's durable".to_string())
            }
            TimerStep::ExpectTimerPull {} => {
                let names = w.insp.names.clone();
                let (stream, durable) = (names.ept_req_stream(), names.timer_writer_durable());
                let insp = &w.insp;
                poll(ctx, &format!("a pull waiting on {durable}"), || async {
                    let info = consumer_info(insp, &stream, &durable).await?;
                    if info.num_waiting > 0 {
                        Ok(())
                    } else {
                        Err("no pull waiting".to_string())
                    }
                })
                .await?;
                Ok(
                    "the broker shows a pull of the timer writer waiting on its durable"
                        .to_string(),
                )
            }
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
