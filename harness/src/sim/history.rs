//! The history of a simulation run: every operation as invoke then ok / fail / unknown (Jepsen's
//! `:invoke/:ok/:fail/:info`), every frame an agent surfaced, and what the runner saw of the
//! daemons, one JSON object per line in `<run dir>/history.jsonl`.
//!
//! Why lines: a run killed half-way still leaves every line written before it, and the checker
//! can be run again on a stored history. Why invoke *and* completion: an operation whose reply
//! never came (`unknown`) may or may not have happened, and the checker must know which
//! operations were in flight when, to tell a loss from a legitimate drop. Every line carries
//! `"v": 1`; a reader refuses any other version, and any malformed line, naming its number.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use cotal_delivery::wire::{LifecycleUid, Principal};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The history format's version, on every line.
pub const HISTORY_VERSION: u32 = 1;
/// The file a run directory keeps its history in.
pub const HISTORY_FILE: &str = "history.jsonl";
/// Longest line a reader accepts: a frame or an operation is a few hundred bytes; a line past
/// this is a corrupt file, not an event.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Most events a reader accepts: bounds the checker's memory (a 30-minute run at 20 agents
/// writes well under a million).
pub const MAX_EVENTS: usize = 5_000_000;

/// Milliseconds since the run started (the runner's monotonic clock).
pub type Ms = u64;

/// One agent lifecycle: `local.bob#<lifecycle uid>`. The principal alone is not enough: a
/// retired lifecycle and its successor share it, and the contract treats them apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Member {
    principal: Principal,
    uid: LifecycleUid,
}

impl Member {
    pub fn new(principal: Principal, uid: LifecycleUid) -> Member {
        Member { principal, uid }
    }
    /// Parses `<owner>.<actor>#<uid>`, each part by the wire grammar.
    pub fn parse(raw: &str) -> Result<Member, String> {
        let (p, u) = raw
            .split_once('#')
            .ok_or_else(|| format!("member {raw:?} is not <owner>.<actor>#<lifecycle uid>"))?;
        let principal = Principal::parse(p).map_err(|e| format!("member {raw:?}: {e}"))?;
        let uid = LifecycleUid::parse(u).map_err(|e| format!("member {raw:?}: {e}"))?;
        Ok(Member { principal, uid })
    }
    pub fn principal(&self) -> &Principal {
        &self.principal
    }
    pub fn uid(&self) -> &LifecycleUid {
        &self.uid
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.principal.dot_form(), self.uid)
    }
}

impl Serialize for Member {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Member {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Member, D::Error> {
        let raw = String::deserialize(d)?;
        Member::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// Who did an operation or saw an event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Process {
    /// An agent lifecycle: `local.bob#<uid>`.
    Agent(Member),
    /// The fault injector: `nemesis`.
    Nemesis,
    /// The manager role (ACL rows, retirements): `manager`.
    Manager,
    /// The runner itself (provisioning, phases, starting daemons): `runner`.
    Runner,
    /// A daemon the runner started, by its short name: `daemon:a`.
    Daemon(String),
}

impl Process {
    fn parse(raw: &str) -> Result<Process, String> {
        match raw {
            "nemesis" => Ok(Process::Nemesis),
            "manager" => Ok(Process::Manager),
            "runner" => Ok(Process::Runner),
            _ => match raw.strip_prefix("daemon:") {
                Some(name) if !name.is_empty() => Ok(Process::Daemon(name.to_string())),
                Some(_) => Err("process \"daemon:\" names no daemon".to_string()),
                None => Member::parse(raw).map(Process::Agent).map_err(|e| {
                    format!("process {raw:?} is none of nemesis, manager, runner, daemon:<name>, an agent ({e})")
                }),
            },
        }
    }
    /// The agent lifecycle, for an agent process.
    pub fn member(&self) -> Option<&Member> {
        match self {
            Process::Agent(m) => Some(m),
            _ => None,
        }
    }
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Process::Agent(m) => m.fmt(f),
            Process::Nemesis => f.write_str("nemesis"),
            Process::Manager => f.write_str("manager"),
            Process::Runner => f.write_str("runner"),
            Process::Daemon(n) => write!(f, "daemon:{n}"),
        }
    }
}

impl Serialize for Process {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Process {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Process, D::Error> {
        let raw = String::deserialize(d)?;
        Process::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// A channel's delivery class, as the workload configured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    Durable,
    Live,
}

/// What the nemesis did. The names are the fault list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL of a daemon (restarted at the fault's end).
    DaemonKill,
    /// SIGSTOP of a daemon, SIGCONT at the end.
    DaemonPause,
    /// SIGTERM of a daemon, started again at the end.
    DaemonRestart,
    /// SIGKILL of the broker (a cluster node with `target` naming it), restarted at the end.
    BrokerKill,
    /// SIGSTOP of the broker, SIGCONT at the end: it stops answering without closing sockets.
    BrokerPause,
    /// The proxy drops every byte, both ways, until the end.
    ProxyBlackhole,
    /// The proxy closes every connection and refuses new ones until the end.
    ProxyCut,
    /// One node of the R3 cluster killed, restarted at the end.
    NodeKill,
    /// The daemon's credential let expire with no renewal.
    CredentialExpiry,
    /// The daemon's credential let expire, a renewal written before the backstop.
    CredentialExpiryRenewed,
    /// The lease row deleted under its holder.
    LeaseDelete,
}

impl FaultKind {
    /// Whether the fault can cut a daemon off its broker (the broker-gone watchdog's cause).
    pub fn cuts_broker(self) -> bool {
        matches!(
            self,
            FaultKind::BrokerKill
                | FaultKind::BrokerPause
                | FaultKind::ProxyBlackhole
                | FaultKind::ProxyCut
                | FaultKind::NodeKill
        )
    }
    /// Whether the broker stops answering without closing the socket: the daemon counts it as
    /// disconnected only once its pings go unanswered.
    pub fn is_silent(self) -> bool {
        matches!(self, FaultKind::BrokerPause | FaultKind::ProxyBlackhole)
    }
    /// Whether the fault freezes its target process (no progress, no lines) until its end.
    pub fn freezes(self) -> bool {
        self == FaultKind::DaemonPause
    }
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::DaemonKill => "daemon-kill",
            FaultKind::DaemonPause => "daemon-pause",
            FaultKind::DaemonRestart => "daemon-restart",
            FaultKind::BrokerKill => "broker-kill",
            FaultKind::BrokerPause => "broker-pause",
            FaultKind::ProxyBlackhole => "proxy-blackhole",
            FaultKind::ProxyCut => "proxy-cut",
            FaultKind::NodeKill => "node-kill",
            FaultKind::CredentialExpiry => "credential-expiry",
            FaultKind::CredentialExpiryRenewed => "credential-expiry-renewed",
            FaultKind::LeaseDelete => "lease-delete",
        }
    }
}

/// An operation as invoked: what was asked, with its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "snake_case", deny_unknown_fields)]
pub enum Call {
    /// The runner provisions an agent lifecycle: its credential, its read-ACL row (`allow`)
    /// and its card name (what mentions resolve).
    Provision {
        member: Member,
        name: String,
        allow: Vec<String>,
    },
    /// The invoking agent posts. `id: null` is an id-less post (no duplicate suppression).
    /// `tag` is the workload's own unique token, carried in the message text, so a frame of an
    /// id-less post can still be told apart from another post's.
    Post {
        channel: String,
        class: Class,
        id: Option<String>,
        tag: String,
        #[serde(default)]
        mentions: Vec<String>,
    },
    /// The invoking agent asks `durableJoin`.
    Join { channel: String },
    /// The invoking agent asks `durableLeave` of the generation it joined.
    Leave { channel: String, generation: u64 },
    /// The manager rewrites `member`'s read-ACL row to `allow`, excluding channels.
    AclNarrow { member: Member, allow: Vec<String> },
    /// The manager rewrites `member`'s read-ACL row to `allow`, including channels.
    AclWiden { member: Member, allow: Vec<String> },
    /// The manager retires `member`'s lifecycle (the tombstone on its ACL row).
    Retire { member: Member },
    /// The invoking agent disconnects (and stops announcing presence).
    Offline,
    /// The invoking agent connects, announces presence and binds its `dlv_` durable.
    Online,
    /// The nemesis starts fault `fault` on `target` (`daemon:a`, `broker`, `node:2`, `proxy`,
    /// `lease`); `planned_ms` is how long the schedule meant it to last.
    FaultStart {
        fault: u64,
        kind: FaultKind,
        target: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        planned_ms: Option<u64>,
    },
    /// The nemesis ends fault `fault` (SIGCONT, restart, heal the proxy, renew).
    FaultEnd { fault: u64 },
    /// The runner starts daemon `daemon` (a process; serving is observed separately).
    DaemonStart { daemon: String },
    /// The runner stops daemon `daemon` with SIGTERM (the end of the run, not a fault).
    DaemonStop { daemon: String },
}

impl Call {
    /// The operation's name (`f`), as on its line.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Provision { .. } => "provision",
            Call::Post { .. } => "post",
            Call::Join { .. } => "join",
            Call::Leave { .. } => "leave",
            Call::AclNarrow { .. } => "acl_narrow",
            Call::AclWiden { .. } => "acl_widen",
            Call::Retire { .. } => "retire",
            Call::Offline => "offline",
            Call::Online => "online",
            Call::FaultStart { .. } => "fault_start",
            Call::FaultEnd { .. } => "fault_end",
            Call::DaemonStart { .. } => "daemon_start",
            Call::DaemonStop { .. } => "daemon_stop",
        }
    }
    /// Whether only an agent process may invoke it (it acts as the invoking agent).
    fn needs_agent(&self) -> bool {
        matches!(
            self,
            Call::Post { .. }
                | Call::Join { .. }
                | Call::Leave { .. }
                | Call::Offline
                | Call::Online
        )
    }
}

/// What an `ok` completion carries, by the operation it completes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "snake_case", deny_unknown_fields)]
pub enum Done {
    /// The ACL row's revision as the broker acknowledged the write.
    Provision {
        revision: u64,
    },
    /// The CHAT stream sequence of the stored post.
    Post {
        seq: u64,
    },
    /// `{durable: true, generation}`; the join cursor when the runner read the member row.
    Join {
        generation: u64,
        #[serde(default)]
        join_cursor: Option<u64>,
    },
    /// `{channel}` or `{channel, alreadyLeft: true}`; the leave cursor when the runner read the
    /// member row.
    Leave {
        #[serde(default)]
        leave_cursor: Option<u64>,
        #[serde(default)]
        already_left: bool,
    },
    AclNarrow {
        revision: u64,
    },
    AclWiden {
        revision: u64,
    },
    Retire {
        revision: u64,
    },
    Offline,
    Online,
    /// The fault is in place (the signal delivered, the proxy switched, the row deleted).
    FaultStart,
    /// The fault is over (the process continued or restarted, the proxy healed).
    FaultEnd,
    /// The daemon process runs, with this pid.
    DaemonStart {
        pid: u32,
    },
    DaemonStop,
}

impl Done {
    pub fn name(&self) -> &'static str {
        match self {
            Done::Provision { .. } => "provision",
            Done::Post { .. } => "post",
            Done::Join { .. } => "join",
            Done::Leave { .. } => "leave",
            Done::AclNarrow { .. } => "acl_narrow",
            Done::AclWiden { .. } => "acl_widen",
            Done::Retire { .. } => "retire",
            Done::Offline => "offline",
            Done::Online => "online",
            Done::FaultStart => "fault_start",
            Done::FaultEnd => "fault_end",
            Done::DaemonStart { .. } => "daemon_start",
            Done::DaemonStop => "daemon_stop",
        }
    }
}

/// A frame an agent surfaced (handed to its caller), as the agent read it from its `dlv_`
/// durable. The member is the event's process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Surfaced {
    /// The frame's `channel` (authenticated by the reader from the CHAT subject).
    pub channel: String,
    /// The message id; `None` for an id-less post (`""` on the wire).
    pub id: Option<String>,
    /// The workload tag found in the message text, if any.
    #[serde(default)]
    pub tag: Option<String>,
    /// The CHAT sequence, if the frame carries one (today's frame does not).
    #[serde(default)]
    pub chat_seq: Option<u64>,
    /// The frame's `DLV_<s>` stream sequence.
    pub dlv_seq: u64,
    /// When the broker stored the frame (its stamp, in run ms): the latest the reader's check
    /// can have run. `None` when the runner could not read it.
    #[serde(default)]
    pub handed_off_ms: Option<Ms>,
    /// Whether the agent's double-ack of the frame was confirmed by the broker. An unconfirmed
    /// ack is the crash between hand-off and surface the seeds allow to redeliver.
    pub acked: bool,
}

/// Something the runner saw a daemon do, not asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "what", rename_all = "snake_case", deny_unknown_fields)]
pub enum Observation {
    /// `✓ delivery daemon up` or `✓ delivery: serving shard 0 again`: the daemon serves, under
    /// the lease row of `holder` / `incarnation`.
    DaemonServing {
        daemon: String,
        holder: String,
        incarnation: String,
    },
    /// `! delivery: stopped serving shard 0 …`: the daemon quiesced.
    DaemonQuiesced { daemon: String },
    /// The daemon process ended: its exit code, or the signal that ended it, and the last line
    /// it wrote (`None`: none, as after a SIGKILL).
    DaemonExited {
        daemon: String,
        #[serde(default)]
        pid: Option<u32>,
        #[serde(default)]
        code: Option<i32>,
        #[serde(default)]
        signal: Option<i32>,
        #[serde(default)]
        last_line: Option<String>,
    },
}

/// The run's phases (Jepsen's quiet, faults, recover, final reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Quiet,
    Faults,
    Heal,
    Drain,
    End,
}

/// The first line: what ran, so a replay can run it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunHeader {
    pub seed: u64,
    /// The commit of the harness that wrote the history.
    pub commit: String,
    /// The daemon binary under test.
    pub daemon: String,
    pub cluster: bool,
    pub standby: bool,
    /// Wall clock at run start (Unix ms): run ms 0.
    pub started_unix_ms: u64,
    /// Replaying: the run directory whose schedule this run follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<String>,
}

/// What one line says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Body {
    Run(RunHeader),
    Phase {
        phase: Phase,
    },
    /// `after_line`: the line of the observed event this operation waited for (replay keeps
    /// that order, not only the time).
    Invoke {
        op: u64,
        call: Call,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after_line: Option<u64>,
    },
    Ok {
        op: u64,
        done: Done,
    },
    Fail {
        op: u64,
        error: String,
    },
    /// No answer, or an answer that does not say whether it happened (Jepsen's `:info`).
    Unknown {
        op: u64,
        error: String,
    },
    Frame(Surfaced),
    Observed(Observation),
}

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub v: u32,
    pub ms: Ms,
    pub process: Process,
    #[serde(flatten)]
    pub body: Body,
}

impl Event {
    pub fn new(ms: Ms, process: Process, body: Body) -> Event {
        Event {
            v: HISTORY_VERSION,
            ms,
            process,
            body,
        }
    }
}

/// Why a history could not be read or written.
#[derive(Debug)]
pub struct HistoryError {
    kind: HistoryErrorKind,
    line: Option<u64>,
    detail: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// What was wrong with a history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryErrorKind {
    /// The file could not be opened, read or written.
    Io,
    /// A line is not JSON of an event.
    Malformed,
    /// A line's `v` is not [`HISTORY_VERSION`].
    Version,
    /// Lines that parse but do not fit together (a completion of no invoke, a post by the
    /// nemesis, no header first).
    Structure,
    /// A line or the whole history is past its bound.
    TooLarge,
}

impl HistoryError {
    fn new(kind: HistoryErrorKind, line: Option<u64>, detail: impl Into<String>) -> HistoryError {
        HistoryError {
            kind,
            line,
            detail: detail.into(),
            source: None,
        }
    }
    fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }
    pub fn kind(&self) -> HistoryErrorKind {
        self.kind
    }
    /// The 1-based line the error is about, when it is about one.
    pub fn line(&self) -> Option<u64> {
        self.line
    }
}

impl fmt::Display for HistoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(n) => write!(f, "history line {n}: {}", self.detail),
            None => write!(f, "history: {}", self.detail),
        }
    }
}

impl std::error::Error for HistoryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

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
pub enum Outcome {
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

impl Outcome {
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok { .. })
    }
    /// Whether the operation may have taken effect without saying so (unknown or pending).
    pub fn is_indeterminate(&self) -> bool {
        matches!(self, Outcome::Unknown { .. } | Outcome::Pending)
    }
    /// When it completed ok.
    pub fn ok_ms(&self) -> Option<Ms> {
        match self {
            Outcome::Ok { ms, .. } => Some(*ms),
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
    pub outcome: Outcome,
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

/// A history read back and checked for structure: operations paired, frames and observations
/// in line order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    pub header: RunHeader,
    /// In invoke order.
    pub ops: Vec<Op>,
    pub frames: Vec<FrameEvent>,
    pub observed: Vec<Observed>,
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
        Some(HISTORY_VERSION) => {}
        Some(v) => {
            return Err(HistoryError::new(
                HistoryErrorKind::Version,
                Some(line),
                format!("version {v}; this reader reads version {HISTORY_VERSION}"),
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
                    outcome: Outcome::Pending,
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
                target.outcome = Outcome::Ok { ms: event.ms, done };
            }
            Body::Fail { op, error } => {
                let target = self.completing(op, &event.process, event.ms, line)?;
                target.outcome = Outcome::Fail {
                    ms: event.ms,
                    error,
                };
            }
            Body::Unknown { op, error } => {
                let target = self.completing(op, &event.process, event.ms, line)?;
                target.outcome = Outcome::Unknown {
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
        if target.outcome != Outcome::Pending {
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
            phases: self.phases,
            end_ms: self.end_ms,
        })
    }
}
