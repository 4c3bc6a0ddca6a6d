//! Plane-3 shapes: the fan-out entry in `INBOX_<s>`, the handoff frame in `DLV_<s>`, and the
//! few facts of a `CotalMessage` routing needs (id, sender, mentions).
//!
//! The message itself is carried as JSON and passed through untouched (receivers ignore unknown
//! fields), except for the frame's authenticated rewrite: `channel` is set from the CHAT
//! subject and `to`/`toService` are removed.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::grammar::{validate_channel, LifecycleUid, Principal};

/// Why an entry was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    DurableChannel,
    LiveMention,
}

/// `Plane3Entry` on `dinbox.<o>.<a>.<uid>`. Agents never see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plane3Entry {
    pub msg: Value,
    /// Authenticated, from the CHAT subject.
    pub channel: String,
    /// CHAT stream sequence of the post.
    pub seq: u64,
    pub reason: Reason,
    /// The member row's generation (0 for mentions).
    pub generation: u64,
}

/// `Plane3DeliveryFrame` on `dlv.<o>.<a>.<uid>` (header `Cotal-Delivery-Frame: 1`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plane3DeliveryFrame {
    pub version: u32,
    pub channel: String,
    pub msg: Value,
}

impl Plane3DeliveryFrame {
    /// The frame for an authorized entry, with the message rewritten for its channel.
    pub fn for_entry(entry: &Plane3Entry) -> Plane3DeliveryFrame {
        Plane3DeliveryFrame {
            version: 1,
            channel: entry.channel.clone(),
            msg: authenticated_channel_message(&entry.msg, &entry.channel),
        }
    }
}

/// `authenticatedChannelMessage(msg, channel)`: `channel` from the subject, no `to`/`toService`.
pub fn authenticated_channel_message(msg: &Value, channel: &str) -> Value {
    let mut out = msg.clone();
    if let Value::Object(map) = &mut out {
        map.insert("channel".into(), Value::String(channel.to_string()));
        map.remove("to");
        map.remove("toService");
    }
    out
}

/// The message id (`""` when absent or not a string).
pub fn message_id(msg: &Value) -> &str {
    msg.get("id").and_then(Value::as_str).unwrap_or("")
}

/// `from.id` of a message, if present.
pub fn sender_id(msg: &Value) -> Option<&str> {
    msg.get("from")?.get("id")?.as_str()
}

/// `normalizeMentions`: trim, lowercase, drop empties, dedupe (first occurrence order).
pub fn mentions(msg: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Some(list) = msg.get("mentions").and_then(Value::as_array) {
        for m in list.iter().filter_map(Value::as_str) {
            let m = m.trim().to_lowercase();
            if !m.is_empty() && !out.contains(&m) {
                out.push(m);
            }
        }
    }
    out
}

/// The JetStream duplicate-suppression id of a copy: `<msg.id>:<o>.<a>:<uid>:<generation>`, or
/// `None` for an id-less post (`""` is never a dedup key).
pub fn dedup_id(
    msg: &Value,
    member: &Principal,
    uid: &LifecycleUid,
    generation: u64,
) -> Option<String> {
    let id = message_id(msg);
    if id.is_empty() {
        None
    } else {
        Some(format!("{id}:{}:{uid}:{generation}", member.dot_form()))
    }
}

/// Sender and channel of a CHAT subject `cotal.<s>.chat.<o>.<a>.<channel...>`; `None` when the
/// subject does not parse, the owner is not a real principal owner token, or the channel is not
/// concrete.
pub fn parse_chat_subject(subject: &str, space_prefix: &str) -> Option<(Principal, String)> {
    let rest = subject.strip_prefix(space_prefix)?.strip_prefix(".chat.")?;
    let mut parts = rest.splitn(3, '.');
    let owner = parts.next()?;
    let actor = parts.next()?;
    let channel = parts.next()?;
    let sender = Principal::new(owner, actor).ok()?;
    validate_channel(channel, true).ok()?;
    Some((sender, channel.to_string()))
}

/// Member and lifecycle of an INBOX subject `cotal.<s>.dinbox.<o>.<a>.<uid>`.
pub fn parse_dinbox_subject(
    subject: &str,
    space_prefix: &str,
) -> Option<(Principal, LifecycleUid)> {
    let rest = subject
        .strip_prefix(space_prefix)?
        .strip_prefix(".dinbox.")?;
    let mut parts = rest.split('.');
    let owner = parts.next()?;
    let actor = parts.next()?;
    let uid = parts.next()?;
    if parts.next().is_some() {
        return None;
    }
    Some((
        Principal::new(owner, actor).ok()?,
        LifecycleUid::parse(uid).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subjects_parse_only_when_well_formed() {
        let (p, ch) = parse_chat_subject("cotal.d.chat.local.alice.eng.alerts", "cotal.d").unwrap();
        assert_eq!(p.dot_form(), "local.alice");
        assert_eq!(ch, "eng.alerts");
        assert!(parse_chat_subject("cotal.d.chat.bogus.alice.eng", "cotal.d").is_none());
        assert!(parse_chat_subject("cotal.d.chat.local.alice", "cotal.d").is_none());
        let uid = "a".repeat(26);
        let (m, u) =
            parse_dinbox_subject(&format!("cotal.d.dinbox.local.bob.{uid}"), "cotal.d").unwrap();
        assert_eq!(m.dot_form(), "local.bob");
        assert_eq!(u.as_str(), uid);
        assert!(parse_dinbox_subject("cotal.d.dinbox.local.bob.short", "cotal.d").is_none());
    }

    #[test]
    fn frames_rewrite_the_channel_and_drop_direct_targets() {
        let e = Plane3Entry {
            msg: json!({"id":"m1","channel":"spoof","to":"x","toService":"y","parts":[]}),
            channel: "eng".into(),
            seq: 4,
            reason: Reason::DurableChannel,
            generation: 2,
        };
        let f = Plane3DeliveryFrame::for_entry(&e);
        assert_eq!(f.version, 1);
        assert_eq!(f.msg, json!({"id":"m1","channel":"eng","parts":[]}));
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["reason"], "durable-channel");
    }

    #[test]
    fn ids_and_mentions() {
        let p = Principal::parse("local.bob").unwrap();
        let uid = LifecycleUid::parse(&"b".repeat(26)).unwrap();
        let m = json!({"id":"m1","mentions":[" Bob ","bob","", "Eve"]});
        assert_eq!(
            dedup_id(&m, &p, &uid, 3).unwrap(),
            format!("m1:local.bob:{}:3", "b".repeat(26))
        );
        assert_eq!(dedup_id(&json!({"id":""}), &p, &uid, 3), None);
        assert_eq!(mentions(&m), vec!["bob".to_string(), "eve".to_string()]);
    }
}
