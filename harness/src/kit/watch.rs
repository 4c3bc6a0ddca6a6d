//! What a case keeps watching between its steps, held by the world: broker advisories, the lease
//! key's writes, the admin rail's reply collectors, requests in flight and sweep watches. Each
//! runs a bounded collector task that ends with the watch.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use serde_json::Value;

use super::failure::Failure;
use crate::rig::lease_log::{LeaseLog, LeaseWrite};

/// A subscription to broker advisories and what it collected.
pub struct AdvisoryWatch {
    pub seen: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AdvisoryWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Most advisories one watch keeps.
const ADVISORIES_MAX: usize = 10_000;

impl AdvisoryWatch {
    /// Keeps every advisory `sub` delivers (at most [`ADVISORIES_MAX`]).
    pub fn start(mut sub: async_nats::Subscriber) -> AdvisoryWatch {
        let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
        let store = seen.clone();
        let task = tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                if let Ok(v) = serde_json::from_slice::<Value>(&m.payload) {
                    let mut s = store.lock().unwrap_or_else(|p| p.into_inner());
                    if s.len() < ADVISORIES_MAX {
                        s.push(v);
                    }
                }
            }
        });
        AdvisoryWatch { seen, task }
    }
}

/// A broker watch of the lease key, and the write a step read past (the end of a run).
pub struct LeaseLogWatch {
    log: LeaseLog,
    ahead: VecDeque<LeaseWrite>,
}

impl LeaseLogWatch {
    pub fn new(log: LeaseLog) -> LeaseLogWatch {
        LeaseLogWatch {
            log,
            ahead: VecDeque::new(),
        }
    }
    /// Gives back a write read past the end of a run: the next `next` returns it first.
    pub fn put_back(&mut self, write: LeaseWrite) {
        self.ahead.push_front(write);
    }
    /// The next write, waiting until `deadline`; `None` when none came.
    pub async fn next(&mut self, deadline: Instant) -> Result<Option<LeaseWrite>, Failure> {
        if let Some(w) = self.ahead.pop_front() {
            return Ok(Some(w));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        Ok(self.log.next(left).await?)
    }
}

/// What the admin rail's steps keep between steps: reply collectors, requests sent and not
/// waited for, one-shot connections and sweep watches.
#[derive(Default)]
pub struct AdminState {
    /// One reply collector per rail subject a `send` went out on (`<subject>.reply.>`).
    pub collectors: BTreeMap<String, Collector>,
    pub sent: BTreeMap<String, Sent>,
    pub once: BTreeMap<String, async_nats::Client>,
    pub sweeps: BTreeMap<String, Collector>,
}

impl AdminState {
    /// The request sent as `name` and the collector its reply arrives in.
    pub fn sent(&self, name: &str) -> Result<(&Sent, &Collector), Failure> {
        let sent = self
            .sent
            .get(name)
            .ok_or_else(|| Failure::could_not(format!("no request {name:?} was sent")))?;
        let collector = self
            .collectors
            .get(&sent.collector)
            .ok_or_else(|| Failure::could_not("no reply collector"))?;
        Ok((sent, collector))
    }
}

/// A subscription that keeps what arrives, in arrival order.
pub struct Collector {
    arrived: Arc<Mutex<Vec<Arrival>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
pub struct Arrival {
    pub subject: String,
    pub no_responders: bool,
    pub payload: Vec<u8>,
}

/// Most messages one collector keeps.
const ARRIVALS_MAX: usize = 100_000;

impl Collector {
    pub fn start(mut sub: async_nats::Subscriber) -> Collector {
        let arrived: Arc<Mutex<Vec<Arrival>>> = Arc::default();
        let store = arrived.clone();
        let task = tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let mut s = store.lock().unwrap_or_else(|p| p.into_inner());
                if s.len() < ARRIVALS_MAX {
                    s.push(Arrival {
                        subject: m.subject.to_string(),
                        no_responders: m.status == Some(async_nats::StatusCode::NO_RESPONDERS),
                        payload: m.payload.to_vec(),
                    });
                }
            }
        });
        Collector { arrived, task }
    }
    pub fn snapshot(&self) -> Vec<Arrival> {
        self.arrived
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    /// The reply on `subject` and its place in the arrival order.
    pub fn reply(&self, subject: &str) -> Option<(usize, Arrival)> {
        self.snapshot()
            .into_iter()
            .enumerate()
            .find(|(_, a)| a.subject == subject)
    }
}

/// A request sent and not waited for.
pub struct Sent {
    pub collector: String,
    pub reply: String,
    pub at: Instant,
}
