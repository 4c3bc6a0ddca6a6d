//! The backlog drain: `--backlog` INBOX entries pending for offline members, a daemon restarted
//! in front of them (with the largest point's registry in place), against the raw pipeline's
//! frame stage draining as many.
//!
//! The daemon is stopped, the entries written into INBOX in the writer's shape
//! ([`BACKLOG_PER_MEMBER`] per member, under the 1,000 per subject INBOX keeps), and the daemon
//! started until DLV holds every frame; then INBOX and DLV are purged, as many entries written
//! again (other ids) and `bench-fanout`'s raw client drains them with its frame stage (its
//! durable from the INBOX's first entry). The rate is first frame stored → last frame stored
//! (broker timestamps); the whole restart, spawn → last frame, is reported beside it, with
//! where the drain stood at each tenth and the RSS read every [`DRAIN_POLL`].

use std::time::{Duration, Instant};

use async_nats::jetstream::stream::Stream;
use async_nats::HeaderMap;
use bytes::Bytes;
use cotal_delivery::wire::{LifecycleUid, Principal};
use serde_json::{json, Value};

use super::point::{Point, Workload};
use super::space::{self, Pipe};
use super::{err, progress, r2, rss_kb, Bench, START_BOUND};
use crate::bench_fanout::measure::CpuMark;

/// Entries of the backlog per member (INBOX keeps 1,000 per subject).
pub const BACKLOG_PER_MEMBER: usize = 500;
/// How often the drain's progress (DLV's message count) and the side's RSS are read.
const DRAIN_POLL: Duration = Duration::from_millis(50);
/// Bound on a drain.
const DRAIN_BOUND: Duration = Duration::from_secs(600);
/// The daemon's drain at least this share of the raw pipeline's rate ...
const TARGET_DRAIN_RATIO_MIN: f64 = 0.7;
/// ... with its RSS during the drain at most this many times its idle RSS at the last point.
const TARGET_DRAIN_RSS_RATIO_MAX: f64 = 1.25;

/// A backlog drained by one side.
#[derive(Default, Clone)]
pub struct DrainSide {
    /// First frame stored → last frame stored.
    pub secs: f64,
    pub per_s: f64,
    /// The side's process spawned → last frame stored.
    pub restart_secs: f64,
    /// The side's process spawned → first frame stored.
    pub first_frame_ms: f64,
    pub cpu_us_per_entry: f64,
    pub broker_us_per_entry: f64,
    pub rss_first_mb: f64,
    pub rss_max_mb: f64,
    pub rss_end_mb: f64,
    /// Seconds after the spawn at which a tenth, two tenths, … of the frames were stored.
    pub tenths_s: Vec<f64>,
}

pub struct Drain {
    pub entries: usize,
    pub members: usize,
    pub write_s: f64,
    pub daemon: DrainSide,
    pub raw: DrainSide,
}

const CHANNEL: &str = "bulk.backlog";

pub async fn run(b: &Bench, w: &Workload) -> Result<Drain, String> {
    let (mesh, insp) = (&b.mesh, &b.insp);
    let members_n = b.args.backlog.div_ceil(BACKLOG_PER_MEMBER);
    let now = cotal_delivery::base::epoch_ms();
    let mut members = Vec::new();
    let mut pipe = Pipe::new(insp);
    for i in 0..members_n {
        let who = space::bulk_principal(&format!("b{i}"))?;
        let uid = LifecycleUid::generate();
        space::write_lifecycle(&mut pipe, &who, &uid, &[CHANNEL.to_string()], false, now).await?;
        members.push((who, uid));
    }
    pipe.settle().await?;
    let entries = members_n * BACKLOG_PER_MEMBER;
    let dlv = insp
        .js
        .get_stream_no_info(insp.names.dlv_stream())
        .await
        .map_err(err)?;

    crate::bench_fanout::purge(insp).await?;
    let t = Instant::now();
    write_backlog(b, w, &members, "a").await?;
    let write_s = t.elapsed().as_secs_f64();
    progress(&format!(
        "backlog: {entries} entries for {members_n} offline members written in {write_s:.1} s; the daemon starts in front of them"
    ));
    let spawned = Instant::now();
    let mut daemon = mesh.deliver(mesh.space()).spawn().map_err(err)?;
    progress(&format!("backlog: daemon pid {}", daemon.pid()));
    let d = async {
        daemon
            .wait_for_line("delivery daemon up", START_BOUND)
            .await
            .map_err(err)?;
        drain(&dlv, entries, daemon.pid(), &b.brokers, spawned).await
    }
    .await;
    let _ = daemon.terminate();
    let _ = daemon.wait_exit(Duration::from_secs(15)).await;
    let d = d?;
    progress(&format!(
        "backlog: the daemon drained {entries} entries in {:.1} s ({:.0}/s; {:.1} s from its spawn, first frame at {:.0} ms), RSS {:.1} -> max {:.1} -> {:.1} MB; tenths at {:?} s",
        d.secs, d.per_s, d.restart_secs, d.first_frame_ms, d.rss_first_mb, d.rss_max_mb, d.rss_end_mb, d.tenths_s
    ));

    crate::bench_fanout::purge(insp).await?;
    write_backlog(b, w, &members, "b").await?;
    let spawned = Instant::now();
    let raw = crate::bench_fanout::raw::RawClient::start_draining(mesh, insp, CHANNEL).await?;
    let r = drain(&dlv, entries, raw.pid(), &b.brokers, spawned).await;
    if r.is_err() {
        eprintln!("bench-scale: the raw client printed:\n{}", raw.transcript());
    }
    raw.stop(insp).await;
    let r = r?;
    progress(&format!(
        "backlog: the raw pipeline drained {entries} entries in {:.1} s ({:.0}/s; {:.1} s from its spawn); tenths at {:?} s",
        r.secs, r.per_s, r.restart_secs, r.tenths_s
    ));
    crate::bench_fanout::purge(insp).await?;
    Ok(Drain {
        entries,
        members: members_n,
        write_s,
        daemon: d,
        raw: r,
    })
}

/// Writes [`BACKLOG_PER_MEMBER`] entries for each member, as the fan-out writer stores them
/// (`Plane3Entry`, the dedup id `<id>:<o>.<a>:<uid>:1`), ids prefixed with `tag`.
async fn write_backlog(
    b: &Bench,
    w: &Workload,
    members: &[(Principal, LifecycleUid)],
    tag: &str,
) -> Result<(), String> {
    let insp = &b.insp;
    let channel_json = Value::String(CHANNEL.to_string()).to_string();
    let mut pipe = Pipe::new(insp);
    for j in 0..BACKLOG_PER_MEMBER {
        let id = format!("{tag}{j}");
        let post = w.sender.message(CHANNEL, "backlog", Some(&id)).to_string();
        // The CHAT sequence the entry names: inside every member's interval (join cursor 0).
        let body = Bytes::from(crate::bench_fanout::raw::entry_bytes(
            post.as_bytes(),
            &channel_json,
            j as u64 + 1,
        ));
        for (who, uid) in members {
            let mut h = HeaderMap::new();
            h.insert(
                "Nats-Msg-Id",
                format!("{id}:{}:{uid}:1", who.dot_form()).as_str(),
            );
            pipe.put(insp.names.dinbox_subject(who, uid), h, body.clone())
                .await?;
        }
    }
    pipe.settle().await
}

/// Waits until `dlv` holds `frames` messages, reading the side's RSS at every poll: the drain's
/// time and rate (first frame stored to last, broker timestamps), the time from `spawned`, CPU
/// per entry (from this call, the side's start-up included) and RSS.
async fn drain(
    dlv: &Stream<()>,
    frames: usize,
    pid: u32,
    brokers: &[u32],
    spawned: Instant,
) -> Result<DrainSide, String> {
    let spawned_ns = epoch_ns() - spawned.elapsed().as_nanos() as i128;
    let a = CpuMark::take(pid, brokers)?;
    let t = Instant::now();
    let mut rss: Vec<u64> = Vec::new();
    let mut tenths = Vec::new();
    loop {
        rss.push(rss_kb(pid, "VmRSS:"));
        let held = dlv.get_info().await.map_err(err)?.state.messages;
        while tenths.len() < 10 && held as usize * 10 >= frames * (tenths.len() + 1) {
            tenths.push(r2(spawned.elapsed().as_secs_f64()));
        }
        if held >= frames as u64 {
            break;
        }
        if t.elapsed() >= DRAIN_BOUND {
            return Err(format!(
                "a drain stored {held} of {frames} frames within {} s",
                DRAIN_BOUND.as_secs()
            ));
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
    let spent = a.spent_until(&CpuMark::take(pid, brokers)?);
    // The rate from the broker's own timestamps: first frame stored to last frame stored, so
    // neither side's start-up (the daemon's or the raw client's process) is in it.
    let state = dlv.get_info().await.map_err(err)?.state;
    let first = crate::bench_fanout::measure::stored_at_ns(dlv, state.first_sequence).await?;
    let last = crate::bench_fanout::measure::stored_at_ns(dlv, state.last_sequence).await?;
    let secs = ((last - first) as f64 / 1e9).max(1e-6);
    let mb = |kb: u64| kb as f64 / 1024.0;
    Ok(DrainSide {
        secs,
        per_s: frames as f64 / secs.max(1e-9),
        restart_secs: (last - spawned_ns) as f64 / 1e9,
        first_frame_ms: (first - spawned_ns) as f64 / 1e6,
        cpu_us_per_entry: spent.side.as_secs_f64() * 1e6 / frames as f64,
        broker_us_per_entry: spent.brokers.as_secs_f64() * 1e6 / frames as f64,
        rss_first_mb: mb(rss.first().copied().unwrap_or(0)),
        rss_max_mb: mb(rss.iter().copied().max().unwrap_or(0)),
        rss_end_mb: mb(rss.last().copied().unwrap_or(0)),
        tenths_s: tenths,
    })
}

fn epoch_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

pub fn print(d: &Drain, last: &Point, args: &super::Args) {
    let ratio = d.daemon.per_s / d.raw.per_s.max(f64::MIN_POSITIVE);
    let restart_ratio = d.raw.restart_secs / d.daemon.restart_secs.max(f64::MIN_POSITIVE);
    let rss_ratio = d.daemon.rss_max_mb / last.rss_idle_mb.max(f64::MIN_POSITIVE);
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    if args.json {
        let side = |s: &DrainSide| {
            json!({
                "secs": r2(s.secs), "entries_per_s": r2(s.per_s),
                "restart_secs": r2(s.restart_secs), "first_frame_ms": r2(s.first_frame_ms),
                "cpu_us_per_entry": r2(s.cpu_us_per_entry),
                "broker_cpu_us_per_entry": r2(s.broker_us_per_entry),
                "rss_first_mb": r2(s.rss_first_mb), "rss_max_mb": r2(s.rss_max_mb),
                "rss_end_mb": r2(s.rss_end_mb), "tenths_s": s.tenths_s,
            })
        };
        println!(
            "{}",
            json!({
                "backlog": d.entries, "members": d.members, "rows": last.shape().rows(),
                "write_s": r2(d.write_s), "daemon": side(&d.daemon), "raw": side(&d.raw),
                "drain_ratio": r2(ratio), "restart_ratio": r2(restart_ratio),
                "rss_max_over_idle": r2(rss_ratio),
                "targets_met": {
                    "drain_ratio_min_0_7": ratio >= TARGET_DRAIN_RATIO_MIN,
                    "drain_rss_max_1_25_x_idle": rss_ratio <= TARGET_DRAIN_RSS_RATIO_MAX,
                },
            })
        );
        return;
    }
    println!(
        "backlog {} entries ({} members, {} rows, written in {:.1} s): daemon {:.0}/s ({:.1} µs CPU, broker {:.1} µs per entry; {:.1} s from its spawn), raw {:.0}/s ({:.1} µs, broker {:.1} µs; {:.1} s from its spawn); ratio {ratio:.2} (>= {TARGET_DRAIN_RATIO_MIN}) {}, from the spawn {restart_ratio:.2}; daemon RSS {:.1} -> max {:.1} -> {:.1} MB, max {rss_ratio:.2} x its idle RSS (<= {TARGET_DRAIN_RSS_RATIO_MAX}) {}",
        d.entries, d.members, last.shape().rows(), d.write_s, d.daemon.per_s, d.daemon.cpu_us_per_entry,
        d.daemon.broker_us_per_entry, d.daemon.restart_secs, d.raw.per_s, d.raw.cpu_us_per_entry,
        d.raw.broker_us_per_entry, d.raw.restart_secs,
        met(ratio >= TARGET_DRAIN_RATIO_MIN), d.daemon.rss_first_mb, d.daemon.rss_max_mb,
        d.daemon.rss_end_mb, met(rss_ratio <= TARGET_DRAIN_RSS_RATIO_MAX)
    );
}
