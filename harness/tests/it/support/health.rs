//! Shared pieces of the `health_*` and `renewal_*` tests: an admin-rail caller, and
//! measured-time printing.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use cotal_delivery::base::Credential;
use cotal_delivery::provision::{MintOptions, Profile};
use cotal_delivery::wire::{CtlService, Principal, Space, SpaceNames};
use delivery_harness::rig::mesh::Mesh;
use futures::StreamExt;

/// The lines a test is judged by: the daemon's own `✓ ✗ ! •` lines, without the ones
/// whose presence depends on scheduling (the `✓` "renews its delivery lease again" note, sweeps).
/// Warnings stay: a `! delivery: could not renew its lease …` line is part of the transcript.
pub fn own_lines(transcript: &str) -> String {
    transcript
        .lines()
        .filter(|l| {
            l.starts_with('✓') || l.starts_with('✗') || l.starts_with('!') || l.starts_with('•')
        })
        .filter(|l| !delivery_harness::rig::daemon::is_component_line(l))
        .filter(|l| !l.contains("$SYS sweeps bound"))
        .filter(|l| !(l.starts_with('✓') && l.contains("renews its delivery lease")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Prints a measured figure so `cargo test -- --nocapture` reports it.
pub fn measured(what: &str, d: Duration) {
    println!("MEASURED {what}: {} ms", d.as_millis());
}

pub fn since(t: Instant) -> Duration {
    t.elapsed()
}

/// The broker's `total_connections` (every connection ever accepted). A failed `/varz` read
/// or a missing field fails the test: it must never read as 0.
pub async fn total_connections(mesh: &Mesh) -> u64 {
    let varz = mesh.broker.varz().await.expect("/varz answers");
    varz["total_connections"]
        .as_u64()
        .unwrap_or_else(|| panic!("/varz has no total_connections: {varz}"))
}

/// A `supervisor` on the admin rail: requests go to `ctl.delivery-admin.<o>.<a>` with the reply
/// under the request subject's own `.reply.` subtree.
pub struct Supervisor {
    pub client: async_nats::Client,
    pub principal: Principal,
    pub names: SpaceNames,
}

impl Supervisor {
    pub async fn connect(mesh: &Mesh, space: &Space) -> Supervisor {
        let principal = Principal::parse("local.boss").expect("principal");
        let cred: Credential = mesh
            .mint(
                space,
                &Profile::Supervisor {
                    principal: principal.clone(),
                },
                MintOptions::new(),
            )
            .expect("mint supervisor");
        let client = mesh
            .connect(&cred, "harness-supervisor")
            .await
            .expect("connect");
        Supervisor {
            client,
            principal,
            names: SpaceNames::new(space),
        }
    }

    /// One request; `Err` when nothing answered within `bound` (no responder or silence).
    pub async fn request(
        &self,
        op: &str,
        args: serde_json::Value,
        bound: Duration,
    ) -> Result<serde_json::Value, String> {
        let subject = self
            .names
            .ctl_subject(CtlService::DeliveryAdmin, &self.principal);
        let reply = format!("{subject}.reply.{}", uuid_like());
        let mut sub = self
            .client
            .subscribe(reply.clone())
            .await
            .map_err(|e| e.to_string())?;
        self.client.flush().await.map_err(|e| e.to_string())?;
        let body = serde_json::json!({
            "op": op,
            "args": args,
            "from": {"id": self.principal.dot_form()},
        });
        self.client
            .publish_with_reply(subject, reply, body.to_string().into())
            .await
            .map_err(|e| e.to_string())?;
        self.client.flush().await.map_err(|e| e.to_string())?;
        match tokio::time::timeout(bound, sub.next()).await {
            Ok(Some(msg)) => serde_json::from_slice(&msg.payload).map_err(|e| e.to_string()),
            Ok(None) => Err("subscription ended".into()),
            Err(_) => Err(format!("no answer within {} ms", bound.as_millis())),
        }
    }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "r{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Waits (bounded) until the daemon's start-up is complete, judged from the broker: its lease
/// watch consumer (`leasewatch_<incarnation>`) exists on the lease bucket's stream.
pub async fn wait_started(mesh: &Mesh, space: &Space, bound: Duration) {
    let insp = mesh.inspector(space).await.expect("inspector");
    let stream_name = SpaceNames::kv_stream(&insp.names().delivery_bucket());
    let deadline = Instant::now() + bound;
    loop {
        if let Ok(stream) = insp.js.get_stream(&stream_name).await {
            let mut names = stream.consumer_names();
            while let Some(Ok(name)) = names.next().await {
                if name.starts_with("leasewatch_") {
                    return;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "the daemon's lease watch was not bound within {} ms",
            bound.as_millis()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
