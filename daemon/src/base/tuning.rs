//! Tuning: every timing bound and knob an operator can override, read from the environment
//! once, and the bounds that are fixed.
//!
//! Why one value: a daemon's whole input is its `SpaceConfig`, so no component reads the
//! environment on its own (a library embedding two spaces, or a test, sets one `Tuning`). The
//! command line reads it with [`Tuning::from_env`]; an embedder gets it from
//! `HostedContextInputs::new` or sets its own. Every override is in milliseconds unless its
//! name says otherwise, and `0` or garbage keeps the default (docs/operations.md, "Timing
//! overrides", lists them; a unit test holds that table to this file).
//!
//! The fixed bounds below are named once, with the unit in their type, and the relations the
//! code relies on between bounds are asserted at compile time next to them.

use std::fmt;
use std::time::Duration;

/// The wait for one answer from the broker: a dial's CONNECT, a JetStream or KV request, a
/// publish's ack, a reply's flush. Every component that asks the broker one thing gives up
/// after this long (the reference's 5 s request budget). Waits that are not one answer are
/// their own bounds: a redial (the signalled release's wait, the admin rail's reconnect wait),
/// an `ack_wait`, a retry delay.
pub const BROKER_BOUND: Duration = Duration::from_secs(5);

/// `COTAL_DELIVERY_PING_INTERVAL_MS`: the resident connection's client ping interval.
pub const ENV_PING_INTERVAL_MS: &str = "COTAL_DELIVERY_PING_INTERVAL_MS";
/// Two unanswered pings count as a disconnect, so a silent broker is noticed within 5 s.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_millis(2_500);

/// `COTAL_DELIVERY_BROKER_GONE_MS`: the broker-gone window.
pub const ENV_BROKER_GONE_MS: &str = "COTAL_DELIVERY_BROKER_GONE_MS";
/// `COTAL_DELIVERY_BROKER_GONE_BACKSTOP_MS`: the wall-time backstop.
pub const ENV_BROKER_GONE_BACKSTOP_MS: &str = "COTAL_DELIVERY_BROKER_GONE_BACKSTOP_MS";
/// Default broker-gone window (15 seconds).
pub const DEFAULT_BROKER_GONE_WINDOW_MS: u64 = 15_000;
/// Default backstop as a multiple of the window (four times, never less than it).
pub const BACKSTOP_WINDOWS: u64 = 4;

/// `COTAL_DELIVERY_NAK_DELAY_MS`: the delay of a nak (a post or entry retried).
pub const ENV_NAK_DELAY_MS: &str = "COTAL_DELIVERY_NAK_DELAY_MS";
pub const DEFAULT_NAK_DELAY: Duration = Duration::from_millis(2_000);
/// `COTAL_DELIVERY_ACK_WAIT_MS`: `ack_wait` of the `fanout` and `reader` durables. Binding them
/// sets it, also on durables created with another value. Messages the daemon owns are kept
/// alive with in-progress acks, so this bounds only how long a crashed (or quiesced) daemon's
/// in-flight messages wait before they redeliver.
pub const ENV_ACK_WAIT_MS: &str = "COTAL_DELIVERY_ACK_WAIT_MS";
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_millis(5_000);

/// `COTAL_DELIVERY_ANYCAST_SWEEP_MS`: interval between two sweeps of the anycast rows (the
/// first runs when serving starts).
pub const ENV_ANYCAST_SWEEP_MS: &str = "COTAL_DELIVERY_ANYCAST_SWEEP_MS";
pub const DEFAULT_ANYCAST_SWEEP: Duration = Duration::from_secs(10 * 60);
/// `COTAL_DELIVERY_ANYCAST_ROW_AGE_MS`: age of a row after its request left the queue before
/// the sweep removes it.
pub const ENV_ANYCAST_ROW_AGE_MS: &str = "COTAL_DELIVERY_ANYCAST_ROW_AGE_MS";
pub const DEFAULT_ANYCAST_ROW_AGE: Duration = Duration::from_secs(24 * 60 * 60);
/// Fault-injection knob (tests only, documented in docs/anycast.md): exactly `1` makes a
/// winning take hold right after its row is written and before its DM is sent, so a test can
/// SIGKILL the daemon inside the crash window the resend repairs.
pub const ENV_FAULT_HOLD_AFTER_ANYCAST_ROW: &str = "COTAL_DELIVERY_FAULT_HOLD_AFTER_ANYCAST_ROW";

/// `COTAL_DELIVERY_REMINT_RETRY_MS`: retry of the credential re-read (the delivery
/// credential's and the membership feed's) after a missed remint or a refused candidate.
pub const ENV_REMINT_RETRY_MS: &str = "COTAL_DELIVERY_REMINT_RETRY_MS";
pub const DEFAULT_REMINT_RETRY: Duration = Duration::from_secs(60);

/// `COTAL_DELIVERY_MEMBERSHIP_INTERVAL_MS`: the membership feed's sweep interval.
pub const ENV_MEMBERSHIP_INTERVAL_MS: &str = "COTAL_DELIVERY_MEMBERSHIP_INTERVAL_MS";
pub const DEFAULT_MEMBERSHIP_INTERVAL: Duration = Duration::from_millis(15_000);

/// `COTAL_DELIVERY_TIMER_RETRY_MS`: the timer writer's first restart backoff.
pub const ENV_TIMER_RETRY_MS: &str = "COTAL_DELIVERY_TIMER_RETRY_MS";
pub const DEFAULT_TIMER_RETRY: Duration = Duration::from_millis(5_000);
/// `COTAL_DELIVERY_TIMER_POLL_MS`: how long one timer-writer fetch waits for requests.
pub const ENV_TIMER_POLL_MS: &str = "COTAL_DELIVERY_TIMER_POLL_MS";
pub const DEFAULT_TIMER_POLL: Duration = Duration::from_millis(1_000);

/// `COTAL_DELIVERY_METRICS_SAMPLE_MS`: how often the gauges are sampled from the broker.
pub const ENV_METRICS_SAMPLE_MS: &str = "COTAL_DELIVERY_METRICS_SAMPLE_MS";
pub const DEFAULT_METRICS_SAMPLE: Duration = Duration::from_millis(1_000);

/// `COTAL_DELIVERY_LOG_REPEAT_WINDOW_MS`: the window of a repeated log line.
pub const ENV_LOG_REPEAT_WINDOW_MS: &str = "COTAL_DELIVERY_LOG_REPEAT_WINDOW_MS";
pub const DEFAULT_LOG_REPEAT_WINDOW: Duration = Duration::from_secs(60);

/// `COTAL_DELIVERY_SWEEP_SETTLE_MS`: a `$SYS` CONNZ page is collected until this long after
/// the last server's answer.
pub const ENV_SWEEP_SETTLE_MS: &str = "COTAL_DELIVERY_SWEEP_SETTLE_MS";
pub const DEFAULT_SWEEP_SETTLE: Duration = Duration::from_millis(250);
/// `COTAL_DELIVERY_SWEEP_PAGE_LIMIT` (a count): connections per CONNZ page.
pub const ENV_SWEEP_PAGE_LIMIT: &str = "COTAL_DELIVERY_SWEEP_PAGE_LIMIT";
pub const DEFAULT_SWEEP_PAGE_LIMIT_CONNECTIONS: u64 = 1024;
/// `COTAL_DELIVERY_SWEEP_MAX_PAGES` (a count): pages one sweep asks for.
pub const ENV_SWEEP_MAX_PAGES: &str = "COTAL_DELIVERY_SWEEP_MAX_PAGES";
pub const DEFAULT_SWEEP_MAX_PAGES: u64 = 64;

/// `COTAL_DELIVERY_STANDBY_RETRY_MS`: a standby lane's retry of a held lease (5 seconds).
pub const ENV_STANDBY_RETRY_MS: &str = "COTAL_DELIVERY_STANDBY_RETRY_MS";
pub const DEFAULT_STANDBY_RETRY: Duration = Duration::from_secs(5);
/// `COTAL_DELIVERY_LANE_BACKOFF_MAX_MS`: the cap of a refused or closed lane's backoff.
pub const ENV_LANE_BACKOFF_MAX_MS: &str = "COTAL_DELIVERY_LANE_BACKOFF_MAX_MS";
pub const DEFAULT_LANE_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The first retry of a refused or closed lane; it doubles up to the cap (which is never
/// below it: [`Tuning::lane_backoff_max`]).
pub const LANE_BACKOFF_MIN: Duration = Duration::from_millis(500);

/// `COTAL_DELIVERY_STOP_GRACE_MS`: the stop's grace between SIGTERM and SIGKILL (15 seconds).
pub const ENV_STOP_GRACE_MS: &str = "COTAL_DELIVERY_STOP_GRACE_MS";
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(15);
/// `COTAL_DELIVERY_SERVING_BOUND_MS`: how long `up` waits for a daemon it started (at start-up
/// or as a replacement) to serve before the not-bound warning.
pub const ENV_SERVING_BOUND_MS: &str = "COTAL_DELIVERY_SERVING_BOUND_MS";
pub const DEFAULT_SERVING_BOUND: Duration = Duration::from_secs(30);

/// Every variable [`Tuning::from_env`] reads, in the order of docs/operations.md's table.
/// (Read by the tests that hold the table and `--help` to it.)
#[cfg(test)]
pub const VARIABLES: [&str; 21] = [
    ENV_PING_INTERVAL_MS,
    ENV_BROKER_GONE_MS,
    ENV_BROKER_GONE_BACKSTOP_MS,
    ENV_REMINT_RETRY_MS,
    ENV_NAK_DELAY_MS,
    ENV_STOP_GRACE_MS,
    ENV_SERVING_BOUND_MS,
    ENV_ACK_WAIT_MS,
    ENV_TIMER_RETRY_MS,
    ENV_MEMBERSHIP_INTERVAL_MS,
    ENV_TIMER_POLL_MS,
    ENV_METRICS_SAMPLE_MS,
    ENV_LOG_REPEAT_WINDOW_MS,
    ENV_SWEEP_SETTLE_MS,
    ENV_SWEEP_PAGE_LIMIT,
    ENV_SWEEP_MAX_PAGES,
    ENV_ANYCAST_SWEEP_MS,
    ENV_ANYCAST_ROW_AGE_MS,
    ENV_FAULT_HOLD_AFTER_ANYCAST_ROW,
    ENV_STANDBY_RETRY_MS,
    ENV_LANE_BACKOFF_MAX_MS,
];

// A silent broker is noticed (two unanswered pings) well inside the broker-gone window.
const _: () =
    assert!(2 * DEFAULT_PING_INTERVAL.as_millis() < DEFAULT_BROKER_GONE_WINDOW_MS as u128);
const _: () = assert!(BACKSTOP_WINDOWS >= 1);
// A lane's backoff starts below its cap.
const _: () = assert!(LANE_BACKOFF_MIN.as_millis() <= DEFAULT_LANE_BACKOFF_MAX.as_millis());

/// The overridable timing of one process: every field is a documented override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// [`ENV_PING_INTERVAL_MS`].
    pub ping_interval: Duration,
    /// [`ENV_BROKER_GONE_MS`], [`ENV_BROKER_GONE_BACKSTOP_MS`].
    pub health: HealthConfig,
    /// [`ENV_NAK_DELAY_MS`].
    pub nak_delay: Duration,
    /// [`ENV_ACK_WAIT_MS`].
    pub ack_wait: Duration,
    /// [`ENV_ANYCAST_SWEEP_MS`].
    pub anycast_sweep: Duration,
    /// [`ENV_ANYCAST_ROW_AGE_MS`].
    pub anycast_row_age: Duration,
    /// [`ENV_FAULT_HOLD_AFTER_ANYCAST_ROW`] is `1`.
    pub anycast_fault_hold: bool,
    /// [`ENV_REMINT_RETRY_MS`].
    pub remint_retry: Duration,
    /// [`ENV_MEMBERSHIP_INTERVAL_MS`].
    pub membership_interval: Duration,
    /// [`ENV_TIMER_RETRY_MS`].
    pub timer_retry: Duration,
    /// [`ENV_TIMER_POLL_MS`].
    pub timer_poll: Duration,
    /// [`ENV_METRICS_SAMPLE_MS`].
    pub metrics_sample: Duration,
    /// [`ENV_LOG_REPEAT_WINDOW_MS`].
    pub log_repeat_window: Duration,
    /// [`ENV_SWEEP_SETTLE_MS`].
    pub sweep_settle: Duration,
    /// [`ENV_SWEEP_PAGE_LIMIT`].
    pub sweep_page_limit_connections: u64,
    /// [`ENV_SWEEP_MAX_PAGES`].
    pub sweep_max_pages: u64,
    /// [`ENV_STANDBY_RETRY_MS`].
    pub standby_retry: Duration,
    /// [`ENV_LANE_BACKOFF_MAX_MS`], never below [`LANE_BACKOFF_MIN`].
    pub lane_backoff_max: Duration,
    /// [`ENV_STOP_GRACE_MS`].
    pub stop_grace: Duration,
    /// [`ENV_SERVING_BOUND_MS`].
    pub serving_bound: Duration,
}

impl Default for Tuning {
    /// The documented defaults, nothing overridden.
    fn default() -> Self {
        Tuning::from_lookup(|_| None)
    }
}

impl Tuning {
    /// The documented defaults with the process environment's overrides applied. The one
    /// place the daemon reads its timing from the environment: the command line calls it once.
    pub fn from_env() -> Tuning {
        Tuning::from_lookup(|name| std::env::var(name).ok())
    }

    /// The defaults with the overrides `lookup` gives (a variable's value, or `None` when
    /// unset): `0` or garbage keeps the default.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Tuning {
        let count = |name: &str| {
            lookup(name)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|n| *n > 0)
        };
        let ms = |name: &str, default: Duration| {
            count(name).map(Duration::from_millis).unwrap_or(default)
        };
        Tuning {
            ping_interval: ms(ENV_PING_INTERVAL_MS, DEFAULT_PING_INTERVAL),
            health: HealthConfig::from_values(
                count(ENV_BROKER_GONE_MS),
                count(ENV_BROKER_GONE_BACKSTOP_MS),
            ),
            nak_delay: ms(ENV_NAK_DELAY_MS, DEFAULT_NAK_DELAY),
            ack_wait: ms(ENV_ACK_WAIT_MS, DEFAULT_ACK_WAIT),
            anycast_sweep: ms(ENV_ANYCAST_SWEEP_MS, DEFAULT_ANYCAST_SWEEP),
            anycast_row_age: ms(ENV_ANYCAST_ROW_AGE_MS, DEFAULT_ANYCAST_ROW_AGE),
            anycast_fault_hold: lookup(ENV_FAULT_HOLD_AFTER_ANYCAST_ROW).is_some_and(|v| v == "1"),
            remint_retry: ms(ENV_REMINT_RETRY_MS, DEFAULT_REMINT_RETRY),
            membership_interval: ms(ENV_MEMBERSHIP_INTERVAL_MS, DEFAULT_MEMBERSHIP_INTERVAL),
            timer_retry: ms(ENV_TIMER_RETRY_MS, DEFAULT_TIMER_RETRY),
            timer_poll: ms(ENV_TIMER_POLL_MS, DEFAULT_TIMER_POLL),
            metrics_sample: ms(ENV_METRICS_SAMPLE_MS, DEFAULT_METRICS_SAMPLE),
            log_repeat_window: ms(ENV_LOG_REPEAT_WINDOW_MS, DEFAULT_LOG_REPEAT_WINDOW),
            sweep_settle: ms(ENV_SWEEP_SETTLE_MS, DEFAULT_SWEEP_SETTLE),
            sweep_page_limit_connections: count(ENV_SWEEP_PAGE_LIMIT)
                .unwrap_or(DEFAULT_SWEEP_PAGE_LIMIT_CONNECTIONS),
            sweep_max_pages: count(ENV_SWEEP_MAX_PAGES).unwrap_or(DEFAULT_SWEEP_MAX_PAGES),
            standby_retry: ms(ENV_STANDBY_RETRY_MS, DEFAULT_STANDBY_RETRY),
            lane_backoff_max: ms(ENV_LANE_BACKOFF_MAX_MS, DEFAULT_LANE_BACKOFF_MAX)
                .max(LANE_BACKOFF_MIN),
            stop_grace: ms(ENV_STOP_GRACE_MS, DEFAULT_STOP_GRACE),
            serving_bound: ms(ENV_SERVING_BOUND_MS, DEFAULT_SERVING_BOUND),
        }
    }
}

/// A refused health configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthError {
    kind: HealthErrorKind,
    detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthErrorKind {
    /// The window is zero.
    Window,
    /// The backstop is shorter than the window.
    Backstop,
}

impl HealthError {
    pub fn kind(&self) -> HealthErrorKind {
        self.kind
    }
}

impl fmt::Display for HealthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for HealthError {}

/// The broker-gone watchdog's window and backstop, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    window_ms: u64,
    backstop_ms: u64,
    /// Close at once on a credential expiry instead of awaiting a proved renewal until the
    /// backstop. Only a multi-space host's lane sets it: its host reopens the lane through the
    /// lane's own credential checks, so nothing is gained by holding a dead connection.
    expiry_closes: bool,
}

impl HealthConfig {
    /// A window and an explicit backstop; refuses a zero window or a backstop below it.
    pub fn new(window_ms: u64, backstop_ms: u64) -> Result<HealthConfig, HealthError> {
        if window_ms == 0 {
            return Err(HealthError {
                kind: HealthErrorKind::Window,
                detail: "the broker-gone window must be longer than 0 ms".into(),
            });
        }
        if backstop_ms < window_ms {
            return Err(HealthError {
                kind: HealthErrorKind::Backstop,
                detail: format!(
                    "the broker-gone backstop ({backstop_ms} ms) is shorter than the window ({window_ms} ms)"
                ),
            });
        }
        Ok(HealthConfig {
            window_ms,
            backstop_ms,
            expiry_closes: false,
        })
    }

    /// The documented rule: window `W` (0 or garbage keeps 15000), backstop `max(W, B or 4W)`.
    pub fn from_values(window: Option<u64>, backstop: Option<u64>) -> HealthConfig {
        let window_ms = window
            .filter(|w| *w > 0)
            .unwrap_or(DEFAULT_BROKER_GONE_WINDOW_MS);
        let backstop_ms = backstop
            .filter(|b| *b > 0)
            .unwrap_or(window_ms.saturating_mul(BACKSTOP_WINDOWS))
            .max(window_ms);
        HealthConfig {
            window_ms,
            backstop_ms,
            expiry_closes: false,
        }
    }

    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }
    pub fn backstop_ms(&self) -> u64 {
        self.backstop_ms
    }
    /// The same windows, closing at once on a credential expiry (a host's lane).
    pub fn closing_on_expiry(mut self) -> HealthConfig {
        self.expiry_closes = true;
        self
    }
    pub fn expiry_closes(&self) -> bool {
        self.expiry_closes
    }
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig::from_values(None, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn with(pairs: &[(&str, &str)]) -> Tuning {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Tuning::from_lookup(move |name| map.get(name).cloned())
    }

    /// Every variable keeps its default at `0` and at garbage, and applies a valid value.
    /// Mutation seen failing: `ms` without the `> 0` filter (a `0` override took effect).
    #[test]
    fn zero_or_garbage_keeps_every_default_and_a_value_applies() {
        let defaults = Tuning::default();
        for name in VARIABLES {
            for bad in ["0", "soon", "-5", ""] {
                assert_eq!(with(&[(name, bad)]), defaults, "{name}={bad:?}");
            }
            let set = with(&[(name, " 777 ")]);
            if name == ENV_FAULT_HOLD_AFTER_ANYCAST_ROW {
                assert_eq!(set, defaults, "only `1` turns the hold on");
                assert!(with(&[(name, "1")]).anycast_fault_hold);
            } else {
                assert_ne!(set, defaults, "{name} had no effect");
            }
        }
        let t = with(&[
            (ENV_PING_INTERVAL_MS, "200"),
            (ENV_BROKER_GONE_MS, "1500"),
            (ENV_SWEEP_PAGE_LIMIT, "3"),
            (ENV_LANE_BACKOFF_MAX_MS, "100"),
        ]);
        assert_eq!(t.ping_interval, Duration::from_millis(200));
        assert_eq!(
            (t.health.window_ms(), t.health.backstop_ms()),
            (1_500, 6_000)
        );
        assert_eq!(t.sweep_page_limit_connections, 3);
        assert_eq!(
            t.lane_backoff_max, LANE_BACKOFF_MIN,
            "the cap is never below the start"
        );
    }

    /// The documented defaults.
    #[test]
    fn the_defaults_are_the_documented_ones() {
        let t = Tuning::default();
        assert_eq!(t.ping_interval, Duration::from_millis(2_500));
        assert_eq!(
            (t.health.window_ms(), t.health.backstop_ms()),
            (15_000, 60_000)
        );
        assert_eq!(t.nak_delay, Duration::from_millis(2_000));
        assert_eq!(t.ack_wait, Duration::from_millis(5_000));
        assert_eq!(t.anycast_sweep, Duration::from_secs(600));
        assert_eq!(t.anycast_row_age, Duration::from_secs(86_400));
        assert!(!t.anycast_fault_hold);
        assert_eq!(t.remint_retry, Duration::from_secs(60));
        assert_eq!(t.membership_interval, Duration::from_secs(15));
        assert_eq!(
            (t.timer_retry, t.timer_poll),
            (Duration::from_secs(5), Duration::from_secs(1))
        );
        assert_eq!(t.metrics_sample, Duration::from_secs(1));
        assert_eq!(t.log_repeat_window, Duration::from_secs(60));
        assert_eq!(t.sweep_settle, Duration::from_millis(250));
        assert_eq!(
            (t.sweep_page_limit_connections, t.sweep_max_pages),
            (1024, 64)
        );
        assert_eq!(t.standby_retry, Duration::from_secs(5));
        assert_eq!(t.lane_backoff_max, Duration::from_secs(30));
        assert_eq!(t.stop_grace, Duration::from_secs(15));
        assert_eq!(t.serving_bound, Duration::from_secs(30));
    }

    /// docs/operations.md's "Timing overrides" table names every variable read here, once.
    /// Mutation seen failing: the `COTAL_DELIVERY_LANE_BACKOFF_MAX_MS` row removed.
    #[test]
    fn the_operations_table_lists_every_variable() {
        let doc = include_str!("../../../docs/operations.md");
        let table = doc
            .split("## Timing overrides")
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
            .unwrap_or_default();
        for name in VARIABLES {
            let rows = table
                .lines()
                .filter(|l| l.starts_with(&format!("| `{name}` |")))
                .count();
            assert_eq!(rows, 1, "{name} in docs/operations.md's timing table");
        }
    }

    #[test]
    fn health_follows_the_documented_rule() {
        let d = HealthConfig::from_values(None, None);
        assert_eq!((d.window_ms(), d.backstop_ms()), (15_000, 60_000));
        let z = HealthConfig::from_values(Some(0), Some(0));
        assert_eq!((z.window_ms(), z.backstop_ms()), (15_000, 60_000));
        let w = HealthConfig::from_values(Some(1_500), None);
        assert_eq!((w.window_ms(), w.backstop_ms()), (1_500, 6_000));
        // Never less than the window.
        let short = HealthConfig::from_values(Some(2_000), Some(500));
        assert_eq!((short.window_ms(), short.backstop_ms()), (2_000, 2_000));
        assert_eq!(
            HealthConfig::new(0, 10).unwrap_err().kind(),
            HealthErrorKind::Window
        );
        assert_eq!(
            HealthConfig::new(10, 9).unwrap_err().kind(),
            HealthErrorKind::Backstop
        );
    }
}
