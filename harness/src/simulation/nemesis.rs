//! The nemesis: faults drawn by weight from the seed, each with its duration, one at a time,
//! each run through the kit's verbs (`signal`, `broker`, `proxy_fault`, `delete_lease`,
//! `remint`, `reload_creds`) against the world's actors, and recorded as `fault_start` /
//! `fault_end` operations. Before a fault starts, the nemesis waits (bounded) for a daemon to
//! serve, and records that serving line as the fault's `after_line`, so a replay keeps the
//! order as well as the time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::config::{self, Aim, FaultSpec};
use super::observe::{self, LeaseWrites};
use super::prng::Prng;
use super::record::Recorder;
use super::stage::Stage;
use crate::kit::steps::broker::{BrokerFault, BrokerStep, ProxyFault};
use crate::kit::steps::creds::{AdoptionExpect, CredStep};
use crate::kit::steps::lease::LeaseStep;
use crate::kit::steps::process::ProcessStep;
use crate::kit::steps::verb::Ctx;
use crate::kit::steps::Step;
use crate::simulation::check::{Call, Done, FaultKind, FaultShape, Ms, Process};

/// Bound on one fault step (a broker restart waits for readiness).
const STEP_BOUND: Duration = Duration::from_secs(30);
/// Attempts at ending a fault before its end is recorded as failed.
const END_ATTEMPTS: u32 = 3;
/// Wait between two attempts at ending a fault.
const END_RETRY_GAP: Duration = Duration::from_secs(2);
/// Bound on a gracefully stopped daemon's exit.
const STOP_EXIT_BOUND: Duration = Duration::from_secs(20);

/// A fault in place, to be ended.
#[derive(Debug)]
pub struct Active {
    pub id: u64,
    pub kind: FaultKind,
    pub target: String,
    /// A slow broker's stutter, running until the end.
    stutter: Option<Stutter>,
}

/// A slow broker's loop of short stops: told to stop at the fault's end, it answers how many
/// stops it made and how long the broker was stopped in all (each measured around its
/// SIGSTOP and SIGCONT).
#[derive(Debug)]
struct Stutter {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<(u64, Duration)>,
}

/// Bound on a stutter's loop ending once told to.
const STUTTER_END_BOUND: Duration = Duration::from_secs(10);

/// SIGSTOP of `node` for `stop`, SIGCONT, `gap`, again until told to stop.
fn stutter(stage: Arc<Mutex<Stage>>, node: usize, stop_ms: u64, gap_ms: u64) -> Stutter {
    let (stop, mut rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let (mut stops, mut stopped) = (0u64, Duration::ZERO);
        while !*rx.borrow() {
            let t = Instant::now();
            if run_step(&mut *stage.lock().await, broker(BrokerFault::Stop, node))
                .await
                .is_err()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(stop_ms)).await;
            let _ = run_step(&mut *stage.lock().await, broker(BrokerFault::Cont, node)).await;
            stops += 1;
            stopped += t.elapsed();
            let _ = tokio::time::timeout(Duration::from_millis(gap_ms), rx.changed()).await;
        }
        (stops, stopped)
    });
    Stutter { stop, task }
}

/// The proxy a `proxy:<name>` target names.
fn proxy_of<'w>(stage: &'w Stage, target: &str) -> Result<&'w crate::rig::proxy::TcpProxy, String> {
    let name = target.strip_prefix("proxy:").unwrap_or(target);
    stage.world.proxy(name).map_err(|f| f.to_string())
}

fn ctx() -> Ctx {
    let now = Instant::now();
    Ctx {
        started: now,
        deadline: now + STEP_BOUND,
    }
}

async fn run_step(stage: &mut Stage, step: Step) -> Result<(), String> {
    step.run(&mut stage.world, ctx())
        .await
        .map(|_| ())
        .map_err(|f| f.to_string())
}

fn signal(daemon: &str, signal: &str) -> Step {
    Step::Process(ProcessStep::Signal {
        daemon: daemon.to_string(),
        signal: signal.to_string(),
    })
}

fn broker(fault: BrokerFault, node: usize) -> Step {
    Step::Broker(BrokerStep::Broker { fault, node })
}

fn proxy(proxy: &str, fault: ProxyFault) -> Step {
    Step::Broker(BrokerStep::ProxyFault {
        proxy: proxy.to_string(),
        fault,
        pattern: None,
    })
}

fn remint(lifetime: u64) -> Step {
    Step::Creds(CredStep::Remint {
        lifetime,
        rogue: false,
    })
}

/// `reloadCreds` from a fresh supervisor connection (the kit keeps one, which a broker fault
/// may have closed for good).
async fn reload(stage: &mut Stage) -> Result<(), String> {
    stage.world.supervisor = None;
    run_step(stage, reload_step()).await
}

fn reload_step() -> Step {
    Step::Creds(CredStep::ReloadCreds {
        expect: AdoptionExpect::Ok,
        error: None,
        release: None,
    })
}

/// `proxy:<name>@<store>` (`dinbox` or `dlv`): arms (or disarms) the proxy's swallow of the
/// daemon's bytes from its first write to that store's subjects (the proxy actor's own
/// `swallow_from`, which the kit's `proxy_fault` verb does not offer).
fn swallow(stage: &mut Stage, target: &str, arm: bool) -> Result<(), String> {
    let (proxy, store) = target
        .strip_prefix("proxy:")
        .and_then(|t| t.split_once('@'))
        .ok_or_else(|| format!("{target:?} is not proxy:<name>@<store>"))?;
    let names = &stage.world.insp.names;
    let subjects = match store {
        "dinbox" => names.dinbox_all(),
        "dlv" => names.dlv_all(),
        other => {
            return Err(format!(
                "{other:?} is not a store the daemon writes (dinbox, dlv)"
            ))
        }
    };
    let pattern = subjects.trim_end_matches('>').to_string();
    let p = stage.world.proxy(proxy).map_err(|f| f.to_string())?;
    if arm {
        p.swallow_from(pattern.as_bytes());
    } else {
        p.stop_swallowing();
    }
    Ok(())
}

/// `stream:<name>`: refuses every new message to that stream, as a store at its limit does
/// (`max_msgs` set to what it holds, discard new), or gives it back the provisioned limits
/// (no `max_msgs`, discard old). An operator's edit of the stream, through the world's view.
async fn store_full(stage: &mut Stage, target: &str, full: bool) -> Result<(), String> {
    use async_nats::jetstream::stream::DiscardPolicy;
    let name = target
        .strip_prefix("stream:")
        .ok_or_else(|| format!("{target:?} is not stream:<name>"))?;
    let js = &stage.world.insp.js;
    let mut stream = js
        .get_stream(name)
        .await
        .map_err(|e| format!("stream {name}: {e}"))?;
    let info = stream
        .info()
        .await
        .map_err(|e| format!("stream {name} info: {e}"))?;
    let mut config = info.config.clone();
    if full {
        config.max_messages = i64::try_from(info.state.messages)
            .unwrap_or(i64::MAX)
            .max(1);
        config.discard = DiscardPolicy::New;
    } else {
        config.max_messages = -1;
        config.discard = DiscardPolicy::Old;
    }
    js.update_stream(&config)
        .await
        .map(|_| ())
        .map_err(|e| format!("update stream {name}: {e}"))
}

/// Cuts node `node` off from the other cluster nodes (`on`), or heals it: its route
/// connections go through the route proxies (`rig::cluster`'s routed cluster).
async fn partition(stage: &mut Stage, node: usize, on: bool) -> Result<(), String> {
    let routes = stage
        .routes
        .as_ref()
        .ok_or("this mesh's routes do not go through proxies (one broker)")?;
    if !on {
        routes.heal(node);
        return Ok(());
    }
    routes.partition(node);
    // In place once the node itself lists no route (its `/routez`): the broker's own word.
    let port = stage
        .world
        .mesh
        .node(node)
        .map(|b| b.monitoring_port())
        .ok_or_else(|| format!("no node {node}"))?;
    let deadline = Instant::now() + PARTITION_BOUND;
    loop {
        let routez = match crate::rig::http::get(port, "/routez", PARTITION_POLL).await {
            Ok(r) => r.json().ok(),
            Err(_) => None,
        };
        let routes_left = routez.as_ref().and_then(|v| v["num_routes"].as_u64());
        if routes_left == Some(0) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            routes.heal(node);
            // Which routes outlived the cut (peer, port, pinned account): a route that does
            // not go through the proxies, or one the node has not noticed is gone.
            let left: Vec<String> = routez
                .as_ref()
                .and_then(|v| v["routes"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .map(|r| {
                    format!(
                        "{}:{}{}",
                        r["remote_name"].as_str().unwrap_or("?"),
                        r["port"],
                        r["account"]
                            .as_str()
                            .map(|a| format!(" (account {a})"))
                            .unwrap_or_default()
                    )
                })
                .collect();
            return Err(format!(
                "node {node} still lists {routes_left:?} route(s) {} ms after its proxies were cut: {}",
                PARTITION_BOUND.as_millis(),
                left.join(", ")
            ));
        }
        tokio::time::sleep(PARTITION_POLL).await;
    }
}

/// Bound on a partitioned node listing no route.
const PARTITION_BOUND: Duration = Duration::from_secs(5);
/// How often a partitioned node's routes are read.
const PARTITION_POLL: Duration = Duration::from_millis(100);

/// `node:<k>` -> k; `broker` -> 0.
fn node_of(target: &str) -> usize {
    target
        .strip_prefix("node:")
        .and_then(|k| k.parse().ok())
        .unwrap_or(0)
}

/// What to start: a fault's id, kind, target, planned duration and drawn shape.
#[derive(Debug, Clone)]
pub struct Planned {
    pub id: u64,
    pub kind: FaultKind,
    pub target: String,
    pub planned_ms: Option<u64>,
    pub shape: Option<FaultShape>,
}

/// Starts fault `p`; records it. `None` when the start failed (no fault: the checker ignores a
/// start that failed).
pub async fn start(
    stage: &Arc<Mutex<Stage>>,
    recorder: &Recorder,
    lease: &LeaseWrites,
    p: Planned,
    after_line: Option<u64>,
) -> Option<Active> {
    let Planned {
        id,
        kind,
        target,
        planned_ms,
        shape,
    } = p;
    let mut s = stage.lock().await;
    let op = recorder.invoke(
        &Process::Nemesis,
        Call::FaultStart {
            fault: id,
            kind,
            target: target.clone(),
            planned_ms,
            shape,
        },
        after_line,
    );
    let mut stuttering = None;
    let daemon = target.strip_prefix("daemon:").unwrap_or("").to_string();
    let result = match kind {
        FaultKind::DaemonKill => {
            s.daemons.held.insert(daemon.clone());
            run_step(&mut s, signal(&daemon, "KILL")).await
        }
        FaultKind::DaemonPause => {
            s.daemons.held.insert(daemon.clone());
            run_step(&mut s, signal(&daemon, "STOP")).await
        }
        FaultKind::DaemonRestart => {
            s.daemons.held.insert(daemon.clone());
            let r = run_step(&mut s, signal(&daemon, "TERM")).await;
            if r.is_ok() {
                if let Some(d) = s.world.daemons.get_mut(&daemon) {
                    let _ = d.wait_exit(STOP_EXIT_BOUND).await;
                }
            }
            r
        }
        FaultKind::BrokerKill | FaultKind::NodeKill => {
            run_step(&mut s, broker(BrokerFault::Kill, node_of(&target))).await
        }
        FaultKind::BrokerPause => run_step(&mut s, broker(BrokerFault::Stop, 0)).await,
        FaultKind::ProxyBlackhole => {
            let p = target.strip_prefix("proxy:").unwrap_or("");
            run_step(&mut s, proxy(p, ProxyFault::Blackhole)).await
        }
        FaultKind::ProxyCut => {
            // Every connection closed, and new ones held until the end.
            let p = target.strip_prefix("proxy:").unwrap_or("");
            match run_step(&mut s, proxy(p, ProxyFault::Cut)).await {
                Ok(()) => run_step(&mut s, proxy(p, ProxyFault::BlackholeNew)).await,
                Err(e) => Err(e),
            }
        }
        FaultKind::CredentialExpiry | FaultKind::CredentialExpiryReminted => {
            if kind == FaultKind::CredentialExpiry {
                s.daemons.held.insert(daemon.clone());
            }
            // The renewal owner remints a short credential and the daemon adopts it now.
            let r = match run_step(&mut s, remint(config::SHORT_CREDENTIAL_MS)).await {
                Ok(()) => reload(&mut s).await,
                Err(e) => Err(e),
            };
            if r.is_err() {
                // Nothing adopted: the store gets a long credential back.
                let _ = run_step(&mut s, remint(config::LONG_CREDENTIAL_MS)).await;
                s.daemons.held.remove(&daemon);
            }
            r
        }
        FaultKind::LeaseDelete => run_step(&mut s, Step::Lease(LeaseStep::DeleteLease {})).await,
        FaultKind::ProxySwallow => swallow(&mut s, &target, true),
        FaultKind::StoreFull => store_full(&mut s, &target, true).await,
        FaultKind::ProxyLatency => match shape {
            Some(FaultShape::Latency { base_ms, jitter_ms }) => proxy_of(&s, &target).map(|p| {
                p.add_latency(
                    Duration::from_millis(base_ms),
                    Duration::from_millis(jitter_ms),
                )
            }),
            _ => Err("a proxy latency needs its shape (base and jitter)".into()),
        },
        FaultKind::BrokerSlow => match shape {
            Some(FaultShape::Stutter { stop_ms, gap_ms }) => {
                stuttering = Some(stutter(stage.clone(), node_of(&target), stop_ms, gap_ms));
                Ok(())
            }
            _ => Err("a slow broker needs its shape (stop and gap)".into()),
        },
        FaultKind::Partition => match shape {
            Some(FaultShape::Partition { node, .. }) => partition(&mut s, node, true).await,
            _ => Err("a partition needs its shape (the node cut off)".into()),
        },
    };
    // What the fault did at once (a kill's exit) is observed before the next step.
    let Stage { world, daemons, .. } = &mut *s;
    observe::poll(world, daemons, recorder, lease).await;
    match result {
        Ok(()) => {
            recorder.ok(&op, Done::FaultStart);
            Some(Active {
                id,
                kind,
                target,
                stutter: stuttering,
            })
        }
        Err(e) => {
            s.daemons.held.remove(&daemon);
            recorder.fail(&op, e);
            None
        }
    }
}

/// Ends `fault`: the process continued or started again, the broker restarted, the proxy
/// healed, a long credential reminted.
pub async fn end(
    stage: &Mutex<Stage>,
    recorder: &Recorder,
    lease: &LeaseWrites,
    mut fault: Active,
) {
    let op = recorder.invoke(&Process::Nemesis, Call::FaultEnd { fault: fault.id }, None);
    // A slow broker's loop ends first (its last SIGCONT sent); what it did is the evidence.
    let mut evidence = None;
    if let Some(st) = fault.stutter.take() {
        let _ = st.stop.send(true);
        if let Ok(Ok((stops, stopped))) = tokio::time::timeout(STUTTER_END_BOUND, st.task).await {
            evidence = Some(format!(
                "{stops} stops, {} ms stopped in all",
                stopped.as_millis()
            ));
        }
    }
    let daemon = fault
        .target
        .strip_prefix("daemon:")
        .unwrap_or("")
        .to_string();
    let mut last = String::new();
    for attempt in 0..END_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(END_RETRY_GAP).await;
        }
        let mut s = stage.lock().await;
        let result = match fault.kind {
            FaultKind::DaemonKill | FaultKind::DaemonRestart => {
                s.daemons.held.remove(&daemon);
                Ok(())
            }
            FaultKind::DaemonPause => {
                let r = run_step(&mut s, signal(&daemon, "CONT")).await;
                s.daemons.held.remove(&daemon);
                r
            }
            FaultKind::BrokerKill | FaultKind::NodeKill => {
                run_step(&mut s, broker(BrokerFault::Restart, node_of(&fault.target))).await
            }
            FaultKind::BrokerPause => run_step(&mut s, broker(BrokerFault::Cont, 0)).await,
            FaultKind::ProxyBlackhole | FaultKind::ProxyCut => {
                let p = fault.target.strip_prefix("proxy:").unwrap_or("");
                run_step(&mut s, proxy(p, ProxyFault::Heal)).await
            }
            FaultKind::CredentialExpiry | FaultKind::CredentialExpiryReminted => {
                let r = run_step(&mut s, remint(config::LONG_CREDENTIAL_MS)).await;
                s.daemons.held.remove(&daemon);
                r
            }
            FaultKind::LeaseDelete => Ok(()),
            FaultKind::ProxySwallow => swallow(&mut s, &fault.target, false),
            FaultKind::StoreFull => store_full(&mut s, &fault.target, false).await,
            FaultKind::ProxyLatency => proxy_of(&s, &fault.target).map(|p| p.clear_latency()),
            // Thawed whatever the loop's last step was.
            FaultKind::BrokerSlow => {
                run_step(&mut s, broker(BrokerFault::Cont, node_of(&fault.target))).await
            }
            FaultKind::Partition => partition(&mut s, node_of(&fault.target), false).await,
        };
        // A daemon the fault held is started again now, by the supervisor.
        let Stage { world, daemons, .. } = &mut *s;
        observe::poll(world, daemons, recorder, lease).await;
        match result {
            Ok(()) => {
                recorder.ok(
                    &op,
                    Done::FaultEnd {
                        evidence: evidence.clone(),
                    },
                );
                return;
            }
            Err(e) => last = e,
        }
    }
    recorder.fail(&op, last);
}

/// How long a fault of `spec` lasts, drawn. A credential let expire without a remint lasts
/// until the daemon's backstop after the expiry; with one, the remint comes the drawn time
/// after the expiry.
pub fn duration_of(spec: &FaultSpec, rng: &mut Prng) -> u64 {
    let drawn = rng.range(spec.duration_ms.0, spec.duration_ms.1);
    match spec.kind {
        FaultKind::CredentialExpiry => {
            config::SHORT_CREDENTIAL_MS + config::BROKER_GONE_BACKSTOP_MS + config::EXIT_MARGIN_MS
        }
        FaultKind::CredentialExpiryReminted => config::SHORT_CREDENTIAL_MS + drawn,
        _ => drawn,
    }
}

/// The faults of a run, their weights scaled by the seed's swarm draw (see `workload::work_mix`).
pub fn swarm(specs: Vec<FaultSpec>, rng: &mut Prng) -> Vec<FaultSpec> {
    let scaled: Vec<FaultSpec> = specs
        .iter()
        .map(|f| FaultSpec {
            weight: f.weight * [0, 1, 2, 3][rng.below(4) as usize],
            ..*f
        })
        .collect();
    let kinds: std::collections::BTreeSet<FaultKind> = scaled
        .iter()
        .filter(|f| f.weight > 0)
        .map(|f| f.kind)
        .collect();
    if kinds.len() < config::SWARM_MIN_FAULT_KINDS {
        return specs;
    }
    scaled
}

/// What the live nemesis needs.
pub struct Live {
    pub stage: Arc<Mutex<Stage>>,
    pub recorder: Arc<Recorder>,
    pub lease: LeaseWrites,
    pub specs: Vec<FaultSpec>,
    pub rng: Prng,
    /// Cluster nodes (1 on one broker).
    pub nodes: usize,
    /// Run ms at which faults may start and by which every fault must have ended.
    pub from_ms: Ms,
    pub until_ms: Ms,
    /// The workload, for the moves a fault is timed with (a leave raced on a store-full of
    /// `DLV_<s>`), and their own draws (a stream of their own: the faults' draws stay the
    /// seed's).
    pub work: Option<(Arc<crate::simulation::workload::Workload>, Prng)>,
}

/// The target a fault of `spec` aims at now.
async fn aim(live: &mut Live, spec: &FaultSpec) -> String {
    let s = live.stage.lock().await;
    let holder = s
        .daemons
        .holder(&live.lease)
        .or_else(|| s.daemons.plans.first().map(|p| p.name.clone()))
        .unwrap_or_default();
    match spec.aim {
        Aim::Holder => format!("daemon:{holder}"),
        Aim::Broker if live.nodes > 1 => format!("node:{}", live.rng.below(live.nodes as u64)),
        Aim::Broker => "broker".to_string(),
        Aim::HolderProxy | Aim::HolderWrites => {
            let via = s
                .daemons
                .plans
                .iter()
                .find(|p| p.name == holder)
                .map(|p| p.via.clone())
                .unwrap_or_default();
            if spec.aim == Aim::HolderWrites {
                let store = live
                    .rng
                    .pick(&["dinbox", "dlv"])
                    .copied()
                    .unwrap_or("dinbox");
                format!("proxy:{via}@{store}")
            } else {
                format!("proxy:{via}")
            }
        }
        Aim::Lease => "lease".to_string(),
        Aim::Store => {
            let names = &s.world.insp.names;
            let stream = match live.rng.pick(&["inbox", "dlv"]).copied() {
                Some("dlv") => names.dlv_stream(),
                _ => names.inbox_stream(),
            };
            format!("stream:{stream}")
        }
    }
}

/// The cluster node the serving daemon's connection is on now, by the nodes' own connection
/// lists; `None` when it cannot be told.
async fn daemon_node(live: &Live) -> Option<usize> {
    let probe = crate::simulation::observe::node_probe(&live.stage.lock().await.world);
    crate::simulation::observe::daemon_node(probe).await
}

/// Waits, bounded, until a daemon serves; the line of that serving observation.
async fn serving_line(live: &Live) -> Option<u64> {
    let deadline = Instant::now() + Duration::from_millis(config::SERVING_WAIT_MS);
    loop {
        {
            let s = live.stage.lock().await;
            if !s.daemons.serving.is_empty() {
                return s.daemons.last_line("serving", None);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(observe::OBSERVE_TICK).await;
    }
}

/// Arms, on the serving daemon's proxy, the delay of its publishes to the members bucket (its
/// member row writes: a join's or a leave's); the proxy's name, `None` when there is none.
async fn hold_member_writes(live: &Live) -> Option<String> {
    let s = live.stage.lock().await;
    let holder = s.daemons.holder(&live.lease)?;
    let via = s
        .daemons
        .plans
        .iter()
        .find(|p| p.name == holder)
        .map(|p| p.via.clone())?;
    let bucket = s.world.insp.names.members_bucket();
    s.world
        .proxy(&via)
        .ok()?
        .delay_publishes_to(&format!("$KV.{bucket}.>"));
    Some(via)
}

/// Waits (bounded, [`config::HELD_WRITE_WAIT_MS`]) until the proxy holds a member row write.
async fn write_held(live: &Live, via: &str) -> bool {
    let deadline = Instant::now() + Duration::from_millis(config::HELD_WRITE_WAIT_MS);
    while Instant::now() < deadline {
        {
            let s = live.stage.lock().await;
            if s.world.proxy(via).is_ok_and(|p| p.delayed_count() >= 1) {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// Hands the held member row writes over, in order, and disarms the delay.
async fn release_member_writes(live: &Live, via: &str) {
    if let Ok(p) = live.stage.lock().await.world.proxy(via) {
        p.release_delayed();
    }
}

/// Whether `active` is a fault on the `DLV_<s>` stream.
async fn active_target_is_dlv(live: &Live, active: &Active) -> bool {
    let dlv = live.stage.lock().await.world.insp.names.dlv_stream();
    active.target == format!("stream:{dlv}")
}

/// Draws and runs faults from `from_ms` until `until_ms`, one at a time.
pub async fn live(mut live: Live) {
    live.recorder.sleep_until_ms(live.from_ms).await;
    let weights: Vec<(usize, u64)> = live
        .specs
        .iter()
        .enumerate()
        .map(|(i, s)| (i, s.weight))
        .collect();
    let mut id = 0u64;
    loop {
        let after_line = serving_line(&live).await;
        let now = live.recorder.now_ms();
        let Some(spec) = live
            .rng
            .weighted(&weights)
            .and_then(|i| live.specs.get(i).copied())
        else {
            return;
        };
        let planned = duration_of(&spec, &mut live.rng);
        let gap = live
            .rng
            .range(config::FAULT_GAP_MS.0, config::FAULT_GAP_MS.1);
        if now + planned + 1_000 > live.until_ms {
            // Too long for what is left: try a short one, else stop.
            if now + 2_000 > live.until_ms {
                return;
            }
            live.recorder.sleep_until_ms(now + 500).await;
            continue;
        }
        id += 1;
        let target = aim(&mut live, &spec).await;
        let shape = match spec.kind {
            FaultKind::ProxyLatency => Some(FaultShape::Latency {
                base_ms: live
                    .rng
                    .range(config::LATENCY_BASE_MS.0, config::LATENCY_BASE_MS.1),
                jitter_ms: live
                    .rng
                    .range(config::LATENCY_JITTER_MS.0, config::LATENCY_JITTER_MS.1),
            }),
            FaultKind::BrokerSlow => Some(FaultShape::Stutter {
                stop_ms: live
                    .rng
                    .range(config::STUTTER_STOP_MS.0, config::STUTTER_STOP_MS.1),
                gap_ms: live
                    .rng
                    .range(config::STUTTER_GAP_MS.0, config::STUTTER_GAP_MS.1),
            }),
            FaultKind::Partition => Some(FaultShape::Partition {
                node: node_of(&target),
                daemon_node: daemon_node(&live).await,
            }),
            _ => None,
        };
        let planned_fault = Planned {
            id,
            kind: spec.kind,
            target,
            planned_ms: Some(planned),
            shape,
        };
        let active = start(
            &live.stage,
            &live.recorder,
            &live.lease,
            planned_fault,
            after_line,
        )
        .await;
        if let Some(active) = active {
            let mut end_at = now + planned;
            // A store-full of DLV_<s> holds the trusted reader's hand-offs back: a leave raced
            // by posts now has its answer before the posts the writer copied are handed off.
            // The leave's row write is held at the daemon's proxy meanwhile, so posts sent then
            // sit past its cursor and are copied by a fan-out writer that does not see the leave
            // yet; only the reader's re-check of the current leave cursor keeps them back.
            if spec.kind == FaultKind::StoreFull && active_target_is_dlv(&live, &active).await {
                let held = hold_member_writes(&live).await;
                let raced = live
                    .work
                    .as_mut()
                    .and_then(|(work, rng)| work.race_leave_now(rng));
                if let Some(via) = held {
                    if let (Some((partner, channel)), Some((work, _))) = (&raced, &live.work) {
                        if write_held(&live, &via).await {
                            work.posts_now(*partner, channel, config::HELD_POSTS);
                            tokio::time::sleep(Duration::from_millis(config::HELD_WRITE_MS)).await;
                        }
                    }
                    release_member_writes(&live, &via).await;
                    end_at = end_at
                        .max(live.recorder.now_ms() + config::STORE_FULL_AFTER_RELEASE_MS)
                        .min(now + config::STORE_FULL_MAX_MS);
                }
            }
            live.recorder.sleep_until_ms(end_at).await;
            end(&live.stage, &live.recorder, &live.lease, active).await;
        }
        let next = live.recorder.now_ms() + gap;
        if next >= live.until_ms {
            return;
        }
        live.recorder.sleep_until_ms(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two seeds draw different swarms, one seed always the same, and a draw keeps at least
    /// the floor of fault kinds.
    /// Mutation seen failing: `swarm` returning its input unscaled (every seed's weights alike).
    #[test]
    fn each_seed_draws_its_own_swarm_of_weights() {
        let draw = |seed| {
            let mut rng = Prng::stream(seed, "swarm");
            let f: Vec<u64> = swarm(config::faults(true, false), &mut rng)
                .iter()
                .map(|f| f.weight)
                .collect();
            let w: Vec<u64> = crate::simulation::workload::work_mix(&mut rng)
                .iter()
                .map(|(_, w)| *w)
                .collect();
            (f, w)
        };
        assert_eq!(draw(7), draw(7));
        let distinct: std::collections::BTreeSet<_> = (0..20).map(draw).collect();
        assert!(distinct.len() > 10, "{}", distinct.len());
        for seed in 0..50 {
            let kinds = draw(seed).0.iter().filter(|w| **w > 0).count();
            assert!(kinds >= config::SWARM_MIN_FAULT_KINDS);
        }
    }
}
