//! A broker watch of every write to a space's lease key: who wrote it, when the broker stamped
//! it, and whether the write was a row, a delete, a purge or the broker's own expiry marker.
//! Takeover tests and `smoke delivery-standby` judge the lease by this, not by a daemon's words.

use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::{push, DeliverPolicy};
use cotal_delivery::base::{row_op, RowOp};
use cotal_delivery::wire::{LeaseInfo, SpaceNames, LEASE_KEY};
use futures::StreamExt;

use crate::rig::error::HarnessError;
use crate::rig::mesh::Inspector;

/// One write to the lease key, as the broker stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseWrite {
    /// Its stream sequence (the KV revision).
    pub revision: u64,
    /// The broker's stamp (the leader's, on a cluster).
    pub stamped: SystemTime,
    pub op: RowOp,
    /// The row, for a write that is one (`None` for a marker or a value that does not parse).
    pub info: Option<LeaseInfo>,
}

impl LeaseWrite {
    /// Whether this write is `holder`'s row.
    pub fn is_row_of(&self, holder: &str) -> bool {
        self.op.is_row() && self.info.as_ref().is_some_and(|i| i.holder == holder)
    }
}

/// Where a [`LeaseLog`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFrom {
    /// The writes made after the bind.
    Now,
    /// The key's last message first (the lease bucket keeps one per key), then every write.
    Last,
    /// The writes after this stream sequence (a watch bound again after an error).
    After(u64),
}

/// An ordered push consumer on the lease key, from the inspector's (unrestricted) connection.
pub struct LeaseLog {
    messages: push::Ordered,
}

impl LeaseLog {
    pub async fn bind(insp: &Inspector, from: LogFrom) -> Result<LeaseLog, HarnessError> {
        let bucket = insp.names().delivery_bucket();
        let stream = insp
            .js
            .get_stream_no_info(SpaceNames::kv_stream(&bucket))
            .await
            .map_err(|e| HarnessError::Usage(format!("lease stream: {e}")))?;
        let consumer = stream
            .create_consumer(push::OrderedConfig {
                deliver_subject: insp.client.new_inbox(),
                filter_subject: format!("$KV.{bucket}.{LEASE_KEY}"),
                deliver_policy: match from {
                    LogFrom::Now => DeliverPolicy::New,
                    LogFrom::Last => DeliverPolicy::LastPerSubject,
                    LogFrom::After(seq) => DeliverPolicy::ByStartSequence {
                        start_sequence: seq + 1,
                    },
                },
                ..Default::default()
            })
            .await
            .map_err(|e| HarnessError::Usage(format!("lease log consumer: {e}")))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| HarnessError::Usage(format!("lease log messages: {e}")))?;
        Ok(LeaseLog { messages })
    }

    /// The next write within `bound`; `Ok(None)` when none came.
    pub async fn next(&mut self, bound: Duration) -> Result<Option<LeaseWrite>, HarnessError> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let msg = match tokio::time::timeout_at(deadline, self.messages.next()).await {
                Err(_) => return Ok(None),
                Ok(None) => return Err(HarnessError::Usage("the lease log ended".into())),
                // A missed heartbeat: the client recreates the consumer from the next sequence.
                Ok(Some(Err(e))) if e.kind() == push::OrderedErrorKind::MissingHeartbeat => {
                    continue
                }
                Ok(Some(Err(e))) => return Err(HarnessError::Usage(format!("lease log: {e}"))),
                Ok(Some(Ok(msg))) => msg,
            };
            let info = msg
                .info()
                .map_err(|e| HarnessError::Usage(format!("lease log message info: {e}")))?;
            let op = row_op(msg.headers.as_ref());
            return Ok(Some(LeaseWrite {
                revision: info.stream_sequence,
                stamped: SystemTime::from(info.published),
                op,
                info: op
                    .is_row()
                    .then(|| serde_json::from_slice(&msg.payload).ok())
                    .flatten(),
            }));
        }
    }

    /// Every write that comes until the log is quiet for `quiet`.
    pub async fn drain(&mut self, quiet: Duration) -> Result<Vec<LeaseWrite>, HarnessError> {
        let mut out = Vec::new();
        while let Some(w) = self.next(quiet).await? {
            out.push(w);
        }
        Ok(out)
    }
}
