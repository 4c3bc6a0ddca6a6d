//! `smoke bench-scale`: what the daemon costs as the space grows (issue 32), every point on the
//! release build and the same broker (or 3-node R3 cluster, `--cluster`) in one run.
//!
//! A point is a members-registry size R: R / 10 agents (each with its ACL row and a presence
//! row) joined durably to 10 channels each, over R / 100 channels, so 1,000 → 10,000 → 100,000
//! rows is 100 → 1,000 → 10,000 agents and 10 → 100 → 1,000 channels. The rows are written
//! straight into the buckets in the daemon's own shapes, pipelined (a window of unacknowledged
//! publishes, [`PROVISION_WINDOW_MESSAGES`]), and points grow on one space: each point adds
//! only its new rows. Per point, with a fresh daemon:
//!
//! - **start to serving**: from the spawn to `delivery daemon up` (the rails bound);
//! - **settle**: until the daemon's CPU falls under [`QUIET_CORE_SHARE`] (its caches loaded);
//! - **idle**: `--idle-secs` with nothing happening: the broker's own `/varz` messages in and
//!   out and the broker's and the daemon's CPU from `/proc`, per minute; RSS at the end;
//! - **sweep**: a connection opened (a CONNECT event) to the next `=feed` heartbeat the feed
//!   writes, less its debounce;
//! - **answers**: `lifecycleMemberships` over the admin rail, `pending` and `members` through
//!   the inspection library with the inspector credential, each the median of `--samples`;
//! - **workload**: `--workload-posts` posts at `--rate` posts/s to one channel of 10 durable
//!   members (joined through the daemon at the first point), the rest of the space idle: the
//!   daemon's and the broker's CPU per delivered frame, and the daemon's peak RSS.
//!
//! The targets (docs/performance.md) compare the largest point with the smallest; they are
//! judged here, in the benchmark, never in a timed test.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::stream::Stream;
use async_nats::HeaderMap;
use cotal_delivery::agent::Agent;
use cotal_delivery::inspect::{InspectConfig, Inspector as InspectView};
use cotal_delivery::provision::{AgentMaterial, MintOptions, STANDING_TTL};
use cotal_delivery::wire::{AclRecord, LifecycleUid, Principal, SpaceNames};
use delivery_harness::agent;
use delivery_harness::manager::{Manager, Outcome};
use delivery_harness::mesh::{Inspector, Mesh};
use serde_json::{json, Value};

use crate::bench_fanout::measure::{loadavg, CpuMark};

#[derive(clap::Args)]
pub struct Args {
    /// Members-registry rows of each point, comma-separated (agents = rows / 10, channels =
    /// rows / 100).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    points: Vec<usize>,
    /// Seconds of the idle window of each point (figures are scaled to a minute).
    #[arg(long, default_value_t = 30)]
    idle_secs: u64,
    /// Posts of the fixed workload (to one channel of 10 members), at most the 1,000 per
    /// subject the streams keep.
    #[arg(long, default_value_t = 500)]
    workload_posts: usize,
    /// Posting rate of the fixed workload, posts/s.
    #[arg(long, default_value_t = 50)]
    rate: u64,
    /// Samples of each answer time (the median is reported).
    #[arg(long, default_value_t = 3)]
    samples: usize,
    /// INBOX entries pending for offline members that a restarted daemon drains after the
    /// last point (0: none), against the raw pipeline draining as many; [`BACKLOG_PER_MEMBER`]
    /// per member, under the per-subject retention.
    #[arg(long, default_value_t = 100_000)]
    backlog: usize,
    /// Every point on a 3-node loopback JetStream cluster with every stream at R3.
    #[arg(long)]
    cluster: bool,
    /// One JSON object per point instead of the table.
    #[arg(long)]
    json: bool,
}

/// Channels each bulk agent is joined to durably.
const CHANNELS_PER_AGENT: usize = 10;
/// Members per bulk channel (rows / channels).
const MEMBERS_PER_CHANNEL: usize = 100;
/// Members of the workload channel.
const WORKLOAD_MEMBERS: usize = 10;
const WORKLOAD_CHANNEL: &str = "workload";
/// Publishes of the provisioning kept unacknowledged at once.
const PROVISION_WINDOW_MESSAGES: usize = 2_000;
/// The daemon counts as settled when its CPU over [`QUIET_SAMPLE`] is under this share of a
/// core ...
const QUIET_CORE_SHARE: f64 = 0.05;
const QUIET_SAMPLE: Duration = Duration::from_secs(1);
/// ... or when this bound passed first (said in the row).
const SETTLE_BOUND: Duration = Duration::from_secs(120);
/// Bound on the daemon's start, one answer, and the workload's frames.
const START_BOUND: Duration = Duration::from_secs(120);
const ANSWER_BOUND: Duration = Duration::from_secs(60);
const WORKLOAD_BOUND: Duration = Duration::from_secs(300);
/// Entries of the backlog per member (INBOX keeps 1,000 per subject).
const BACKLOG_PER_MEMBER: usize = 500;
const BACKLOG_CHANNEL: &str = "backlog";
/// How often the drain's progress (DLV's message count) and the daemon's RSS are read.
const DRAIN_POLL: Duration = Duration::from_millis(50);
/// Bound on a drain.
const DRAIN_BOUND: Duration = Duration::from_secs(600);
/// How often the feed's heartbeat row is read while a sweep is timed.
const HEARTBEAT_POLL: Duration = Duration::from_millis(10);
/// The feed's debounce (`space::feed::DEBOUNCE`), taken off a timed sweep.
const FEED_DEBOUNCE: Duration = cotal_delivery::space::DEBOUNCE;

// Targets (issue 32), the largest point against the smallest.
/// Idle broker messages and CPU per minute: "independent of the rows", read as at most this
/// ratio (the broker's own background work is noisy at a few percent).
const TARGET_IDLE_RATIO_MAX: f64 = 1.25;
/// Daemon CPU per frame of the fixed workload.
const TARGET_CPU_PER_FRAME_RATIO_MAX: f64 = 1.25;
/// RSS growth per members row, bytes.
const TARGET_RSS_PER_ROW_MAX_BYTES: f64 = 1024.0;
/// Peak RSS at the largest point, MB.
const TARGET_PEAK_RSS_MAX_MB: f64 = 128.0;
/// Start to serving, ms.
const TARGET_SERVING_MAX_MS: f64 = 10_000.0;
/// Inventories and inspection answered within, ms.
const TARGET_ANSWER_MAX_MS: f64 = 1_000.0;
/// The daemon's drain of a backlog at least this share of the raw pipeline's rate ...
const TARGET_DRAIN_RATIO_MIN: f64 = 0.7;
/// ... with its RSS during the drain at most this many times its idle RSS at the last point.
const TARGET_DRAIN_RSS_RATIO_MAX: f64 = 1.25;

pub async fn run(args: Args) -> i32 {
    match bench(args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("bench-scale: {e}");
            1
        }
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// One point's figures.
#[derive(Default, Clone)]
struct Point {
    rows: usize,
    agents: usize,
    channels: usize,
    provision_s: f64,
    serving_ms: f64,
    settle_ms: f64,
    settled: bool,
    idle_in_per_min: f64,
    idle_out_per_min: f64,
    idle_broker_cpu_pct: f64,
    idle_daemon_cpu_pct: f64,
    rss_idle_mb: f64,
    sweep_ms: f64,
    inventory_ms: f64,
    pending_ms: f64,
    members_ms: f64,
    frames: usize,
    daemon_us_per_frame: f64,
    broker_us_per_frame: f64,
    rss_peak_mb: f64,
}

impl Point {
    fn json(&self, cluster: bool) -> Value {
        json!({
            "rows": self.rows, "agents": self.agents, "channels": self.channels, "cluster": cluster,
            "provision_s": r2(self.provision_s),
            "start_to_serving_ms": r2(self.serving_ms),
            "settle_ms": r2(self.settle_ms), "settled": self.settled,
            "idle_broker_msgs_in_per_min": r2(self.idle_in_per_min),
            "idle_broker_msgs_out_per_min": r2(self.idle_out_per_min),
            "idle_broker_cpu_pct_of_core": r2(self.idle_broker_cpu_pct),
            "idle_daemon_cpu_pct_of_core": r2(self.idle_daemon_cpu_pct),
            "rss_idle_mb": r2(self.rss_idle_mb),
            "feed_sweep_ms": r2(self.sweep_ms),
            "lifecycle_memberships_ms": r2(self.inventory_ms),
            "pending_ms": r2(self.pending_ms),
            "members_ms": r2(self.members_ms),
            "workload_frames": self.frames,
            "daemon_cpu_us_per_frame": r2(self.daemon_us_per_frame),
            "broker_cpu_us_per_frame": r2(self.broker_us_per_frame),
            "rss_peak_mb": r2(self.rss_peak_mb),
            "loadavg": loadavg(),
        })
    }
}

/// The space's fixed parts: the workload channel's members and sender.
struct Workload {
    sender: Agent,
    members: Vec<AgentMaterial>,
}

async fn bench(args: Args) -> Result<(), String> {
    if args.points.is_empty() || args.points.iter().any(|&r| r < MEMBERS_PER_CHANNEL) {
        return Err(format!(
            "--points: each point is at least {MEMBERS_PER_CHANNEL} rows"
        ));
    }
    if args.workload_posts == 0 || args.workload_posts >= 1_000 {
        return Err("--workload-posts: 1 to 999 (the streams keep 1,000 per subject)".into());
    }
    let nodes = crate::cluster::nodes(args.cluster);
    let mesh = Mesh::builder()
        .space("scale")
        .map_err(err)?
        .cluster(nodes)
        .start()
        .await
        .map_err(err)?;
    let insp = mesh
        .inspector_with(mesh.space(), MintOptions::new().expires_in(STANDING_TTL))
        .await
        .map_err(err)?;
    let shape = if args.cluster {
        format!(
            "a {nodes}-node loopback cluster ({})",
            crate::cluster::replicas(&insp, nodes).await?
        )
    } else {
        "one nats-server".to_string()
    };
    progress(&format!(
        "{shape} at {}; points {:?} rows; idle {} s; workload {} posts at {}/s to {WORKLOAD_MEMBERS} members; load average {}",
        mesh.url(),
        args.points,
        args.idle_secs,
        args.workload_posts,
        args.rate,
        loadavg()
    ));
    let brokers: Vec<u32> = (0..mesh.node_count())
        .filter_map(|i| mesh.node(i).map(|b| b.pid()))
        .collect();
    let manager = Manager::connect(
        &mesh,
        mesh.space(),
        &Principal::new("local", "scale_manager").map_err(err)?,
    )
    .await
    .map_err(err)?;
    let view = InspectView::open(&InspectConfig {
        space: mesh.space().clone(),
        root: mesh.root().to_path_buf(),
        server: Some(mesh.url()),
        tls_ca: mesh.tls_ca(),
    })
    .await
    .map_err(err)?;

    let mut bulk: Vec<(Principal, LifecycleUid)> = Vec::new();
    let mut workload: Option<Workload> = None;
    let mut points = Vec::new();
    if !args.json {
        header();
    }
    for (i, &rows) in args.points.iter().enumerate() {
        let agents = rows / CHANNELS_PER_AGENT;
        let channels = (rows / MEMBERS_PER_CHANNEL).max(CHANNELS_PER_AGENT);
        let tag = format!("point {}/{} ({rows} rows)", i + 1, args.points.len());
        let t0 = Instant::now();
        let added = provision(&insp, &mut bulk, agents, channels).await?;
        let provision_s = t0.elapsed().as_secs_f64();
        progress(&format!(
            "{tag}: {added} agents added ({} in all, {channels} channels) in {provision_s:.1} s",
            bulk.len()
        ));

        let t0 = Instant::now();
        let mut daemon = mesh.deliver(mesh.space()).spawn().map_err(err)?;
        daemon
            .wait_for_line("delivery daemon up", START_BOUND)
            .await
            .map_err(err)?;
        let serving_ms = t0.elapsed().as_secs_f64() * 1e3;
        if workload.is_none() {
            workload = Some(join_workload(&mesh, &insp).await?);
        }
        let (settle_ms, settled) = settle(daemon.pid(), t0).await?;
        progress(&format!(
            "{tag}: serving {serving_ms:.0} ms after the spawn, settled at {settle_ms:.0} ms{}",
            if settled {
                ""
            } else {
                " (NOT settled: the bound passed)"
            }
        ));

        let mut p = Point {
            rows,
            agents: bulk.len(),
            channels,
            provision_s,
            serving_ms,
            settle_ms,
            settled,
            ..Point::default()
        };
        idle(&mesh, &brokers, daemon.pid(), &args, &mut p).await?;
        p.rss_idle_mb = rss_kb(daemon.pid(), "VmRSS:") as f64 / 1024.0;
        progress(&format!(
            "{tag}: idle {:.0} msgs in / {:.0} out per minute at the broker, broker {:.2} % and daemon {:.2} % of a core, RSS {:.1} MB",
            p.idle_in_per_min, p.idle_out_per_min, p.idle_broker_cpu_pct, p.idle_daemon_cpu_pct, p.rss_idle_mb
        ));

        p.sweep_ms = median_of(args.samples, || sweep_ms(&mesh, &insp)).await?;
        let mut next = 0usize;
        p.inventory_ms = median_of(args.samples, || {
            // A different lifecycle each time: an inventory fences the one it reads.
            let (who, uid) = bulk[(i * args.samples + next) % bulk.len()].clone();
            next += 1;
            let m = &manager;
            async move {
                let t = Instant::now();
                match m.inventory(&who, &uid, ANSWER_BOUND).await {
                    Outcome::Answered(v)
                        if v["memberships"]
                            .as_array()
                            .is_some_and(|a| a.len() == CHANNELS_PER_AGENT) =>
                    {
                        Ok(t.elapsed().as_secs_f64() * 1e3)
                    }
                    other => Err(format!("lifecycleMemberships of {who}: {other:?}")),
                }
            }
        })
        .await?;
        let (who, _) = bulk[bulk.len() / 2].clone();
        p.pending_ms = median_of(args.samples, || async {
            let t = Instant::now();
            cotal_delivery::inspect::pending(&view, &who)
                .await
                .map_err(err)?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        })
        .await?;
        let channel = format!("ch{}", channels / 2);
        p.members_ms = median_of(args.samples, || async {
            let t = Instant::now();
            let got = cotal_delivery::inspect::members(&view, &channel)
                .await
                .map_err(err)?;
            if got.members.is_empty() {
                return Err(format!("members {channel}: no row"));
            }
            Ok(t.elapsed().as_secs_f64() * 1e3)
        })
        .await?;
        progress(&format!(
            "{tag}: feed sweep {:.1} ms; lifecycleMemberships {:.1} ms, pending {:.1} ms, members {:.1} ms",
            p.sweep_ms, p.inventory_ms, p.pending_ms, p.members_ms
        ));

        let w = workload.as_ref().ok_or("no workload")?;
        run_workload(&insp, w, &brokers, daemon.pid(), &args, &mut p).await?;
        p.rss_peak_mb = rss_kb(daemon.pid(), "VmHWM:") as f64 / 1024.0;
        progress(&format!(
            "{tag}: workload {} frames, daemon {:.1} µs and broker {:.1} µs CPU per frame, peak RSS {:.1} MB",
            p.frames, p.daemon_us_per_frame, p.broker_us_per_frame, p.rss_peak_mb
        ));
        let _ = daemon.terminate();
        let _ = daemon.wait_exit(Duration::from_secs(15)).await;
        crate::bench_fanout::purge(&insp).await?;
        print_point(&p, &args);
        points.push(p);
    }
    view.close().await;
    let drain = if args.backlog > 0 {
        let w = workload.as_ref().ok_or("no workload")?;
        Some(backlog(&mesh, &insp, w, &brokers, &args).await?)
    } else {
        None
    };
    if let (Some(d), Some(last)) = (&drain, points.last()) {
        print_drain(d, last, &args);
    }
    if let (Some(small), Some(large)) = (points.first(), points.last()) {
        let t = Targets::of(small, large);
        if args.json {
            println!("{}", json!({ "targets": t.json() }));
        } else {
            for line in t.lines() {
                println!("{line}");
            }
        }
    }
    Ok(())
}

fn progress(line: &str) {
    eprintln!("bench-scale: {line}");
}

fn header() {
    println!(
        "{:>7} {:>6} {:>5} | {:>6} | {:>7} {:>7} | {:>7} {:>7} {:>6} {:>6} | {:>6} {:>6} | {:>7} | {:>7} {:>7} {:>7} | {:>7} {:>7}",
        "rows", "agents", "chans", "prov s", "serve", "settle", "in/min", "out/min", "brk %", "dmn %",
        "RSS id", "peak", "sweep", "inv ms", "pend ms", "memb ms", "d µs/fr", "b µs/fr"
    );
}

fn print_point(p: &Point, args: &Args) {
    if args.json {
        println!("{}", p.json(args.cluster));
        return;
    }
    println!(
        "{:>7} {:>6} {:>5} | {:>6.1} | {:>7.0} {:>7.0} | {:>7.0} {:>7.0} {:>6.2} {:>6.2} | {:>6.1} {:>6.1} | {:>7.1} | {:>7.1} {:>7.1} {:>7.1} | {:>7.1} {:>7.1}",
        p.rows, p.agents, p.channels, p.provision_s, p.serving_ms, p.settle_ms, p.idle_in_per_min,
        p.idle_out_per_min, p.idle_broker_cpu_pct, p.idle_daemon_cpu_pct, p.rss_idle_mb, p.rss_peak_mb,
        p.sweep_ms, p.inventory_ms, p.pending_ms, p.members_ms, p.daemon_us_per_frame, p.broker_us_per_frame
    );
}

/// Adds bulk agents up to `agents`, each with its ACL row, a presence row and
/// [`CHANNELS_PER_AGENT`] durable member rows over `channels` channels, pipelined. Returns how
/// many were added.
async fn provision(
    insp: &Inspector,
    bulk: &mut Vec<(Principal, LifecycleUid)>,
    agents: usize,
    channels: usize,
) -> Result<usize, String> {
    let n = &insp.names;
    let now = cotal_delivery::base::epoch_ms();
    let mut acks: Vec<PublishAckFuture> = Vec::with_capacity(PROVISION_WINDOW_MESSAGES);
    let from = bulk.len();
    for i in from..agents {
        let who = Principal::new("local", &format!("a{i}")).map_err(err)?;
        let uid = LifecycleUid::generate();
        // Spread evenly: agent i joins channels i, i + 1, … (mod channels).
        let joined: Vec<String> = (0..CHANNELS_PER_AGENT)
            .map(|k| format!("ch{}", (i * CHANNELS_PER_AGENT + k) % channels))
            .collect();
        let acl = AclRecord::new(joined.clone(), 1, now);
        let mut writes = vec![(
            kv(&n.acl_bucket(), &SpaceNames::acl_key(&who, &uid)),
            serde_json::to_vec(&acl).map_err(err)?,
        )];
        let presence = json!({"card": {"id": who.dot_form(), "name": who.actor()}, "status": "offline", "ts": now});
        writes.push((
            kv(&n.presence_bucket(), &SpaceNames::presence_key(&who)),
            presence.to_string().into_bytes(),
        ));
        for ch in &joined {
            let row = json!({
                "channel": ch, "owner": who.dot_form(), "lifecycleUid": uid.as_str(),
                "state": "durable-active", "joinCursor": 0, "activated": true, "generation": 1,
                "writerIdentity": "local.bench-scale", "updatedAt": now,
            });
            writes.push((
                kv(&n.members_bucket(), &SpaceNames::member_key(ch, &who, &uid)),
                row.to_string().into_bytes(),
            ));
        }
        for (subject, body) in writes {
            acks.push(
                insp.js
                    .publish_with_headers(subject, HeaderMap::new(), body.into())
                    .await
                    .map_err(err)?,
            );
            if acks.len() >= PROVISION_WINDOW_MESSAGES {
                settle_acks(&mut acks).await?;
            }
        }
        bulk.push((who, uid));
    }
    settle_acks(&mut acks).await?;
    Ok(agents.saturating_sub(from))
}

fn kv(bucket: &str, key: &str) -> String {
    format!("$KV.{bucket}.{key}")
}

async fn settle_acks(acks: &mut Vec<PublishAckFuture>) -> Result<(), String> {
    for r in futures::future::join_all(acks.drain(..).map(|a| a.into_future())).await {
        r.map_err(|e| format!("provisioning write: {e}"))?;
    }
    Ok(())
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
async fn settle(pid: u32, t0: Instant) -> Result<(f64, bool), String> {
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

async fn idle(
    mesh: &Mesh,
    brokers: &[u32],
    pid: u32,
    args: &Args,
    p: &mut Point,
) -> Result<(), String> {
    let (i0, o0) = varz_msgs(mesh).await?;
    let a = CpuMark::take(pid, brokers)?;
    tokio::time::sleep(Duration::from_secs(args.idle_secs.max(1))).await;
    let b = CpuMark::take(pid, brokers)?;
    let (i1, o1) = varz_msgs(mesh).await?;
    let spent = a.spent_until(&b);
    let minutes = spent.wall.as_secs_f64() / 60.0;
    // Each /varz read is an HTTP request, not a message: it does not count itself.
    p.idle_in_per_min = i1.saturating_sub(i0) as f64 / minutes;
    p.idle_out_per_min = o1.saturating_sub(o0) as f64 / minutes;
    p.idle_broker_cpu_pct = spent.brokers.as_secs_f64() / spent.wall.as_secs_f64() * 100.0;
    p.idle_daemon_cpu_pct = spent.side.as_secs_f64() / spent.wall.as_secs_f64() * 100.0;
    Ok(())
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

async fn median_of<F, Fut>(samples: usize, mut f: F) -> Result<f64, String>
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

async fn run_workload(
    insp: &Inspector,
    w: &Workload,
    brokers: &[u32],
    pid: u32,
    args: &Args,
    p: &mut Point,
) -> Result<(), String> {
    let dlv = insp
        .js
        .get_stream_no_info(insp.names.dlv_stream())
        .await
        .map_err(err)?;
    let before = dlv.get_info().await.map_err(err)?.state.messages;
    let want = before + (args.workload_posts * w.members.len()) as u64;
    let a = CpuMark::take(pid, brokers)?;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / args.rate.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut acks = Vec::with_capacity(args.workload_posts);
    for i in 0..args.workload_posts {
        tick.tick().await;
        let id = format!("r{}-{i}", p.rows);
        let msg = w.sender.message(WORKLOAD_CHANNEL, "scale", Some(&id));
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", id.as_str());
        acks.push(
            insp.js
                .publish_with_headers(
                    insp.names
                        .chat_subject(w.sender.principal(), WORKLOAD_CHANNEL),
                    headers,
                    msg.to_string().into(),
                )
                .await
                .map_err(err)?,
        );
    }
    settle_acks(&mut acks).await?;
    let got = crate::bench_fanout::measure::wait_frames(&dlv, want, WORKLOAD_BOUND).await?;
    let b = CpuMark::take(pid, brokers)?;
    if got.is_none() {
        return Err(format!(
            "the workload's {} frames were not all stored within {} s",
            want - before,
            WORKLOAD_BOUND.as_secs()
        ));
    }
    let spent = a.spent_until(&b);
    let frames = (want - before) as usize;
    p.frames = frames;
    p.daemon_us_per_frame = spent.side.as_secs_f64() * 1e6 / frames as f64;
    p.broker_us_per_frame = spent.brokers.as_secs_f64() * 1e6 / frames as f64;
    Ok(())
}

/// `field` (`VmRSS:`, `VmHWM:`) of `pid` in kB, 0 if unreadable.
fn rss_kb(pid: u32, field: &str) -> u64 {
    crate::bench_fanout::measure::status_kb(pid, field)
}

/// A backlog drained by one side.
#[derive(Default, Clone, Copy)]
struct DrainSide {
    secs: f64,
    per_s: f64,
    cpu_us_per_entry: f64,
    broker_us_per_entry: f64,
    rss_first_mb: f64,
    rss_max_mb: f64,
    rss_end_mb: f64,
}

struct Drain {
    entries: usize,
    members: usize,
    write_s: f64,
    daemon: DrainSide,
    raw: DrainSide,
}

/// The backlog's members (ACL row and durable member row on [`BACKLOG_CHANNEL`], written as the
/// bulk agents' are), then the drain: the daemon stopped, `--backlog` entries written into
/// INBOX in the writer's shape, the daemon started in front of them until DLV holds every
/// frame; then INBOX and DLV purged, as many entries again (other ids) and the raw pipeline's
/// frame stage drains them the same way.
async fn backlog(
    mesh: &Mesh,
    insp: &Inspector,
    w: &Workload,
    brokers: &[u32],
    args: &Args,
) -> Result<Drain, String> {
    let n = &insp.names;
    let members_n = args.backlog.div_ceil(BACKLOG_PER_MEMBER);
    let now = cotal_delivery::base::epoch_ms();
    let mut members = Vec::new();
    let mut acks = Vec::new();
    for i in 0..members_n {
        let who = Principal::new("local", &format!("b{i}")).map_err(err)?;
        let uid = LifecycleUid::generate();
        let acl = AclRecord::new(vec![BACKLOG_CHANNEL.to_string()], 1, now);
        let row = json!({
            "channel": BACKLOG_CHANNEL, "owner": who.dot_form(), "lifecycleUid": uid.as_str(),
            "state": "durable-active", "joinCursor": 0, "activated": true, "generation": 1,
            "writerIdentity": "local.bench-scale", "updatedAt": now,
        });
        for (subject, body) in [
            (
                kv(&n.acl_bucket(), &SpaceNames::acl_key(&who, &uid)),
                serde_json::to_vec(&acl).map_err(err)?,
            ),
            (
                kv(
                    &n.members_bucket(),
                    &SpaceNames::member_key(BACKLOG_CHANNEL, &who, &uid),
                ),
                row.to_string().into_bytes(),
            ),
        ] {
            acks.push(
                insp.js
                    .publish_with_headers(subject, HeaderMap::new(), body.into())
                    .await
                    .map_err(err)?,
            );
        }
        members.push((who, uid));
    }
    settle_acks(&mut acks).await?;
    let entries = members_n * BACKLOG_PER_MEMBER;
    let dlv = insp
        .js
        .get_stream_no_info(n.dlv_stream())
        .await
        .map_err(err)?;

    crate::bench_fanout::purge(insp).await?;
    let t = Instant::now();
    write_backlog(insp, w, &members, "a").await?;
    let write_s = t.elapsed().as_secs_f64();
    progress(&format!(
        "backlog: {entries} entries for {members_n} offline members written in {write_s:.1} s; the daemon starts in front of them"
    ));
    let mut daemon = mesh.deliver(mesh.space()).spawn().map_err(err)?;
    daemon
        .wait_for_line("delivery daemon up", START_BOUND)
        .await
        .map_err(err)?;
    let d = drain(&dlv, entries, daemon.pid(), brokers).await;
    let _ = daemon.terminate();
    let _ = daemon.wait_exit(Duration::from_secs(15)).await;
    let d = d?;
    progress(&format!(
        "backlog: the daemon drained {entries} entries in {:.1} s ({:.0}/s), RSS {:.1} -> max {:.1} -> {:.1} MB",
        d.secs, d.per_s, d.rss_first_mb, d.rss_max_mb, d.rss_end_mb
    ));

    crate::bench_fanout::purge(insp).await?;
    write_backlog(insp, w, &members, "b").await?;
    let raw =
        crate::bench_fanout::raw::RawClient::start_draining(mesh, insp, BACKLOG_CHANNEL).await?;
    let r = drain(&dlv, entries, raw.pid(), brokers).await;
    if r.is_err() {
        eprintln!("bench-scale: the raw client printed:\n{}", raw.transcript());
    }
    raw.stop(insp).await;
    let r = r?;
    progress(&format!(
        "backlog: the raw pipeline drained {entries} entries in {:.1} s ({:.0}/s)",
        r.secs, r.per_s
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
    insp: &Inspector,
    w: &Workload,
    members: &[(Principal, LifecycleUid)],
    tag: &str,
) -> Result<(), String> {
    let channel_json = Value::String(BACKLOG_CHANNEL.to_string()).to_string();
    let mut acks = Vec::with_capacity(PROVISION_WINDOW_MESSAGES);
    for j in 0..BACKLOG_PER_MEMBER {
        let id = format!("{tag}{j}");
        let post = w
            .sender
            .message(BACKLOG_CHANNEL, "backlog", Some(&id))
            .to_string();
        // The CHAT sequence the entry names: inside every member's interval (join cursor 0).
        // One body for every member (its type is the publish's payload's, which this crate
        // does not name).
        let body = Into::into(crate::bench_fanout::raw::entry_bytes(
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
            acks.push(
                insp.js
                    .publish_with_headers(
                        insp.names.dinbox_subject(who, uid),
                        h,
                        Clone::clone(&body),
                    )
                    .await
                    .map_err(err)?,
            );
            if acks.len() >= PROVISION_WINDOW_MESSAGES {
                settle_acks(&mut acks).await?;
            }
        }
    }
    settle_acks(&mut acks).await
}

/// Waits until `dlv` holds `frames` messages, reading the side's RSS at every poll: the drain's
/// time and rate (first frame stored to last, broker timestamps), CPU per entry (from this
/// call, the side's start-up included) and RSS.
async fn drain(
    dlv: &Stream<()>,
    frames: usize,
    pid: u32,
    brokers: &[u32],
) -> Result<DrainSide, String> {
    let a = CpuMark::take(pid, brokers)?;
    let t = Instant::now();
    let mut rss: Vec<u64> = Vec::new();
    loop {
        rss.push(rss_kb(pid, "VmRSS:"));
        let held = dlv.get_info().await.map_err(err)?.state.messages;
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
        cpu_us_per_entry: spent.side.as_secs_f64() * 1e6 / frames as f64,
        broker_us_per_entry: spent.brokers.as_secs_f64() * 1e6 / frames as f64,
        rss_first_mb: mb(rss.first().copied().unwrap_or(0)),
        rss_max_mb: mb(rss.iter().copied().max().unwrap_or(0)),
        rss_end_mb: mb(rss.last().copied().unwrap_or(0)),
    })
}

fn print_drain(d: &Drain, last: &Point, args: &Args) {
    let ratio = d.daemon.per_s / d.raw.per_s.max(f64::MIN_POSITIVE);
    let rss_ratio = d.daemon.rss_max_mb / last.rss_idle_mb.max(f64::MIN_POSITIVE);
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    if args.json {
        let side = |s: &DrainSide| {
            json!({
                "secs": r2(s.secs), "entries_per_s": r2(s.per_s),
                "cpu_us_per_entry": r2(s.cpu_us_per_entry),
                "broker_cpu_us_per_entry": r2(s.broker_us_per_entry),
                "rss_first_mb": r2(s.rss_first_mb), "rss_max_mb": r2(s.rss_max_mb),
                "rss_end_mb": r2(s.rss_end_mb),
            })
        };
        println!(
            "{}",
            json!({
                "backlog": d.entries, "members": d.members, "rows": last.rows,
                "write_s": r2(d.write_s), "daemon": side(&d.daemon), "raw": side(&d.raw),
                "drain_ratio": r2(ratio), "rss_max_over_idle": r2(rss_ratio),
                "targets_met": {
                    "drain_ratio_min_0_7": ratio >= TARGET_DRAIN_RATIO_MIN,
                    "drain_rss_max_1_25_x_idle": rss_ratio <= TARGET_DRAIN_RSS_RATIO_MAX,
                },
            })
        );
        return;
    }
    println!(
        "backlog {} entries ({} members, {} rows, written in {:.1} s): daemon {:.0}/s ({:.1} µs CPU, broker {:.1} µs per entry), raw {:.0}/s ({:.1} µs, broker {:.1} µs); ratio {ratio:.2} (>= {TARGET_DRAIN_RATIO_MIN}) {}; daemon RSS {:.1} -> max {:.1} -> {:.1} MB, max {rss_ratio:.2} x its idle RSS (<= {TARGET_DRAIN_RSS_RATIO_MAX}) {}",
        d.entries, d.members, last.rows, d.write_s, d.daemon.per_s, d.daemon.cpu_us_per_entry,
        d.daemon.broker_us_per_entry, d.raw.per_s, d.raw.cpu_us_per_entry, d.raw.broker_us_per_entry,
        met(ratio >= TARGET_DRAIN_RATIO_MIN), d.daemon.rss_first_mb, d.daemon.rss_max_mb,
        d.daemon.rss_end_mb, met(rss_ratio <= TARGET_DRAIN_RSS_RATIO_MAX)
    );
}

/// Where each target stands, the largest point against the smallest.
struct Targets {
    idle_msgs: f64,
    idle_cpu: f64,
    cpu_per_frame: f64,
    rss_per_row: f64,
    peak_mb: f64,
    serving_ms: f64,
    answer_ms: f64,
}

impl Targets {
    fn of(s: &Point, l: &Point) -> Targets {
        let ratio = |a: f64, b: f64| a / b.max(f64::MIN_POSITIVE);
        let rows = l.rows.saturating_sub(s.rows).max(1) as f64;
        Targets {
            idle_msgs: ratio(
                l.idle_in_per_min + l.idle_out_per_min,
                s.idle_in_per_min + s.idle_out_per_min,
            ),
            idle_cpu: ratio(l.idle_broker_cpu_pct, s.idle_broker_cpu_pct),
            cpu_per_frame: ratio(l.daemon_us_per_frame, s.daemon_us_per_frame),
            rss_per_row: (l.rss_idle_mb - s.rss_idle_mb) * 1024.0 * 1024.0 / rows,
            peak_mb: l.rss_peak_mb,
            serving_ms: l.serving_ms,
            answer_ms: l.inventory_ms.max(l.pending_ms).max(l.members_ms),
        }
    }

    fn verdicts(&self) -> Vec<(&'static str, String, bool)> {
        vec![
            (
                "idle_broker_msgs_ratio_max_1_25",
                format!("idle broker messages {:.2} x", self.idle_msgs),
                self.idle_msgs <= TARGET_IDLE_RATIO_MAX,
            ),
            (
                "idle_broker_cpu_ratio_max_1_25",
                format!("idle broker CPU {:.2} x", self.idle_cpu),
                self.idle_cpu <= TARGET_IDLE_RATIO_MAX,
            ),
            (
                "cpu_per_frame_ratio_max_1_25",
                format!("daemon CPU per frame {:.2} x", self.cpu_per_frame),
                self.cpu_per_frame <= TARGET_CPU_PER_FRAME_RATIO_MAX,
            ),
            (
                "rss_per_row_max_1024_bytes",
                format!("RSS growth {:.0} bytes per row", self.rss_per_row),
                self.rss_per_row <= TARGET_RSS_PER_ROW_MAX_BYTES,
            ),
            (
                "peak_rss_max_128_mb",
                format!("peak RSS {:.1} MB", self.peak_mb),
                self.peak_mb <= TARGET_PEAK_RSS_MAX_MB,
            ),
            (
                "serving_max_10_s",
                format!("serving {:.0} ms after the spawn", self.serving_ms),
                self.serving_ms <= TARGET_SERVING_MAX_MS,
            ),
            (
                "answers_max_1_s",
                format!("slowest answer {:.0} ms", self.answer_ms),
                self.answer_ms <= TARGET_ANSWER_MAX_MS,
            ),
        ]
    }

    fn json(&self) -> Value {
        let mut m = serde_json::Map::new();
        for (k, _, ok) in self.verdicts() {
            m.insert(k.to_string(), json!(ok));
        }
        Value::Object(m)
    }

    fn lines(&self) -> Vec<String> {
        self.verdicts()
            .into_iter()
            .map(|(_, what, ok)| {
                format!(
                    "targets (largest against smallest): {what}: {}",
                    if ok { "met" } else { "NOT met" }
                )
            })
            .collect()
    }
}

fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
