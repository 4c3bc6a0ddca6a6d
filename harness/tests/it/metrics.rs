//! Prometheus metrics of the real daemon, scraped over HTTP: absent without `--metrics-addr`
//! (no listening socket at all), fan-out lag rising while the daemon is frozen with posts
//! arriving and falling back to zero, the counters matching the posts sent, and one endpoint
//! for every lane of a multi-space host. Every figure is cross-checked against the broker.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cotal_delivery::provision::Manifest;
use delivery_harness::rig::agent;
use delivery_harness::rig::daemon::DaemonSpec;

use crate::support::data_path::*;

const SCRAPE_BOUND: Duration = Duration::from_secs(5);

/// A free loopback port (bound, then released for the daemon to take).
pub(crate) fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

pub(crate) async fn scrape(port: u16) -> String {
    let r = delivery_harness::rig::http::get(port, "/metrics", SCRAPE_BOUND)
        .await
        .expect("scrape");
    assert_eq!(r.status, 200);
    String::from_utf8(r.body).expect("utf-8")
}

/// Scrapes until `ok` holds (a refused connection counts as not yet), within `UP_BOUND`.
async fn scrape_until(port: u16, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + UP_BOUND;
    loop {
        let text = match delivery_harness::rig::http::get(port, "/metrics", SCRAPE_BOUND).await {
            Ok(r) if r.status == 200 => String::from_utf8(r.body).expect("utf-8"),
            _ => String::new(),
        };
        if ok(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of the sample `series` (name with its labels), if present.
pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

fn value(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or(0.0)
}

/// Inodes of the TCP sockets in LISTEN state on this host (`/proc/net/tcp{,6}`).
fn listening_inodes() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for l in text.lines().skip(1) {
            let cols: Vec<&str> = l.split_whitespace().collect();
            if cols.len() > 9 && cols[3] == "0A" {
                out.insert(cols[9].to_string());
            }
        }
    }
    out
}

/// How many listening TCP sockets process `pid` holds (its fds matched against LISTEN inodes).
fn listening_sockets_of(pid: u32) -> usize {
    let listening = listening_inodes();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|t| {
            let t = t.to_string_lossy().to_string();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .filter(|inode| listening.contains(inode))
        .count()
}

/// `spec` with its metrics endpoint on `port`, sampled every 100 ms.
fn served(spec: DaemonSpec, port: u16) -> DaemonSpec {
    spec.arg("--metrics-addr")
        .arg(format!("127.0.0.1:{port}"))
        .env("COTAL_DELIVERY_METRICS_SAMPLE_MS", "100")
}

/// Without the flag the daemon opens no listening socket (the port is refused); with it the
/// same port answers `/metrics` and the daemon holds exactly that one, with the lease,
/// connection and credential gauges and the renewals counted. Mutations applied and seen caught:
/// `metrics_endpoint` binding `127.0.0.1:0` when no address is given (the process then holds a
/// listening socket); the keeper not counting renewals (two never reached).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_is_absent_without_the_flag() {
    // A 4 s lease TTL: renewals every 2 s.
    let mesh = delivery_harness::rig::mesh::Mesh::demo_builder()
        .unwrap()
        .lease_ttl(Duration::from_secs(4))
        .start()
        .await
        .unwrap();
    let port = free_port();
    let mut plain = crate::support::start(daemon_spec(&mesh)).await;
    assert_eq!(listening_sockets_of(plain.pid()), 0);
    let refused = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
    assert_eq!(
        refused.map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    stop_daemon(&mut plain).await;

    let mut served = crate::support::start(served(daemon_spec(&mesh), port)).await;
    assert_eq!(listening_sockets_of(served.pid()), 1);
    let text = scrape_until(port, "the lease gauge sampled", |t| {
        sample(t, "cotal_delivery_lease_held{space=\"demo\"}") == Some(1.0)
    })
    .await;
    assert_eq!(
        sample(&text, "cotal_delivery_broker_connected{space=\"demo\"}"),
        Some(1.0)
    );
    let expiry = sample(
        &text,
        "cotal_delivery_credential_expiry_seconds{space=\"demo\"}",
    )
    .expect("the credential has an exp");
    assert!(expiry > 0.0, "{text}");
    // Renewals the broker acknowledged are counted (the lease row's revision moves with them).
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let rev0 = insp.lease().await.unwrap().expect("lease row").revision;
    let text = scrape_until(port, "two lease renewals", |t| {
        value(t, "cotal_delivery_lease_renewals_total{space=\"demo\"}") >= 2.0
    })
    .await;
    let renewals = value(&text, "cotal_delivery_lease_renewals_total{space=\"demo\"}");
    let rev1 = insp.lease().await.unwrap().expect("lease row").revision;
    assert!(
        rev1 > rev0,
        "the broker saw the renewals ({rev0} -> {rev1}, {renewals})"
    );
    // Anything but GET /metrics is not found.
    let other = delivery_harness::rig::http::get(port, "/", SCRAPE_BOUND)
        .await
        .unwrap();
    assert_eq!(other.status, 404);
    stop_daemon(&mut served).await;
}

/// Without the flag nothing is sampled: the daemon makes none of the sampler's broker reads,
/// which nobody could read the gauges of. Seen through a proxy that delays the replies to a
/// request only the sampler makes (`STREAM.INFO` of `DLV_<s>`): none in 3 s at a 100 ms sample
/// period, while the same daemon started with the flag makes one at once.
/// Mutation seen failing: the sampler spawned whether an endpoint serves or not
/// (`is_served()` always true): the unserved daemon's read is kept within the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_nothing_is_sampled_from_the_broker() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let proxy = delivery_harness::TcpProxy::start(mesh.broker.port())
        .await
        .unwrap();
    proxy.delay_replies_to(&format!("$JS.API.STREAM.INFO.{}", insp.names.dlv_stream()));
    let spec = || {
        delivery_harness::rig::daemon::DaemonSpec::deliver(mesh.space().as_str(), mesh.root())
            .server(&proxy.url())
            .env("COTAL_DELIVERY_METRICS_SAMPLE_MS", "100")
    };
    let mut unserved = crate::support::start(spec()).await;
    // An observation window of thirty sample periods.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        proxy.delayed_count(),
        0,
        "a daemon without --metrics-addr read the DLV stream's info"
    );
    stop_daemon(&mut unserved).await;
    let port = free_port();
    let mut served = crate::support::start(
        spec()
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{port}")),
    )
    .await;
    proxy
        .wait_delayed(1, Duration::from_secs(5))
        .await
        .expect("the served daemon samples the DLV stream");
    proxy.release_delayed();
    stop_daemon(&mut served).await;
}

/// Posts the fan-out writer has not settled on the broker show as fan-out lag, the lag falls
/// back to 0 once they are, and the counters match what was sent: `posts_copied` and
/// `handed_off` grow by posts x members, as the broker's INBOX and DLV stores do. The daemon
/// dials through a proxy that holds the fan-out durable's acks while the posts are made (every
/// other frame flows, the sampler's reads included), so the lag is on the broker until the
/// sampler has seen it; a frozen daemon (SIGSTOP) used to stand for that, and on a thaw could
/// fan out every post before its sampler's next read (CI of ad9488f: lag never above 0). The
/// durables' ack wait is 30 s here, so no held ack is redelivered. Mutations applied and seen
/// caught: `posts_copied(stored.len())` replaced by `posts_copied(1)` (N instead of 2N); the
/// sampler's lag computed as `floor - last` saturating (lag never above 0); the sampler not
/// reading the caches' totals (no `cache_fences_total` series); `rail_request` counting every
/// request as refused (durableJoin refusals 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_lag_rises_and_falls_and_the_counters_match_the_posts() {
    const POSTS: u64 = 200;
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let port = free_port();
    let proxy = delivery_harness::TcpProxy::start(mesh.broker.port())
        .await
        .unwrap();
    let spec = DaemonSpec::deliver(mesh.space().as_str(), mesh.root())
        .server(&proxy.url())
        .env("COTAL_DELIVERY_NAK_DELAY_MS", NAK_DELAY_MS)
        .env("COTAL_DELIVERY_ACK_WAIT_MS", "30000");
    let mut daemon = crate::support::start(served(spec, port)).await;
    let (alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    let (bob, bob_m) = agent::spawn(&mesh, &insp, "bob", &["general"])
        .await
        .unwrap();
    let (carol, carol_m) = agent::spawn(&mesh, &insp, "carol", &["general"])
        .await
        .unwrap();
    let g = match bob.durable_join("general").await.unwrap().backstop {
        cotal_delivery::agent::Backstop::Durable { generation } => generation,
        other => panic!("{other:?}"),
    };
    carol.durable_join("general").await.unwrap();
    // A stale leave is refused: rail requests and refusals by verb.
    bob.durable_leave("general", g + 7).await.unwrap_err();
    let rails = scrape(port).await;
    for (series, want) in [
        (
            "cotal_delivery_rail_requests_total{space=\"demo\",verb=\"durableJoin\"}",
            2.0,
        ),
        (
            "cotal_delivery_rail_refusals_total{space=\"demo\",verb=\"durableJoin\"}",
            0.0,
        ),
        (
            "cotal_delivery_rail_requests_total{space=\"demo\",verb=\"durableLeave\"}",
            1.0,
        ),
        (
            "cotal_delivery_rail_refusals_total{space=\"demo\",verb=\"durableLeave\"}",
            1.0,
        ),
    ] {
        assert_eq!(value(&rails, series), want, "{series}:\n{rails}");
    }
    drained(&insp, SURFACE_BOUND).await;
    let before = scrape(port).await;
    let copied0 = value(&before, "cotal_delivery_posts_copied_total{space=\"demo\"}");
    let handed0 = value(&before, "cotal_delivery_handed_off_total{space=\"demo\"}");

    const LAG: &str = "cotal_delivery_fanout_lag{space=\"demo\"}";
    proxy.delay_publishes_to(&format!(
        "$JS.ACK.{}.{}.>",
        insp.names.chat_stream(),
        cotal_delivery::wire::FANOUT_DURABLE
    ));
    for i in 0..POSTS {
        let m = alice.message("general", &format!("lag-{i}"), None);
        alice.post("general", &m).await.unwrap();
    }
    let held = scrape_until(port, "fan-out lag above 0 while its acks are held", |t| {
        value(t, LAG) > 0.0
    })
    .await;
    assert!(proxy.delayed_count() > 0, "no ack was held");
    proxy.release_delayed();
    let t = Instant::now();
    let mut max_lag = value(&held, LAG);
    let mut last;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        last = scrape(port).await;
        let lag = value(&last, LAG);
        max_lag = max_lag.max(lag);
        let copied = value(&last, "cotal_delivery_posts_copied_total{space=\"demo\"}") - copied0;
        let handed = value(&last, "cotal_delivery_handed_off_total{space=\"demo\"}") - handed0;
        // The lag was above 0 before the release (`held`).
        if lag == 0.0 && copied >= (2 * POSTS) as f64 && handed >= (2 * POSTS) as f64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lag {lag} (max {max_lag}), copied {copied}, handed off {handed}:\n{last}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "MEASURED fan-out lag with {POSTS} posts' acks held: max {max_lag}, back to 0 in {} ms after the release",
        t.elapsed().as_millis()
    );
    assert!(max_lag <= POSTS as f64, "{max_lag}");
    // Exactly posts x members, as the broker holds them.
    assert_eq!(
        value(&last, "cotal_delivery_posts_copied_total{space=\"demo\"}") - copied0,
        (2 * POSTS) as f64
    );
    assert_eq!(
        value(&last, "cotal_delivery_handed_off_total{space=\"demo\"}") - handed0,
        (2 * POSTS) as f64
    );
    drained(&insp, SURFACE_BOUND).await;
    for m in [&bob_m, &carol_m] {
        assert!(dlv_count(&insp, &m.principal, &m.lifecycle_uid).await >= POSTS);
    }
    let f = consumer(&insp, &insp.names.chat_stream(), "fanout").await;
    assert_eq!(f.num_pending + f.num_ack_pending as u64, 0);
    assert_eq!(
        value(
            &last,
            "cotal_delivery_give_ups_total{space=\"demo\",reason=\"unknown_owner\"}"
        ),
        0.0
    );
    // The reader decided every entry from a fenced ACL cache.
    let fences = sample(
        &last,
        "cotal_delivery_cache_fences_total{space=\"demo\",cache=\"acl\"}",
    )
    .expect("the acl cache's series");
    assert!(fences > 0.0, "{last}");
    stop_daemon(&mut daemon).await;
}

/// `deliver --spaces --metrics-addr`: one endpoint, one series set per lane (label `space`).
/// Mutation applied and seen caught: the lane handle made with `for_space("")` (the lanes'
/// series merge under one empty label).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_space_host_serves_every_lane_on_one_endpoint() {
    let mesh = delivery_harness::rig::mesh::Mesh::builder()
        .space("alpha")
        .unwrap()
        .space("beta")
        .unwrap()
        .start()
        .await
        .unwrap();
    Manifest {
        spaces: mesh.spaces().to_vec(),
    }
    .write(mesh.root())
    .unwrap();
    let port = free_port();
    let mut host = mesh
        .host(mesh.root())
        .arg("--metrics-addr")
        .arg(format!("127.0.0.1:{port}"))
        .env("COTAL_DELIVERY_METRICS_SAMPLE_MS", "100")
        .spawn()
        .expect("spawn");
    // Each lane's lease gauge and lag series, under its own label, on the one endpoint.
    let series = |space: &str| {
        [
            format!("cotal_delivery_lease_held{{space=\"{space}\"}}"),
            format!("cotal_delivery_fanout_lag{{space=\"{space}\"}}"),
        ]
    };
    scrape_until(port, "both lanes serve, sampled", |t| {
        ["alpha", "beta"].iter().all(|s| {
            let [held, lag] = series(s);
            sample(t, &held) == Some(1.0) && sample(t, &lag).is_some()
        })
    })
    .await;
    assert_eq!(listening_sockets_of(host.pid()), 1);
    host.terminate().unwrap();
    host.wait_exit(Duration::from_secs(20)).await.expect("exit");
}

/// A member who never surfaces is handed off more frames than `DLV_<s>`'s per-subject retention
/// (1000, discard old) keeps: the DLV discards gauge shows exactly what the broker removed
/// (`POSTS - 1000` when the reader kept up; fewer when the burst outran it by more than the
/// INBOX's own retention, the same 1000 per subject).
/// Mutation applied and seen caught: `removed` returning the frames held instead of the frames
/// removed (1000 instead of 100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlv_retention_discards_are_exported() {
    const POSTS: u64 = 1100;
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let port = free_port();
    let mut daemon = crate::support::start(served(daemon_spec(&mesh), port)).await;
    let (alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    let (bob, bob_m) = agent::spawn(&mesh, &insp, "bob", &["general"])
        .await
        .unwrap();
    bob.durable_join("general").await.unwrap();
    burst(&insp, &alice, "general", POSTS).await;
    drained(&insp, SURFACE_BOUND * 6).await;
    // The broker's figure: every frame took a sequence; DLV holds at most 1000 of bob's.
    let dlv = insp
        .js
        .get_stream(insp.names.dlv_stream())
        .await
        .unwrap()
        .cached_info()
        .state
        .clone();
    let removed = dlv.last_sequence - dlv.messages;
    assert_eq!(
        dlv_count(&insp, &bob_m.principal, &bob_m.lifecycle_uid).await,
        1000
    );
    // The burst may outrun the reader by more than INBOX_'s own retention (also 1000 per
    // subject): copies it discarded unread never became frames, so the DLV may have removed
    // fewer than POSTS - 1000. Whatever the broker removed, the gauge must show that figure.
    assert!(
        removed > 0 && removed <= POSTS - 1000,
        "the DLV's retention removed frames: {dlv:?}"
    );
    let series = "cotal_delivery_dlv_discarded{space=\"demo\"}";
    let text = scrape_until(port, "the DLV discards sampled", |t| {
        sample(t, series) == Some(removed as f64)
    })
    .await;
    assert_eq!(sample(&text, series), Some(removed as f64));
    stop_daemon(&mut daemon).await;
}

/// The resident connection cut twice through a proxy: the connection gauge and the reconnect
/// counter follow each outage, and the log says `reconnecting` / `restored` once each, the
/// second outage only counted and summarised at the close (`… (repeated 1 time …)`).
/// Mutations applied and seen caught: the sampler never counting a reconnect (the count stays
/// 0); the health watchdog writing `reconnecting` with `journal.line` (two such lines). Tried
/// and not caught, so not claimed: counting every `Connected` (the sampler subscribes after the
/// first connect, so the guard is only defensive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_are_counted_and_their_lines_aggregated() {
    use delivery_harness::rig::proxy::TcpProxy;
    const LOST: &str = "broker connection unavailable, reconnecting";
    const RESTORED: &str = "broker connection restored";
    let mesh = mesh().await;
    let proxy = TcpProxy::start(mesh.broker.port()).await.expect("proxy");
    let port = free_port();
    let mut d = crate::support::start(
        delivery_harness::rig::daemon::DaemonSpec::deliver(mesh.space().as_str(), mesh.root())
            .server(&proxy.url())
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{port}"))
            .env("COTAL_DELIVERY_METRICS_SAMPLE_MS", "100"),
    )
    .await;
    let connected = "cotal_delivery_broker_connected{space=\"demo\"}";
    let reconnects = "cotal_delivery_reconnects_total{space=\"demo\"}";
    scrape_until(port, "connected", |t| sample(t, connected) == Some(1.0)).await;
    for outage in 1..=2u32 {
        proxy.blackhole_new();
        proxy.cut_established();
        scrape_until(port, "the drop seen", |t| sample(t, connected) == Some(0.0)).await;
        proxy.heal();
        scrape_until(port, "the reconnect counted", |t| {
            sample(t, connected) == Some(1.0) && value(t, reconnects) == f64::from(outage)
        })
        .await;
    }
    let count = |needle: &str| d.lines().iter().filter(|l| l.contains(needle)).count();
    assert_eq!((count(LOST), count(RESTORED)), (1, 1), "{}", d.transcript());
    d.terminate().unwrap();
    d.wait_exit(Duration::from_secs(15)).await.expect("exit");
    let summaries: Vec<String> = d
        .lines()
        .into_iter()
        .filter(|l| l.contains("(repeated 1 time in the last "))
        .collect();
    assert_eq!(summaries.len(), 2, "{}", d.transcript());
    assert!(summaries
        .iter()
        .any(|l| l.starts_with(&format!("! delivery: {LOST} (space demo)"))));
    assert!(summaries
        .iter()
        .any(|l| l.starts_with(&format!("✓ delivery: {RESTORED} (space demo)"))));
}
