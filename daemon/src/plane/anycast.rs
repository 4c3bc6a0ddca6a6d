//! Anycast take records (docs/anycast.md): which holder took each role request on `TASK_<s>`
//! and which requests their senders cancelled. One row per request in `cotal_anycast_<s>`,
//! keyed `<stream creation ns>.<seq>` and written only by create or revision check, so a take
//! and a cancel of one request race on the broker and exactly one wins. A winning take (and a
//! take that a later delivery moved to another holder) sends the request's sender a DM from the
//! daemon's own principal; the row remembers whether that notice went out, so a crash between
//! the row and the DM is repaired by the sweep, which also removes rows a day after their
//! request left the queue. Only a holder of the request's role takes it: the role must be
//! listed on the ACL row of the lifecycle the take names (written by the manager with the
//! credential that grants the role's durable).

use std::time::Duration;

use async_nats::jetstream::{self, stream::RawMessageErrorKind};
use async_nats::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::base::{broker_words, epoch_ms, Journal, Read, RowErrorKind, Rows};
use crate::plane::acl::{AclRow, Acls};
use crate::plane::PlaneCtx;
use crate::wire::{
    AnycastCancelled, AnycastRowStatus, AnycastStatus, LifecycleUid, Principal, SpaceNames,
};

/// Bound of the fault-injection hold ([`crate::base::ENV_FAULT_HOLD_AFTER_ANYCAST_ROW`]), logging
/// [`FAULT_HOLD_LINE`]: a forgotten knob delays a DM, it never wedges a take.
pub const FAULT_HOLD: Duration = Duration::from_secs(60);
/// Start of the line the hold logs (the row key follows).
pub const FAULT_HOLD_LINE: &str = "! anycast: fault injection: holding before the DM of row";

/// Compare-and-set rounds one verb may lose before it gives up (each loss means another
/// writer changed the row; the next round decides on the new row).
const CAS_ROUNDS: usize = 5;
/// Name the DMs carry in `from.name`.
pub const DM_FROM_NAME: &str = "cotal-delivery";

/// The row of one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AnycastRow {
    pub v: u32,
    pub seq: u64,
    /// Creation time of `TASK_<s>` (unix ns, decimal) the row belongs to.
    pub stream_created: String,
    pub role: String,
    /// The request's sender `<o>.<a>` (from the request subject).
    pub sender: String,
    pub state: RowState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_holder: Option<String>,
    /// The delivery count of the take the row records.
    #[serde(default)]
    pub delivered: u64,
    /// How often a later delivery moved the take to another holder.
    #[serde(default)]
    pub moves: u32,
    /// Whether the sender's DM for the current take went out.
    pub notice_sent: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_at: Option<u64>,
    /// When the sweep first found the request gone from the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_queue_at: Option<u64>,
    pub updated_at: u64,
}

impl AnycastRow {
    /// The row of a request its sender cancelled before any take, at `now` (unix ms): nothing
    /// to notify (`notice_sent`), no holder.
    pub fn cancelled(
        seq: u64,
        stream_created: String,
        role: String,
        sender: String,
        now: u64,
    ) -> AnycastRow {
        AnycastRow {
            v: 1,
            seq,
            stream_created,
            role,
            sender,
            state: RowState::Cancelled,
            holder: None,
            previous_holder: None,
            delivered: 0,
            moves: 0,
            notice_sent: true,
            taken_at: None,
            cancelled_at: Some(now),
            left_queue_at: None,
            updated_at: now,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RowState {
    Taken,
    Cancelled,
}

impl RowState {
    /// The state as the row and the replies write it.
    pub fn as_str(self) -> &'static str {
        match self {
            RowState::Taken => "taken",
            RowState::Cancelled => "cancelled",
        }
    }
}

/// What went wrong with an anycast verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnycastError {
    kind: AnycastErrorKind,
    detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnycastErrorKind {
    /// The task stream was recreated since the holder read its creation time.
    Recreated,
    /// The request's sender cancelled it.
    Cancelled,
    /// Another holder's take stands.
    Taken,
    /// No request at that seq (acked, deleted, or never sent).
    Gone,
    /// The caller is not the request's sender.
    NotYours,
    /// The holder asking to take does not serve the role the request is addressed to.
    NotHolder,
    /// The broker did not answer or refused.
    Unavailable,
}

impl AnycastError {
    fn new(kind: AnycastErrorKind, detail: impl Into<String>) -> Self {
        AnycastError {
            kind,
            detail: detail.into(),
        }
    }
    pub fn kind(&self) -> AnycastErrorKind {
        self.kind
    }
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl std::fmt::Display for AnycastError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for AnycastError {}

/// What a recorded take was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Took {
    /// The first take of the request.
    First,
    /// A later delivery moved the take to this holder.
    Moved,
    /// This holder's take already stood (a repeated ask).
    Already,
}

impl Took {
    pub fn as_str(self) -> &'static str {
        match self {
            Took::First => "taken",
            Took::Moved => "moved",
            Took::Already => "already-held",
        }
    }
}

/// One request on the task stream.
struct Request {
    sender: Principal,
    role: String,
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    pub rows: usize,
    pub marked_left: usize,
    pub removed: usize,
    pub resent: usize,
    pub redeleted: usize,
}

/// Timing knobs of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepConfig {
    pub row_age: Duration,
    pub every: Duration,
}

impl SweepConfig {
    /// The sweep's timing out of the plane's configuration.
    pub fn of(config: &crate::plane::PlaneConfig) -> SweepConfig {
        SweepConfig {
            row_age: config.anycast_row_age,
            every: config.anycast_sweep,
        }
    }
}

/// The record keeper of one space.
pub struct Anycast {
    ctx: PlaneCtx,
    js: jetstream::Context,
    names: SpaceNames,
    me: Principal,
    journal: Journal,
    bound: Duration,
    rows: Rows,
    fault_hold: bool,
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> AnycastError {
    AnycastError::new(
        AnycastErrorKind::Unavailable,
        format!("anycast: {what}: {e}"),
    )
}

/// `anycastCancel`'s answer.
fn cancelled(seq: u64, deleted: bool) -> AnycastCancelled {
    AnycastCancelled {
        seq,
        state: "cancelled",
        deleted,
    }
}

/// Key of a request's row: `<stream creation ns>.<seq>` (a recreated stream reuses seqs).
pub fn row_key(created_ns: &str, seq: u64) -> String {
    format!("{created_ns}.{seq}")
}

impl Anycast {
    pub async fn open(ctx: &PlaneCtx) -> Result<Anycast, AnycastError> {
        let rows = Rows::open(
            &ctx.js,
            &ctx.names.anycast_bucket(),
            ctx.config.request_bound,
        )
        .await
        .map_err(|e| unavailable("opening the rows", e))?;
        Ok(Anycast {
            ctx: ctx.clone(),
            js: ctx.js.clone(),
            names: ctx.names.clone(),
            me: ctx.me.clone(),
            journal: ctx.journal.clone(),
            bound: ctx.config.request_bound,
            rows,
            fault_hold: ctx.config.anycast_fault_hold,
        })
    }

    /// The task stream's creation time (unix ns, decimal), read from the stream leader.
    pub async fn task_created(&self) -> Result<String, AnycastError> {
        let task = self.names.task_stream();
        let read = async {
            let stream = self
                .js
                .get_stream(task.clone())
                .await
                .map_err(|e| broker_words(&e))?;
            Ok::<_, String>(
                stream
                    .cached_info()
                    .created
                    .unix_timestamp_nanos()
                    .to_string(),
            )
        };
        match tokio::time::timeout(self.bound, read).await {
            Ok(Ok(created)) => Ok(created),
            Ok(Err(e)) => Err(unavailable(&format!("reading {task}"), e)),
            Err(_) => Err(unavailable(
                &format!("reading {task}"),
                format!("no answer within {} ms", self.bound.as_millis()),
            )),
        }
    }

    /// The request at `seq` on the task stream (leader-served `STREAM.MSG.GET`, never Direct
    /// Get), or `None` when nothing is stored there.
    async fn request_at(&self, seq: u64) -> Result<Option<Request>, AnycastError> {
        let task = self.names.task_stream();
        let read = async {
            let stream = self
                .js
                .get_stream_no_info(task.clone())
                .await
                .map_err(|e| broker_words(&e))?;
            match stream.get_raw_message(seq).await {
                Ok(m) => Ok(Some(m.subject.to_string())),
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
                Err(e) => Err(broker_words(&e)),
            }
        };
        let subject = match tokio::time::timeout(self.bound, read).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(unavailable(&format!("reading seq {seq} of {task}"), e)),
            Err(_) => {
                return Err(unavailable(
                    &format!("reading seq {seq} of {task}"),
                    format!("no answer within {} ms", self.bound.as_millis()),
                ))
            }
        };
        Ok(subject.and_then(|s| self.parse_request(&s)))
    }

    /// `cotal.<s>.svc.<role>.<sndO>.<sndA>` → sender and role.
    fn parse_request(&self, subject: &str) -> Option<Request> {
        let rest = subject
            .strip_prefix(&self.names.space().prefix())?
            .strip_prefix(".svc.")?;
        let mut t = rest.split('.');
        let (role, owner, actor) = (t.next()?, t.next()?, t.next()?);
        if t.next().is_some() {
            return None;
        }
        Some(Request {
            sender: Principal::new(owner, actor).ok()?,
            role: role.to_string(),
        })
    }

    async fn read_row(&self, key: &str) -> Result<Option<(AnycastRow, u64)>, AnycastError> {
        match self.rows.read(key).await {
            Ok(Read::Present(row)) => match serde_json::from_slice::<AnycastRow>(&row.value) {
                Ok(r) => Ok(Some((r, row.revision))),
                Err(e) => Err(unavailable(&format!("row {key} is unreadable"), e)),
            },
            Ok(Read::Absent { .. }) => Ok(None),
            Err(e) => Err(unavailable(&format!("reading row {key}"), e)),
        }
    }

    fn no_request(&self, op: &str, seq: u64) -> AnycastError {
        AnycastError::new(
            AnycastErrorKind::Gone,
            format!(
                "{op}: no request at seq {seq} on {} (it left the queue or was never sent)",
                self.names.task_stream()
            ),
        )
    }

    /// The role the request at `seq` is addressed to: from its row when there is one, else
    /// from the request itself.
    async fn role_of(&self, key: &str, seq: u64) -> Result<String, AnycastError> {
        if let Some((row, _)) = self.read_row(key).await? {
            return Ok(row.role);
        }
        if let Some(req) = self.request_at(seq).await? {
            return Ok(req.role);
        }
        // A cancel may have written its row and deleted the request between the two reads.
        match self.read_row(key).await? {
            Some((row, _)) => Ok(row.role),
            None => Err(self.no_request("take", seq)),
        }
    }

    /// Refuses a take by a holder whose lifecycle does not serve `role`: the lifecycle's ACL
    /// row (leader-served, fresh) must be live and list the role.
    async fn check_serves(
        &self,
        holder: &Principal,
        lifecycle: &LifecycleUid,
        seq: u64,
        role: &str,
    ) -> Result<(), AnycastError> {
        let acls = Acls::open(&self.ctx)
            .await
            .map_err(|e| unavailable("opening the ACL rows", e))?;
        let row = acls
            .read(holder, lifecycle)
            .await
            .map_err(|e| unavailable(&format!("reading the ACL row of {holder}"), e))?;
        let found = match row {
            AclRow::Present { record, .. } if record.serves(role) => return Ok(()),
            AclRow::Present { record, .. } if record.is_retired() => {
                format!("its lifecycle {lifecycle} is retired")
            }
            AclRow::Present { record, .. } if record.roles.is_empty() => {
                format!("the ACL row of its lifecycle {lifecycle} lists no role")
            }
            AclRow::Present { record, .. } => format!(
                "the ACL row of its lifecycle {lifecycle} lists {}",
                record
                    .roles
                    .iter()
                    .map(|r| format!("@{r}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            AclRow::Absent => format!("its lifecycle {lifecycle} has no ACL row"),
            AclRow::Garbled(e) => {
                format!("the ACL row of its lifecycle {lifecycle} is unreadable ({e})")
            }
        };
        Err(AnycastError::new(
            AnycastErrorKind::NotHolder,
            format!(
                "take: refused: {holder} does not serve @{role} ({found}); request seq {seq} is addressed to @{role} and only its holders take it"
            ),
        ))
    }

    /// Records `holder`'s take of the request at `seq`, which it read from the stream created
    /// at `seen_created` in delivery number `delivered`, as its lifecycle `lifecycle` (whose
    /// ACL row must list the request's role).
    pub async fn take(
        &self,
        holder: &Principal,
        lifecycle: &LifecycleUid,
        seq: u64,
        seen_created: &str,
        delivered: u64,
    ) -> Result<(Took, AnycastRow), AnycastError> {
        let current = self.task_created().await?;
        if current != seen_created {
            return Err(AnycastError::new(
                AnycastErrorKind::Recreated,
                format!(
                    "take: refused: {} was recreated since you read it (you saw creation time {seen_created}, it is now {current}); its seqs are reused, so re-read the creation time and nak your copy",
                    self.names.task_stream()
                ),
            ));
        }
        let key = row_key(&current, seq);
        let me = holder.dot_form();
        let role = self.role_of(&key, seq).await?;
        self.check_serves(holder, lifecycle, seq, &role).await?;
        for _ in 0..CAS_ROUNDS {
            let now = epoch_ms();
            match self.read_row(&key).await? {
                None => {
                    let Some(req) = self.request_at(seq).await? else {
                        // A cancel may have written its row and deleted the request since the
                        // row was read: decide on that row, so the refusal names the cancel.
                        if self.read_row(&key).await?.is_some() {
                            continue;
                        }
                        return Err(self.no_request("take", seq));
                    };
                    let row = AnycastRow {
                        v: 1,
                        seq,
                        stream_created: current.clone(),
                        role: req.role,
                        sender: req.sender.dot_form(),
                        state: RowState::Taken,
                        holder: Some(me.clone()),
                        previous_holder: None,
                        delivered,
                        moves: 0,
                        notice_sent: false,
                        taken_at: Some(now),
                        cancelled_at: None,
                        left_queue_at: None,
                        updated_at: now,
                    };
                    match self.rows.create(&key, encode(&row)).await {
                        Ok(rev) => return Ok((Took::First, self.after_take(&key, row, rev).await)),
                        Err(e) if e.kind() == RowErrorKind::Conflict => continue,
                        Err(e) => return Err(unavailable(&format!("writing row {key}"), e)),
                    }
                }
                Some((row, _)) if row.state == RowState::Cancelled => {
                    return Err(AnycastError::new(
                        AnycastErrorKind::Cancelled,
                        format!("take: refused: request seq {seq} was cancelled by its sender {}; forget your copy", row.sender),
                    ))
                }
                Some((row, _)) if row.holder.as_deref() == Some(me.as_str()) => {
                    return Ok((Took::Already, row))
                }
                Some((row, rev)) if delivered > row.delivered => {
                    // The ack wait ran out for the earlier holder and the broker delivered the
                    // request again: the take moves, if the request is still queued.
                    if self.request_at(seq).await?.is_none() {
                        return Err(self.no_request("take", seq));
                    }
                    let moved = AnycastRow {
                        previous_holder: row.holder.clone(),
                        holder: Some(me.clone()),
                        delivered,
                        moves: row.moves.saturating_add(1),
                        notice_sent: false,
                        taken_at: Some(now),
                        updated_at: now,
                        ..row
                    };
                    match self.rows.put_expecting(&key, encode(&moved), rev).await {
                        Ok(rev) => {
                            return Ok((Took::Moved, self.after_take(&key, moved, rev).await))
                        }
                        Err(e) if e.kind() == RowErrorKind::Conflict => continue,
                        Err(e) => return Err(unavailable(&format!("writing row {key}"), e)),
                    }
                }
                Some((row, _)) => {
                    return Err(AnycastError::new(
                        AnycastErrorKind::Taken,
                        format!(
                            "take: refused: request seq {seq} is already taken by {} (delivery {}; yours is delivery {delivered})",
                            row.holder.as_deref().unwrap_or("?"),
                            row.delivered
                        ),
                    ))
                }
            }
        }
        Err(unavailable(
            &format!("take of seq {seq}"),
            format!("the row changed under {CAS_ROUNDS} compare-and-set rounds; retry"),
        ))
    }

    /// After a winning take's row: the fault-injection hold (tests), then the sender's DM.
    async fn after_take(&self, key: &str, row: AnycastRow, rev: u64) -> AnycastRow {
        if self.fault_hold {
            self.journal.line(format!(
                "{FAULT_HOLD_LINE} {key} for {} s ({}=1)",
                FAULT_HOLD.as_secs(),
                crate::base::ENV_FAULT_HOLD_AFTER_ANYCAST_ROW
            ));
            tokio::time::sleep(FAULT_HOLD).await;
        }
        match self.notify(key, &row, rev).await {
            Ok(sent) => sent,
            Err(e) => {
                // The row keeps `noticeSent: false`; the sweep resends it.
                self.journal.line(format!(
                    "! anycast: the DM for row {key} was not sent ({e}); the sweep resends it"
                ));
                row
            }
        }
    }

    /// Sends the sender the DM of the row's current take, then marks it sent (by revision:
    /// a row another take moved meanwhile keeps its own pending notice).
    async fn notify(
        &self,
        key: &str,
        row: &AnycastRow,
        rev: u64,
    ) -> Result<AnycastRow, AnycastError> {
        let (subject, body, id) = self.notice(key, row)?;
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", id.as_str());
        let send = async {
            let ack = self
                .js
                .publish_with_headers(subject, headers, body.into())
                .await
                .map_err(|e| broker_words(&e))?;
            ack.await.map_err(|e| broker_words(&e))
        };
        match tokio::time::timeout(self.bound, send).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(unavailable("sending the DM", e)),
            Err(_) => {
                return Err(unavailable(
                    "sending the DM",
                    format!("no ack within {} ms", self.bound.as_millis()),
                ))
            }
        }
        let sent = AnycastRow {
            notice_sent: true,
            updated_at: epoch_ms(),
            ..row.clone()
        };
        match self.rows.put_expecting(key, encode(&sent), rev).await {
            Ok(_) => Ok(sent),
            Err(e) if e.kind() == RowErrorKind::Conflict => Ok(row.clone()),
            Err(e) => Err(unavailable(&format!("marking row {key} notified"), e)),
        }
    }

    /// The DM of a row's current take: subject, body, and its `Nats-Msg-Id` (one per take, so
    /// a resend inside the duplicate window is dropped by the broker).
    fn notice(
        &self,
        key: &str,
        row: &AnycastRow,
    ) -> Result<(String, Vec<u8>, String), AnycastError> {
        let sender = Principal::parse(&row.sender)
            .map_err(|e| unavailable(&format!("row {key} names a bad sender"), e))?;
        let holder = row.holder.as_deref().unwrap_or("?");
        let id = format!("anycast-{key}-{}", row.moves);
        let (event, text) = match &row.previous_holder {
            None => (
                "taken",
                format!(
                    "Your @{} request seq {} was taken by {holder}.",
                    row.role, row.seq
                ),
            ),
            Some(prev) => (
                "moved",
                format!(
                    "Your @{} request seq {} moved to {holder}: the ack wait ran out for {prev} and a later delivery went to {holder}.",
                    row.role, row.seq
                ),
            ),
        };
        let body = json!({
            "id": id,
            "ts": epoch_ms(),
            "space": self.names.space().as_str(),
            "from": {"id": self.me.dot_form(), "name": DM_FROM_NAME},
            "to": row.sender,
            "parts": [
                {"kind": "text", "text": text},
                {"kind": "data", "data": {"anycast": {
                    "event": event,
                    "seq": row.seq,
                    "role": row.role,
                    "holder": holder,
                    "previousHolder": row.previous_holder,
                    "streamCreated": row.stream_created,
                }}},
            ],
        });
        Ok((
            self.names.dm_subject(&sender, &self.me),
            serde_json::to_vec(&body).unwrap_or_default(),
            id,
        ))
    }

    /// `anycastStatus`: the caller's own request at `seq`.
    pub async fn status(
        &self,
        caller: &Principal,
        seq: u64,
    ) -> Result<AnycastStatus, AnycastError> {
        let op = "anycastStatus";
        let current = self.task_created().await?;
        let key = row_key(&current, seq);
        let queued = self.request_at(seq).await?;
        match self.read_row(&key).await? {
            Some((row, _)) => {
                self.own(op, caller, seq, &row.sender)?;
                Ok(AnycastStatus {
                    seq,
                    state: row.state.as_str().to_string(),
                    row: Some(AnycastRowStatus {
                        holder: row.holder,
                        previous_holder: row.previous_holder,
                        moves: row.moves,
                        taken_at: row.taken_at,
                        cancelled_at: row.cancelled_at,
                    }),
                    in_queue: queued.is_some(),
                })
            }
            None => {
                let req = queued.ok_or_else(|| self.no_request(op, seq))?;
                self.own(op, caller, seq, &req.sender.dot_form())?;
                Ok(AnycastStatus {
                    seq,
                    state: "queued".to_string(),
                    row: None,
                    in_queue: true,
                })
            }
        }
    }

    fn own(
        &self,
        op: &str,
        caller: &Principal,
        seq: u64,
        sender: &str,
    ) -> Result<(), AnycastError> {
        if caller.dot_form() == sender {
            Ok(())
        } else {
            Err(AnycastError::new(
                AnycastErrorKind::NotYours,
                format!("{op}: request seq {seq} was not sent by you; a sender reads and cancels only its own requests"),
            ))
        }
    }

    /// `anycastCancel`: succeeds only while no holder has taken the request; writes the
    /// cancelled row (racing a take on its create), then deletes the request from the queue.
    pub async fn cancel(
        &self,
        caller: &Principal,
        seq: u64,
    ) -> Result<AnycastCancelled, AnycastError> {
        let op = "anycastCancel";
        let current = self.task_created().await?;
        let key = row_key(&current, seq);
        for _ in 0..CAS_ROUNDS {
            match self.read_row(&key).await? {
                Some((row, _)) => {
                    self.own(op, caller, seq, &row.sender)?;
                    return match row.state {
                        RowState::Cancelled => {
                            let deleted = self.delete_request(seq).await?;
                            Ok(cancelled(seq, deleted))
                        }
                        RowState::Taken => Err(AnycastError::new(
                            AnycastErrorKind::Taken,
                            format!(
                                "{op}: request seq {seq} is already taken by {}; a cancel succeeds only while no holder has taken it",
                                row.holder.as_deref().unwrap_or("?")
                            ),
                        )),
                    };
                }
                None => {
                    let req = self
                        .request_at(seq)
                        .await?
                        .ok_or_else(|| self.no_request(op, seq))?;
                    self.own(op, caller, seq, &req.sender.dot_form())?;
                    let row = AnycastRow::cancelled(
                        seq,
                        current.clone(),
                        req.role,
                        req.sender.dot_form(),
                        epoch_ms(),
                    );
                    match self.rows.create(&key, encode(&row)).await {
                        Ok(_) => {
                            let deleted = self.delete_request(seq).await?;
                            return Ok(cancelled(seq, deleted));
                        }
                        Err(e) if e.kind() == RowErrorKind::Conflict => continue,
                        Err(e) => return Err(unavailable(&format!("writing row {key}"), e)),
                    }
                }
            }
        }
        Err(unavailable(
            &format!("cancel of seq {seq}"),
            format!("the row changed under {CAS_ROUNDS} compare-and-set rounds; retry"),
        ))
    }

    /// Deletes the request at `seq` from the task stream: whether one was deleted (`false`
    /// when it had already left).
    async fn delete_request(&self, seq: u64) -> Result<bool, AnycastError> {
        let task = self.names.task_stream();
        let delete = async {
            let stream = self
                .js
                .get_stream_no_info(task.clone())
                .await
                .map_err(|e| broker_words(&e))?;
            match stream.delete_message(seq).await {
                Ok(deleted) => Ok(deleted),
                Err(e) => {
                    let words = broker_words(&e);
                    // 10057: no message at that seq (already acked or deleted).
                    if words.contains("10057") || words.to_lowercase().contains("no message found")
                    {
                        Ok(false)
                    } else {
                        Err(words)
                    }
                }
            }
        };
        match tokio::time::timeout(self.bound, delete).await {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(e)) => Err(unavailable(&format!("deleting seq {seq} from {task}"), e)),
            Err(_) => Err(unavailable(
                &format!("deleting seq {seq} from {task}"),
                format!("no answer within {} ms", self.bound.as_millis()),
            )),
        }
    }

    /// One sweep: resends notices a crash left unsent, finishes cancels whose delete did not
    /// land, marks rows whose request left the queue, and removes rows `row_age` after that.
    pub async fn sweep(&self, row_age: Duration) -> Result<SweepReport, AnycastError> {
        let keys = crate::base::keys(&self.js, self.rows.bucket(), ">", self.bound)
            .await
            .map_err(|e| unavailable("listing the rows", e))?;
        let current = self.task_created().await?;
        let mut report = SweepReport::default();
        for key in keys {
            let Some((mut row, mut rev)) = self.read_row(&key).await? else {
                continue;
            };
            report.rows += 1;
            if row.state == RowState::Taken && !row.notice_sent {
                if let Ok(sent) = self.notify(&key, &row, rev).await {
                    report.resent += 1;
                    if sent.notice_sent {
                        match self.read_row(&key).await? {
                            Some(fresh) => (row, rev) = fresh,
                            None => continue,
                        }
                    }
                }
            }
            let now = epoch_ms();
            match row.left_queue_at {
                None => {
                    let mut queued =
                        row.stream_created == current && self.request_at(row.seq).await?.is_some();
                    if queued && row.state == RowState::Cancelled {
                        // A cancel whose delete a crash cut off.
                        self.delete_request(row.seq).await?;
                        report.redeleted += 1;
                        queued = false;
                    }
                    if !queued {
                        let left = AnycastRow {
                            left_queue_at: Some(now),
                            updated_at: now,
                            ..row
                        };
                        if self
                            .rows
                            .put_expecting(&key, encode(&left), rev)
                            .await
                            .is_ok()
                        {
                            report.marked_left += 1;
                        }
                    }
                }
                Some(left) if now.saturating_sub(left) >= row_age.as_millis() as u64 => {
                    if self.rows.delete_expecting(&key, rev).await.is_ok() {
                        report.removed += 1;
                    }
                }
                Some(_) => {}
            }
        }
        Ok(report)
    }
}

fn encode(row: &AnycastRow) -> bytes::Bytes {
    serde_json::to_vec(row).unwrap_or_default().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented timings when nothing overrides them: rows kept a day after leaving the
    /// queue, checked every ten minutes. Mutation seen caught: `DEFAULT_ANYCAST_SWEEP` at 60 s.
    #[test]
    fn the_sweep_defaults_are_a_day_and_ten_minutes() {
        assert_eq!(
            SweepConfig::of(&crate::plane::PlaneConfig::default()),
            SweepConfig {
                row_age: Duration::from_secs(86_400),
                every: Duration::from_secs(600),
            }
        );
    }

    #[test]
    fn rows_round_trip_with_lowercase_states() {
        let row = AnycastRow {
            v: 1,
            seq: 7,
            stream_created: "1700000000000000000".into(),
            role: "review".into(),
            sender: "local.alice".into(),
            state: RowState::Taken,
            holder: Some("local.bob".into()),
            previous_holder: None,
            delivered: 1,
            moves: 0,
            notice_sent: false,
            taken_at: Some(1),
            cancelled_at: None,
            left_queue_at: None,
            updated_at: 1,
        };
        let v: serde_json::Value = serde_json::to_value(&row).unwrap();
        assert_eq!(v["state"], "taken");
        assert_eq!(v["noticeSent"], false);
        assert_eq!(v["streamCreated"], "1700000000000000000");
        assert_eq!(serde_json::from_value::<AnycastRow>(v).unwrap(), row);
        assert_eq!(row_key("17", 7), "17.7");
    }
}
