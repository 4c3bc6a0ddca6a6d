//! `harness simulate`: the flags checked (exit 2 naming what was wrong), a run, its table, and
//! the verdict's exit code.

use std::path::{Path, PathBuf};

use clap::Args;

use super::common::{daemon_under_test, from_caller, refuse, runtime, write_atomic, DaemonArgs};

pub const SIMULATE_ABOUT: &str =
    "Run a seeded simulation against a live mesh and check its history.\n\n\
Starts a mesh (one broker, or the 3-node R3 cluster with --cluster; a second host standing by \
with --standby), provisions a population of agents (default 20) in three durable channels and \
one live channel, and runs, drawn from the seed, a workload (durable posts, id-less posts, live \
posts with @mentions, joins, leaves, rejoins, posts raced on purpose against another member's \
join, leave or rejoin, agents offline and back, ACL rows narrowed and widened, lifecycles \
retired) and a nemesis (daemon SIGKILL, SIGSTOP shorter and longer than the broker-gone window, \
graceful restart, broker SIGKILL or SIGSTOP, a slow broker (SIGSTOPs shorter than the ping \
interval, repeated), a proxy that blackholes, cuts, swallows or delays (latency and jitter) the \
daemon's connection, a store refusing writes, a cluster node killed, a cluster node cut off \
from the other two (a partition, the daemon on either side), the daemon's credential let expire \
with and without a remint, the lease row deleted, with --standby the holder killed or \
stopped), each seed drawing its own weights (swarm testing). The history records every write \
to the members and ACL buckets as the broker stored it, which decides cursors and ACL states. \
Phases: quiet, faults, heal, then a drain (every agent online until nothing is pending, \
bounded). The windows are shrunk through the documented overrides so faults land in a short \
run.\n\n\
The long mode (--seeds A..B or --hours H) runs seeds back to back, one line per run and a table \
at the end, and stops at the first invalid run with its replay command.\n\n\
The run directory (--keep DIR, else ./sim-runs/seed-<seed>-<time>) holds history.jsonl, \
snapshot.json, report.json and the daemons' and brokers' logs; it is removed after a valid run \
unless --keep names it. `harness simulate --check <dir>` checks a stored run again. An invalid run prints the command that replays it: `harness simulate \
--replay <dir>` runs the recorded schedule again against a fresh mesh; a replay that passes is \
reported as not reproduced, never as fixed.\n\n\
Exit status: 0 valid, 1 invalid, 2 unknown (something undecided) or could not run (bad flags, \
with a line naming what was wrong).";

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// The daemon binary to simulate against (default: this checkout's own build; with
    /// --replay, the binary the run recorded, when it still exists).
    #[arg(long, value_name = "PATH")]
    daemon: Option<PathBuf>,
    /// The nats-server binary (default: NATS_SERVER_BIN, then .tools/, then PATH).
    #[arg(long, value_name = "PATH")]
    nats_server: Option<PathBuf>,
    /// The seed every draw comes from: the population, the workload, the nemesis (default:
    /// drawn from the clock, and printed).
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Minutes of quiet, faults and heal (15 %, 60 %, 25 %); the drain comes after them.
    /// Default 5; a decimal is allowed; at most 600.
    #[arg(long, value_name = "M")]
    minutes: Option<f64>,
    /// On the 3-node R3 cluster (a node killed is one of the faults).
    #[arg(long)]
    cluster: bool,
    /// Two standby hosts (`deliver --spaces`): one serves, the other takes over; the holder
    /// is what daemon faults aim at.
    #[arg(long)]
    standby: bool,
    /// Agents in the population (2 to 64; default 20).
    #[arg(long, value_name = "N")]
    agents: Option<usize>,
    /// Write the checker's report as JSON to FILE too.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// The run directory (kept whatever the verdict); it must not hold a history yet.
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
    /// The long mode: run seeds A to B (inclusive) back to back, one line per run, a table at
    /// the end; stops at the first invalid run and prints its replay command. Each run is
    /// --minutes long (default 5) on the shape the other flags give (or rotated).
    #[arg(long, value_name = "A..B", conflicts_with_all = ["seed", "hours"])]
    seeds: Option<String>,
    /// The long mode for H hours of wall time (a decimal is allowed): seeds from --seed (default
    /// drawn from the clock) upwards, back to back, until H hours have passed (a run started
    /// before then is finished).
    #[arg(long, value_name = "H")]
    hours: Option<f64>,
    /// In the long mode, cycle the runs through one broker, the 3-node cluster and two standby
    /// hosts (run i on shape i mod 3) instead of the shape --cluster / --standby give.
    #[arg(long, conflicts_with_all = ["cluster", "standby"])]
    rotate_shapes: bool,
    /// Replay the run in DIR: its seed, its mesh shape and its schedule as it really happened.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["seed", "minutes", "cluster", "standby", "agents", "check", "seeds", "hours", "rotate_shapes"])]
    replay: Option<PathBuf>,
    /// Check the stored run in DIR again (its history.jsonl and snapshot.json) and print the
    /// verdict; nothing is started (Jepsen's analyze).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["seed", "minutes", "cluster", "standby", "agents", "keep", "daemon", "seeds", "hours", "rotate_shapes"])]
    check: Option<PathBuf>,
}

/// `A..B` (inclusive), A at most B.
fn parse_seeds(raw: &str) -> Result<(u64, u64), String> {
    let (a, b) = raw
        .split_once("..")
        .ok_or_else(|| format!("--seeds {raw:?}: give a range A..B, as 1..20"))?;
    let num = |t: &str| {
        t.trim()
            .parse::<u64>()
            .map_err(|e| format!("--seeds {raw:?}: {t:?} is not a seed ({e})"))
    };
    let (a, b) = (num(a)?, num(b)?);
    if a > b {
        return Err(format!("--seeds {raw:?}: {a} is past {b}"));
    }
    Ok((a, b))
}

/// `harness simulate`: checks the flags (exit 2 naming what was wrong), runs, prints the table,
/// exits with the verdict's code.
pub fn run(args: SimulateArgs, cwd: &Path) -> ! {
    use delivery_harness::simulation::{config, runner, summary};
    if let Some(dir) = &args.check {
        let dir = from_caller(dir.clone(), cwd);
        let history = delivery_harness::simulation::check::History::read_dir(&dir)
            .unwrap_or_else(|e| refuse(&format!("--check {}: {e}", dir.display())));
        let snapshot = delivery_harness::simulation::check::Snapshot::read_dir(&dir)
            .unwrap_or_else(|e| refuse(&format!("--check {}: {e}", dir.display())));
        let report = delivery_harness::simulation::check::check(
            &history,
            &snapshot,
            &config::check_config(),
        );
        println!("{}", report.summary());
        if let Some(p) = args.json {
            let text = report
                .to_json()
                .unwrap_or_else(|e| refuse(&format!("the report as JSON: {e}")));
            if let Err(e) = write_atomic(&from_caller(p, cwd), &text) {
                refuse(&format!("write the JSON: {e}"));
            }
        }
        std::process::exit(report.verdict.exit_code());
    }
    let unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let replay = args.replay.as_ref().map(|dir| {
        let dir = from_caller(dir.clone(), cwd);
        match delivery_harness::simulation::check::History::read_dir(&dir) {
            Ok(history) => runner::ReplaySource { dir, history },
            Err(e) => refuse(&format!("--replay {}: {e}", dir.display())),
        }
    });
    let minutes = args.minutes.unwrap_or(config::DEFAULT_MINUTES);
    if !(minutes.is_finite() && minutes > 0.0 && minutes <= config::MAX_MINUTES) {
        refuse(&format!(
            "--minutes {minutes}: give a number of minutes above 0 and at most {}",
            config::MAX_MINUTES
        ));
    }
    let agents = args.agents.unwrap_or(config::DEFAULT_AGENTS);
    if !(2..=config::MAX_AGENTS).contains(&agents) {
        refuse(&format!(
            "--agents {agents}: give 2 to {} agents",
            config::MAX_AGENTS
        ));
    }
    if args.seeds.is_some() || args.hours.is_some() {
        batch(&args, cwd, minutes, agents, unix_s);
    }
    if args.rotate_shapes {
        refuse("--rotate-shapes: give --seeds A..B or --hours H (it applies to the long mode)");
    }
    let recorded_daemon = replay
        .as_ref()
        .map(|r| PathBuf::from(&r.history.header.daemon))
        .filter(|p| p.is_file());
    let daemon_args = DaemonArgs {
        daemon: args.daemon.clone().or(recorded_daemon),
        daemon_cmd: None,
        host_cmd: None,
        nats_server: args.nats_server.clone(),
        scaled: false,
        profile: None,
    };
    let (daemon, daemon_label, version) = daemon_under_test(&daemon_args, cwd);
    let (seed, cluster, standby, minutes) = match &replay {
        Some(r) => {
            let h = &r.history.header;
            let phases = delivery_harness::simulation::replay::phases(&r.history);
            (
                h.seed,
                h.cluster,
                h.standby,
                phases.drain_from() as f64 / 60_000.0,
            )
        }
        None => (
            args.seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0)
            }),
            args.cluster,
            args.standby,
            minutes,
        ),
    };
    let dir = match (&args.keep, &replay) {
        (Some(k), _) => from_caller(k.clone(), cwd),
        (None, Some(r)) => cwd.join("sim-runs").join(format!(
            "replay-of-{}-{unix_s}",
            r.dir
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default()
        )),
        (None, None) => cwd.join("sim-runs").join(format!("seed-{seed}-{unix_s}")),
    };
    let replay_of = replay.as_ref().map(|r| r.dir.clone());
    eprintln!(
        "harness simulate: seed {seed}, {minutes:.1} minutes, {}{}, {agents} agents, daemon {daemon_label} ({version})",
        if cluster { "3-node cluster" } else { "one broker" },
        if standby { ", two standby hosts" } else { "" },
    );
    if let Some(of) = &replay_of {
        eprintln!("replaying the schedule of {}", of.display());
    }
    eprintln!("run directory: {}", dir.display());
    let opts = runner::Options {
        daemon,
        daemon_label,
        seed,
        minutes,
        cluster,
        standby,
        agents,
        dir: dir.clone(),
        replay,
        progress: true,
    };
    let outcome = match runtime().block_on(runner::run(opts)) {
        Ok(o) => o,
        Err(e) => refuse(&format!("the simulation could not reach a verdict: {e}")),
    };
    let row = summary::Row {
        seed,
        minutes,
        cluster,
        standby,
        report: &outcome.report,
        tally: &outcome.tally,
        wall: outcome.wall,
        drained: outcome.drained,
    };
    println!("{}", row.table());
    if let Some(p) = args.json {
        let p = from_caller(p, cwd);
        match outcome.report.to_json() {
            Ok(text) => {
                if let Err(e) = write_atomic(&p, &text) {
                    refuse(&format!("write {}: {e}", p.display()));
                }
            }
            Err(e) => refuse(&format!("the report as JSON: {e}")),
        }
    }
    let verdict = outcome.report.verdict;
    use delivery_harness::simulation::check::Verdict;
    match (&replay_of, verdict) {
        (Some(of), Verdict::Valid) => println!(
            "not reproduced: the replay of {} found nothing invalid (a replay that passes proves nothing fixed: real processes do not replay exactly)",
            of.display()
        ),
        (Some(of), Verdict::Invalid) => {
            println!("reproduced: the replay of {} is invalid too", of.display())
        }
        _ => {}
    }
    if verdict == Verdict::Invalid {
        println!(
            "replay it with: harness simulate --replay {}",
            outcome.dir.display()
        );
    }
    if verdict == Verdict::Valid && args.keep.is_none() {
        let _ = std::fs::remove_dir_all(&outcome.dir);
    } else {
        println!("run directory kept: {}", outcome.dir.display());
    }
    std::process::exit(verdict.exit_code());
}

/// The long mode: runs back to back, one line each, the table at the end; stops at the first
/// invalid run with its replay command. Exit: 0 every run valid, 1 an invalid run, 2 a run
/// unknown or one that could not run.
fn batch(args: &SimulateArgs, cwd: &Path, minutes: f64, agents: usize, unix_s: u64) -> ! {
    use delivery_harness::simulation::batch::{self, Item, MeshShape, RunOutcome};
    use delivery_harness::simulation::check::Verdict;
    use delivery_harness::simulation::runner;
    let range = args
        .seeds
        .as_deref()
        .map(|raw| parse_seeds(raw).unwrap_or_else(|e| refuse(&e)));
    let hours = args.hours;
    if let Some(h) = hours {
        if !(h.is_finite() && h > 0.0 && h <= 48.0) {
            refuse(&format!(
                "--hours {h}: give a number of hours above 0 and at most 48"
            ));
        }
    }
    let first = range.map(|(a, _)| a).unwrap_or_else(|| {
        args.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        })
    });
    let daemon_args = DaemonArgs {
        daemon: args.daemon.clone(),
        daemon_cmd: None,
        host_cmd: None,
        nats_server: args.nats_server.clone(),
        scaled: false,
        profile: None,
    };
    let (daemon, daemon_label, version) = daemon_under_test(&daemon_args, cwd);
    let root = match &args.keep {
        Some(k) => from_caller(k.clone(), cwd),
        None => cwd.join("sim-runs").join(format!("batch-{unix_s}")),
    };
    if let Err(e) = std::fs::create_dir_all(&root) {
        refuse(&format!("create {}: {e}", root.display()));
    }
    eprintln!(
        "harness simulate (long mode): seeds from {first}{}, {minutes:.1} minutes each, {agents} agents, {}, daemon {daemon_label} ({version}); runs in {}",
        match (range, hours) {
            (Some((_, b)), _) => format!(" to {b}"),
            (None, Some(h)) => format!(" for {h} hours"),
            (None, None) => String::new(),
        },
        if args.rotate_shapes {
            "shapes rotated (one broker, cluster, standby)".to_string()
        } else {
            MeshShape { cluster: args.cluster, standby: args.standby }.name().to_string()
        },
        root.display()
    );
    let started = std::time::Instant::now();
    let mut items: Vec<Item> = Vec::new();
    let mut seed = first;
    let mut invalid_dir: Option<PathBuf> = None;
    loop {
        let more = match (range, hours) {
            (Some((_, b)), _) => seed <= b,
            (None, Some(h)) => started.elapsed().as_secs_f64() < h * 3600.0,
            (None, None) => false,
        };
        if !more {
            break;
        }
        let shape = if args.rotate_shapes {
            MeshShape::ROTATION[items.len() % MeshShape::ROTATION.len()]
        } else {
            MeshShape {
                cluster: args.cluster,
                standby: args.standby,
            }
        };
        let dir = root.join(format!(
            "seed-{seed}-{}",
            shape.name().replace([' ', '+'], "-")
        ));
        let load_before = batch::load_average();
        let t = std::time::Instant::now();
        let opts = runner::Options {
            daemon: daemon.clone(),
            daemon_label: daemon_label.clone(),
            seed,
            minutes,
            cluster: shape.cluster,
            standby: shape.standby,
            agents,
            dir: dir.clone(),
            replay: None,
            progress: false,
        };
        let outcome = match runtime().block_on(runner::run(opts)) {
            Ok(f) => {
                let _ = std::fs::write(dir.join("table.txt"), {
                    let row = delivery_harness::simulation::summary::Row {
                        seed,
                        minutes,
                        cluster: shape.cluster,
                        standby: shape.standby,
                        report: &f.report,
                        tally: &f.tally,
                        wall: f.wall,
                        drained: f.drained,
                    };
                    row.table()
                });
                RunOutcome::of(&f.report, &f.dir)
            }
            Err(e) => RunOutcome::CouldNotRun(e.to_string()),
        };
        let item = Item {
            seed,
            shape,
            minutes,
            wall: t.elapsed(),
            load: (load_before, batch::load_average()),
            outcome,
        };
        println!("{}", item.line(items.len() + 1));
        let verdict = item.outcome.verdict();
        if verdict == Some(Verdict::Valid) && args.keep.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        items.push(item);
        let _ = std::fs::write(root.join("batch.md"), batch::table(&items));
        if verdict == Some(Verdict::Invalid) {
            invalid_dir = Some(dir);
            break;
        }
        seed += 1;
    }
    println!();
    println!("{}", batch::table(&items));
    println!("the table is in {}", root.join("batch.md").display());
    if let Some(dir) = invalid_dir {
        if let Some(Item {
            outcome: RunOutcome::Ran { why, .. },
            ..
        }) = items.last()
        {
            for w in why {
                println!("  - {w}");
            }
        }
        println!(
            "stopped at the first invalid run; replay it with: harness simulate --replay {}",
            dir.display()
        );
        std::process::exit(1);
    }
    let all_valid = !items.is_empty()
        && items
            .iter()
            .all(|i| i.outcome.verdict() == Some(Verdict::Valid));
    std::process::exit(if all_valid { 0 } else { 2 });
}
