//! The membership registry (`cotal_members_<s>`, key `<channel>/<o>.<a>.<uid>`).
//!
//! Broker-known truth, written only by the daemon in answer to `durableJoin`/`durableLeave` on
//! the `ctl.delivery` rail (an agent holds no write grant on the bucket, so it can never assert
//! its own membership). Each row carries a join cursor and, after a leave, a leave cursor: a post
//! is eligible for the backstop exactly when its CHAT sequence lies in `(joinCursor,
//! leaveCursor]`, so a post concurrent with a join or leave orders deterministically.
//!
//! A rejoin rewrites the one row per key, so the row also keeps the *closed* intervals of earlier
//! generations (`priorIntervals`) for as long as the fan-out writer or the trusted reader may
//! still judge a post of them: a post the writer routes after the rejoin, or an entry the reader
//! hands off after it, is judged by the interval it was posted in. They are pruned once both
//! have passed them ([`prune_prior`]) and capped at [`MAX_PRIOR_INTERVALS`]. A reader that does
//! not know the field (the reference) ignores it and sees the current interval, as before.

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::base::{Read, RowError, Rows};
use crate::plane::acl::RowDecodeError;
use crate::plane::cache::{DecodedRead, View};
use crate::plane::PlaneCtx;
use crate::wire::{LifecycleNames, LifecycleUid, Principal, SpaceNames};

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
    /// Closed intervals of earlier generations still needed by the writer or the reader.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prior_intervals: Vec<PriorInterval>,
}

/// A closed interval `(joinCursor, leaveCursor]` of an earlier generation of the row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PriorInterval {
    pub generation: u64,
    pub join_cursor: u64,
    pub leave_cursor: u64,
    /// `INBOX_<s>`'s last sequence read once the fan-out writer was seen past `leave_cursor`:
    /// every copy of this interval sits at or below it, so the interval may go once the
    /// reader's ack floor reaches it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbox_mark: Option<u64>,
}

/// Most closed intervals one row keeps; beyond it the oldest goes (with a warning), so a row
/// stays small however often a member rejoins while the writer lags.
pub const MAX_PRIOR_INTERVALS: usize = 32;

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

    /// The generation whose interval (current or kept closed one) admits CHAT sequence `seq`.
    pub fn generation_admitting(&self, seq: u64) -> Option<u64> {
        if self.admits(seq) {
            return Some(self.generation);
        }
        self.prior_intervals
            .iter()
            .find(|p| seq > p.join_cursor && seq <= p.leave_cursor)
            .map(|p| p.generation)
    }

    /// Whether an entry copied for `generation` at CHAT sequence `seq` is still inside that
    /// generation's interval (the reader's re-check).
    pub fn admits_entry(&self, seq: u64, generation: u64) -> bool {
        self.generation_admitting(seq) == Some(generation)
    }

    /// The record a join at `join_cursor` writes over this one (generation + 1): the interval
    /// this row had, closed at its leave cursor or, still open, at the new join cursor, joins
    /// the kept closed intervals.
    pub fn closed_for_rejoin(&self, join_cursor: u64) -> Vec<PriorInterval> {
        let mut prior = self.prior_intervals.clone();
        let leave = self
            .leave_cursor
            .unwrap_or(join_cursor)
            .max(self.join_cursor);
        if leave > self.join_cursor {
            prior.push(PriorInterval {
                generation: self.generation,
                join_cursor: self.join_cursor,
                leave_cursor: leave,
                inbox_mark: None,
            });
        }
        prior
    }
}

/// How far the fan-out writer and the trusted reader have got, read leader-served from the broker
/// in this order (the order the pruning argument needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// `fanout`'s ack floor (CHAT sequence): every post at or below it has all its copies stored.
    pub writer_floor: u64,
    /// `INBOX_<s>`'s last sequence, read after `writer_floor`.
    pub inbox_last: u64,
    /// `reader`'s ack floor (INBOX sequence), read after `inbox_last`.
    pub reader_floor: u64,
}

/// Drops the closed intervals both the writer and the reader have passed; returns how many
/// intervals had to be dropped by the cap instead (never passed).
///
/// An interval ending at leave cursor `L` is passed by the writer once `writer_floor >= L`; from
/// then on every copy of it is stored, at INBOX sequences no higher than the INBOX last sequence
/// read after that floor (its mark). It is passed by the reader once the reader's ack floor,
/// read later still, reaches that mark: every copy has then been handed off or dropped.
pub fn prune_prior(prior: &mut Vec<PriorInterval>, progress: Option<Progress>) -> usize {
    if let Some(p) = progress {
        for interval in prior.iter_mut() {
            if interval.inbox_mark.is_none() && p.writer_floor >= interval.leave_cursor {
                interval.inbox_mark = Some(p.inbox_last);
            }
        }
        prior.retain(|i| i.inbox_mark.is_none_or(|mark| p.reader_floor < mark));
    }
    let over = prior.len().saturating_sub(MAX_PRIOR_INTERVALS);
    prior.drain(..over);
    over
}

/// Reads [`Progress`] from the broker (`None` if any read fails: then nothing is pruned).
pub async fn progress(ctx: &PlaneCtx) -> Option<Progress> {
    use async_nats::jetstream::consumer::{pull, Consumer};
    let work = async {
        let chat = ctx
            .js
            .get_stream_no_info(ctx.names.chat_stream())
            .await
            .ok()?;
        let fanout: Consumer<pull::Config> =
            chat.get_consumer(crate::wire::FANOUT_DURABLE).await.ok()?;
        let writer_floor = fanout.cached_info().ack_floor.stream_sequence;
        let mut inbox = ctx.js.get_stream(ctx.names.inbox_stream()).await.ok()?;
        let inbox_last = inbox.info().await.ok()?.state.last_sequence;
        let reader: Consumer<pull::Config> =
            inbox.get_consumer(crate::wire::READER_DURABLE).await.ok()?;
        let reader_floor = reader.cached_info().ack_floor.stream_sequence;
        Some(Progress {
            writer_floor,
            inbox_last,
            reader_floor,
        })
    };
    tokio::time::timeout(ctx.config.request_bound, work)
        .await
        .ok()
        .flatten()
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
    Garbled(RowDecodeError),
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
        Ok(member_read(self.rows.read(key).await?))
    }

    /// [`Members::read`] through `view`: the proved cache hands out the row as decoded once per
    /// revision (`None` when absent), the leader's read is decoded here.
    pub async fn read_in(
        &self,
        view: &View<'_>,
        channel: &str,
        names: &Arc<LifecycleNames>,
    ) -> Result<Option<Arc<MemberDecoded>>, RowError> {
        let (member, uid) = (&names.member, &names.uid);
        match view {
            View::Proved(cache) => {
                let key = names.member_key(channel);
                let space = &self.ctx.names;
                Ok(
                    match cache.read_decoded(&key, |k, v| MemberDecoded::new(space, k, v)) {
                        DecodedRead::Present(row, _) => Some(row),
                        DecodedRead::Absent { .. } => None,
                    },
                )
            }
            View::Leader => Ok(match self.read(channel, member, uid).await? {
                MemberRead::Present(record, _) => Some(Arc::new(MemberDecoded {
                    names: Some(names.clone()),
                    record: Ok(record),
                })),
                MemberRead::Absent { .. } => None,
                MemberRead::Garbled(e) => Some(Arc::new(MemberDecoded {
                    names: Some(names.clone()),
                    record: Err(e),
                })),
            }),
        }
    }

    /// [`Members::of_channel`] through `view`: from the proved cache, the live rows as decoded
    /// once per revision (only rows whose key splits and whose record parses); from the leader,
    /// decoded here.
    pub async fn of_channel_in(
        &self,
        view: &View<'_>,
        channel: &str,
    ) -> Result<Vec<Arc<MemberDecoded>>, RowError> {
        let View::Proved(cache) = view else {
            return Ok(self
                .of_channel(channel)
                .await?
                .into_iter()
                .map(|r| {
                    Arc::new(MemberDecoded {
                        names: Some(Arc::new(self.ctx.names.lifecycle(&r.member, &r.uid))),
                        record: Ok(r.record),
                    })
                })
                .collect());
        };
        let space = &self.ctx.names;
        let mut rows = cache.scan_decoded(&format!("{channel}/"), |k, v| {
            MemberDecoded::new(space, k, v)
        });
        rows.retain(|r| r.names.is_some() && r.record.is_ok());
        Ok(rows)
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
        let body: bytes::Bytes = serde_json::to_vec(record)
            .map_err(|e| RowError::from_detail(e.to_string()))?
            .into();
        let revision = self
            .rows
            .put_expecting(&key, body.clone(), expected)
            .await?;
        // The daemon's own write, applied to the cache at its revision.
        self.ctx
            .caches
            .members
            .note_own_write(&key, Some(body), revision);
        Ok(revision)
    }

    /// Deletes the row if its revision is still `expected`.
    pub async fn remove(
        &self,
        channel: &str,
        member: &Principal,
        uid: &LifecycleUid,
        expected: u64,
    ) -> Result<u64, RowError> {
        let key = SpaceNames::member_key(channel, member, uid);
        let revision = self.rows.delete_expecting(&key, expected).await?;
        self.ctx.caches.members.note_own_write(&key, None, revision);
        Ok(revision)
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
        let keys = crate::base::keys(
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

/// A member row's value as decoded once per revision: the member and lifecycle its key names,
/// with their data-path names (`None` when the key does not split), and the record (or why it
/// does not parse).
#[derive(Debug)]
pub struct MemberDecoded {
    pub names: Option<Arc<LifecycleNames>>,
    pub record: Result<MembershipRecord, RowDecodeError>,
}

impl MemberDecoded {
    fn new(space: &SpaceNames, key: &str, value: &bytes::Bytes) -> MemberDecoded {
        MemberDecoded {
            names: split_member_key(key)
                .map(|(_, member, uid)| Arc::new(space.lifecycle(&member, &uid))),
            record: serde_json::from_slice(value).map_err(RowDecodeError::from),
        }
    }
}

/// What one read of a member key means.
fn member_read(read: Read) -> MemberRead {
    match read {
        Read::Absent { marker_revision } => MemberRead::Absent {
            marker_revision: marker_revision.unwrap_or(0),
        },
        Read::Present(row) => match serde_json::from_slice(&row.value) {
            Ok(rec) => MemberRead::Present(rec, row.revision),
            Err(e) => MemberRead::Garbled(e.into()),
        },
    }
}

/// The CHAT frontier: the last sequence `CHAT_<s>` has captured (leader-served stream info).
pub async fn chat_frontier(ctx: &PlaneCtx) -> Result<u64, RowError> {
    let work = async {
        let stream = ctx
            .js
            .get_stream_no_info(ctx.names.chat_stream())
            .await
            .map_err(|e| RowError::from_detail(crate::base::broker_words(&e)))?;
        let info = stream
            .get_info()
            .await
            .map_err(|e| RowError::from_detail(crate::base::broker_words(&e)))?;
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
            prior_intervals: Vec::new(),
        }
    }

    fn closed(generation: u64, join: u64, leave: u64) -> PriorInterval {
        PriorInterval {
            generation,
            join_cursor: join,
            leave_cursor: leave,
            inbox_mark: None,
        }
    }

    /// Mutation: `closed_for_rejoin` returning only the old list fails the first assertion.
    #[test]
    fn a_rejoin_keeps_the_closed_interval_and_judges_each_post_by_its_own() {
        let mut left = rec(10, Some(20));
        left.generation = 3;
        let mut next = rec(25, None);
        next.generation = 4;
        next.prior_intervals = left.closed_for_rejoin(25);
        assert_eq!(next.prior_intervals, vec![closed(3, 10, 20)]);
        assert_eq!(next.generation_admitting(15), Some(3));
        assert_eq!(
            next.generation_admitting(22),
            None,
            "between leave and rejoin"
        );
        assert_eq!(next.generation_admitting(26), Some(4));
        assert!(next.admits_entry(15, 3));
        assert!(!next.admits_entry(15, 4), "copied for another generation");
        // An open row rejoined is closed at the new join cursor.
        let open = rec(10, None);
        assert_eq!(open.closed_for_rejoin(30), vec![closed(1, 10, 30)]);
        // An empty interval is not kept.
        assert!(rec(10, Some(10)).closed_for_rejoin(12).is_empty());
    }

    /// Mutation: dropping the `reader_floor < mark` condition (pruning once the writer passed)
    /// fails the second assertion.
    #[test]
    fn an_interval_goes_only_once_writer_and_reader_have_passed_it() {
        let mut prior = vec![closed(1, 0, 100), closed(2, 150, 200)];
        let p = |w, i, r| {
            Some(Progress {
                writer_floor: w,
                inbox_last: i,
                reader_floor: r,
            })
        };
        assert_eq!(prune_prior(&mut prior, p(99, 500, 500)), 0);
        assert_eq!(prior.len(), 2, "writer not past either");
        prune_prior(&mut prior, p(120, 600, 550));
        assert_eq!(
            prior.len(),
            2,
            "writer past the first; reader not past its mark 600"
        );
        assert_eq!(prior[0].inbox_mark, Some(600));
        prune_prior(&mut prior, p(120, 700, 600));
        assert_eq!(prior, vec![closed(2, 150, 200)]);
        prune_prior(&mut prior, None);
        assert_eq!(prior.len(), 1, "unknown progress prunes nothing");
        let mut many: Vec<_> = (0..40).map(|g| closed(g, g * 10, g * 10 + 5)).collect();
        assert_eq!(prune_prior(&mut many, None), 40 - MAX_PRIOR_INTERVALS);
        assert_eq!(many.len(), MAX_PRIOR_INTERVALS);
        assert_eq!(many[0].generation, 40 - MAX_PRIOR_INTERVALS as u64);
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
