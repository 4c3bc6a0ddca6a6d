//! The daemon's human log: the exact lines the seeds quote (`✓ …`, `✗ …`, `! …`, `• …`).
//!
//! These lines are an interface (operators grep them, tests snapshot them), so they are written
//! verbatim, one per call, to stderr and appended with a UTC timestamp to the space's
//! `.cotal/delivery.<key>.log`. Structured `tracing` output is for everything else.

use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// A cheap, clonable handle on the daemon's human log.
#[derive(Clone, Default)]
pub struct Journal {
    file: Arc<Mutex<Option<File>>>,
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

    /// Writes one line. Failures to write are ignored: the log never takes the daemon down.
    pub fn line(&self, text: impl AsRef<str>) {
        let text = text.as_ref();
        {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{text}");
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
}
