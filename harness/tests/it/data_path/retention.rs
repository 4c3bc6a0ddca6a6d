//! The edge of the guarantee is visible: durable delivery is at-least-once *within retention*.
//! A sender that outruns the fan-out writer by more than `CHAT_<s>`'s per-subject retention
//! (1000 messages, discard old) loses posts before they are copied; the daemon must say how many
//! instead of leaving a silent gap. Checked on the broker: every post is either copied into the
//! member's backstop or counted by the daemon as discarded, and nothing is counted twice. The
//! writer is held while the burst outruns it (its durable paused on the broker), so the loss
//! happens however fast the writer is.

use cotal_delivery::agent::Backstop;
use delivery_harness::rig::agent;

use crate::support::data_path::*;

/// Posts in the burst: well past the 1000-per-subject retention of `CHAT_<s>`.
const POSTS: u64 = 3000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_discarded_by_retention_before_fan_out_are_reported_and_counted() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = crate::support::start(daemon_spec(&mesh)).await;
    let (alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    let (bob, _) = agent::spawn(&mesh, &insp, "bob", &["general"])
        .await
        .unwrap();
    let joined = bob.durable_join("general").await.unwrap();
    assert!(matches!(joined.backstop, Backstop::Durable { .. }));
    drop(joined);
    drop(bob);

    // The writer is held (its durable paused on the broker) while the burst outruns retention,
    // after its first post, so it has a first delivery to see the gap from: a writer fast
    // enough to keep up with a pipelined burst would otherwise make the loss this test is
    // about not happen at all.
    burst(&insp, &alice, "general", 1).await;
    eventually("the first post copied", SURFACE_BOUND, || async {
        let f = consumer(&insp, &insp.names.chat_stream(), "fanout").await;
        f.ack_floor.stream_sequence == 1
    })
    .await;
    pause_fanout(&insp, Some("2099-01-01T00:00:00Z")).await;
    burst(&insp, &alice, "general", POSTS - 1).await;
    pause_fanout(&insp, None).await;
    eventually("the fan-out writer drained", SURFACE_BOUND * 6, || async {
        let f = consumer(&insp, &insp.names.chat_stream(), "fanout").await;
        f.num_pending == 0 && f.num_ack_pending == 0
    })
    .await;

    // What the daemon said it lost.
    let reported: Vec<u64> = daemon
        .lines()
        .iter()
        .filter(|l| l.contains("gone before it read them"))
        .map(|l| {
            let n = l
                .split("found ")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .and_then(|n| n.parse().ok());
            n.unwrap_or_else(|| panic!("unparsable line: {l}"))
        })
        .collect();
    let discarded: u64 = reported.iter().sum();
    assert!(
        discarded > 0,
        "the burst outran retention, and the daemon said so"
    );
    // Every post was either copied (bob is INBOX's only writer target, so its last sequence is
    // the number of copies ever stored) or reported discarded.
    let mut inbox = insp.js.get_stream(insp.names.inbox_stream()).await.unwrap();
    let copies = inbox.info().await.unwrap().state.last_sequence;
    assert_eq!(
        copies + discarded,
        POSTS,
        "copies {copies} + reported {discarded} (lines {reported:?})"
    );
    eprintln!("{POSTS} posts: {copies} copied, {discarded} reported discarded by retention");
    stop_daemon(&mut daemon).await;
}
