//! Operator inspection: what the backstop owes a member (`pending`) and who is a durable member
//! of a channel (`members`), read from the broker without reading it by hand.
//!
//! Read-only by construction: one one-shot connection under the `inspector` credential
//! (`.cotal/space.<key>/inspect.creds`, minted with the space's other material), whose grants
//! are stream and consumer info and leader-served message gets, and nothing that writes. Its
//! own ring, above `plane` (it reads the plane's row shapes) and below `cli.rs`; nothing imports
//! it but the command line.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream;
use futures::TryStreamExt;

use crate::base::{self, broker_words, read_creds_file, DEFAULT_SERVER};
use crate::provision::Workspace;
use crate::wire::{Space, SpaceNames};

mod members;
mod pending;

pub use members::{members, parse_channel};
pub use pending::{parse_member, pending};

/// Bound on connecting, and on each broker request.
pub const REQUEST_BOUND: Duration = crate::base::BROKER_BOUND;
/// At most this many owed messages are read per store and lifecycle (each is one leader-served
/// get); past it the report says it stopped counting.
pub const MAX_SCANNED: usize = 10_000;

/// What kind of inspection failure: each is one exit code of `docs/operations.md`
/// ("Inspection").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InspectErrorKind {
    /// A malformed space, member or channel, no workspace root, no inspection credential.
    Input,
    /// The member or channel is not known to the broker.
    Unknown,
    /// The broker could not be reached, refused the credential, or refused a read.
    Broker,
}

/// One clear line naming what was wrong, typed.
#[derive(Debug, Clone)]
pub struct InspectError {
    kind: InspectErrorKind,
    detail: String,
}

impl InspectError {
    pub fn new(kind: InspectErrorKind, detail: impl Into<String>) -> InspectError {
        InspectError {
            kind,
            detail: detail.into(),
        }
    }
    pub fn kind(&self) -> InspectErrorKind {
        self.kind
    }
    fn broker(what: &str, e: &(dyn std::error::Error + 'static)) -> InspectError {
        InspectError::new(
            InspectErrorKind::Broker,
            format!("{what}: {}", broker_words(e)),
        )
    }
}

impl std::fmt::Display for InspectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for InspectError {}

/// Where to look: the space, its workspace root (which holds the credential) and the broker.
#[derive(Debug, Clone)]
pub struct InspectConfig {
    pub space: Space,
    pub root: PathBuf,
    /// `--server`; default: the mesh registry's broker for the space, else [`DEFAULT_SERVER`].
    pub server: Option<String>,
    pub tls_ca: Option<PathBuf>,
}

/// An open, read-only view of one space.
pub struct Inspector {
    pub js: jetstream::Context,
    pub names: SpaceNames,
    client: async_nats::Client,
}

impl Inspector {
    /// Reads the inspection credential and connects (one attempt, bounded).
    pub async fn open(cfg: &InspectConfig) -> Result<Inspector, InspectError> {
        let path = Workspace::new(&cfg.root).inspect_creds_path(&cfg.space);
        let credential = read_creds_file(&path).map_err(|e| {
            InspectError::new(
                InspectErrorKind::Input,
                format!(
                    "no usable inspection credential at {} ({e}); provision the space (cotal-delivery up)",
                    path.display()
                ),
            )
        })?;
        let record = base::cotal_home()
            .and_then(|home| base::MeshRecord::read(&base::registry_path(&home, &cfg.space)).ok())
            .flatten();
        let server = cfg
            .server
            .clone()
            .or_else(|| record.as_ref().map(|r| r.server.clone()))
            .unwrap_or_else(|| DEFAULT_SERVER.to_string());
        let tls_ca = cfg
            .tls_ca
            .clone()
            .or_else(|| record.as_ref().and_then(|r| r.tls_ca.clone()));
        let client = crate::base::connect_with_credential(
            &server,
            tls_ca.as_deref(),
            &credential,
            "cotal:inspect",
            REQUEST_BOUND,
        )
        .await
        .map_err(|e| {
            InspectError::new(
                InspectErrorKind::Broker,
                format!("can't reach NATS at {server} with the inspection credential ({e})"),
            )
        })?;
        let js = jetstream::context::ContextBuilder::new()
            .timeout(REQUEST_BOUND)
            .build(client.clone());
        Ok(Inspector {
            js,
            names: SpaceNames::new(&cfg.space),
            client,
        })
    }

    /// Drains the connection (bounded).
    pub async fn close(self) {
        let _ = tokio::time::timeout(REQUEST_BOUND, self.client.drain()).await;
    }

    /// Subjects of `stream` matching `filter` that hold messages, with their counts.
    async fn subjects(
        &self,
        stream: &str,
        filter: &str,
    ) -> Result<Vec<(String, usize)>, InspectError> {
        let s = self
            .js
            .get_stream_no_info(stream)
            .await
            .map_err(|e| InspectError::broker(stream, &e))?;
        let mut info = s
            .info_with_subjects(filter)
            .await
            .map_err(|e| InspectError::broker(stream, &e))?;
        let mut out = Vec::new();
        while let Some(pair) = info
            .try_next()
            .await
            .map_err(|e| InspectError::broker(stream, &e))?
        {
            out.push(pair);
        }
        out.sort();
        Ok(out)
    }

    /// The ack floor (stream sequence) of `durable` on `stream`; 0 when it does not exist.
    async fn ack_floor(&self, stream: &str, durable: &str) -> Result<u64, InspectError> {
        let s = self
            .js
            .get_stream_no_info(stream)
            .await
            .map_err(|e| InspectError::broker(stream, &e))?;
        match s.consumer_info(durable).await {
            Ok(info) => Ok(info.ack_floor.stream_sequence),
            Err(e) => {
                let words = broker_words(&e);
                if words.to_lowercase().contains("consumer not found") {
                    Ok(0)
                } else {
                    Err(InspectError::new(
                        InspectErrorKind::Broker,
                        format!("{stream} consumer {durable}: {words}"),
                    ))
                }
            }
        }
    }

    /// The messages on exactly `subject` above sequence `floor`, oldest first, leader-served
    /// one by one (at most [`MAX_SCANNED`]; the flag says whether it stopped there).
    async fn above(
        &self,
        stream: &str,
        subject: &str,
        floor: u64,
    ) -> Result<(Vec<async_nats::jetstream::message::StreamMessage>, bool), InspectError> {
        let s = self
            .js
            .get_stream_no_info(stream)
            .await
            .map_err(|e| InspectError::broker(stream, &e))?;
        let mut out = Vec::new();
        let mut next = floor + 1;
        loop {
            if out.len() >= MAX_SCANNED {
                return Ok((out, true));
            }
            match s.get_first_raw_message_by_subject(subject, next).await {
                Ok(m) => {
                    next = m.sequence + 1;
                    out.push(m);
                }
                Err(e) => {
                    let words = broker_words(&e);
                    if words.to_lowercase().contains("no message found") {
                        return Ok((out, false));
                    }
                    return Err(InspectError::new(
                        InspectErrorKind::Broker,
                        format!("{stream} {subject}: {words}"),
                    ));
                }
            }
        }
    }
}

/// Milliseconds since the Unix epoch of a stored message.
fn stored_ms(m: &async_nats::jetstream::message::StreamMessage) -> u64 {
    u64::try_from(m.time.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

/// `12 s`, `3 min 4 s`, `2 h 5 min` for an age in milliseconds.
pub fn age_words(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_in_the_largest_sensible_units() {
        assert_eq!(age_words(999), "0 s");
        assert_eq!(age_words(12_400), "12 s");
        assert_eq!(age_words(184_000), "3 min 4 s");
        assert_eq!(age_words(7_500_000), "2 h 5 min");
    }
}
