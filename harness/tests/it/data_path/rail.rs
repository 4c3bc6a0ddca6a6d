//! The `ctl.delivery` rail as an agent meets it: reply binding (a forged reply target under
//! another caller's subtree gets nothing), the max_payload refusal with the reply's size on a
//! TLS-required broker, refusals for unknown ops and malformed args, and a pending request whose
//! connection closes is rejected and never replayed.

use std::time::Duration;

use cotal_delivery::agent::AgentErrorKind;
use cotal_delivery::wire::CtlService;
use delivery_harness::agent;
use delivery_harness::mesh::Mesh;
use delivery_harness::TcpProxy;
use futures::StreamExt;
use serde_json::json;

use crate::support::data_path::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_reply_target_gets_nothing_and_the_own_subtree_is_answered() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = start_daemon(&mesh).await;
    let (eve, _) = agent::spawn(&mesh, &insp, "eve", &["general"])
        .await
        .unwrap();
    let (bob, _) = agent::spawn(&mesh, &insp, "bob", &["general"])
        .await
        .unwrap();
    let victim_subtree = insp
        .names
        .ctl_reply_subtree(CtlService::Delivery, bob.principal());
    let mut victim = bob
        .client()
        .subscribe(victim_subtree.clone())
        .await
        .unwrap();
    bob.client().flush().await.unwrap();
    let own = insp
        .names
        .ctl_subject(CtlService::Delivery, eve.principal());
    let body = json!({"op":"listMemberships","args":{},"from":{"id":"local.eve","name":"eve"}});
    let forged = format!(
        "{}.reply.forged",
        insp.names
            .ctl_subject(CtlService::Delivery, bob.principal())
    );
    eve.client()
        .publish_with_reply(own.clone(), forged, body.to_string().into())
        .await
        .unwrap();
    eve.client().flush().await.unwrap();
    // The daemon is serving (eve's own-subtree request below is answered), yet bob got nothing.
    let answered = eve.list_memberships().await.unwrap();
    assert_eq!(answered, json!({"memberships": []}));
    let got = tokio::time::timeout(QUIET, victim.next()).await;
    assert!(got.is_err(), "the victim received {got:?}");
    // A from.id that is not the subject's caller is refused.
    let spoof = json!({"op":"listMemberships","args":{},"from":{"id":"local.bob","name":"eve"}});
    let reply = format!("{own}.reply.spoof");
    let e = eve
        .request_raw(
            &own,
            &reply,
            spoof.to_string().into_bytes(),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert_eq!(e.detail(), "sender mismatch - request rejected");
    stop_daemon(&mut daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ops_and_malformed_args_get_clear_refusals() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = start_daemon(&mesh).await;
    let (eve, _) = agent::spawn(&mesh, &insp, "eve", &["general", "eng.>"])
        .await
        .unwrap();
    let t = Duration::from_secs(5);
    let cases = [
        ("frobnicate", json!({}), "op \"frobnicate\" not supported on the delivery control service"),
        ("durableJoin", json!({"channel": 5}), "durableJoin: channel must be a non-blank string"),
        ("durableJoin", json!({"channel": "  "}), "durableJoin: channel must be a non-blank string"),
        ("durableJoin", json!({"channel": "eng.*"}), "durableJoin: \"eng.*\" must be a concrete channel (durable membership is per-concrete-channel, not wildcard)"),
        ("durableJoin", json!({"channel": "secret"}), "channel \"secret\" is not within your read ACL [general, eng.>]"),
        ("durableLeave", json!({"channel": "general"}), "durableLeave: a finite generation is required (fail-closed stale-leave guard)"),
        ("durableLeave", json!({"channel": "general", "generation": "1"}), "durableLeave: a finite generation is required (fail-closed stale-leave guard)"),
        ("listMemberships", json!([1]), "listMemberships: args must be an object"),
        ("listMemberships", json!({"lifecycleUid": "NOPE"}), "listMemberships: invalid lifecycle uid \"NOPE\": a lifecycle uid is 26 to 32 characters from [a-z0-9]"),
    ];
    for (op, args, want) in cases {
        let e = eve.request(op, args.clone(), t).await.unwrap_err();
        assert_eq!(e.kind(), AgentErrorKind::Refused, "{op} {args}");
        assert_eq!(e.detail(), want, "{op} {args}");
    }
    // Without lifecycleUid the caller's single live ACL row names it; a second live lifecycle
    // of the same principal makes that ambiguous, refused loudly.
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
    assert!(
        e.detail()
            .starts_with("listMemberships: local.eve has 2 live ACL rows"),
        "{e}"
    );
    // A malformed body.
    let own = insp
        .names
        .ctl_subject(CtlService::Delivery, eve.principal());
    let e = eve
        .request_raw(&own, &format!("{own}.reply.m"), b"{not json".to_vec(), t)
        .await
        .unwrap_err();
    assert!(e.detail().starts_with("malformed request:"), "{e}");
    stop_daemon(&mut daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_reply_is_refused_with_its_size_on_a_tls_max_payload_broker() {
    let mesh = Mesh::demo_builder()
        .unwrap()
        .broker(|b| b.tls().max_payload_bytes(4096))
        .start()
        .await
        .unwrap();
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = start_daemon(&mesh).await;
    let (eve, _) = agent::spawn(&mesh, &insp, "eve", &["big.>"]).await.unwrap();
    let pad = "x".repeat(80);
    for i in 0..40 {
        let ch = format!("big.c{i:02}{pad}");
        let out = eve
            .request(
                "durableJoin",
                json!({"channel": ch}),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(out["durable"], true);
    }
    let e = eve.list_memberships().await.unwrap_err();
    assert_eq!(e.kind(), AgentErrorKind::Refused);
    let size: usize = e
        .detail()
        .strip_prefix("delivery: the reply is ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in {e}"));
    assert!(size > 4096, "{e}");
    snapshot_settings().bind(|| {
        insta::assert_snapshot!("data_path_oversized_reply", e.detail());
    });
    stop_daemon(&mut daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_request_whose_connection_closes_is_rejected_not_replayed() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = start_daemon(&mesh).await;
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
