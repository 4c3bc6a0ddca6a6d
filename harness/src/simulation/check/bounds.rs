//! The bounds the checker judges time by, apart from the rules that use them, so the model of
//! the run and the rules both stand on it.

use super::history::Ms;

/// The bounds the rules judge time by. Defaults are the seeds' (broker-gone window 15 s,
/// backstop four times it, lease TTL 30 s); the runner passes what it configured the daemon
/// with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckConfig {
    /// `COTAL_DELIVERY_BROKER_GONE_MS`.
    pub broker_gone_window_ms: Ms,
    /// `COTAL_DELIVERY_BROKER_GONE_BACKSTOP_MS`.
    pub broker_gone_backstop_ms: Ms,
    /// How long a broker that stops answering without closing the socket takes to count as
    /// disconnected (two unanswered client pings: 2 × `COTAL_DELIVERY_PING_INTERVAL_MS`, plus
    /// one interval for where the clock stood).
    pub silent_detect_ms: Ms,
    /// Slack on either side of a broker-gone exit's window.
    pub exit_margin_ms: Ms,
    /// The lease bucket's TTL: a row not renewed this long is gone.
    pub lease_ttl_ms: Ms,
    /// How long a daemon thawed from a pause, or whose row was replaced, may still look as if
    /// it serves before noticing: overlaps no longer than this are not reported.
    pub takeover_grace_ms: Ms,
    /// Most time between the reader's check and the broker's stamp of its hand-off, when no
    /// fault runs: bounds when the check happened, for leaks after a narrowing.
    pub handoff_slack_ms: Ms,
    /// Most time from a post's ok to its hand-off (fan-out, then the reader's check) while a
    /// daemon serves and no fault runs: bounds when a mention was resolved against presence,
    /// and makes a narrowing begun after it irrelevant to the post.
    pub handoff_bound_ms: Ms,
    /// The first post after the heal must surface within this of its ok.
    pub liveness_bound_ms: Ms,
    /// The DLV stream's duplicate window: a hand-off repeated later than this is not deduped.
    pub dedup_window_ms: Ms,
    /// Slack between the broker's stamps (wall clock) and the runner's times (its monotonic
    /// clock from the run's start) when a row state is placed against an operation.
    pub stamp_skew_ms: Ms,
}

impl Default for CheckConfig {
    fn default() -> CheckConfig {
        CheckConfig {
            broker_gone_window_ms: 15_000,
            broker_gone_backstop_ms: 60_000,
            silent_detect_ms: 7_500,
            exit_margin_ms: 3_000,
            lease_ttl_ms: 30_000,
            takeover_grace_ms: 2_000,
            handoff_slack_ms: 2_000,
            handoff_bound_ms: 10_000,
            liveness_bound_ms: 30_000,
            dedup_window_ms: 120_000,
            stamp_skew_ms: 50,
        }
    }
}
