//! A standby lane's watch on the lease row of the space it stands by for.
//!
//! Why: a standby retries a held lease every 5 s (docs/host.md), so it noticed a released row
//! up to 5 s late and an expired one up to 5 s after its expiry. The watch wakes the lane the
//! moment the broker shows the row deleted, purged or expired (the lease bucket leaves a marker
//! when a row runs out its TTL, docs/host.md, "Standby hosts"). It decides nothing: the claim is
//! still the atomic create on the broker, and the retry stays as the fallback. When the watch is
//! lost the lane stands by on the retry alone.
//!
//! The watch is its own task with its own connection under the lane's delivery credential
//! (`_INBOX_<nkey>` replies): an ordered push consumer named `standbywatch_<id>` on the lease
//! key, the grant a daemon's own lease watch uses
//! (`$JS.API.CONSUMER.CREATE.KV_cotal_delivery_<s>.>`; an unnamed consumer is not covered). Its
//! bind never holds up the lane's retries.

use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, consumer::push, consumer::DeliverPolicy};
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use crate::base::{
    self, broker_words, row_op, Credential, CredentialCell, DialSpec, RowOp, BROKER_BOUND,
};
use crate::wire::{Space, SpaceNames, LEASE_KEY};

/// News a watch may hold for its lane before its task waits: each one is a write to the key
/// (or the bind, or the loss), so a lane that is busy claiming falls behind by a few at most.
const NEWS_KEPT: usize = 8;
/// Bound on the delete of the watch consumer and on the drain of its connection at retirement.
const RETIRE_BOUND: Duration = Duration::from_secs(2);
/// The connection name the broker's `/connz` shows for a standby's watch (never counted as its
/// credential's holder running).
pub use crate::space::STANDBY_WATCH_CONNECTION;

/// What the watch needs to dial and bind.
#[derive(Clone)]
pub(crate) struct WatchSpec {
    pub(crate) space: Space,
    pub(crate) dial: DialSpec,
}

/// The row's end, as the broker stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gone {
    pub(crate) op: RowOp,
    pub(crate) revision: u64,
    pub(crate) stamped: SystemTime,
}

/// What the watch tells its lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum News {
    /// The consumer is bound; `markers` says whether the bucket leaves a marker when a row
    /// expires (a bucket provisioned before them does not: only deletes and purges are seen).
    Bound { markers: bool },
    /// The row was deleted, purged or expired: claim now.
    Gone(Gone),
    /// The watch is lost (why); nothing more comes from it.
    Lost(String),
}

/// A running watch. Dropping it ends the task at once (the broker reclaims an undeleted
/// consumer 30 s after its connection closed); [`StandbyWatch::retire`] deletes it first.
pub(crate) struct StandbyWatch {
    news: mpsc::Receiver<News>,
    cell: CredentialCell,
    retire: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl StandbyWatch {
    /// Starts the watch's task: dial, bind, then forward every end of the row.
    pub(crate) fn spawn(spec: WatchSpec, credential: Credential) -> StandbyWatch {
        let (tx, news) = mpsc::channel(NEWS_KEPT);
        let (retire, retired) = oneshot::channel();
        let cell = CredentialCell::new(credential);
        let task = tokio::spawn(run(spec, cell.clone(), tx, retired));
        StandbyWatch {
            news,
            cell,
            retire: Some(retire),
            task,
        }
    }

    /// The next piece of news; pending forever once the task ended (after `Lost`).
    pub(crate) async fn next(&mut self) -> News {
        match self.news.recv().await {
            Some(news) => news,
            None => std::future::pending().await,
        }
    }

    /// The credential the lane read on its latest attempt: what the watch's next redial
    /// presents (a renewal written to the host's store reaches the watch this way).
    pub(crate) fn credential(&self, credential: &Credential) {
        if self.cell.get().jwt != credential.jwt {
            self.cell.set(credential.clone());
        }
    }

    /// Deletes the consumer and closes the connection (each bounded), then ends the task.
    pub(crate) async fn retire(mut self) {
        if let Some(tx) = self.retire.take() {
            let _ = tx.send(());
        }
        if tokio::time::timeout(2 * RETIRE_BOUND, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

impl Drop for StandbyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The watch's task. Every way out but a retirement sends `Lost` first.
async fn run(
    spec: WatchSpec,
    cell: CredentialCell,
    tx: mpsc::Sender<News>,
    mut retired: oneshot::Receiver<()>,
) {
    let lost = |why: String| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(News::Lost(why)).await;
        }
    };
    let resident = tokio::select! {
        dialed = base::dial(&spec.dial, cell) => match dialed {
            Ok(r) => r,
            Err(e) => return lost(format!("its connection failed: {e}")).await,
        },
        _ = &mut retired => return,
    };
    let names = SpaceNames::new(&spec.space);
    let bucket = names.delivery_bucket();
    let js = jetstream::context::ContextBuilder::new()
        .timeout(BROKER_BOUND)
        .build(resident.client.clone());
    let name = format!("standbywatch_{}", uuid::Uuid::new_v4().simple());
    let bind = async {
        // `STREAM.INFO`, granted to `delivery`: whether the bucket leaves expiry markers.
        let stream = js
            .get_stream(SpaceNames::kv_stream(&bucket))
            .await
            .map_err(|e| broker_words(&e))?;
        let markers = stream
            .cached_info()
            .config
            .subject_delete_marker_ttl
            .is_some();
        let consumer = stream
            .create_consumer(push::OrderedConfig {
                name: Some(name.clone()),
                deliver_subject: resident.client.new_inbox(),
                filter_subject: format!("$KV.{bucket}.{LEASE_KEY}"),
                // The key's last write first: a row gone between the lane's refused claim and
                // this bind wakes it at once.
                deliver_policy: DeliverPolicy::LastPerSubject,
                ..Default::default()
            })
            .await
            .map_err(|e| broker_words(&e))?;
        let messages = consumer.messages().await.map_err(|e| broker_words(&e))?;
        Ok::<_, String>((stream, markers, messages))
    };
    // Two requests (the stream's info, the consumer's create), each bounded by the context;
    // this bound catches only a bind stuck past both.
    let bind_bound = 2 * BROKER_BOUND;
    let bound = tokio::select! {
        r = tokio::time::timeout(bind_bound, bind) => r,
        _ = &mut retired => return close(resident).await,
    };
    let (stream, markers, mut messages) = match bound {
        Ok(Ok(b)) => b,
        Ok(Err(why)) => {
            lost(format!("its consumer could not be bound: {why}")).await;
            return close(resident).await;
        }
        Err(_) => {
            lost(format!(
                "its consumer was not bound within {} ms",
                bind_bound.as_millis()
            ))
            .await;
            return close(resident).await;
        }
    };
    if tx.send(News::Bound { markers }).await.is_err() {
        return close(resident).await;
    }
    loop {
        let next = tokio::select! {
            next = messages.next() => next,
            _ = &mut retired => break,
        };
        let msg = match next {
            Some(Ok(msg)) => msg,
            // Two missed 5 s heartbeats (its consumer gone, or the link stuck): the client
            // recreates the consumer from the next sequence, and a marker lives one lease TTL,
            // so the recreated one still finds it. The retry covers the gap.
            Some(Err(e)) if e.kind() == push::OrderedErrorKind::MissingHeartbeat => continue,
            // Anything else ends the stream for good (polling it again is not safe).
            Some(Err(e)) => {
                lost(format!("its consumer failed: {e}")).await;
                break;
            }
            None => {
                lost("its consumer ended".into()).await;
                break;
            }
        };
        let op = row_op(msg.headers.as_ref());
        if op.is_row() {
            // A renewal of the holder's row, or a new holder's create.
            continue;
        }
        let (revision, stamped) = match msg.info() {
            Ok(info) => (info.stream_sequence, SystemTime::from(info.published)),
            Err(_) => (0, SystemTime::now()),
        };
        let gone = News::Gone(Gone {
            op,
            revision,
            stamped,
        });
        tokio::select! {
            sent = tx.send(gone) => if sent.is_err() { break },
            _ = &mut retired => break,
        }
    }
    drop(messages);
    // A recreated consumer has another name (`<name>_<n>`): not found here, it goes with the
    // connection (the broker removes it 30 s after its interest is gone).
    let _ = tokio::time::timeout(RETIRE_BOUND, stream.delete_consumer(&name)).await;
    close(resident).await;
}

async fn close(resident: base::Resident) {
    resident.close(RETIRE_BOUND).await;
}
