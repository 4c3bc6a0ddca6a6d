//! The checker's report: the verdict, what made it, and every finding with enough to find it
//! in the history (op ids, lines, times). Serialises to JSON for `--json`; [`Report::summary`]
//! is the table a person reads at the end of a run.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::history::{FaultKind, Member, Ms};

/// Most findings of one kind the human summary lists (the JSON has them all).
pub const SUMMARY_ITEMS_MAX: usize = 20;

/// Valid: nothing wrong was found and everything was decided. Invalid: something the contract
/// forbids happened. Unknown: nothing invalid, but some post or frame could not be decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Valid,
    Invalid,
    Unknown,
}

impl Verdict {
    /// The exit code `harness simulate` gives it (Jepsen's: 0 valid, 1 invalid, 2 unknown).
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Valid => 0,
            Verdict::Invalid => 1,
            Verdict::Unknown => 2,
        }
    }
}

/// A post, as findings name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PostRef {
    pub op: u64,
    pub sender: Member,
    pub channel: String,
    pub seq: Option<u64>,
    pub id: Option<String>,
    pub tag: String,
}

/// A fault, as findings name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FaultRef {
    pub id: u64,
    pub kind: FaultKind,
    pub target: String,
    pub from_ms: Ms,
    pub to_ms: Ms,
}

/// Where an undelivered post still sat when the drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stuck {
    /// Handed off to the member's `DLV_<s>`, never surfaced.
    Dlv,
    /// Still an entry in `INBOX_<s>`, never handed off.
    Inbox,
    /// Still in `CHAT_<s>` above the fan-out writer's ack floor: never copied, never settled.
    Chat,
    /// Settled by the fan-out writer (its ack floor is past the post) with no copy pending
    /// anywhere, though `CHAT_<s>` still holds it.
    PassedByFanout,
    /// `CHAT_<s>` no longer holds the post's sequence although the broker acknowledged the
    /// publish: the broker lost an acknowledged message (not the daemon's doing).
    GoneFromChat,
}

/// A post an eligible member never surfaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lost {
    pub post: PostRef,
    pub member: Member,
    pub stuck: Option<Stuck>,
    /// Faults between the post's invoke and the end of the run.
    pub faults: Vec<FaultRef>,
}

/// An owed post the member never surfaced, excused because it sits in the catch-up window of
/// the member's join that was answered `durable:false` (the catch-up failed, the row stands):
/// such an answer promises nothing for `(join_cursor, frontier]`. Named, not counted as lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Excused {
    pub post: PostRef,
    pub member: Member,
    /// The join answered `durable:false`.
    pub join_op: u64,
    pub generation: u64,
    pub join_cursor: u64,
    /// The most the catch-up's frontier can have been (the window's upper bound).
    pub frontier_max: u64,
}

/// What an undecided finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Undecided {
    /// Whether the member was owed the post.
    Owed,
    /// Whether a surfaced frame was a leak.
    Leak,
}

/// A post or frame the history cannot decide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Uncertain {
    pub post: PostRef,
    pub member: Member,
    pub about: Undecided,
    pub why: String,
}

/// Why a surfaced frame was a leak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LeakKind {
    /// The post's CHAT sequence is outside every membership interval of the member.
    OutsideInterval,
    /// The reader's check certainly ran after a narrowing excluding the channel was
    /// acknowledged (op `op`, at `acked_ms`).
    AfterNarrowing { op: u64, acked_ms: Ms },
    /// The same, after the lifecycle's retirement was acknowledged.
    AfterRetirement { op: u64, acked_ms: Ms },
    /// By the row log: every state of the member's ACL row the broker held from the post to the
    /// hand-off excluded the channel (the first of them: `revision`, stored at `stored_ms`;
    /// `retired`: the tombstone).
    AclExcluded {
        revision: u64,
        stored_ms: Ms,
        retired: bool,
    },
}

/// A frame surfaced to a member who must not have had it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Leak {
    pub post: PostRef,
    pub member: Member,
    pub surfaced_ms: Ms,
    pub line: u64,
    pub dlv_seq: u64,
    #[serde(flatten)]
    pub kind: LeakKind,
}

/// Why a surfaced frame fits no post it could be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum UnexpectedKind {
    /// Its tag, id or sequence names no post of the history.
    NoSuchPost,
    /// Its post failed (the broker said it was not stored).
    FailedPost { op: u64 },
    /// It came on another channel than its post's.
    WrongChannel { op: u64, posted_on: String },
    /// The sender surfaced its own post.
    SenderCopy { op: u64 },
    /// A live-channel post to a member none of its mentions names.
    NotMentioned { op: u64 },
}

/// A frame that fits no post it could be (Jepsen's "unexpected").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unexpected {
    pub member: Member,
    pub surfaced_ms: Ms,
    pub line: u64,
    pub channel: String,
    pub dlv_seq: u64,
    #[serde(flatten)]
    pub kind: UnexpectedKind,
}

/// Why a frame surfaced again, and whether the seeds allow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DuplicateWhy {
    /// Allowed: an id-less post has no duplicate-suppression key, so a redelivery of its entry
    /// may surface twice.
    IdLess,
    /// Allowed: the same frame again after a surface whose ack was never confirmed (the crash
    /// between hand-off and surface).
    AckUnconfirmed,
    /// Allowed: a second hand-off after a daemon exit, further apart than the broker's
    /// duplicate window (the entry redelivered after the dedup id was forgotten).
    CrashRedelivery,
    /// Allowed: the same frame again after its ack was confirmed, the broker (or a cluster
    /// node) SIGKILLed within `BROKER_ACK_LOSS_MS` after that ack: it restarted from the
    /// consumer state it had stored before the ack; or, on the cluster, a node cut off or
    /// killed around the ack (running then, or begun within that bound after it): the consumer
    /// leader that confirmed it was replaced by a follower that never got it. The broker's
    /// doing, not the daemon's.
    BrokerLostAck,
    /// Allowed: a rejoin raced the post. Handed off under the generation the rejoin closed (a
    /// decision taken before the rejoin's row was written, with the interval still open), and
    /// again under the new generation, whose interval admits it, once the rejoin was written
    /// (its activation catch-up); each copy carries its generation in its duplicate-suppression
    /// id, so the broker keeps both. By the row log: the new generation was first written
    /// between the post's invoke and the second hand-off (the first copy may be handed off
    /// after the rejoin was written, by a check read before it).
    RejoinRace,
    /// Not allowed: the same frame again after its ack was confirmed.
    AfterConfirmedAck,
    /// Not allowed: a second hand-off of a post with an id, with no crash to explain it.
    SecondHandOff,
}

impl DuplicateWhy {
    pub fn allowed(self) -> bool {
        matches!(
            self,
            DuplicateWhy::IdLess
                | DuplicateWhy::AckUnconfirmed
                | DuplicateWhy::CrashRedelivery
                | DuplicateWhy::BrokerLostAck
                | DuplicateWhy::RejoinRace
        )
    }
}

/// A frame a member surfaced more than once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Duplicate {
    pub post: PostRef,
    pub member: Member,
    pub first_ms: Ms,
    pub again_ms: Ms,
    pub first_dlv_seq: u64,
    pub again_dlv_seq: u64,
    pub allowed: bool,
    pub why: DuplicateWhy,
}

/// How two daemons were seen serving at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OverlapSeen {
    /// Both said they served (their serving lines, no quiesce or exit between).
    BothServing,
    /// `a` said it served while the lease row of `b` was written.
    RowOfAnother,
}

/// Two daemons serving at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Overlap {
    pub a: String,
    pub b: String,
    pub from_ms: Ms,
    pub to_ms: Ms,
    pub seen: OverlapSeen,
}

/// A lease row written over another holder's live row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ForeignWrite {
    pub revision: u64,
    pub ms: Ms,
    /// The writer (a daemon's name when the history maps its holder, else `holder/incarnation`).
    pub writer: String,
    /// The holder whose live row it replaced.
    pub over: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SingleFlight {
    pub overlaps: Vec<Overlap>,
    pub foreign_writes: Vec<ForeignWrite>,
}

/// What a daemon's exit was, by its last line (and its code or signal when the line says
/// nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitClass {
    /// `✗ delivery: broker connection unavailable (broker unreachable), exiting …` (exit 9).
    BrokerGone,
    /// `… unavailable past backstop (broker unreachable), exiting …` (exit 9).
    BrokerGoneBackstop,
    /// `✗ delivery: credential expired without renewal` (exit 10).
    CredentialExpired,
    /// `… exiting so the holder is single` or `… it serves only under its lease, exiting` (6).
    LeaseLost,
    /// `✗ delivery: a live lease already exists …` or `… belongs to a holder that is not
    /// running …`: a standby or a restart refused at start (6).
    LeaseHeld,
    /// `received SIGTERM, exiting` (0).
    Signal,
    /// SIGKILL: no line.
    Killed,
    /// `delivery: can't reach NATS at …`: the start-up reachability check failed (4).
    Unreachable,
    /// `✗ delivery: start-up failed …` (1).
    StartupFailed,
    /// Anything else: a crash, a panic, an unknown line.
    Other,
}

/// Whether an exit fits the faults that ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "judged", rename_all = "snake_case")]
pub enum ExitJudgement {
    Expected {
        because: String,
    },
    /// A broker-gone exit later than its fault's window (or backstop) plus the margin.
    Late {
        fault: u64,
        by_ms: Ms,
    },
    /// A broker-gone exit before its fault's window ran out.
    Early {
        fault: u64,
        by_ms: Ms,
    },
    /// No fault or operation explains it.
    Unexplained,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExitReport {
    pub daemon: String,
    pub ms: Ms,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub last_line: Option<String>,
    pub class: ExitClass,
    #[serde(flatten)]
    pub judged: ExitJudgement,
}

impl ExitReport {
    pub fn is_bad(&self) -> bool {
        !matches!(self.judged, ExitJudgement::Expected { .. })
    }
}

/// Whether the first post after the heal was delivered within the bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "liveness", rename_all = "snake_case")]
pub enum Liveness {
    Met { post: PostRef, latency_ms: Ms },
    Missed { post: PostRef, bound_ms: Ms },
    NotChecked { why: String },
}

/// Totals, for the summary and for the docs' figures of measured runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub posts: u64,
    pub posts_ok: u64,
    /// Posts whose outcome is unknown (or never came).
    pub posts_indeterminate: u64,
    /// Posts of unknown outcome some member surfaced (Jepsen's "recovered").
    pub recovered: u64,
    pub frames: u64,
    /// (post, member) pairs owed, delivered, not owed (a legitimate drop), undecided.
    pub owed: u64,
    pub delivered: u64,
    pub not_owed: u64,
    pub faults: BTreeMap<String, u64>,
}

/// Everything the checker found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub verdict: Verdict,
    /// One line per reason the verdict is not valid.
    pub why: Vec<String>,
    pub counts: Counts,
    pub lost: Vec<Lost>,
    /// Owed posts missing in the catch-up window of a join answered `durable:false`.
    pub excused: Vec<Excused>,
    pub uncertain: Vec<Uncertain>,
    pub leaked: Vec<Leak>,
    pub unexpected: Vec<Unexpected>,
    pub duplicates: Vec<Duplicate>,
    pub single_flight: SingleFlight,
    pub exits: Vec<ExitReport>,
    pub liveness: Liveness,
    /// Facts the history lacks (a bucket's log incomplete): what an undecided finding waits on.
    pub missing_facts: Vec<String>,
}

impl Report {
    /// Decides the verdict from the findings, and says why.
    pub(crate) fn decide(&mut self) {
        let mut why = Vec::new();
        let mut count = |n: usize, what: &str| {
            if n > 0 {
                why.push(format!("{n} {what}"));
            }
        };
        count(self.lost.len(), "lost");
        // Named apart, never hidden: an acknowledged post the broker itself no longer holds.
        count(
            self.lost
                .iter()
                .filter(|l| l.stuck == Some(Stuck::GoneFromChat))
                .count(),
            "of them gone from the CHAT stream (the broker lost an acknowledged post)",
        );
        count(self.leaked.len(), "leaked");
        count(self.unexpected.len(), "unexpected frame(s)");
        count(
            self.duplicates.iter().filter(|d| !d.allowed).count(),
            "duplicate(s) the seeds do not allow",
        );
        count(
            self.single_flight.overlaps.len(),
            "overlap(s) of serving daemons",
        );
        count(
            self.single_flight.foreign_writes.len(),
            "lease row(s) written by a non-holder",
        );
        count(
            self.exits.iter().filter(|e| e.is_bad()).count(),
            "exit(s) late, early or unexplained",
        );
        if let Liveness::Missed { post, bound_ms } = &self.liveness {
            why.push(format!(
                "liveness: post op {} not delivered within {bound_ms} ms of the heal",
                post.op
            ));
        }
        let invalid = !why.is_empty();
        if !self.uncertain.is_empty() {
            let lacking = if self.missing_facts.is_empty() {
                String::new()
            } else {
                format!(" ({})", self.missing_facts.join("; "))
            };
            why.push(format!("{} undecided{lacking}", self.uncertain.len()));
        }
        if let Liveness::NotChecked { why: w } = &self.liveness {
            why.push(format!("liveness not checked: {w}"));
        }
        self.verdict = if invalid {
            Verdict::Invalid
        } else if why.is_empty() {
            Verdict::Valid
        } else {
            Verdict::Unknown
        };
        self.why = why;
    }

    /// The report as JSON (`--json FILE`).
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }

    /// The human summary: one row per check, then up to [`SUMMARY_ITEMS_MAX`] findings of each.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let verdict = match self.verdict {
            Verdict::Valid => "VALID",
            Verdict::Invalid => "INVALID",
            Verdict::Unknown => "UNKNOWN",
        };
        let _ = writeln!(out, "verdict: {verdict}");
        for w in &self.why {
            let _ = writeln!(out, "  - {w}");
        }
        let c = &self.counts;
        let faults: Vec<String> = c.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(
            out,
            "posts {} (ok {}, indeterminate {}, recovered {}), frames {}, faults: {}",
            c.posts,
            c.posts_ok,
            c.posts_indeterminate,
            c.recovered,
            c.frames,
            if faults.is_empty() {
                "none".to_string()
            } else {
                faults.join(", ")
            }
        );
        let _ = writeln!(out, "{:<16} {:<20} status", "check", "count");
        let bad_dups = self.duplicates.iter().filter(|d| !d.allowed).count();
        let bad_exits = self.exits.iter().filter(|e| e.is_bad()).count();
        let sf = self.single_flight.overlaps.len() + self.single_flight.foreign_writes.len();
        let live = match &self.liveness {
            Liveness::Met { latency_ms, .. } => (format!("{latency_ms} ms"), "ok"),
            Liveness::Missed { .. } => ("missed".to_string(), "INVALID"),
            Liveness::NotChecked { .. } => ("-".to_string(), "unknown"),
        };
        let rows: [(&str, String, &str); 11] = [
            ("owed", c.owed.to_string(), "-"),
            ("delivered", c.delivered.to_string(), "-"),
            (
                "lost",
                self.lost.len().to_string(),
                status(self.lost.is_empty()),
            ),
            ("excused", self.excused.len().to_string(), "ok"),
            (
                "uncertain",
                self.uncertain.len().to_string(),
                if self.uncertain.is_empty() {
                    "ok"
                } else {
                    "unknown"
                },
            ),
            (
                "leaked",
                self.leaked.len().to_string(),
                status(self.leaked.is_empty()),
            ),
            (
                "unexpected",
                self.unexpected.len().to_string(),
                status(self.unexpected.is_empty()),
            ),
            (
                "duplicates",
                format!("{} ({bad_dups} not allowed)", self.duplicates.len()),
                status(bad_dups == 0),
            ),
            ("single flight", sf.to_string(), status(sf == 0)),
            (
                "exits",
                format!("{} ({bad_exits} bad)", self.exits.len()),
                status(bad_exits == 0),
            ),
            ("liveness", live.0, live.1),
        ];
        for (name, count, st) in rows {
            let _ = writeln!(out, "{name:<16} {count:<20} {st}");
        }
        list(&mut out, "lost", &self.lost, |l| {
            let faults: Vec<String> = l
                .faults
                .iter()
                .map(|f| format!("{} {} #{}", f.kind.name(), f.target, f.id))
                .collect();
            format!(
                "{} to {}{}; faults: {}",
                post(&l.post),
                l.member,
                l.stuck
                    .map(|s| match s {
                        Stuck::Dlv | Stuck::Inbox | Stuck::Chat => format!(" (still in {s:?})"),
                        Stuck::PassedByFanout => {
                            " (pending nowhere: the fan-out writer settled it, CHAT still holds it)"
                                .to_string()
                        }
                        Stuck::GoneFromChat => {
                            " (gone from CHAT: the broker lost the acknowledged post)".to_string()
                        }
                    })
                    .unwrap_or_default(),
                if faults.is_empty() {
                    "none".to_string()
                } else {
                    faults.join(", ")
                }
            )
        });
        list(&mut out, "excused", &self.excused, |e| {
            format!(
                "{} to {}: in the catch-up window ({}, {}] of its join op {} (generation {}), answered durable:false",
                post(&e.post),
                e.member,
                e.join_cursor,
                e.frontier_max,
                e.join_op,
                e.generation
            )
        });
        list(&mut out, "uncertain", &self.uncertain, |u| {
            format!(
                "{} to {} ({:?}): {}",
                post(&u.post),
                u.member,
                u.about,
                u.why
            )
        });
        list(&mut out, "leaked", &self.leaked, |l| {
            format!(
                "{} to {} at {} ms (line {}): {:?}",
                post(&l.post),
                l.member,
                l.surfaced_ms,
                l.line,
                l.kind
            )
        });
        list(&mut out, "unexpected", &self.unexpected, |u| {
            format!(
                "{} at {} ms (line {}) on {}: {:?}",
                u.member, u.surfaced_ms, u.line, u.channel, u.kind
            )
        });
        let bad: Vec<&Duplicate> = self.duplicates.iter().filter(|d| !d.allowed).collect();
        list(&mut out, "duplicates not allowed", &bad, |d| {
            format!(
                "{} to {} at {} and {} ms: {:?}",
                post(&d.post),
                d.member,
                d.first_ms,
                d.again_ms,
                d.why
            )
        });
        list(&mut out, "overlaps", &self.single_flight.overlaps, |o| {
            format!(
                "{} and {} both served {}..{} ms",
                o.a, o.b, o.from_ms, o.to_ms
            )
        });
        list(
            &mut out,
            "foreign lease writes",
            &self.single_flight.foreign_writes,
            |w| {
                format!(
                    "revision {} at {} ms by {} over {}",
                    w.revision, w.ms, w.writer, w.over
                )
            },
        );
        let bad: Vec<&ExitReport> = self.exits.iter().filter(|e| e.is_bad()).collect();
        list(&mut out, "bad exits", &bad, |e| {
            format!(
                "daemon {} at {} ms, {:?}: {:?} ({})",
                e.daemon,
                e.ms,
                e.class,
                e.judged,
                e.last_line.as_deref().unwrap_or("no line")
            )
        });
        out
    }
}

fn status(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "INVALID"
    }
}

fn post(p: &PostRef) -> String {
    format!(
        "post op {} ({} on {}, seq {}, {})",
        p.op,
        p.sender,
        p.channel,
        p.seq.map_or("-".to_string(), |s| s.to_string()),
        p.id.as_deref()
            .map_or_else(|| format!("id-less, tag {}", p.tag), |i| format!("id {i}"))
    )
}

fn list<T>(out: &mut String, title: &str, items: &[T], line: impl Fn(&T) -> String) {
    if items.is_empty() {
        return;
    }
    let _ = writeln!(out, "{title}:");
    for item in items.iter().take(SUMMARY_ITEMS_MAX) {
        let _ = writeln!(out, "  {}", line(item));
    }
    if items.len() > SUMMARY_ITEMS_MAX {
        let _ = writeln!(
            out,
            "  … and {} more (see the JSON report)",
            items.len() - SUMMARY_ITEMS_MAX
        );
    }
}
