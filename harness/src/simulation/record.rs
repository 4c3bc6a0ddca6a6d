//! The run's recorder: one history writer shared by every actor of the run (agents, the
//! manager, the nemesis, the observer), the run's clock, op ids, and a running tally for the
//! progress line. Every line is flushed as it is written (`HistoryWriter`), so a run that dies
//! keeps what it recorded.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::simulation::check::{
    Body, Call, Done, Event, HistoryWriter, Member, Ms, Observation, Phase, Process, RowWrite,
    RunHeader, Surfaced,
};

/// An operation invoked and not yet completed.
#[derive(Debug, Clone)]
pub struct OpRef {
    pub id: u64,
    pub process: Process,
    /// The invoke's line.
    pub line: u64,
}

/// What the progress line and the summary count while the run goes.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub posts: u64,
    pub posts_ok: u64,
    pub frames: u64,
    pub faults: BTreeMap<String, u64>,
    pub ops: u64,
    /// Workload operations not issued because their agent was still busy.
    pub skipped: u64,
    pub exits: u64,
    pub phase: Option<Phase>,
}

struct Inner {
    writer: HistoryWriter,
    /// The first write that failed: the run's history is incomplete.
    error: Option<String>,
    tally: Tally,
}

/// The history writer behind a lock, with the run's clock.
pub struct Recorder {
    inner: Mutex<Inner>,
    start: Instant,
    started_unix_ms: u64,
    next_op: AtomicU64,
}

impl Recorder {
    /// Starts the run's clock: ms 0 is now.
    pub fn new(writer: HistoryWriter) -> Recorder {
        let started_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Recorder {
            inner: Mutex::new(Inner {
                writer,
                error: None,
                tally: Tally::default(),
            }),
            start: Instant::now(),
            started_unix_ms,
            next_op: AtomicU64::new(1),
        }
    }

    pub fn started_unix_ms(&self) -> u64 {
        self.started_unix_ms
    }

    /// Milliseconds since the run started (monotonic).
    pub fn now_ms(&self) -> Ms {
        self.start.elapsed().as_millis() as Ms
    }

    /// Sleeps until run time `at` (at once when it has passed): the schedule's clock.
    pub async fn sleep_until_ms(&self, at: Ms) {
        let now = self.now_ms();
        if at > now {
            tokio::time::sleep(std::time::Duration::from_millis(at - now)).await;
        }
    }

    /// A broker's wall-clock stamp in run ms (`None` before the run started).
    pub fn run_ms_of(&self, at: SystemTime) -> Option<Ms> {
        let unix = at.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64;
        unix.checked_sub(self.started_unix_ms)
    }

    fn append(&self, process: Process, body: Body, tally: impl FnOnce(&mut Tally)) -> u64 {
        let event = Event::new(self.now_ms(), process, body);
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match inner.writer.append(&event) {
            Ok(line) => {
                tally(&mut inner.tally);
                line
            }
            Err(e) => {
                if inner.error.is_none() {
                    inner.error = Some(e.to_string());
                }
                0
            }
        }
    }

    pub fn header(&self, header: RunHeader) {
        self.append(Process::Runner, Body::Run(header), |_| {});
    }

    pub fn phase(&self, phase: Phase) -> u64 {
        self.append(Process::Runner, Body::Phase { phase }, |t| {
            t.phase = Some(phase)
        })
    }

    pub fn invoke(&self, process: &Process, call: Call, after_line: Option<u64>) -> OpRef {
        let id = self.next_op.fetch_add(1, Ordering::SeqCst);
        let is_post = matches!(call, Call::Post { .. });
        let fault = match &call {
            Call::FaultStart { kind, .. } => Some(kind.name().to_string()),
            _ => None,
        };
        let line = self.append(
            process.clone(),
            Body::Invoke {
                op: id,
                call,
                after_line,
            },
            |t| {
                t.ops += 1;
                if is_post {
                    t.posts += 1;
                }
                if let Some(k) = fault {
                    *t.faults.entry(k).or_default() += 1;
                }
            },
        );
        OpRef {
            id,
            process: process.clone(),
            line,
        }
    }

    pub fn ok(&self, op: &OpRef, done: Done) {
        let is_post = matches!(done, Done::Post { .. });
        self.append(op.process.clone(), Body::Ok { op: op.id, done }, |t| {
            if is_post {
                t.posts_ok += 1;
            }
        });
    }

    pub fn fail(&self, op: &OpRef, error: impl Into<String>) {
        self.append(
            op.process.clone(),
            Body::Fail {
                op: op.id,
                error: error.into(),
            },
            |_| {},
        );
    }

    pub fn unknown(&self, op: &OpRef, error: impl Into<String>) {
        self.append(
            op.process.clone(),
            Body::Unknown {
                op: op.id,
                error: error.into(),
            },
            |_| {},
        );
    }

    pub fn frame(&self, member: &Member, frame: Surfaced) {
        self.append(Process::Agent(member.clone()), Body::Frame(frame), |t| {
            t.frames += 1
        });
    }

    /// Records what the runner saw a daemon do; returns the line (what a later op's
    /// `after_line` names).
    pub fn observed(&self, daemon: &str, what: Observation) -> u64 {
        let exited = matches!(what, Observation::DaemonExited { .. });
        self.append(
            Process::Daemon(daemon.to_string()),
            Body::Observed(what),
            |t| {
                if exited {
                    t.exits += 1
                }
            },
        )
    }

    /// Records a write to a watched bucket (the row watch's).
    pub fn row(&self, write: RowWrite) {
        self.append(Process::Runner, Body::Row(write), |_| {});
    }

    /// A workload operation not issued (its agent still busy with the last one).
    pub fn skipped(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.tally.skipped += 1;
    }

    pub fn tally(&self) -> Tally {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tally
            .clone()
    }

    /// The first write that failed, if one did.
    pub fn error(&self) -> Option<String> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .error
            .clone()
    }
}
