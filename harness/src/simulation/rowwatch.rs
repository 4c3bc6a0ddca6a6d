//! The row watch: every write to the members and ACL buckets, as the broker stored it (key,
//! revision, put / delete / purge, the broker's stamp, the row), recorded as the history's
//! `row` lines from before the first operation to the end of the run.
//!
//! Why: the buckets keep one revision per key, so the final state cannot tell the checker the
//! cursor an unanswered join or leave wrote once a later write replaced the row, nor when an ACL
//! row changed; the log can (docs/simulation.md, "The row log"). An ordered push consumer on the
//! bucket's stream from sequence 1; bound again after an error from the last sequence seen. A
//! revision the bucket replaced while the watch was down is missed: the snapshot's last
//! revision per bucket lets the checker see that, and fall back on the operations for it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{push, DeliverPolicy};
use cotal_delivery::base::{row_op, RowOp};
use cotal_delivery::wire::SpaceNames;
use futures::StreamExt;
use tokio::sync::watch;

use super::record::Recorder;
use crate::rig::mesh::Inspector;
use crate::simulation::check::snapshot::RowLogEnd;
use crate::simulation::check::{RowBucket, RowChange, RowWrite};

/// How long the watch waits for a write before it checks whether it must stop.
const POLL: Duration = Duration::from_millis(500);
/// Wait before the watch is bound again after an error.
const REBIND_GAP: Duration = Duration::from_millis(1_000);
/// Bound on the watch catching up with a bucket's last revision at the end.
const SETTLE: Duration = Duration::from_secs(5);
/// How often the watch's progress is looked at while it catches up.
const SETTLE_POLL: Duration = Duration::from_millis(20);
/// Bound on reading a bucket stream's last revision.
const READ_BOUND: Duration = Duration::from_secs(5);

/// The last revision the watch recorded, per bucket.
pub type RowsSeen = Arc<Mutex<BTreeMap<RowBucket, u64>>>;

fn bucket_name(names: &SpaceNames, bucket: RowBucket) -> String {
    match bucket {
        RowBucket::Members => names.members_bucket(),
        RowBucket::Acl => names.acl_bucket(),
    }
}

async fn bind(
    insp: &Inspector,
    bucket: &str,
    from: u64,
) -> Result<push::Ordered, Box<dyn std::error::Error + Send + Sync>> {
    let stream = insp
        .js
        .get_stream_no_info(SpaceNames::kv_stream(bucket))
        .await?;
    let consumer = stream
        .create_consumer(push::OrderedConfig {
            deliver_subject: insp.client.new_inbox(),
            filter_subject: format!("$KV.{bucket}.>"),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from,
            },
            ..Default::default()
        })
        .await?;
    Ok(consumer.messages().await?)
}

/// Records every write to `bucket` until `stop`, from its first revision.
pub async fn watch(
    insp: Arc<Inspector>,
    bucket: RowBucket,
    recorder: Arc<Recorder>,
    seen: RowsSeen,
    mut stop: watch::Receiver<bool>,
) {
    let name = bucket_name(&insp.names, bucket);
    let prefix = format!("$KV.{name}.");
    let mut messages: Option<push::Ordered> = None;
    while !*stop.borrow() {
        let Some(current) = messages.as_mut() else {
            let last = seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&bucket)
                .copied()
                .unwrap_or(0);
            match bind(&insp, &name, last + 1).await {
                Ok(m) => messages = Some(m),
                Err(_) => {
                    let _ = tokio::time::timeout(REBIND_GAP, stop.changed()).await;
                }
            }
            continue;
        };
        let msg = match tokio::time::timeout(POLL, current.next()).await {
            Err(_) => continue,
            // A missed heartbeat: the client recreates the consumer from the next sequence.
            Ok(Some(Err(e))) if e.kind() == push::OrderedErrorKind::MissingHeartbeat => continue,
            Ok(None) | Ok(Some(Err(_))) => {
                messages = None;
                continue;
            }
            Ok(Some(Ok(msg))) => msg,
        };
        let Ok(info) = msg.info() else { continue };
        let revision = info.stream_sequence;
        let Some(key) = msg.subject.as_str().strip_prefix(&prefix) else {
            continue;
        };
        let change = match row_op(msg.headers.as_ref()) {
            RowOp::Put => RowChange::Put,
            RowOp::Purged => RowChange::Purge,
            RowOp::Deleted | RowOp::Expired => RowChange::Delete,
        };
        let stamp_ms = recorder
            .run_ms_of(std::time::SystemTime::from(info.published))
            .unwrap_or(0);
        let value = (change == RowChange::Put)
            .then(|| serde_json::from_slice(&msg.payload).ok())
            .flatten();
        recorder.row(RowWrite {
            bucket,
            key: key.to_string(),
            revision,
            change,
            stamp_ms,
            value,
        });
        let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
        let e = s.entry(bucket).or_insert(0);
        *e = (*e).max(revision);
    }
}

/// Each bucket's last revision, once the watch has recorded up to it (at most [`SETTLE`]); a
/// bucket whose last revision cannot be read is left out (the checker does not use its log).
pub async fn caught_up(insp: &Inspector, seen: &RowsSeen) -> Vec<RowLogEnd> {
    let mut out = Vec::new();
    for bucket in [RowBucket::Members, RowBucket::Acl] {
        let name = bucket_name(&insp.names, bucket);
        let last = tokio::time::timeout(READ_BOUND, async {
            let mut s = insp
                .js
                .get_stream(SpaceNames::kv_stream(&name))
                .await
                .ok()?;
            s.info().await.ok().map(|i| i.state.last_sequence)
        })
        .await
        .ok()
        .flatten();
        let Some(last) = last else { continue };
        let deadline = Instant::now() + SETTLE;
        while Instant::now() < deadline {
            let at = seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&bucket)
                .copied()
                .unwrap_or(0);
            if at >= last {
                break;
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
        out.push(RowLogEnd {
            bucket,
            last_revision: last,
        });
    }
    out
}
