//! `smoke soak`: a detached mesh (`cotal-delivery up --detach`) run for minutes on short
//! credentials, as an operator leaves one running: steady durable posts to members that are
//! offline most of the time, the renewal owner re-signing the credentials many times over, one
//! SIGKILL of the daemon (relaunched by a bare `up`, as the operator would) and one restart of
//! the broker (the same command line, port and store) in the middle.
//!
//! Judged at the end: every post surfaced to every member once it binds (nothing lost), the
//! daemon never ended on a credential expiry, at least `--min-renewals` renewals, and `status`
//! healthy. Progress lines go to stderr; `--json` prints one summary object on stdout.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cotal_delivery::agent::{Agent, AgentSpec, Backstop};
use cotal_delivery::base::{self, PidLiveness};
use cotal_delivery::provision::Workspace;
use cotal_delivery::provision::{provision_agent, AgentMaterial};
use cotal_delivery::provision::{MeshAuthority, MintOptions, Profile, ReadChannels, Roles};
use cotal_delivery::wire::{Principal, Space};
use delivery_harness::rig::daemon::DaemonSpec;
use delivery_harness::rig::server_bin::nats_server_bin;
use serde_json::json;

#[derive(clap::Args, Clone)]
pub struct Args {
    /// How long the mesh runs, in minutes (fractions allowed: 1.5).
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Lifetime of the standing credentials `up` mints and the renewal owner re-signs, in
    /// seconds (passed to `up --creds-lifetime-secs`): the owner re-signs at half of it.
    #[arg(long, default_value_t = 60)]
    pub creds_lifetime_secs: u64,
    /// The lease TTL (`up --lease-ttl-secs`): after the daemon's SIGKILL a bare `up` serves
    /// again once the killed daemon's row has expired.
    #[arg(long, default_value_t = 30)]
    pub lease_ttl_secs: u64,
    /// Interval of the durable sender, in milliseconds.
    #[arg(long, default_value_t = 1_000)]
    pub post_every_ms: u64,
    /// Members of the durable channel, offline except while they drain.
    #[arg(long, default_value_t = 3)]
    pub members: usize,
    /// Each member binds and surfaces what it is owed this often, in seconds (then goes
    /// offline again); it also keeps it well inside the per-member retention of 1000.
    #[arg(long, default_value_t = 45)]
    pub drain_every_secs: u64,
    /// Fewer renewals than this fails the suite.
    #[arg(long, default_value_t = 8)]
    pub min_renewals: usize,
    /// One JSON object on stdout instead of the summary lines.
    #[arg(long)]
    pub json: bool,
}

const SPACE: &str = "soak";
const CHANNEL: &str = "soak";
/// Bound on one step: a command's exit, a member's drain, a broker's restart.
const STEP_BOUND: Duration = Duration::from_secs(120);
/// Bound on one member's drain during the run (the posts stored before it bound).
const DRAIN_BOUND: Duration = Duration::from_secs(60);
/// Bound on one member's drain at the end (everything owed surfaced).
const FINAL_DRAIN_BOUND: Duration = Duration::from_secs(120);
/// A drain ends once nothing new arrived for this long.
const DRAIN_QUIET: Duration = Duration::from_secs(3);
/// Poll period of the bounded waits.
const POLL: Duration = Duration::from_millis(200);
/// A bare `up` refused without a stated expiry is tried again after this long; one refused
/// with one, this long after it.
const RELAUNCH_RETRY: Duration = Duration::from_secs(1);
/// The exit code of a daemon that could not claim the lease (docs/operations.md): the bare
/// `up`s run while the killed daemon's row has not expired yet end so.
const EXIT_LEASE_HELD: i64 = 6;

pub async fn run(args: Args) -> i32 {
    let root = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("soak: no temporary root: {e}");
            return 1;
        }
    };
    let guard = Leftovers(root.path().to_path_buf());
    // A stopped suite still takes down what it started (the guard runs on the way out).
    let outcome = tokio::select! {
        outcome = suite(&args, root.path()) => outcome,
        by = stopped() => Err(format!("stopped by {by}; the mesh it started was killed")),
    };
    drop(guard);
    match outcome {
        Ok(summary) => {
            let passed = summary["passed"] == true;
            if args.json {
                println!("{summary}");
            } else {
                for (k, v) in summary.as_object().into_iter().flatten() {
                    println!("{k}: {v}");
                }
            }
            if passed {
                0
            } else {
                eprintln!("soak: FAILED: {}", summary["failures"]);
                1
            }
        }
        Err(e) => {
            eprintln!("soak: {e}");
            if args.json {
                println!("{}", json!({"passed": false, "error": e}));
            }
            1
        }
    }
}

/// The first SIGINT or SIGTERM.
async fn stopped() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        },
        _ => std::future::pending().await,
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn say(t0: Instant, line: impl AsRef<str>) {
    eprintln!("soak: t={:>4}s {}", t0.elapsed().as_secs(), line.as_ref());
}

/// Kills (SIGKILL) what the detached mesh left when the suite ends early: the recorded
/// renewal owner, daemon and broker, only while their command lines prove what they are.
struct Leftovers(PathBuf);

/// A record and the command-line check that proves its process.
type Record = (PathBuf, fn(&[String]) -> bool);

impl Drop for Leftovers {
    fn drop(&mut self) {
        let space = Space::parse(SPACE).expect("the suite's space name");
        let records: [Record; 3] = [
            (
                base::remint_pid_path(&self.0, &space),
                base::argv_names_remint_watch,
            ),
            (
                base::pid_path(&self.0, &space),
                base::argv_names_delivery_daemon,
            ),
            (base::broker_pid_path(&self.0), base::argv_names_nats_server),
        ];
        for (path, is_it) in records {
            if let Some(pid) = base::read_pid(&path) {
                if let PidLiveness::Alive(p) = base::process_liveness(pid, is_it) {
                    kill(p, nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
    }
}

fn kill(pid: u32, sig: nix::sys::signal::Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), sig);
    }
}

fn alive(pid: u32) -> bool {
    base::process_alive(pid) && !base::is_zombie(pid)
}

/// `cotal-delivery <args…>` run to its exit (bounded) from `root`; the code and the transcript.
async fn command(root: &Path, args: &[&str]) -> Result<(Option<i32>, String), String> {
    let nats = nats_server_bin().map_err(err)?;
    let mut p = DaemonSpec::command(args, root)
        .env("NATS_SERVER_BIN", nats.display().to_string())
        .env("COTAL_HOME", root.join("home").display().to_string())
        .spawn()
        .map_err(err)?;
    let status = p.wait_exit(STEP_BOUND).await.map_err(err)?;
    Ok((status.code(), p.transcript()))
}

fn root_arg(root: &Path) -> Result<String, String> {
    root.to_str()
        .map(str::to_string)
        .ok_or_else(|| "the temporary root is not UTF-8".to_string())
}

/// A free loopback port (the broker's, kept across its restart).
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(err)
}

fn count(text: &str, needle: &str) -> usize {
    text.lines().filter(|l| l.contains(needle)).count()
}

fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// What one member has surfaced: each post id once, and how many came again.
#[derive(Default)]
struct Surfaced {
    ids: BTreeSet<String>,
    again: usize,
}

struct Member {
    material: AgentMaterial,
    surfaced: Surfaced,
}

async fn connect(url: &str, m: &AgentMaterial, name: &str) -> Result<Agent, String> {
    Agent::connect(AgentSpec::of_material(url, None, m, name))
        .await
        .map_err(|e| format!("{name} could not connect: {e}"))
}

/// The member comes online, surfaces (and acks) frames until it has every id of `want` (the
/// posts stored before it came online), or `bound` passed; then goes offline again.
async fn drain(
    url: &str,
    member: &mut Member,
    want: &BTreeSet<String>,
    bound: Duration,
) -> Result<usize, String> {
    let name = member.material.principal.actor().to_string();
    let agent = connect(url, &member.material, &name).await?;
    let mut delivery = agent.bind_delivery().await.map_err(err)?;
    let deadline = Instant::now() + bound;
    let mut got = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match delivery.surface(DRAIN_QUIET.min(left), |_| {}).await {
            Ok(Some(frame)) => {
                got += 1;
                let id = frame.msg["id"].as_str().unwrap_or_default().to_string();
                if !member.surfaced.ids.insert(id) {
                    member.surfaced.again += 1;
                }
                if want.is_subset(&member.surfaced.ids) {
                    break;
                }
            }
            Ok(None) if want.is_subset(&member.surfaced.ids) => break,
            Ok(None) => {}
            Err(e) => return Err(format!("{name}'s drain: {e}")),
        }
    }
    drop(delivery);
    let _ = agent.client().drain().await;
    Ok(got)
}

/// The mesh's broker URL, from `.cotal/mesh.json`.
fn mesh_url(root: &Path) -> Result<String, String> {
    base::MeshRecord::read(&base::mesh_state_path(root))
        .map_err(err)?
        .map(|r| r.server)
        .ok_or_else(|| "up recorded no mesh".to_string())
}

/// Restarts the broker as its supervisor would: SIGTERM, then the same command line (same
/// configuration, port, store and ports directory) in a process group of its own, its output
/// appended to `.cotal/nats.log`, its pid in `.cotal/nats.pid` (so `down` stops it). Returns
/// how long no broker listened.
async fn restart_broker(root: &Path) -> Result<Duration, String> {
    let record = base::broker_pid_path(root);
    let pid = base::read_pid(&record).ok_or("no .cotal/nats.pid")?;
    let argv = base::process_argv(pid).ok_or("the broker's command line cannot be read")?;
    if !base::argv_names_nats_server(&argv) {
        return Err(format!("pid {pid} is not a nats-server"));
    }
    let down_at = Instant::now();
    kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + STEP_BOUND;
    while alive(pid) {
        if Instant::now() > deadline {
            return Err(format!("the broker (pid {pid}) did not exit on SIGTERM"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join(".cotal").join("nats.log"))
        .map_err(err)?;
    let child = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(root)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(err)?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("restarting {}: {e}", argv[0]))?;
    let new_pid = child.id();
    base::write_atomic(&record, format!("{new_pid}\n").as_bytes()).map_err(err)?;
    // Ready once it listens (the ports file it writes names its pid).
    let ports = argv
        .iter()
        .position(|a| a == "--ports_file_dir")
        .and_then(|i| argv.get(i + 1))
        .map(PathBuf::from)
        .ok_or("the broker's command line has no --ports_file_dir")?;
    let file = ports.join(format!("nats-server_{new_pid}.ports"));
    while !file.exists() {
        if Instant::now() > deadline {
            return Err("the restarted broker did not listen".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The child is reaped by nobody but the system once this process ends; it is the mesh's.
    std::mem::forget(child);
    Ok(down_at.elapsed())
}

/// Runs bare `up` until it exits 0 (a killed daemon's lease row must expire first); returns
/// the attempts and the new daemon's pid.
async fn relaunch(root: &Path, t0: Instant) -> Result<(usize, u32), String> {
    let r = root_arg(root)?;
    let deadline = Instant::now() + STEP_BOUND;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (code, out) = command(root, &["up", "--space", SPACE, "--root", &r]).await?;
        if code == Some(0) {
            let space = Space::parse(SPACE).map_err(err)?;
            let pid = base::read_pid(&base::pid_path(root, &space))
                .ok_or("the relaunched daemon recorded nothing")?;
            return Ok((attempts, pid));
        }
        let last = out.lines().last().unwrap_or_default().to_string();
        say(
            t0,
            format!("bare up attempt {attempts}: exit {code:?}: {last}"),
        );
        if Instant::now() > deadline {
            return Err(format!(
                "no bare up served within {} s:\n{out}",
                STEP_BOUND.as_secs()
            ));
        }
        // As the operator reads it: the refusal says when the killed daemon's row expires.
        let wait = expires_in(&last).map_or(RELAUNCH_RETRY, |s| {
            Duration::from_secs(s).min(STEP_BOUND) + RELAUNCH_RETRY
        });
        tokio::time::sleep(wait).await;
    }
}

/// The seconds in `… expires in <n> s …` (`up`'s line for a row whose holder is not running).
fn expires_in(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once("expires in ")?;
    rest.split_once(" s")?.0.parse().ok()
}

/// The daemon's run-ended lines in its log: each run's exit code and reason, in order.
fn daemon_exits(log: &str) -> Vec<(i64, String)> {
    log.lines()
        .filter_map(|l| {
            l.split_once("• delivery: run ended — exit code ")
                .map(|(_, r)| r)
        })
        .filter_map(|r| {
            let (code, reason) = r.split_once(": ")?;
            Some((code.parse().ok()?, reason.to_string()))
        })
        .collect()
}

async fn suite(args: &Args, root: &Path) -> Result<serde_json::Value, String> {
    let t0 = Instant::now();
    let run_for = Duration::from_secs_f64((args.minutes * 60.0).max(30.0));
    let space = Space::parse(SPACE).map_err(err)?;
    let r = root_arg(root)?;
    let port = free_port()?.to_string();
    let lifetime = args.creds_lifetime_secs.max(4).to_string();
    let ttl = args.lease_ttl_secs.max(1).to_string();
    let (code, out) = command(
        root,
        &[
            "up",
            "--space",
            SPACE,
            "--root",
            &r,
            "--port",
            &port,
            "--detach",
            "--creds-lifetime-secs",
            &lifetime,
            "--lease-ttl-secs",
            &ttl,
        ],
    )
    .await?;
    if code != Some(0) {
        return Err(format!("up --detach exited {code:?}:\n{out}"));
    }
    let url = mesh_url(root)?;
    say(
        t0,
        format!(
            "detached mesh up at {url} (credentials {lifetime} s, lease TTL {ttl} s, {} min)",
            args.minutes
        ),
    );

    // Agents as the manager provisions them; members join durably, then go offline.
    let ws = Workspace::new(root);
    let authority = MeshAuthority::load(&ws.auth_dir()).map_err(err)?;
    let operator = authority
        .mint(&space, &Profile::Operator, MintOptions::new())
        .map_err(err)?;
    let op = cotal_delivery::base::connect_with_credential(
        &url,
        None,
        &operator,
        "soak-operator",
        Duration::from_secs(5),
    )
    .await
    .map_err(err)?;
    let js = async_nats::jetstream::new(op.clone());
    let read = ReadChannels::new([CHANNEL]).map_err(err)?;
    let provision = |actor: String| {
        let authority = &authority;
        let js = &js;
        let space = &space;
        let read = read.clone();
        async move {
            let principal = Principal::new("local", &actor).map_err(err)?;
            provision_agent(
                authority,
                js,
                space,
                &principal,
                read,
                Roles::none(),
                MintOptions::new(),
            )
            .await
            .map_err(err)
        }
    };
    let sender_m = provision("sender".into()).await?;
    let mut members = Vec::new();
    for i in 0..args.members.max(1) {
        let material = provision(format!("member{i}")).await?;
        let agent = connect(&url, &material, &format!("member{i}")).await?;
        let joined = agent.durable_join(CHANNEL).await.map_err(err)?;
        if let Backstop::Unestablished { reason } = &joined.backstop {
            return Err(format!(
                "member{i} joined without the durable backstop: {reason}"
            ));
        }
        let _ = agent.client().drain().await;
        members.push(Member {
            material,
            surfaced: Surfaced::default(),
        });
    }
    let _ = op.drain().await;
    say(
        t0,
        format!(
            "{} members joined {CHANNEL} durably and went offline",
            members.len()
        ),
    );

    // The steady sender: a post is counted once the broker stored it; a failed post (the
    // broker restarting) is retried with the same id.
    let posted: Arc<Mutex<Vec<String>>> = Arc::default();
    let post_failures = Arc::new(Mutex::new(0usize));
    let stop = Arc::new(AtomicBool::new(false));
    let sender = connect(&url, &sender_m, "sender").await?;
    let sending = {
        let (posted, failures, stop) = (posted.clone(), post_failures.clone(), stop.clone());
        let every = Duration::from_millis(args.post_every_ms.max(50));
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let id = format!("soak-{n}");
                let msg = sender.message(CHANNEL, &format!("soak post {n}"), Some(&id));
                match sender.post(CHANNEL, &msg).await {
                    Ok(_) => {
                        if let Ok(mut p) = posted.lock() {
                            p.push(id);
                        }
                        n += 1;
                        tokio::time::sleep(every).await;
                    }
                    Err(_) => {
                        if let Ok(mut f) = failures.lock() {
                            *f += 1;
                        }
                        tokio::time::sleep(POLL).await;
                    }
                }
            }
            let _ = sender.client().drain().await;
        })
    };
    let snapshot = |posted: &Arc<Mutex<Vec<String>>>| -> BTreeSet<String> {
        posted
            .lock()
            .map(|p| p.iter().cloned().collect())
            .unwrap_or_default()
    };

    // The schedule counts from the first post, so a slow start-up (a loaded machine) does not
    // shorten the run nor bring the faults forward.
    let running = Instant::now();
    let kill_at = run_for / 3;
    let restart_at = run_for * 2 / 3;
    let mut killed: Option<serde_json::Value> = None;
    let mut restarted: Option<serde_json::Value> = None;
    let drain_every = Duration::from_secs(args.drain_every_secs.max(5));
    let mut next_drain = running + drain_every;
    let mut drains = 0usize;
    // Member drains that ended (at their bound) without every post stored before the bind.
    let mut incomplete_drains = 0usize;
    let owner_log = base::remint_log_path(root, &space);
    let daemon_log = base::log_path(root, &space);
    while running.elapsed() < run_for {
        // Outside its SIGKILL, the daemon never stops: an exit (on a credential expiry, say)
        // ends the suite at once, with its last words.
        if base::pid_liveness(&base::pid_path(root, &space))
            .daemon_pid()
            .is_none()
        {
            let last = read_text(&daemon_log)
                .lines()
                .last()
                .unwrap_or_default()
                .to_string();
            return Err(format!("the daemon is not running; its log ends: {last}"));
        }
        if killed.is_none() && running.elapsed() >= kill_at {
            let pid = base::read_pid(&base::pid_path(root, &space)).ok_or("no daemon record")?;
            kill(pid, nix::sys::signal::Signal::SIGKILL);
            let at = Instant::now();
            say(
                t0,
                format!("SIGKILL to the daemon (pid {pid}); a bare up relaunches it"),
            );
            let (attempts, new_pid) = relaunch(root, t0).await?;
            let ms = at.elapsed().as_millis() as u64;
            say(
                t0,
                format!(
                    "daemon serving again (pid {new_pid}) after {ms} ms, {attempts} bare up run(s)"
                ),
            );
            killed = Some(
                json!({"pid": pid, "relaunched_pid": new_pid, "serving_again_ms": ms, "bare_up_runs": attempts}),
            );
        }
        if restarted.is_none() && running.elapsed() >= restart_at {
            say(t0, "restarting the broker (SIGTERM, the same command line)");
            let down = restart_broker(root).await?;
            say(
                t0,
                format!("broker listening again after {} ms", down.as_millis()),
            );
            restarted = Some(json!({"not_listening_ms": down.as_millis() as u64}));
        }
        if Instant::now() >= next_drain {
            // What was stored before the members come online; later posts wait for the next.
            let want = snapshot(&posted);
            let started = Instant::now();
            let mut short = 0;
            for m in members.iter_mut() {
                drain(&url, m, &want, DRAIN_BOUND).await?;
                if !want.is_subset(&m.surfaced.ids) {
                    short += 1;
                }
            }
            drains += 1;
            incomplete_drains += short;
            next_drain = Instant::now() + drain_every;
            say(
                t0,
                format!(
                    "drain {drains}: {} of {} members surfaced all {} posts stored before they bound ({} ms); renewals {}",
                    members.len() - short,
                    members.len(),
                    want.len(),
                    started.elapsed().as_millis(),
                    count(&read_text(&owner_log), "re-signed")
                ),
            );
        }
        tokio::time::sleep(POLL).await;
    }
    stop.store(true, Ordering::SeqCst);
    let _ = tokio::time::timeout(STEP_BOUND, sending).await;
    let all = snapshot(&posted);
    say(
        t0,
        format!("sender stopped after {} posts; final drains", all.len()),
    );
    let mut lost = 0usize;
    let mut again = 0usize;
    let mut per_member = Vec::new();
    for m in members.iter_mut() {
        drain(&url, m, &all, FINAL_DRAIN_BOUND).await?;
        let missing = all.difference(&m.surfaced.ids).count();
        lost += missing;
        again += m.surfaced.again;
        per_member.push(json!({
            "member": m.material.principal.dot_form(),
            "surfaced": all.intersection(&m.surfaced.ids).count(),
            "missing": missing,
            "again": m.surfaced.again,
        }));
    }

    let owner = read_text(&owner_log);
    let daemon = read_text(&daemon_log);
    let renewals = count(&owner, "re-signed");
    let adopted = count(&owner, "re-signed and adopted");
    let expiry_lines = count(&daemon, "credential expired");
    let (status_code, status_out) =
        command(root, &["status", "--space", SPACE, "--root", &r, "--json"]).await?;
    let status: serde_json::Value = status_out
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(serde_json::Value::Null);
    let healthy = status_code == Some(0) && status["healthy"] == true;
    let owner_alive = status["renewalOwner"]["verdict"] == "alive";
    // Every daemon exit before the `down`: only the bare `up`s refused on the killed daemon's
    // row may have ended one (its SIGKILL writes no line).
    let exits_before_down = daemon_exits(&daemon);
    let (down_code, down_out) = command(root, &["down", "--space", SPACE, "--root", &r]).await?;
    let exits = daemon_exits(&read_text(&daemon_log));
    let last_exit = exits.get(exits_before_down.len()).map(|(c, _)| *c);

    let mut failures = Vec::new();
    if lost > 0 {
        failures.push(format!("{lost} post deliveries missing"));
    }
    if incomplete_drains > 0 {
        failures.push(format!(
            "{incomplete_drains} member drain(s) without every post stored before the bind"
        ));
    }
    if renewals < args.min_renewals {
        failures.push(format!(
            "{renewals} renewals, fewer than {}",
            args.min_renewals
        ));
    }
    if expiry_lines > 0 {
        failures.push(format!(
            "the daemon logged {expiry_lines} credential-expiry line(s)"
        ));
    }
    if !healthy {
        failures.push(format!("status not healthy at the end: {status}"));
    }
    if !owner_alive {
        failures.push("no live renewal owner at the end".into());
    }
    if killed.is_none() || restarted.is_none() {
        failures.push("the run ended before both faults".into());
    }
    if down_code != Some(0) {
        failures.push(format!("down exited {down_code:?}: {down_out}"));
    }
    let unexpected: Vec<_> = exits_before_down
        .iter()
        .filter(|(c, _)| *c != EXIT_LEASE_HELD)
        .collect();
    if !unexpected.is_empty() {
        failures.push(format!(
            "the daemon exited while the mesh ran: {unexpected:?}"
        ));
    }
    if last_exit != Some(0) {
        failures.push(format!(
            "the daemon's last run ended with {last_exit:?} at the down, not exit code 0"
        ));
    }
    say(
        t0,
        format!(
            "done: {}",
            if failures.is_empty() {
                "passed"
            } else {
                "FAILED"
            }
        ),
    );
    Ok(json!({
        "passed": failures.is_empty(),
        "failures": failures,
        "minutes": args.minutes,
        "elapsed_s": t0.elapsed().as_secs(),
        "creds_lifetime_secs": args.creds_lifetime_secs,
        "lease_ttl_secs": args.lease_ttl_secs,
        "posts": all.len(),
        "post_retries": post_failures.lock().map(|f| *f).unwrap_or(0),
        "members": per_member,
        "lost": lost,
        "surfaced_again": again,
        "drains": drains,
        "incomplete_drains": incomplete_drains,
        "renewals": renewals,
        "adopted_on_reload": adopted,
        "daemon_expiry_lines": expiry_lines,
        "daemon_exit_codes": exits.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        "daemon_exits_before_down": exits_before_down.len(),
        "daemon_exit_at_down": last_exit,
        "down_exit": down_code,
        "daemon_kill": killed,
        "broker_restart": restarted,
        "status_healthy": healthy,
        "status_exit": status_code,
        "daemon_runs": count(&read_text(&daemon_log), "• delivery: run started"),
        "renewal_owner_alive": owner_alive,
    }))
}
