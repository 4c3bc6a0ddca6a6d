//! Plane-3 shapes: the fan-out entry in `INBOX_<s>`, the handoff frame in `DLV_<s>`, and the
//! few facts of a `CotalMessage` routing needs (id, sender, mentions).
//!
//! The message itself is carried as JSON and passed through untouched (receivers ignore unknown
//! fields), except for the frame's authenticated rewrite: `channel` is set from the CHAT
//! subject and `to`/`toService` are removed.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
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

/// An INBOX entry as the trusted reader reads it: borrowed from the entry's bytes, its message
/// kept as the bytes the writer stored, when it parses so; else parsed whole (a `channel` with
/// escapes).
#[derive(Debug)]
pub enum EntryRead<'a> {
    Borrowed(EntryView<'a>),
    Parsed(Plane3Entry),
}

/// A [`Plane3Entry`] borrowed from its bytes, the message unparsed.
#[derive(Debug, Deserialize)]
pub struct EntryView<'a> {
    #[serde(borrow)]
    msg: &'a RawValue,
    channel: &'a str,
    seq: u64,
    reason: Reason,
    generation: u64,
}

/// What a frame needs to know of a message to pass it through untouched: its id, its own
/// `channel`, and whether it names direct targets (a key present, whatever its value).
#[derive(Deserialize)]
struct MessageFacts<'a> {
    #[serde(default, borrow)]
    id: Option<&'a str>,
    #[serde(default, borrow)]
    channel: Option<&'a str>,
    #[serde(default)]
    to: Named,
    #[serde(default, rename = "toService")]
    to_service: Named,
}

/// Whether a key was present, whatever its value (`null` included).
#[derive(Default)]
struct Named(bool);

impl<'de> Deserialize<'de> for Named {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Named, D::Error> {
        IgnoredAny::deserialize(d)?;
        Ok(Named(true))
    }
}

impl<'a> EntryRead<'a> {
    /// Reads an entry; the error is the whole parse's (a `Plane3Entry`).
    pub fn parse(payload: &'a [u8]) -> Result<EntryRead<'a>, serde_json::Error> {
        match serde_json::from_slice::<EntryView<'a>>(payload) {
            Ok(view) => Ok(EntryRead::Borrowed(view)),
            Err(_) => serde_json::from_slice::<Plane3Entry>(payload).map(EntryRead::Parsed),
        }
    }

    pub fn channel(&self) -> &str {
        match self {
            EntryRead::Borrowed(v) => v.channel,
            EntryRead::Parsed(e) => &e.channel,
        }
    }
    pub fn seq(&self) -> u64 {
        match self {
            EntryRead::Borrowed(v) => v.seq,
            EntryRead::Parsed(e) => e.seq,
        }
    }
    pub fn reason(&self) -> Reason {
        match self {
            EntryRead::Borrowed(v) => v.reason,
            EntryRead::Parsed(e) => e.reason,
        }
    }
    pub fn generation(&self) -> u64 {
        match self {
            EntryRead::Borrowed(v) => v.generation,
            EntryRead::Parsed(e) => e.generation,
        }
    }

    /// What [`EntryRead::frame`] depends on, for an entry read borrowed: its message's bytes
    /// and its channel (`None` for an entry parsed whole).
    pub fn frame_key(&self) -> Option<(&str, &str)> {
        match self {
            EntryRead::Borrowed(v) => Some((v.msg.get(), v.channel)),
            EntryRead::Parsed(_) => None,
        }
    }

    /// The entry's DLV frame (`Plane3DeliveryFrame::for_entry`, serialised) and its message's
    /// id. A message that already reads as the frame's (an object whose `channel` is the
    /// entry's, with no `to` or `toService`: what this daemon's writer stores for a post on its
    /// own channel) is spliced in as its bytes, which are serde's serialisation of it when
    /// serde wrote the entry: the same bytes the rewrite would write. Any other is parsed and
    /// rewritten. An error is a message serde cannot hold as a value.
    pub fn frame(&self) -> Result<(Vec<u8>, Cow<'_, str>), serde_json::Error> {
        let view = match self {
            EntryRead::Parsed(e) => return rewritten_frame(&e.msg, &e.channel),
            EntryRead::Borrowed(v) => v,
        };
        let raw = view.msg.get();
        let facts = raw
            .starts_with('{')
            .then(|| serde_json::from_str::<MessageFacts<'_>>(raw).ok())
            .flatten();
        match facts {
            Some(f) if f.channel == Some(view.channel) && !f.to.0 && !f.to_service.0 => {
                let mut body = Vec::with_capacity(raw.len() + view.channel.len() + 32);
                body.extend_from_slice(b"{\"version\":1,\"channel\":");
                serde_json::to_writer(&mut body, view.channel)?;
                body.extend_from_slice(b",\"msg\":");
                body.extend_from_slice(raw.as_bytes());
                body.push(b'}');
                Ok((body, Cow::Borrowed(f.id.unwrap_or(""))))
            }
            _ => {
                let msg: Value = serde_json::from_str(raw)?;
                rewritten_frame(&msg, view.channel)
            }
        }
    }
}

/// The frame of `msg` on `channel` through the rewrite, and the message's id.
fn rewritten_frame(
    msg: &Value,
    channel: &str,
) -> Result<(Vec<u8>, Cow<'static, str>), serde_json::Error> {
    let frame = Plane3DeliveryFrame {
        version: 1,
        channel: channel.to_string(),
        msg: authenticated_channel_message(msg, channel),
    };
    Ok((
        serde_json::to_vec(&frame)?,
        Cow::Owned(message_id(msg).to_string()),
    ))
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
    dedup_id_of(message_id(msg), member, uid, generation)
}

/// [`dedup_id`] of a message whose id is `id`.
pub fn dedup_id_of(
    id: &str,
    member: &Principal,
    uid: &LifecycleUid,
    generation: u64,
) -> Option<String> {
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

    /// The reader's frame is byte for byte the rewrite's (`Plane3DeliveryFrame::for_entry`,
    /// serialised) with the same message id, whether the message is spliced in or rewritten.
    /// Mutations seen failing: dropping the `to` check (the `to: null` case), the `toService`
    /// check, or the `channel` equality (the spoofed and the duplicated `channel`), each splices
    /// a message the rewrite changes.
    #[test]
    fn a_frame_is_the_rewrites_bytes_spliced_or_not() {
        let cases = [
            json!({"id":"m1","channel":"eng","from":{"id":"local.a"},"parts":[{"text":"a \"q\" \u{e9}"}]}),
            json!({"id":"m1","channel":"spoof","parts":[]}),
            json!({"id":"m1","parts":[]}),
            json!({"id":"m1","channel":"eng","to":null}),
            json!({"id":"m1","channel":"eng","toService":"svc"}),
            json!({"id":"m\"1","channel":"eng"}),
            json!({"id":7,"channel":"eng"}),
            json!({"channel":"eng"}),
            json!(["m1", "eng"]),
            json!("eng"),
        ];
        for msg in cases {
            // The second channel has an escape, so the entry is parsed whole.
            for channel in ["eng", "e\"ng"] {
                let entry = Plane3Entry {
                    msg: msg.clone(),
                    channel: channel.into(),
                    seq: 9,
                    reason: Reason::DurableChannel,
                    generation: 2,
                };
                let payload = serde_json::to_vec(&entry).unwrap();
                let read = EntryRead::parse(&payload).unwrap();
                assert_eq!(matches!(read, EntryRead::Parsed(_)), channel != "eng");
                assert_eq!(
                    (read.channel(), read.seq(), read.reason(), read.generation()),
                    (channel, 9, Reason::DurableChannel, 2)
                );
                let (body, id) = read.frame().unwrap();
                let theirs = serde_json::to_vec(&Plane3DeliveryFrame::for_entry(&entry)).unwrap();
                assert_eq!(
                    String::from_utf8_lossy(&body),
                    String::from_utf8_lossy(&theirs),
                    "{msg} on {channel}"
                );
                assert_eq!(id, message_id(&entry.msg), "{msg}");
            }
        }
        // A message with `channel` twice reads as its last (serde's Value, and JSON.parse).
        let dup = br#"{"msg":{"id":"m1","channel":"eng","channel":"spoof"},"channel":"eng","seq":1,"reason":"durable-channel","generation":1}"#;
        let (body, _) = EntryRead::parse(dup).unwrap().frame().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&body),
            r#"{"version":1,"channel":"eng","msg":{"channel":"eng","id":"m1"}}"#
        );
        assert!(EntryRead::parse(br#"{"msg":{},"channel":"eng"}"#).is_err());
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
