//! One point: its space written, a fresh daemon started in front of it, and measured.
//!
//! - **start to serving**: from the spawn to `delivery daemon up` (the rails bound);
//! - **settle**: until the daemon's CPU falls under [`QUIET_CORE_SHARE`] (its caches loaded);
//! - **idle**: `--idle-secs` with nothing happening, from the moment the point's bulk presence
//!   rows have expired (their expiry is the broker removing one message per bulk agent: the
//!   work of a change, not of the daemon idling): the broker's own `/varz` messages in and out
//!   and the broker's and the daemon's CPU from `/proc`, per minute; RSS at the end;
//! - **sweep**: a connection opened (a CONNECT event) to the next `=feed` heartbeat the feed
//!   writes, less its debounce;
//! - **answers**: `lifecycleMemberships` over the admin rail, `pending` and `members` through
//!   the inspection library with the inspector credential, each the median of `--samples`;
//! - **workload**: `--workload-posts` posts at `--rate` posts/s to one channel of
//!   [`WORKLOAD_MEMBERS`] durable members (joined through the daemon at the first point), the
//!   rest of the space idle: the daemon's and the broker's CPU per delivered frame, and the
//!   daemon's peak RSS.

use std::time::{Duration, Instant};

use async_nats::jetstream::stream::Stream;
use async_nats::HeaderMap;
use cotal_delivery::agent::Agent;
use cotal_delivery::provision::{AgentMaterial, MintOptions};
use cotal_delivery::wire::{LifecycleUid, Principal};
use delivery_harness::rig::agent;
use delivery_harness::rig::manager::AdminAnswer;
use delivery_harness::rig::mesh::{Inspector, Mesh};
use serde_json::{json, Value};

use super::space::{self, Shape};
use super::{err, progress, r2, rss_kb, Axis, Bench, START_BOUND};
use crate::bench_fanout::measure::{loadavg, CpuMark};

/// Members of the workload channel.
pub const WORKLOAD_MEMBERS: usize = 10;
pub const WORKLOAD_CHANNEL: &str = "workload";
/// The daemon counts as settled when its CPU over [`QUIET_SAMPLE`] is under this share of a
/// core ...
const QUIET_CORE_SHARE: f64 = 0.05;
const QUIET_SAMPLE: Duration = Duration::from_secs(1);
/// ... or when this bound passed first (said in the row).
const SETTLE_BOUND: Duration = Duration::from_secs(120);
/// Bound on one answer, and on the workload's frames.
const ANSWER_BOUND: Duration = Duration::from_secs(60);
const WORKLOAD_BOUND: Duration = Duration::from_secs(300);
/// How often the feed's heartbeat row is read while a sweep is timed.
const HEARTBEAT_POLL: Duration = Duration::from_millis(10);
/// The feed's debounce (`space::feed::DEBOUNCE`), taken off a timed sweep.
const FEED_DEBOUNCE: Duration = cotal_delivery::space::DEBOUNCE;
/// How often the presence bucket is asked for a bulk row while the idle window waits for them
/// to expire ...
const EXPIRY_POLL: Duration = Duration::from_millis(100);
/// ... and how long past the bucket's max age it waits at most.
const EXPIRY_SLACK: Duration = Duration::from_secs(10);

/// One point's figures.
#[derive(Default, Clone)]
pub struct Point {
    pub shape: Option<Shape>,
    pub axes: Vec<Axis>,
    /// The pids of the broker nodes the point was measured on.
    pub broker_pids: Vec<u32>,
    pub provision_s: f64,
    pub serving_ms: f64,
    pub settle_ms: f64,
    pub settled: bool,
    pub idle_in_per_min: f64,
    pub idle_out_per_min: f64,
    pub idle_broker_cpu_pct: f64,
    pub idle_daemon_cpu_pct: f64,
    /// Seconds from settled to the idle window's start (the bulk presence rows expiring).
    pub idle_wait_s: f64,
    /// Whether a bulk presence row was still stored when the idle window ended.
    pub idle_presence_left: bool,
    pub rss_idle_mb: f64,
    pub sweep_ms: f64,
    pub inventory_ms: f64,
    pub pending_ms: f64,
    pub members_ms: f64,
    /// Members of the channel `members` was asked about.
    pub members_of_channel: usize,
    pub frames: usize,
    pub daemon_us_per_frame: f64,
    pub broker_us_per_frame: f64,
    pub rss_peak_mb: f64,
    pub loadavg: String,
}

impl Point {
    pub fn shape(&self) -> Shape {
        self.shape.unwrap_or(Shape {
            agents: 0,
            channels: 0,
            joins: 0,
        })
    }

    fn json(&self, cluster: bool) -> Value {
        let s = self.shape();
        json!({
            "rows": s.rows(), "agents": s.agents, "channels": s.channels, "joins_per_agent": s.joins,
            "axes": self.axes.iter().map(|a| a.name()).collect::<Vec<_>>(),
            "broker_pids": self.broker_pids,
            "cluster": cluster,
            "provision_s": r2(self.provision_s),
            "start_to_serving_ms": r2(self.serving_ms),
            "settle_ms": r2(self.settle_ms), "settled": self.settled,
            "idle_broker_msgs_in_per_min": r2(self.idle_in_per_min),
            "idle_broker_msgs_out_per_min": r2(self.idle_out_per_min),
            "idle_broker_cpu_pct_of_core": r2(self.idle_broker_cpu_pct),
            "idle_daemon_cpu_pct_of_core": r2(self.idle_daemon_cpu_pct),
            "idle_wait_s": r2(self.idle_wait_s),
            "idle_presence_left": self.idle_presence_left,
            "rss_idle_mb": r2(self.rss_idle_mb),
            "feed_sweep_ms": r2(self.sweep_ms),
            "lifecycle_memberships_ms": r2(self.inventory_ms),
            "pending_ms": r2(self.pending_ms),
            "members_ms": r2(self.members_ms),
            "members_of_channel": self.members_of_channel,
            "workload_frames": self.frames,
            "daemon_cpu_us_per_frame": r2(self.daemon_us_per_frame),
            "broker_cpu_us_per_frame": r2(self.broker_us_per_frame),
            "rss_peak_mb": r2(self.rss_peak_mb),
            "loadavg": self.loadavg,
        })
    }
}

/// The space's fixed parts: the workload channel's members and sender.
pub struct Workload {
    pub sender: Agent,
    pub members: Vec<AgentMaterial>,
}

/// Writes the point's space (after wiping the last one's), starts a daemon in front of it and
/// measures it; the daemon is stopped and CHAT, INBOX and DLV purged after.
pub async fn measure(
    b: &Bench,
    tag: &str,
    shape: Shape,
    axes: &[Axis],
    workload: &mut Option<Workload>,
) -> Result<Point, String> {
    let (mesh, insp, args) = (&b.mesh, &b.insp, &b.args);
    space::wipe(insp).await?;
    let (bulk, provision_s) = space::provision(insp, shape).await?;
    progress(&format!("{tag}: written in {provision_s:.1} s"));

    let t0 = Instant::now();
    let mut daemon = mesh.deliver(mesh.space()).spawn().map_err(err)?;
    daemon
        .wait_for_line("delivery daemon up", START_BOUND)
        .await
        .map_err(err)?;
    let serving_ms = t0.elapsed().as_secs_f64() * 1e3;
    if workload.is_none() {
        *workload = Some(join_workload(mesh, insp).await?);
    }
    let w = workload.as_ref().ok_or("no workload")?;
    let (settle_ms, settled) = settle(daemon.pid(), t0).await?;
    progress(&format!(
        "{tag}: daemon pid {}, serving {serving_ms:.0} ms after the spawn, settled at {settle_ms:.0} ms{}",
        daemon.pid(),
        if settled {
            ""
        } else {
            " (NOT settled: the bound passed)"
        }
    ));

    let mut p = Point {
        shape: Some(shape),
        axes: axes.to_vec(),
        broker_pids: b.brokers.clone(),
        provision_s,
        serving_ms,
        settle_ms,
        settled,
        ..Point::default()
    };
    idle(b, daemon.pid(), &mut p).await?;
    p.rss_idle_mb = rss_kb(daemon.pid(), "VmRSS:") as f64 / 1024.0;
    progress(&format!(
        "{tag}: idle {:.0} msgs in / {:.0} out per minute at the broker, broker {:.2} % and daemon {:.2} % of a core, RSS {:.1} MB (the window from {:.1} s after it settled, once its presence rows had expired)",
        p.idle_in_per_min, p.idle_out_per_min, p.idle_broker_cpu_pct, p.idle_daemon_cpu_pct, p.rss_idle_mb, p.idle_wait_s
    ));

    p.sweep_ms = median_of(args.samples, || sweep_ms(mesh, insp)).await?;
    answers(b, &bulk, shape, &mut p).await?;
    progress(&format!(
        "{tag}: feed sweep {:.1} ms; lifecycleMemberships {:.1} ms, pending {:.1} ms, members {:.1} ms ({} members)",
        p.sweep_ms, p.inventory_ms, p.pending_ms, p.members_ms, p.members_of_channel
    ));

    run_workload(b, w, daemon.pid(), &mut p).await?;
    p.rss_peak_mb = rss_kb(daemon.pid(), "VmHWM:") as f64 / 1024.0;
    p.loadavg = loadavg();
    progress(&format!(
        "{tag}: workload {} frames, daemon {:.1} µs and broker {:.1} µs CPU per frame, peak RSS {:.1} MB; load average {}",
        p.frames, p.daemon_us_per_frame, p.broker_us_per_frame, p.rss_peak_mb, p.loadavg
    ));
    let _ = daemon.terminate();
    let _ = daemon.wait_exit(Duration::from_secs(15)).await;
    crate::bench_fanout::purge(insp).await?;
    Ok(p)
}

/// `lifecycleMemberships` (a different lifecycle each sample: an inventory fences the one it
/// reads), `pending` of one bulk member and `members` of one bulk channel.
async fn answers(
    b: &Bench,
    bulk: &[(Principal, LifecycleUid)],
    shape: Shape,
    p: &mut Point,
) -> Result<(), String> {
    let samples = b.args.samples;
    let mut next = 0usize;
    p.inventory_ms = median_of(samples, || {
        let (who, uid) = bulk[(next * 7919) % bulk.len()].clone();
        next += 1;
        let m = &b.manager;
        async move {
            let t = Instant::now();
            match m.inventory(&who, &uid, ANSWER_BOUND).await {
                AdminAnswer::Answered(v)
                    if v["memberships"]
                        .as_array()
                        .is_some_and(|a| a.len() == shape.joins) =>
                {
                    Ok(t.elapsed().as_secs_f64() * 1e3)
                }
                other => Err(format!("lifecycleMemberships of {who}: {other:?}")),
            }
        }
    })
    .await?;
    let (who, _) = bulk[bulk.len() / 2].clone();
    p.pending_ms = median_of(samples, || async {
        let t = Instant::now();
        cotal_delivery::inspect::pending(&b.view, &who)
            .await
            .map_err(err)?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    })
    .await?;
    let channel = space::channel(shape.channels / 2);
    p.members_ms = median_of(samples, || async {
        let t = Instant::now();
        let got = cotal_delivery::inspect::members(&b.view, &channel)
            .await
            .map_err(err)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if got.members.len() != shape.members_per_channel() {
            return Err(format!(
                "members {channel}: {} rows, {} written",
                got.members.len(),
                shape.members_per_channel()
            ));
        }
        Ok(ms)
    })
    .await?;
    p.members_of_channel = shape.members_per_channel();
    Ok(())
}

pub fn header() {
    println!(
        "{:>7} {:>6} {:>5} {:>5} {:<14} | {:>6} | {:>6} {:>6} | {:>6} {:>6} {:>5} {:>5} | {:>6} {:>6} | {:>6} | {:>6} {:>6} {:>7} | {:>7} {:>7}",
        "rows", "agents", "chans", "joins", "axes", "prov s", "serve", "settle", "in/min", "out/m", "brk %",
        "dmn %", "RSS id", "peak", "sweep", "inv ms", "pend", "memb ms", "d µs/fr", "b µs/fr"
    );
}

pub fn print(p: &Point, args: &super::Args) {
    if args.json {
        println!("{}", p.json(args.cluster));
        return;
    }
    let s = p.shape();
    let axes: Vec<&str> = p.axes.iter().map(|a| a.name()).collect();
    println!(
        "{:>7} {:>6} {:>5} {:>5} {:<14} | {:>6.1} | {:>6.0} {:>6.0} | {:>6.0} {:>6.0} {:>5.2} {:>5.2} | {:>6.1} {:>6.1} | {:>6.0} | {:>6.1} {:>6.1} {:>7.1} | {:>7.1} {:>7.1}",
        s.rows(), s.agents, s.channels, s.joins, axes.join(","), p.provision_s, p.serving_ms,
        p.settle_ms, p.idle_in_per_min, p.idle_out_per_min, p.idle_broker_cpu_pct,
        p.idle_daemon_cpu_pct, p.rss_idle_mb, p.rss_peak_mb, p.sweep_ms, p.inventory_ms,
        p.pending_ms, p.members_ms, p.daemon_us_per_frame, p.broker_us_per_frame
    );
}

/// The workload channel's members, joined through the daemon, and its sender.
async fn join_workload(mesh: &Mesh, insp: &Inspector) -> Result<Workload, String> {
    let (sender, _) = agent::spawn(mesh, insp, "wsender", &[WORKLOAD_CHANNEL])
        .await
        .map_err(err)?;
    let mut members = Vec::new();
    for i in 0..WORKLOAD_MEMBERS {
        let (a, mat) = agent::spawn(mesh, insp, &format!("w{i}"), &[WORKLOAD_CHANNEL])
            .await
            .map_err(err)?;
        a.durable_join(WORKLOAD_CHANNEL).await.map_err(err)?;
        members.push(mat);
    }
    Ok(Workload { sender, members })
}

/// Waits until the daemon's CPU over [`QUIET_SAMPLE`] is under [`QUIET_CORE_SHARE`]: ms since
/// `t0`, and whether it did within [`SETTLE_BOUND`].
pub async fn settle(pid: u32, t0: Instant) -> Result<(f64, bool), String> {
    let deadline = Instant::now() + SETTLE_BOUND;
    loop {
        let a = CpuMark::take(pid, &[])?;
        tokio::time::sleep(QUIET_SAMPLE).await;
        let spent = a.spent_until(&CpuMark::take(pid, &[])?);
        let share = spent.side.as_secs_f64() / spent.wall.as_secs_f64().max(1e-9);
        let at = t0.elapsed().as_secs_f64() * 1e3;
        if share < QUIET_CORE_SHARE {
            return Ok((at, true));
        }
        if Instant::now() >= deadline {
            return Ok((at, false));
        }
    }
}

/// The broker's messages in and out (every node), from `/varz`.
async fn varz_msgs(mesh: &Mesh) -> Result<(u64, u64), String> {
    let (mut i, mut o) = (0, 0);
    for n in 0..mesh.node_count() {
        let Some(b) = mesh.node(n) else { continue };
        let v = b.varz().await.map_err(err)?;
        i += v["in_msgs"].as_u64().unwrap_or(0);
        o += v["out_msgs"].as_u64().unwrap_or(0);
    }
    Ok((i, o))
}

async fn idle(b: &Bench, pid: u32, p: &mut Point) -> Result<(), String> {
    let waited = Instant::now();
    let presence = bulk_presence(&b.insp).await?;
    while presence.left().await? {
        if waited.elapsed() >= presence.max_age + EXPIRY_SLACK {
            return Err(format!(
                "the point's presence rows were still stored {:.0} s after it settled (the bucket's max age is {} s)",
                waited.elapsed().as_secs_f64(),
                presence.max_age.as_secs()
            ));
        }
        tokio::time::sleep(EXPIRY_POLL).await;
    }
    p.idle_wait_s = waited.elapsed().as_secs_f64();
    let (i0, o0) = varz_msgs(&b.mesh).await?;
    let a = CpuMark::take(pid, &b.brokers)?;
    tokio::time::sleep(Duration::from_secs(b.args.idle_secs.max(1))).await;
    let z = CpuMark::take(pid, &b.brokers)?;
    let (i1, o1) = varz_msgs(&b.mesh).await?;
    let spent = a.spent_until(&z);
    let minutes = spent.wall.as_secs_f64() / 60.0;
    // Each /varz read is an HTTP request, not a message: it does not count itself.
    p.idle_in_per_min = i1.saturating_sub(i0) as f64 / minutes;
    p.idle_out_per_min = o1.saturating_sub(o0) as f64 / minutes;
    p.idle_broker_cpu_pct = spent.brokers.as_secs_f64() / spent.wall.as_secs_f64() * 100.0;
    p.idle_daemon_cpu_pct = spent.side.as_secs_f64() / spent.wall.as_secs_f64() * 100.0;
    p.idle_presence_left = presence.left().await?;
    Ok(())
}

/// The presence bucket's bulk rows: whether any is still stored, and the bucket's max age.
struct BulkPresence {
    stream: Stream,
    filter: String,
    max_age: Duration,
}

async fn bulk_presence(insp: &Inspector) -> Result<BulkPresence, String> {
    let bucket = insp.names.presence_bucket();
    let stream = insp
        .js
        .get_stream(format!("KV_{bucket}"))
        .await
        .map_err(err)?;
    let max_age = stream.cached_info().config.max_age;
    let filter = space::kv(&bucket, &format!("{}.>", space::BULK_OWNER));
    Ok(BulkPresence {
        stream,
        filter,
        max_age,
    })
}

impl BulkPresence {
    /// Whether the broker still stores a bulk presence row (expired rows are removed by the
    /// broker itself, at the bucket's max age).
    async fn left(&self) -> Result<bool, String> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        match self
            .stream
            .get_first_raw_message_by_subject(&self.filter, 1)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(false),
            Err(e) => Err(format!("the presence bucket's bulk rows: {e}")),
        }
    }
}

/// The `=feed` heartbeat's last stored sequence and time (ns).
async fn heartbeat(kv: &Stream<()>, subject: &str) -> Result<(u64, i128), String> {
    let m = kv
        .get_last_raw_message_by_subject(subject)
        .await
        .map_err(|e| format!("the feed's heartbeat: {e}"))?;
    Ok((m.sequence, m.time.unix_timestamp_nanos()))
}

/// A connection opened (its CONNECT event starts a debounced sweep) to the next heartbeat the
/// feed writes, less the debounce: ms.
async fn sweep_ms(mesh: &Mesh, insp: &Inspector) -> Result<f64, String> {
    let bucket = insp.names.membership_bucket();
    let kv = insp
        .js
        .get_stream_no_info(format!("KV_{bucket}"))
        .await
        .map_err(err)?;
    let subject = format!("$KV.{bucket}.=feed");
    let (seq0, _) = heartbeat(&kv, &subject).await?;
    let cred = mesh
        .mint(
            mesh.space(),
            &cotal_delivery::provision::Profile::Inspector,
            MintOptions::new(),
        )
        .map_err(err)?;
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(err)?
        .as_nanos() as i128;
    let probe = mesh
        .connect(&cred, "bench-scale-probe")
        .await
        .map_err(err)?;
    let deadline = Instant::now() + ANSWER_BOUND;
    let result = loop {
        let (seq, at) = heartbeat(&kv, &subject).await?;
        if seq > seq0 {
            let ms = (at - t0) as f64 / 1e6 - FEED_DEBOUNCE.as_secs_f64() * 1e3;
            break Ok(ms.max(0.0));
        }
        if Instant::now() >= deadline {
            break Err("no feed heartbeat after a connect".to_string());
        }
        tokio::time::sleep(HEARTBEAT_POLL).await;
    };
    let _ = probe.drain().await;
    result
}

pub async fn median_of<F, Fut>(samples: usize, mut f: F) -> Result<f64, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<f64, String>>,
{
    let mut v = Vec::new();
    for _ in 0..samples.max(1) {
        v.push(f().await?);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Ok(v[v.len() / 2])
}

/// `--workload-posts` at `--rate` to the workload channel: the daemon's and the broker's CPU
/// per frame until DLV holds every frame.
async fn run_workload(b: &Bench, w: &Workload, pid: u32, p: &mut Point) -> Result<(), String> {
    let (insp, args) = (&b.insp, &b.args);
    let dlv = insp
        .js
        .get_stream_no_info(insp.names.dlv_stream())
        .await
        .map_err(err)?;
    let before = dlv.get_info().await.map_err(err)?.state.messages;
    let want = before + (args.workload_posts * w.members.len()) as u64;
    let a = CpuMark::take(pid, &b.brokers)?;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / args.rate.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut pipe = space::Pipe::new(insp);
    let shape = p.shape();
    for i in 0..args.workload_posts {
        tick.tick().await;
        let id = format!("r{}a{}c{}-{i}", shape.rows(), shape.agents, shape.channels);
        let msg = w.sender.message(WORKLOAD_CHANNEL, "scale", Some(&id));
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", id.as_str());
        pipe.put(
            insp.names
                .chat_subject(w.sender.principal(), WORKLOAD_CHANNEL),
            headers,
            msg.to_string().into_bytes().into(),
        )
        .await?;
    }
    pipe.settle().await?;
    let got = crate::bench_fanout::measure::wait_frames(&dlv, want, WORKLOAD_BOUND).await?;
    let z = CpuMark::take(pid, &b.brokers)?;
    if got.is_none() {
        return Err(format!(
            "the workload's {} frames were not all stored within {} s",
            want - before,
            WORKLOAD_BOUND.as_secs()
        ));
    }
    let spent = a.spent_until(&z);
    let frames = (want - before) as usize;
    p.frames = frames;
    p.daemon_us_per_frame = spent.side.as_secs_f64() * 1e6 / frames as f64;
    p.broker_us_per_frame = spent.brokers.as_secs_f64() * 1e6 / frames as f64;
    Ok(())
}
