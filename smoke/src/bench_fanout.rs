//! `smoke bench-fanout`: the durable data path next to the raw JetStream pipeline it wraps,
//! like for like, on the same broker in the same run (issue 10, "Must show").
//!
//! Per member count M (M lifecycles joined durably to one channel, offline; one sender):
//!
//! - **daemon**: the real daemon binary runs the path (CHAT → `fanout` → INBOX → `reader` → DLV).
//! - **baseline**: the daemon is stopped and this process runs the same pipeline shape with no
//!   checks: a durable pull consumer on CHAT publishes the M INBOX copies of each post (message
//!   ids), acks the post after every copy's ack; a durable pull consumer on INBOX publishes each
//!   entry's DLV frame (message id), acks the entry after the frame's ack; each stage with at
//!   most [`BASELINE_IN_FLIGHT`] messages in flight, and the copy stage also with at most the
//!   daemon's `MAX_COPIES_IN_FLIGHT` copies unacknowledged (so at most 20 posts at 100 members).
//!
//! Both phases post from the same sender in windows of `--window` posts (the next window starts
//! once every (post, member) pair of the last one is stored in DLV), so the backlog stays inside
//! CHAT's per-subject retention. Every stream is purged between phases. Stored in DLV is seen by
//! a core subscription of this process on `dlv.>`; completeness counts distinct (post, member)
//! pairs. Throughput (median of `--runs`) is posts over first publish → last pair stored.
//! Latency is measured separately at a fixed `--rate` posts/s: publish → DLV stored, per pair.
//! The daemon's peak RSS is its `VmHWM` before each stop (maximum over runs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::HeaderMap;
use cotal_delivery::provision::AgentMaterial;
use cotal_delivery::wire::DELIVERY_FRAME_HEADER;
use cotal_delivery::wire::{dedup_id, Plane3DeliveryFrame, Plane3Entry, Reason};
use delivery_harness::agent;
use delivery_harness::daemon::Daemon;
use delivery_harness::mesh::{Inspector, Mesh};
use futures::StreamExt;
use serde_json::{json, Value};

/// Messages each baseline stage handles at once (its `max_ack_pending` and its semaphore).
pub const BASELINE_IN_FLIGHT: usize = 512;

#[derive(clap::Args)]
pub struct Args {
    /// Member counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100")]
    members: Vec<usize>,
    /// Posts per throughput run (at least 2000 for the figures).
    #[arg(long, default_value_t = 2000)]
    posts: usize,
    /// Throughput runs per member count and side; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Posts the sender may have outstanding (not yet stored in DLV for every member).
    #[arg(long, default_value_t = 500)]
    window: usize,
    /// Fixed posting rate of the latency measurement, posts/s.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    /// Posts of the latency measurement.
    #[arg(long, default_value_t = 400)]
    latency_posts: usize,
    /// Bound on one window (or the latency tail) being stored, in seconds.
    #[arg(long, default_value_t = 300)]
    surface_bound_secs: u64,
    /// Print one JSON object per member count instead of the table.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Args) -> i32 {
    match bench(args).await {
        Ok(complete) if complete => 0,
        Ok(_) => 2,
        Err(e) => {
            eprintln!("bench-fanout: {e}");
            1
        }
    }
}

/// First time each (post id, member subject) pair was seen stored in DLV.
#[derive(Default)]
struct Seen {
    first: HashMap<(String, String), Instant>,
}

type Shared = Arc<Mutex<Seen>>;

/// One member count's figures.
struct Row {
    members: usize,
    daemon_pps: f64,
    baseline_pps: f64,
    daemon_p50: f64,
    daemon_p99: f64,
    baseline_p50: f64,
    baseline_p99: f64,
    rss_mb: f64,
    complete: bool,
    /// The daemon's metrics endpoint over each daemon run.
    scraped: Vec<Scraped>,
}

async fn bench(args: Args) -> Result<bool, String> {
    let mesh = Mesh::builder()
        .space("bench")
        .map_err(|e| e.to_string())?
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let insp = mesh
        .inspector(mesh.space())
        .await
        .map_err(|e| e.to_string())?;
    let seen: Shared = Arc::default();
    let mut sub = insp
        .client
        .subscribe(insp.names.dlv_all())
        .await
        .map_err(|e| e.to_string())?;
    let api = count_api_requests(&insp).await?;
    insp.sync().await.map_err(|e| e.to_string())?;
    {
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let now = Instant::now();
                let Ok(frame) = serde_json::from_slice::<Value>(&m.payload) else {
                    continue;
                };
                let Some(id) = frame["msg"]["id"].as_str() else {
                    continue;
                };
                if let Ok(mut s) = seen.lock() {
                    s.first
                        .entry((id.to_string(), m.subject.to_string()))
                        .or_insert(now);
                }
            }
        });
    }
    if !args.json {
        println!(
            "bench-fanout: nats-server at {}, {} posts x {} runs per member count, window {}, latency at {} posts/s",
            mesh.url(),
            args.posts,
            args.runs,
            args.window,
            args.rate
        );
        println!(
            "{:>7} | {:>10} {:>10} {:>6} | {:>9} {:>9} | {:>9} {:>9} | {:>7} | complete",
            "members",
            "daemon p/s",
            "base p/s",
            "ratio",
            "d p50 ms",
            "d p99 ms",
            "b p50 ms",
            "b p99 ms",
            "RSS MB"
        );
    }
    let bound = Duration::from_secs(args.surface_bound_secs);
    let mut all_complete = true;
    for (round, &m) in args.members.iter().enumerate() {
        let channel = format!("bench{round}");
        let (mut daemon, mut port) = start_daemon(&mesh).await?;
        let mut scraped = Vec::new();
        let (sender, _) = agent::spawn(&mesh, &insp, &format!("sender{round}"), &[&channel])
            .await
            .map_err(|e| e.to_string())?;
        let mut targets = Vec::new();
        for i in 0..m {
            let (a, mat) = agent::spawn(&mesh, &insp, &format!("m{round}_{i}"), &[&channel])
                .await
                .map_err(|e| e.to_string())?;
            a.durable_join(&channel).await.map_err(|e| e.to_string())?;
            targets.push(mat);
        }
        let dlv: Vec<String> = targets
            .iter()
            .map(|t| insp.names.dlv_subject(&t.principal, &t.lifecycle_uid))
            .collect();
        let mut complete = true;
        let (mut daemon_pps, mut baseline_pps) = (Vec::new(), Vec::new());
        let (mut daemon_lat, mut baseline_lat) = ((0.0, 0.0), (0.0, 0.0));
        let mut rss_kb = 0u64;
        for run in 0..args.runs.max(1) {
            if run > 0 {
                (daemon, port) = start_daemon(&mesh).await?;
            }
            let scraper = Scraper::start(port, mesh.space().as_str().to_string());
            let on = On {
                api: &api,
                insp: &insp,
                sender: &sender,
                channel: &channel,
                dlv: &dlv,
                seen: &seen,
                args: &args,
                bound,
            };
            let d = on.phase(&format!("d{round}r{run}"), run == 0).await?;
            let posts = args.posts + if run == 0 { args.latency_posts } else { 0 };
            let got = scraper
                .finish(mesh.space().as_str(), (posts * m) as u64)
                .await;
            if !got.ok() {
                eprintln!(
                    "bench-fanout: {m} members, run {run}: the metrics endpoint disagrees: fan-out lag peak {} end {}, copies counted {} and handed off {} of {}",
                    got.peak_lag, got.end_lag, got.copied, got.handed_off, got.expected
                );
            }
            scraped.push(got);
            daemon_pps.push(d.posts_per_s);
            complete &= d.complete;
            daemon_lat = d.latency.unwrap_or(daemon_lat);
            rss_kb = rss_kb.max(peak_rss_kb(daemon.pid()));
            stop(&mut daemon).await;
            purge(&insp).await?;

            let baseline = Baseline::start(&insp, &channel, &targets).await?;
            let b = on.phase(&format!("b{round}r{run}"), run == 0).await?;
            baseline_pps.push(b.posts_per_s);
            complete &= b.complete;
            baseline_lat = b.latency.unwrap_or(baseline_lat);
            // What bounds the daemon: JetStream API requests per post, counted by the broker.
            eprintln!(
                "bench-fanout: {m} members, run {run}: JetStream API requests per post: daemon {:.1}, baseline {:.1}",
                d.api_requests as f64 / args.posts as f64,
                b.api_requests as f64 / args.posts as f64
            );
            baseline.stop(&insp).await;
            purge(&insp).await?;
        }
        let row = Row {
            members: m,
            daemon_pps: median(&mut daemon_pps),
            baseline_pps: median(&mut baseline_pps),
            daemon_p50: daemon_lat.0,
            daemon_p99: daemon_lat.1,
            baseline_p50: baseline_lat.0,
            baseline_p99: baseline_lat.1,
            rss_mb: rss_kb as f64 / 1024.0,
            complete,
            scraped,
        };
        // A metrics endpoint that disagrees with the broker fails the run like an incomplete one.
        all_complete &= complete && row.scraped.iter().all(Scraped::ok);
        print_row(&row, &args);
    }
    Ok(all_complete)
}

/// Everything one phase needs.
struct On<'a> {
    api: &'a AtomicU64,
    insp: &'a Inspector,
    sender: &'a cotal_delivery::agent::Agent,
    channel: &'a str,
    dlv: &'a [String],
    seen: &'a Shared,
    args: &'a Args,
    bound: Duration,
}

/// One phase (daemon or baseline) of one run.
struct Phase {
    posts_per_s: f64,
    api_requests: u64,
    latency: Option<(f64, f64)>,
    complete: bool,
}

impl On<'_> {
    /// Throughput, then (when asked) latency, with whatever runs the pipeline now.
    async fn phase(&self, tag: &str, with_latency: bool) -> Result<Phase, String> {
        let api0 = self.api.load(Ordering::Relaxed);
        let (posts_per_s, mut complete) = throughput(self, tag).await?;
        let api_requests = self.api.load(Ordering::Relaxed).saturating_sub(api0);
        let latency = if with_latency {
            let (lat, ok) = latency(self, &format!("{tag}l")).await?;
            complete &= ok;
            Some(lat)
        } else {
            None
        };
        Ok(Phase {
            posts_per_s,
            api_requests,
            latency,
            complete,
        })
    }
}

fn print_row(r: &Row, args: &Args) {
    let ratio = r.daemon_pps / r.baseline_pps.max(f64::MIN_POSITIVE);
    if args.json {
        println!(
            "{}",
            json!({
                "members": r.members,
                "posts": args.posts,
                "daemon_posts_per_s": round2(r.daemon_pps),
                "baseline_posts_per_s": round2(r.baseline_pps),
                "ratio": round2(ratio),
                "daemon_p50_ms": round2(r.daemon_p50),
                "daemon_p99_ms": round2(r.daemon_p99),
                "baseline_p50_ms": round2(r.baseline_p50),
                "baseline_p99_ms": round2(r.baseline_p99),
                "daemon_rss_peak_mb": round2(r.rss_mb),
                "complete": r.complete,
                "metrics": r.scraped.iter().map(|m| json!({
                    "fanout_lag_peak": m.peak_lag,
                    "fanout_lag_end": m.end_lag,
                    "posts_copied": m.copied,
                    "handed_off": m.handed_off,
                    "copies_expected": m.expected,
                    "ok": m.ok(),
                })).collect::<Vec<_>>(),
            })
        );
    } else {
        println!(
            "{:>7} | {:>10.1} {:>10.1} {:>6.3} | {:>9.2} {:>9.2} | {:>9.2} {:>9.2} | {:>7.1} | {}",
            r.members,
            r.daemon_pps,
            r.baseline_pps,
            ratio,
            r.daemon_p50,
            r.daemon_p99,
            r.baseline_p50,
            r.baseline_p99,
            r.rss_mb,
            r.complete
        );
        for (run, m) in r.scraped.iter().enumerate() {
            println!(
                "        metrics run {run}: fan-out lag peak {} -> end {}, copies counted {} / handed off {} of {} expected: {}",
                m.peak_lag,
                m.end_lag,
                m.copied,
                m.handed_off,
                m.expected,
                if m.ok() { "agree" } else { "DISAGREE" }
            );
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Publishes one post (with its id as `Nats-Msg-Id`) and returns the id.
async fn post(
    insp: &Inspector,
    sender: &cotal_delivery::agent::Agent,
    channel: &str,
    id: &str,
) -> Result<async_nats::jetstream::context::PublishAckFuture, String> {
    let msg = sender.message(channel, "bench", Some(id));
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", id);
    insp.js
        .publish_with_headers(
            insp.names.chat_subject(sender.principal(), channel),
            headers,
            msg.to_string().into(),
        )
        .await
        .map_err(|e| e.to_string())
}

/// How many pairs of `ids` x `dlv` are stored, and the latest time one was first seen.
fn stored(seen: &Shared, ids: &[String], dlv: &[String]) -> (usize, Option<Instant>) {
    let s = seen.lock().expect("seen");
    let mut n = 0;
    let mut last = None;
    for id in ids {
        for d in dlv {
            if let Some(t) = s.first.get(&(id.clone(), d.clone())) {
                n += 1;
                last = Some(last.map_or(*t, |l: Instant| l.max(*t)));
            }
        }
    }
    (n, last)
}

/// Waits (bounded) until every pair of `ids` is stored; false if the bound passed first.
async fn all_stored(seen: &Shared, ids: &[String], dlv: &[String], bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if stored(seen, ids, dlv).0 == ids.len() * dlv.len() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Posts `--posts` in windows; returns posts/s and whether every pair was stored.
async fn throughput(on: &On<'_>, tag: &str) -> Result<(f64, bool), String> {
    let (insp, sender, channel, dlv, seen, args, bound) = (
        on.insp, on.sender, on.channel, on.dlv, on.seen, on.args, on.bound,
    );
    let ids: Vec<String> = (0..args.posts).map(|i| format!("{tag}-{i}")).collect();
    let start = Instant::now();
    let mut complete = true;
    for window in ids.chunks(args.window.max(1)) {
        let mut acks = Vec::with_capacity(window.len());
        for id in window {
            acks.push(post(insp, sender, channel, id).await?);
        }
        for a in acks {
            a.await.map_err(|e| e.to_string())?;
        }
        if !all_stored(seen, window, dlv, bound).await {
            complete = false;
            break;
        }
    }
    let (n, last) = stored(seen, &ids, dlv);
    complete &= n == ids.len() * dlv.len();
    let elapsed = last.unwrap_or(start).saturating_duration_since(start);
    Ok((
        args.posts as f64 / elapsed.as_secs_f64().max(1e-9),
        complete,
    ))
}

/// Posts `--latency-posts` at `--rate` posts/s; returns (p50, p99) of publish → DLV stored.
async fn latency(on: &On<'_>, tag: &str) -> Result<((f64, f64), bool), String> {
    let (insp, sender, channel, dlv, seen, args, bound) = (
        on.insp, on.sender, on.channel, on.dlv, on.seen, on.args, on.bound,
    );
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / args.rate.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent: Vec<(String, Instant)> = Vec::with_capacity(args.latency_posts);
    let mut acks = Vec::new();
    for i in 0..args.latency_posts {
        tick.tick().await;
        let id = format!("{tag}-{i}");
        let t0 = Instant::now();
        acks.push(post(insp, sender, channel, &id).await?);
        sent.push((id, t0));
    }
    for a in acks {
        a.await.map_err(|e| e.to_string())?;
    }
    let ids: Vec<String> = sent.iter().map(|(id, _)| id.clone()).collect();
    let complete = all_stored(seen, &ids, dlv, bound).await;
    let s = seen.lock().expect("seen");
    let mut ms: Vec<f64> = Vec::new();
    for (id, t0) in &sent {
        for d in dlv {
            if let Some(t) = s.first.get(&(id.clone(), d.clone())) {
                ms.push(t.saturating_duration_since(*t0).as_secs_f64() * 1000.0);
            }
        }
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        ms.get(((ms.len().max(1) - 1) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Ok(((pct(0.50), pct(0.99)), complete))
}

/// Purges CHAT, INBOX and DLV (consumers move past what was purged).
async fn purge(insp: &Inspector) -> Result<(), String> {
    for name in [
        insp.names.chat_stream(),
        insp.names.inbox_stream(),
        insp.names.dlv_stream(),
    ] {
        let s = insp
            .js
            .get_stream_no_info(&name)
            .await
            .map_err(|e| e.to_string())?;
        s.purge().await.map_err(|e| format!("purge {name}: {e}"))?;
    }
    Ok(())
}

/// Counts the JetStream API requests of the space's account as the broker routes them (a core
/// subscription on `$JS.API.>`: the daemon's reads and pulls, or the baseline's pulls).
async fn count_api_requests(insp: &Inspector) -> Result<Arc<AtomicU64>, String> {
    let count = Arc::new(AtomicU64::new(0));
    let mut sub = insp
        .client
        .subscribe("$JS.API.>")
        .await
        .map_err(|e| e.to_string())?;
    let c = count.clone();
    tokio::spawn(async move {
        while sub.next().await.is_some() {
            c.fetch_add(1, Ordering::Relaxed);
        }
    });
    Ok(count)
}

/// `VmHWM` (peak resident set) of `pid` in kB, 0 if unreadable.
fn peak_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

const BASE_FANOUT: &str = "bench_fanout";
const BASE_READER: &str = "bench_reader";

/// The raw pipeline: two durable pull consumers and their tasks.
struct Baseline {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Baseline {
    async fn start(
        insp: &Inspector,
        channel: &str,
        targets: &[AgentMaterial],
    ) -> Result<Baseline, String> {
        let consumer = |stream: String, name: &'static str, filter: String| {
            let js = insp.js.clone();
            async move {
                js.get_stream_no_info(stream)
                    .await
                    .map_err(|e| e.to_string())?
                    .create_consumer(pull::Config {
                        durable_name: Some(name.to_string()),
                        filter_subject: filter,
                        ack_policy: AckPolicy::Explicit,
                        deliver_policy: DeliverPolicy::New,
                        max_ack_pending: BASELINE_IN_FLIGHT as i64,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| e.to_string())
            }
        };
        let fanout = consumer(
            insp.names.chat_stream(),
            BASE_FANOUT,
            insp.names.chat_read_subject(channel),
        )
        .await?;
        let reader = consumer(
            insp.names.inbox_stream(),
            BASE_READER,
            insp.names.dinbox_all(),
        )
        .await?;
        let names = insp.names.clone();
        let js = insp.js.clone();
        let members: Arc<Vec<AgentMaterial>> = Arc::new(targets.to_vec());
        let channel = channel.to_string();
        let fan = {
            let (js, names) = (js.clone(), names.clone());
            tokio::spawn(async move {
                let Ok(messages) = fanout.messages().await else {
                    return;
                };
                // Bounded by copies, like the daemon's writer (`MAX_COPIES_IN_FLIGHT`): 512
                // posts of 100 members each would put 51,200 publishes on one client, whose
                // acks then time out and the baseline stalls instead of measuring anything.
                let posts_in_flight = (cotal_delivery::plane::MAX_COPIES_IN_FLIGHT
                    / members.len().max(1))
                .clamp(1, BASELINE_IN_FLIGHT);
                messages
                    .for_each_concurrent(posts_in_flight, |m| {
                        let (js, names, members, channel) =
                            (js.clone(), names.clone(), members.clone(), channel.clone());
                        async move {
                            let Ok(m) = m else { return };
                            let Ok(msg) = serde_json::from_slice::<Value>(&m.payload) else {
                                return;
                            };
                            let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
                            let mut acks = Vec::with_capacity(members.len());
                            for t in members.iter() {
                                let entry = Plane3Entry {
                                    msg: msg.clone(),
                                    channel: channel.clone(),
                                    seq,
                                    reason: Reason::DurableChannel,
                                    generation: 1,
                                };
                                let mut h = HeaderMap::new();
                                if let Some(id) = dedup_id(&msg, &t.principal, &t.lifecycle_uid, 1)
                                {
                                    h.insert("Nats-Msg-Id", id.as_str());
                                }
                                let body = serde_json::to_vec(&entry).unwrap_or_default();
                                let subject = names.dinbox_subject(&t.principal, &t.lifecycle_uid);
                                match js.publish_with_headers(subject, h, body.into()).await {
                                    Ok(a) => acks.push(a),
                                    Err(_) => return,
                                }
                            }
                            for a in acks {
                                if a.await.is_err() {
                                    return;
                                }
                            }
                            let _ = m.ack().await;
                        }
                    })
                    .await;
            })
        };
        let read = tokio::spawn(async move {
            let Ok(messages) = reader.messages().await else {
                return;
            };
            messages
                .for_each_concurrent(BASELINE_IN_FLIGHT, |m| {
                    let (js, names) = (js.clone(), names.clone());
                    async move {
                        let Ok(m) = m else { return };
                        let Ok(entry) = serde_json::from_slice::<Plane3Entry>(&m.payload) else {
                            return;
                        };
                        let prefix = names.space().prefix();
                        let Some((member, uid)) =
                            cotal_delivery::wire::parse_dinbox_subject(&m.subject, &prefix)
                        else {
                            return;
                        };
                        let frame = Plane3DeliveryFrame::for_entry(&entry);
                        let mut h = HeaderMap::new();
                        h.insert(DELIVERY_FRAME_HEADER, "1");
                        if let Some(id) = dedup_id(&entry.msg, &member, &uid, entry.generation) {
                            h.insert("Nats-Msg-Id", id.as_str());
                        }
                        let body = serde_json::to_vec(&frame).unwrap_or_default();
                        let Ok(a) = js
                            .publish_with_headers(names.dlv_subject(&member, &uid), h, body.into())
                            .await
                        else {
                            return;
                        };
                        if a.await.is_ok() {
                            let _ = m.ack().await;
                        }
                    }
                })
                .await;
        });
        Ok(Baseline {
            tasks: vec![fan, read],
        })
    }

    async fn stop(self, insp: &Inspector) {
        for t in self.tasks {
            t.abort();
        }
        for (stream, name) in [
            (insp.names.chat_stream(), BASE_FANOUT),
            (insp.names.inbox_stream(), BASE_READER),
        ] {
            if let Ok(s) = insp.js.get_stream_no_info(stream).await {
                let _ = s.delete_consumer(name).await;
            }
        }
    }
}

async fn start_daemon(mesh: &Mesh) -> Result<(Daemon, u16), String> {
    // The daemon's own Prometheus endpoint, scraped while it runs (docs/operations.md).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free loopback port for --metrics-addr: {e}"))?
        .port();
    let mut d = mesh
        .deliver(mesh.space())
        .arg("--metrics-addr")
        .arg(format!("127.0.0.1:{port}"))
        .env("COTAL_DELIVERY_METRICS_SAMPLE_MS", "100")
        .spawn()
        .map_err(|e| e.to_string())?;
    d.wait_for_line("delivery daemon up", Duration::from_secs(30))
        .await
        .map_err(|e| e.to_string())?;
    // For a profiler to attach to (`perf stat -p <pid>`).
    eprintln!("bench-fanout: daemon pid {}", d.pid());
    Ok((d, port))
}

/// What the daemon's metrics endpoint showed over one daemon phase: the fan-out lag gauge
/// sampled every `SCRAPE_EVERY` (it must rise under the burst and fall back to 0) and the copy
/// counters at the end (they must equal posts x members: every copy counted once).
struct Scraper {
    port: u16,
    peak_lag: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

const SCRAPE_EVERY: Duration = Duration::from_millis(100);
const SCRAPE_BOUND: Duration = Duration::from_secs(5);
/// How long the lag may take to fall back to 0 after the phase saw every copy stored.
const LAG_SETTLE_BOUND: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Default)]
struct Scraped {
    peak_lag: u64,
    end_lag: u64,
    copied: u64,
    handed_off: u64,
    expected: u64,
}

impl Scraped {
    fn ok(&self) -> bool {
        self.peak_lag > 0
            && self.end_lag == 0
            && self.copied == self.expected
            && self.handed_off == self.expected
    }
}

fn metric(text: &str, name: &str, space: &str) -> Option<u64> {
    let series = format!("{name}{{space=\"{space}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

async fn scrape(port: u16) -> Option<String> {
    let r = delivery_harness::http::get(port, "/metrics", SCRAPE_BOUND)
        .await
        .ok()?;
    (r.status == 200).then(|| String::from_utf8_lossy(&r.body).into_owned())
}

impl Scraper {
    fn start(port: u16, space: String) -> Scraper {
        let peak_lag = Arc::new(AtomicU64::new(0));
        let peak = peak_lag.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Some(lag) = scrape(port)
                    .await
                    .and_then(|t| metric(&t, "cotal_delivery_fanout_lag", &space))
                {
                    peak.fetch_max(lag, Ordering::Relaxed);
                }
                tokio::time::sleep(SCRAPE_EVERY).await;
            }
        });
        Scraper {
            port,
            peak_lag,
            task,
        }
    }

    /// Stops sampling and reads the end state once the lag settled (or its bound ran out).
    async fn finish(self, space: &str, expected: u64) -> Scraped {
        self.task.abort();
        let deadline = Instant::now() + LAG_SETTLE_BOUND;
        let mut out = Scraped {
            peak_lag: self.peak_lag.load(Ordering::Relaxed),
            end_lag: u64::MAX,
            expected,
            ..Scraped::default()
        };
        loop {
            if let Some(t) = scrape(self.port).await {
                out.end_lag = metric(&t, "cotal_delivery_fanout_lag", space).unwrap_or(u64::MAX);
                out.copied = metric(&t, "cotal_delivery_posts_copied_total", space).unwrap_or(0);
                out.handed_off = metric(&t, "cotal_delivery_handed_off_total", space).unwrap_or(0);
            }
            if out.ok() || Instant::now() >= deadline {
                return out;
            }
            tokio::time::sleep(SCRAPE_EVERY).await;
        }
    }
}

async fn stop(d: &mut Daemon) {
    let _ = d.terminate();
    let _ = d.wait_exit(Duration::from_secs(15)).await;
}
