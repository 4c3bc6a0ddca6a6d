//! Connection events of an async-nats client, captured so a test can wait (bounded) for "the
//! client saw a disconnect" instead of guessing with a sleep.

use std::time::Duration;

use async_nats::{ConnectOptions, Event};
use tokio::sync::mpsc;

use crate::rig::error::HarnessError;

/// Events received so far and the channel the client's callback feeds.
#[derive(Debug)]
pub struct ClientEvents {
    rx: mpsc::UnboundedReceiver<Event>,
    seen: Vec<String>,
}

impl ClientEvents {
    /// Adds an event callback to `options` that records every event.
    pub fn capture(options: ConnectOptions) -> (ConnectOptions, ClientEvents) {
        let (tx, rx) = mpsc::unbounded_channel();
        let options = options.event_callback(move |event| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(event);
            }
        });
        (
            options,
            ClientEvents {
                rx,
                seen: Vec::new(),
            },
        )
    }

    /// Waits up to `bound` for the next event matching `pred`, consuming the ones before it.
    pub async fn wait_for(
        &mut self,
        bound: Duration,
        what: &str,
        pred: impl Fn(&Event) -> bool,
    ) -> Result<Event, HarnessError> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(event)) => {
                    self.seen.push(event.to_string());
                    if pred(&event) {
                        return Ok(event);
                    }
                }
                Ok(None) => {
                    return Err(HarnessError::Usage(format!(
                        "waiting for {what}: the client is gone (events seen: {:?})",
                        self.seen
                    )))
                }
                Err(_) => {
                    return Err(HarnessError::Timeout {
                        what: what.to_string(),
                        bound_ms: bound.as_millis(),
                        last: Some(format!("events seen: {:?}", self.seen)),
                    })
                }
            }
        }
    }

    /// Waits up to `bound` for the broker's permission violation of `op` (`Publish`,
    /// `Subscription`) on exactly `subject`.
    pub async fn expect_denied(
        &mut self,
        bound: Duration,
        op: &str,
        subject: &str,
    ) -> Result<(), HarnessError> {
        let needle = format!("Permissions Violation for {op} to \"{subject}\"");
        self.wait_for(bound, &needle, |e| match e {
            Event::ServerError(err) => err.to_string().contains(&needle),
            _ => false,
        })
        .await
        .map(|_| ())
    }

    /// Every event received so far, as displayed by async-nats (drains the channel first).
    pub fn seen(&mut self) -> &[String] {
        while let Ok(event) = self.rx.try_recv() {
            self.seen.push(event.to_string());
        }
        &self.seen
    }
}
