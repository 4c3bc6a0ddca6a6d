//! The history format: the line types (one JSON object per line, `"v": 2`) and the error a
//! reader gives for a line it refuses.

use std::fmt;

use cotal_delivery::wire::{LifecycleUid, Principal, WireError};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The history format's version, on every line. Version 2 added the `row` line (every write to
/// the members and ACL buckets as the broker stored it); a reader reads versions 1 and 2.
pub const HISTORY_VERSION: u32 = 2;
/// The oldest version a reader still reads (a version-1 history has no `row` lines: the checker
/// then infers cursors and ACL states from the operations, as it did).
pub const HISTORY_VERSION_OLDEST: u32 = 1;
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
    pub fn parse(raw: &str) -> Result<Member, MemberError> {
        let error = |kind, source| MemberError {
            kind,
            raw: raw.to_string(),
            source,
        };
        let (p, u) = raw
            .split_once('#')
            .ok_or_else(|| error(MemberErrorKind::Form, None))?;
        let principal = Principal::parse(p).map_err(|e| error(MemberErrorKind::Token, Some(e)))?;
        let uid = LifecycleUid::parse(u).map_err(|e| error(MemberErrorKind::Token, Some(e)))?;
        Ok(Member { principal, uid })
    }
    pub fn principal(&self) -> &Principal {
        &self.principal
    }
    pub fn uid(&self) -> &LifecycleUid {
        &self.uid
    }
}

/// Why a member could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberError {
    kind: MemberErrorKind,
    raw: String,
    source: Option<WireError>,
}

/// What was wrong with a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberErrorKind {
    /// Not `<principal>#<uid>`.
    Form,
    /// The principal or the uid breaks the wire grammar (the source says which rule).
    Token,
}

impl MemberError {
    pub fn kind(&self) -> MemberErrorKind {
        self.kind
    }
}

impl fmt::Display for MemberError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            None => write!(
                f,
                "member {:?} is not <owner>.<actor>#<lifecycle uid>",
                self.raw
            ),
            Some(e) => write!(f, "member {:?}: {e}", self.raw),
        }
    }
}

impl std::error::Error for MemberError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
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
    /// One way: from the first of the daemon's writes to a store (its target names which: a
    /// copy to `INBOX_<s>`, a hand-off to `DLV_<s>`), the proxy drops every byte that daemon
    /// connection sends while the broker's deliveries still reach it, on each connection, until
    /// the end: the daemon's writes are lost while it still works and, its pings unanswered,
    /// dials again.
    ProxySwallow,
    /// One stream the daemon writes (its target: `stream:INBOX_<s>` copies or `stream:DLV_<s>`
    /// hand-offs) refuses every new message, as a store at its limit does (its `max_msgs` set to
    /// what it holds, discard new), until the end: the daemon's writes there fail at once while
    /// everything else works.
    StoreFull,
    /// One node of the R3 cluster killed, restarted at the end.
    NodeKill,
    /// The daemon's credential let expire with no remint.
    CredentialExpiry,
    /// The daemon's credential let expire, a remint written before the backstop (adopted).
    /// Histories written before the glossary's words (docs/architecture.md) name it
    /// `credential-expiry-renewed`; the alias keeps them readable.
    #[serde(alias = "credential-expiry-renewed")]
    CredentialExpiryReminted,
    /// The lease row deleted under its holder.
    LeaseDelete,
    /// The daemon's proxy delays every chunk, both ways, by a drawn time (its shape: a base and
    /// a jitter), below the ping interval's round trip: a slow, jittery link.
    ProxyLatency,
    /// The broker (a cluster node with `target` naming it) SIGSTOPped for less than the ping
    /// interval, again and again (its shape: each stop and the gap between), SIGCONT at the
    /// end: a slow broker, never silent long enough to count as gone.
    BrokerSlow,
    /// One cluster node cut off from the other two (its route connections through proxies cut
    /// and new ones held), healed at the end; the daemon's own connection lands on either side
    /// (its shape names the node cut off and the daemon's node).
    Partition,
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
                | FaultKind::ProxySwallow
                | FaultKind::NodeKill
                | FaultKind::Partition
        )
    }
    /// Whether the broker stops answering without closing the socket: the daemon counts it as
    /// disconnected only once its pings go unanswered.
    pub fn is_silent(self) -> bool {
        matches!(
            self,
            FaultKind::BrokerPause | FaultKind::ProxyBlackhole | FaultKind::ProxySwallow
        )
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
            FaultKind::ProxySwallow => "proxy-swallow",
            FaultKind::StoreFull => "store-full",
            FaultKind::NodeKill => "node-kill",
            FaultKind::CredentialExpiry => "credential-expiry",
            FaultKind::CredentialExpiryReminted => "credential-expiry-reminted",
            FaultKind::LeaseDelete => "lease-delete",
            FaultKind::ProxyLatency => "proxy-latency",
            FaultKind::BrokerSlow => "broker-slow",
            FaultKind::Partition => "partition",
        }
    }
}

/// The drawn parameters of a fault whose kind alone does not say what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "shape", rename_all = "snake_case", deny_unknown_fields)]
pub enum FaultShape {
    /// A proxy latency: each chunk waits `base_ms` plus up to `jitter_ms`.
    Latency { base_ms: u64, jitter_ms: u64 },
    /// A slow broker: SIGSTOP for `stop_ms`, SIGCONT, `gap_ms`, again until the end.
    Stutter { stop_ms: u64, gap_ms: u64 },
    /// A partition: node `node` cut off from the others; `daemon_node` is the node the
    /// serving daemon's connection was on when it began (`None`: not found).
    Partition {
        node: usize,
        #[serde(default)]
        daemon_node: Option<usize>,
    },
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
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shape: Option<FaultShape>,
    },
    /// The nemesis ends fault `fault` (SIGCONT, restart, heal the proxy, remint).
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
    pub(super) fn needs_agent(&self) -> bool {
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
    /// The fault is over (the process continued or restarted, the proxy healed); `evidence`
    /// is what the fault really did, as the process or the broker showed it (a slow broker's
    /// stops and their total).
    FaultEnd {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        evidence: Option<String>,
    },
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
            Done::FaultEnd { .. } => "fault_end",
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

/// A bucket whose writes the runner's row watch records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowBucket {
    /// `cotal_members_<s>`: one row per (channel, lifecycle), written by the daemon.
    Members,
    /// `cotal_acl_<s>`: one read-ACL row per lifecycle, written by the manager.
    Acl,
}

impl RowBucket {
    pub fn name(self) -> &'static str {
        match self {
            RowBucket::Members => "members",
            RowBucket::Acl => "acl",
        }
    }
}

/// What a write to a bucket key did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowChange {
    /// A value written.
    Put,
    /// A delete marker.
    Delete,
    /// A purge marker (every earlier revision of the key removed).
    Purge,
}

/// One write to the members or ACL bucket, as the broker stored it: what decides a cursor or an
/// ACL state even when a later revision replaced the row (the buckets keep one per key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowWrite {
    pub bucket: RowBucket,
    /// The bucket key (`<channel>/<o>.<a>.<uid>` or `<o>.<a>.<uid>`).
    pub key: String,
    /// The KV revision (the bucket stream's sequence).
    pub revision: u64,
    pub change: RowChange,
    /// The broker's stamp of the write, in run ms.
    pub stamp_ms: Ms,
    /// The row's JSON, for a put that parses (`None` for a marker).
    #[serde(default)]
    pub value: Option<serde_json::Value>,
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
    /// A write to the members or ACL bucket (version 2 on).
    Row(RowWrite),
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
    pub(super) fn new(
        kind: HistoryErrorKind,
        line: Option<u64>,
        detail: impl Into<String>,
    ) -> HistoryError {
        HistoryError {
            kind,
            line,
            detail: detail.into(),
            source: None,
        }
    }
    pub(super) fn with_source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
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
