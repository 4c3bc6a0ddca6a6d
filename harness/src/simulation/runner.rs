//! One run, start to verdict: the run directory and its history, the mesh (one broker or the
//! 3-node R3 cluster, a proxy in front of each daemon, standby host roots), the daemons started
//! and supervised, the population brought up, then the phases (Jepsen's quiet, faults,
//! recover, final reads): quiet (the workload alone), faults (the nemesis too), heal (every
//! fault ended, the workload on), drain (no new work, every agent online until nothing is
//! pending or [`config::DRAIN_BOUND_MS`] passes), end (the daemons stopped). Then the broker's
//! final state is read, the history read back and checked.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cotal_delivery::provision::MintOptions;
use tokio::sync::{watch, Mutex};

use super::config::{self, Phases};
use super::observe::{self, DaemonPlan, Daemons, LeaseWrites};
use super::population::AgentCtx;
use super::prng::Prng;
use super::record::{Recorder, Tally};
use super::stage::{SimError, SimErrorKind, Stage};
use super::workload::{self, Workload};
use super::{capture, nemesis, replay, rowwatch, summary};
use crate::kit::shape::{MeshSpec, Shape};
use crate::kit::steps::verb::Ctx;
use crate::kit::steps::{broker, hosts, rows, Step};
use crate::kit::under_test::{DaemonUnderTest, RunOptions};
use crate::kit::world::World;
use crate::simulation::check::{
    check, History, HistoryWriter, Phase, Report, RowBucket, RunHeader,
};

/// Bound on the first daemon serving, before the workload starts.
const SERVING_START_BOUND: Duration = Duration::from_secs(90);
/// How often the progress line is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Bound on a daemon's exit after the runner's SIGTERM at the end, before SIGKILL.
const STOP_BOUND: Duration = Duration::from_secs(20);
/// Bound on the lease watch catching up, after the daemons stopped, with the lease key's last
/// write on the broker (their releases).
const LEASE_SETTLE: Duration = Duration::from_millis(1_500);
/// How often the lease watch's record is looked at while it catches up.
const LEASE_SETTLE_POLL: Duration = Duration::from_millis(20);
/// How often the drain reads what is pending.
const DRAIN_POLL: Duration = Duration::from_millis(500);
/// Lifetime of the runner's own broker views: longer than any run.
const VIEW_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// A stored run whose schedule this run follows.
pub struct ReplaySource {
    pub dir: PathBuf,
    pub history: History,
}

/// What to run.
pub struct Options {
    pub daemon: DaemonUnderTest,
    /// How the run header names the daemon under test (its path).
    pub daemon_label: String,
    pub seed: u64,
    pub minutes: f64,
    pub cluster: bool,
    pub standby: bool,
    pub agents: usize,
    /// The run directory: created, and it must not hold a history yet.
    pub dir: PathBuf,
    pub replay: Option<ReplaySource>,
    /// Print the progress line to stderr.
    pub progress: bool,
}

/// How a run ended.
pub struct Finished {
    pub report: Report,
    pub dir: PathBuf,
    pub tally: Tally,
    /// Wall time of the whole run, mesh start to verdict.
    pub wall: Duration,
    /// Whether the drain found nothing pending before its bound.
    pub drained: bool,
}

/// The commit of this checkout (`-dirty` when it has changes), or `unknown`.
pub fn commit() -> String {
    let Some(dir) = crate::rig::checkout::root() else {
        return "unknown".to_string();
    };
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(&dir)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "HEAD"]) {
        Some(head) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(s) if !s.is_empty() => format!("{head}-dirty"),
            _ => head,
        },
        None => "unknown".to_string(),
    }
}

fn mesh_err(what: &str) -> impl Fn(crate::kit::failure::Failure) -> SimError + '_ {
    move |f| SimError::new(SimErrorKind::Mesh, format!("{what}: {f}"))
}

async fn kit_step(w: &mut World, step: Step, what: &str) -> Result<(), SimError> {
    let now = Instant::now();
    let ctx = Ctx {
        started: now,
        deadline: now + Duration::from_secs(30),
    };
    step.run(w, ctx).await.map(|_| ()).map_err(mesh_err(what))
}

/// Waits, at most [`LEASE_SETTLE`], until the lease watch has recorded the lease key's last
/// write on the broker (the stopped daemons' releases), so the snapshot's `lease_writes` ends
/// where the broker's key does. A broker that cannot be read ends the wait at its bound.
async fn lease_caught_up(view: &crate::rig::mesh::Inspector, lease: &LeaseWrites) {
    let deadline = Instant::now() + LEASE_SETTLE;
    let last = tokio::time::timeout(LEASE_SETTLE, view.lease_revision()).await;
    let Ok(Ok(Some(last))) = last else {
        return;
    };
    while Instant::now() < deadline {
        let seen = lease
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .next_back()
            .copied();
        if seen.is_some_and(|seen| seen >= last) {
            return;
        }
        tokio::time::sleep(LEASE_SETTLE_POLL).await;
    }
}

/// Runs one simulation to its verdict.
pub async fn run(opts: Options) -> Result<Finished, SimError> {
    let wall = Instant::now();
    std::fs::create_dir_all(&opts.dir).map_err(|e| {
        SimError::new(
            SimErrorKind::Files,
            format!("create the run directory {}: {e}", opts.dir.display()),
        )
        .with_source(e)
    })?;
    let writer = HistoryWriter::create(&opts.dir)
        .map_err(|e| SimError::new(SimErrorKind::Files, e.to_string()).with_source(e))?;
    let recorder = Arc::new(Recorder::new(writer));
    recorder.header(RunHeader {
        seed: opts.seed,
        commit: commit(),
        daemon: opts.daemon_label.clone(),
        cluster: opts.cluster,
        standby: opts.standby,
        started_unix_ms: recorder.started_unix_ms(),
        replay_of: opts.replay.as_ref().map(|r| r.dir.display().to_string()),
    });

    // The mesh, through the kit: a world with no case behind it.
    let spec = MeshSpec {
        space: config::SPACE.to_string(),
        lease_ttl_ms: crate::kit::expr::Duration::Ms(config::LEASE_TTL_MS),
        ..MeshSpec::default()
    };
    let shape = Shape::parse(if opts.cluster {
        "operator+cluster"
    } else {
        "operator"
    })
    .map_err(|e| SimError::new(SimErrorKind::Usage, e))?;
    // On the cluster, its routes go through proxies (what a partition cuts).
    let route_slot: crate::rig::cluster::RouteSlot = Arc::default();
    let run_options = RunOptions {
        daemon: opts.daemon.clone(),
        scaled: false,
        ..RunOptions::default()
    };
    let start = World::start(
        &spec,
        &shape,
        config::daemon_env(opts.standby),
        Default::default(),
        &run_options,
    );
    let started = if opts.cluster {
        crate::rig::cluster::routed(route_slot.clone(), start).await
    } else {
        start.await
    };
    let mut world = started.map_err(mesh_err("start the mesh"))?;
    let routes = route_slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    for c in config::DURABLE_CHANNELS {
        let step = Step::Rows(rows::RowStep::Channel {
            name: c.to_string(),
            class: rows::RowClass::Durable,
        });
        kit_step(&mut world, step, "write a channel row").await?;
    }
    let step = Step::Rows(rows::RowStep::Channel {
        name: config::LIVE_CHANNEL.to_string(),
        class: rows::RowClass::Live,
    });
    kit_step(&mut world, step, "write the live channel's row").await?;
    let names: &[&str] = if opts.standby { &["a", "b"] } else { &["a"] };
    let mut plans = Vec::new();
    for n in names {
        let via = format!("p{n}");
        let step = Step::Broker(broker::BrokerStep::Proxy {
            name: via.clone(),
            node: 0,
        });
        kit_step(&mut world, step, "start a proxy").await?;
        let host = if opts.standby {
            let step = Step::Hosts(hosts::HostStep::Host {
                name: n.to_string(),
                every_space: false,
            });
            kit_step(&mut world, step, "prepare a standby host").await?;
            Some(n.to_string())
        } else {
            None
        };
        plans.push(DaemonPlan {
            name: n.to_string(),
            via,
            host,
        });
    }
    // The runner's own views of the broker reconnect without limit: broker faults end.
    let view = |name: &'static str| {
        let options = MintOptions::new().expires_in(VIEW_LIFETIME);
        let space = world.mesh.space().clone();
        let mesh = &world.mesh;
        async move {
            mesh.standing_inspector(&space, options, name)
                .await
                .map_err(|e| SimError::new(SimErrorKind::Mesh, format!("{name}: {e}")))
        }
    };
    let lease_view = view("sim-lease-watch").await?;
    let rows_view = Arc::new(view("sim-row-watch").await?);
    let manager = view("sim-manager").await?;
    // The kit's steps read and write through the world's view (the lease row, the drain).
    let steps_view = view("sim-steps").await?;
    world.insp = steps_view;
    let agents_ctx = Arc::new(AgentCtx {
        recorder: recorder.clone(),
        population: Arc::new(std::sync::Mutex::new(Vec::new())),
        server_url: world.mesh.url(),
        tls_ca: world.mesh.tls_ca(),
        js: manager.js.clone(),
        names: manager.names.clone(),
        ask_again: opts.replay.is_none(),
    });
    let nodes = world.mesh.node_count();
    let stage = Arc::new(Mutex::new(Stage {
        world,
        daemons: Daemons::new(plans),
        routes,
    }));
    let lease: LeaseWrites = Arc::default();
    let (stop_tx, stop_rx) = watch::channel(false);
    let lease_task = tokio::spawn(observe::watch_lease(
        lease_view,
        recorder.clone(),
        lease.clone(),
        stop_rx.clone(),
    ));
    // Every write to the members and ACL buckets, from before the first operation.
    let rows_seen: rowwatch::RowsSeen = Arc::default();
    let row_tasks: Vec<_> = [RowBucket::Members, RowBucket::Acl]
        .into_iter()
        .map(|bucket| {
            tokio::spawn(rowwatch::watch(
                rows_view.clone(),
                bucket,
                recorder.clone(),
                rows_seen.clone(),
                stop_rx.clone(),
            ))
        })
        .collect();
    let observer = tokio::spawn(observe_loop(
        stage.clone(),
        recorder.clone(),
        lease.clone(),
        stop_rx.clone(),
    ));
    if wait_serving(&stage, SERVING_START_BOUND).await.is_err() {
        keep_logs(&stage, &opts.dir).await;
        let _ = stop_tx.send(true);
        return Err(SimError::new(
            SimErrorKind::NoDaemon,
            format!(
                "no daemon served within {} s of its start; its lines are in {}",
                SERVING_START_BOUND.as_secs(),
                opts.dir.join("logs").display()
            ),
        ));
    }

    // The phases.
    let slots = match &opts.replay {
        Some(r) => replay::population_size(&r.history),
        None => opts.agents,
    };
    *agents_ctx
        .population
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = workload::population(slots);
    let work = Workload::new(
        recorder.clone(),
        agents_ctx.population.clone(),
        stage.clone(),
        agents_ctx.clone(),
    );
    let phases = match &opts.replay {
        Some(r) => replay::phases(&r.history),
        None => Phases::of((opts.minutes * 60_000.0) as u64),
    };
    let progress = opts.progress.then(|| {
        tokio::spawn(summary::progress(
            recorder.clone(),
            agents_ctx.population.clone(),
            stage.clone(),
            PROGRESS_EVERY,
            phases,
        ))
    });
    let t0 = recorder.now_ms();
    recorder.phase(Phase::Quiet);
    let (faults_at, heal_at, drain_at) = (
        t0 + phases.faults_from(),
        t0 + phases.heal_from(),
        t0 + phases.drain_from(),
    );
    let (work_task, nemesis_task) = match &opts.replay {
        None => {
            let mut rng = Prng::stream(opts.seed, "population");
            for slot in 0..slots {
                work.bring_up(slot, &mut rng).await;
            }
            // The seed's swarm: its own weights for the workload and the faults.
            let mut swarm = Prng::stream(opts.seed, "swarm");
            let specs = nemesis::swarm(config::faults(opts.cluster, opts.standby), &mut swarm);
            let mix = workload::work_mix(&mut swarm);
            if opts.progress {
                eprintln!("{}", summary::swarm_line(&specs, &mix));
            }
            let w = tokio::spawn(workload::live(
                work.clone(),
                Prng::stream(opts.seed, "workload"),
                mix,
                t0,
                drain_at,
            ));
            let n = tokio::spawn(nemesis::live(nemesis::Live {
                stage: stage.clone(),
                recorder: recorder.clone(),
                lease: lease.clone(),
                specs,
                rng: Prng::stream(opts.seed, "nemesis"),
                nodes,
                from_ms: faults_at,
                until_ms: heal_at,
                work: Some((work.clone(), Prng::stream(opts.seed, "held-leave"))),
            }));
            (w, n)
        }
        Some(r) => {
            let plan = replay::Plan::of(&r.history, t0);
            let w = tokio::spawn(replay::workload(work.clone(), plan.clone()));
            let n = tokio::spawn(replay::nemesis(
                stage.clone(),
                recorder.clone(),
                lease.clone(),
                plan,
            ));
            (w, n)
        }
    };
    recorder.sleep_until_ms(faults_at).await;
    recorder.phase(Phase::Faults);
    let _ = nemesis_task.await;
    recorder.sleep_until_ms(heal_at).await;
    recorder.phase(Phase::Heal);
    recorder.sleep_until_ms(drain_at).await;
    work_task.abort();
    recorder.phase(Phase::Drain);
    let drained = drain(&work, &stage, &manager).await;
    recorder.phase(Phase::End);
    stop_daemons(&stage, &recorder, &lease).await;
    work.close();
    lease_caught_up(&manager, &lease).await;
    let row_logs = rowwatch::caught_up(&rows_view, &rows_seen).await;
    let _ = stop_tx.send(true);
    let _ = observer.await;
    let _ = lease_task.await;
    for t in row_tasks {
        let _ = t.await;
    }
    if let Some(p) = progress {
        p.abort();
    }
    keep_logs(&stage, &opts.dir).await;

    // The broker's final state, the history read back, the verdict.
    let mut snap = capture::read(&manager.js, &manager.names, &work.members(), &lease)
        .await
        .map_err(|e| SimError::new(SimErrorKind::Mesh, format!("read the final state: {e}")))?;
    snap.row_logs = row_logs;
    snap.write_dir(&opts.dir)
        .map_err(|e| SimError::new(SimErrorKind::Files, e.to_string()).with_source(e))?;
    if let Some(e) = recorder.error() {
        return Err(SimError::new(
            SimErrorKind::Files,
            format!("the history is incomplete: {e}"),
        ));
    }
    let history = History::read_dir(&opts.dir)
        .map_err(|e| SimError::new(SimErrorKind::Files, e.to_string()).with_source(e))?;
    let report = check(&history, &snap, &config::check_config());
    let json = report
        .to_json()
        .map_err(|e| SimError::new(SimErrorKind::Files, e.to_string()).with_source(e))?;
    std::fs::write(opts.dir.join("report.json"), json).map_err(|e| {
        SimError::new(SimErrorKind::Files, format!("write report.json: {e}")).with_source(e)
    })?;
    let tally = recorder.tally();
    drop(stage);
    Ok(Finished {
        report,
        dir: opts.dir,
        tally,
        wall: wall.elapsed(),
        drained,
    })
}

/// Reads the daemons every [`observe::OBSERVE_TICK`] until `stop`.
async fn observe_loop(
    stage: Arc<Mutex<Stage>>,
    recorder: Arc<Recorder>,
    lease: LeaseWrites,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        {
            let mut s = stage.lock().await;
            let Stage { world, daemons, .. } = &mut *s;
            observe::poll(world, daemons, &recorder, &lease).await;
        }
        if *stop.borrow() {
            return;
        }
        let _ = tokio::time::timeout(observe::OBSERVE_TICK, stop.changed()).await;
    }
}

/// Waits until some daemon serves, at most `bound` (zero: checks once).
async fn wait_serving(stage: &Mutex<Stage>, bound: Duration) -> Result<(), ()> {
    let deadline = Instant::now() + bound;
    loop {
        if !stage.lock().await.daemons.serving.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(());
        }
        tokio::time::sleep(observe::OBSERVE_TICK).await;
    }
}

/// Every agent online until nothing is pending (the fan-out writer, the reader, every online
/// agent's `dlv_` durable), or the bound passes; whether it drained.
async fn drain(
    work: &Workload,
    stage: &Mutex<Stage>,
    manager: &crate::rig::mesh::Inspector,
) -> bool {
    let deadline = Instant::now() + Duration::from_millis(config::DRAIN_BOUND_MS);
    loop {
        let slots: Vec<(usize, bool, Option<crate::simulation::check::Member>)> = work
            .population
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.online, s.member.clone()))
            .collect();
        let mut all_online = true;
        for (i, online, member) in &slots {
            if member.is_some() && !online {
                all_online = false;
                work.send(*i, super::population::Command::Online);
            }
        }
        if all_online && drained(stage, manager, &slots).await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

async fn drained(
    stage: &Mutex<Stage>,
    manager: &crate::rig::mesh::Inspector,
    slots: &[(usize, bool, Option<crate::simulation::check::Member>)],
) -> bool {
    {
        let mut s = stage.lock().await;
        if s.daemons.serving.is_empty() {
            return false;
        }
        let now = Instant::now();
        let once = Ctx {
            started: now,
            deadline: now,
        };
        let step = Step::Streams(crate::kit::steps::streams::StreamStep::Drained {});
        if step.run(&mut s.world, once).await.is_err() {
            return false;
        }
    }
    let names = &manager.names;
    for (_, _, member) in slots {
        let Some(m) = member else { continue };
        let durable = cotal_delivery::wire::SpaceNames::dlv_durable(m.principal(), m.uid());
        match crate::kit::steps::read::consumer_info(manager, &names.dlv_stream(), &durable).await {
            Ok(c) if c.num_pending == 0 && c.num_ack_pending == 0 => {}
            _ => return false,
        }
    }
    true
}

/// The runner's stop at the end: SIGTERM to each daemon (SIGKILL after [`STOP_BOUND`]),
/// recorded as `daemon_stop`, each exit observed.
async fn stop_daemons(stage: &Mutex<Stage>, recorder: &Recorder, lease: &LeaseWrites) {
    let mut s = stage.lock().await;
    s.daemons.stopping = true;
    let names: Vec<String> = s.daemons.plans.iter().map(|p| p.name.clone()).collect();
    for name in names {
        let op = recorder.invoke(
            &crate::simulation::check::Process::Runner,
            crate::simulation::check::Call::DaemonStop {
                daemon: name.clone(),
            },
            None,
        );
        if let Some(d) = s.world.daemons.get_mut(&name) {
            if d.is_running() {
                // A paused daemon must run to hear the signal.
                let _ = d.thaw();
                let _ = d.terminate();
                if d.wait_exit(STOP_BOUND).await.is_err() {
                    let _ = d.kill();
                    let _ = d.wait_exit(STOP_BOUND).await;
                }
            }
        }
        let Stage { world, daemons, .. } = &mut *s;
        observe::poll(world, daemons, recorder, lease).await;
        recorder.ok(&op, crate::simulation::check::Done::DaemonStop);
    }
}

/// Copies the daemons' lines and the brokers' logs into the run directory.
async fn keep_logs(stage: &Mutex<Stage>, dir: &std::path::Path) {
    let s = stage.lock().await;
    let _ = s.world.keep(&dir.join("logs"), "");
    for (name, lines) in &s.daemons.earlier {
        let path = dir
            .join("logs")
            .join(format!("daemon-{name}.processes.log"));
        let _ = std::fs::write(path, lines.join("\n") + "\n");
    }
}
