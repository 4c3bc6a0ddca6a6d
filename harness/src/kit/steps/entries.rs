//! An agent's store entries and how the daemon settles them, as the broker and the wire show
//! it: entries an operator deletes from `INBOX_<s>` behind the reader's back, a durable deleted
//! so the next reader starts from a fresh cursor, the JetStream settlements (`+ACK`, `-NAK`,
//! `+TERM`…) the daemon sent among the bytes a proxy holds, and the daemon's watch of its lease
//! row bound on the broker (the readiness a hold needs before it may keep a connection's bytes)
//! or, as the broker lists them, the consumers the watches of the row leave on the lease bucket.

use std::time::Duration;

use async_nats::jetstream::stream::LastRawMessageErrorKind;
use cotal_delivery::wire::SpaceNames;
use futures::StreamExt;
use serde::Deserialize;

use super::read::{consumer_refs, resolve};
use super::verb::{poll, Ctx, Kind, Profiled, Refs, DEFAULT_WITHIN};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;

pub const VERBS: &[&str] = &[
    "delete_entries",
    "delete_consumer",
    "expect_settlements",
    "lease_watched",
    "lease_watches",
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum EntryStep {
    DeleteEntries {
        agent: String,
        /// How many entries the broker must hold on the agent's INBOX subject (all deleted).
        count: u64,
    },
    DeleteConsumer {
        consumer: String,
    },
    ExpectSettlements {
        proxy: String,
        /// Only the held bytes before the first occurrence of this text (which must be held).
        #[serde(default)]
        before: Option<String>,
        /// The settlements expected, in order (`[]`: none).
        settlements: Vec<String>,
    },
    LeaseWatched {
        /// How many bound watches of the row to wait for (default 1): a holder's own and a
        /// standby's are two.
        #[serde(default)]
        count: Option<usize>,
    },
    LeaseWatches {
        /// How many consumers the lease bucket holds, bound or not.
        count: usize,
        /// How many of them have their interest bound on the broker (a push subscription the
        /// broker knows, or a pull waiting): `0` for watches whose connection closed.
        #[serde(default)]
        bound: Option<usize>,
        /// Every one's inactivity threshold (ms) as the broker reports it in the consumer's
        /// info: how long after its interest went the broker reclaims it.
        #[serde(default)]
        inactive_threshold: Option<u64>,
    },
}

/// One consumer of the lease bucket as the broker lists it: its name, whether its interest is
/// bound, its inactivity threshold.
#[derive(Debug)]
struct Watch {
    name: String,
    bound: bool,
    inactive_threshold: Duration,
}

/// Whether the lease bucket's consumers are `count`, `bound` of them bound, each with that
/// inactivity threshold (ms); else what the broker holds instead.
fn judge_watches(
    seen: &[Watch],
    count: usize,
    bound: Option<usize>,
    inactive_threshold: Option<u64>,
) -> Result<(), String> {
    let bound_now = seen.iter().filter(|w| w.bound).count();
    let held = |seen: &[Watch]| {
        let each: Vec<String> = seen
            .iter()
            .map(|w| {
                format!(
                    "{} ({}, inactivity threshold {} ms)",
                    w.name,
                    if w.bound { "bound" } else { "unbound" },
                    w.inactive_threshold.as_millis()
                )
            })
            .collect();
        format!("{} consumer(s), {bound_now} bound: {each:?}", seen.len())
    };
    if seen.len() != count || bound.is_some_and(|b| b != bound_now) {
        return Err(held(seen));
    }
    if let Some(ms) = inactive_threshold {
        if seen
            .iter()
            .any(|w| w.inactive_threshold != Duration::from_millis(ms))
        {
            return Err(held(seen));
        }
    }
    Ok(())
}

/// Most entries one `delete_entries` deletes.
const DELETE_MAX: u64 = 10_000;

impl Profiled for EntryStep {}

impl EntryStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            EntryStep::LeaseWatched { .. } | EntryStep::LeaseWatches { .. } => Some(DEFAULT_WITHIN),
            _ => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            EntryStep::DeleteEntries { agent, .. } => Refs::default().uses(Kind::Agent, agent),
            EntryStep::DeleteConsumer { consumer } => consumer_refs(consumer),
            EntryStep::ExpectSettlements { proxy, .. } => Refs::default().uses(Kind::Proxy, proxy),
            EntryStep::LeaseWatched { .. } | EntryStep::LeaseWatches { .. } => Refs::default(),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            EntryStep::DeleteEntries { agent, count } => {
                if *count > DELETE_MAX {
                    return Err(Failure::could_not(format!("count above {DELETE_MAX}")));
                }
                let a = w.agent(agent)?;
                let (p, u) = (
                    a.material.principal.clone(),
                    a.material.lifecycle_uid.clone(),
                );
                let names = &w.insp.names;
                let (stream_name, subject) = (names.inbox_stream(), names.dinbox_subject(&p, &u));
                let stream = w
                    .insp
                    .js
                    .get_stream_no_info(&stream_name)
                    .await
                    .map_err(|e| Failure::could_not(format!("stream {stream_name}: {e}")))?;
                // Newest first, one at a time, until the subject holds none: one more look than
                // the count expected, so an extra entry is seen and reported.
                let mut deleted = 0u64;
                while deleted <= *count {
                    let seq = match stream.get_last_raw_message_by_subject(&subject).await {
                        Ok(m) => m.sequence,
                        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => break,
                        Err(e) => {
                            return Err(Failure::could_not(format!("read {subject}: {e}")));
                        }
                    };
                    let gone = stream
                        .delete_message(seq)
                        .await
                        .map_err(|e| Failure::could_not(format!("delete seq {seq}: {e}")))?;
                    if !gone {
                        return Err(Failure::could_not(format!(
                            "the broker did not delete seq {seq}"
                        )));
                    }
                    deleted += 1;
                }
                if deleted != *count {
                    return Err(Failure::new(
                        format!("{count} entries of {agent} in INBOX to delete"),
                        format!("{deleted} (at least)"),
                    ));
                }
                Ok(format!(
                    "an operator deletes {agent}'s {count} INBOX entries from the stream"
                ))
            }
            EntryStep::DeleteConsumer { consumer } => {
                let (stream, name) = resolve(w, consumer)?;
                w.insp
                    .js
                    .delete_consumer_from_stream(&name, &stream)
                    .await
                    .map_err(|e| Failure::could_not(format!("delete consumer {name}: {e}")))?;
                Ok(format!("an operator deletes the {consumer} durable"))
            }
            EntryStep::ExpectSettlements {
                proxy,
                before,
                settlements: want,
            } => {
                let held = w.proxy(proxy)?.held();
                let scope = match before {
                    None => &held[..],
                    Some(text) => {
                        let at = find(&held, text.as_bytes()).ok_or_else(|| {
                            Failure::new(
                                format!("proxy {proxy} to hold {text:?}"),
                                format!("{} held bytes without it", held.len()),
                            )
                        })?;
                        &held[..at]
                    }
                };
                let got = settlements(scope);
                if got != *want {
                    return Err(Failure::new(
                        format!("the settlements {want:?} among the held bytes"),
                        format!("{got:?} in:\n{}", String::from_utf8_lossy(scope)),
                    ));
                }
                let among = match before {
                    Some(t) => format!("before {t:?}"),
                    None => "of all".to_string(),
                };
                Ok(if want.is_empty() {
                    format!("no settlement among the bytes proxy {proxy} holds {among}")
                } else {
                    format!("the settlements {want:?} among the bytes proxy {proxy} holds {among}")
                })
            }
            EntryStep::LeaseWatched { count } => {
                let stream = SpaceNames::kv_stream(&w.insp.names.delivery_bucket());
                let js = w.insp.js.clone();
                let want = count.unwrap_or(1);
                poll(
                    ctx,
                    &format!("{want} watch(es) of the lease row bound on the broker"),
                    || async {
                        let s = js
                            .get_stream_no_info(&stream)
                            .await
                            .map_err(|e| format!("stream {stream}: {e}"))?;
                        let mut infos = s.consumers();
                        let (mut bound, mut seen) = (0, Vec::new());
                        while let Some(info) = infos.next().await {
                            let info = info.map_err(|e| format!("consumers of {stream}: {e}"))?;
                            // A push consumer whose subscription the broker knows, or a pull
                            // consumer with a pull waiting: either way the watch's interest has
                            // reached the broker.
                            if info.push_bound || info.num_waiting > 0 {
                                bound += 1;
                            }
                            seen.push(info.name);
                        }
                        if bound >= want {
                            return Ok(());
                        }
                        Err(format!(
                            "{bound} bound consumer(s) on {stream} (consumers: {seen:?})"
                        ))
                    },
                )
                .await?;
                Ok(match count {
                    None => "the daemon's watch of its lease row is bound on the broker".into(),
                    Some(n) => format!("{n} watches of the lease row are bound on the broker"),
                })
            }
            EntryStep::LeaseWatches {
                count,
                bound,
                inactive_threshold,
            } => {
                let stream = SpaceNames::kv_stream(&w.insp.names.delivery_bucket());
                let js = w.insp.js.clone();
                let mut want = format!("{count} consumer(s) on {stream}");
                if let Some(b) = bound {
                    want.push_str(&format!(", {b} bound"));
                }
                if let Some(ms) = inactive_threshold {
                    want.push_str(&format!(", each with an inactivity threshold of {ms} ms"));
                }
                poll(ctx, &want, || async {
                    let s = js
                        .get_stream_no_info(&stream)
                        .await
                        .map_err(|e| format!("stream {stream}: {e}"))?;
                    let mut infos = s.consumers();
                    let mut seen = Vec::new();
                    while let Some(info) = infos.next().await {
                        let info = info.map_err(|e| format!("consumers of {stream}: {e}"))?;
                        seen.push(Watch {
                            bound: info.push_bound || info.num_waiting > 0,
                            inactive_threshold: info.config.inactive_threshold,
                            name: info.name,
                        });
                    }
                    judge_watches(&seen, *count, *bound, *inactive_threshold)
                })
                .await?;
                let mut said = format!(
                    "the lease bucket holds {count} consumer{} (watches of the row, {})",
                    if *count == 1 { "" } else { "s" },
                    match bound {
                        None => "bound or not".to_string(),
                        Some(0) => "none bound".to_string(),
                        Some(b) => format!("{b} bound"),
                    }
                );
                if let Some(ms) = inactive_threshold {
                    // In seconds when whole, so the transcript keeps the figure (a `N ms` is
                    // normalised away as timing).
                    let threshold = if ms % 1000 == 0 {
                        format!("{} s", ms / 1000)
                    } else {
                        format!("{ms} ms")
                    };
                    said.push_str(&format!(
                        ", each with the broker's inactivity threshold at {threshold}: reclaimed that long after its interest went"
                    ));
                }
                Ok(said)
            }
        }
    }
}

/// The position of `needle` in `bytes`.
fn find(bytes: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    bytes.windows(needle.len()).position(|w| w == needle)
}

/// The JetStream settlements among client protocol bytes, in order: the first word of the
/// payload of each `PUB $JS.ACK.…` (`+ACK` for an empty one), in-progress acks (`+WPI`) left
/// out since they settle nothing.
pub fn settlements(bytes: &[u8]) -> Vec<String> {
    const PUB: &[u8] = b"PUB $JS.ACK.";
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = find(&bytes[at..], PUB) {
        let start = at + i;
        // `PUB <subject> [reply] <size>\r\n<payload>\r\n`
        let Some(eol) = find(&bytes[start..], b"\r\n").map(|e| start + e) else {
            break;
        };
        let line = String::from_utf8_lossy(&bytes[start..eol]);
        let size = line
            .rsplit(' ')
            .next()
            .and_then(|s| s.parse::<usize>().ok());
        let body_start = eol + 2;
        let (body, next) = match size {
            Some(n) if body_start + n <= bytes.len() => {
                (&bytes[body_start..body_start + n], body_start + n)
            }
            // Cut short (the held bytes end mid-message): what there is.
            _ => (&bytes[body_start.min(bytes.len())..], bytes.len()),
        };
        let text = String::from_utf8_lossy(body);
        let word = text.split_whitespace().next().unwrap_or("+ACK");
        let word = word.split('{').next().unwrap_or(word);
        if word != "+WPI" {
            out.push(if word.is_empty() { "+ACK" } else { word }.to_string());
        }
        at = next.max(start + PUB.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{judge_watches, settlements, Watch};

    /// Mutations seen failing: the threshold not compared (a 30 s watch passes for a five-minute
    /// one), and the bound count not compared (a bound watch passes for one left behind).
    #[test]
    fn lease_watches_are_judged_by_count_binding_and_inactivity_threshold() {
        let watch = |bound: bool, secs: u64| Watch {
            name: "leasewatch_x".into(),
            bound,
            inactive_threshold: Duration::from_secs(secs),
        };
        let left = [watch(false, 300)];
        assert_eq!(judge_watches(&left, 1, None, None), Ok(()));
        assert_eq!(judge_watches(&left, 1, Some(0), Some(300_000)), Ok(()));
        assert!(judge_watches(&left, 0, None, None).is_err());
        assert!(judge_watches(&[watch(true, 300)], 1, Some(0), None).is_err());
        assert!(judge_watches(&[watch(false, 30)], 1, Some(0), Some(300_000)).is_err());
        assert_eq!(judge_watches(&[watch(false, 30)], 1, Some(0), None), Ok(()));
        // Each one's threshold, not only the first's.
        let two = [watch(true, 300), watch(false, 5)];
        assert!(judge_watches(&two, 2, Some(1), Some(300_000)).is_err());
        assert_eq!(judge_watches(&two, 2, Some(1), None), Ok(()));
    }

    /// Mutation seen failing: the payload read from the line itself (every settlement `+ACK`).
    #[test]
    fn settlements_are_read_from_each_ack_publish_in_order() {
        let publish =
            |subject: &str, body: &str| format!("PUB {subject} {}\r\n{body}\r\n", body.len());
        let bytes = [
            publish(
                "$JS.API.STREAM.MSG.DELETE.INBOX_demo _INBOX.x",
                r#"{"seq":1}"#,
            ),
            publish("$JS.ACK.INBOX_demo.reader.1.1.1.1.0", ""),
            publish("$JS.ACK.INBOX_demo.reader.1.2.2.1.0", "+WPI"),
            publish(
                "$JS.ACK.INBOX_demo.reader.1.3.3.1.0",
                r#"-NAK {"delay":100000000}"#,
            ),
            publish("$JS.ACK.INBOX_demo.reader.1.4.4.1.0", "+TERM"),
            publish("$JS.ACK.INBOX_demo.reader.1.5.5.1.0", "+ACK"),
        ]
        .concat();
        assert_eq!(
            settlements(bytes.as_bytes()),
            vec!["+ACK", "-NAK", "+TERM", "+ACK"],
            "{bytes}"
        );
        assert!(settlements(b"PUB $JS.API.STREAM.MSG.DELETE.X 2\r\n{}\r\n").is_empty());
    }
}
