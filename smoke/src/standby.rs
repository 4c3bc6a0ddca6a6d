//! `smoke delivery-standby`: two complete `deliver --spaces` hosts for one space on one broker,
//! through the holder-killed, holder-returns and holder-stopped cases, with observed takeover
//! times, what the lease did in each (`lease`: when the row ended, as the broker stamped it, and
//! the standby's answer and first post after that; one create per end), and a durable sender
//! whose every post must reach an offline member's DLV.
//!
//! Why a suite and not only tests: integrators run it before a release to watch takeover happen
//! on their machine. The times are observations on one machine and one broker: not an SLA, and
//! not a test of two physical hosts or of a partition. The proofs of the same takeovers are the
//! cases of `cases/standby/` (`ci/test` runs them, and this suite only on the cluster:
//! `smoke/tests/it/standby_cluster.rs`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use cotal_delivery::agent::Agent;
use cotal_delivery::base::{read_creds_file, ENV_ACK_WAIT_MS, ENV_STANDBY_RETRY_MS};
use cotal_delivery::provision::manifest_path;
use cotal_delivery::provision::Workspace;
use cotal_delivery::provision::DEFAULT_BACKSTOP_MAX_MSGS_PER_SUBJECT;
use cotal_delivery::provision::{prepare_standby_hosts, renew_host_delivery, StandbyPlan};
use cotal_delivery::wire::{Principal, Space};
use delivery_harness::rig::agent;
use delivery_harness::rig::daemon::Daemon;
use delivery_harness::rig::mesh::{Inspector, Mesh};
use delivery_harness::ConnState;

use crate::cluster::CLUSTER_NODES;

mod lease;

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Rounds of each case.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// The lease TTL set at provisioning (the lease bucket's max_age), in seconds.
    #[arg(long, default_value_t = 30)]
    pub lease_ttl_secs: u64,
    /// Lifetime of each host's initial delivery credential, in seconds; the suite replaces it
    /// through each host's store and waits until it has expired while the holder serves.
    #[arg(long, default_value_t = 20)]
    pub initial_creds_secs: u64,
    /// A standby's retry of a held lease, in milliseconds, passed to both hosts as
    /// `COTAL_DELIVERY_STANDBY_RETRY_MS` (5 s by default; shortened only to make the
    /// suite fit in `ci/test`).
    #[arg(long, default_value_t = 5_000)]
    pub standby_retry_ms: u64,
    /// `ack_wait` of the hosts' fan-out and reader durables, in milliseconds, passed to both
    /// hosts as `COTAL_DELIVERY_ACK_WAIT_MS` (unset: the daemon's 5 s). A longer one makes a
    /// post held behind a daemon's closed gate (redelivered only after `ack_wait`) stand out
    /// from the takeover bound; `smoke/tests/it/standby_cluster.rs` uses it so.
    #[arg(long)]
    pub ack_wait_ms: Option<u64>,
    /// Interval of the durable sender, in milliseconds. The sender stops at the offline
    /// member's backstop cap (see `DLV_BUDGET`), so a long run is not cut by the stream's
    /// `max_msgs_per_subject` discarding the oldest copies.
    #[arg(long, default_value_t = 500)]
    pub post_every_ms: u64,
    /// A 3-node loopback JetStream cluster with R3 streams and buckets instead of one broker;
    /// host 1 dials node 1, host 2 node 2 (the suite's own clients node 0), and a fourth case
    /// kills the node the holder is connected to (then restarts it).
    #[arg(long)]
    pub cluster: bool,
    /// One JSON object per case on its own line instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// What one step of a round may take, in s: a host up or standing by, a holder elected, a
/// takeover answered, a mark delivered, a connection gone from the broker, an exit. Generous:
/// the suite runs on whatever machine the integrator has and fails past it, never measures it.
const STEP_BOUND: Duration = Duration::from_secs(120);
/// Pause between two binds of the offline member's DLV that failed (within [`STEP_BOUND`]).
const BIND_RETRY: Duration = Duration::from_millis(500);
const _: () = assert!(BIND_RETRY.as_millis() < STEP_BOUND.as_millis());
/// One ctl.delivery probe's wait for its answer (the takeover resolution is about this).
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
const CASES: [&str; 3] = ["kill", "return", "stop"];
/// The suite's target for the standby's first `ctl.delivery` answer: after a graceful stop,
/// counted from the holder's SIGTERM; after a kill, from the row's expiry as the broker stamped
/// it. A target the run reports against, not a bound it fails on.
const ANSWER_TARGET: Duration = Duration::from_secs(1);
/// Posts the sender may make: the DLV stream keeps at most
/// `DEFAULT_BACKSTOP_MAX_MSGS_PER_SUBJECT` (1000) copies per member and discards the oldest
/// beyond it (a documented bound, not a takeover loss); the rounds' markers share that subject,
/// hence the margin.
const DLV_BUDGET: usize = DEFAULT_BACKSTOP_MAX_MSGS_PER_SUBJECT as usize - 100;
/// The cluster-only case: the broker node the holder is connected to is SIGKILLed.
const NODE_CASE: &str = "node";

pub async fn run(args: Args) -> i32 {
    match suite(args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("delivery-standby: {e}");
            1
        }
    }
}

struct Host {
    root: tempfile::TempDir,
    holder: String,
    /// The delivery nkey, as the broker's `/connz?auth=true` names the connection's user.
    nkey: String,
    /// The URL this host dials (a cluster node's on `--cluster`).
    server: String,
    proc: Option<Daemon>,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The timing overrides every host of the suite is started with.
#[derive(Clone, Copy)]
struct Timing {
    retry: Duration,
    ack_wait: Option<Duration>,
}

fn spawn(mesh: &Mesh, root: &Path, server: &str, timing: Timing) -> Result<Daemon, String> {
    let mut host = mesh
        .host_at(root, server)
        .env(ENV_STANDBY_RETRY_MS, timing.retry.as_millis().to_string());
    if let Some(ack_wait) = timing.ack_wait {
        host = host.env(ENV_ACK_WAIT_MS, ack_wait.as_millis().to_string());
    }
    host.spawn().map_err(err)
}

/// The host's holder name (as its lease row names it) and its delivery nkey.
fn holder_of(root: &Path, space: &Space) -> Result<(String, String), String> {
    let cred = read_creds_file(&Workspace::new(root).delivery_creds_path(space)).map_err(err)?;
    let nkey = cred.public_key().map_err(err)?;
    let holder = Principal::for_nkey(&nkey).map_err(err)?.dot_form();
    Ok((holder, nkey))
}

/// The running node on which a connection of user `nkey` is open (from each node's `/connz`).
async fn node_of(mesh: &mut Mesh, nkey: &str) -> Result<Option<usize>, String> {
    for i in 0..mesh.node_count() {
        let Some(node) = mesh.node_mut(i) else {
            continue;
        };
        if !node.is_running() {
            continue;
        }
        let open = node.connz(ConnState::Open).await.map_err(err)?;
        if open.iter().any(|c| c.user.as_deref() == Some(nkey)) {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// Waits (bounded) until no running node has a connection of user `nkey` open.
async fn gone_from_broker(mesh: &mut Mesh, nkey: &str) -> Result<(), String> {
    let deadline = Instant::now() + STEP_BOUND;
    while node_of(mesh, nkey).await?.is_some() {
        if Instant::now() > deadline {
            return Err(format!(
                "the killed holder's connections still open after {} s",
                STEP_BOUND.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The last `n` lines a host printed (for a failure's message).
fn tail(host: &Host, n: usize) -> String {
    let lines = host.proc.as_ref().map(|p| p.lines()).unwrap_or_default();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Posts the steady sender has made labelled `case`.
fn posted_in(posted: &Posted, case: &str) -> Result<usize, String> {
    Ok(posted
        .lock()
        .map_err(err)?
        .iter()
        .filter(|(_, l)| l == case)
        .count())
}

/// Waits (bounded) until the steady sender posted at least once more labelled `case`: a case
/// quicker than the sender's interval must still carry a post across its takeover to count.
async fn wait_posted(posted: &Posted, case: &str, before: usize) -> Result<(), String> {
    let deadline = Instant::now() + STEP_BOUND;
    while posted_in(posted, case)? <= before {
        if posted.lock().map_err(err)?.len() >= DLV_BUDGET {
            // The sender stopped at its budget (see `DLV_BUDGET`).
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("the sender posted nothing during the {case} case"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Which host's row is live (index into `hosts`), read from the broker.
async fn holder_index(insp: &Inspector, hosts: &[Host]) -> Result<Option<usize>, String> {
    let row = insp.lease().await.map_err(err)?;
    Ok(row.and_then(|r| {
        hosts
            .iter()
            .position(|h| h.holder == r.info.holder && r.info.ready)
    }))
}

/// Waits (bounded) until one of `hosts` holds a ready row. A failed read is retried: on a
/// cluster the suite's own connection may be failing over.
async fn wait_holder(insp: &Inspector, hosts: &[Host]) -> Result<usize, String> {
    let deadline = Instant::now() + STEP_BOUND;
    let mut last_error = String::new();
    loop {
        match holder_index(insp, hosts).await {
            Ok(Some(i)) => return Ok(i),
            Ok(None) => {}
            Err(e) => last_error = e,
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no host held a ready row within {} s (last read error: {last_error})",
                STEP_BOUND.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until a ctl.delivery request is answered; returns when.
async fn first_answer(probe: &Agent, bound: Duration) -> Result<Instant, String> {
    let deadline = Instant::now() + bound;
    loop {
        // A short timeout per probe: an unanswered request (nobody serves) is not a
        // no-responders answer here, so the agent's default 60 s wait would hide the takeover.
        let args = serde_json::json!({"lifecycleUid": probe.lifecycle_uid().as_str()});
        if probe
            .request("listMemberships", args, PROBE_TIMEOUT)
            .await
            .is_ok()
        {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            return Err("no ctl.delivery answer within the bound".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The steady sender's posts: (id, the case it was posted in).
type Posted = Arc<Mutex<Vec<(String, String)>>>;

/// Surfaced post ids (the text) with their first surface time, and duplicates counted.
type Seen = Arc<Mutex<(BTreeMap<String, Instant>, usize)>>;

async fn wait_seen(seen: &Seen, id: &str, bound: Duration) -> Result<Instant, String> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(t) = seen.lock().map_err(err)?.0.get(id) {
            return Ok(*t);
        }
        if Instant::now() > deadline {
            return Err(format!("post {id} not delivered within the bound"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Posts a round's marker, retried (bounded) while a cluster connection fails over.
async fn post_mark(sender: &Agent, channel: &str, mark: &str) -> Result<(), String> {
    let deadline = Instant::now() + STEP_BOUND;
    loop {
        let msg = sender.message(channel, mark, Some(mark));
        match sender.post(channel, &msg).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(format!("post {mark}: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

type Times<'a> = BTreeMap<&'a str, Vec<u128>>;

/// Records one case's times: takeover (both seen), first answer, first delivered post.
fn record<'a>(
    takeover: &mut Times<'a>,
    rail: &mut Times<'a>,
    post: &mut Times<'a>,
    case: &'a str,
    t0: Instant,
    answered: Instant,
    delivered: Instant,
) {
    let ms = |t: Instant| t.duration_since(t0).as_millis();
    takeover
        .entry(case)
        .or_default()
        .push(ms(answered.max(delivered)));
    rail.entry(case).or_default().push(ms(answered));
    post.entry(case).or_default().push(ms(delivered));
}

fn stats(v: &[u128]) -> (u128, u128, u128) {
    let mut v = v.to_vec();
    v.sort_unstable();
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

async fn suite(args: Args) -> Result<(), String> {
    let ttl = Duration::from_secs(args.lease_ttl_secs.max(1));
    let retry = Duration::from_millis(args.standby_retry_ms.max(100));
    let timing = Timing {
        retry,
        ack_wait: args
            .ack_wait_ms
            .map(|ms| Duration::from_millis(ms.max(100))),
    };
    let nodes = crate::cluster::nodes(args.cluster);
    let mut mesh = Mesh::builder()
        .space("standby")
        .map_err(err)?
        .lease_ttl(ttl)
        .cluster(nodes)
        .start()
        .await
        .map_err(err)?;
    let space = mesh.space().clone();
    let insp = mesh.inspector(&space).await.map_err(err)?;
    let replicas_line = crate::cluster::replicas(&insp, nodes).await?;
    // Every write to the lease key from here on, from the broker (the suite's own connection).
    let recorder = lease::Recorder::start(&insp).await?;
    let roots = [
        tempfile::tempdir().map_err(err)?,
        tempfile::tempdir().map_err(err)?,
    ];
    let mut plan = StandbyPlan::new(vec![space.clone()]);
    let initial = Duration::from_secs(args.initial_creds_secs.max(5));
    plan.delivery_ttl = Some(initial);
    let minted_at = Instant::now();
    prepare_standby_hosts(&mesh.authority, &plan, &[roots[0].path(), roots[1].path()])
        .map_err(err)?;
    let mut hosts = Vec::new();
    for (i, root) in roots.into_iter().enumerate() {
        let (holder, nkey) = holder_of(root.path(), &space)?;
        // On a cluster host i+1 dials node i+1, away from the suite's own node 0.
        let server = mesh
            .node((i + 1) % nodes)
            .map(|n| n.client_url())
            .ok_or("no node")?;
        hosts.push(Host {
            root,
            holder,
            nkey,
            server,
            proc: None,
        });
    }
    hosts[0].proc = Some(spawn(
        &mesh,
        hosts[0].root.path(),
        &hosts[0].server,
        timing,
    )?);
    hosts[0]
        .proc
        .as_mut()
        .ok_or("no host")?
        .wait_for_line("✓ delivery daemon up", STEP_BOUND)
        .await
        .map_err(err)?;
    hosts[1].proc = Some(spawn(
        &mesh,
        hosts[1].root.path(),
        &hosts[1].server,
        timing,
    )?);
    hosts[1]
        .proc
        .as_mut()
        .ok_or("no host")?
        .wait_for_line("standing by", STEP_BOUND)
        .await
        .map_err(err)?;

    // The channel, its offline member, an online watcher and the ctl.delivery probe.
    let channel = "ops";
    let (member, member_mat) = agent::spawn(&mesh, &insp, "offline", &[channel])
        .await
        .map_err(err)?;
    member.durable_join(channel).await.map_err(err)?;
    drop(member);
    let (watcher, _) = agent::spawn(&mesh, &insp, "watcher", &[channel])
        .await
        .map_err(err)?;
    watcher.durable_join(channel).await.map_err(err)?;
    let mut watch_dlv = watcher.bind_delivery().await.map_err(err)?;
    let (sender, _) = agent::spawn(&mesh, &insp, "sender", &[channel])
        .await
        .map_err(err)?;
    let sender = Arc::new(sender);
    let seen: Seen = Arc::default();
    let watching = {
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Ok(Some(f)) = watch_dlv.surface(Duration::from_secs(3600), |_| {}).await {
                let id = agent::texts(std::slice::from_ref(&f)).remove(0);
                if let Ok(mut s) = seen.lock() {
                    s.0.entry(id).or_insert_with(Instant::now);
                }
            }
        })
    };

    // The steady durable sender, labelled by the phase it posts in.
    let phase = Arc::new(Mutex::new(String::from("setup")));
    let sending = Arc::new(AtomicBool::new(true));
    let posted: Posted = Arc::default();
    let sender_task = {
        let (sender, phase, sending, posted) = (
            sender.clone(),
            phase.clone(),
            sending.clone(),
            posted.clone(),
        );
        let every = Duration::from_millis(args.post_every_ms.max(10));
        tokio::spawn(async move {
            let mut n = 0u64;
            while sending.load(Ordering::SeqCst) {
                if posted.lock().map(|p| p.len()).unwrap_or(0) >= DLV_BUDGET {
                    eprintln!("delivery-standby: the sender stops at {DLV_BUDGET} posts (the offline member's DLV keeps {DEFAULT_BACKSTOP_MAX_MSGS_PER_SUBJECT})");
                    break;
                }
                let label = phase.lock().map(|p| p.clone()).unwrap_or_default();
                let id = format!("p-{n}");
                let msg = sender.message(channel, &id, Some(&id));
                if sender.post(channel, &msg).await.is_ok() {
                    if let Ok(mut p) = posted.lock() {
                        p.push((id, label));
                    }
                }
                n += 1;
                tokio::time::sleep(every).await;
            }
        })
    };

    // Credentials replaced through each host's own store; the initial expiry crossed while
    // the holder serves.
    for h in &hosts {
        renew_host_delivery(
            &mesh.authority,
            h.root.path(),
            &space,
            Duration::from_secs(86_400),
        )
        .map_err(err)?;
    }
    let expiry = minted_at + initial + Duration::from_secs(2);
    tokio::time::sleep(expiry.saturating_duration_since(Instant::now())).await;
    let holder = wait_holder(&insp, &hosts).await?;
    first_answer(&watcher, Duration::from_secs(10)).await?;
    let credential_line = format!(
        "credentials replaced through each host's store; initial expiry ({} s) crossed while host {} served and answered",
        initial.as_secs(),
        holder + 1
    );

    // A third host with an invalid manifest refuses without disturbing the holder.
    let third = tempfile::tempdir().map_err(err)?;
    std::fs::create_dir_all(third.path().join(".cotal")).map_err(err)?;
    std::fs::write(
        manifest_path(third.path()),
        r#"{"version": 2, "spaces": ["standby"]}"#,
    )
    .map_err(err)?;
    let before = insp.lease().await.map_err(err)?.ok_or("no row")?;
    let mut t = spawn(&mesh, third.path(), &mesh.url(), timing)?;
    let code = t.wait_exit(STEP_BOUND).await.map_err(err)?.code();
    let after = insp.lease().await.map_err(err)?.ok_or("no row")?;
    let same_holder = after.info.holder == before.info.holder
        && after.info.incarnation == before.info.incarnation;
    if code != Some(3) || !same_holder {
        return Err(format!(
            "the invalid-manifest host: exit {code:?}, row {before:?} -> {after:?}"
        ));
    }
    let third_line = format!(
        "a third host with an invalid manifest refused (exit 3); the holder's row stayed its own (revision {} -> {}, renewals only, incarnation unchanged)",
        before.revision, after.revision
    );

    // The cases.
    let mut takeover: BTreeMap<&str, Vec<u128>> = BTreeMap::new();
    let mut rail: BTreeMap<&str, Vec<u128>> = BTreeMap::new();
    let mut post: BTreeMap<&str, Vec<u128>> = BTreeMap::new();
    // Each run's times on the wall clock, for the lease's facts read from the broker's log.
    let mut runs: Vec<(&str, lease::Run)> = Vec::new();
    // Node case: whether the holder's lane rode the failover or the standby took over.
    let mut kept = 0usize;
    let mut moved = 0usize;
    let cases: Vec<&str> = if args.cluster {
        CASES.iter().copied().chain([NODE_CASE]).collect()
    } else {
        CASES.to_vec()
    };
    for round in 0..args.rounds {
        for &case in &cases {
            if let Ok(mut p) = phase.lock() {
                *p = case.to_string();
            }
            let posted_before = posted_in(&posted, case)?;
            let h = wait_holder(&insp, &hosts).await?;
            let s = 1 - h;
            if case == NODE_CASE {
                let row = insp.lease().await.map_err(err)?.ok_or("no row")?;
                let node = node_of(&mut mesh, &hosts[h].nkey)
                    .await?
                    .ok_or("the holder is connected to no running node")?;
                let (t0, t0_wall) = (Instant::now(), SystemTime::now());
                mesh.node_mut(node).ok_or("no node")?.kill().map_err(err)?;
                let mark = format!("mark-{case}-{round}");
                post_mark(&sender, channel, &mark).await?;
                let answered = first_answer(&watcher, STEP_BOUND).await?;
                let delivered = wait_seen(&seen, &mark, STEP_BOUND).await?;
                let after = wait_holder(&insp, &hosts).await?;
                let now = insp.lease().await.map_err(err)?.ok_or("no row")?;
                let outcome = if after == h && now.info.incarnation == row.info.incarnation {
                    kept += 1;
                    format!(
                        "host {}'s lane rode the failover (incarnation unchanged)",
                        h + 1
                    )
                } else {
                    moved += 1;
                    format!(
                        "host {} holds it now (incarnation {} -> {})",
                        after + 1,
                        row.info.incarnation,
                        now.info.incarnation
                    )
                };
                record(
                    &mut takeover,
                    &mut rail,
                    &mut post,
                    case,
                    t0,
                    answered,
                    delivered,
                );
                let times = lease::Times::new(t0, t0_wall, answered, delivered);
                runs.push((case, times.run(hosts[h].holder.clone(), None)));
                eprintln!(
                    "delivery-standby: {case} round {round}: node {node} (the holder's) killed; ctl.delivery answered after {} ms, post delivered after {} ms; {outcome}",
                    answered.duration_since(t0).as_millis(),
                    delivered.duration_since(t0).as_millis()
                );
                let n = mesh.node_mut(node).ok_or("no node")?;
                n.wait_exit(STEP_BOUND).await.map_err(err)?;
                n.restart().await.map_err(err)?;
                wait_posted(&posted, case, posted_before).await?;
                continue;
            }
            let holder_nkey = hosts[h].nkey.clone();
            let (old_holder, new_holder) = (hosts[h].holder.clone(), hosts[s].holder.clone());
            let holder_proc = hosts[h].proc.as_mut().ok_or("holder not running")?;
            let (t0, t0_wall) = (Instant::now(), SystemTime::now());
            match case {
                "stop" => holder_proc.terminate().map_err(err)?,
                _ => holder_proc.kill().map_err(err)?,
            }
            // The marker is the first post sent once the holder is gone from the broker: a
            // post sent while the dying (or stopping) holder's pull requests were still there
            // could be handed to them in flight and come back only one ack_wait later (crash
            // recovery of an in-flight message, not takeover). Timed from the signal all the same.
            gone_from_broker(&mut mesh, &holder_nkey).await?;
            let mark = format!("mark-{case}-{round}");
            post_mark(&sender, channel, &mark).await?;
            let answered = first_answer(&watcher, STEP_BOUND).await?;
            let delivered = wait_seen(&seen, &mark, STEP_BOUND).await?;
            record(
                &mut takeover,
                &mut rail,
                &mut post,
                case,
                t0,
                answered,
                delivered,
            );
            let times = lease::Times::new(t0, t0_wall, answered, delivered);
            runs.push((case, times.run(old_holder, Some(new_holder))));
            eprintln!(
                "delivery-standby: {case} round {round}: ctl.delivery answered after {} ms, post delivered after {} ms",
                answered.duration_since(t0).as_millis(),
                delivered.duration_since(t0).as_millis()
            );
            let status = holder_proc.wait_exit(STEP_BOUND).await.map_err(err)?;
            if case == "stop" && status.code() != Some(0) {
                return Err(format!("the stopped holder exited {status:?}"));
            }
            if wait_holder(&insp, &hosts).await? != s {
                let row = insp.lease().await.map_err(err)?;
                return Err(format!(
                    "{case}: host {} did not take the lease (row {row:?}; host {}'s last lines:\n{})",
                    s + 1,
                    s + 1,
                    tail(&hosts[s], 20)
                ));
            }
            // The old holder comes back and stands by; the new holder's row stays its own.
            let row = insp.lease().await.map_err(err)?.ok_or("no row")?;
            let mut back = spawn(&mesh, hosts[h].root.path(), &hosts[h].server, timing)?;
            back.wait_for_line("standing by", STEP_BOUND)
                .await
                .map_err(err)?;
            if case == "return" {
                tokio::time::sleep(retry + Duration::from_secs(1)).await;
            }
            let now = insp.lease().await.map_err(err)?.ok_or("no row")?;
            if now.info.holder != row.info.holder || now.info.incarnation != row.info.incarnation {
                return Err(format!(
                    "{case}: the returning host moved the row: {row:?} -> {now:?}"
                ));
            }
            hosts[h].proc = Some(back);
            wait_posted(&posted, case, posted_before).await?;
        }
    }

    // What the lease did in each run, from the broker's log of the key (before any host stops).
    let writes = recorder.writes();
    let mut facts: BTreeMap<&str, Vec<lease::Facts>> = BTreeMap::new();
    let mut lease_faults: Vec<String> = Vec::new();
    for (i, (case, run)) in runs.iter().enumerate() {
        let until = runs.get(i + 1).map(|(_, next)| next.t0);
        match lease::facts(&writes, run, until, ttl) {
            Ok(Some(f)) => facts.entry(case).or_default().push(f),
            Ok(None) if *case == NODE_CASE => {}
            Ok(None) => lease_faults.push(format!("{case}: the holder's row never ended")),
            Err(e) => lease_faults.push(format!("{case}: {e}")),
        }
    }
    for fault in &lease_faults {
        eprintln!("delivery-standby: the lease broke a rule: {fault}");
    }

    // Every post must be in the offline member's DLV.
    sending.store(false, Ordering::SeqCst);
    let _ = sender_task.await;
    let posts = posted.lock().map_err(err)?.clone();
    // A cluster that has just lost a node may not answer a consumer lookup until the DLV
    // consumer has a leader again (seen: `bind dlv_…: timed out` after the node round), so the
    // bind is tried again until the step's bound; a bind that never succeeds fails with its
    // last error.
    let bind_deadline = Instant::now() + STEP_BOUND;
    let (_member, mut dlv) = loop {
        let bound = async {
            let member = agent::connect(&mesh, &member_mat, "offline")
                .await
                .map_err(err)?;
            let dlv = member.bind_delivery().await.map_err(err)?;
            Ok::<_, String>((member, dlv))
        };
        match bound.await {
            Ok(pair) => break pair,
            Err(e) if Instant::now() + BIND_RETRY < bind_deadline => {
                eprintln!(
                    "delivery-standby: binding the offline member's DLV: {e}; trying again in {} ms",
                    BIND_RETRY.as_millis()
                );
                tokio::time::sleep(BIND_RETRY).await;
            }
            Err(e) => return Err(format!("binding the offline member's DLV: {e}")),
        }
    };
    let want: std::collections::BTreeSet<String> = posts.iter().map(|(id, _)| id.clone()).collect();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let deadline = Instant::now() + STEP_BOUND;
    while want.iter().any(|id| !counts.contains_key(id)) && Instant::now() < deadline {
        match dlv.surface(Duration::from_secs(5), |_| {}).await {
            Ok(Some(f)) => {
                let id = agent::texts(std::slice::from_ref(&f)).remove(0);
                *counts.entry(id).or_default() += 1;
            }
            // Quiet for a while is not "lost": a copy may still be waiting on a redelivery;
            // only the bound decides.
            Ok(None) => continue,
            Err(e) => return Err(format!("the offline member's DLV: {e}")),
        }
    }
    // A short quiet read catches late duplicates.
    while let Ok(Some(f)) = dlv.surface(Duration::from_millis(500), |_| {}).await {
        let id = agent::texts(std::slice::from_ref(&f)).remove(0);
        *counts.entry(id).or_default() += 1;
    }
    watching.abort();

    let bound_ms = (ttl + retry + Duration::from_secs(1)).as_millis();
    let mut lost_total = 0;
    if !args.json {
        let broker = if args.cluster {
            format!(
                "a {CLUSTER_NODES}-node loopback cluster (R{CLUSTER_NODES} streams and buckets)"
            )
        } else {
            format!("one broker at {}", mesh.url())
        };
        let ack_wait = timing
            .ack_wait
            .map(|d| format!("{} s", d.as_secs_f64()))
            .unwrap_or_else(|| "the daemon's default".into());
        println!("delivery-standby: two hosts, {broker}, lease TTL {} s, standby retry {} s, ack_wait {ack_wait}, {} round(s)", ttl.as_secs(), retry.as_secs_f64(), args.rounds);
        println!("These are observations on one machine and one broker (or one loopback cluster): not an SLA, and not a test of two physical hosts or of a network partition.");
        println!("{replicas_line}");
        println!("{credential_line}");
        println!("{third_line}");
        println!("expected bound after a kill, for the first ctl.delivery answer and the first post sent after the kill: TTL + standby retry + 1 s = {bound_ms} ms");
        println!(
            "{:>7} | {:>6} | {:>8} {:>8} {:>8} | {:>6} {:>8} {:>5} {:>10}",
            "case",
            "rounds",
            "min ms",
            "med ms",
            "max ms",
            "posts",
            "surfaced",
            "lost",
            "duplicates"
        );
    }
    for &case in &cases {
        let ids: Vec<&String> = posts
            .iter()
            .filter(|(_, l)| l == case)
            .map(|(id, _)| id)
            .collect();
        let surfaced = ids
            .iter()
            .filter(|id| counts.contains_key(id.as_str()))
            .count();
        let dups: usize = ids
            .iter()
            .map(|id| {
                counts
                    .get(id.as_str())
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(1)
            })
            .sum();
        let lost = ids.len() - surfaced;
        lost_total += lost;
        let (min, med, max) = stats(takeover.get(case).map(Vec::as_slice).unwrap_or(&[0]));
        let r = stats(rail.get(case).map(Vec::as_slice).unwrap_or(&[0]));
        let p = stats(post.get(case).map(Vec::as_slice).unwrap_or(&[0]));
        let summary = lease::Summary {
            case,
            facts: facts.get(case).map(Vec::as_slice).unwrap_or(&[]),
            rail_max_ms: r.2,
            faults: lease_faults
                .iter()
                .filter(|f| f.starts_with(&format!("{case}:")))
                .count(),
            target: ANSWER_TARGET,
        };
        if args.json {
            let mut line = serde_json::json!({"case": case, "rounds": args.rounds, "takeover_ms": {"min": min, "median": med, "max": max}, "posts": ids.len(), "surfaced": surfaced, "lost": lost, "duplicates": dups, "bound_ms": bound_ms, "rail_ms": {"min": r.0, "median": r.1, "max": r.2}, "post_ms": {"min": p.0, "median": p.1, "max": p.2}, "rail_within_bound": r.2 <= bound_ms, "post_within_bound": p.2 <= bound_ms, "cluster": args.cluster});
            if let (Some(line), serde_json::Value::Object(fields)) =
                (line.as_object_mut(), summary.json())
            {
                line.extend(fields);
            }
            if case == NODE_CASE {
                // Which outcome each round had, proved by the row's holder and incarnation.
                line["lane_kept"] = kept.into();
                line["standby_took_over"] = moved.into();
            }
            println!("{line}");
        } else {
            println!(
                "{:>7} | {:>6} | {:>8} {:>8} {:>8} | {:>6} {:>8} {:>5} {:>10}",
                case,
                args.rounds,
                min,
                med,
                max,
                ids.len(),
                surfaced,
                lost,
                dups
            );
            let within = |max: u128| if max <= bound_ms { "within" } else { "beyond" };
            println!(
                "        first ctl.delivery answer {}/{}/{} ms ({} the bound); first delivered post {}/{}/{} ms ({} the bound) (min/med/max)",
                r.0, r.1, r.2, within(r.2), p.0, p.1, p.2, within(p.2)
            );
            println!("{}", summary.line());
            if case == NODE_CASE {
                println!(
                    "        after the holder's node died: its lane rode the failover {kept} time(s), the standby took over {moved} time(s) (from the row's holder and incarnation)"
                );
            }
        }
    }
    let all_lost = want
        .iter()
        .filter(|id| !counts.contains_key(id.as_str()))
        .count();
    for h in &mut hosts {
        if let Some(p) = h.proc.as_mut() {
            let _ = p.terminate();
            let _ = p.wait_exit(STEP_BOUND).await;
        }
    }
    if all_lost > 0 || lost_total > 0 {
        return Err(format!(
            "{all_lost} of {} posts never reached the offline member's DLV",
            want.len()
        ));
    }
    if !lease_faults.is_empty() {
        return Err(format!(
            "the lease broke a rule in {} run(s): {}",
            lease_faults.len(),
            lease_faults.join("; ")
        ));
    }
    Ok(())
}
