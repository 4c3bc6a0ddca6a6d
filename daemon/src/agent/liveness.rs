//! The agent's `live.delivery` probe: "is a delivery daemon serving my space on this plane?"
//!
//! The probe goes to `cotal.<s>.live.delivery.<o>.<a>` (the agent's own principal) with the
//! reply under the request's own `.reply.` subtree. The caller-side classification is the
//! reference's: no responders → `unbound`; the responder's own verdict when it answers; a
//! timeout, a refusal or a malformed answer → `unknown`. A probe whose connection closes under it
//! is `unknown` too, never `unbound`: a lost reply does not prove nothing serves. The reason
//! travels with the verdict so a caller (and a test) can tell which case happened.

use std::time::Duration;

use serde_json::Value;

use crate::agent::{Agent, AgentErrorKind};

/// Why a probe ended where it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeWhy {
    /// The responder answered with this verdict.
    Answered,
    /// The broker said no responder is bound.
    NoResponders,
    /// No answer within the bound.
    TimedOut,
    /// The connection closed while the probe was pending.
    ConnectionClosed,
    /// The answer was not the closed `{plane, responder, instance?}` shape.
    Malformed,
    /// The probe could not be sent.
    Failed(String),
}

/// A probe's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// `bound` | `unbound` | `stale` | `unknown`.
    pub responder: String,
    pub instance: Option<String>,
    pub why: ProbeWhy,
}

impl Probe {
    fn unknown(why: ProbeWhy) -> Probe {
        Probe {
            responder: "unknown".into(),
            instance: None,
            why,
        }
    }
}

/// Parses the responder's closed answer.
fn parse(payload: &[u8]) -> Option<(String, Option<String>)> {
    let v: Value = serde_json::from_slice(payload).ok()?;
    let m = v.as_object()?;
    if m.keys()
        .any(|k| !matches!(k.as_str(), "plane" | "responder" | "instance"))
    {
        return None;
    }
    if m.get("plane")?.as_str()? != "delivery" {
        return None;
    }
    let responder = m.get("responder")?.as_str()?;
    if !matches!(responder, "bound" | "unbound" | "stale" | "unknown") {
        return None;
    }
    let instance = match m.get("instance") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return None,
    };
    Some((responder.to_string(), instance))
}

impl Agent {
    /// Probes the plane's `live.delivery` responder, waiting at most `timeout`.
    pub async fn probe_delivery(&self, timeout: Duration) -> Probe {
        let subject = self.names().live_delivery_subject(self.principal());
        let reply = format!("{subject}.reply.{}", uuid::Uuid::new_v4().simple());
        match self.exchange(&subject, &reply, Vec::new(), timeout).await {
            Ok(msg) => match parse(&msg.payload) {
                Some((responder, instance)) => Probe {
                    responder,
                    instance,
                    why: ProbeWhy::Answered,
                },
                None => Probe::unknown(ProbeWhy::Malformed),
            },
            Err(e) => match e.kind() {
                AgentErrorKind::NoResponders => Probe {
                    responder: "unbound".into(),
                    instance: None,
                    why: ProbeWhy::NoResponders,
                },
                AgentErrorKind::ConnectionClosed => Probe::unknown(ProbeWhy::ConnectionClosed),
                AgentErrorKind::TimedOut => Probe::unknown(ProbeWhy::TimedOut),
                _ => Probe::unknown(ProbeWhy::Failed(e.to_string())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation: accepting an extra key or an unknown verdict fails here.
    #[test]
    fn the_answer_is_a_closed_shape() {
        assert_eq!(
            parse(br#"{"plane":"delivery","responder":"bound","instance":"x"}"#),
            Some(("bound".into(), Some("x".into())))
        );
        assert_eq!(
            parse(br#"{"plane":"delivery","responder":"unbound"}"#),
            Some(("unbound".into(), None))
        );
        assert!(parse(br#"{"plane":"delivery","responder":"bound","x":1}"#).is_none());
        assert!(parse(br#"{"plane":"delivery","responder":"up"}"#).is_none());
        assert!(parse(br#"{"plane":"timer","responder":"bound"}"#).is_none());
    }
}
