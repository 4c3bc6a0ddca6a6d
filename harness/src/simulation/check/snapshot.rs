//! What the broker holds once the final drain ends, as plain data: the checker's second input.
//!
//! Why plain data and not a broker connection: the checker is pure, so it runs the same on a
//! live run, on a stored run directory (`snapshot.json` beside the history) and in unit tests.
//! The runner reads these from the broker with the inspector credential (`DLV_<s>` and
//! `INBOX_<s>` pending per member, the members and ACL buckets, the lease key's writes from
//! [`crate::rig::lease_log::LeaseLog`]).

use serde::{Deserialize, Serialize};

use super::history::{Member, Ms, RowBucket};

/// The file a run directory keeps its snapshot in.
pub const SNAPSHOT_FILE: &str = "snapshot.json";
/// Largest snapshot a reader accepts: per-subject retention keeps at most 1000 entries per
/// member in each stream, so even 1000 members stay far below it.
pub const SNAPSHOT_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// The broker's final state, as far as the checker reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// Per member: what is still pending for it.
    #[serde(default)]
    pub pending: Vec<Pending>,
    /// Every row of `cotal_members_<s>`.
    #[serde(default)]
    pub member_rows: Vec<MemberRow>,
    /// Every row of `cotal_acl_<s>`, tombstones included.
    #[serde(default)]
    pub acl_rows: Vec<AclRow>,
    /// Every write to the lease key during the run, in revision order.
    #[serde(default)]
    pub lease_writes: Vec<LeaseRecord>,
    /// Per watched bucket, its last revision once the run ended: the row watch's `row` lines
    /// are complete when they hold every revision up to it (a missing one is a write the watch
    /// did not see). Absent: the history's row lines are not used for that bucket.
    #[serde(default)]
    pub row_logs: Vec<RowLogEnd>,
    /// What the `CHAT_<s>` stream still holds and how far the fan-out writer settled it, so a
    /// lost post that is pending nowhere says whether the broker still has it. Absent in
    /// snapshots written before it was read.
    #[serde(default)]
    pub chat: Option<ChatHeld>,
}

/// The `CHAT_<s>` stream at the end of the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatHeld {
    pub first_seq: u64,
    pub last_seq: u64,
    /// Sequences from `first_seq` to `last_seq` the stream no longer holds.
    #[serde(default)]
    pub missing: Vec<u64>,
    /// The `fanout` durable's ack floor (its stream sequence), when it could be read.
    #[serde(default)]
    pub fanout_ack_floor: Option<u64>,
}

impl ChatHeld {
    /// Whether the stream no longer holds `seq`, which it once acknowledged: below its first
    /// sequence (removed from the front) or a gap inside it.
    pub fn lost(&self, seq: u64) -> bool {
        seq < self.first_seq || self.missing.binary_search(&seq).is_ok()
    }
}

/// A watched bucket's last revision at the end of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowLogEnd {
    pub bucket: RowBucket,
    pub last_revision: u64,
}

/// What a member still has waiting: frames handed off but not surfaced, entries not handed off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pending {
    pub member: Member,
    #[serde(default)]
    pub dlv: Vec<PendingFrame>,
    #[serde(default)]
    pub inbox: Vec<PendingEntry>,
}

/// A frame in the member's `DLV_<s>` its `dlv_` durable has not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingFrame {
    pub channel: String,
    pub id: Option<String>,
    #[serde(default)]
    pub tag: Option<String>,
    pub dlv_seq: u64,
}

/// An entry in the member's `INBOX_<s>` subject the reader has not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingEntry {
    pub channel: String,
    /// The post's CHAT sequence (the entry carries it).
    pub chat_seq: u64,
    pub generation: u64,
    pub id: Option<String>,
    #[serde(default)]
    pub tag: Option<String>,
}

/// One member row (`<channel>/<o>.<a>.<uid>`) as the broker holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberRow {
    pub member: Member,
    pub channel: String,
    pub generation: u64,
    pub join_cursor: u64,
    #[serde(default)]
    pub leave_cursor: Option<u64>,
    /// The closed intervals of earlier generations the row still keeps.
    #[serde(default)]
    pub prior: Vec<PriorInterval>,
}

/// A closed interval `(join_cursor, leave_cursor]` of an earlier generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriorInterval {
    pub generation: u64,
    pub join_cursor: u64,
    pub leave_cursor: u64,
}

/// One read-ACL row as the broker holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclRow {
    pub member: Member,
    pub allow_subscribe: Vec<String>,
    /// The KV revision of the row's last write.
    pub revision: u64,
    /// The retirement tombstone.
    pub retired: bool,
}

/// What a write to the lease key was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseOp {
    /// A row (a claim, a renewal, a not-ready write).
    Row,
    /// A delete marker (a release, the nemesis's delete).
    Delete,
    Purge,
    /// The broker's `MaxAge` marker: the row ran out its TTL.
    Expired,
}

/// One write to the lease key, as the broker stamped it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRecord {
    pub revision: u64,
    /// The broker's stamp, in run ms.
    pub ms: Ms,
    pub op: LeaseOp,
    /// The row's holder and incarnation (a row only).
    #[serde(default)]
    pub holder: Option<String>,
    #[serde(default)]
    pub incarnation: Option<String>,
    #[serde(default)]
    pub ready: bool,
}

impl Snapshot {
    /// The member's ACL row, if the bucket holds one.
    pub fn acl_row(&self, member: &Member) -> Option<&AclRow> {
        self.acl_rows.iter().find(|r| &r.member == member)
    }
    /// The member's row on `channel`, if the bucket holds one.
    pub fn member_row(&self, member: &Member, channel: &str) -> Option<&MemberRow> {
        self.member_rows
            .iter()
            .find(|r| &r.member == member && r.channel == channel)
    }
    /// The last revision of `bucket` at the end, if the runner read it.
    pub fn row_log_end(&self, bucket: RowBucket) -> Option<u64> {
        self.row_logs
            .iter()
            .find(|e| e.bucket == bucket)
            .map(|e| e.last_revision)
    }
    /// What is pending for `member`.
    pub fn pending_of(&self, member: &Member) -> Option<&Pending> {
        self.pending.iter().find(|p| &p.member == member)
    }
}

impl MemberRow {
    /// The `(join, leave)` cursors the row still knows for `generation`.
    pub fn cursors_of(&self, generation: u64) -> Option<(u64, Option<u64>)> {
        if self.generation == generation {
            return Some((self.join_cursor, self.leave_cursor));
        }
        self.prior
            .iter()
            .find(|p| p.generation == generation)
            .map(|p| (p.join_cursor, Some(p.leave_cursor)))
    }
}

/// Why a snapshot could not be read or written.
#[derive(Debug)]
pub struct SnapshotError {
    kind: SnapshotErrorKind,
    detail: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotErrorKind {
    /// The file could not be opened, read or written.
    Io,
    /// The file is not a snapshot's JSON.
    Malformed,
    /// The file is past [`SNAPSHOT_MAX_BYTES`].
    TooLarge,
}

impl SnapshotError {
    fn new(
        kind: SnapshotErrorKind,
        detail: String,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> SnapshotError {
        SnapshotError {
            kind,
            detail,
            source: Some(Box::new(source)),
        }
    }
    pub fn kind(&self) -> SnapshotErrorKind {
        self.kind
    }
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "snapshot: {}", self.detail)
    }
}

impl std::error::Error for SnapshotError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl Snapshot {
    /// Reads `<dir>/snapshot.json`.
    pub fn read_dir(dir: &std::path::Path) -> Result<Snapshot, SnapshotError> {
        let path = dir.join(SNAPSHOT_FILE);
        let io = |e: std::io::Error| {
            SnapshotError::new(
                SnapshotErrorKind::Io,
                format!("reading {}: {e}", path.display()),
                e,
            )
        };
        let size = std::fs::metadata(&path).map_err(io)?.len();
        if size > SNAPSHOT_MAX_BYTES {
            return Err(SnapshotError {
                kind: SnapshotErrorKind::TooLarge,
                detail: format!(
                    "{}: {size} bytes, past the {SNAPSHOT_MAX_BYTES}-byte bound",
                    path.display()
                ),
                source: None,
            });
        }
        let text = std::fs::read(&path).map_err(io)?;
        serde_json::from_slice(&text).map_err(|e| {
            SnapshotError::new(
                SnapshotErrorKind::Malformed,
                format!("{}: {e}", path.display()),
                e,
            )
        })
    }

    /// Writes `<dir>/snapshot.json` (pretty: a person reads it beside the report).
    pub fn write_dir(&self, dir: &std::path::Path) -> Result<(), SnapshotError> {
        let path = dir.join(SNAPSHOT_FILE);
        let text = serde_json::to_vec_pretty(self).map_err(|e| {
            SnapshotError::new(
                SnapshotErrorKind::Malformed,
                format!("{}: {e}", path.display()),
                e,
            )
        })?;
        std::fs::write(&path, text).map_err(|e| {
            SnapshotError::new(
                SnapshotErrorKind::Io,
                format!("writing {}: {e}", path.display()),
                e,
            )
        })
    }
}
