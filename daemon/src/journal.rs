//! The daemon's human log: the exact lines the seeds quote (`✓ …`, `✗ …`, `! …`, `• …`).
//!
//! These lines are an interface (operators grep them, tests snapshot them), so they are written
//! verbatim, one per call, to stderr and appended with a UTC timestamp to the space's
//! `.cotal/delivery.<key>.log`. Structured `tracing` output is for everything else.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::repeats::{Repeats, MAX_KEYS};

/// A cheap, clonable handle on the daemon's human log.
#[derive(Clone, Default)]
pub struct Journal {
    file: Arc<Mutex<Option<File>>>,
    /// Put before each stderr line (a multi-space host names the lane); the file gets the
    /// line as it is, since the file is already the space's own.
    prefix: Option<Arc<str>>,
    /// While `Some`, lines are kept here instead of written (see [`Journal::held`]).
    held: Option<Arc<Mutex<Option<Vec<String>>>>>,
    /// Lines that repeat ([`Journal::repeated`]), shared by every clone, prefixed or held.
    repeats: RepeatState,
}

/// The shared aggregator of repeated lines and whether a task is waiting to write its
/// summaries.
#[derive(Clone)]
struct RepeatState {
    map: Arc<Mutex<Repeats>>,
    flusher: Arc<AtomicBool>,
}

impl Default for RepeatState {
    fn default() -> Self {
        RepeatState {
            map: Arc::new(Mutex::new(Repeats::new(
                Repeats::window_from_env(),
                MAX_KEYS,
            ))),
            flusher: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Journal {
    /// A journal that writes to stderr only (until `attach_file`).
    pub fn stderr_only() -> Journal {
        Journal::default()
    }

    /// From now on, also append every line to `file`.
    pub fn attach_file(&self, file: File) {
        if let Ok(mut slot) = self.file.lock() {
            *slot = Some(file);
        }
    }

    /// The same log, each stderr line preceded by `prefix` (the file line is unchanged).
    pub fn prefixed(&self, prefix: impl Into<String>) -> Journal {
        Journal {
            file: self.file.clone(),
            prefix: Some(Arc::from(prefix.into())),
            held: None,
            repeats: self.repeats.clone(),
        }
    }

    /// The same log, holding its lines until [`Journal::release`] writes them (and every later
    /// line) or [`Journal::discard`] drops them. Why: a host retrying a start every few seconds
    /// writes an attempt's lines only when its outcome differs from the previous attempt's, so
    /// a standby reports a held lease once, not once per retry.
    pub fn held(&self) -> Journal {
        Journal {
            file: self.file.clone(),
            prefix: self.prefix.clone(),
            held: Some(Arc::new(Mutex::new(Some(Vec::new())))),
            repeats: self.repeats.clone(),
        }
    }

    /// Writes the held lines, and from now on writes through.
    pub fn release(&self) {
        let lines = self
            .held
            .as_ref()
            .and_then(|h| h.lock().ok().and_then(|mut slot| slot.take()));
        for line in lines.unwrap_or_default() {
            self.write(&line);
        }
    }

    /// Drops the held lines; later lines are still held (until `release`).
    pub fn discard(&self) {
        if let Some(Ok(mut slot)) = self.held.as_ref().map(|h| h.lock()) {
            if let Some(lines) = slot.as_mut() {
                lines.clear();
            }
        }
    }

    /// Writes one line. Failures to write are ignored: the log never takes the daemon down.
    pub fn line(&self, text: impl AsRef<str>) {
        let text = text.as_ref();
        if let Some(held) = &self.held {
            if let Ok(mut slot) = held.lock() {
                if let Some(lines) = slot.as_mut() {
                    lines.push(text.to_string());
                    return;
                }
            }
        }
        self.write(text);
    }

    /// Writes a line that may repeat under `key` (give-up reason, reconnect, missed remint;
    /// keys name their space): the first occurrence in a window at once, later ones counted and
    /// summarised as `… (repeated N times in the last 60 s)` when the window ends
    /// (`COTAL_DELIVERY_LOG_REPEAT_WINDOW_MS`).
    pub fn repeated(&self, key: &str, text: impl Into<String>) {
        let lines = match self.repeats.map.lock() {
            Ok(mut map) => map.offer(key, text.into(), Instant::now()),
            Err(_) => vec![text.into()],
        };
        for line in lines {
            self.line(line);
        }
        self.arm_flusher();
    }

    /// Writes every summary still counted (a closing daemon says what it suppressed).
    pub fn flush_repeats(&self) {
        let lines = match self.repeats.map.lock() {
            Ok(mut map) => map.drain(Instant::now()),
            Err(_) => Vec::new(),
        };
        for line in lines {
            self.line(line);
        }
    }

    /// Starts (at most one) task that writes summaries when their windows end, so a count is
    /// reported even if the line never comes again. Outside a runtime, summaries wait for the
    /// next occurrence.
    fn arm_flusher(&self) {
        let pending = |j: &Journal| j.repeats.map.lock().ok().and_then(|m| m.next_due());
        if pending(self).is_none() || self.repeats.flusher.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.repeats.flusher.store(false, Ordering::SeqCst);
            return;
        };
        let journal = self.clone();
        rt.spawn(async move {
            loop {
                let Some(at) = pending(&journal) else {
                    journal.repeats.flusher.store(false, Ordering::SeqCst);
                    // A repeat counted between the check and the store re-arms.
                    if pending(&journal).is_some()
                        && !journal.repeats.flusher.swap(true, Ordering::SeqCst)
                    {
                        continue;
                    }
                    return;
                };
                tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
                let lines = match journal.repeats.map.lock() {
                    Ok(mut map) => map.due(Instant::now()),
                    Err(_) => Vec::new(),
                };
                for line in lines {
                    journal.line(line);
                }
            }
        });
    }

    fn write(&self, text: &str) {
        {
            let mut err = std::io::stderr().lock();
            let _ = match &self.prefix {
                Some(p) => writeln!(err, "{p}{text}"),
                None => writeln!(err, "{text}"),
            };
            let _ = err.flush();
        }
        if let Ok(mut slot) = self.file.lock() {
            if let Some(f) = slot.as_mut() {
                let _ = writeln!(f, "{} {text}", utc_timestamp(SystemTime::now()));
                let _ = f.flush();
            }
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a system time (UTC, proleptic Gregorian).
pub fn utc_timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let millis = d.subsec_millis();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Milliseconds since the Unix epoch, for record timestamps (`since`, `updatedAt`).
pub fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_utc_rfc3339() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_000_000_123);
        assert_eq!(utc_timestamp(t), "2026-11-30T00:53:20.123Z");
        assert_eq!(utc_timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn lines_are_appended_to_the_attached_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.log");
        let j = Journal::stderr_only();
        j.attach_file(File::create(&path).unwrap());
        j.line("✓ delivery daemon up (space demo) — stop with: cotal down");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with(" ✓ delivery daemon up (space demo) — stop with: cotal down\n"));
    }

    /// Mutation seen failing: `line` writing through while held (the discarded line appears).
    #[test]
    fn held_lines_are_written_only_when_released() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.log");
        let j = Journal::stderr_only();
        j.attach_file(File::create(&path).unwrap());
        let attempt = j.prefixed("lane demo: ").held();
        attempt.line("first attempt");
        attempt.discard();
        attempt.line("second attempt");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        attempt.release();
        attempt.line("after release");
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().map(|l| l.split_once(' ').unwrap().1).collect();
        assert_eq!(lines, vec!["second attempt", "after release"]);
    }
}
