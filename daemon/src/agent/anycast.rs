//! The agent side of anycast take records (docs/anycast.md). A role holder asks the daemon to
//! record its take on its own take subject just before it shows a role request; when the daemon
//! refuses because the task stream was recreated, the holder re-reads the creation time and,
//! when it moved, naks its copy so the broker delivers the request again at once on the new
//! stream; a refused take of a cancelled request forgets the copy. A sender reads or cancels its
//! own request with `anycastStatus` / `anycastCancel`. While no daemon serves, every call
//! reports "no delivery daemon is answering".

use async_nats::jetstream::{self, AckKind};
use serde_json::{json, Value};

use super::{Agent, AgentError, AgentErrorKind, BROKER_BOUND, REQUEST_TIMEOUT};
use crate::wire::{CtlService, Role, SpaceNames};

/// What the holder does with its copy after asking to take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeVerdict {
    /// The take is recorded (first take, a move, or a repeat of its own): show the request.
    Show { took: String },
    /// The stream was recreated since the holder read its creation time, which moved: the copy
    /// was nak'ed (redelivered at once on the new stream). `created` is the new creation time.
    Naked { created: String, why: String },
    /// The request was cancelled by its sender (or left the queue): the copy is forgotten.
    Forget { why: String },
    /// Another holder's take stands: do not show it.
    Refused { why: String },
}

/// Why a call found no daemon (docs/anycast.md's words).
pub const NO_DAEMON: &str = "no delivery daemon is answering";
/// What a holder says when a daemon or its own seat predates takes (docs/anycast.md).
pub const PREDATES_FIX: &str = "restart the daemon or respawn the seat";
/// Bound of the liveness probe that tells a daemon predating takes from no daemon at all.
const PROBE_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

fn no_daemon(e: AgentError) -> AgentError {
    if e.kind() == AgentErrorKind::NoResponders {
        AgentError::new(
            AgentErrorKind::NoResponders,
            format!("anycast: {NO_DAEMON} ({})", e.detail()),
        )
    } else {
        e
    }
}

impl Agent {
    /// The task stream's creation time in unix nanoseconds (what a take names), read from the
    /// stream leader.
    pub async fn task_created(&self) -> Result<String, AgentError> {
        let task = self.names.task_stream();
        let read = async {
            self.js
                .get_stream(task.clone())
                .await
                .map(|s| s.cached_info().created.unix_timestamp_nanos().to_string())
        };
        match tokio::time::timeout(BROKER_BOUND, read).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(AgentError::new(
                AgentErrorKind::Broker,
                format!("reading {task}: {e}"),
            )),
            Err(_) => Err(AgentError::new(
                AgentErrorKind::TimedOut,
                format!("reading {task}: no answer"),
            )),
        }
    }

    /// Binds the role's shared durable `svc_<role>` on `TASK_<s>`, from which a holder of the
    /// role receives its requests (bind-only: the provisioner pre-created it, and the
    /// credential grants INFO, MSG.NEXT and ACK on the durables of its own roles only).
    pub async fn role_queue(
        &self,
        role: &str,
    ) -> Result<jetstream::consumer::PullConsumer, AgentError> {
        let role = Role::parse(role)
            .map_err(|e| AgentError::new(AgentErrorKind::Malformed, e.to_string()))?;
        let durable = SpaceNames::task_durable(&role);
        let task = self.names.task_stream();
        let info_subject = format!("$JS.API.CONSUMER.INFO.{task}.{durable}");
        let errors_before = self.server_errors_seen();
        let bind = self
            .js
            .get_consumer_from_stream(durable.clone(), task.clone());
        // A credential without the role is denied at once by the broker, and the bind would
        // only time out: watch the connection's server errors so the denial answers first.
        let denied = self.denied(errors_before, &info_subject);
        let outcome = tokio::time::timeout(BROKER_BOUND, async {
            tokio::select! {
                r = bind => Some(r),
                _ = denied => None,
            }
        })
        .await;
        match outcome {
            Ok(Some(Ok(c))) => Ok(c),
            Ok(None) => Err(AgentError::new(
                AgentErrorKind::Broker,
                format!("binding {durable} on {task}: the broker denied it (this credential does not serve @{role})"),
            )),
            Ok(Some(Err(e))) => Err(AgentError::new(
                AgentErrorKind::Broker,
                format!("binding {durable} on {task}: {e}"),
            )),
            Err(_) => Err(AgentError::new(
                AgentErrorKind::TimedOut,
                format!("binding {durable} on {task}: no answer"),
            )),
        }
    }

    /// Asks the daemon to record this holder's take of the request at `seq`, read from the
    /// stream created at `seen_created`, in delivery number `delivered`. While no daemon answers
    /// it says "no delivery daemon is answering"; when a daemon serves but not takes (it, or its
    /// credential, predates them) or the broker denies this seat's take subject (a seat minted
    /// before takes), it says to restart the daemon or respawn the seat.
    pub async fn anycast_take(
        &self,
        seq: u64,
        seen_created: &str,
        delivered: u64,
    ) -> Result<Value, AgentError> {
        let subject = self
            .names
            .ctl_subject(CtlService::Anycast, self.principal());
        let before = self.server_errors_seen();
        let take = self.request_on(
            CtlService::Anycast,
            "take",
            json!({
                "seq": seq,
                "streamCreated": seen_created,
                "delivered": delivered,
                "lifecycleUid": self.lifecycle_uid().to_string(),
            }),
            REQUEST_TIMEOUT,
        );
        let outcome = tokio::select! {
            r = take => r,
            _ = self.denied(before, &subject) => {
                return Err(AgentError::new(
                    AgentErrorKind::Broker,
                    format!("anycast: the broker denied this seat's take subject {subject}: its credential predates takes, so role requests wait on the queue; {PREDATES_FIX}"),
                ));
            }
        };
        match outcome {
            Err(e) if e.kind() == AgentErrorKind::NoResponders => {
                // Is a daemon serving the space at all? One that answers the liveness probe
                // but not takes predates them (or its credential does).
                let probe = self.probe_delivery(PROBE_BOUND).await;
                if probe.responder == "bound" {
                    Err(AgentError::new(
                        AgentErrorKind::NoResponders,
                        format!("anycast: the delivery daemon serving this space does not answer takes on {subject} (it or its credential predates them), so role requests wait on the queue; {PREDATES_FIX}"),
                    ))
                } else {
                    Err(no_daemon(e))
                }
            }
            other => other.map_err(no_daemon),
        }
    }

    /// Takes `msg` (a copy delivered from `TASK_<s>`) before showing it: records the take, and on
    /// a refusal acts on the copy (nak on a moved creation time, ack on a cancelled or gone
    /// request so it is forgotten).
    pub async fn take_before_showing(
        &self,
        msg: &jetstream::Message,
        seen_created: &str,
    ) -> Result<TakeVerdict, AgentError> {
        let info = msg.info().map_err(|e| {
            AgentError::new(
                AgentErrorKind::Malformed,
                format!("not a JetStream delivery: {e}"),
            )
        })?;
        let (seq, delivered) = (info.stream_sequence, info.delivered.max(1) as u64);
        match self.anycast_take(seq, seen_created, delivered).await {
            Ok(v) => Ok(TakeVerdict::Show {
                took: v["took"].as_str().unwrap_or_default().to_string(),
            }),
            Err(e) if e.kind() == AgentErrorKind::Refused => {
                let why = e.detail().to_string();
                let created = self.task_created().await?;
                if created != seen_created {
                    msg.ack_with(AckKind::Nak(None)).await.map_err(|e| {
                        AgentError::new(AgentErrorKind::Broker, format!("nak: {e}"))
                    })?;
                    Ok(TakeVerdict::Naked { created, why })
                } else if why.contains("was cancelled") || why.contains("no request at seq") {
                    // The request is gone from the queue; acking the copy only forgets it.
                    let _ = msg.ack().await;
                    Ok(TakeVerdict::Forget { why })
                } else {
                    Ok(TakeVerdict::Refused { why })
                }
            }
            Err(e) => Err(e),
        }
    }

    /// `anycastStatus {seq}`: this sender's own request.
    pub async fn anycast_status(&self, seq: u64) -> Result<Value, AgentError> {
        self.request("anycastStatus", json!({"seq": seq}), REQUEST_TIMEOUT)
            .await
            .map_err(no_daemon)
    }

    /// `anycastCancel {seq}`: succeeds only while no holder has taken it.
    pub async fn anycast_cancel(&self, seq: u64) -> Result<Value, AgentError> {
        self.request("anycastCancel", json!({"seq": seq}), REQUEST_TIMEOUT)
            .await
            .map_err(no_daemon)
    }
}
