//! `smoke bench-scale`: what the daemon costs as the space grows (issue 32), every point on the
//! release build and a broker (or 3-node R3 cluster, `--cluster`) of its own, started fresh for
//! the point: a broker that carried the earlier points' purged rows idled higher with every
//! point, and the largest point is measured last (docs/performance.md). `--shared-broker`
//! measures every point on one broker as before.
//!
//! A point is a space of bulk agents (each with its ACL row and a presence row) joined durably
//! to bulk channels (`space.rs`), written straight into the buckets (after the last point's are
//! wiped, on a shared broker). The points lie on three axes that each move one size and hold the others:
//!
//! - **rows**: 1,000 → 10,000 → 100,000 members rows (agents = rows / 10 joined to 10 channels
//!   each, channels = rows / 100: everything grows together);
//! - **agents**: 100 → 1,000 → 10,000 agents at 10,000 rows over 100 channels (100 → 10 → 1
//!   joins each);
//! - **channels**: 10 → 100 → 1,000 channels at 10,000 rows of 1,000 agents (10 joins each;
//!   1,000 → 100 → 10 members per channel).
//!
//! A point shared by axes is measured once. Per point, with a fresh daemon (`point.rs`): start
//! to serving, settle, idle broker messages and CPU, RSS, the feed's sweep, the answer times of
//! `lifecycleMemberships`, `pending` and `members`, CPU per frame of a fixed workload. After the
//! points, with the largest rows point's registry in place: the backlog drain (`backlog.rs`),
//! one large channel against the raw pipeline (`channel.rs`) and a burst of joins at once
//! (`burst.rs`).
//!
//! The targets (docs/performance.md) compare the largest point of an axis with its smallest;
//! they are judged here, in the benchmark, never in a timed test.

mod backlog;
mod burst;
mod channel;
mod point;
mod space;
mod targets;

use std::time::Duration;

use cotal_delivery::inspect::{InspectConfig, Inspector as InspectView};
use cotal_delivery::provision::{MintOptions, STANDING_TTL};
use cotal_delivery::wire::Principal;
use delivery_harness::rig::manager::Manager;
use delivery_harness::rig::mesh::{Inspector, Mesh};
use serde_json::json;

use crate::bench_fanout::measure::loadavg;
use space::Shape;

#[derive(clap::Args)]
pub struct Args {
    /// Axes to measure, comma-separated: rows, agents, channels.
    #[arg(long, value_delimiter = ',', default_value = "rows,agents,channels")]
    axes: Vec<String>,
    /// Members-registry rows of the rows axis (agents = rows / 10, channels = rows / 100).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    rows: Vec<usize>,
    /// Agents of the agents axis (at --axis-rows rows over --axis-channels channels).
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    agents: Vec<usize>,
    /// Channels of the channels axis (at --axis-rows rows of --axis-agents agents).
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    channels: Vec<usize>,
    /// Rows the agents and channels axes hold.
    #[arg(long, default_value_t = 10_000)]
    axis_rows: usize,
    /// Agents the channels axis holds.
    #[arg(long, default_value_t = 1_000)]
    axis_agents: usize,
    /// Channels the agents axis holds.
    #[arg(long, default_value_t = 100)]
    axis_channels: usize,
    /// Seconds of the idle window of each point (figures are scaled to a minute). The window
    /// opens once the point's presence rows have expired (up to the bucket's 6 s after they
    /// were written), so their removal is not counted as idle work.
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
    /// points (0: none), against the raw pipeline draining as many; 500 per member, under the
    /// per-subject retention.
    #[arg(long, default_value_t = 100_000)]
    backlog: usize,
    /// Members of the large channel measured against the raw pipeline (0: none) ...
    #[arg(long, default_value_t = 10_000)]
    large_channel: usize,
    /// ... and posts of each of its runs (published at once after a warm-up post).
    #[arg(long, default_value_t = 20)]
    large_posts: usize,
    /// Members of the channel the large one is compared with, and posts of each of its runs.
    #[arg(long, default_value_t = 100)]
    small_channel: usize,
    #[arg(long, default_value_t = 500)]
    small_posts: usize,
    /// Runs of each channel and side (the median of each figure is reported).
    #[arg(long, default_value_t = 3)]
    channel_runs: usize,
    /// Durable joins sent to the daemon at once, each by an agent of its own (0: none).
    #[arg(long, default_value_t = 10_000)]
    burst: usize,
    /// Every point on a 3-node loopback JetStream cluster with every stream at R3.
    #[arg(long)]
    cluster: bool,
    /// Measure every point on one broker (or cluster) started once, each point's rows purged
    /// before the next, instead of a fresh broker per point. The broker then carries every
    /// earlier point's history (purged blocks, deleted consumers), which raises its idle CPU
    /// as the run goes on, and the largest point is always measured last.
    #[arg(long)]
    shared_broker: bool,
    /// One JSON object per point (and per part after them) instead of the table.
    #[arg(long)]
    json: bool,
}

/// Channels each agent of the rows axis joins; members per channel there is rows / channels.
const ROWS_AXIS_JOINS: usize = 10;
const ROWS_AXIS_MEMBERS_PER_CHANNEL: usize = 100;

/// Exit 0 when every part completed, 2 when a part lost or duplicated something (the large
/// channel's frames, the burst's joins), 1 when the run itself failed. A missed target does not
/// change it: the targets are the benchmark's, not a gate.
pub async fn run(args: Args) -> i32 {
    match bench(args).await {
        Ok(true) => 0,
        Ok(false) => 2,
        Err(e) => {
            eprintln!("bench-scale: {e}");
            1
        }
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// An axis and where its points lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Rows,
    Agents,
    Channels,
}

impl Axis {
    fn parse(s: &str) -> Result<Axis, String> {
        match s {
            "rows" => Ok(Axis::Rows),
            "agents" => Ok(Axis::Agents),
            "channels" => Ok(Axis::Channels),
            other => Err(format!("--axes: {other:?} is not rows, agents or channels")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Axis::Rows => "rows",
            Axis::Agents => "agents",
            Axis::Channels => "channels",
        }
    }

    /// The size this axis moves, of `shape`.
    pub fn size(self, shape: &Shape) -> usize {
        match self {
            Axis::Rows => shape.rows(),
            Axis::Agents => shape.agents,
            Axis::Channels => shape.channels,
        }
    }

    /// The shapes of this axis.
    fn shapes(self, args: &Args) -> Vec<Shape> {
        match self {
            Axis::Rows => args
                .rows
                .iter()
                .map(|&r| Shape {
                    agents: r / ROWS_AXIS_JOINS,
                    channels: (r / ROWS_AXIS_MEMBERS_PER_CHANNEL).max(ROWS_AXIS_JOINS),
                    joins: ROWS_AXIS_JOINS,
                })
                .collect(),
            Axis::Agents => args
                .agents
                .iter()
                .map(|&a| Shape {
                    agents: a,
                    channels: args.axis_channels,
                    joins: args.axis_rows / a.max(1),
                })
                .collect(),
            Axis::Channels => args
                .channels
                .iter()
                .map(|&c| Shape {
                    agents: args.axis_agents,
                    channels: c,
                    joins: args.axis_rows / args.axis_agents.max(1),
                })
                .collect(),
        }
    }
}

/// What every part of the run shares.
pub struct Bench {
    pub mesh: Mesh,
    pub insp: Inspector,
    pub manager: Manager,
    pub view: InspectView,
    /// Every broker node's pid.
    pub brokers: Vec<u32>,
    /// "one nats-server" or the cluster's shape, for the progress lines.
    shape_words: String,
    pub args: Args,
}

impl Bench {
    /// A fresh mesh of the space `scale` (one broker or the `--cluster`), its inspector,
    /// manager and inspection view.
    async fn open(args: Args) -> Result<Bench, String> {
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
        let shape_words = if args.cluster {
            format!(
                "a {nodes}-node loopback cluster ({})",
                crate::cluster::replicas(&insp, nodes).await?
            )
        } else {
            "one nats-server".to_string()
        };
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
        Ok(Bench {
            mesh,
            insp,
            manager,
            view,
            brokers,
            shape_words,
            args,
        })
    }

    /// Closes the view and stops the mesh's brokers (by dropping it); gives the arguments back.
    async fn close(self) -> Args {
        let Bench {
            mesh,
            insp,
            manager,
            view,
            args,
            ..
        } = self;
        view.close().await;
        drop((manager, insp));
        drop(mesh);
        args
    }
}

async fn bench(args: Args) -> Result<bool, String> {
    let axes = args
        .axes
        .iter()
        .map(|a| Axis::parse(a))
        .collect::<Result<Vec<_>, _>>()?;
    if args.workload_posts == 0 || args.workload_posts >= 1_000 {
        return Err("--workload-posts: 1 to 999 (the streams keep 1,000 per subject)".into());
    }
    // Every point once, smallest registry first: the largest rows point is measured last, and
    // the backlog, the large channel and the burst run in front of its registry.
    let mut shapes: Vec<(Shape, Vec<Axis>)> = Vec::new();
    for &axis in &axes {
        for shape in axis.shapes(&args) {
            shape.check()?;
            match shapes.iter_mut().find(|(s, _)| *s == shape) {
                Some((_, on)) => on.push(axis),
                None => shapes.push((shape, vec![axis])),
            }
        }
    }
    shapes.sort_by_key(|(s, _)| (s.rows(), s.agents, s.channels));
    if shapes.is_empty() {
        return Err("no point to measure (--axes)".into());
    }

    let mut b = Bench::open(args).await?;
    progress(&format!(
        "{} at {}; {} points on the {} axes{}; idle {} s; workload {} posts at {}/s to {} members; load average {}",
        b.shape_words,
        b.mesh.url(),
        shapes.len(),
        b.args.axes.join(", "),
        if b.args.shared_broker {
            ", every point on this broker"
        } else {
            ", a fresh broker for each point"
        },
        b.args.idle_secs,
        b.args.workload_posts,
        b.args.rate,
        point::WORKLOAD_MEMBERS,
        loadavg()
    ));

    if !b.args.json {
        point::header();
    }
    let mut workload = None;
    let mut points = Vec::new();
    for (i, (shape, on)) in shapes.iter().enumerate() {
        if i > 0 && !b.args.shared_broker {
            // The workload's agents belong to the mesh they joined on.
            workload = None;
            let args = b.close().await;
            b = Bench::open(args).await?;
        }
        let tag = format!("point {}/{} ({})", i + 1, shapes.len(), shape.words());
        let p = point::measure(&b, &tag, *shape, on, &mut workload).await?;
        point::print(&p, &b.args);
        points.push(p);
    }
    let workload = workload.ok_or("no workload")?;
    let last = points.last().cloned().ok_or("no point")?;

    if b.args.backlog > 0 {
        let d = backlog::run(&b, &workload).await?;
        backlog::print(&d, &last, &b.args);
    }
    let mut complete = true;
    if b.args.large_channel > 0 {
        let c = channel::run(&b).await?;
        channel::print(&c, &b.args);
        complete &= c.small.complete && c.large.complete;
    }
    if b.args.burst > 0 {
        let r = burst::run(&b).await?;
        burst::print(&r, &b.args);
        complete &= r.nothing_lost();
    }
    let verdicts = targets::judge(&points, &axes);
    if b.args.json {
        println!("{}", json!({ "targets": targets::json(&verdicts) }));
    } else {
        for line in targets::lines(&verdicts) {
            println!("{line}");
        }
    }
    b.close().await;
    Ok(complete)
}

fn progress(line: &str) {
    eprintln!("bench-scale: {line}");
}

fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `field` (`VmRSS:`, `VmHWM:`) of `pid` in kB, 0 if unreadable.
fn rss_kb(pid: u32, field: &str) -> u64 {
    crate::bench_fanout::measure::status_kb(pid, field)
}

/// Bound on the daemon's start.
const START_BOUND: Duration = Duration::from_secs(120);
