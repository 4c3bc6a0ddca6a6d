//! Aggregation of log lines that repeat: the same give-up reason, the same reconnect, the same
//! missed remint. The reference's log was 99 % one repeated line when something kept failing;
//! here the first occurrence of a key is written at once, later ones within the window are only
//! counted, and when the window ends one line says `… (repeated N times in the last 60 s)`.
//!
//! [`Repeats`] is pure bookkeeping (no clock of its own, no I/O): the journal feeds it lines and
//! `now`, and writes what it returns. The key map is bounded ([`MAX_KEYS`]); a full map first
//! reports and drops its oldest key, so memory never grows with the number of distinct keys.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// At most this many keys are tracked at once.
pub const MAX_KEYS: usize = 256;

#[derive(Debug)]
struct Slot {
    /// The latest text offered under the key (the summary repeats it).
    text: String,
    /// When the current window began.
    since: Instant,
    /// Occurrences counted, not written, in the current window.
    suppressed: u64,
}

/// The bounded key map of repeated lines.
#[derive(Debug)]
pub struct Repeats {
    window: Duration,
    max_keys: usize,
    slots: HashMap<String, Slot>,
}

impl Repeats {
    pub fn new(window: Duration, max_keys: usize) -> Repeats {
        Repeats {
            window: window.max(Duration::from_millis(1)),
            max_keys: max_keys.max(1),
            slots: HashMap::new(),
        }
    }

    /// Offers one occurrence of `key` with its `text`; returns the lines to write now (the
    /// summaries of windows that ended first, then `text` if it is the first of its window).
    pub fn offer(&mut self, key: &str, text: String, now: Instant) -> Vec<String> {
        let mut out = self.due(now);
        if let Some(slot) = self.slots.get_mut(key) {
            slot.suppressed += 1;
            slot.text = text;
            return out;
        }
        if self.slots.len() >= self.max_keys {
            if let Some(oldest) = self
                .slots
                .iter()
                .min_by_key(|(_, s)| s.since)
                .map(|(k, _)| k.clone())
            {
                if let Some(slot) = self.slots.remove(&oldest) {
                    out.extend(self.summary(&slot, now));
                }
            }
        }
        self.slots.insert(
            key.to_string(),
            Slot {
                text: text.clone(),
                since: now,
                suppressed: 0,
            },
        );
        out.push(text);
        out
    }

    /// Summaries of every window that ended by `now`. A key with repeats starts a new window
    /// (so a steady flood writes one line per window); a key without is forgotten (its next
    /// occurrence is written at once).
    pub fn due(&mut self, now: Instant) -> Vec<String> {
        let window = self.window;
        let mut out = Vec::new();
        let mut ended: Vec<String> = Vec::new();
        for (key, slot) in self.slots.iter_mut() {
            if now.saturating_duration_since(slot.since) < window {
                continue;
            }
            if slot.suppressed == 0 {
                ended.push(key.clone());
                continue;
            }
            out.push(summary_line(&slot.text, slot.suppressed, window));
            slot.suppressed = 0;
            slot.since = now;
        }
        for key in ended {
            self.slots.remove(&key);
        }
        out
    }

    /// When the earliest window with counted repeats ends, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.slots
            .values()
            .filter(|s| s.suppressed > 0)
            .map(|s| s.since + self.window)
            .min()
    }

    /// Everything still counted, as summaries (at close); the map is emptied.
    pub fn drain(&mut self, now: Instant) -> Vec<String> {
        let slots: Vec<Slot> = self.slots.drain().map(|(_, s)| s).collect();
        slots.iter().filter_map(|s| self.summary(s, now)).collect()
    }

    fn summary(&self, slot: &Slot, now: Instant) -> Option<String> {
        (slot.suppressed > 0).then(|| {
            let span = now
                .saturating_duration_since(slot.since)
                .min(self.window)
                .max(Duration::from_millis(1));
            summary_line(&slot.text, slot.suppressed, span)
        })
    }
}

/// `<text> (repeated N times in the last W s)`.
pub fn summary_line(text: &str, n: u64, window: Duration) -> String {
    let ms = window.as_millis();
    let secs = if ms.is_multiple_of(1000) {
        format!("{}", ms / 1000)
    } else {
        format!("{:.1}", window.as_secs_f64())
    };
    let times = if n == 1 { "time" } else { "times" };
    format!("{text} (repeated {n} {times} in the last {secs} s)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// First occurrence written at once, the rest counted and summarised once the window ends,
    /// then forgotten. Mutation seen caught: `offer` writing every occurrence (returns the line
    /// again on the second offer).
    #[test]
    fn the_first_is_written_the_rest_counted_then_summarised() {
        let t0 = Instant::now();
        let mut r = Repeats::new(Duration::from_secs(60), 8);
        assert_eq!(r.offer("k", "! gave up".into(), t0), vec!["! gave up"]);
        for i in 1..=412 {
            assert!(r
                .offer("k", "! gave up".into(), t0 + Duration::from_millis(i))
                .is_empty());
        }
        assert_eq!(r.next_due(), Some(t0 + Duration::from_secs(60)));
        assert!(r.due(t0 + Duration::from_secs(59)).is_empty());
        assert_eq!(
            r.due(t0 + Duration::from_secs(60)),
            vec!["! gave up (repeated 412 times in the last 60 s)"]
        );
        // A quiet window forgets the key; the next occurrence is written at once.
        assert!(r.due(t0 + Duration::from_secs(120)).is_empty());
        assert_eq!(
            r.offer("k", "! gave up".into(), t0 + Duration::from_secs(121)),
            vec!["! gave up"]
        );
    }

    /// The map never holds more than its bound; the evicted key's count is reported, not lost.
    /// Mutation seen caught: skipping the eviction (the map grows to 3 keys).
    #[test]
    fn the_key_map_is_bounded_and_eviction_reports() {
        let t0 = Instant::now();
        let mut r = Repeats::new(Duration::from_secs(60), 2);
        r.offer("a", "A".into(), t0);
        r.offer("a", "A".into(), t0);
        r.offer("b", "B".into(), t0 + Duration::from_secs(1));
        let out = r.offer("c", "C".into(), t0 + Duration::from_secs(2));
        assert_eq!(out, vec!["A (repeated 1 time in the last 2 s)", "C"]);
        assert_eq!(r.slots.len(), 2);
    }

    #[test]
    fn short_windows_are_named_in_tenths() {
        assert_eq!(
            summary_line("x", 3, Duration::from_millis(1500)),
            "x (repeated 3 times in the last 1.5 s)"
        );
    }
}
