//! The trusted reader: the durable `reader` on `INBOX_<s>`.
//!
//! Agents hold no content-bearing read on the mixed per-member store; the reader re-authorizes
//! each entry and hands the authorized frame to the member's own `dlv_` durable.

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use tokio::task::JoinHandle;

use crate::plane::{stopped, PlaneCtx, PlaneError, StopRx};
use crate::wire::READER_DURABLE;

/// Creates (or binds) the `reader` durable (exactly one filter subject, DESIGN §6.5).
pub async fn bind(ctx: &PlaneCtx, mut stop: StopRx) -> Result<JoinHandle<()>, PlaneError> {
    let err = |detail: String| PlaneError {
        what: "trusted reader",
        detail,
    };
    let stream = ctx
        .js
        .get_stream_no_info(ctx.names.inbox_stream())
        .await
        .map_err(|e| err(crate::kv::broker_words(&e)))?;
    let config = pull::Config {
        durable_name: Some(READER_DURABLE.to_string()),
        filter_subject: ctx.names.dinbox_all(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: ctx.config.ack_wait,
        deliver_policy: DeliverPolicy::All,
        max_ack_pending: ctx.config.reader_max_ack_pending,
        ..Default::default()
    };
    let _consumer = tokio::time::timeout(
        ctx.config.request_bound,
        stream.get_or_create_consumer(READER_DURABLE, config),
    )
    .await
    .map_err(|_| {
        err(format!(
            "no answer within {} ms",
            ctx.config.request_bound.as_millis()
        ))
    })?
    .map_err(|e| err(crate::kv::broker_words(&e)))?;
    Ok(tokio::spawn(async move {
        // The re-authorization loop arrives with the data path (issue 4); until then entries
        // stay pending, unacked.
        stopped(&mut stop).await;
    }))
}
