//! `pending`: what the backstop owes one member, per lifecycle and channel.
//!
//! Owed = INBOX entries on the member's `dinbox` subject above the `reader` durable's ack floor
//! that no DLV frame answers (not yet handed off), plus DLV frames on its `dlv` subject above
//! its own `dlv_` durable's ack floor (handed off, not yet surfaced). An entry and its frame
//! carry the same `Nats-Msg-Id` (`<id>:<o>.<a>:<uid>:<generation>`), which is how a handed-off
//! entry is told apart from an owed one while the reader's floor is held back by another
//! member's entry. An entry the reader settled without a frame (an ACL that no longer covers it,
//! a sequence outside the member's interval, a give-up) above the floor, and an id-less post,
//! are still counted: the figure is an upper bound, exact once the reader's floor passed them.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use async_nats::jetstream::message::StreamMessage;

use serde_json::{json, Value};

use super::{age_words, stored_ms, InspectError, InspectErrorKind, Inspector};
use crate::base::{Read, Rows};
use crate::wire::{LifecycleUid, Principal, SpaceNames, READER_DURABLE};

/// Owed messages of one store for one lifecycle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owed {
    pub count: usize,
    /// When the oldest owed message was stored (epoch ms).
    pub oldest_ms: Option<u64>,
    /// Owed count per channel.
    pub channels: BTreeMap<String, usize>,
    /// The count stopped at [`super::MAX_SCANNED`].
    pub truncated: bool,
}

/// One lifecycle of the member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecyclePending {
    pub uid: LifecycleUid,
    /// `live`, `retired` or `absent` (no ACL row: its entries are given up after ten tries).
    pub acl: &'static str,
    pub inbox: Owed,
    pub dlv: Owed,
}

/// The whole answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub space: String,
    pub member: Principal,
    pub lifecycles: Vec<LifecyclePending>,
    /// The time the report was read (epoch ms), ages are counted from it.
    pub now_ms: u64,
}

impl Pending {
    pub fn owed(&self) -> usize {
        self.lifecycles
            .iter()
            .map(|l| l.inbox.count + l.dlv.count)
            .sum()
    }
    fn oldest_ms(&self) -> Option<u64> {
        self.lifecycles
            .iter()
            .flat_map(|l| [l.inbox.oldest_ms, l.dlv.oldest_ms])
            .flatten()
            .min()
    }
    fn age(&self, at: Option<u64>) -> Option<u64> {
        at.map(|t| self.now_ms.saturating_sub(t))
    }

    /// The human report, one line per lifecycle and per channel.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![match self.age(self.oldest_ms()) {
            Some(age) => format!(
                "{} in space {}: {} owed, oldest {}",
                self.member,
                self.space,
                self.owed(),
                age_words(age)
            ),
            None => format!("{} in space {}: nothing owed", self.member, self.space),
        }];
        for l in &self.lifecycles {
            let store = |o: &Owed, what: &str| {
                let more = if o.truncated { "+" } else { "" };
                match self.age(o.oldest_ms) {
                    Some(age) => format!("{}{more} {what} (oldest {})", o.count, age_words(age)),
                    None => format!("0 {what}"),
                }
            };
            out.push(format!(
                "  lifecycle {} (acl {}): {}, {}",
                l.uid,
                l.acl,
                store(&l.inbox, "in INBOX not yet handed off"),
                store(&l.dlv, "in DLV not yet surfaced")
            ));
            let channels: BTreeSet<&String> = l
                .inbox
                .channels
                .keys()
                .chain(l.dlv.channels.keys())
                .collect();
            for ch in channels {
                out.push(format!(
                    "    {ch}: {} INBOX, {} DLV",
                    l.inbox.channels.get(ch).unwrap_or(&0),
                    l.dlv.channels.get(ch).unwrap_or(&0)
                ));
            }
        }
        out
    }

    /// The report as one JSON object (`--json`).
    pub fn to_json(&self) -> Value {
        let store = |o: &Owed| {
            json!({
                "owed": o.count,
                "oldestAgeMs": self.age(o.oldest_ms),
                "truncated": o.truncated,
                "channels": o.channels,
            })
        };
        json!({
            "space": self.space,
            "member": self.member.dot_form(),
            "owed": self.owed(),
            "oldestAgeMs": self.age(self.oldest_ms()),
            "lifecycles": self.lifecycles.iter().map(|l| json!({
                "uid": l.uid.to_string(),
                "acl": l.acl,
                "inbox": store(&l.inbox),
                "dlv": store(&l.dlv),
            })).collect::<Vec<_>>(),
        })
    }
}

/// Parses a member token (`<owner>.<actor>`), or says what is wrong with it.
pub fn parse_member(token: &str) -> Result<Principal, InspectError> {
    Principal::parse(token)
        .map_err(|e| InspectError::new(InspectErrorKind::Input, format!("member {token:?}: {e}")))
}

/// What `member` is owed in the inspected space.
pub async fn pending(insp: &Inspector, member: &Principal) -> Result<Pending, InspectError> {
    let n = &insp.names;
    let uids = lifecycles(insp, member).await?;
    if uids.is_empty() {
        return Err(InspectError::new(
            InspectErrorKind::Unknown,
            format!(
                "no member {member} in space {}: no ACL row, membership row, INBOX entry or DLV frame names it",
                n.space()
            ),
        ));
    }
    let acl_rows = Rows::open(&insp.js, &n.acl_bucket(), super::REQUEST_BOUND)
        .await
        .map_err(|e| InspectError::new(InspectErrorKind::Broker, e.to_string()))?;
    let reader_floor = insp.ack_floor(&n.inbox_stream(), READER_DURABLE).await?;
    let mut lifecycles = Vec::new();
    for uid in uids {
        let acl = match acl_rows.read(&SpaceNames::acl_key(member, &uid)).await {
            Ok(Read::Present(row)) => {
                match serde_json::from_slice::<crate::wire::AclRecord>(&row.value) {
                    Ok(r) if r.retired => "retired",
                    Ok(_) => "live",
                    Err(_) => "absent",
                }
            }
            Ok(Read::Absent { .. }) => "absent",
            Err(e) => return Err(InspectError::new(InspectErrorKind::Broker, e.to_string())),
        };
        // Every frame of the lifecycle (retention bounds them), then the entries none answers.
        let (frames, frames_cut) = insp
            .above(&n.dlv_stream(), &n.dlv_subject(member, &uid), 0)
            .await?;
        let handed: HashSet<String> = frames.iter().filter_map(msg_id).collect();
        let (entries, entries_cut) = insp
            .above(
                &n.inbox_stream(),
                &n.dinbox_subject(member, &uid),
                reader_floor,
            )
            .await?;
        let inbox = owed(
            entries
                .iter()
                .filter(|m| msg_id(m).is_none_or(|id| !handed.contains(&id))),
            entries_cut,
        );
        let dlv_floor = insp
            .ack_floor(&n.dlv_stream(), &SpaceNames::dlv_durable(member, &uid))
            .await?;
        let dlv = owed(frames.iter().filter(|m| m.sequence > dlv_floor), frames_cut);
        lifecycles.push(LifecyclePending {
            uid,
            acl,
            inbox,
            dlv,
        });
    }
    Ok(Pending {
        space: n.space().to_string(),
        member: member.clone(),
        lifecycles,
        now_ms: crate::base::epoch_ms(),
    })
}

/// Every lifecycle the broker knows for `member` that can owe something: ACL rows, INBOX and
/// DLV subjects (each found by a subject filter); membership rows only when none of those
/// names one.
async fn lifecycles(
    insp: &Inspector,
    member: &Principal,
) -> Result<BTreeSet<LifecycleUid>, InspectError> {
    let n = &insp.names;
    let who = member.dot_form();
    let mut out = BTreeSet::new();
    let listed =
        |e: crate::base::RowError| InspectError::new(InspectErrorKind::Broker, e.to_string());
    let acl = crate::base::keys(
        &insp.js,
        &n.acl_bucket(),
        &format!("{who}.*"),
        super::REQUEST_BOUND,
    )
    .await
    .map_err(listed)?;
    for key in acl {
        if let Some(uid) = key.strip_prefix(&format!("{who}.")) {
            out.extend(LifecycleUid::parse(uid).ok());
        }
    }
    for (stream, prefix) in [
        (
            n.inbox_stream(),
            format!("{}.dinbox.{who}.", n.space().prefix()),
        ),
        (n.dlv_stream(), format!("{}.dlv.{who}.", n.space().prefix())),
    ] {
        for (subject, _) in insp.subjects(&stream, &format!("{prefix}*")).await? {
            if let Some(uid) = subject.strip_prefix(&prefix) {
                out.extend(LifecycleUid::parse(uid).ok());
            }
        }
    }
    // Membership rows name a lifecycle too, but a key's owner shares a subject token with the
    // channel's last segment, so no subject filter selects one member's rows: finding them is
    // a listing of the whole registry. A lifecycle known only by such rows owes nothing (no
    // entry, no frame), so they are listed only to tell such a member from an unknown one.
    if out.is_empty() {
        let rows = crate::base::keys(&insp.js, &n.members_bucket(), ">", super::REQUEST_BOUND)
            .await
            .map_err(listed)?;
        for key in rows {
            if let Some((_, rest)) = key.split_once('/') {
                if let Some(uid) = rest.strip_prefix(&format!("{who}.")) {
                    out.extend(LifecycleUid::parse(uid).ok());
                }
            }
        }
    }
    Ok(out)
}

/// The `Nats-Msg-Id` an entry and its frame share (absent for an id-less post).
fn msg_id(m: &StreamMessage) -> Option<String> {
    m.headers.get("Nats-Msg-Id").map(|v| v.as_str().to_string())
}

/// Counts `messages` by channel, with the oldest one's time.
fn owed<'a>(messages: impl Iterator<Item = &'a StreamMessage>, truncated: bool) -> Owed {
    let mut o = Owed {
        truncated,
        ..Owed::default()
    };
    for m in messages {
        o.count += 1;
        let at = stored_ms(m);
        o.oldest_ms = Some(o.oldest_ms.map_or(at, |t| t.min(at)));
        // Both the INBOX entry and the DLV frame carry `channel`.
        let channel = serde_json::from_slice::<Value>(&m.payload)
            .ok()
            .and_then(|v| v.get("channel").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_else(|| "(unreadable)".to_string());
        *o.channels.entry(channel).or_default() += 1;
    }
    o
}
