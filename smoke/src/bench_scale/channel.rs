//! One large channel (`--large-channel` members, 10,000 by default) against the raw pipeline,
//! beside a small one (`--small-channel`, 100) measured the same way in the same run, with the
//! largest point's registry in place: the target is the large channel at the small one's CPU
//! per frame ratio to raw.
//!
//! The method is `smoke bench-fanout`'s (`bench_fanout::On::throughput`): a warm-up post, then
//! the run's posts at once; posts/s from the broker's timestamps (first post stored in CHAT →
//! last frame stored in DLV), CPU per frame of the daemon or the raw client and of the broker
//! between the burst and DLV complete, every member holding exactly every post and the last
//! frame of the daemon's shape. The members are written straight into the registry (ACL and
//! member rows, `space.rs`), so both channels are set up alike; the daemon is started (and
//! settled: its caches loaded) before each of its runs, the raw client (`bench_fanout::raw`)
//! runs with the daemon stopped.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use cotal_delivery::wire::{LifecycleUid, Principal};
use delivery_harness::rig::agent;
use serde_json::json;

use super::space::{self, Pipe};
use super::{err, progress, r2, rss_kb, Bench, START_BOUND};
use crate::bench_fanout::measure::loadavg;
use crate::bench_fanout::raw::{RawClient, GENERATION};
use crate::bench_fanout::{count_api_requests, Figures, On};

/// Bound on one run completing in DLV.
const RUN_BOUND: Duration = Duration::from_secs(600);
/// The large channel's CPU per frame ratio to raw at most this many times the small one's
/// ("the same ratio", read with the tolerance of the benchmark's other size targets).
const TARGET_RATIO_OF_RATIOS_MAX: f64 = 1.25;

/// One channel's figures: medians over the runs of each side.
pub struct ChannelRow {
    pub members: usize,
    pub posts: usize,
    pub daemon: Figures,
    pub raw: Figures,
    pub rss_peak_mb: f64,
    pub complete: bool,
    pub loadavg: Vec<String>,
}

impl ChannelRow {
    fn cpu_ratio(&self) -> f64 {
        self.daemon.cpu_us_per_frame / self.raw.cpu_us_per_frame.max(f64::MIN_POSITIVE)
    }
    fn broker_ratio(&self) -> f64 {
        self.daemon.broker_us_per_frame / self.raw.broker_us_per_frame.max(f64::MIN_POSITIVE)
    }
    fn throughput_ratio(&self) -> f64 {
        self.daemon.posts_per_s / self.raw.posts_per_s.max(f64::MIN_POSITIVE)
    }
}

pub struct Channels {
    pub small: ChannelRow,
    pub large: ChannelRow,
}

pub async fn run(b: &Bench) -> Result<Channels, String> {
    let args = &b.args;
    let small = measure(b, "bulk.small", "s", args.small_channel, args.small_posts).await?;
    let large = measure(b, "bulk.large", "l", args.large_channel, args.large_posts).await?;
    Ok(Channels { small, large })
}

async fn measure(
    b: &Bench,
    channel: &str,
    actor: &str,
    members_n: usize,
    posts: usize,
) -> Result<ChannelRow, String> {
    let (mesh, insp) = (&b.mesh, &b.insp);
    if posts == 0 || posts + crate::bench_fanout::WARM_UP_POSTS > 1_000 {
        return Err(format!(
            "{channel}: 1 to 999 posts a run (the streams keep 1,000 per subject)"
        ));
    }
    let t = Instant::now();
    let now = cotal_delivery::base::epoch_ms();
    let mut pipe = Pipe::new(insp);
    let mut members: Vec<(Principal, LifecycleUid)> = Vec::with_capacity(members_n);
    for i in 0..members_n {
        let who = space::bulk_principal(&format!("{actor}{i}"))?;
        let uid = LifecycleUid::generate();
        space::write_lifecycle(&mut pipe, &who, &uid, &[channel.to_string()], false, now).await?;
        members.push((who, uid));
    }
    pipe.settle().await?;
    let (sender, _) = agent::spawn(mesh, insp, &format!("{actor}sender"), &[channel])
        .await
        .map_err(err)?;
    progress(&format!(
        "channel {channel}: {members_n} members written in {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    let suffixes: HashMap<String, String> = members
        .iter()
        .map(|(who, uid)| {
            (
                insp.names.dlv_subject(who, uid),
                format!(":{}:{uid}:{GENERATION}", who.dot_form()),
            )
        })
        .collect();
    let api = count_api_requests(insp).await?;
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
    let on = On {
        api: &api,
        insp,
        chat: &chat,
        dlv: &dlv,
        sender: &sender,
        channel,
        suffixes: &suffixes,
        brokers: &b.brokers,
        posts,
        latency_posts: 0,
        rate: 1,
        bound: RUN_BOUND,
    };
    let (mut daemon_runs, mut raw_runs, mut loads) = (Vec::new(), Vec::new(), Vec::new());
    let mut complete = true;
    let mut rss_kb_peak = 0u64;
    for run in 0..b.args.channel_runs.max(1) {
        crate::bench_fanout::purge(insp).await?;
        let t0 = Instant::now();
        let mut daemon = mesh.deliver(mesh.space()).spawn().map_err(err)?;
        let d = async {
            daemon
                .wait_for_line("delivery daemon up", START_BOUND)
                .await
                .map_err(err)?;
            super::point::settle(daemon.pid(), t0).await?;
            on.throughput(daemon.pid(), &format!("{actor}d{run}")).await
        }
        .await;
        rss_kb_peak = rss_kb_peak.max(rss_kb(daemon.pid(), "VmHWM:"));
        let _ = daemon.terminate();
        let _ = daemon.wait_exit(Duration::from_secs(15)).await;
        let (d, d_ok) = d?;
        crate::bench_fanout::purge(insp).await?;

        let raw = RawClient::start_for(mesh, insp, channel, &members).await?;
        let r = on.throughput(raw.pid(), &format!("{actor}r{run}")).await;
        if !matches!(r, Ok((_, true))) {
            eprintln!(
                "bench-scale: channel {channel}, run {run}: the raw client's run is incomplete; it printed:\n{}",
                raw.transcript()
            );
        }
        raw.stop(insp).await;
        let (r, r_ok) = r?;
        complete &= d_ok && r_ok;
        let load = loadavg();
        progress(&format!(
            "channel {channel} ({members_n} members), run {run}: daemon {:.1} posts/s, {:.1} µs CPU and broker {:.1} µs per frame; raw {:.1} posts/s, {:.1} µs and broker {:.1} µs; this benchmark {:.1} % of a core; complete {}; load average {load}",
            d.posts_per_s, d.cpu_us_per_frame, d.broker_us_per_frame, r.posts_per_s,
            r.cpu_us_per_frame, r.broker_us_per_frame, d.bench_core_share.max(r.bench_core_share) * 100.0,
            d_ok && r_ok
        ));
        daemon_runs.push(d);
        raw_runs.push(r);
        loads.push(load);
    }
    crate::bench_fanout::purge(insp).await?;
    Ok(ChannelRow {
        members: members_n,
        posts,
        daemon: Figures::median(&daemon_runs),
        raw: Figures::median(&raw_runs),
        rss_peak_mb: rss_kb_peak as f64 / 1024.0,
        complete,
        loadavg: loads,
    })
}

pub fn print(c: &Channels, args: &super::Args) {
    let ratio_of_ratios = c.large.cpu_ratio() / c.small.cpu_ratio().max(f64::MIN_POSITIVE);
    let met = ratio_of_ratios <= TARGET_RATIO_OF_RATIOS_MAX;
    if args.json {
        let row = |r: &ChannelRow| {
            json!({
                "members": r.members, "posts": r.posts,
                "daemon_posts_per_s": r2(r.daemon.posts_per_s),
                "raw_posts_per_s": r2(r.raw.posts_per_s),
                "throughput_ratio": r2(r.throughput_ratio()),
                "daemon_frames_per_s": r2(r.daemon.frames_per_s),
                "raw_frames_per_s": r2(r.raw.frames_per_s),
                "daemon_cpu_us_per_frame": r2(r.daemon.cpu_us_per_frame),
                "raw_cpu_us_per_frame": r2(r.raw.cpu_us_per_frame),
                "cpu_per_frame_ratio": r2(r.cpu_ratio()),
                "daemon_broker_cpu_us_per_frame": r2(r.daemon.broker_us_per_frame),
                "raw_broker_cpu_us_per_frame": r2(r.raw.broker_us_per_frame),
                "broker_cpu_per_frame_ratio": r2(r.broker_ratio()),
                "daemon_api_requests_per_post": r2(r.daemon.api_per_post),
                "raw_api_requests_per_post": r2(r.raw.api_per_post),
                "bench_cpu_core_share": r2(r.daemon.bench_core_share.max(r.raw.bench_core_share)),
                "daemon_rss_peak_mb": r2(r.rss_peak_mb),
                "complete": r.complete,
                "loadavg": r.loadavg,
            })
        };
        println!(
            "{}",
            json!({
                "channels": { "small": row(&c.small), "large": row(&c.large) },
                "cpu_ratio_large_over_small": r2(ratio_of_ratios),
                "targets_met": { "large_channel_cpu_ratio_max_1_25_x_small": met },
            })
        );
        return;
    }
    for r in [&c.small, &c.large] {
        println!(
            "channel of {} members ({} posts a run): daemon {:.1} posts/s ({:.0} frames/s), raw {:.1} ({:.0}): {:.2} x; CPU per frame daemon {:.1} µs, raw {:.1} µs: {:.2} x; broker {:.1} / {:.1} µs: {:.2} x; daemon peak RSS {:.1} MB; complete {}",
            r.members, r.posts, r.daemon.posts_per_s, r.daemon.frames_per_s, r.raw.posts_per_s,
            r.raw.frames_per_s, r.throughput_ratio(), r.daemon.cpu_us_per_frame,
            r.raw.cpu_us_per_frame, r.cpu_ratio(), r.daemon.broker_us_per_frame,
            r.raw.broker_us_per_frame, r.broker_ratio(), r.rss_peak_mb, r.complete
        );
    }
    println!(
        "target: the {}-member channel's CPU per frame ratio to raw {:.2} x the {}-member one's (<= {TARGET_RATIO_OF_RATIOS_MAX}): {}",
        c.large.members,
        ratio_of_ratios,
        c.small.members,
        if met { "met" } else { "NOT met" }
    );
}
