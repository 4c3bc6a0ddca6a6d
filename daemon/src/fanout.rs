//! The fan-out writer: the durable `fanout` on `CHAT_<s>`.
//!
//! It turns each post into per-member copies in `INBOX_<s>`. Routing only: authorization stays
//! with the broker and with the trusted reader's re-check.

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use tokio::task::JoinHandle;

use crate::plane::{stopped, PlaneCtx, PlaneError, StopRx};
use crate::wire::FANOUT_DURABLE;

/// Creates (or binds) the `fanout` durable and starts its loop.
pub async fn bind(ctx: &PlaneCtx, mut stop: StopRx) -> Result<JoinHandle<()>, PlaneError> {
    let err = |detail: String| PlaneError {
        what: "fan-out writer",
        detail,
    };
    let stream = ctx
        .js
        .get_stream_no_info(ctx.names.chat_stream())
        .await
        .map_err(|e| err(crate::kv::broker_words(&e)))?;
    let config = pull::Config {
        durable_name: Some(FANOUT_DURABLE.to_string()),
        filter_subject: ctx.names.chat_all(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: ctx.config.ack_wait,
        deliver_policy: DeliverPolicy::New,
        ..Default::default()
    };
    let _consumer = tokio::time::timeout(
        ctx.config.request_bound,
        stream.get_or_create_consumer(FANOUT_DURABLE, config),
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
        // The copy loop arrives with the data path (issue 4); until then posts stay pending in
        // the durable, unacked, so nothing is lost.
        stopped(&mut stop).await;
    }))
}
