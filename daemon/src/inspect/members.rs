//! `members`: the durable members of one channel as the registry (`cotal_members_<s>`) holds
//! them: generation, join cursor, leave cursor (a member who left keeps a tombstone row), the
//! closed intervals of earlier generations, and whether the member is online now (a live
//! presence record: fresh heartbeat, not `offline`).

use futures::StreamExt;
use serde_json::{json, Value};

use super::{InspectError, InspectErrorKind, Inspector};
use crate::base::{Read, Rows};
use crate::plane::{MembershipRecord, PriorInterval};
use crate::wire::{validate_channel, LifecycleUid, Principal, SpaceNames};

/// Leader reads of one `members` answer kept in flight together.
const READS_IN_FLIGHT: usize = 32;

/// One row of the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub member: Principal,
    pub uid: LifecycleUid,
    pub record: MembershipRecord,
    pub online: bool,
}

/// The whole answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members {
    pub space: String,
    pub channel: String,
    pub members: Vec<Member>,
}

fn interval_words(p: &PriorInterval) -> String {
    format!(
        "gen {} ({}, {}]",
        p.generation, p.join_cursor, p.leave_cursor
    )
}

impl Members {
    /// Members whose current interval is open (no leave cursor).
    pub fn current(&self) -> usize {
        self.members
            .iter()
            .filter(|m| !m.record.is_tombstone())
            .count()
    }

    /// The human report, one line per row.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "channel {} in space {}: {} durable member(s), {} left",
            self.channel,
            self.space,
            self.current(),
            self.members.len() - self.current()
        )];
        for m in &self.members {
            let r = &m.record;
            let interval = match r.leave_cursor {
                Some(leave) => format!("left: ({}, {leave}]", r.join_cursor),
                None => format!("member: ({}, …)", r.join_cursor),
            };
            let prior = if r.prior_intervals.is_empty() {
                String::new()
            } else {
                let list: Vec<String> = r.prior_intervals.iter().map(interval_words).collect();
                format!(", before: {}", list.join("; "))
            };
            out.push(format!(
                "  {}.{} generation {} {interval}{prior}, {}",
                m.member,
                m.uid,
                r.generation,
                if m.online { "online" } else { "offline" }
            ));
        }
        out
    }

    /// The report as one JSON object (`--json`).
    pub fn to_json(&self) -> Value {
        json!({
            "space": self.space,
            "channel": self.channel,
            "current": self.current(),
            "members": self.members.iter().map(|m| json!({
                "member": m.member.dot_form(),
                "lifecycleUid": m.uid.to_string(),
                "generation": m.record.generation,
                "state": m.record.state,
                "joinCursor": m.record.join_cursor,
                "leaveCursor": m.record.leave_cursor,
                "priorIntervals": m.record.prior_intervals.iter().map(|p| json!({
                    "generation": p.generation,
                    "joinCursor": p.join_cursor,
                    "leaveCursor": p.leave_cursor,
                })).collect::<Vec<_>>(),
                "online": m.online,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Checks a channel token (no wildcards), or says what is wrong with it.
pub fn parse_channel(token: &str) -> Result<String, InspectError> {
    validate_channel(token, false).map_err(|e| {
        InspectError::new(InspectErrorKind::Input, format!("channel {token:?}: {e}"))
    })?;
    if token.contains('*') || token.contains('>') {
        return Err(InspectError::new(
            InspectErrorKind::Input,
            format!("channel {token:?}: name one channel, not a pattern"),
        ));
    }
    Ok(token.to_string())
}

/// The registry rows of `channel` in the inspected space.
pub async fn members(insp: &Inspector, channel: &str) -> Result<Members, InspectError> {
    let n = &insp.names;
    let broker =
        |e: crate::base::RowError| InspectError::new(InspectErrorKind::Broker, e.to_string());
    let keys = crate::base::keys(&insp.js, &n.members_bucket(), ">", super::REQUEST_BOUND)
        .await
        .map_err(broker)?;
    let rows = Rows::open(&insp.js, &n.members_bucket(), super::REQUEST_BOUND)
        .await
        .map_err(broker)?;
    let presence = Rows::open(&insp.js, &n.presence_bucket(), super::REQUEST_BOUND)
        .await
        .map_err(broker)?;
    let now = crate::base::epoch_ms();
    let prefix = format!("{channel}/");
    // Each member costs two leader reads (its row, its presence): kept in flight together, so a
    // channel of thousands of members is not thousands of round trips in a row.
    let reads = keys.iter().filter(|k| k.starts_with(&prefix)).map(|key| {
        let (rows, presence, prefix) = (&rows, &presence, &prefix);
        async move {
            let Read::Present(row) = rows.read(key).await.map_err(broker)? else {
                return Ok(None);
            };
            let Ok(record) = serde_json::from_slice::<MembershipRecord>(&row.value) else {
                return Ok(None);
            };
            let Some((who, uid)) = key[prefix.len()..].rsplit_once('.') else {
                return Ok(None);
            };
            let (Ok(member), Ok(uid)) = (Principal::parse(who), LifecycleUid::parse(uid)) else {
                return Ok(None);
            };
            let online = match presence
                .read(&SpaceNames::presence_key(&member))
                .await
                .map_err(broker)?
            {
                Read::Present(p) => serde_json::from_slice::<Value>(&p.value)
                    .ok()
                    .and_then(|v| {
                        crate::plane::live_entry(&SpaceNames::presence_key(&member), &v, now)
                    })
                    .is_some(),
                Read::Absent { .. } => false,
            };
            Ok::<_, InspectError>(Some(Member {
                member,
                uid,
                record,
                online,
            }))
        }
    });
    let read: Vec<Result<Option<Member>, InspectError>> = futures::stream::iter(reads)
        .buffered(READS_IN_FLIGHT)
        .collect()
        .await;
    let mut out = Vec::new();
    for r in read {
        out.extend(r?);
    }
    if out.is_empty() {
        return Err(InspectError::new(
            InspectErrorKind::Unknown,
            format!(
                "no durable member of channel {channel} in space {}: the membership registry holds no row for it",
                n.space()
            ),
        ));
    }
    Ok(Members {
        space: n.space().to_string(),
        channel: channel.to_string(),
        members: out,
    })
}
