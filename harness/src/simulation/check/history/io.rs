//! Writing a history line by line, and reading one back: each line parsed (version first),
//! each completion paired with its invoke, every structural fault refused by its line number.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::line::{
    Body, Call, Done, Event, HistoryError, HistoryErrorKind, Member, Ms, Observation, Phase,
    Process, RowWrite, RunHeader, Surfaced, HISTORY_FILE, HISTORY_VERSION, HISTORY_VERSION_OLDEST,
    MAX_EVENTS, MAX_LINE_BYTES,
};

/// Appends events to `<dir>/history.jsonl`, one line each, flushed per line so a run that dies
/// keeps everything it recorded.
pub struct HistoryWriter {
    out: BufWriter<File>,
    path: PathBuf,
    lines: u64,
}

impl HistoryWriter {
    /// Creates the file; refuses one that already exists (a run directory holds one run).
    pub fn create(dir: &Path) -> Result<HistoryWriter, HistoryError> {
        let path = dir.join(HISTORY_FILE);
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| {
                HistoryError::new(
                    HistoryErrorKind::Io,
                    None,
                    format!("creating {}: {e}", path.display()),
                )
                .with_source(e)
            })?;
        Ok(HistoryWriter {
            out: BufWriter::new(file),
            path,
            lines: 0,
        })
    }

    /// Writes one event; returns its line number (what a later invoke's `after_line` names).
    pub fn append(&mut self, event: &Event) -> Result<u64, HistoryError> {
        let line = self.lines + 1;
        let io = |e: std::io::Error, path: &Path| {
            HistoryError::new(
                HistoryErrorKind::Io,
                Some(line),
                format!("writing {}: {e}", path.display()),
            )
            .with_source(e)
        };
        let text = serde_json::to_string(event).map_err(|e| {
            HistoryError::new(HistoryErrorKind::Malformed, Some(line), e.to_string()).with_source(e)
        })?;
        if text.len() > MAX_LINE_BYTES {
            return Err(HistoryError::new(
                HistoryErrorKind::TooLarge,
                Some(line),
                format!(
                    "{} bytes, past the {MAX_LINE_BYTES}-byte line bound",
                    text.len()
                ),
            ));
        }
        self.out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.write_all(b"\n"))
            .and_then(|()| self.out.flush())
            .map_err(|e| io(e, &self.path))?;
        self.lines = line;
        Ok(line)
    }
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    Ok {
        ms: Ms,
        done: Done,
    },
    Fail {
        ms: Ms,
        error: String,
    },
    Unknown {
        ms: Ms,
        error: String,
    },
    /// No completion line before the history ended: as unknown, from the end.
    Pending,
}

impl Completion {
    pub fn is_ok(&self) -> bool {
        matches!(self, Completion::Ok { .. })
    }
    /// Whether the operation may have taken effect without saying so (unknown or pending).
    pub fn is_indeterminate(&self) -> bool {
        matches!(self, Completion::Unknown { .. } | Completion::Pending)
    }
    /// When it completed ok.
    pub fn ok_ms(&self) -> Option<Ms> {
        match self {
            Completion::Ok { ms, .. } => Some(*ms),
            _ => None,
        }
    }
}

/// An invoke paired with its completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub id: u64,
    pub process: Process,
    pub call: Call,
    pub invoke_ms: Ms,
    /// The invoke's line.
    pub line: u64,
    pub after_line: Option<u64>,
    pub outcome: Completion,
}

/// A frame with the agent that surfaced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameEvent {
    pub member: Member,
    pub ms: Ms,
    pub line: u64,
    pub frame: Surfaced,
}

/// An observation with its time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub ms: Ms,
    pub line: u64,
    pub what: Observation,
}

/// A write to a watched bucket, with the line it was recorded on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowEvent {
    pub ms: Ms,
    pub line: u64,
    pub write: RowWrite,
}

/// A history read back and checked for structure: operations paired, frames and observations
/// in line order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    pub header: RunHeader,
    /// In invoke order.
    pub ops: Vec<Op>,
    pub frames: Vec<FrameEvent>,
    pub observed: Vec<Observed>,
    /// Every bucket write the row watch recorded, in line order (version 2 on).
    pub rows: Vec<RowEvent>,
    pub phases: Vec<(Phase, Ms)>,
    /// The last time any line carries.
    pub end_ms: Ms,
}

impl History {
    /// Reads `<dir>/history.jsonl`.
    pub fn read_dir(dir: &Path) -> Result<History, HistoryError> {
        let path = dir.join(HISTORY_FILE);
        let file = File::open(&path).map_err(|e| {
            HistoryError::new(
                HistoryErrorKind::Io,
                None,
                format!("opening {}: {e}", path.display()),
            )
            .with_source(e)
        })?;
        History::parse(BufReader::new(file))
    }

    /// Reads a history from JSON lines; the first malformed or misplaced line is refused by
    /// its number. Blank lines are skipped (an editor's trailing newline).
    pub fn parse(input: impl BufRead) -> Result<History, HistoryError> {
        let mut builder = Builder::default();
        let mut input = input;
        let mut buf = Vec::new();
        let mut line = 0u64;
        loop {
            buf.clear();
            line += 1;
            // One byte past the bound tells a long line from one exactly at it.
            let read = (&mut input)
                .take(MAX_LINE_BYTES as u64 + 2)
                .read_until(b'\n', &mut buf)
                .map_err(|e| {
                    HistoryError::new(HistoryErrorKind::Io, Some(line), e.to_string())
                        .with_source(e)
                })?;
            if read == 0 {
                break;
            }
            let text = buf.strip_suffix(b"\n").unwrap_or(&buf);
            if text.len() > MAX_LINE_BYTES {
                return Err(HistoryError::new(
                    HistoryErrorKind::TooLarge,
                    Some(line),
                    format!("longer than {MAX_LINE_BYTES} bytes"),
                ));
            }
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let event = parse_line(text, line)?;
            builder.add(event, line)?;
        }
        builder.finish()
    }

    /// The schedule as it really happened: every invoke, in time order, with when it fired,
    /// what it waited for and how it ended. A replay re-issues these (the workload's and the
    /// nemesis's alike), keeping both the times and the `after_line` order.
    pub fn schedule(&self) -> Vec<&Op> {
        let mut ops: Vec<&Op> = self.ops.iter().collect();
        ops.sort_by_key(|o| (o.invoke_ms, o.line));
        ops
    }

    /// When a phase started, if it did.
    pub fn phase_ms(&self, phase: Phase) -> Option<Ms> {
        self.phases
            .iter()
            .find(|(p, _)| *p == phase)
            .map(|(_, t)| *t)
    }
}

fn parse_line(text: &[u8], line: u64) -> Result<Event, HistoryError> {
    // The version first, so a future format is refused as such, not as malformed.
    #[derive(Deserialize)]
    struct Version {
        v: Option<u32>,
    }
    let version: Version = serde_json::from_slice(text).map_err(|e| {
        HistoryError::new(HistoryErrorKind::Malformed, Some(line), e.to_string()).with_source(e)
    })?;
    match version.v {
        Some(v) if (HISTORY_VERSION_OLDEST..=HISTORY_VERSION).contains(&v) => {}
        Some(v) => {
            return Err(HistoryError::new(
                HistoryErrorKind::Version,
                Some(line),
                format!(
                    "version {v}; this reader reads versions {HISTORY_VERSION_OLDEST} to {HISTORY_VERSION}"
                ),
            ))
        }
        None => {
            return Err(HistoryError::new(
                HistoryErrorKind::Version,
                Some(line),
                "no \"v\" field",
            ))
        }
    }
    serde_json::from_slice(text).map_err(|e| {
        HistoryError::new(HistoryErrorKind::Malformed, Some(line), e.to_string()).with_source(e)
    })
}

/// Pairs invokes with completions while the lines are read.
#[derive(Default)]
struct Builder {
    header: Option<RunHeader>,
    ops: Vec<Op>,
    /// op id -> index in `ops`.
    by_id: HashMap<u64, usize>,
    frames: Vec<FrameEvent>,
    observed: Vec<Observed>,
    rows: Vec<RowEvent>,
    phases: Vec<(Phase, Ms)>,
    end_ms: Ms,
    lines: u64,
}

impl Builder {
    fn add(&mut self, event: Event, line: u64) -> Result<(), HistoryError> {
        let structure =
            |detail: String| HistoryError::new(HistoryErrorKind::Structure, Some(line), detail);
        self.lines += 1;
        if self.lines as usize > MAX_EVENTS {
            return Err(HistoryError::new(
                HistoryErrorKind::TooLarge,
                Some(line),
                format!("more than {MAX_EVENTS} events"),
            ));
        }
        if self.header.is_none() && !matches!(event.body, Body::Run(_)) {
            return Err(structure(
                "the first event must be the run header (\"type\":\"run\")".into(),
            ));
        }
        self.end_ms = self.end_ms.max(event.ms);
        match event.body {
            Body::Run(header) => {
                if self.header.is_some() {
                    return Err(structure("a second run header".into()));
                }
                self.header = Some(header);
            }
            Body::Phase { phase } => self.phases.push((phase, event.ms)),
            Body::Invoke {
                op,
                call,
                after_line,
            } => {
                if self.by_id.contains_key(&op) {
                    return Err(structure(format!("op {op} invoked twice")));
                }
                if call.needs_agent() && event.process.member().is_none() {
                    return Err(structure(format!(
                        "{} invoked by {}, not by an agent",
                        call.name(),
                        event.process
                    )));
                }
                if let Some(after) = after_line {
                    if after >= line {
                        return Err(structure(format!(
                            "op {op} waits for line {after}, which is not before it"
                        )));
                    }
                }
                self.by_id.insert(op, self.ops.len());
                self.ops.push(Op {
                    id: op,
                    process: event.process,
                    call,
                    invoke_ms: event.ms,
                    line,
                    after_line,
                    outcome: Completion::Pending,
                });
            }
            Body::Ok { op, done } => {
                let target = self.completing(op, &event.process, event.ms, line)?;
                if target.call.name() != done.name() {
                    return Err(structure(format!(
                        "op {op} is a {} but its ok carries a {}",
                        target.call.name(),
                        done.name()
                    )));
                }
                target.outcome = Completion::Ok { ms: event.ms, done };
            }
            Body::Fail { op, error } => {
                let target = self.completing(op, &event.process, event.ms, line)?;
                target.outcome = Completion::Fail {
                    ms: event.ms,
                    error,
                };
            }
            Body::Unknown { op, error } => {
                let target = self.completing(op, &event.process, event.ms, line)?;
                target.outcome = Completion::Unknown {
                    ms: event.ms,
                    error,
                };
            }
            Body::Frame(frame) => {
                let Process::Agent(member) = event.process else {
                    return Err(structure(format!(
                        "a frame surfaced by {}, not by an agent",
                        event.process
                    )));
                };
                self.frames.push(FrameEvent {
                    member,
                    ms: event.ms,
                    line,
                    frame,
                });
            }
            Body::Observed(what) => self.observed.push(Observed {
                ms: event.ms,
                line,
                what,
            }),
            Body::Row(write) => {
                if event.v < 2 {
                    return Err(structure(format!(
                        "a row line in a version-{} history (rows came with version 2)",
                        event.v
                    )));
                }
                self.rows.push(RowEvent {
                    ms: event.ms,
                    line,
                    write,
                })
            }
        }
        Ok(())
    }

    /// The op a completion line completes: invoked before, by the same process, not yet
    /// completed, and not completed before it was invoked.
    fn completing(
        &mut self,
        op: u64,
        process: &Process,
        ms: Ms,
        line: u64,
    ) -> Result<&mut Op, HistoryError> {
        let structure =
            |detail: String| HistoryError::new(HistoryErrorKind::Structure, Some(line), detail);
        let Some(&index) = self.by_id.get(&op) else {
            return Err(structure(format!(
                "completion of op {op}, which was never invoked"
            )));
        };
        let target = &mut self.ops[index];
        if &target.process != process {
            return Err(structure(format!(
                "op {op} was invoked by {} but completed by {process}",
                target.process
            )));
        }
        if target.outcome != Completion::Pending {
            return Err(structure(format!("op {op} completed twice")));
        }
        if ms < target.invoke_ms {
            return Err(structure(format!(
                "op {op} completed at {ms} ms, before its invoke at {} ms",
                target.invoke_ms
            )));
        }
        Ok(target)
    }

    fn finish(self) -> Result<History, HistoryError> {
        let header = self.header.ok_or_else(|| {
            HistoryError::new(HistoryErrorKind::Structure, None, "empty: no run header")
        })?;
        Ok(History {
            header,
            ops: self.ops,
            frames: self.frames,
            observed: self.observed,
            rows: self.rows,
            phases: self.phases,
            end_ms: self.end_ms,
        })
    }
}
