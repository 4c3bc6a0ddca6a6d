//! Posts racing a durable join: a post is a member's when its CHAT sequence sits above the join
//! cursor (and at or below the leave cursor). The cursor is read before the member row is
//! written, so a post captured in between may be routed by the fan-out writer before the row is
//! visible; the join's activation catch-up must copy it. Alice posts a continuous burst while
//! bob joins and leaves repeatedly; every post inside each of bob's intervals must be in his
//! backstop, and none outside them, checked on the broker against the cursors the daemon
//! recorded. The burst is paced to stay inside CHAT's per-subject retention.

mod data_path_support;

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use cotal_delivery::agent::Backstop;
use futures::StreamExt;

use data_path_support::*;

/// Join/leave cycles racing the burst, and the most posts the burst may send (it stops once
/// the cycles are done).
const CYCLES: usize = 20;
const MAX_POSTS: usize = 20_000;
/// How far the burst may run ahead of the fan-out writer.
const MAX_LAG: u64 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_post_above_the_join_cursor_reaches_a_member_who_joined_during_a_burst() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = start_daemon(&mesh).await;
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;

    let cycling = std::sync::atomic::AtomicBool::new(true);
    let burst = async {
        let mut seqs = Vec::new();
        for i in 0..MAX_POSTS {
            if !cycling.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            let m = alice.message("general", &format!("burst-{i}"), None);
            let seq = alice.post("general", &m).await.unwrap();
            seqs.push(seq);
            // Stay well inside CHAT's per-subject retention (1000): a post the broker discards
            // before the fan-out writer reads it is outside the guarantee, not this test's subject.
            if i % 50 == 49 {
                eventually("the fan-out writer keeps up", SURFACE_BOUND, || async {
                    let f = consumer(&insp, &insp.names.chat_stream(), "fanout").await;
                    f.ack_floor.stream_sequence + MAX_LAG >= seq
                })
                .await;
            }
        }
        seqs
    };
    let cycles = async {
        // (generation, join cursor, leave cursor)
        let mut intervals = Vec::new();
        for _ in 0..CYCLES {
            let joined = bob.durable_join("general").await.unwrap();
            let Backstop::Durable { generation } = joined.backstop else {
                panic!("joined live only: {:?}", joined.backstop);
            };
            let row = member_row(&insp, "general", &bob_m.principal, &bob_m.lifecycle_uid)
                .await
                .expect("member row");
            let join_cursor = row["joinCursor"].as_u64().expect("joinCursor");
            bob.durable_leave("general", generation).await.unwrap();
            let row = member_row(&insp, "general", &bob_m.principal, &bob_m.lifecycle_uid)
                .await
                .expect("tombstone");
            let leave_cursor = row["leaveCursor"].as_u64().expect("leaveCursor");
            intervals.push((generation, join_cursor, leave_cursor));
            // The next join rewrites the row; let the fan-out writer pass this interval first
            // (a rejoin takes a new cursor; the old interval is not re-read afterwards).
            eventually(
                "the fan-out writer acked the interval",
                SURFACE_BOUND,
                || async {
                    let f = consumer(&insp, &insp.names.chat_stream(), "fanout").await;
                    f.ack_floor.stream_sequence >= leave_cursor
                },
            )
            .await;
        }
        cycling.store(false, std::sync::atomic::Ordering::SeqCst);
        intervals
    };
    let (posts, intervals) = tokio::join!(burst, cycles);

    // Which posts each interval owes bob.
    let mut owed = BTreeSet::new();
    for (generation, join, leave) in &intervals {
        for seq in posts.iter().filter(|s| **s > *join && **s <= *leave) {
            owed.insert((*generation, *seq));
        }
    }
    assert!(
        !owed.is_empty(),
        "the burst overlapped the joins: {intervals:?}"
    );

    // What bob's backstop holds, read from INBOX on the broker once the fan-out settled.
    eventually("the fan-out writer drained", SURFACE_BOUND, || async {
        let f = consumer(&insp, &insp.names.chat_stream(), "fanout").await;
        f.num_pending == 0 && f.num_ack_pending == 0
    })
    .await;
    let subject = insp
        .names
        .dinbox_subject(&bob_m.principal, &bob_m.lifecycle_uid);
    let stream = insp
        .js
        .get_stream_no_info(insp.names.inbox_stream())
        .await
        .unwrap();
    let reader = stream
        .create_consumer(pull::Config {
            filter_subject: subject.clone(),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::None,
            ..Default::default()
        })
        .await
        .unwrap();
    let stored = count_on(&insp, &insp.names.inbox_stream(), &subject).await as usize;
    let mut held = BTreeSet::new();
    let mut messages = reader.messages().await.unwrap();
    for _ in 0..stored {
        let m = tokio::time::timeout(Duration::from_secs(5), messages.next())
            .await
            .expect("every stored entry is read back")
            .expect("stream open")
            .unwrap();
        let entry: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
        held.insert((
            entry["generation"].as_u64().unwrap(),
            entry["seq"].as_u64().unwrap(),
        ));
    }
    let missing: Vec<_> = owed.difference(&held).collect();
    assert!(
        missing.is_empty(),
        "posts inside bob's intervals without a copy (generation, seq): {missing:?}; intervals {intervals:?}"
    );
    let strays: Vec<_> = held.difference(&owed).collect();
    assert!(
        strays.is_empty(),
        "copies outside bob's intervals: {strays:?}"
    );
    eprintln!(
        "{} posts, {} intervals, {} copies owed and held",
        posts.len(),
        intervals.len(),
        owed.len()
    );
    stop_daemon(&mut daemon).await;
}
