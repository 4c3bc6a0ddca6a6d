//! `smoke bench-fanout`: posts/s and post-to-surface latency (p50, p99) of the durable data
//! path for several member counts, next to a raw JetStream baseline measured on the same
//! broker in the same run.
//!
//! Per member count M: M online members join one durable channel and surface from their own
//! `dlv_` durables. Daemon phase: a sender posts P messages through JetStream; the daemon fans
//! each out to INBOX, re-authorizes and hands it to DLV; latency is post-ack time to surface.
//! Baseline phase (daemon stopped): a plain client publishes the same P x M copies straight
//! into the same streams (an INBOX entry and a DLV frame per copy, awaiting every ack); latency
//! is from the start of a post's copies to surface. Throughput is P over the time from the
//! first post to the last surface.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use cotal_delivery::agent::Delivery;
use cotal_delivery::plane::entry::{Plane3DeliveryFrame, Plane3Entry, Reason};
use cotal_delivery::wire::DELIVERY_FRAME_HEADER;
use delivery_harness::agent;
use delivery_harness::daemon::Daemon;
use delivery_harness::mesh::{Inspector, Mesh};

#[derive(clap::Args)]
pub struct Args {
    /// Member counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    members: Vec<usize>,
    /// Posts per member count.
    #[arg(long, default_value_t = 200)]
    posts: usize,
    /// Bound on waiting for every copy to surface, per phase, in seconds.
    #[arg(long, default_value_t = 120)]
    surface_bound_secs: u64,
}

/// Surface times by message id, shared by the members' surfacing tasks.
type Surfaced = Arc<Mutex<HashMap<String, Vec<Instant>>>>;

struct Phase {
    posts_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    copies: usize,
}

pub async fn run(args: Args) -> i32 {
    match bench(args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("bench-fanout: {e}");
            1
        }
    }
}

async fn bench(args: Args) -> Result<(), String> {
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
    println!(
        "bench-fanout: nats-server at {}, {} posts per member count",
        mesh.url(),
        args.posts
    );
    println!(
        "{:>7} | {:>10} {:>9} {:>9} | {:>10} {:>9} {:>9} | {:>8}",
        "members", "daemon p/s", "p50 ms", "p99 ms", "raw p/s", "p50 ms", "p99 ms", "ratio"
    );
    let bound = Duration::from_secs(args.surface_bound_secs);
    for (round, &m) in args.members.iter().enumerate() {
        let channel = format!("bench{round}");
        let mut daemon = start_daemon(&mesh).await?;
        let (sender, _) = agent::spawn(&mesh, &insp, &format!("sender{round}"), &[&channel])
            .await
            .map_err(|e| e.to_string())?;
        let mut deliveries = Vec::new();
        let mut targets = Vec::new();
        for i in 0..m {
            let (a, mat) = agent::spawn(&mesh, &insp, &format!("m{round}_{i}"), &[&channel])
                .await
                .map_err(|e| e.to_string())?;
            a.durable_join(&channel).await.map_err(|e| e.to_string())?;
            deliveries.push(a.bind_delivery().await.map_err(|e| e.to_string())?);
            targets.push((mat, a));
        }
        // Daemon phase.
        let surfaced: Surfaced = Arc::default();
        let tasks = spawn_surfacers(deliveries, surfaced.clone(), "d-", args.posts, bound);
        let mut posted = HashMap::new();
        let start = Instant::now();
        for i in 0..args.posts {
            let id = format!("d-{round}-{i}");
            let msg = sender.message(&channel, "bench", Some(&id));
            sender
                .post(&channel, &msg)
                .await
                .map_err(|e| e.to_string())?;
            posted.insert(id, Instant::now());
        }
        let deliveries = join_surfacers(tasks).await;
        let daemon_phase = measure(&posted, &surfaced, start, args.posts, m)?;
        stop(&mut daemon).await;

        // Baseline phase: the same copies straight into the same streams, no daemon.
        let surfaced: Surfaced = Arc::default();
        let tasks = spawn_surfacers(deliveries, surfaced.clone(), "b-", args.posts, bound);
        let mut posted = HashMap::new();
        let start = Instant::now();
        for i in 0..args.posts {
            let id = format!("b-{round}-{i}");
            let msg = sender.message(&channel, "bench", Some(&id));
            let t0 = Instant::now();
            publish_raw_copies(&insp, &channel, &msg, &targets).await?;
            posted.insert(id, t0);
        }
        let _ = join_surfacers(tasks).await;
        let raw = measure(&posted, &surfaced, start, args.posts, m)?;
        println!(
            "{:>7} | {:>10.1} {:>9.2} {:>9.2} | {:>10.1} {:>9.2} {:>9.2} | {:>7.2}x",
            m,
            daemon_phase.posts_per_s,
            daemon_phase.p50_ms,
            daemon_phase.p99_ms,
            raw.posts_per_s,
            raw.p50_ms,
            raw.p99_ms,
            raw.posts_per_s / daemon_phase.posts_per_s.max(f64::MIN_POSITIVE)
        );
        println!(
            "        copies surfaced: daemon {} / raw {} of {} each; ratio = raw posts/s over daemon posts/s",
            daemon_phase.copies,
            raw.copies,
            args.posts * m
        );
    }
    Ok(())
}

async fn start_daemon(mesh: &Mesh) -> Result<Daemon, String> {
    let mut d = mesh
        .deliver(mesh.space())
        .spawn()
        .map_err(|e| e.to_string())?;
    d.wait_for_line("delivery daemon up", Duration::from_secs(30))
        .await
        .map_err(|e| e.to_string())?;
    Ok(d)
}

async fn stop(d: &mut Daemon) {
    let _ = d.terminate();
    let _ = d.wait_exit(Duration::from_secs(15)).await;
}

type Surfacer = tokio::task::JoinHandle<Delivery>;

fn spawn_surfacers(
    deliveries: Vec<Delivery>,
    surfaced: Surfaced,
    prefix: &'static str,
    want: usize,
    bound: Duration,
) -> Vec<Surfacer> {
    deliveries
        .into_iter()
        .map(|mut d| {
            let surfaced = surfaced.clone();
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + bound;
                let mut got = 0;
                while got < want {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    let r = d
                        .surface(left, |f| {
                            let now = Instant::now();
                            if let Some(id) = f.msg["id"].as_str() {
                                if id.starts_with(prefix) {
                                    got += 1;
                                    if let Ok(mut s) = surfaced.lock() {
                                        s.entry(id.to_string()).or_default().push(now);
                                    }
                                }
                            }
                        })
                        .await;
                    if !matches!(r, Ok(Some(_))) {
                        break;
                    }
                }
                d
            })
        })
        .collect()
}

async fn join_surfacers(tasks: Vec<Surfacer>) -> Vec<Delivery> {
    let mut out = Vec::new();
    for t in tasks {
        if let Ok(d) = t.await {
            out.push(d);
        }
    }
    out
}

/// One INBOX entry and one DLV frame per member, every ack awaited.
async fn publish_raw_copies(
    insp: &Inspector,
    channel: &str,
    msg: &serde_json::Value,
    targets: &[(
        cotal_delivery::provision::agent::AgentMaterial,
        cotal_delivery::agent::Agent,
    )],
) -> Result<(), String> {
    let mut acks = Vec::with_capacity(targets.len() * 2);
    for (mat, _) in targets {
        // seq 0 lies outside every membership interval: a later reader drops these entries.
        let entry = Plane3Entry {
            msg: msg.clone(),
            channel: channel.to_string(),
            seq: 0,
            reason: Reason::DurableChannel,
            generation: 1,
        };
        let frame = Plane3DeliveryFrame::for_entry(&entry);
        let inbox = insp
            .names
            .dinbox_subject(&mat.principal, &mat.lifecycle_uid);
        let dlv = insp.names.dlv_subject(&mat.principal, &mat.lifecycle_uid);
        let body = serde_json::to_vec(&entry).map_err(|e| e.to_string())?;
        acks.push(
            insp.js
                .publish(inbox, body.into())
                .await
                .map_err(|e| e.to_string())?,
        );
        let mut headers = HeaderMap::new();
        headers.insert(DELIVERY_FRAME_HEADER, "1");
        let body = serde_json::to_vec(&frame).map_err(|e| e.to_string())?;
        acks.push(
            insp.js
                .publish_with_headers(dlv, headers, body.into())
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    for a in acks {
        a.await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn measure(
    posted: &HashMap<String, Instant>,
    surfaced: &Surfaced,
    start: Instant,
    posts: usize,
    members: usize,
) -> Result<Phase, String> {
    let s = surfaced.lock().map_err(|_| "poisoned".to_string())?;
    let mut latencies_ms: Vec<f64> = Vec::new();
    let mut last = start;
    for (id, times) in s.iter() {
        let Some(t0) = posted.get(id) else { continue };
        for t in times {
            latencies_ms.push(t.saturating_duration_since(*t0).as_secs_f64() * 1000.0);
            last = last.max(*t);
        }
    }
    let copies = latencies_ms.len();
    if copies < posts * members {
        return Err(format!(
            "only {copies} of {} copies surfaced within the bound",
            posts * members
        ));
    }
    latencies_ms.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| latencies_ms[((copies as f64 - 1.0) * p).round() as usize];
    let elapsed = last.saturating_duration_since(start).as_secs_f64();
    Ok(Phase {
        posts_per_s: posts as f64 / elapsed.max(1e-9),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        copies,
    })
}
