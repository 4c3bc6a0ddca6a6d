//! Leader-served key listing of a KV bucket.
//!
//! The `delivery` credential has no `MSG.NEXT` on KV streams and no Direct Get (DESIGN §6.2,
//! §6.6), but it may ask the stream leader for `STREAM.INFO` with a `subjects_filter`: the
//! answer names every subject (key) holding a message, fresh from the leader, in one request
//! (paged by the broker for very large buckets). A key whose last message is a delete marker is
//! still listed; reading it through [`crate::kv::Rows::read`] reports it absent.

use std::time::Duration;

use async_nats::jetstream;
use futures::TryStreamExt;

use crate::kv::{broker_words, RowError};

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
