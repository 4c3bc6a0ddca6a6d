//! The fan-out writer's and the trusted reader's pull requests live [`PULL_EXPIRES`], an idle
//! loop asks again when one expires, and a loop whose requests the broker lost (a restart)
//! asks again as soon as its connection is back, not when its last request would have expired
//! (`plane/pull.rs`; docs/performance-history.md, "The drain, fourth look").
//!
//! Judged from the requests themselves: the test subscribes to the two durables'
//! `$JS.API.CONSUMER.MSG.NEXT` subjects in the space's account, so it sees each request the
//! daemon sends, its `expires` and when it came; and from the broker's own count of the
//! requests waiting on each durable (`num_waiting`) after a restart lost them.

use std::time::Duration;

use cotal_delivery::plane::{PULL_EXPIRES, PULL_LOST_MARGIN};
use cotal_delivery::wire::{FANOUT_DURABLE, READER_DURABLE};
use delivery_harness::rig::mesh::Inspector;
use futures::StreamExt;
use tokio::time::Instant;

use crate::support::data_path::*;

/// How long the test waits for one request after the previous one. Far above [`PULL_EXPIRES`]
/// (a loaded host) and far below the 30 s a request lived before.
const NEXT_REQUEST_BOUND: Duration = Duration::from_secs(15);

/// The two pull loops: the fan-out writer's durable on CHAT and the reader's on INBOX.
fn loops(insp: &Inspector) -> [(String, &'static str); 2] {
    [
        (insp.names.chat_stream(), FANOUT_DURABLE),
        (insp.names.inbox_stream(), READER_DURABLE),
    ]
}

/// A subscription to each loop's `$JS.API.CONSUMER.MSG.NEXT` subject, with the subject,
/// in place on the broker before the daemon starts.
async fn watch_requests(insp: &Inspector) -> Vec<(String, async_nats::Subscriber)> {
    let mut subs = Vec::new();
    for (stream, durable) in loops(insp) {
        let subject = format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}");
        let sub = insp.client.subscribe(subject.clone()).await.unwrap();
        subs.push((subject, sub));
    }
    insp.client.flush().await.unwrap();
    subs
}

/// Mutation seen failing: `PULL_EXPIRES` 30 s (async-nats's default, what `consumer.messages()`
/// sends) — the requests carry `"expires":30000000000` and the next one does not come within
/// 15 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pull_loop_asks_again_when_its_short_request_expires() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let subs = watch_requests(&insp).await;
    let mut daemon = crate::support::start(daemon_spec(&mesh)).await;

    // Both loops watched at once: each request is stamped when it arrives.
    let watched = subs.into_iter().map(|(subject, mut sub)| async move {
        // The first request, then the next: nothing is pending, so the next one is sent when
        // the first expires at the broker.
        let mut seen = Vec::new();
        for _ in 0..2 {
            let request = tokio::time::timeout(NEXT_REQUEST_BOUND, sub.next())
                .await
                .unwrap_or_else(|_| {
                    panic!("no pull request on {subject} within {NEXT_REQUEST_BOUND:?} (seen {seen:?})")
                })
                .expect("subscription open");
            let body: serde_json::Value = serde_json::from_slice(&request.payload).unwrap();
            seen.push((Instant::now(), body));
        }
        (subject, seen)
    });
    for (subject, seen) in futures::future::join_all(watched).await {
        for (_, body) in &seen {
            assert_eq!(
                body["expires"].as_u64(),
                Some(PULL_EXPIRES.as_nanos() as u64),
                "{subject}: {body}"
            );
        }
        let gap = seen[1].0 - seen[0].0;
        println!("MEASURED {subject}: the next request {gap:?} after the first");
        // Not sooner than its expiry (it is the expiry that brings it, not a fault).
        assert!(
            gap >= PULL_EXPIRES - Duration::from_millis(500),
            "{subject}: {gap:?}"
        );
    }
    stop_daemon(&mut daemon).await;
}

/// How long after the daemon's "connection restored" line both loops must have a request
/// waiting on the broker again: far below a request's life, past which a loop that did not
/// ask afresh would ask anyway ([`PULL_EXPIRES`] and [`PULL_LOST_MARGIN`] after its last one).
const ASKED_AFTER_RECONNECT_BOUND: Duration = Duration::from_secs(2);
const _: () = assert!(
    ASKED_AFTER_RECONNECT_BOUND.as_millis() * 2
        < PULL_EXPIRES.as_millis() + PULL_LOST_MARGIN.as_millis()
);

/// A broker restart loses the requests it held (they lived in the old process). Each loop's
/// last request is sent the moment before the broker is killed, so a loop that waited for it
/// to expire would ask again only about 6 s later; both durables must have a request waiting
/// within 2 s of the daemon's reconnect line. Mutation seen failing: the reconnect not
/// setting the count back (`owed.forget()` on `ConnEvent::Connected` removed in `Pulls::next`):
/// the fan-out writer's request came back 5.96-5.97 s after the line (two runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_loop_asks_again_as_soon_as_a_restarted_broker_is_back() {
    let mut mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let loops = loops(&insp);
    let mut subs = watch_requests(&insp).await;
    let mut daemon = crate::support::start(daemon_spec(&mesh)).await;
    // Each loop's request the moment it is sent: the broker dies with both just asked.
    for (_, sub) in &mut subs {
        tokio::time::timeout(NEXT_REQUEST_BOUND, sub.next())
            .await
            .expect("a first pull request")
            .expect("subscription open");
    }
    mesh.broker.restart().await.expect("broker restarted");
    daemon
        .wait_for_line(
            "✓ delivery: broker connection restored",
            Duration::from_secs(20),
        )
        .await
        .expect("the daemon reconnects");
    let back = Instant::now();
    // The inspector's own connection does not outlive the broker it dialed.
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    for (stream, durable) in &loops {
        let asked = loop {
            let waiting = match insp.js.get_stream_no_info(stream).await {
                Ok(s) => s.consumer_info(*durable).await.ok().map(|i| i.num_waiting),
                Err(_) => None,
            };
            if waiting.is_some_and(|n| n >= 1) {
                break back.elapsed();
            }
            assert!(
                back.elapsed() < NEXT_REQUEST_BOUND,
                "{durable}: no request waiting on the broker {NEXT_REQUEST_BOUND:?} after the reconnect"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        println!("MEASURED {durable}: a request waiting {asked:?} after the reconnect line");
        assert!(
            asked < ASKED_AFTER_RECONNECT_BOUND,
            "{durable}: the loop asked again only {asked:?} after its connection was back"
        );
    }
    stop_daemon(&mut daemon).await;
}
