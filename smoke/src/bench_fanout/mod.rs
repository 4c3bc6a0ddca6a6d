//! `smoke bench-fanout`: the durable data path next to the raw JetStream pipeline it wraps,
//! like for like, on the same broker (or the same 3-node cluster, `--cluster`) in the same run.
//!
//! Per member count M (M lifecycles joined durably to one channel, offline; one sender), each
//! run measures both sides in turn, every stream purged between them:
//!
//! - **daemon**: the real daemon binary runs the path (CHAT → `fanout` → INBOX → `reader` → DLV).
//! - **baseline**: the daemon is stopped and the raw client (`raw.rs`, a process of its own)
//!   runs the same pipeline with no checks, one connection per stage, at full speed.
//!
//! A run is one warm-up post (not measured) and then `--posts` posts published at once, fewer
//! than the 1,000 per subject CHAT, INBOX and DLV keep, so nothing is windowed and nothing is
//! discarded. Nothing observes frames while a run is measured: completion is the DLV stream's
//! message count (its state polled), throughput is posts over the broker's timestamps (the
//! first measured post stored in CHAT → the last frame stored in DLV), and CPU is read from
//! `/proc/<pid>/stat` of the process running the pipeline, of the broker (every node) and of
//! this benchmark itself, before the burst and once DLV is complete. Latency is measured after
//! each run at a fixed `--rate` posts/s, post stored → frame stored, from the same timestamps
//! read back after the run; a row takes each side's median over the runs. The daemon's peak RSS
//! is its `VmHWM` before each stop.

pub(crate) mod measure;
pub mod raw;
mod scrape;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::stream::Stream;
use async_nats::HeaderMap;
use cotal_delivery::agent::Agent;
use cotal_delivery::provision::{AgentMaterial, MintOptions, STANDING_TTL};
use delivery_harness::rig::agent;
use delivery_harness::rig::daemon::Daemon;
use delivery_harness::rig::mesh::{Inspector, Mesh};
use futures::StreamExt;
use serde_json::{json, Value};

use measure::{CpuMark, CpuSpent};
use raw::{RawClient, GENERATION};
use scrape::{Scraped, Scraper};

#[derive(clap::Args)]
pub struct Args {
    /// Member counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100")]
    members: Vec<usize>,
    /// Posts per throughput run, published at once; with the warm-up post at most the 1,000
    /// per subject the streams keep.
    #[arg(long, default_value_t = 900)]
    posts: usize,
    /// Throughput runs per member count and side; the median of each figure is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Fixed posting rate of the latency measurement, posts/s.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    /// Posts of the latency measurement, made after every run (at most the 1,000 per subject
    /// the streams keep).
    #[arg(long, default_value_t = 400)]
    latency_posts: usize,
    /// Bound on one run (or its latency measurement) completing in DLV, in seconds.
    #[arg(long, default_value_t = 300)]
    surface_bound_secs: u64,
    /// Both sides on a 3-node loopback JetStream cluster with every stream at R3 (the
    /// production shape) instead of one broker.
    #[arg(long)]
    cluster: bool,
    /// Print one JSON object per member count instead of the table.
    #[arg(long)]
    json: bool,
}

/// Posts each throughput run starts with, not measured: the pipeline has pulled, routed and
/// handed off once (connections, pull requests and caches up) before the burst.
pub(crate) const WARM_UP_POSTS: usize = 1;
/// Lifetime of the benchmark's own unrestricted credentials (its view of the broker, each raw
/// client's): a standing credential's, since a default `--cluster` run takes 5-6 minutes here
/// and the operator profile's 5 minutes ended one at its expiry ("DLV info: request failed:
/// channel closed").
pub(crate) const BENCH_CREDENTIAL_TTL: std::time::Duration = STANDING_TTL;

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

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// One side's figures over one throughput run (or the median over runs).
#[derive(Clone, Copy, Default)]
pub(crate) struct Figures {
    pub posts_per_s: f64,
    pub frames_per_s: f64,
    /// CPU of the process running the pipeline (the daemon or the raw client) per frame.
    pub cpu_us_per_frame: f64,
    /// CPU of the broker (every node) per frame.
    pub broker_us_per_frame: f64,
    /// This benchmark process's own CPU over the run, as a share of one core.
    pub bench_core_share: f64,
    /// JetStream API requests of the space's account per post (the benchmark's own excluded).
    pub api_per_post: f64,
}

impl Figures {
    fn of(spent: &CpuSpent, posts: usize, frames: usize, elapsed_s: f64, api: u64) -> Figures {
        let per_frame = |d: Duration| d.as_secs_f64() * 1e6 / frames.max(1) as f64;
        Figures {
            posts_per_s: posts as f64 / elapsed_s,
            frames_per_s: frames as f64 / elapsed_s,
            cpu_us_per_frame: per_frame(spent.side),
            broker_us_per_frame: per_frame(spent.brokers),
            bench_core_share: spent.bench.as_secs_f64() / spent.wall.as_secs_f64().max(1e-9),
            api_per_post: api as f64 / posts.max(1) as f64,
        }
    }

    /// The median of every figure over `runs`, figure by figure.
    pub(crate) fn median(runs: &[Figures]) -> Figures {
        let m = |f: fn(&Figures) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
        Figures {
            posts_per_s: m(|f| f.posts_per_s),
            frames_per_s: m(|f| f.frames_per_s),
            cpu_us_per_frame: m(|f| f.cpu_us_per_frame),
            broker_us_per_frame: m(|f| f.broker_us_per_frame),
            bench_core_share: m(|f| f.bench_core_share),
            api_per_post: m(|f| f.api_per_post),
        }
    }

    fn json(&self) -> Value {
        json!({
            "posts_per_s": round2(self.posts_per_s),
            "frames_per_s": round2(self.frames_per_s),
            "cpu_us_per_frame": round2(self.cpu_us_per_frame),
            "broker_cpu_us_per_frame": round2(self.broker_us_per_frame),
            "bench_cpu_core_share": round3(self.bench_core_share),
            "api_requests_per_post": round2(self.api_per_post),
        })
    }
}

/// One run of both sides.
struct RunFigures {
    daemon: Figures,
    baseline: Figures,
    /// (p50, p99) ms of each side's latency phase in this run.
    daemon_lat: (f64, f64),
    baseline_lat: (f64, f64),
    loadavg: String,
}

/// One member count's figures.
struct Row {
    members: usize,
    daemon: Figures,
    baseline: Figures,
    runs: Vec<RunFigures>,
    /// Medians over the runs of each side's p50 and p99, ms.
    daemon_lat: (f64, f64),
    baseline_lat: (f64, f64),
    rss_mb: f64,
    complete: bool,
    /// The daemon's metrics endpoint over each daemon run.
    scraped: Vec<Scraped>,
}

async fn bench(args: Args) -> Result<bool, String> {
    let nodes = crate::cluster::nodes(args.cluster);
    let mesh = Mesh::builder()
        .space("bench")
        .map_err(err)?
        .cluster(nodes)
        .start()
        .await
        .map_err(err)?;
    let insp = mesh
        .inspector_with(
            mesh.space(),
            MintOptions::new().expires_in(BENCH_CREDENTIAL_TTL),
        )
        .await
        .map_err(err)?;
    let replicas_line = if args.cluster {
        Some(crate::cluster::replicas(&insp, nodes).await?)
    } else {
        None
    };
    let retained = retained_per_subject(&insp).await?;
    for (what, n, run) in [
        ("--posts", args.posts, args.posts + WARM_UP_POSTS),
        ("--latency-posts", args.latency_posts, args.latency_posts),
    ] {
        if n == 0 || run > retained {
            return Err(format!(
                "{what} {n}: a run needs at least one post and at most the {retained} per subject the streams keep ({run} with the warm-up)"
            ));
        }
    }
    let api = count_api_requests(&insp).await?;
    insp.sync().await.map_err(err)?;
    let brokers: Vec<u32> = (0..mesh.node_count())
        .filter_map(|i| mesh.node(i).map(|b| b.pid()))
        .collect();
    let chat = insp
        .js
        .get_stream_no_info(insp.names.chat_stream())
        .await
        .map_err(err)?;
    let dlv = insp
        .js
        .get_stream_no_info(insp.names.dlv_stream())
        .await
        .map_err(err)?;
    if !args.json {
        let broker = match &replicas_line {
            Some(line) => format!("a {nodes}-node loopback cluster at {} ({line})", mesh.url()),
            None => format!("one nats-server at {}", mesh.url()),
        };
        println!(
            "bench-fanout: {broker}; {} posts (+{WARM_UP_POSTS} warm-up) x {} runs per member count and side, latency {} posts at {} posts/s after each run; load average {}",
            args.posts,
            args.runs,
            args.latency_posts,
            args.rate,
            measure::loadavg()
        );
        println!(
            "{:>7} | {:>9} {:>9} {:>5} | {:>8} {:>8} | {:>7} {:>7} {:>5} | {:>7} {:>7} {:>5} | {:>8} {:>8} | {:>8} {:>8} | {:>6} | complete",
            "members",
            "daemon/s",
            "raw/s",
            "ratio",
            "d fr/s",
            "raw fr/s",
            "d µs/fr",
            "r µs/fr",
            "x",
            "bd µs/fr",
            "br µs/fr",
            "x",
            "d p50 ms",
            "d p99 ms",
            "r p50 ms",
            "r p99 ms",
            "RSS MB"
        );
    }
    let bound = Duration::from_secs(args.surface_bound_secs);
    let mut all_complete = true;
    for (round, &m) in args.members.iter().enumerate() {
        let channel = format!("bench{round}");
        // The daemon serves the members' joins, so it runs before they exist.
        let (mut daemon, mut port) = start_daemon(&mesh).await?;
        let (sender, _) = agent::spawn(&mesh, &insp, &format!("sender{round}"), &[&channel])
            .await
            .map_err(err)?;
        let mut targets: Vec<AgentMaterial> = Vec::new();
        for i in 0..m {
            let (a, mat) = agent::spawn(&mesh, &insp, &format!("m{round}_{i}"), &[&channel])
                .await
                .map_err(err)?;
            a.durable_join(&channel).await.map_err(err)?;
            targets.push(mat);
        }
        let suffixes: HashMap<String, String> = targets
            .iter()
            .map(|t| {
                (
                    insp.names.dlv_subject(&t.principal, &t.lifecycle_uid),
                    format!(
                        ":{}:{}:{GENERATION}",
                        t.principal.dot_form(),
                        t.lifecycle_uid
                    ),
                )
            })
            .collect();
        let on = On {
            api: &api,
            insp: &insp,
            chat: &chat,
            dlv: &dlv,
            sender: &sender,
            channel: &channel,
            suffixes: &suffixes,
            brokers: &brokers,
            posts: args.posts,
            latency_posts: args.latency_posts,
            rate: args.rate,
            bound,
        };
        let mut complete = true;
        let mut runs = Vec::new();
        let mut scraped = Vec::new();
        let mut rss_kb = 0u64;
        for run in 0..args.runs.max(1) {
            if run > 0 {
                (daemon, port) = start_daemon(&mesh).await?;
            }
            let scraper = Scraper::start(port, mesh.space().as_str().to_string());
            let d = on.phase(daemon.pid(), &format!("d{round}r{run}")).await?;
            let posts = WARM_UP_POSTS + args.posts + args.latency_posts;
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
            complete &= d.complete;
            rss_kb = rss_kb.max(peak_rss_kb(daemon.pid()));
            stop(&mut daemon).await;
            purge(&insp).await?;

            let raw = RawClient::start(&mesh, &insp, &channel, &targets).await?;
            let b = on.phase(raw.pid(), &format!("b{round}r{run}")).await?;
            if !b.complete {
                eprintln!(
                    "bench-fanout: {m} members, run {run}: the raw client's run is incomplete; it printed:\n{}",
                    raw.transcript()
                );
            }
            complete &= b.complete;
            raw.stop(&insp).await;
            purge(&insp).await?;
            let load = measure::loadavg();
            eprintln!(
                "bench-fanout: {m} members, run {run}: {}; {}; latency p50 / p99 daemon {:.2} / {:.2} ms, raw {:.2} / {:.2} ms; load average {load}",
                describe("daemon", "daemon", &d.figures),
                describe("raw", "raw client", &b.figures),
                d.latency.0,
                d.latency.1,
                b.latency.0,
                b.latency.1
            );
            runs.push(RunFigures {
                daemon: d.figures,
                baseline: b.figures,
                daemon_lat: d.latency,
                baseline_lat: b.latency,
                loadavg: load,
            });
        }
        let lat = |side: fn(&RunFigures) -> (f64, f64)| {
            (
                median(&mut runs.iter().map(|r| side(r).0).collect::<Vec<_>>()),
                median(&mut runs.iter().map(|r| side(r).1).collect::<Vec<_>>()),
            )
        };
        let (daemon_lat, baseline_lat) = (lat(|r| r.daemon_lat), lat(|r| r.baseline_lat));
        let row = Row {
            members: m,
            daemon: Figures::median(&runs.iter().map(|r| r.daemon).collect::<Vec<_>>()),
            baseline: Figures::median(&runs.iter().map(|r| r.baseline).collect::<Vec<_>>()),
            runs,
            daemon_lat,
            baseline_lat,
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

/// One run's figures of one side, for the per-run line.
fn describe(side: &str, process: &str, f: &Figures) -> String {
    format!(
        "{side} {:.1} posts/s, {:.0} frames/s, {process} {:.1} µs CPU per frame, broker {:.1} µs per frame, {:.1} JetStream API requests per post, this benchmark's process {:.1} % of a core",
        f.posts_per_s,
        f.frames_per_s,
        f.cpu_us_per_frame,
        f.broker_us_per_frame,
        f.api_per_post,
        f.bench_core_share * 100.0
    )
}

/// Everything one phase needs (`smoke bench-scale` measures its large channel with it too).
pub(crate) struct On<'a> {
    pub api: &'a ApiCount,
    pub insp: &'a Inspector,
    pub chat: &'a Stream<()>,
    pub dlv: &'a Stream<()>,
    pub sender: &'a Agent,
    pub channel: &'a str,
    /// Each member's DLV subject → the suffix of its dedup ids.
    pub suffixes: &'a HashMap<String, String>,
    /// Every broker node's pid.
    pub brokers: &'a [u32],
    /// Posts of a throughput run (published at once after the warm-up).
    pub posts: usize,
    /// Posts of the latency measurement, and their rate (posts/s).
    pub latency_posts: usize,
    pub rate: u64,
    pub bound: Duration,
}

/// One phase (daemon or baseline) of one run.
struct Phase {
    figures: Figures,
    /// (p50, p99) ms of the latency measurement.
    latency: (f64, f64),
    complete: bool,
}

impl On<'_> {
    fn members(&self) -> usize {
        self.suffixes.len()
    }

    /// Throughput, then latency, with process `pid` running the pipeline. Latency is measured
    /// in every run: one phase's p99 is set by its few slowest posts, too noisy to judge alone
    /// (docs/performance.md), so the row takes each side's median over the runs.
    async fn phase(&self, pid: u32, tag: &str) -> Result<Phase, String> {
        let (figures, mut complete) = self.throughput(pid, tag).await?;
        purge(self.insp).await?;
        let (latency, ok) = self.latency(&format!("{tag}l")).await?;
        complete &= ok;
        Ok(Phase {
            figures,
            latency,
            complete,
        })
    }

    /// The warm-up post, then `--posts` at once; figures from the broker's timestamps and
    /// `/proc`, completeness from DLV (every member holds exactly every post, and the last
    /// frame has the daemon's shape).
    pub(crate) async fn throughput(&self, pid: u32, tag: &str) -> Result<(Figures, bool), String> {
        let (posts, m) = (self.posts, self.members());
        for i in 0..WARM_UP_POSTS {
            let ack = post(self.insp, self.sender, self.channel, &format!("{tag}-w{i}")).await?;
            ack.await.map_err(err)?;
        }
        let warm = (WARM_UP_POSTS * m) as u64;
        if measure::wait_frames(self.dlv, warm, self.bound)
            .await?
            .is_none()
        {
            eprintln!(
                "bench-fanout: {tag}: the warm-up post did not reach every member within the bound"
            );
            return Ok((Figures::default(), false));
        }
        let api0 = self.api.load();
        let before = CpuMark::take(pid, self.brokers)?;
        let mut acks = Vec::with_capacity(posts);
        for i in 0..posts {
            acks.push(post(self.insp, self.sender, self.channel, &format!("{tag}-{i}")).await?);
        }
        let mut first_seq = None;
        for a in acks {
            let ack = a.await.map_err(err)?;
            first_seq.get_or_insert(ack.sequence);
        }
        let want = ((WARM_UP_POSTS + posts) * m) as u64;
        let state = measure::wait_frames(self.dlv, want, self.bound).await?;
        let after = CpuMark::take(pid, self.brokers)?;
        let api = self.api.load().saturating_sub(api0);
        let Some(state) = state else {
            eprintln!(
                "bench-fanout: {tag}: not every frame stored within {} s",
                self.bound.as_secs()
            );
            return Ok((Figures::default(), false));
        };
        let first = measure::stored_at_ns(self.chat, first_seq.unwrap_or(0)).await?;
        let last = state.last_timestamp.unix_timestamp_nanos();
        let elapsed_s = (last - first).max(1) as f64 / 1e9;
        let figures = Figures::of(
            &before.spent_until(&after),
            posts,
            posts * m,
            elapsed_s,
            api,
        );
        let complete = self.every_member_holds(WARM_UP_POSTS + posts, tag).await?
            && self.frame_is_the_daemons(state.last_sequence, tag).await;
        Ok((figures, complete))
    }

    /// Whether every member's DLV subject holds exactly `n` frames (a duplicate or a loss
    /// shows; the stream's count alone could hide one behind the other).
    async fn every_member_holds(&self, n: usize, tag: &str) -> Result<bool, String> {
        let held = measure::per_subject(self.dlv, &self.insp.names.dlv_all()).await?;
        let wrong: Vec<String> = self
            .suffixes
            .keys()
            .filter(|s| held.get(*s) != Some(&n))
            .map(|s| format!("{s}: {:?}", held.get(s)))
            .collect();
        if wrong.is_empty() && held.len() == self.members() {
            return Ok(true);
        }
        eprintln!(
            "bench-fanout: {tag}: {} of {} members do not hold exactly {n} frames ({} subjects in DLV): {}",
            wrong.len(),
            self.members(),
            held.len(),
            wrong.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
        );
        Ok(false)
    }

    async fn frame_is_the_daemons(&self, seq: u64, tag: &str) -> bool {
        match measure::check_frame(self.dlv, seq, self.channel, |s| {
            self.suffixes.get(s).cloned()
        })
        .await
        {
            Ok(()) => true,
            Err(e) => {
                eprintln!("bench-fanout: {tag}: {e}");
                false
            }
        }
    }

    /// Posts `--latency-posts` at `--rate` posts/s; returns (p50, p99) of post stored in CHAT
    /// → frame stored in DLV, per (post, member), from the broker's timestamps read back after
    /// every frame is stored.
    async fn latency(&self, tag: &str) -> Result<((f64, f64), bool), String> {
        let (n, m) = (self.latency_posts, self.members());
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / self.rate.max(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut acks = Vec::with_capacity(n);
        for i in 0..n {
            tick.tick().await;
            acks.push(post(self.insp, self.sender, self.channel, &format!("{tag}-{i}")).await?);
        }
        for a in acks {
            a.await.map_err(err)?;
        }
        if measure::wait_frames(self.dlv, (n * m) as u64, self.bound)
            .await?
            .is_none()
        {
            eprintln!(
                "bench-fanout: {tag}: not every frame stored within {} s",
                self.bound.as_secs()
            );
            return Ok(((0.0, 0.0), false));
        }
        let chat_subject = self
            .insp
            .names
            .chat_subject(self.sender.principal(), self.channel);
        let posted: HashMap<String, i128> =
            measure::stored_times(self.chat, &chat_subject, n, self.bound)
                .await?
                .into_iter()
                .collect();
        let frames =
            measure::stored_times(self.dlv, &self.insp.names.dlv_all(), n * m, self.bound).await?;
        let mut ms: Vec<f64> = frames
            .iter()
            .filter_map(|(dedup, at)| {
                let id = dedup.split(':').next()?;
                posted.get(id).map(|t0| (at - t0) as f64 / 1e6)
            })
            .collect();
        ms.sort_by(|a, b| a.total_cmp(b));
        let complete = ms.len() == n * m;
        let pct = |p| measure::percentile(&ms, p);
        Ok(((pct(0.50), pct(0.99)), complete))
    }
}

/// The targets of docs/performance.md, against the raw pipeline of the same run: daemon CPU
/// per frame at most this many times the raw client's.
const TARGET_CPU_RATIO_MAX: f64 = 1.5;
/// Broker CPU per frame of the daemon run at most this many times the raw run's.
const TARGET_BROKER_RATIO_MAX: f64 = 1.25;
/// Daemon throughput at least this share of the raw pipeline's.
const TARGET_THROUGHPUT_RATIO_MIN: f64 = 0.7;
/// p99 post stored → frame stored at `--rate` at most this many times the raw p99 ...
const TARGET_P99_RATIO_MAX: f64 = 1.5;
/// ... at this member count (at 100 members both sides queue at 200 posts/s).
const TARGET_P99_MEMBERS: usize = 10;
/// Daemon peak RSS, MB.
const TARGET_RSS_MAX_MB: f64 = 32.0;

/// Whether one row meets each target (`None`: the target does not apply to this row).
struct TargetsMet {
    cpu: bool,
    broker: bool,
    throughput: bool,
    p99: Option<bool>,
    rss: bool,
}

impl TargetsMet {
    fn of(r: &Row) -> TargetsMet {
        let ratio = |a: f64, b: f64| a / b.max(f64::MIN_POSITIVE);
        let (d, b) = (&r.daemon, &r.baseline);
        TargetsMet {
            cpu: ratio(d.cpu_us_per_frame, b.cpu_us_per_frame) <= TARGET_CPU_RATIO_MAX,
            broker: ratio(d.broker_us_per_frame, b.broker_us_per_frame) <= TARGET_BROKER_RATIO_MAX,
            throughput: ratio(d.posts_per_s, b.posts_per_s) >= TARGET_THROUGHPUT_RATIO_MIN,
            p99: (r.members == TARGET_P99_MEMBERS)
                .then(|| ratio(r.daemon_lat.1, r.baseline_lat.1) <= TARGET_P99_RATIO_MAX),
            rss: r.rss_mb <= TARGET_RSS_MAX_MB,
        }
    }

    fn json(&self) -> Value {
        json!({
            "cpu_per_frame_ratio_max_1_5": self.cpu,
            "broker_cpu_per_frame_ratio_max_1_25": self.broker,
            "throughput_ratio_min_0_7": self.throughput,
            "p99_ratio_max_1_5_at_10_members": self.p99,
            "rss_max_32_mb": self.rss,
        })
    }

    fn line(&self, r: &Row) -> String {
        let ratio = |a: f64, b: f64| a / b.max(f64::MIN_POSITIVE);
        let (d, b) = (&r.daemon, &r.baseline);
        let met = |ok: bool| if ok { "met" } else { "NOT met" };
        let p99 = match self.p99 {
            Some(ok) => format!(
                "p99 {:.2} x (<= {TARGET_P99_RATIO_MAX}) {}",
                ratio(r.daemon_lat.1, r.baseline_lat.1),
                met(ok)
            ),
            None => format!("p99 target only at {TARGET_P99_MEMBERS} members"),
        };
        format!(
            "targets: CPU/frame {:.2} x (<= {TARGET_CPU_RATIO_MAX}) {}; broker {:.2} x (<= {TARGET_BROKER_RATIO_MAX}) {}; throughput {:.2} x (>= {TARGET_THROUGHPUT_RATIO_MIN}) {}; {p99}; RSS {:.1} MB (<= {TARGET_RSS_MAX_MB}) {}",
            ratio(d.cpu_us_per_frame, b.cpu_us_per_frame),
            met(self.cpu),
            ratio(d.broker_us_per_frame, b.broker_us_per_frame),
            met(self.broker),
            ratio(d.posts_per_s, b.posts_per_s),
            met(self.throughput),
            r.rss_mb,
            met(self.rss),
        )
    }
}

fn print_row(r: &Row, args: &Args) {
    let ratio = |a: f64, b: f64| a / b.max(f64::MIN_POSITIVE);
    let (d, b) = (&r.daemon, &r.baseline);
    let targets = TargetsMet::of(r);
    if args.json {
        println!(
            "{}",
            json!({
                "members": r.members,
                "posts": args.posts,
                "cluster": args.cluster,
                "daemon_posts_per_s": round2(d.posts_per_s),
                "baseline_posts_per_s": round2(b.posts_per_s),
                "ratio": round2(ratio(d.posts_per_s, b.posts_per_s)),
                "daemon_frames_per_s": round2(d.frames_per_s),
                "baseline_frames_per_s": round2(b.frames_per_s),
                "daemon_cpu_us_per_frame": round2(d.cpu_us_per_frame),
                "baseline_client_cpu_us_per_frame": round2(b.cpu_us_per_frame),
                "cpu_per_frame_ratio": round2(ratio(d.cpu_us_per_frame, b.cpu_us_per_frame)),
                "daemon_broker_cpu_us_per_frame": round2(d.broker_us_per_frame),
                "baseline_broker_cpu_us_per_frame": round2(b.broker_us_per_frame),
                "broker_cpu_per_frame_ratio": round2(ratio(d.broker_us_per_frame, b.broker_us_per_frame)),
                "bench_cpu_core_share_daemon_run": round3(d.bench_core_share),
                "bench_cpu_core_share_baseline_run": round3(b.bench_core_share),
                "daemon_api_requests_per_post": round2(d.api_per_post),
                "baseline_api_requests_per_post": round2(b.api_per_post),
                "daemon_p50_ms": round2(r.daemon_lat.0),
                "daemon_p99_ms": round2(r.daemon_lat.1),
                "baseline_p50_ms": round2(r.baseline_lat.0),
                "baseline_p99_ms": round2(r.baseline_lat.1),
                "daemon_rss_peak_mb": round2(r.rss_mb),
                "complete": r.complete,
                "targets_met": targets.json(),
                "runs": r.runs.iter().map(|run| json!({
                    "daemon": run.daemon.json(),
                    "baseline": run.baseline.json(),
                    "daemon_p50_ms": round2(run.daemon_lat.0),
                    "daemon_p99_ms": round2(run.daemon_lat.1),
                    "baseline_p50_ms": round2(run.baseline_lat.0),
                    "baseline_p99_ms": round2(run.baseline_lat.1),
                    "loadavg": run.loadavg,
                })).collect::<Vec<_>>(),
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
            "{:>7} | {:>9.1} {:>9.1} {:>5.2} | {:>8.0} {:>8.0} | {:>7.1} {:>7.1} {:>5.2} | {:>7.1} {:>7.1} {:>5.2} | {:>8.2} {:>8.2} | {:>8.2} {:>8.2} | {:>6.1} | {}",
            r.members,
            d.posts_per_s,
            b.posts_per_s,
            ratio(d.posts_per_s, b.posts_per_s),
            d.frames_per_s,
            b.frames_per_s,
            d.cpu_us_per_frame,
            b.cpu_us_per_frame,
            ratio(d.cpu_us_per_frame, b.cpu_us_per_frame),
            d.broker_us_per_frame,
            b.broker_us_per_frame,
            ratio(d.broker_us_per_frame, b.broker_us_per_frame),
            r.daemon_lat.0,
            r.daemon_lat.1,
            r.baseline_lat.0,
            r.baseline_lat.1,
            r.rss_mb,
            r.complete
        );
        println!("        {}", targets.line(r));
        println!(
            "        this benchmark's own process: {:.1} % of a core in the daemon runs, {:.1} % in the raw runs (median)",
            d.bench_core_share * 100.0,
            b.bench_core_share * 100.0
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

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Publishes one post with its id as `Nats-Msg-Id`; returns its ack.
async fn post(
    insp: &Inspector,
    sender: &Agent,
    channel: &str,
    id: &str,
) -> Result<PublishAckFuture, String> {
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
        .map_err(err)
}

/// The fewest messages per subject CHAT (per sender and channel), INBOX and DLV (per member
/// lifecycle) keep, discarding the oldest beyond it, as the broker has their configuration: a
/// run stays within it, so nothing is discarded.
async fn retained_per_subject(insp: &Inspector) -> Result<usize, String> {
    let mut fewest = usize::MAX;
    for name in [
        insp.names.chat_stream(),
        insp.names.inbox_stream(),
        insp.names.dlv_stream(),
    ] {
        let info = insp
            .js
            .get_stream_no_info(&name)
            .await
            .map_err(err)?
            .get_info()
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        let per_subject = info.config.max_messages_per_subject;
        if per_subject > 0 {
            fewest = fewest.min(per_subject as usize);
        }
    }
    Ok(fewest)
}

/// Purges CHAT, INBOX and DLV (consumers move past what was purged).
pub(crate) async fn purge(insp: &Inspector) -> Result<(), String> {
    for name in [
        insp.names.chat_stream(),
        insp.names.inbox_stream(),
        insp.names.dlv_stream(),
    ] {
        let s = insp.js.get_stream_no_info(&name).await.map_err(err)?;
        s.purge().await.map_err(|e| format!("purge {name}: {e}"))?;
    }
    Ok(())
}

/// JetStream API requests of the space's account, as the broker routes them.
pub(crate) struct ApiCount(Arc<AtomicU64>);

impl ApiCount {
    fn load(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Counts the space account's JetStream API requests (a core subscription on `$JS.API.>`: the
/// daemon's reads and pulls, or the raw client's pulls), leaving out the benchmark's own (their
/// replies go to its connection's inbox prefix): its DLV polls are not the pipeline's.
pub(crate) async fn count_api_requests(insp: &Inspector) -> Result<ApiCount, String> {
    let count = Arc::new(AtomicU64::new(0));
    let own = insp.client.new_inbox();
    let own = own
        .split_once('.')
        .map(|(prefix, _)| format!("{prefix}."))
        .unwrap_or(own);
    let mut sub = insp.client.subscribe("$JS.API.>").await.map_err(err)?;
    let c = count.clone();
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            if !m
                .reply
                .as_ref()
                .is_some_and(|r| r.starts_with(own.as_str()))
            {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    Ok(ApiCount(count))
}

/// `VmHWM` (peak resident set) of `pid` in kB, 0 if unreadable.
fn peak_rss_kb(pid: u32) -> u64 {
    measure::status_kb(pid, "VmHWM:")
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
        .map_err(err)?;
    d.wait_for_line("delivery daemon up", Duration::from_secs(30))
        .await
        .map_err(err)?;
    // For a profiler to attach to (`perf record -g -p <pid>`).
    eprintln!("bench-fanout: daemon pid {}", d.pid());
    Ok((d, port))
}

async fn stop(d: &mut Daemon) {
    let _ = d.terminate();
    let _ = d.wait_exit(Duration::from_secs(15)).await;
}
