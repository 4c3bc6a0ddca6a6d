//! The control rails' envelope: `{op,args,from}` requests and `{ok,data?,error?}` replies, as
//! the reference writes them, and the typed refusal every rail answers with.
//!
//! A request is parsed once, where it arrives: [`ControlRequest::parse`] reads the envelope and
//! checks the caller (`from.id` against the subject's principal); the rail's own request enum
//! (`wire::requests`) then parses the verb and its arguments. Every refusal is a [`Refusal`]:
//! a [`RefusalKind`] a caller can match and the exact text the reply carries (operators and
//! peers read those texts; tests snapshot them).

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::wire::grammar::Principal;
use crate::wire::replies::ReplyData;

/// `ControlRequest` of the reference.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ControlRequest {
    pub op: String,
    #[serde(default)]
    pub args: Value,
    #[serde(default)]
    pub from: Value,
}

/// Refusal of a request whose `from.id` is not the caller the subject names.
pub const SENDER_MISMATCH: &str = "sender mismatch - request rejected";

impl ControlRequest {
    /// The envelope of a request `caller` sent: refused when it does not parse (`malformed
    /// request: …`) or when `from.id` is not the caller.
    pub fn parse(payload: &[u8], caller: &Principal) -> Result<ControlRequest, Refusal> {
        let request: ControlRequest = serde_json::from_slice(payload).map_err(|e| {
            Refusal::new(RefusalKind::Malformed, format!("malformed request: {e}")).source(e)
        })?;
        let from_id = request.from.get("id").and_then(Value::as_str);
        if from_id != Some(caller.dot_form().as_str()) {
            return Err(Refusal::new(RefusalKind::SenderMismatch, SENDER_MISMATCH));
        }
        Ok(request)
    }
}

/// `ControlReply` of the reference: `data` is the verb's typed answer (a `Value` when read
/// back by a client).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct ControlReply<D = Value> {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<D>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl<D> ControlReply<D> {
    pub fn ok(data: D) -> ControlReply<D> {
        ControlReply {
            ok: true,
            data: Some(data),
            error: None,
        }
    }
    pub fn refuse(error: impl Into<String>) -> ControlReply<D> {
        ControlReply {
            ok: false,
            data: None,
            error: Some(error.into()),
        }
    }
}

/// What kind of refusal a rail answered with: the cause a caller can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// The request envelope does not parse.
    Malformed,
    /// `from.id` is not the caller the subject names.
    SenderMismatch,
    /// The rail does not serve that verb.
    UnknownOp,
    /// An argument is missing or malformed.
    Argument,
    /// The daemon does not serve now (not holding its lease, or quiesced).
    NotServing,
    /// The request was admitted, then the daemon stopped serving before it finished.
    StoppedServing,
    /// The caller may not do this (no or narrowed read ACL, a retired or fenced lifecycle,
    /// another sender's request).
    Denied,
    /// The state the request addresses refuses it (a stale leave, a request already taken,
    /// none at that sequence, a generation at its maximum, writes still running).
    Conflict,
    /// A read or write at the broker, or a `$SYS` sweep, did not succeed.
    Unavailable,
    /// The daemon has not finished starting.
    NotStarted,
    /// The daemon has nothing wired to serve the verb (no eviction executor, no renewal source).
    Unwired,
    /// The `$SYS` scan or kick authority is missing, unreadable, or inconsistent (another
    /// account, a torn rotation): a provisioning boundary an operator resolves.
    Authority,
    /// A credential candidate was refused (missed remint, unusable, not accepted).
    Credential,
    /// The reply would be larger than the broker's `max_payload`.
    TooLarge,
    /// The admin rail's queue is full.
    Busy,
}

/// A refused request: its kind, the text the reply carries, the cause when there is one, and
/// the reply `data` a verb keeps even when it fails (`reloadCreds` answers `ok:false` with its
/// per-component results).
#[derive(Debug)]
pub struct Refusal {
    kind: RefusalKind,
    text: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
    data: Option<Box<ReplyData>>,
}

impl Refusal {
    pub fn new(kind: RefusalKind, text: impl Into<String>) -> Refusal {
        Refusal {
            kind,
            text: text.into(),
            source: None,
            data: None,
        }
    }
    /// The same refusal, keeping `source` as its cause.
    pub fn source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Refusal {
        self.source = Some(Box::new(source));
        self
    }
    /// The same refusal, answering with `data` beside its text.
    pub fn with_data(mut self, data: ReplyData) -> Refusal {
        self.data = Some(Box::new(data));
        self
    }
    pub fn kind(&self) -> RefusalKind {
        self.kind
    }
    /// The reply's `error` text.
    pub fn text(&self) -> &str {
        &self.text
    }
    pub fn data(&self) -> Option<&ReplyData> {
        self.data.as_deref()
    }
    /// The same refusal with its text rewritten (the admin rail scrubs digests from it).
    pub fn map_text(mut self, f: impl FnOnce(&str) -> String) -> Refusal {
        self.text = f(&self.text);
        self
    }
    /// The reply this refusal answers with.
    pub fn reply(self) -> ControlReply<ReplyData> {
        ControlReply {
            ok: false,
            data: self.data.map(|d| *d),
            error: Some(self.text),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Refusal {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl PartialEq for Refusal {
    fn eq(&self, other: &Refusal) -> bool {
        self.kind == other.kind && self.text == other.text && self.data == other.data
    }
}
