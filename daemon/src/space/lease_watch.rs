//! The watch on the daemon's own lease key.
//!
//! Why: the daemon must notice at once when its lease key changes under it (an operator's
//! rewrite, a delete, another holder), not only at the next renew (docs/architecture.md,
//! "Start-up and the lease").
//!
//! The watch is a push consumer the daemon creates and names itself (`leasewatch_<incarnation>`,
//! then `leasewatch_<incarnation>_<n>` for each rebind), delivering the key's last row and every
//! later write into the daemon's inbox, with the broker's inactivity threshold at five minutes:
//! a consumer whose connection closed before it could carry the delete is reclaimed by the broker
//! that long after. A task of its own owns the consumer's whole life, so every retirement knows
//! the name it deletes (async-nats's ordered consumer renames the consumer it recreates, and a
//! retirement deleting the first name left the real one behind with a spurious warning):
//!
//! - a manual reconnect of the live connection (the move onto an adopted credential) first asks
//!   the watch to retire: the watch finishes a bind in flight, deletes its consumer on the
//!   connection still up, and only then lets the reconnect close it (bounded by the JetStream
//!   request timeout); once the connection is back the watch binds again;
//! - a connection replaced under it (a drop and redial) makes it bind a new consumer from the
//!   key's last row, so a write made while it was down is still seen, and delete the old one;
//! - a bind that finishes after its connection was replaced, or after a retirement was asked
//!   for, deletes the consumer it created instead of installing it (a bind whose answer was
//!   lost deletes its name in case it landed, silently when it had not); after a replacement
//!   it binds again at once on the new connection;
//! - the endpoint's stop retires it the same way before the connection closes;
//! - the first bind (start-up's last phase) outlives a blip: an attempt whose connection drops
//!   is abandoned and made again under a fresh name once the connection is back, so only the
//!   broker-gone verdict the start races, or [`FIRST_BIND_ATTEMPTS`], ends it.

use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::base::{ConnEvent, Journal, RowOp};
use crate::plane::{BrokerError, BrokerErrorKind};
use crate::space::lease::Identity;
use crate::wire::LeaseInfo;
use crate::wire::{SpaceNames, LEASE_KEY};

/// A change of the lease key seen by the watch.
pub(crate) enum WatchEvent {
    /// A row this process wrote.
    Own,
    /// Anything else: another holder's row, another incarnation's, a delete or a purge (not
    /// the broker's expiry marker: see [`Watcher::classify`]).
    Foreign,
}

/// The broker's inactivity threshold of the watch consumer: with no subscriber on its delivery
/// subject for this long (its connection closed before the delete), the broker deletes it.
pub const WATCH_INACTIVE_THRESHOLD: Duration = Duration::from_secs(5 * 60);
/// What a request on a client whose connection task has ended fails with (its command channel
/// closed).
const CLIENT_CLOSED: &str = "channel closed";
/// Bound on the delete of a watch consumer.
const DELETE_BOUND: Duration = Duration::from_secs(2);
/// Pause before another bind once one failed (the renew interval arbitrates meanwhile).
const REBIND_RETRY: Duration = Duration::from_secs(5);
/// Watch events waiting for the serve loop; one more waits in the watch's task.
const EVENTS_QUEUED: usize = 16;
/// Retirement requests waiting for the watch's task.
const COMMANDS_QUEUED: usize = 4;
/// Attempts of the first bind (start-up's last phase). Another attempt is made only after the
/// connection dropped while one was in flight and came back; the wait for it is bounded by the
/// broker-gone verdict its caller races (docs/operations.md, "Start-up"), and this bounds a
/// connection that keeps flapping without the verdict ever falling due.
pub(crate) const FIRST_BIND_ATTEMPTS: u32 = 4;

/// What the watch's task is asked to do.
enum Command {
    /// A manual reconnect of the live connection is about to close it: finish a bind in flight,
    /// delete the consumer on the connection still up, answer, and bind again once reconnected.
    RetireForReconnect(oneshot::Sender<()>),
    /// The endpoint stops: finish a bind in flight, delete the consumer, answer, end.
    Stop(oneshot::Sender<()>),
}

/// Asks the watch to retire before a manual reconnect (the renewal's move onto an adopted
/// credential). Cheap to clone.
#[derive(Clone)]
pub(crate) struct WatchRetirement {
    commands: mpsc::Sender<Command>,
    /// The JetStream request timeout: how long a reconnect waits for the retirement.
    bound: Duration,
}

impl WatchRetirement {
    /// Asks the watch to retire and waits for it, at most the JetStream request timeout: a
    /// reconnect that waited that long goes ahead (a bind then finishing on the replaced
    /// connection deletes its consumer instead of installing it).
    pub(crate) async fn before_reconnect(&self) {
        let (done, answered) = oneshot::channel();
        if self
            .commands
            .send(Command::RetireForReconnect(done))
            .await
            .is_ok()
        {
            let _ = tokio::time::timeout(self.bound, answered).await;
        }
    }
}

/// The watch on the daemon's own lease key, as the serve loop sees it.
pub(crate) struct LeaseWatch {
    events: Option<mpsc::Receiver<WatchEvent>>,
    retirement: WatchRetirement,
    task: JoinHandle<()>,
}

impl LeaseWatch {
    /// Binds the watch (start-up is complete once it is bound) and starts its task, which
    /// follows the resident connection through `conn` (its events).
    pub(crate) async fn bind(
        js: &jetstream::Context,
        names: &SpaceNames,
        me: &Identity,
        journal: Journal,
        conn: &broadcast::Sender<ConnEvent>,
        request_bound: Duration,
    ) -> Result<LeaseWatch, BrokerError> {
        let stream = js
            .get_stream_no_info(SpaceNames::kv_stream(&names.delivery_bucket()))
            .await
            .map_err(|e| BrokerError::new(BrokerErrorKind::Unsent, e.to_string()).source(e))?;
        let mut watcher = Watcher {
            me: me.clone(),
            stream,
            client: js.client(),
            filter: format!("$KV.{}.{LEASE_KEY}", names.delivery_bucket()),
            journal,
            request_bound,
            binds: 0,
            installed: None,
            conn: conn.subscribe(),
            dropped: false,
            replaced_while_binding: false,
            seen: 0,
        };
        let first = watcher.first_bind().await?;
        watcher.installed = Some(first);
        let (events_tx, events) = mpsc::channel(EVENTS_QUEUED);
        let (commands, commands_rx) = mpsc::channel(COMMANDS_QUEUED);
        let task = tokio::spawn(watcher.run(commands_rx, events_tx));
        Ok(LeaseWatch {
            events: Some(events),
            retirement: WatchRetirement {
                commands,
                bound: request_bound,
            },
            task,
        })
    }

    /// The handle a manual reconnect retires the watch through.
    pub(crate) fn retirement(&self) -> WatchRetirement {
        self.retirement.clone()
    }

    /// The next change; `None` when the watch's task ended (then parked: never ready again).
    pub(crate) async fn next(&mut self) -> Option<WatchEvent> {
        match self.events.as_mut() {
            Some(events) => events.recv().await,
            None => std::future::pending().await,
        }
    }

    pub(crate) fn park(&mut self) {
        self.events = None;
    }

    /// Retires the watch for good, before the connection closes: a bind in flight is finished
    /// and its consumer deleted, as is the installed one (a failed delete is said, a warning in
    /// docs/operations.md, and leaves reclamation to the broker). Bounded by the
    /// JetStream request timeout; past it the task is ended where it is.
    pub(crate) async fn retire(self) {
        let (done, answered) = oneshot::channel();
        if self
            .retirement
            .commands
            .send(Command::Stop(done))
            .await
            .is_ok()
        {
            let _ = tokio::time::timeout(self.retirement.bound, answered).await;
        }
    }
}

impl Drop for LeaseWatch {
    /// A watch dropped without [`LeaseWatch::retire`] (the broker is gone) ends its task; its
    /// consumer is left to the broker's inactivity threshold.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One watch consumer: its name and the subscription it delivers into.
struct Installed {
    name: String,
    deliveries: async_nats::Subscriber,
}

/// The watch's task: binds, rebinds and deletes its consumers.
struct Watcher {
    me: Identity,
    stream: jetstream::stream::Stream<()>,
    client: async_nats::Client,
    filter: String,
    journal: Journal,
    request_bound: Duration,
    /// Consumers bound so far (names the next one).
    binds: u64,
    installed: Option<Installed>,
    conn: broadcast::Receiver<ConnEvent>,
    /// The connection dropped since the installed consumer was bound (writes made meanwhile
    /// reached no subscriber): the next `Connected` rebinds.
    dropped: bool,
    /// The last bind's connection dropped while it was in flight (see [`Watcher::next_retry`]).
    replaced_while_binding: bool,
    /// The highest stream sequence of the key already passed on: a rebind starts from the
    /// key's last row, which the serve loop may already have been told about (a delete it is
    /// still arbitrating); told twice, it would stop serving again for a change it has seen.
    seen: u64,
}

/// What a delete answered "consumer not found" means.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Absent {
    /// The consumer was installed: someone else removed it, a failed delete (said).
    Failure,
    /// Its create's answer was lost, so it may never have been created: nothing to say.
    Expected,
}

/// How one attempt of the first bind ended.
enum Attempt {
    /// The create answered (or timed out) with the connection it was sent on.
    Answered(Result<Installed, BrokerError>),
    /// The connection dropped while it was in flight.
    Dropped,
    /// The connection closed for good.
    Closed,
}

/// What a bind was told while it was in flight.
#[derive(Default)]
struct WhileBinding {
    /// The connection it was bound on dropped (replaced by a redial).
    replaced: bool,
    /// A retirement asked for meanwhile, answered once the bind is dealt with.
    command: Option<Command>,
}

impl Watcher {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        events: mpsc::Sender<WatchEvent>,
    ) {
        let mut retry: Option<tokio::time::Instant> = None;
        loop {
            let command = tokio::select! {
                command = commands.recv() => command,
                ev = self.conn.recv() => {
                    match ev {
                        Ok(ConnEvent::Disconnected) | Ok(ConnEvent::Closed) => self.dropped = true,
                        Ok(ConnEvent::Connected) if self.dropped || self.installed.is_none() => {
                            if let Some(command) = self.rebind(&mut commands).await {
                                if self.obey(command).await {
                                    return;
                                }
                            }
                            retry = self.next_retry();
                        }
                        // Missed events may have hidden a drop: bind again from the last row.
                        Err(broadcast::error::RecvError::Lagged(_)) => self.dropped = true,
                        // The connection's owner is gone: only a command can come now.
                        Err(broadcast::error::RecvError::Closed) => {
                            let command = commands.recv().await;
                            if let Some(command) = command {
                                self.obey(command).await;
                            }
                            return;
                        }
                        Ok(_) => {}
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(retry.unwrap_or_else(tokio::time::Instant::now)), if retry.is_some() => {
                    if self.connected() {
                        if let Some(command) = self.rebind(&mut commands).await {
                            if self.obey(command).await {
                                return;
                            }
                        }
                    }
                    retry = self.next_retry();
                    continue;
                }
                delivered = next_delivery(&mut self.installed) => {
                    match delivered {
                        Some(msg) => {
                            if let Some(seq) = stream_sequence(&msg) {
                                if seq <= self.seen {
                                    continue;
                                }
                                self.seen = seq;
                            }
                            if let Some(event) = self.classify(&msg) {
                                if events.send(event).await.is_err() {
                                    return;
                                }
                            }
                        }
                        // The subscription ended under it: bind again.
                        None => {
                            self.installed = None;
                            retry = Some(tokio::time::Instant::now());
                        }
                    }
                    continue;
                }
            };
            let Some(command) = command else {
                return;
            };
            let retired_for_reconnect = matches!(command, Command::RetireForReconnect(_));
            if self.obey(command).await {
                return;
            }
            if retired_for_reconnect {
                // Bound again on the `Connected` of the reconnect; if that never comes (the
                // reconnect was not made), on the retry.
                retry = Some(tokio::time::Instant::now() + REBIND_RETRY);
            }
        }
    }

    /// When to bind again after a bind: at once when its connection was replaced while it was
    /// in flight and is back already (the bind read that `Connected` itself, so no event will
    /// ask again), after [`REBIND_RETRY`] when no consumer is installed or the installed one
    /// predates a drop (the bind failed), else not.
    fn next_retry(&mut self) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        let replaced = std::mem::take(&mut self.replaced_while_binding);
        if replaced && self.connected() {
            Some(now)
        } else if self.installed.is_none() || self.dropped {
            Some(now + REBIND_RETRY)
        } else {
            None
        }
    }

    /// Carries out a retirement; `true` when the task should end (a stop).
    async fn obey(&mut self, command: Command) -> bool {
        let installed = self.installed.take();
        if let Some(i) = installed {
            self.delete(i).await;
        }
        match command {
            Command::RetireForReconnect(done) => {
                let _ = done.send(());
                false
            }
            Command::Stop(done) => {
                let _ = done.send(());
                true
            }
        }
    }

    /// Binds a new consumer from the key's last row (a write missed while the connection was
    /// replaced is then seen) and deletes the one it replaces. A bind whose connection dropped
    /// meanwhile, or during which a retirement was asked for, deletes what it created instead
    /// of installing it; that retirement is returned to be carried out.
    async fn rebind(&mut self, commands: &mut mpsc::Receiver<Command>) -> Option<Command> {
        let mut told = WhileBinding::default();
        let name = self.next_name();
        let result = {
            let bind = create(
                &self.stream,
                &self.client,
                &self.filter,
                &name,
                self.request_bound,
            );
            tokio::pin!(bind);
            loop {
                tokio::select! {
                    r = &mut bind => break r,
                    ev = self.conn.recv() => {
                        if matches!(ev, Ok(ConnEvent::Disconnected) | Ok(ConnEvent::Closed) | Err(broadcast::error::RecvError::Lagged(_))) {
                            told.replaced = true;
                        }
                    }
                    // A retirement waits for this bind (and then for its consumer's delete).
                    command = commands.recv(), if told.command.is_none() => {
                        told.command = command;
                    }
                }
            }
        };
        match result {
            Ok(fresh) if told.replaced || told.command.is_some() => self.delete(fresh).await,
            Ok(fresh) => {
                self.dropped = false;
                if let Some(old) = self.installed.replace(fresh) {
                    self.delete(old).await;
                }
            }
            // The create may have landed although its answer was lost: delete the name. If it
            // never landed the broker has no such consumer, and there is nothing to say.
            Err(_) => self.delete_name(&name, Absent::Expected).await,
        }
        if told.replaced {
            self.dropped = true;
            self.replaced_while_binding = true;
        }
        told.command
    }

    /// The first bind: a consumer, subscribed. An attempt whose connection drops while it is in
    /// flight is abandoned (its request or its answer went with the connection, so it could only
    /// time out), and once the connection is back the bind is made again under a fresh name, from
    /// the key's last row; the abandoned name is deleted in case its create landed. So a blip
    /// while start-up binds the watch is not a start-up failure, and a broker gone for good ends
    /// the start with the verdict its caller races, at the window. A create the broker refuses,
    /// or that times out on a connection that stayed up, fails the bind; so does a connection
    /// that dropped during each of [`FIRST_BIND_ATTEMPTS`] attempts, or that closed.
    async fn first_bind(&mut self) -> Result<Installed, BrokerError> {
        let mut attempt = 1;
        loop {
            let name = self.next_name();
            let outcome = {
                let bind = create(
                    &self.stream,
                    &self.client,
                    &self.filter,
                    &name,
                    self.request_bound,
                );
                tokio::pin!(bind);
                loop {
                    tokio::select! {
                        r = &mut bind => break Attempt::Answered(r),
                        ev = self.conn.recv() => match ev {
                            Ok(ConnEvent::Disconnected) | Err(broadcast::error::RecvError::Lagged(_)) => {
                                break Attempt::Dropped
                            }
                            Ok(ConnEvent::Closed) | Err(broadcast::error::RecvError::Closed) => {
                                break Attempt::Closed
                            }
                            Ok(_) => {}
                        },
                    }
                }
            };
            match outcome {
                Attempt::Answered(Ok(installed)) => return Ok(installed),
                // Failed on a connection that is still up: the broker's answer, or its silence.
                Attempt::Answered(Err(e)) if self.connected() => return Err(e),
                Attempt::Closed => {
                    return Err(BrokerError::new(
                        BrokerErrorKind::Unsent,
                        "the connection closed while the watch was being bound",
                    ))
                }
                Attempt::Answered(Err(_)) | Attempt::Dropped => {}
            }
            if attempt >= FIRST_BIND_ATTEMPTS {
                return Err(BrokerError::new(
                    BrokerErrorKind::Unsent,
                    format!(
                        "the connection dropped during each of {FIRST_BIND_ATTEMPTS} attempts to bind it"
                    ),
                ));
            }
            attempt += 1;
            self.reconnected().await?;
            self.delete_name(&name, Absent::Expected).await;
        }
    }

    /// Waits for the connection to be back (its `Connected`, or a state that already reads
    /// connected). Unbounded here: the caller races it against the broker-gone verdict.
    async fn reconnected(&mut self) -> Result<(), BrokerError> {
        loop {
            if self.connected() {
                return Ok(());
            }
            match self.conn.recv().await {
                Ok(ConnEvent::Connected) => return Ok(()),
                Ok(ConnEvent::Closed) | Err(broadcast::error::RecvError::Closed) => {
                    return Err(BrokerError::new(
                        BrokerErrorKind::Unsent,
                        "the connection closed while the watch was being bound",
                    ))
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            }
        }
    }

    fn next_name(&mut self) -> String {
        let name = match self.binds {
            0 => format!("leasewatch_{}", self.me.incarnation),
            n => format!("leasewatch_{}_{n}", self.me.incarnation),
        };
        self.binds += 1;
        name
    }

    fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Deletes `installed`'s consumer and drops its subscription.
    async fn delete(&self, installed: Installed) {
        let Installed {
            name,
            mut deliveries,
        } = installed;
        let _ = tokio::time::timeout(DELETE_BOUND, deliveries.unsubscribe()).await;
        self.delete_name(&name, Absent::Failure).await;
    }

    /// Deletes the consumer `name`. A connection that is down cannot carry the delete: the
    /// broker reclaims the consumer after its inactivity threshold. A failed delete is said.
    async fn delete_name(&self, name: &str, absent: Absent) {
        use async_nats::jetstream::{stream::ConsumerErrorKind, ErrorCode};
        if !self.connected() {
            return;
        }
        let why = match tokio::time::timeout(DELETE_BOUND, self.stream.delete_consumer(name)).await
        {
            Ok(Ok(_)) => return,
            Ok(Err(e))
                if absent == Absent::Expected
                    && matches!(e.kind(), ConsumerErrorKind::JetStream(js)
                        if js.error_code() == ErrorCode::CONSUMER_NOT_FOUND) =>
            {
                return
            }
            Ok(Err(e)) => match crate::base::broker_words(&e) {
                // The client's own command channel closed under the request: the connection
                // is gone (closed at a credential's expiry, or by the daemon's close) though
                // its last state still read connected, so it could not carry the delete either.
                why if why == CLIENT_CLOSED => return,
                why => why,
            },
            Err(_) => format!("no answer within {} ms", DELETE_BOUND.as_millis()),
        };
        self.journal.line(format!(
            "! delivery: could not delete the lease watch consumer {name} ({why}); the broker reclaims it after five minutes of inactivity"
        ));
    }

    /// What a delivered message says about the key.
    fn classify(&self, msg: &async_nats::Message) -> Option<WatchEvent> {
        match crate::base::row_op(msg.headers.as_ref()) {
            // The broker's expiry marker: the row ran out its TTL. The keeper's renew counts as
            // failed once the row may have expired (docs/architecture.md, "Start-up and the
            // lease"), never later than this marker, so the marker is no news; taken as news it
            // would stop a daemon that has just re-created its row.
            RowOp::Expired => None,
            RowOp::Deleted | RowOp::Purged => Some(WatchEvent::Foreign),
            RowOp::Put => match serde_json::from_slice::<LeaseInfo>(&msg.payload) {
                Ok(info) if self.me.owns(&info) => Some(WatchEvent::Own),
                _ => Some(WatchEvent::Foreign),
            },
        }
    }
}

/// The stream sequence of a delivered message, from the reply subject the broker gives every
/// JetStream delivery (`$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>…`, or with a domain and
/// account hash ahead of the stream: `$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>…`).
fn stream_sequence(msg: &async_nats::Message) -> Option<u64> {
    let reply = msg.reply.as_ref()?;
    let tokens: Vec<&str> = reply.split('.').collect();
    if tokens.len() < 9 || tokens[0] != "$JS" || tokens[1] != "ACK" {
        return None;
    }
    let at = if tokens.len() == 9 { 5 } else { 7 };
    tokens.get(at)?.parse().ok()
}

/// Subscribes a fresh inbox, then creates the consumer `name` delivering into it from the key's
/// last row (the create's round trip follows the SUB on the same connection, so that row is not
/// missed), within `bound`.
async fn create(
    stream: &jetstream::stream::Stream<()>,
    client: &async_nats::Client,
    filter: &str,
    name: &str,
    bound: Duration,
) -> Result<Installed, BrokerError> {
    use jetstream::consumer::{push, AckPolicy, DeliverPolicy};
    use jetstream::stream::ConsumerErrorKind;
    let inbox = client.new_inbox();
    let deliveries = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| BrokerError::new(BrokerErrorKind::Unsent, e.to_string()).source(e))?;
    let create = stream.create_consumer(push::Config {
        name: Some(name.to_string()),
        deliver_subject: inbox,
        filter_subject: filter.to_string(),
        deliver_policy: DeliverPolicy::LastPerSubject,
        ack_policy: AckPolicy::None,
        memory_storage: true,
        inactive_threshold: WATCH_INACTIVE_THRESHOLD,
        ..Default::default()
    });
    match tokio::time::timeout(bound, create).await {
        Ok(Ok(_)) => Ok(Installed {
            name: name.to_string(),
            deliveries,
        }),
        Ok(Err(e)) => {
            let kind = match e.kind() {
                ConsumerErrorKind::TimedOut => BrokerErrorKind::TimedOut,
                _ => BrokerErrorKind::Refused,
            };
            Err(BrokerError::quoting(kind, "", e))
        }
        Err(elapsed) => Err(BrokerError::new(
            BrokerErrorKind::TimedOut,
            format!("no answer within {} ms", bound.as_millis()),
        )
        .source(elapsed)),
    }
}

/// The next message delivered to the installed consumer; never while none is installed.
async fn next_delivery(installed: &mut Option<Installed>) -> Option<async_nats::Message> {
    match installed.as_mut() {
        Some(i) => i.deliveries.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(reply: &str) -> async_nats::Message {
        async_nats::Message {
            subject: "$KV.b.k".into(),
            reply: Some(reply.into()),
            payload: Default::default(),
            headers: None,
            status: None,
            description: None,
            length: 0,
        }
    }

    /// The stream sequence is read from both reply forms; anything else is not a delivery.
    /// Mutation seen failing: the domain form read at the first form's position.
    #[test]
    fn the_stream_sequence_is_read_from_either_reply_form() {
        assert_eq!(
            stream_sequence(&delivered("$JS.ACK.KV_b.leasewatch_1.1.42.7.1700000000.0")),
            Some(42)
        );
        assert_eq!(
            stream_sequence(&delivered(
                "$JS.ACK.hub.ACCHASH.KV_b.leasewatch_1.1.42.7.1700000000.0.xyz"
            )),
            Some(42)
        );
        assert_eq!(stream_sequence(&delivered("_INBOX.abc")), None);
    }
}
