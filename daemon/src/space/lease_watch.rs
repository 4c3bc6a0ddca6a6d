//! The watch on the daemon's own lease key.
//!
//! Why: the daemon must notice at once when its lease key changes under it (an operator's
//! rewrite, a delete, another holder), not only at the next renew (docs/architecture.md,
//! "Start-up and the lease").

use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;

use crate::journal::Journal;
use crate::kv::RowOp;
use crate::space::lease::Identity;
use crate::wire::LeaseInfo;
use crate::wire::{SpaceNames, LEASE_KEY};

/// A change of the lease key seen by the watch.
pub(crate) enum WatchEvent {
    /// A row this process wrote.
    Own,
    /// Anything else: another holder's row, another incarnation's, a delete or a purge (not
    /// the broker's expiry marker: see [`LeaseWatch::next`]).
    Foreign,
}

/// The watch on the daemon's own lease key: an ordered push consumer delivering into the
/// daemon's inbox (the grant `$JS.API.CONSUMER.CREATE.KV_cotal_delivery_<s>.>`, `provision/profiles.rs`).
pub(crate) struct LeaseWatch {
    me: Identity,
    messages: Option<jetstream::consumer::push::Ordered>,
    stream: jetstream::stream::Stream<()>,
    name: String,
    journal: Journal,
    client: async_nats::Client,
}

/// Bound on the delete of the watch consumer at retirement.
const RETIRE_BOUND: Duration = Duration::from_secs(2);

impl LeaseWatch {
    pub(crate) async fn bind(
        js: &jetstream::Context,
        names: &SpaceNames,
        me: &Identity,
        journal: Journal,
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
            journal,
            client: js.client(),
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
                    match crate::kv::row_op(msg.headers.as_ref()) {
                        // The broker's expiry marker: the row ran out its TTL. The keeper's
                        // renew counts as failed once the row may have expired (docs/
                        // architecture.md, "Start-up and the lease"), never later than this
                        // marker, so the marker is no news; taken as news it would stop a
                        // daemon that has just re-created its row.
                        RowOp::Expired => continue,
                        RowOp::Deleted | RowOp::Purged => return Some(WatchEvent::Foreign),
                        RowOp::Put => {}
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

    /// Deletes the watch consumer. A failed delete is said (a warning,
    /// docs/operations.md) and leaves reclamation to the broker (five minutes of inactivity).
    pub(crate) async fn retire(&mut self) {
        self.messages = None;
        // A connection that is down cannot carry the delete: the broker reclaims the consumer.
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return;
        }
        let why = match tokio::time::timeout(RETIRE_BOUND, self.stream.delete_consumer(&self.name))
            .await
        {
            Ok(Ok(_)) => return,
            Ok(Err(e)) => crate::kv::broker_words(&e),
            Err(_) => format!("no answer within {} ms", RETIRE_BOUND.as_millis()),
        };
        self.journal.line(format!(
            "! delivery: could not delete the lease watch consumer {} ({why}); the broker reclaims it after five minutes of inactivity",
            self.name
        ));
    }
}
