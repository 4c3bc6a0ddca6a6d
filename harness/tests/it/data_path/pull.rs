//! The fan-out writer's and the trusted reader's pull requests live [`PULL_EXPIRES`], and an idle
//! loop asks again when one expires: a request the broker never serves holds a loop for that
//! plus async-nats's own 5 s, not for its 30 s default plus 5 s (the backlog drain's 35 s
//! stall, docs/performance.md).
//!
//! Judged from the requests themselves: the test subscribes to the two durables'
//! `$JS.API.CONSUMER.MSG.NEXT` subjects in the space's account, so it sees each request the
//! daemon sends, its `expires` and when it came.

use std::time::Duration;

use cotal_delivery::plane::PULL_EXPIRES;
use cotal_delivery::wire::{FANOUT_DURABLE, READER_DURABLE};
use futures::StreamExt;
use tokio::time::Instant;

use crate::support::data_path::*;

/// How long the test waits for one request after the previous one. Far above [`PULL_EXPIRES`]
/// (a loaded host) and far below the 30 s a request lived before.
const NEXT_REQUEST_BOUND: Duration = Duration::from_secs(15);

/// Mutation seen failing: `PULL_EXPIRES` 30 s (async-nats's default, what `consumer.messages()`
/// sends) — the requests carry `"expires":30000000000` and the next one does not come within
/// 15 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pull_loop_asks_again_when_its_short_request_expires() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let loops = [
        (insp.names.chat_stream(), FANOUT_DURABLE),
        (insp.names.inbox_stream(), READER_DURABLE),
    ];
    let mut subs = Vec::new();
    for (stream, durable) in &loops {
        let subject = format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}");
        subs.push((
            subject.clone(),
            insp.client.subscribe(subject).await.unwrap(),
        ));
    }
    insp.client.flush().await.unwrap();
    let mut daemon = start_daemon(&mesh).await;

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
