//! Leader-served KV rows.
//!
//! The `delivery` credential may read buckets only through `$JS.API.STREAM.MSG.GET` (no Direct
//! Get: docs/data-path.md), and freshness demands it anyway: the lease, an ACL re-check and a membership
//! interval must be read from the stream leader, never from a replica or a cache. Writes go
//! through plain JetStream publishes on `$KV.<bucket>.<key>` with an expected-revision header, so
//! every write here is a compare-and-set the broker arbitrates.

use std::fmt;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures::TryStreamExt;

/// Header carrying the KV operation of a client's marker (`DEL` / `PURGE`).
const KV_OPERATION: &str = "KV-Operation";
/// Header of a marker the broker placed itself (`MaxAge` when a row ran out its bucket's
/// `max_age` on a stream with `subject_delete_marker_ttl`; `Purge`, `Remove`). It carries no
/// `KV-Operation`, so a reader that looks only at that header takes it for a live, empty row.
const NATS_MARKER_REASON: &str = "Nats-Marker-Reason";
const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";

/// What one message of a bucket did to its key. Every reader of a bucket classifies with
/// [`row_op`], so a marker reads as absent everywhere, as async-nats (`Operation::Purge` /
/// `Delete`) and nats.js (`"PURGE"`, what a TypeScript peer reads) read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOp {
    /// A live row.
    Put,
    /// A `KV-Operation: DEL` marker (a delete, a release) or the broker's `Remove` marker.
    Deleted,
    /// A `KV-Operation: PURGE` marker or the broker's `Purge` marker.
    Purged,
    /// The broker's `MaxAge` marker: the row ran out its bucket's `max_age` (the lease TTL).
    Expired,
}

impl RowOp {
    /// Whether the message is a live row (anything else reads as absent).
    pub fn is_row(self) -> bool {
        self == RowOp::Put
    }
    /// The words a log line uses for it.
    pub fn as_str(self) -> &'static str {
        match self {
            RowOp::Put => "written",
            RowOp::Deleted => "deleted",
            RowOp::Purged => "purged",
            RowOp::Expired => "expired",
        }
    }
}

/// Classifies a KV message by its headers. A broker marker of a reason this build does not know
/// still carries no value, so it reads as a delete rather than as an empty row.
pub fn row_op(headers: Option<&HeaderMap>) -> RowOp {
    let Some(headers) = headers else {
        return RowOp::Put;
    };
    match headers.get(KV_OPERATION).map(|v| v.as_str()) {
        Some("DEL") => return RowOp::Deleted,
        Some("PURGE") => return RowOp::Purged,
        _ => {}
    }
    match headers.get(NATS_MARKER_REASON).map(|v| v.as_str()) {
        None => RowOp::Put,
        Some("MaxAge") => RowOp::Expired,
        Some("Purge") => RowOp::Purged,
        Some(_) => RowOp::Deleted,
    }
}

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
    /// No live row. `marker_revision` is the sequence of a marker (a delete, a purge, or the
    /// broker's expiry marker), which a create must name as the expected last sequence.
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
            Ok(msg) if row_op(Some(&msg.headers)).is_row() => Ok(Read::Present(Row {
                value: msg.payload,
                revision: msg.sequence,
            })),
            Ok(msg) => Ok(Read::Absent {
                marker_revision: Some(msg.sequence),
            }),
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

    /// A leader-served read of the live row for `key` and when the broker stored it (unix ms):
    /// a lease row expires its TTL after that, whatever its value says.
    pub async fn read_dated(&self, key: &str) -> Result<Option<(Row, u64)>, RowError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        match self
            .stream
            .get_last_raw_message_by_subject(&self.subject(key))
            .await
        {
            Ok(msg) if row_op(Some(&msg.headers)).is_row() => {
                let written_ms = (msg.time.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
                Ok(Some((
                    Row {
                        value: msg.payload,
                        revision: msg.sequence,
                    },
                    written_ms,
                )))
            }
            Ok(_) => Ok(None),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, *v);
        }
        h
    }

    /// The headers the broker and the clients put on a bucket's messages, each read as
    /// async-nats reads it (`Operation::Put` / `Delete` / `Purge`). The MaxAge marker's headers
    /// are the ones nats-server 2.15.1 stores (docs/host.md, "Standby hosts").
    /// Mutation seen failing: the `Nats-Marker-Reason` match removed (a marker reads `Put`).
    #[test]
    fn every_marker_reads_as_absent_and_a_plain_message_as_a_row() {
        assert_eq!(row_op(None), RowOp::Put);
        assert_eq!(
            row_op(Some(&headers(&[(EXPECTED_LAST_SUBJECT_SEQUENCE, "0")]))),
            RowOp::Put
        );
        assert_eq!(
            row_op(Some(&headers(&[(KV_OPERATION, "DEL")]))),
            RowOp::Deleted
        );
        assert_eq!(
            row_op(Some(&headers(&[
                (KV_OPERATION, "PURGE"),
                ("Nats-Rollup", "sub")
            ]))),
            RowOp::Purged
        );
        let max_age = headers(&[
            (NATS_MARKER_REASON, "MaxAge"),
            ("Nats-Rollup", "sub"),
            ("Nats-TTL", "30s"),
        ]);
        assert_eq!(row_op(Some(&max_age)), RowOp::Expired);
        assert_eq!(
            row_op(Some(&headers(&[(NATS_MARKER_REASON, "Purge")]))),
            RowOp::Purged
        );
        assert_eq!(
            row_op(Some(&headers(&[(NATS_MARKER_REASON, "Remove")]))),
            RowOp::Deleted
        );
        assert_eq!(
            row_op(Some(&headers(&[(NATS_MARKER_REASON, "Later")]))),
            RowOp::Deleted
        );
        assert!(!RowOp::Expired.is_row() && RowOp::Put.is_row());
    }
}
