//! Delayed frames: a proxy keeps whole frames of the daemon's connection (`proxy.rs`, "delay")
//! while every other frame flows, then hands them over in order: the broker's replies to
//! requests on a subject (the request reaches the broker and is answered at once; only the
//! answer is late, as a slow JetStream API answer is), or the daemon's own publishes on a
//! subject (they reach the broker late, or never if the daemon dies first). With a request sent
//! and not waited for (`send`), they open a window deterministically, e.g. between a join's or a
//! leave's cursor read (a JetStream API read the daemon makes before it writes the member row)
//! and the row's write, so a case can post into it and prove from the broker that it opened.
//! A drop takes the daemon's next publishes on a subject whole and never forwards them: a
//! request lost before the broker (never answered), while a retry of it is carried.

use std::time::Duration;

use serde::Deserialize;

use super::verb::{Ctx, Kind, Profiled, Refs, DEFAULT_WITHIN};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;

pub const VERBS: &[&str] = &[
    "delay_frames",
    "expect_delayed",
    "release_delayed",
    "drop_frames",
    "expect_dropped",
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum DelayStep {
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
    DropFrames {
        proxy: String,
        /// Drop the client's next publishes on subjects this matches.
        publishes_to: String,
        /// How many (default 1); later ones flow.
        #[serde(default = "one")]
        count: usize,
    },
    ExpectDropped {
        proxy: String,
        count: usize,
    },
}

fn one() -> usize {
    1
}

impl Profiled for DelayStep {}

impl DelayStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            DelayStep::ExpectDelayed { .. } | DelayStep::ExpectDropped { .. } => {
                Some(DEFAULT_WITHIN)
            }
            _ => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            DelayStep::DelayFrames { proxy, .. }
            | DelayStep::ExpectDelayed { proxy, .. }
            | DelayStep::ReleaseDelayed { proxy }
            | DelayStep::DropFrames { proxy, .. }
            | DelayStep::ExpectDropped { proxy, .. } => Refs::default().uses(Kind::Proxy, proxy),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            DelayStep::DelayFrames {
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
            DelayStep::ExpectDelayed { proxy, count } => {
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
            DelayStep::ReleaseDelayed { proxy } => {
                w.proxy(proxy)?.release_delayed();
                Ok(format!("proxy {proxy} releases what it delayed"))
            }
            DelayStep::DropFrames {
                proxy,
                publishes_to,
                count,
            } => {
                w.proxy(proxy)?.drop_publishes_to(publishes_to, *count);
                Ok(format!(
                    "proxy {proxy} drops the next {} on {publishes_to}",
                    plural(*count, "publish", "publishes")
                ))
            }
            DelayStep::ExpectDropped { proxy, count } => {
                let p = w.proxy(proxy)?;
                p.wait_dropped(*count, ctx.left()).await.map_err(|_| {
                    Failure::new(
                        format!("proxy {proxy} to have dropped {count} frames"),
                        format!("it dropped {}", p.dropped_count()),
                    )
                })?;
                Ok(format!(
                    "proxy {proxy} dropped {}",
                    plural(*count, "frame", "frames")
                ))
            }
        }
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
