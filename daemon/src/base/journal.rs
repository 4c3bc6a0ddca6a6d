//! The daemon's human log: the exact lines docs/operations.md lists (`✓ …`, `✗ …`, `! …`, `• …`).
//!
//! These lines are an interface (operators grep them, tests snapshot them), so they are written
//! verbatim, one per call, to stderr and appended with a UTC timestamp to the space's
//! `.cotal/delivery.<key>.log`. Structured `tracing` output is for everything else.
//!
//! When stderr already is that log (`up` redirects its daemon's stdout and stderr onto it),
//! [`StampedStderr`] puts a pipe in between whose reader stamps every line, so a line written
//! there by anything but the journal (a `RUST_LOG` diagnostic, a panic message) also begins
//! with its timestamp, and the journal writes each of its own lines once, through stderr.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::repeats::{Repeats, MAX_KEYS};

/// Set while [`StampedStderr`] stands: stderr is the stamped log, so a line meant only for the
/// log file goes to stderr.
static STDERR_STAMPED: AtomicBool = AtomicBool::new(false);

/// The file the stamping reader writes to, and its path (so SIGUSR1 can reopen it).
type StampSink = (std::path::PathBuf, Arc<Mutex<File>>);
static STAMP_SINK: Mutex<Option<StampSink>> = Mutex::new(None);

/// Bound on waiting for the stamping reader to drain the pipe when the redirect is undone.
const STAMP_DRAIN_BOUND: Duration = Duration::from_secs(2);

/// This process's stdout and stderr redirected through a pipe whose reader appends each line to
/// the log file as `<UTC timestamp> <line>`. Dropping it puts the file back on both descriptors,
/// which closes the pipe, and waits (bounded) for the reader to write what it still holds.
pub struct StampedStderr {
    sink: Arc<Mutex<File>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl StampedStderr {
    /// Installs the redirect onto the log at `path` (opened for appending).
    pub fn install(path: &std::path::Path) -> std::io::Result<StampedStderr> {
        let file = open_append(path)?;
        let (read, write) = nix::unistd::pipe().map_err(std::io::Error::from)?;
        let sink = Arc::new(Mutex::new(file));
        let to = sink.clone();
        let reader = std::thread::Builder::new()
            .name("log-stamper".into())
            .spawn(move || stamp_lines(File::from(read), &to))?;
        let _ = std::io::stdout().flush();
        nix::unistd::dup2_stdout(&write).map_err(std::io::Error::from)?;
        nix::unistd::dup2_stderr(&write).map_err(std::io::Error::from)?;
        drop(write);
        STDERR_STAMPED.store(true, Ordering::SeqCst);
        if let Ok(mut slot) = STAMP_SINK.lock() {
            *slot = Some((path.to_path_buf(), sink.clone()));
        }
        Ok(StampedStderr {
            sink,
            reader: Some(reader),
        })
    }
}

/// Reopens the stamped log at its path (logrotate renamed it: the next line goes to a new
/// file). `None` when stderr is not stamped.
pub fn reopen_stamped() -> Option<std::io::Result<std::path::PathBuf>> {
    let slot = STAMP_SINK.lock().ok()?;
    let (path, sink) = slot.as_ref()?;
    Some(open_append(path).map(|fresh| {
        if let Ok(mut file) = sink.lock() {
            *file = fresh;
        }
        path.clone()
    }))
}

fn open_append(path: &std::path::Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

impl Drop for StampedStderr {
    fn drop(&mut self) {
        let _ = std::io::stdout().flush();
        STDERR_STAMPED.store(false, Ordering::SeqCst);
        if let Ok(mut slot) = STAMP_SINK.lock() {
            *slot = None;
        }
        // The file again on both: the last write end of the pipe closes, the reader sees EOF.
        if let Ok(file) = self.sink.lock() {
            let _ = nix::unistd::dup2_stdout(&*file);
            let _ = nix::unistd::dup2_stderr(&*file);
        }
        if let Some(reader) = self.reader.take() {
            let deadline = Instant::now() + STAMP_DRAIN_BOUND;
            while !reader.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if reader.is_finished() {
                let _ = reader.join();
            }
        }
    }
}

/// Copies `from` line by line into `to`, each line after its UTC timestamp, until EOF.
fn stamp_lines(from: File, to: &Mutex<File>) {
    use std::io::BufRead;
    let mut from = std::io::BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match from.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        let stamped = format!(
            "{} {}\n",
            utc_timestamp(SystemTime::now()),
            text.trim_end_matches(['\n', '\r'])
        );
        // One write per line: another process appending to the same log never splits it.
        if let Ok(mut file) = to.lock() {
            let _ = file.write_all(stamped.as_bytes());
        }
    }
}

/// Whether stderr is the stamped log ([`StampedStderr`] stands): a journal then attaches no file,
/// its lines reach the log through stderr.
pub fn stderr_is_stamped() -> bool {
    STDERR_STAMPED.load(Ordering::SeqCst)
}

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

impl RepeatState {
    fn new(window: Duration) -> RepeatState {
        RepeatState {
            map: Arc::new(Mutex::new(Repeats::new(window, MAX_KEYS))),
            flusher: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Default for RepeatState {
    fn default() -> Self {
        RepeatState::new(super::tuning::DEFAULT_LOG_REPEAT_WINDOW)
    }
}

impl Journal {
    /// A journal that writes to stderr only (until `attach_file`), counting repeated lines
    /// over the default window.
    pub fn stderr_only() -> Journal {
        Journal::default()
    }

    /// A journal that writes to stderr only, counting repeated lines over `window`
    /// ([`super::tuning::Tuning::log_repeat_window`]).
    pub fn with_repeat_window(window: Duration) -> Journal {
        Journal {
            repeats: RepeatState::new(window),
            ..Journal::default()
        }
    }

    /// From now on, also append every line to `file`.
    pub fn attach_file(&self, file: File) {
        if let Ok(mut slot) = self.file.lock() {
            *slot = Some(file);
        }
    }

    /// Reopens the attached file at `path` (logrotate renamed it: the next line goes to a new
    /// file there). `Ok(false)` when no file is attached.
    pub fn reopen(&self, path: &std::path::Path) -> std::io::Result<bool> {
        let mut slot = self
            .file
            .lock()
            .map_err(|_| std::io::Error::other("the log's lock is poisoned"))?;
        if slot.is_none() {
            return Ok(false);
        }
        *slot = Some(open_append(path)?);
        Ok(true)
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

    /// Writes a line to the log file only (a run's first and last lines): appended when a file
    /// is attached, through stderr when stderr is the stamped log, else nowhere.
    pub fn file_line(&self, text: impl AsRef<str>) {
        let text = text.as_ref();
        if let Ok(mut slot) = self.file.lock() {
            if let Some(f) = slot.as_mut() {
                let _ = f
                    .write_all(format!("{} {text}\n", utc_timestamp(SystemTime::now())).as_bytes());
                return;
            }
        }
        if STDERR_STAMPED.load(Ordering::SeqCst) {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{text}");
            let _ = err.flush();
        }
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
                // One write per line: another process appending to the same log never splits it.
                let _ = f
                    .write_all(format!("{} {text}\n", utc_timestamp(SystemTime::now())).as_bytes());
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
        j.line("✓ delivery daemon up (space demo) — stop with: cotal-delivery down --space demo --root /srv/mesh");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with(" ✓ delivery daemon up (space demo) — stop with: cotal-delivery down --space demo --root /srv/mesh\n"));
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
