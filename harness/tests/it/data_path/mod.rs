//! The durable data path end to end on a real broker with the real daemon: fan-out writer,
//! trusted reader, membership registry and the agent client. Every test checks broker
//! state from the test side (stream contents, consumer state, rows), not only what the agent
//! surfaced.

mod bounds;
mod cache;
mod catchup_retry;
mod crash;
mod join_atomic;
mod join_race;
mod log_hygiene;
mod pull;
mod quiesce;
mod rail;
mod refusal;
mod retention;

use std::time::Duration;

use cotal_delivery::agent::Backstop;
use delivery_harness::rig::agent::{surface_until, texts};

use crate::support::data_path::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_path_delivers_with_no_daemon_running() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    // No daemon: the join is live, the backstop unestablished, loudly.
    let mut joined = bob
        .durable_join_within("general", Duration::from_secs(2))
        .await
        .unwrap();
    let Backstop::Unestablished { reason } = &joined.backstop else {
        panic!("joined durable with no daemon: {:?}", joined.backstop);
    };
    assert!(reason.contains("no delivery daemon"), "{reason}");
    let m = alice.message("general", "live-hello", None);
    alice.post("general", &m).await.unwrap();
    let got = tokio::time::timeout(SURFACE_BOUND, futures::StreamExt::next(&mut joined.live))
        .await
        .unwrap()
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&got.payload).unwrap();
    assert_eq!(body["parts"][0]["text"], "live-hello");
    // The binding still happens, with the warning naming durable, space and condition.
    let delivery = bob.bind_delivery().await.unwrap();
    assert!(delivery.durable().starts_with("dlv_local-bob-"));
    // No member row exists: nothing was asserted without the daemon.
    assert!(
        member_row(&insp, "general", &bob_m.principal, &bob_m.lifecycle_uid)
            .await
            .is_none()
    );
    snapshot!(
        "live_path_without_daemon_warnings",
        bob.warnings().join("\n")
    );
}

/// The other branch of the bind's warning: a daemon holds the lease but is still binding (the
/// proxy holds its last binding, the admin rail's SUB, so the broker shows its row claimed
/// `ready:false`). An agent binding its durable then is warned naming the durable, the space and
/// that condition (the holder), and the bind still happens; the durable then delivers once the
/// daemon is up. Mutation seen failing: `Agent::lease_condition` counting any present row as a
/// ready lease (no warning is recorded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_while_the_lease_is_not_ready_warns_naming_durable_space_and_holder() {
    use cotal_delivery::wire::CtlService;
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    let proxy = delivery_harness::TcpProxy::start(mesh.broker.port())
        .await
        .unwrap();
    let admin_sub = format!("SUB {} ", insp.names.ctl_serve(CtlService::DeliveryAdmin));
    proxy.hold_from(admin_sub.as_bytes());
    let mut daemon =
        delivery_harness::rig::daemon::DaemonSpec::deliver(mesh.space().as_str(), mesh.root())
            .server(&proxy.url())
            .env("COTAL_DELIVERY_NAK_DELAY_MS", NAK_DELAY_MS)
            .env("COTAL_DELIVERY_ACK_WAIT_MS", ACK_WAIT_MS)
            .spawn()
            .unwrap();
    proxy.wait_held(&admin_sub, UP_BOUND).await.unwrap();
    let row = insp.lease().await.unwrap().expect("claimed");
    assert!(!row.info.ready, "{row:?}");
    let mut delivery = bob.bind_delivery().await.unwrap();
    assert!(delivery.durable().starts_with("dlv_local-bob-"));
    let warnings = bob.warnings().join("\n");
    assert!(warnings.contains(&row.info.holder), "{warnings}");
    proxy.release();
    daemon
        .wait_for_line("delivery daemon up", UP_BOUND)
        .await
        .unwrap();
    // The durable bound while not ready is the one the daemon now delivers through.
    bob.durable_join("general").await.unwrap();
    let m = alice.message("general", "after-ready", None);
    alice.post("general", &m).await.unwrap();
    let frames = surface_until(&mut delivery, SURFACE_BOUND, |f| !f.is_empty()).await;
    assert_eq!(texts(&frames), ["after-ready"]);
    assert!(
        member_row(&insp, "general", &bob_m.principal, &bob_m.lifecycle_uid)
            .await
            .is_some()
    );
    snapshot!("bind_while_lease_not_ready_warning", warnings);
    stop_daemon(&mut daemon).await;
}

/// The durables' `ack_wait` of the start-up test below: long, so a post left to it stands out.
const LONG_ACK_WAIT_MS: &str = "20000";
/// What that test allows from the daemon's spawn to the last copy: start-up, then one fan-out
/// of the waiting posts. Half the `ack_wait` above.
const PROMPT_BOUND: Duration = Duration::from_secs(10);

/// Posts waiting on the broker when a daemon starts serving are fanned out at once, each handed
/// to the fan-out writer exactly once. Its pull loop pulls only once `arm` has opened the serving
/// gate (`plane/pump.rs`); a loop that pulled earlier got the waiting posts behind the closed gate,
/// and they waited out an `ack_wait` (a new holder's first posts in the standby suite's kill case
/// came 37 s after the kill). The `ack_wait` is 20 s here, so a post left to it stands out.
///
/// bob joins durably and goes offline, the daemon stops (releasing its lease), 50 posts are made
/// while nobody serves, and a daemon starts. Checked on the broker: all 50 copies in bob's inbox
/// within `PROMPT_BOUND` of the spawn, and the `fanout` durable's consumer sequence advanced by
/// exactly 50 for the 50 stream messages (no post delivered twice).
///
/// Mutations seen failing: the pull loop's wait for the open gate removed (the posts pulled in
/// `arm` are handed back with a nak and redelivered: the consumer sequence advances past 50);
/// that and the hand-back (`hand_back` doing nothing) both removed (the copies come one
/// `ack_wait` later: the bound fails). The hand-back alone removed is not caught here: with the
/// wait in place nothing is pulled behind a closed gate at start-up; it guards the window
/// between a quiesce closing the gate and the loop stopping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_waiting_when_a_daemon_starts_serving_are_fanned_out_at_once_and_once() {
    const POSTS: u64 = 50;
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut first = crate::support::start(daemon_spec(&mesh)).await;
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    bob.durable_join("general").await.unwrap();
    drop(bob); // offline
    stop_daemon(&mut first).await;
    let chat = insp.names.chat_stream();
    let before = consumer(&insp, &chat, "fanout").await;

    burst(&insp, &alice, "general", POSTS).await;
    let (p, u) = (bob_m.principal.clone(), bob_m.lifecycle_uid.clone());
    assert_eq!(inbox_count(&insp, &p, &u).await, 0, "nobody serves yet");

    let spawned = tokio::time::Instant::now();
    let mut daemon = daemon_spec(&mesh)
        .env("COTAL_DELIVERY_ACK_WAIT_MS", LONG_ACK_WAIT_MS)
        .spawn()
        .expect("spawn daemon");
    eventually("every waiting post fanned out", PROMPT_BOUND, || async {
        inbox_count(&insp, &p, &u).await == POSTS
    })
    .await;
    let took = spawned.elapsed();
    drained(&insp, SURFACE_BOUND).await;
    let after = consumer(&insp, &chat, "fanout").await;
    assert_eq!(
        after.delivered.stream_sequence - before.delivered.stream_sequence,
        POSTS
    );
    assert_eq!(
        after.delivered.consumer_sequence - before.delivered.consumer_sequence,
        POSTS,
        "each waiting post handed to the writer once, none redelivered: {after:?}"
    );
    assert_eq!(
        inbox_count(&insp, &p, &u).await,
        POSTS,
        "fanned out once each"
    );
    eprintln!(
        "MEASURED start-up fan-out: {POSTS} waiting posts in bob's inbox {} ms after the spawn (ack_wait {LONG_ACK_WAIT_MS} ms)",
        took.as_millis()
    );
    stop_daemon(&mut daemon).await;
}
