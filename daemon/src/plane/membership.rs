//! The membership registry (`cotal_members_<s>`, key `<channel>/<o>.<a>.<uid>`).
//!
//! Broker-known truth, written only by the daemon in answer to `durableJoin`/`durableLeave` on
//! the `ctl.delivery` rail (an agent holds no write grant on the bucket, so it can never assert
//! its own membership). Each row carries a join cursor and, after a leave, a leave cursor: a post
//! is eligible for the backstop exactly when its CHAT sequence lies in `(joinCursor,
//! leaveCursor]`, so a post concurrent with a join or leave orders deterministically.

use serde::{Deserialize, Serialize};

use crate::kv::{Read, RowError, Rows};
use crate::plane::PlaneCtx;
use crate::wire::{LifecycleUid, Principal, SpaceNames};

/// `MembershipRecord` of the reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MembershipRecord {
    pub channel: String,
    /// Principal dot-form `<o>.<a>` (the field name is legacy).
    pub owner: String,
    pub lifecycle_uid: String,
    /// `live-confirmed` | `durable-active`.
    pub state: String,
    pub join_cursor: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activated: Option<bool>,
    /// Present = tombstone (the member left at this CHAT sequence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leave_cursor: Option<u64>,
    pub generation: u64,
    #[serde(default)]
    pub writer_identity: String,
    #[serde(default)]
    pub updated_at: u64,
}

pub const STATE_DURABLE_ACTIVE: &str = "durable-active";
pub const STATE_LIVE_CONFIRMED: &str = "live-confirmed";

impl MembershipRecord {
    /// `durableEligible(rec, seq)`.
    pub fn admits(&self, seq: u64) -> bool {
        seq > self.join_cursor && self.leave_cursor.is_none_or(|leave| seq <= leave)
    }
    pub fn is_tombstone(&self) -> bool {
        self.leave_cursor.is_some()
    }
}

/// One member row as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRow {
    pub member: Principal,
    pub uid: LifecycleUid,
    pub record: MembershipRecord,
    pub revision: u64,
}

/// What a leader-served read of one member key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberRead {
    Present(MembershipRecord, u64),
    /// No live row; a create must name `marker_revision` (0 when never written).
    Absent {
        marker_revision: u64,
    },
    Garbled(String),
}

/// Splits a member key `<channel>/<o>.<a>.<uid>`.
pub fn split_member_key(key: &str) -> Option<(String, Principal, LifecycleUid)> {
    let (channel, rest) = key.split_once('/')?;
    let mut parts = rest.split('.');
    let owner = parts.next()?;
    let actor = parts.next()?;
    let uid = parts.next()?;
    if parts.next().is_some() {
        return None;
    }
    Some((
        channel.to_string(),
        Principal::new(owner, actor).ok()?,
        LifecycleUid::parse(uid).ok()?,
    ))
}

/// The registry, read leader-served and written by compare-and-set.
#[derive(Clone)]
pub struct Members {
    rows: Rows,
    ctx: PlaneCtx,
}

impl Members {
    pub async fn open(ctx: &PlaneCtx) -> Result<Members, RowError> {
        let rows = Rows::open(
            &ctx.js,
            &ctx.names.members_bucket(),
            ctx.config.request_bound,
        )
        .await?;
        Ok(Members {
            rows,
            ctx: ctx.clone(),
        })
    }

    pub fn rows(&self) -> &Rows {
        &self.rows
    }

    pub async fn read(
        &self,
        channel: &str,
        member: &Principal,
        uid: &LifecycleUid,
    ) -> Result<MemberRead, RowError> {
        self.read_key(&SpaceNames::member_key(channel, member, uid))
            .await
    }

    async fn read_key(&self, key: &str) -> Result<MemberRead, RowError> {
        match self.rows.read(key).await? {
            Read::Absent { marker_revision } => Ok(MemberRead::Absent {
                marker_revision: marker_revision.unwrap_or(0),
            }),
            Read::Present(row) => match serde_json::from_slice(&row.value) {
                Ok(rec) => Ok(MemberRead::Present(rec, row.revision)),
                Err(e) => Ok(MemberRead::Garbled(e.to_string())),
            },
        }
    }

    /// Writes `record` at its key if the row's revision is still `expected`.
    pub async fn write(
        &self,
        member: &Principal,
        uid: &LifecycleUid,
        record: &MembershipRecord,
        expected: u64,
    ) -> Result<u64, RowError> {
        let key = SpaceNames::member_key(&record.channel, member, uid);
        let body = serde_json::to_vec(record).map_err(|e| RowError::from_detail(e.to_string()))?;
        self.rows.put_expecting(&key, body.into(), expected).await
    }

    /// Deletes the row if its revision is still `expected`.
    pub async fn remove(
        &self,
        channel: &str,
        member: &Principal,
        uid: &LifecycleUid,
        expected: u64,
    ) -> Result<u64, RowError> {
        self.rows
            .delete_expecting(&SpaceNames::member_key(channel, member, uid), expected)
            .await
    }

    /// Every live row of `channel`, fresh from the leader.
    pub async fn of_channel(&self, channel: &str) -> Result<Vec<MemberRow>, RowError> {
        // The key's `/` does not split subject tokens, so the last channel segment and the
        // owner share one token: filter on the leading segments and check the prefix here.
        let leading: Vec<&str> = channel.split('.').collect();
        let filter = if leading.len() > 1 {
            format!("{}.>", leading[..leading.len() - 1].join("."))
        } else {
            ">".to_string()
        };
        let prefix = format!("{channel}/");
        self.rows_matching(&filter, |k| k.starts_with(&prefix))
            .await
    }

    /// Every live row of one lifecycle.
    pub async fn of_lifecycle(
        &self,
        member: &Principal,
        uid: &LifecycleUid,
    ) -> Result<Vec<MemberRow>, RowError> {
        let suffix = format!("/{}.{uid}", member.dot_form());
        self.rows_matching(">", |k| k.ends_with(&suffix)).await
    }

    async fn rows_matching(
        &self,
        filter: &str,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<MemberRow>, RowError> {
        let keys = crate::plane::scan::keys(
            &self.ctx.js,
            self.rows.bucket(),
            filter,
            self.ctx.config.request_bound,
        )
        .await?;
        let wanted: Vec<String> = keys.into_iter().filter(|k| keep(k)).collect();
        let reads = futures::future::join_all(wanted.iter().map(|k| self.read_key(k))).await;
        let mut out = Vec::new();
        for (key, read) in wanted.iter().zip(reads) {
            if let MemberRead::Present(record, revision) = read? {
                if let Some((_, member, uid)) = split_member_key(key) {
                    out.push(MemberRow {
                        member,
                        uid,
                        record,
                        revision,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// The CHAT frontier: the last sequence `CHAT_<s>` has captured (leader-served stream info).
pub async fn chat_frontier(ctx: &PlaneCtx) -> Result<u64, RowError> {
    let work = async {
        let stream = ctx
            .js
            .get_stream_no_info(ctx.names.chat_stream())
            .await
            .map_err(|e| RowError::from_detail(crate::kv::broker_words(&e)))?;
        let info = stream
            .get_info()
            .await
            .map_err(|e| RowError::from_detail(crate::kv::broker_words(&e)))?;
        Ok(info.state.last_sequence)
    };
    match tokio::time::timeout(ctx.config.request_bound, work).await {
        Ok(r) => r,
        Err(_) => Err(RowError::from_detail(format!(
            "stream info of {}: no answer within {} ms",
            ctx.names.chat_stream(),
            ctx.config.request_bound.as_millis()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(join: u64, leave: Option<u64>) -> MembershipRecord {
        MembershipRecord {
            channel: "eng".into(),
            owner: "local.bob".into(),
            lifecycle_uid: "b".repeat(26),
            state: STATE_DURABLE_ACTIVE.into(),
            join_cursor: join,
            activated: Some(true),
            leave_cursor: leave,
            generation: 1,
            writer_identity: String::new(),
            updated_at: 0,
        }
    }

    #[test]
    fn eligibility_is_the_half_open_interval() {
        let r = rec(10, None);
        assert!(!r.admits(10));
        assert!(r.admits(11));
        let l = rec(10, Some(20));
        assert!(l.admits(20));
        assert!(!l.admits(21));
    }

    #[test]
    fn member_keys_split() {
        let (ch, p, u) =
            split_member_key(&format!("eng.alerts/local.bob.{}", "b".repeat(26))).unwrap();
        assert_eq!(ch, "eng.alerts");
        assert_eq!(p.dot_form(), "local.bob");
        assert_eq!(u.as_str().len(), 26);
        assert!(split_member_key("eng/local.bob").is_none());
    }
}
