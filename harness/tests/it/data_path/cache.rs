//! Fenced row caches on a real broker: the writer and the reader decide from in-memory copies of
//! the KV buckets, and each decision is proved current by a leader-served fence
//! (`STREAM.MSG.GET` past the applied sequence). To show that the *fence*, not the watch, carries
//! the freshness, each test pauses the daemon's watch consumer on the bucket it changes
//! (`$JS.API.CONSUMER.PAUSE`), so the cache cannot have applied the change when it decides.
//! Everything is checked on the broker (INBOX/DLV contents, consumer state) and in the daemon's
//! own log (the cache's `row cache loaded` / `row cache reset` lines, enabled with `RUST_LOG`).

use std::future::IntoFuture;
use std::time::Duration;

use cotal_delivery::provision::set_read_acl;
use cotal_delivery::wire::LifecycleUid;
use delivery_harness::rig::agent::{surface_for, texts};

use crate::support::data_path::*;

/// Mutation seen failing this test: `RowCache::fence` answering "proved" without sending the
/// fence (the ACL cache still holds the wide row; the post is surfaced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_narrowed_while_a_post_is_in_flight_is_not_surfaced() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    let (p, u) = (bob_m.principal.clone(), bob_m.lifecycle_uid.clone());
    let mut daemon = crate::support::start(traced_spec(&mesh)).await;
    let acl = insp.names.acl_bucket();
    loaded(&daemon, &acl, 1).await;
    loaded(&daemon, &insp.names.members_bucket(), 1).await;
    bob.durable_join("general").await.unwrap();

    // The post is captured while the daemon is frozen; the ACL is narrowed while it is in
    // flight, and the watch cannot tell the cache.
    daemon.freeze().unwrap();
    let pid = daemon.pid();
    eventually("the daemon is stopped", SURFACE_BOUND, || async move {
        std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("State:") && l.contains("T (stopped)"))
        })
    })
    .await;
    let m = alice.message("general", "secret", None);
    alice.post("general", &m).await.unwrap();
    // Captured for the writer and not routed: delivered into the frozen daemon's pull, or
    // waiting for its next pull request (either way it is routed only after the thaw, so after
    // the narrowing).
    eventually(
        "the post waits for the frozen writer",
        SURFACE_BOUND,
        || async {
            let f = consumer(&insp, &insp.names.chat_stream(), "fanout").await;
            f.num_ack_pending as u64 + f.num_pending == 1
        },
    )
    .await;
    pause_watch(&insp, &acl).await;
    set_read_acl(&insp.js, &insp.names, &p, &u, vec!["ops".into()])
        .await
        .unwrap();
    daemon.thaw().unwrap();

    eventually("the copy is in INBOX", SURFACE_BOUND, || async {
        inbox_count(&insp, &p, &u).await == 1
    })
    .await;
    drained(&insp, SURFACE_BOUND).await;
    assert_eq!(
        dlv_count(&insp, &p, &u).await,
        0,
        "surfaced past a narrowing: {:#?}",
        daemon.lines()
    );
    let mut delivery = bob.bind_delivery().await.unwrap();
    assert!(surface_for(&mut delivery, QUIET).await.is_empty());
    assert_eq!(
        cache_lines(&daemon, "reset", &acl),
        0,
        "decided from the cache"
    );
    stop_daemon(&mut daemon).await;
}

/// Mutation seen failing this test: `RowCache::fence` answering "proved" without sending the
/// fence (the channel cache still says durable; the plain post is copied to bob).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_write_the_cache_has_not_applied_is_seen_through_the_fence() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    let (p, u) = (bob_m.principal.clone(), bob_m.lifecycle_uid.clone());
    let mut daemon = crate::support::start(traced_spec(&mesh)).await;
    let channels = insp.names.channels_bucket();
    loaded(&daemon, &channels, 1).await;
    loaded(&daemon, &insp.names.members_bucket(), 1).await;
    bob.durable_join("general").await.unwrap();
    let m = alice.message("general", "durable-1", None);
    alice.post("general", &m).await.unwrap();
    eventually("the durable post is copied", SURFACE_BOUND, || async {
        inbox_count(&insp, &p, &u).await == 1
    })
    .await;

    pause_watch(&insp, &channels).await;
    set_channel(
        &insp,
        "general",
        serde_json::json!({"deliveryClass": "live"}),
    )
    .await;
    let m = alice.message("general", "live-plain", None);
    alice.post("general", &m).await.unwrap();
    drained(&insp, SURFACE_BOUND).await;
    assert_eq!(
        inbox_count(&insp, &p, &u).await,
        1,
        "a plain post on a channel made live was copied to a durable member"
    );
    assert_eq!(cache_lines(&daemon, "reset", &channels), 0);
    stop_daemon(&mut daemon).await;
}

/// Mutation seen failing this test: `RowCache::fence` answering "proved" without sending the
/// fence (the member cache, its watch paused and the leave not applicable locally, still holds
/// the open interval; the post after the leave is surfaced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_leave_is_answered_no_later_post_surfaces_even_with_the_cache_behind() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    let (p, u) = (bob_m.principal.clone(), bob_m.lifecycle_uid.clone());
    let mut daemon = crate::support::start(traced_spec(&mesh)).await;
    let members = insp.names.members_bucket();
    loaded(&daemon, &members, 1).await;
    loaded(&daemon, &insp.names.acl_bucket(), 1).await;
    let joined = bob.durable_join("general").await.unwrap();
    let m = alice.message("general", "before", None);
    alice.post("general", &m).await.unwrap();
    eventually(
        "the post before the leave is handed off",
        SURFACE_BOUND,
        || async { dlv_count(&insp, &p, &u).await == 1 },
    )
    .await;

    // The watch is paused and an unrelated row lands first, so the daemon's own leave write is
    // not the next message its cache expects: only the fence can show the leave.
    pause_watch(&insp, &members).await;
    insp.js
        .publish(format!("$KV.{members}.elsewhere/local.zed.x"), "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let cotal_delivery::agent::Backstop::Durable { generation } = joined.backstop else {
        panic!("bob's join is durable");
    };
    bob.durable_leave("general", generation).await.unwrap();
    for i in 0..5 {
        let m = alice.message("general", &format!("after-{i}"), None);
        alice.post("general", &m).await.unwrap();
    }
    drained(&insp, SURFACE_BOUND).await;
    assert_eq!(
        dlv_count(&insp, &p, &u).await,
        1,
        "a post after the leave surfaced"
    );
    let mut delivery = bob.bind_delivery().await.unwrap();
    assert_eq!(
        texts(&surface_for(&mut delivery, QUIET).await),
        vec!["before"]
    );
    assert_eq!(cache_lines(&daemon, "reset", &members), 0);
    stop_daemon(&mut daemon).await;
}

/// Mutation seen failing this test: `audit_verdict` never asking for a reset (the purged
/// channel row stays "live" in the cache, proved by fences that find nothing newer, and no post
/// is ever copied again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_bucket_resets_the_cache_and_decisions_stay_correct() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    let (p, u) = (bob_m.principal.clone(), bob_m.lifecycle_uid.clone());
    set_channel(
        &insp,
        "general",
        serde_json::json!({"deliveryClass": "live"}),
    )
    .await;
    let mut daemon = crate::support::start(traced_spec(&mesh)).await;
    let channels = insp.names.channels_bucket();
    loaded(&daemon, &channels, 1).await;
    bob.durable_join("general").await.unwrap();
    let m = alice.message("general", "while-live", None);
    alice.post("general", &m).await.unwrap();
    drained(&insp, SURFACE_BOUND).await;
    assert_eq!(inbox_count(&insp, &p, &u).await, 0, "live: no durable copy");

    // An operator purges the bucket's stream: no marker reaches the watch or the fence.
    insp.js
        .get_stream_no_info(format!("KV_{channels}"))
        .await
        .unwrap()
        .purge()
        .await
        .unwrap();
    let mut n = 0;
    eventually(
        "a post after the purge is copied (class falls back to durable)",
        Duration::from_secs(15),
        || {
            n += 1;
            let m = alice.message("general", &format!("after-purge-{n}"), None);
            let (alice, insp, p, u) = (&alice, &insp, &p, &u);
            async move {
                alice.post("general", &m).await.unwrap();
                drained(insp, SURFACE_BOUND).await;
                inbox_count(insp, p, u).await > 0
            }
        },
    )
    .await;
    assert!(
        cache_lines(&daemon, "reset", &channels) >= 1,
        "the audit reset the cache: {:?}",
        daemon.lines()
    );
    stop_daemon(&mut daemon).await;
}

/// The `rowcache_` consumers the broker holds on `buckets`' streams.
async fn cache_consumers(
    insp: &delivery_harness::rig::mesh::Inspector,
    buckets: &[String],
) -> Vec<String> {
    let mut out = Vec::new();
    for bucket in buckets {
        out.extend(rowcache_consumers(insp, bucket).await);
    }
    out
}

/// A daemon that stops deletes its row caches' consumers on its way out: right after its exit
/// the broker holds no `rowcache_` consumer on any cached bucket, where an ordered consumer
/// left alone would stay (heartbeated by the broker) for its 30 s inactivity threshold, beside
/// a restarted daemon's own. Mutation seen failing: `RowCache::retire_consumer` returning at
/// once (the four consumers still on the broker after the exit).
#[tokio::test]
async fn a_stopped_daemon_leaves_no_cache_consumer_behind() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = crate::support::start(traced_spec(&mesh)).await;
    let n = &insp.names;
    let buckets = [
        n.acl_bucket(),
        n.members_bucket(),
        n.channels_bucket(),
        n.presence_bucket(),
    ];
    for b in &buckets {
        loaded(&daemon, b, 1).await;
    }
    assert_eq!(
        cache_consumers(&insp, &buckets).await.len(),
        buckets.len(),
        "one consumer per cache while serving"
    );
    stop_daemon(&mut daemon).await;
    assert_eq!(
        cache_consumers(&insp, &buckets).await,
        Vec::<String>::new(),
        "left on the broker by the stopped daemon"
    );
}

/// A daemon restarted in front of work its pull loops have not judged waits for the row caches
/// they decide from before their first pull (`pump::CACHE_LOAD_WAIT`): the copy of a post
/// captured while it was down (the fan-out writer's), and the frame of a copy already in INBOX
/// (the trusted reader's), are stored on the broker only after the member cache, 20,000 rows,
/// logged `row cache loaded`. Judged from the broker's stamps on the copy and the frame against
/// the stamp of the daemon's line. Mutations seen failing: `pump::run` given no caches to wait
/// for in `fanout::bind` (the copy stored 105-132 ms before the load), and in `reader::bind`
/// (the frame stored 179-197 ms before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_daemon_judges_its_first_work_from_its_loaded_member_cache() {
    const FILLER_ROWS: usize = 20_000;
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    let (p, u) = (bob_m.principal.clone(), bob_m.lifecycle_uid.clone());
    let members = insp.names.members_bucket();
    let mut daemon = crate::support::start(traced_spec(&mesh)).await;
    bob.durable_join("general").await.unwrap();
    // A copy the reader has not handed off when the daemon stops: its durable paused.
    pause_reader(&insp, true).await;
    let first = alice.message("general", "copied before the stop", None);
    alice.post("general", &first).await.unwrap();
    eventually("the first copy is in INBOX", SURFACE_BOUND, || async {
        inbox_count(&insp, &p, &u).await == 1
    })
    .await;
    stop_daemon(&mut daemon).await;
    pause_reader(&insp, false).await;
    assert_eq!(
        dlv_count(&insp, &p, &u).await,
        0,
        "handed off before the stop"
    );

    // Rows of other lifecycles the restarted daemon must load before it is proved current,
    // written pipelined (the broker's acks collected in windows).
    let filler = LifecycleUid::generate();
    let mut acks = Vec::new();
    for i in 0..FILLER_ROWS {
        let row = serde_json::json!({
            "channel": "filler", "owner": format!("zz.f{i}"), "lifecycleUid": filler.as_str(),
            "state": "live-confirmed", "joinCursor": 0, "generation": 1,
        });
        let subject = format!("$KV.{members}.filler/zz.f{i}.{filler}");
        acks.push(
            insp.js
                .publish(subject, row.to_string().into())
                .await
                .unwrap(),
        );
        if acks.len() == 1_000 || i + 1 == FILLER_ROWS {
            for ack in futures::future::join_all(acks.drain(..).map(|a| a.into_future())).await {
                ack.unwrap();
            }
        }
    }
    let second = alice.message("general", "posted while the daemon was down", None);
    alice.post("general", &second).await.unwrap();

    let mut daemon = crate::support::start(traced_spec(&mesh)).await;
    eventually("both copies are handed off", SURFACE_BOUND, || async {
        inbox_count(&insp, &p, &u).await == 2 && dlv_count(&insp, &p, &u).await == 2
    })
    .await;
    let stamp_us = |m: async_nats::jetstream::message::StreamMessage| {
        (m.time.unix_timestamp_nanos() / 1_000) as i64
    };
    let inbox = insp.js.get_stream(insp.names.inbox_stream()).await.unwrap();
    let copied_us = stamp_us(
        inbox
            .get_last_raw_message_by_subject(&insp.names.dinbox_subject(&p, &u))
            .await
            .unwrap(),
    );
    let dlv = insp.js.get_stream(insp.names.dlv_stream()).await.unwrap();
    let framed_us = stamp_us(
        dlv.get_first_raw_message_by_subject(&insp.names.dlv_subject(&p, &u), 1)
            .await
            .unwrap(),
    );
    // The line is read from the daemon's stderr a moment after it is written.
    loaded(&daemon, &members, 1).await;
    let lines = daemon.lines();
    let line = lines
        .iter()
        .find(|l| l.contains("row cache loaded") && l.contains(&members))
        .unwrap_or_else(|| panic!("no members load line: {lines:#?}"));
    let loaded_us = line
        .split_whitespace()
        .next()
        .and_then(delivery_harness::rig::connz::rfc3339_unix_us)
        .unwrap_or_else(|| panic!("no stamp on {line:?}"));
    // bob's row and the fillers at least: the load saw every row written before the start.
    let applied: usize = line
        .rsplit("applied=")
        .next()
        .and_then(|a| a.trim().parse().ok())
        .unwrap_or(0);
    assert!(applied > FILLER_ROWS, "loaded before the fillers: {line}");
    assert!(
        copied_us >= loaded_us,
        "the writer's copy was stored {} µs before the member cache loaded ({line})",
        loaded_us - copied_us
    );
    assert!(
        framed_us >= loaded_us,
        "the reader's frame was stored {} µs before the member cache loaded ({line})",
        loaded_us - framed_us
    );
    stop_daemon(&mut daemon).await;
}

/// Pauses (or resumes) the trusted reader's durable on the broker.
async fn pause_reader(insp: &delivery_harness::rig::mesh::Inspector, pause: bool) {
    let body = if pause {
        r#"{"pause_until":"2099-01-01T00:00:00Z"}"#
    } else {
        "{}"
    };
    let reply = insp
        .client
        .request(
            format!(
                "$JS.API.CONSUMER.PAUSE.{}.reader",
                insp.names.inbox_stream()
            ),
            body.into(),
        )
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(answer["paused"], pause, "reader pause {pause}: {answer}");
}
