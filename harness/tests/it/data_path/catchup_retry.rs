//! A join's activation catch-up whose first attempt fails for a reason that passes is tried
//! again before the join is answered (docs/data-path.md, "Activation catch-up"): found by
//! `harness simulate --seed 4404 --cluster` (docs/simulation.md), where the catch-up's fetch got
//! a 503 during a node kill's leadership churn, the join answered `durable:false`, its row stood
//! and the post of its window never reached the member.
//!
//! Forced here on one broker with two proxies in a chain (daemon → A → B → broker), each
//! delaying one thing: A the broker's answer to the join's read of the CHAT frontier (the window
//! opens: alice's post is stored and routed by the fan-out writer with no member row for bob),
//! B the daemon's request creating the catch-up consumer (it never reaches the broker, so the
//! first attempt times out for real, as a create does when the stream's leader is gone). B
//! keeps delaying, so a second create request kept at B is the daemon's retry; then B hands
//! both over, the consumer is created, the join answers durable and bob's backstop holds the
//! post of the window.

use std::time::Duration;

use cotal_delivery::agent::Backstop;
use delivery_harness::rig::daemon::DaemonSpec;

use crate::support::data_path::*;

/// Bound on the daemon's first create request timing out and its retry being sent: the
/// JetStream request timeout (5 s) plus the first pause, with room for a loaded host.
const RETRY_SEEN: Duration = Duration::from_secs(14);

/// Mutation seen failing: `activate` answering the first attempt's error whatever it is (no
/// retry: "activation catch-up of local.bob on \"general\" failed: timed out", and no second
/// create at B within 14 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_whose_consumer_create_times_out_is_tried_again_and_the_join_is_durable() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let b = delivery_harness::TcpProxy::start(mesh.broker.port())
        .await
        .expect("proxy B");
    let a = delivery_harness::TcpProxy::start(b.listen_port())
        .await
        .expect("proxy A");
    let mut daemon = crate::support::start(
        DaemonSpec::deliver(mesh.space().as_str(), mesh.root())
            .server(&a.url())
            .env("COTAL_DELIVERY_NAK_DELAY_MS", NAK_DELAY_MS)
            .env("COTAL_DELIVERY_ACK_WAIT_MS", ACK_WAIT_MS),
    )
    .await;
    wait_lease_watch_bound(&insp).await;
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    let before = alice.message("general", "before-join", None);
    alice.post("general", &before).await.unwrap();
    drained(&insp, SURFACE_BOUND).await;

    let chat = insp.names.chat_stream();
    a.delay_replies_to(&format!("$JS.API.STREAM.INFO.{chat}"));
    b.delay_publishes_to(&format!("$JS.API.CONSUMER.CREATE.{chat}.>"));
    let steps = async {
        // The broker answered the join's frontier read; the answer waits at A.
        a.wait_delayed(1, Duration::from_secs(5))
            .await
            .expect("the join's frontier read");
        let racing = alice.message("general", "racing", None);
        alice.post("general", &racing).await.unwrap();
        // The writer routed it with no member row for bob: copied to nobody.
        drained(&insp, SURFACE_BOUND).await;
        assert!(
            member_row(&insp, "general", &bob_m.principal, &bob_m.lifecycle_uid)
                .await
                .is_none(),
            "bob's row was written before the frontier answer arrived"
        );
        assert_eq!(
            inbox_count(&insp, &bob_m.principal, &bob_m.lifecycle_uid).await,
            0
        );
        a.release_delayed();
        // The first create is kept at B and times out at the daemon; the second is its retry.
        b.wait_delayed(1, Duration::from_secs(5))
            .await
            .expect("the catch-up's first consumer create");
        b.wait_delayed(2, RETRY_SEEN).await.unwrap_or_else(|e| {
            panic!("no second create (no retry): {e}\n{}", daemon.transcript())
        });
        b.release_delayed();
    };
    let (joined, ()) = tokio::join!(bob.durable_join("general"), steps);
    let joined = joined.expect("join answered");
    assert!(
        matches!(joined.backstop, Backstop::Durable { generation: 1 }),
        "{:?}\n{}",
        joined.backstop,
        daemon.transcript()
    );
    // The post of the window is in bob's backstop, copied by the catch-up; the one before the
    // join is not.
    let inbox = stored_on(
        &insp,
        &insp.names.inbox_stream(),
        &insp
            .names
            .dinbox_subject(&bob_m.principal, &bob_m.lifecycle_uid),
    )
    .await;
    // An entry carries the message whole: its text is found in the entry's JSON.
    let holds = |text: &str| {
        inbox
            .iter()
            .filter(|e| e.to_string().contains(&format!("\"{text}\"")))
            .count()
    };
    assert_eq!(
        (inbox.len(), holds("racing"), holds("before-join")),
        (1, 1, 0),
        "{inbox:?}"
    );
    let transcript = daemon.transcript();
    assert!(
        transcript.contains("attempt 1:") && transcript.contains("trying again"),
        "{transcript}"
    );
    stop_daemon(&mut daemon).await;
}
