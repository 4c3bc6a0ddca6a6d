//! Shared fixture of the data-path tests: a mesh, the real daemon with the documented short
//! windows, and test-side reads of broker state (stream subjects, consumer state, rows).
#![allow(dead_code)]

use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use cotal_delivery::base::{Read, Rows};
use cotal_delivery::wire::{LifecycleUid, Principal, Space, SpaceNames};
use delivery_harness::rig::daemon::{Daemon, DaemonSpec};
use delivery_harness::rig::mesh::{Inspector, Mesh};
use futures::TryStreamExt;

/// Nak delay the tests run the daemon with (`COTAL_DELIVERY_NAK_DELAY_MS`).
pub const NAK_DELAY_MS: &str = "100";
/// Ack wait of the daemon's durables in tests (`COTAL_DELIVERY_ACK_WAIT_MS`).
pub const ACK_WAIT_MS: &str = "2000";
pub const UP_BOUND: Duration = super::BOUND;
pub const SURFACE_BOUND: Duration = Duration::from_secs(10);
/// How long "nothing arrives" is watched.
pub const QUIET: Duration = Duration::from_millis(1500);

/// The mesh's daemon with the data-path tests' short windows; started by
/// [`crate::support::start`].
pub fn daemon_spec(mesh: &Mesh) -> DaemonSpec {
    mesh.deliver(mesh.space())
        .env("COTAL_DELIVERY_NAK_DELAY_MS", NAK_DELAY_MS)
        .env("COTAL_DELIVERY_ACK_WAIT_MS", ACK_WAIT_MS)
}

/// A proxy in front of the mesh's broker and the daemon (test windows) dialing through it, up.
pub async fn start_daemon_via_proxy(mesh: &Mesh) -> (delivery_harness::TcpProxy, Daemon) {
    let proxy = delivery_harness::TcpProxy::start(mesh.broker.port())
        .await
        .expect("proxy");
    let daemon = crate::support::start(
        DaemonSpec::deliver(mesh.space().as_str(), mesh.root())
            .server(&proxy.url())
            .env("COTAL_DELIVERY_NAK_DELAY_MS", NAK_DELAY_MS)
            .env("COTAL_DELIVERY_ACK_WAIT_MS", ACK_WAIT_MS),
    )
    .await;
    // A test that holds the proxy must not hold the lease watch's own subscription with it.
    wait_lease_watch_bound(&mesh.inspector(mesh.space()).await.expect("inspector")).await;
    (proxy, daemon)
}

/// Waits until the daemon's start-up is complete as the broker sees it: its lease watch
/// consumer exists and the broker knows its subscription (`push_bound`). The watch binds after
/// "delivery daemon up" (the start-up order of docs/architecture.md), so a proxy hold armed before
/// this may keep the watch's subscription from the broker, and the watch would then never see a
/// lease change.
pub async fn wait_lease_watch_bound(insp: &delivery_harness::rig::mesh::Inspector) {
    let lease_stream = cotal_delivery::wire::SpaceNames::kv_stream(&insp.names.delivery_bucket());
    eventually("the lease watch bound", UP_BOUND, || async {
        let Ok(stream) = insp.js.get_stream(&lease_stream).await else {
            return false;
        };
        let mut infos = stream.consumers();
        while let Some(Ok(info)) = futures::StreamExt::next(&mut infos).await {
            if info.name.starts_with("leasewatch_") && info.push_bound {
                return true;
            }
        }
        false
    })
    .await;
}

pub async fn stop_daemon(d: &mut Daemon) {
    d.terminate().expect("sigterm");
    d.wait_exit(Duration::from_secs(15)).await.expect("exit");
}

/// The `demo` mesh most tests start from ([`Mesh::demo`]).
pub async fn mesh() -> Mesh {
    Mesh::demo().await.expect("mesh")
}

/// The `demo` mesh with its lease bucket's `max_age` set to `ttl` instead of the default.
pub async fn mesh_with_lease_ttl(ttl: Duration) -> Mesh {
    let builder = Mesh::demo_builder().expect("space");
    builder.lease_ttl(ttl).start().await.expect("mesh")
}

/// The `demo` mesh with its signer saved in the workspace store, where the renewal owner
/// (`remint`, a feed's or writer's renewal) reads it.
pub async fn mesh_with_signer() -> Mesh {
    let mesh = mesh().await;
    mesh.authority
        .save(&mesh.workspace().auth_dir())
        .expect("save signer");
    mesh
}

/// How many messages `stream` holds on exactly `subject` (leader-served stream info).
pub async fn count_on(insp: &Inspector, stream: &str, subject: &str) -> u64 {
    let s = insp.js.get_stream_no_info(stream).await.expect("stream");
    let mut info = s.info_with_subjects(subject).await.expect("info");
    let mut n = 0;
    while let Some((subj, count)) = info.try_next().await.expect("page") {
        if subj == subject {
            n += count as u64;
        }
    }
    n
}

pub async fn inbox_count(insp: &Inspector, p: &Principal, uid: &LifecycleUid) -> u64 {
    count_on(
        insp,
        &insp.names.inbox_stream(),
        &insp.names.dinbox_subject(p, uid),
    )
    .await
}

pub async fn dlv_count(insp: &Inspector, p: &Principal, uid: &LifecycleUid) -> u64 {
    count_on(
        insp,
        &insp.names.dlv_stream(),
        &insp.names.dlv_subject(p, uid),
    )
    .await
}

/// Consumer state from the broker.
pub async fn consumer(
    insp: &Inspector,
    stream: &str,
    name: &str,
) -> async_nats::jetstream::consumer::Info {
    let s = insp.js.get_stream_no_info(stream).await.expect("stream");
    let c: async_nats::jetstream::consumer::Consumer<pull::Config> =
        s.get_consumer(name).await.expect("consumer");
    c.cached_info().clone()
}

/// Waits (bounded) until `f` holds, polling the broker.
pub async fn eventually<F, Fut>(what: &str, bound: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        if f().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "timed out after {} ms waiting for: {what}",
                bound.as_millis()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A row of a bucket as the broker holds it.
pub async fn row(insp: &Inspector, bucket: &str, key: &str) -> Option<serde_json::Value> {
    let rows = Rows::open(&insp.js, bucket, Duration::from_secs(5))
        .await
        .expect("bucket");
    match rows.read(key).await.expect("read") {
        Read::Present(r) => serde_json::from_slice(&r.value).ok(),
        Read::Absent { .. } => None,
    }
}

pub async fn member_row(
    insp: &Inspector,
    channel: &str,
    p: &Principal,
    uid: &LifecycleUid,
) -> Option<serde_json::Value> {
    row(
        insp,
        &insp.names.members_bucket(),
        &SpaceNames::member_key(channel, p, uid),
    )
    .await
}

/// Writes a channel config row (e.g. `{"deliveryClass":"live"}`).
pub async fn set_channel(insp: &Inspector, channel: &str, config: serde_json::Value) {
    let subject = format!("$KV.{}.{channel}", insp.names.channels_bucket());
    insp.js
        .publish(subject, config.to_string().into())
        .await
        .expect("publish")
        .await
        .expect("stored");
}

/// Sets `max_msg_size` of `stream` (`-1`: no limit). Below a write's size (headers count) the
/// broker refuses that write with its own words, while reads of the stream still work: how a
/// test makes one kind of write fail for real.
pub async fn set_max_msg_size(insp: &Inspector, stream: &str, bytes: i32) {
    let mut s = insp.js.get_stream(stream).await.expect("stream");
    let mut config = s.info().await.expect("stream info").config.clone();
    config.max_message_size = bytes;
    insp.js
        .update_stream(config)
        .await
        .expect("update max_msg_size");
}

/// alice and bob, fresh lifecycles both reading `general`, connected (bob with his material).
pub async fn alice_and_bob(
    mesh: &Mesh,
    insp: &Inspector,
) -> (
    cotal_delivery::agent::Agent,
    (
        cotal_delivery::agent::Agent,
        cotal_delivery::provision::AgentMaterial,
    ),
) {
    let (alice, _) = delivery_harness::rig::agent::spawn(mesh, insp, "alice", &["general"])
        .await
        .expect("alice");
    let bob = delivery_harness::rig::agent::spawn(mesh, insp, "bob", &["general"])
        .await
        .expect("bob");
    (alice, bob)
}

pub fn space(mesh: &Mesh) -> Space {
    mesh.space().clone()
}

/// Every message `stream` holds on exactly `subject`, as JSON, read back on the test side with
/// an ephemeral AckNone consumer (bounded per message).
pub async fn stored_on(insp: &Inspector, stream: &str, subject: &str) -> Vec<serde_json::Value> {
    use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy};
    use futures::StreamExt;
    let expected = count_on(insp, stream, subject).await as usize;
    if expected == 0 {
        return Vec::new();
    }
    let s = insp.js.get_stream_no_info(stream).await.expect("stream");
    let reader = s
        .create_consumer(pull::Config {
            filter_subject: subject.to_string(),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .expect("test-side consumer");
    let mut messages = reader.messages().await.expect("pull");
    let mut out = Vec::with_capacity(expected);
    for _ in 0..expected {
        let m = tokio::time::timeout(Duration::from_secs(5), messages.next())
            .await
            .expect("every stored message is read back")
            .expect("stream open")
            .expect("message");
        out.push(serde_json::from_slice(&m.payload).expect("JSON"));
    }
    out
}

/// Waits (bounded) until the fan-out writer and the trusted reader have nothing pending or
/// unacknowledged, as the broker sees their durables.
pub async fn drained(insp: &Inspector, bound: Duration) {
    eventually("the fan-out writer and reader drained", bound, || async {
        let f = consumer(insp, &insp.names.chat_stream(), "fanout").await;
        let r = consumer(insp, &insp.names.inbox_stream(), "reader").await;
        f.num_pending == 0 && f.num_ack_pending == 0 && r.num_pending == 0 && r.num_ack_pending == 0
    })
    .await;
}

/// `n` posts of `from` on `channel` (`burst-<i>`, each with its id as `Nats-Msg-Id`) published
/// pipelined from the test side, then every broker ack collected: a sender outrunning the
/// fan-out writer.
pub async fn burst(insp: &Inspector, from: &cotal_delivery::agent::Agent, channel: &str, n: u64) {
    let subject = insp.names.chat_subject(from.principal(), channel);
    let mut acks = Vec::new();
    for i in 0..n {
        let m = from.message(channel, &format!("burst-{i}"), None);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", m["id"].as_str().unwrap());
        acks.push(
            insp.js
                .publish_with_headers(subject.clone(), headers, m.to_string().into())
                .await
                .unwrap(),
        );
    }
    for a in acks {
        a.await.unwrap();
    }
}

/// Pauses (`until` = an RFC 3339 time) or resumes (`None`) the daemon's `fanout` durable.
pub async fn pause_fanout(insp: &delivery_harness::rig::mesh::Inspector, until: Option<&str>) {
    pause_durable(insp, &insp.names.chat_stream(), "fanout", until).await;
}

/// Pauses (`until` = an RFC 3339 time) or resumes (`None`) one of the daemon's durables on the
/// broker (`CONSUMER.PAUSE`): while paused the broker hands it nothing, whoever pulls.
pub async fn pause_durable(
    insp: &delivery_harness::rig::mesh::Inspector,
    stream: &str,
    durable: &str,
    until: Option<&str>,
) {
    let body = match until {
        Some(t) => format!(r#"{{"pause_until":"{t}"}}"#),
        None => "{}".to_string(),
    };
    let reply = insp
        .client
        .request(
            format!("$JS.API.CONSUMER.PAUSE.{stream}.{durable}"),
            body.into(),
        )
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(
        answer["paused"],
        until.is_some(),
        "pause/resume of {durable} answered {answer}"
    );
}

// Fenced row caches: the daemon's own `row cache` lines, and its watches paused so a change
// reaches a cache only through its fence (data_path::cache, admin::inventory).

/// The daemon with the cache's info lines on stderr.
pub fn traced_spec(mesh: &Mesh) -> DaemonSpec {
    daemon_spec(mesh).env("RUST_LOG", "cotal_delivery::plane::cache=info")
}

/// How many `row cache <what>` lines name `bucket`.
pub fn cache_lines(d: &Daemon, what: &str, bucket: &str) -> usize {
    let needle = format!("row cache {what}");
    d.lines()
        .iter()
        .filter(|l| l.contains(&needle) && l.contains(bucket))
        .count()
}

/// Waits until the cache of `bucket` has loaded `n` times.
pub async fn loaded(d: &Daemon, bucket: &str, n: usize) {
    let deadline = tokio::time::Instant::now() + UP_BOUND;
    while cache_lines(d, "loaded", bucket) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the {bucket} cache did not load: {:#?}",
            d.lines()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The row-cache watch consumers (`rowcache_<uuid>`) the broker holds on `bucket`'s stream.
pub async fn rowcache_consumers(insp: &Inspector, bucket: &str) -> Vec<String> {
    let stream = insp
        .js
        .get_stream_no_info(format!("KV_{bucket}"))
        .await
        .unwrap();
    let names: Vec<String> = stream.consumer_names().try_collect().await.unwrap();
    names
        .into_iter()
        .filter(|n| n.starts_with("rowcache_"))
        .collect()
}

/// Pauses every row-cache watch consumer of `bucket` on the broker, so changes reach the cache
/// only through its fence. Returns how many were paused (at least one).
pub async fn pause_watch(insp: &Inspector, bucket: &str) -> usize {
    let watches = rowcache_consumers(insp, bucket).await;
    assert!(!watches.is_empty(), "no row-cache watch on {bucket}");
    for name in &watches {
        let reply = insp
            .client
            .request(
                format!("$JS.API.CONSUMER.PAUSE.KV_{bucket}.{name}"),
                r#"{"pause_until":"2099-01-01T00:00:00Z"}"#.into(),
            )
            .await
            .unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
        assert_eq!(answer["paused"], true, "{name} not paused: {answer}");
    }
    watches.len()
}
