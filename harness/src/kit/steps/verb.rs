//! What every verb is made of, below the verb groups so that no group imports another: the
//! kinds of names a step uses or creates, its context (when it began, its bound), the default
//! bound, polling a broker-side condition until the bound, the reason a distribution-only step
//! gives under a command template, and the argument types and conversions groups share.

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::Value;

use crate::kit::failure::Failure;
use crate::kit::under_test::DaemonUnderTest;

/// What a name in a case stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Daemon,
    Agent,
    Proxy,
    Host,
    Lease,
    Counter,
    Advisory,
    Post,
    Request,
    Sweeps,
    LeaseLog,
    /// An anycast request a case sent.
    Task,
    /// A remembered creation time of the task stream.
    TaskStream,
    /// A workflow timer a case armed.
    Timer,
    /// A daemon pid a case remembered (a process it did not start itself).
    Pid,
    /// A timed event a verb records itself (its `mark` modifier's kind).
    Event,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Daemon => "daemon",
            Kind::Agent => "agent",
            Kind::Proxy => "proxy",
            Kind::Host => "host",
            Kind::Lease => "remembered lease",
            Kind::Counter => "remembered connection count",
            Kind::Advisory => "advisory watch",
            Kind::Post => "post",
            Kind::Request => "sent request",
            Kind::Sweeps => "sweep watch",
            Kind::LeaseLog => "lease watch",
            Kind::Task => "anycast request",
            Kind::TaskStream => "remembered task stream",
            Kind::Timer => "timer",
            Kind::Pid => "remembered daemon pid",
            Kind::Event => "event (a `mark`)",
        })
    }
}

/// The names a step uses and the ones it creates.
#[derive(Debug, Default)]
pub struct Refs {
    pub uses: Vec<(Kind, String)>,
    pub creates: Vec<(Kind, String)>,
}

impl Refs {
    pub fn uses(mut self, kind: Kind, name: &str) -> Self {
        self.uses.push((kind, name.to_string()));
        self
    }
    pub fn creates(mut self, kind: Kind, name: &str) -> Self {
        self.creates.push((kind, name.to_string()));
        self
    }
    pub fn uses_opt(self, kind: Kind, name: Option<&String>) -> Self {
        match name {
            Some(n) => self.uses(kind, n),
            None => self,
        }
    }
}

/// When a step must be done by and when it began.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    pub started: Instant,
    pub deadline: Instant,
}

impl Ctx {
    /// What is left of the step's bound.
    pub fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// The default bound of a waiting step.
pub const DEFAULT_WITHIN: Duration = Duration::from_secs(20);

/// What a step says about the profile it can belong to (docs/cases.md, "Profiles"): every
/// verb group implements it; a verb that judges only what the contract requires keeps both
/// defaults.
pub trait Profiled {
    /// The texts this step judges the daemon's output by (a line it waits for or rules out, a
    /// reply's error text): in a contract step each must be quoted by a seed document.
    fn wording(&self) -> Vec<&str> {
        Vec::new()
    }

    /// Why this step judges something only this distribution promises whatever its texts (an
    /// exact exit code, one of its commands, a connection name), if it does: such a step is a
    /// distribution step.
    fn distribution_only(&self) -> Option<&'static str> {
        None
    }
}

/// The reason every distribution-only step gives under `--daemon-cmd`.
pub fn only_here(daemon: &DaemonUnderTest, why: &str) -> Option<String> {
    matches!(daemon, DaemonUnderTest::Cmd(_)).then(|| why.to_string())
}

/// Why a host cannot be started under `daemon`: a command template with no `--host-cmd`.
pub fn no_host_cmd(daemon: &DaemonUnderTest) -> Option<String> {
    match daemon {
        DaemonUnderTest::Cmd(c) if c.host().is_none() => Some(
            "a standby host is started by --host-cmd, and the run has none (`--daemon-cmd` starts one daemon for one space)".into(),
        ),
        _ => None,
    }
}

/// Waits until `check` answers `Ok` or `ctx`'s deadline passes; the last answer is the failure.
pub async fn poll<F, Fut, T>(
    ctx: Ctx,
    what: &str,
    mut check: F,
) -> Result<T, crate::kit::failure::Failure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    /// How often a broker-side condition is read again.
    const POLL: Duration = Duration::from_millis(50);
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(last) => {
                if Instant::now() >= ctx.deadline {
                    return Err(crate::kit::failure::Failure::new(
                        format!(
                            "{what} within {} ms",
                            ctx.deadline
                                .saturating_duration_since(ctx.started)
                                .as_millis()
                        ),
                        last,
                    ));
                }
            }
        }
        tokio::time::sleep(POLL.min(ctx.left())).await;
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Which {
    /// The credential the daemon was provisioned (or first reminted) with.
    Original,
    /// The owner's latest remint.
    Latest,
}

/// A TOML value as JSON (for answers written in a case).
pub fn toml_to_json(v: &toml::Value) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The instant of this process's clock at unix time `ms` (past or future).
pub fn instant_at_unix_ms(ms: i64) -> Result<Instant, Failure> {
    let now = Instant::now();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| Failure::could_not(format!("the system clock: {e}")))?
        .as_millis() as i64;
    let delta = ms.saturating_sub(now_ms);
    let shift = Duration::from_millis(delta.unsigned_abs());
    if delta >= 0 {
        Ok(now + shift)
    } else {
        now.checked_sub(shift).ok_or_else(|| {
            Failure::could_not(format!("unix time {ms} ms is before this process's clock"))
        })
    }
}

/// An RFC 3339 stamp as the broker writes it (`2026-12-02T15:54:05.123456789Z`, or with a
/// `+hh:mm` / `-hh:mm` offset).
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let (date, rest) = text.split_once('T')?;
    let mut d = date.split('-');
    let (y, m, day): (i64, i64, i64) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    let (clock, offset_s) = if let Some(c) = rest.strip_suffix('Z') {
        (c, 0i64)
    } else {
        let at = rest.rfind(['+', '-'])?;
        let (c, off) = rest.split_at(at);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let (oh, om) = off[1..].split_once(':')?;
        (
            c,
            sign * (oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60),
        )
    };
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, ""));
    let mut t = hms.split(':');
    let (h, mi, s): (i64, i64, i64) = (
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
    );
    let nanos: u32 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").get(..9)?.parse().ok()?
    };
    let secs = days_from_civil(y, m, day) * 86_400 + h * 3600 + mi * 60 + s - offset_s;
    let secs = u64::try_from(secs).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation seen failing: the sign of the shift inverted (a past `iat` read as future).
    #[test]
    fn unix_times_map_onto_this_clock_both_ways() {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
        let past = instant_at_unix_ms(now_ms - 5_000).expect("past");
        let future = instant_at_unix_ms(now_ms + 5_000).expect("future");
        let gap = future.duration_since(past).as_millis();
        assert!((9_990..=10_010).contains(&gap), "{gap}");
        assert!(past < Instant::now() && future > Instant::now());
    }
}
