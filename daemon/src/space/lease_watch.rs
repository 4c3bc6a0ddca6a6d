//! The watch on the daemon's own lease key.
//!
//! Why: the seeds require the daemon to notice at once when its lease key changes under it (an
//! operator's rewrite, a delete, another holder), not only at the next renew.

use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;

use crate::space::lease::{Identity, LeaseInfo};
use crate::wire::{SpaceNames, LEASE_KEY};

/// A change of the lease key seen by the watch.
pub(crate) enum WatchEvent {
    /// A row this process wrote.
    Own,
    /// Anything else: another holder's row, another incarnation's, a delete or a purge.
    Foreign,
}

/// The watch on the daemon's own lease key: an ordered push consumer delivering into the
/// daemon's inbox (the grant `$JS.API.CONSUMER.CREATE.KV_cotal_delivery_<s>.>`, DESIGN §6.3).
pub(crate) struct LeaseWatch {
    me: Identity,
    messages: Option<jetstream::consumer::push::Ordered>,
    stream: jetstream::stream::Stream<()>,
    name: String,
}

impl LeaseWatch {
    pub(crate) async fn bind(
        js: &jetstream::Context,
        names: &SpaceNames,
        me: &Identity,
    ) -> Result<LeaseWatch, String> {
        use jetstream::consumer::{push, DeliverPolicy};
        let stream = js
            .get_stream_no_info(SpaceNames::kv_stream(&names.delivery_bucket()))
            .await
            .map_err(|e| e.to_string())?;
        let name = format!("leasewatch_{}", me.incarnation);
        let consumer = stream
            .create_consumer(push::OrderedConfig {
                name: Some(name.clone()),
                deliver_subject: js.client().new_inbox(),
                filter_subject: format!("$KV.{}.{LEASE_KEY}", names.delivery_bucket()),
                deliver_policy: DeliverPolicy::LastPerSubject,
                ..Default::default()
            })
            .await
            .map_err(|e| crate::kv::broker_words(&e))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| crate::kv::broker_words(&e))?;
        Ok(LeaseWatch {
            me: me.clone(),
            messages: Some(messages),
            stream,
            name,
        })
    }

    /// The next change; `None` when the consumer ended (then parked: never ready again).
    pub(crate) async fn next(&mut self) -> Option<WatchEvent> {
        let Some(messages) = self.messages.as_mut() else {
            return std::future::pending().await;
        };
        loop {
            match messages.next().await {
                None => return None,
                Some(Err(_)) => continue,
                Some(Ok(msg)) => {
                    let op = msg
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("KV-Operation"))
                        .map(|v| v.as_str().to_string());
                    if op.is_some() {
                        return Some(WatchEvent::Foreign);
                    }
                    return match serde_json::from_slice::<LeaseInfo>(&msg.payload) {
                        Ok(info) if self.me.owns(&info) => Some(WatchEvent::Own),
                        _ => Some(WatchEvent::Foreign),
                    };
                }
            }
        }
    }

    pub(crate) fn park(&mut self) {
        self.messages = None;
    }

    /// Deletes the watch consumer; a failed delete leaves reclamation to the broker.
    pub(crate) async fn retire(&mut self) {
        self.messages = None;
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            self.stream.delete_consumer(&self.name),
        )
        .await;
    }
}
