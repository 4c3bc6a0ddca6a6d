//! The `ctl.delivery` rail as an agent meets it, beyond the cases of the `bad-input` and
//! `oversized` families: an implicit lifecycle made ambiguous by a second live one, and a
//! pending request whose connection closes is rejected and never replayed (the agent client's
//! side).

use std::time::Duration;

use cotal_delivery::agent::AgentErrorKind;
use delivery_harness::rig::agent;
use delivery_harness::TcpProxy;
use serde_json::json;

use crate::support::data_path::*;

/// Without `lifecycleUid` the caller's single live ACL row names the lifecycle; a second live
/// lifecycle of the same principal makes that ambiguous, refused loudly (the malformed requests
/// themselves are the case `bad-input/delivery-malformed-requests`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_lifecycle_makes_the_implicit_one_ambiguous() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = crate::support::start(daemon_spec(&mesh)).await;
    let (eve, _) = agent::spawn(&mesh, &insp, "eve", &["general", "eng.>"])
        .await
        .unwrap();
    let t = Duration::from_secs(5);
    let ok = eve
        .request("durableJoin", json!({"channel": "eng.alerts"}), t)
        .await
        .unwrap();
    assert_eq!(ok, json!({"durable": true, "generation": 1}));
    agent::provision(&mesh, &insp, mesh.space(), "eve", &["general"])
        .await
        .unwrap();
    let e = eve
        .request("listMemberships", json!({}), t)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), AgentErrorKind::Refused);
    assert!(
        e.detail()
            .starts_with("listMemberships: local.eve has 2 live ACL rows"),
        "{e}"
    );
    stop_daemon(&mut daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_request_whose_connection_closes_is_rejected_not_replayed() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = crate::support::start(daemon_spec(&mesh)).await;
    let proxy = TcpProxy::start(mesh.broker.port()).await.unwrap();
    let material = agent::provision(&mesh, &insp, mesh.space(), "eve", &["general"])
        .await
        .unwrap();
    let eve = cotal_delivery::agent::Agent::connect(cotal_delivery::agent::AgentSpec::of_material(
        proxy.url(),
        None,
        &material,
        "eve",
    ))
    .await
    .unwrap();
    // The request leaves the client but never reaches the broker; then the path drops.
    proxy.blackhole_established();
    let pending = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let r = eve
            .request(
                "durableJoin",
                json!({"channel": "general"}),
                Duration::from_secs(30),
            )
            .await;
        (r, started.elapsed(), eve)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.cut_established();
    let (result, waited, _eve) = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .unwrap()
        .unwrap();
    let e = result.unwrap_err();
    assert_eq!(e.kind(), AgentErrorKind::ConnectionClosed, "{e}");
    assert!(
        waited < Duration::from_secs(10),
        "rejected after {waited:?}"
    );
    proxy.heal();
    // Never replayed: the daemon never wrote the membership.
    tokio::time::sleep(QUIET).await;
    assert!(member_row(
        &insp,
        "general",
        &material.principal,
        &material.lifecycle_uid
    )
    .await
    .is_none());
    stop_daemon(&mut daemon).await;
}
