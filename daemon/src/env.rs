//! Timing overrides read from the environment.
//!
//! Why: the seeds name their own variables (`COTAL_DELIVERY_BROKER_GONE_MS`, …) and DESIGN §1.6
//! asks every timing constant to have a documented override, so tests shrink windows through the
//! same code production runs. One reader, so `0` or garbage means "keep the default" everywhere.

use std::time::Duration;

/// Reads an environment override in milliseconds; `0` or garbage keeps the default.
pub fn env_ms(name: &str, default: Duration) -> Duration {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
        .unwrap_or(default)
}

/// Reads a count override (a size, not a time); `0` or garbage keeps the default.
pub fn env_count(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}
