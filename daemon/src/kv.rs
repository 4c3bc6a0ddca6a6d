//! Leader-served KV rows.
//!
//! The `delivery` credential may read buckets only through `$JS.API.STREAM.MSG.GET` (no Direct
//! Get, DESIGN §6.2), and freshness demands it anyway: the lease, an ACL re-check and a membership
//! interval must be read from the stream leader, never from a replica or a cache. Writes go
//! through plain JetStream publishes on `$KV.<bucket>.<key>` with an expected-revision header, so
//! every write here is a compare-and-set the broker arbitrates.

use std::fmt;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures::TryStreamExt;

/// Header carrying the KV operation of a marker (`DEL` / `PURGE`).
const KV_OPERATION: &str = "KV-Operation";
const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";

/// One live row: its value and the stream sequence that wrote it (the KV revision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub value: Bytes,
    pub revision: u64,
}

/// What a leader-served read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    Present(Row),
    /// No live row. `marker_revision` is the sequence of a delete/purge marker, which a create
    /// must name as the expected last sequence.
    Absent {
        marker_revision: Option<u64>,
    },
}

/// Why a row operation failed. `kind()` lets a caller decide; `Display` quotes the broker.
#[derive(Debug, Clone)]
pub struct RowError {
    kind: RowErrorKind,
    detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowErrorKind {
    /// The expected revision did not match: someone else wrote the row (or it exists).
    Conflict,
    /// No answer within the bound (also what a permission-denied publish looks like).
    TimedOut,
    /// The broker refused for another reason; `detail` quotes it.
    Refused,
    /// The connection failed underneath.
    Transport,
}

impl RowError {
    fn new(kind: RowErrorKind, detail: impl Into<String>) -> Self {
        RowError {
            kind,
            detail: detail.into(),
        }
    }
    /// A refusal that carries only words (no broker error behind it).
    pub fn from_detail(detail: impl Into<String>) -> Self {
        RowError::new(RowErrorKind::Refused, detail)
    }
    /// An answer that did not come within a caller's own bound.
    pub fn timed_out(detail: impl Into<String>) -> Self {
        RowError::new(RowErrorKind::TimedOut, detail)
    }
    pub fn kind(&self) -> RowErrorKind {
        self.kind
    }
    /// The broker's own words (or the client's, for a transport failure).
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for RowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for RowError {}

/// The broker's words for a JetStream error: the inner API error when there is one.
pub fn broker_words(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    let mut last = err.to_string();
    while let Some(e) = cur {
        if let Some(js) = e.downcast_ref::<jetstream::Error>() {
            return js.to_string();
        }
        last = e.to_string();
        cur = e.source();
    }
    last
}

/// Rows of one bucket, read from the leader and written by compare-and-set.
#[derive(Clone)]
pub struct Rows {
    js: jetstream::Context,
    bucket: String,
    stream: jetstream::stream::Stream<()>,
    write_bound: Duration,
}

impl Rows {
    /// Opens `bucket` without asking for stream info (the handle is just a name).
    pub async fn open(
        js: &jetstream::Context,
        bucket: &str,
        write_bound: Duration,
    ) -> Result<Rows, RowError> {
        let stream = js
            .get_stream_no_info(format!("KV_{bucket}"))
            .await
            .map_err(|e| RowError::new(RowErrorKind::Transport, broker_words(&e)))?;
        Ok(Rows {
            js: js.clone(),
            bucket: bucket.to_string(),
            stream,
            write_bound,
        })
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// `$KV.<bucket>.<key>`: the subject a write publishes on (and a denial names).
    pub fn subject(&self, key: &str) -> String {
        format!("$KV.{}.{key}", self.bucket)
    }

    /// Leader-served read of the last message for `key`.
    pub async fn read(&self, key: &str) -> Result<Read, RowError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        match self
            .stream
            .get_last_raw_message_by_subject(&self.subject(key))
            .await
        {
            Ok(msg) => {
                let op = msg
                    .headers
                    .get(KV_OPERATION)
                    .map(|v| v.as_str().to_string());
                match op.as_deref() {
                    Some("DEL") | Some("PURGE") => Ok(Read::Absent {
                        marker_revision: Some(msg.sequence),
                    }),
                    _ => Ok(Read::Present(Row {
                        value: msg.payload,
                        revision: msg.sequence,
                    })),
                }
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(Read::Absent {
                marker_revision: None,
            }),
            Err(e) => {
                let kind = match e.kind() {
                    LastRawMessageErrorKind::JetStream(_) => RowErrorKind::Refused,
                    _ => RowErrorKind::Transport,
                };
                Err(RowError::new(kind, broker_words(&e)))
            }
        }
    }

    /// Writes `value` only if the row's last revision is `expected` (0 = never written).
    pub async fn put_expecting(
        &self,
        key: &str,
        value: Bytes,
        expected: u64,
    ) -> Result<u64, RowError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            EXPECTED_LAST_SUBJECT_SEQUENCE,
            expected.to_string().as_str(),
        );
        self.publish(key, headers, value).await
    }

    /// Atomic create: succeeds only when no live row exists. Like a KV `create`, it first
    /// publishes expecting no history at all, and only when that conflicts reads the key: over
    /// a delete/purge marker it publishes again expecting the marker. The first operation is
    /// therefore the write itself, so a credential that may not write is refused on it.
    pub async fn create(&self, key: &str, value: Bytes) -> Result<u64, RowError> {
        match self.put_expecting(key, value.clone(), 0).await {
            Err(e) if e.kind() == RowErrorKind::Conflict => match self.read(key).await? {
                Read::Present(row) => Err(RowError::new(
                    RowErrorKind::Conflict,
                    format!("wrong last sequence: {} (key exists)", row.revision),
                )),
                Read::Absent {
                    marker_revision: Some(marker),
                } => self.put_expecting(key, value, marker).await,
                Read::Absent {
                    marker_revision: None,
                } => Err(e),
            },
            other => other,
        }
    }

    /// Deletes the row only if its last revision is `expected` (leaves a `DEL` marker).
    pub async fn delete_expecting(&self, key: &str, expected: u64) -> Result<u64, RowError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            EXPECTED_LAST_SUBJECT_SEQUENCE,
            expected.to_string().as_str(),
        );
        headers.insert(KV_OPERATION, "DEL");
        self.publish(key, headers, Bytes::new()).await
    }

    async fn publish(&self, key: &str, headers: HeaderMap, value: Bytes) -> Result<u64, RowError> {
        let subject = self.subject(key);
        let send = async {
            let ack = self
                .js
                .publish_with_headers(subject, headers, value)
                .await
                .map_err(publish_error)?;
            ack.await.map_err(publish_error)
        };
        match tokio::time::timeout(self.write_bound, send).await {
            Ok(Ok(ack)) => Ok(ack.sequence),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RowError::new(
                RowErrorKind::TimedOut,
                format!("no answer within {} ms", self.write_bound.as_millis()),
            )),
        }
    }
}

fn publish_error(e: jetstream::context::PublishError) -> RowError {
    let kind = match e.kind() {
        PublishErrorKind::WrongLastSequence => RowErrorKind::Conflict,
        PublishErrorKind::TimedOut => RowErrorKind::TimedOut,
        PublishErrorKind::BrokenPipe | PublishErrorKind::StreamNotFound => RowErrorKind::Transport,
        _ => RowErrorKind::Refused,
    };
    RowError::new(kind, broker_words(&e))
}

// Key listing. The `delivery` credential has no `MSG.NEXT` on KV streams and no Direct Get, but it
// may ask the stream leader for `STREAM.INFO` with a `subjects_filter`: the answer names every
// subject (key) holding a message, fresh from the leader, in one request (paged by the broker for
// very large buckets). A key whose last message is a delete marker is still listed; reading it
// through [`Rows::read`] reports it absent.

/// Keys of `bucket` whose subject matches `$KV.<bucket>.<key_filter>` (NATS wildcards).
pub async fn keys(
    js: &jetstream::Context,
    bucket: &str,
    key_filter: &str,
    bound: Duration,
) -> Result<Vec<String>, RowError> {
    let prefix = format!("$KV.{bucket}.");
    let work = async {
        let stream = js
            .get_stream_no_info(format!("KV_{bucket}"))
            .await
            .map_err(|e| RowError::from_detail(broker_words(&e)))?;
        let mut info = stream
            .info_with_subjects(format!("{prefix}{key_filter}"))
            .await
            .map_err(|e| RowError::from_detail(broker_words(&e)))?;
        let mut out = Vec::new();
        while let Some((subject, _count)) = info
            .try_next()
            .await
            .map_err(|e| RowError::from_detail(broker_words(&e)))?
        {
            if let Some(key) = subject.strip_prefix(&prefix) {
                out.push(key.to_string());
            }
        }
        out.sort();
        Ok(out)
    };
    match tokio::time::timeout(bound, work).await {
        Ok(r) => r,
        Err(_) => Err(RowError::from_detail(format!(
            "listing keys of {bucket}: no answer within {} ms",
            bound.as_millis()
        ))),
    }
}
