//! Streams and consumers as the broker holds them: the fan-out writer's and the trusted
//! reader's durables and each agent's `dlv_` durable (pending, unacknowledged, delivered,
//! redelivered), the broker's pause of a durable, a stream's configuration changed under the
//! daemon (a refused delete, a message size cap), and the broker's own JetStream advisories.

use super::read::{consumer_refs, resolve};
use std::time::Duration;

use cotal_delivery::wire::SpaceNames;
use serde::Deserialize;
use serde_json::Value;

use super::read::consumer_info;
use super::verb::{poll, Ctx, Kind, Profiled, Refs};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::watch::AdvisoryWatch;
use crate::kit::world::World;

pub const VERBS: &[&str] = &[
    "expect_consumer",
    "drained",
    "pause_consumer",
    "resume_consumer",
    "stream_config",
    "watch_advisory",
    "expect_advisory",
];

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum StreamName {
    Chat,
    Inbox,
    Dlv,
    Members,
    Acl,
    /// The delivery bucket's stream, where the lease row lives.
    Lease,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StreamStep {
    ExpectConsumer {
        consumer: String,
        #[serde(default)]
        pending: Option<u64>,
        #[serde(default)]
        ack_pending: Option<u64>,
        #[serde(default)]
        delivered: Option<u64>,
        #[serde(default)]
        redelivered: Option<u64>,
        /// Deliveries so far, redeliveries included (the consumer's own sequence).
        #[serde(default)]
        deliveries: Option<u64>,
    },
    Drained {},
    PauseConsumer {
        consumer: String,
    },
    ResumeConsumer {
        consumer: String,
    },
    StreamConfig {
        stream: StreamName,
        #[serde(default)]
        deny_delete: Option<bool>,
        /// Bytes; `-1` lifts the cap.
        #[serde(default)]
        max_msg_size: Option<i32>,
    },
    WatchAdvisory {
        name: String,
        /// The advisory kind (`MSG_TERMINATED`, `MAX_DELIVERIES`, …).
        event: String,
        consumer: String,
    },
    ExpectAdvisory {
        name: String,
        count: usize,
        /// Fields the last advisory carries, with these values.
        #[serde(default)]
        fields: toml::Table,
    },
}

impl Profiled for StreamStep {}

impl StreamStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            StreamStep::ExpectConsumer { .. } | StreamStep::ExpectAdvisory { .. } => {
                Some(Duration::ZERO)
            }
            StreamStep::Drained {} => Some(Duration::from_secs(20)),
            _ => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            StreamStep::WatchAdvisory { name, consumer, .. } => {
                consumer_refs(consumer).creates(Kind::Advisory, name)
            }
            StreamStep::ExpectAdvisory { name, .. } => Refs::default().uses(Kind::Advisory, name),
            StreamStep::ExpectConsumer { consumer, .. }
            | StreamStep::PauseConsumer { consumer }
            | StreamStep::ResumeConsumer { consumer } => consumer_refs(consumer),
            StreamStep::Drained {} | StreamStep::StreamConfig { .. } => Refs::default(),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            StreamStep::ExpectConsumer {
                consumer,
                pending,
                ack_pending,
                delivered,
                redelivered,
                deliveries,
            } => {
                let (stream, name) = resolve(w, consumer)?;
                let insp = &w.insp;
                let want = (
                    *pending,
                    *ack_pending,
                    *delivered,
                    *redelivered,
                    *deliveries,
                );
                poll(ctx, &format!("consumer {consumer}'s state"), || async {
                    let c = consumer_info(insp, &stream, &name).await?;
                    let got = (
                        c.num_pending,
                        c.num_ack_pending as u64,
                        c.delivered.stream_sequence,
                        c.num_redelivered as u64,
                        c.delivered.consumer_sequence,
                    );
                    let ok = want.0.is_none_or(|n| n == got.0)
                        && want.1.is_none_or(|n| n == got.1)
                        && want.2.is_none_or(|n| n == got.2)
                        && want.3.is_none_or(|n| n == got.3)
                        && want.4.is_none_or(|n| n == got.4);
                    if ok {
                        Ok(())
                    } else {
                        Err(format!(
                            "pending {}, ack pending {}, delivered up to stream seq {}, redelivered {}, {} deliveries",
                            got.0, got.1, got.2, got.3, got.4
                        ))
                    }
                })
                .await?;
                let mut what = Vec::new();
                for (label, v) in [
                    ("pending", pending),
                    ("ack pending", ack_pending),
                    ("delivered up to stream seq", delivered),
                    ("redelivered", redelivered),
                ] {
                    if let Some(v) = v {
                        what.push(format!("{label} {v}"));
                    }
                }
                if let Some(v) = deliveries {
                    what.push(format!("{v} deliveries"));
                }
                Ok(format!("consumer {consumer}: {}", what.join(", ")))
            }
            StreamStep::Drained {} => {
                let insp = &w.insp;
                let names = insp.names.clone();
                poll(ctx, "the fan-out writer and the reader drained", || async {
                    let f = consumer_info(insp, &names.chat_stream(), "fanout").await?;
                    let r = consumer_info(insp, &names.inbox_stream(), "reader").await?;
                    if f.num_pending == 0
                        && f.num_ack_pending == 0
                        && r.num_pending == 0
                        && r.num_ack_pending == 0
                    {
                        Ok(())
                    } else {
                        Err(format!(
                            "fanout {} pending / {} unacked, reader {} pending / {} unacked",
                            f.num_pending, f.num_ack_pending, r.num_pending, r.num_ack_pending
                        ))
                    }
                })
                .await?;
                Ok("the fan-out writer and the reader have nothing pending".into())
            }
            StreamStep::PauseConsumer { consumer } | StreamStep::ResumeConsumer { consumer } => {
                let pause = matches!(self, StreamStep::PauseConsumer { .. });
                let (stream, name) = resolve(w, consumer)?;
                // A day ahead: far beyond any case; resumed explicitly.
                let body = if pause {
                    let until = std::time::SystemTime::now() + Duration::from_secs(86_400);
                    let secs = until
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    format!(r#"{{"pause_until":"{}"}}"#, rfc3339(secs))
                } else {
                    "{}".to_string()
                };
                let reply = w
                    .insp
                    .client
                    .request(
                        format!("$JS.API.CONSUMER.PAUSE.{stream}.{name}"),
                        body.into(),
                    )
                    .await
                    .map_err(|e| Failure::could_not(format!("pause {consumer}: {e}")))?;
                let answer: Value = serde_json::from_slice(&reply.payload)
                    .map_err(|e| Failure::could_not(format!("pause answer: {e}")))?;
                if answer["paused"] != Value::Bool(pause) {
                    return Err(Failure::new(
                        format!(
                            "the broker to {} {consumer}",
                            if pause { "pause" } else { "resume" }
                        ),
                        answer.to_string(),
                    ));
                }
                Ok(format!(
                    "the broker {} consumer {consumer}",
                    if pause { "pauses" } else { "resumes" }
                ))
            }
            StreamStep::StreamConfig {
                stream,
                deny_delete,
                max_msg_size,
            } => {
                let names = &w.insp.names;
                let name = match stream {
                    StreamName::Chat => names.chat_stream(),
                    StreamName::Inbox => names.inbox_stream(),
                    StreamName::Dlv => names.dlv_stream(),
                    StreamName::Members => SpaceNames::kv_stream(&names.members_bucket()),
                    StreamName::Acl => SpaceNames::kv_stream(&names.acl_bucket()),
                    StreamName::Lease => SpaceNames::kv_stream(&names.delivery_bucket()),
                };
                let mut s = w
                    .insp
                    .js
                    .get_stream(&name)
                    .await
                    .map_err(|e| Failure::could_not(format!("stream {name}: {e}")))?;
                let mut config = s
                    .info()
                    .await
                    .map_err(|e| Failure::could_not(format!("stream {name} info: {e}")))?
                    .config
                    .clone();
                let mut what = Vec::new();
                if let Some(d) = deny_delete {
                    config.deny_delete = *d;
                    what.push(format!("deny_delete {d}"));
                }
                if let Some(m) = max_msg_size {
                    config.max_message_size = *m;
                    what.push(format!("max_msg_size {m}"));
                }
                w.insp
                    .js
                    .update_stream(config)
                    .await
                    .map_err(|e| Failure::could_not(format!("update stream {name}: {e}")))?;
                Ok(format!("stream {stream:?}: {}", what.join(", ")))
            }
            StreamStep::WatchAdvisory {
                name,
                event,
                consumer,
            } => {
                let (stream, cname) = resolve(w, consumer)?;
                let subject = format!("$JS.EVENT.ADVISORY.CONSUMER.{event}.{stream}.{cname}");
                let sub = w
                    .insp
                    .client
                    .subscribe(subject)
                    .await
                    .map_err(|e| Failure::could_not(format!("subscribe advisories: {e}")))?;
                w.insp.sync().await?;
                w.advisories.insert(name.clone(), AdvisoryWatch::start(sub));
                Ok(format!(
                    "watch the broker's {event} advisories of {consumer} as {name}"
                ))
            }
            StreamStep::ExpectAdvisory {
                name,
                count,
                fields,
            } => {
                let seen = w
                    .advisories
                    .get(name)
                    .ok_or_else(|| Failure::could_not(format!("no advisory watch {name:?}")))?
                    .seen
                    .clone();
                let want: Vec<(String, Value)> = fields
                    .iter()
                    .map(|(k, v)| (k.clone(), super::verb::toml_to_json(v)))
                    .collect();
                poll(ctx, &format!("{count} advisories of {name}"), || async {
                    let s = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    if s.len() != *count {
                        return Err(format!("{} advisories: {s:?}", s.len()));
                    }
                    if let Some(last) = s.last() {
                        for (k, v) in &want {
                            if last.get(k) != Some(v) {
                                return Err(format!("the last advisory {last}"));
                            }
                        }
                    }
                    Ok(())
                })
                .await?;
                let f: Vec<String> = want.iter().map(|(k, v)| format!("{k} {v}")).collect();
                Ok(format!(
                    "{count} advisories of {name}{}",
                    if f.is_empty() {
                        String::new()
                    } else {
                        format!(", the last with {}", f.join(", "))
                    }
                ))
            }
        }
    }
}

/// `secs` since the epoch as an RFC 3339 UTC time.
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    /// Mutation seen failing: the month taken before the March shift (`m = mp + 1`).
    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1_796_212_800), "2026-12-02T12:00:00Z");
    }
}
