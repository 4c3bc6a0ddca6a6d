//! `harness`: qualifies a Cotal delivery daemon against real nats-server brokers.
//!
//! `harness qualify` runs the catalogue of cases (scenarios/<family>/*.toml, docs/qualify.md)
//! and reports a verdict per case, as a table, JSON and JUnit; `harness run FILE...` runs single
//! case files and prints their transcripts; `harness mutate` proves each case fails without its
//! behaviour; `harness simulate` runs a seeded workload and nemesis against a live mesh and checks
//! the history (docs/simulation.md). Exit 0 when everything selected passed (a simulation:
//! valid), 1 when something failed (invalid), 2 when it could not run (bad flags, no broker
//! binary, the daemon not executable; a simulation: unknown).

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use delivery_harness::kit::catalogue::{self, Catalogue, QualifyOptions};
use delivery_harness::kit::report::Subject;
use delivery_harness::kit::{mutate, run_case, Case, DaemonCmd, DaemonUnderTest, RunOptions};

#[derive(Debug, Parser)]
#[command(
    name = "harness",
    version,
    about = "Qualify a Cotal delivery daemon against real nats-server brokers",
    long_about = "Qualify a Cotal delivery daemon against real nats-server brokers.\n\n\
`harness qualify` runs every case of the catalogue (scenarios/<family>/*.toml: one seed sentence \
each, judged from what the broker holds) against the daemon under test and prints a verdict \
table; --json and --junit write reports a CI can gate on. docs/qualify.md explains the report; \
docs/scenarios.md is the language of the cases.\n\n\
Exit status: 0 every selected case passed, 1 one failed, 2 the run could not start."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
struct DaemonArgs {
    /// The daemon binary to qualify (a `cotal-delivery` of this distribution; default: this
    /// checkout's own build). A relative path is taken from the directory you type it in; a
    /// bare name that is no file there is looked up on PATH.
    #[arg(long, value_name = "PATH", conflicts_with = "daemon_cmd")]
    daemon: Option<PathBuf>,
    /// Another implementation, started through a command template with the placeholders
    /// {space} {server} {root} {creds} {tls_ca}; words inside `[ … ]` are dropped when one of
    /// their placeholders has no value. Cases that need this distribution's own commands are
    /// skipped, with the reason. Example: 'node daemon.js --space {space} --server {server}
    /// --root {root} [ --tls-ca {tls_ca} ]'.
    #[arg(long, value_name = "TEMPLATE")]
    daemon_cmd: Option<String>,
    /// The nats-server binary (default: NATS_SERVER_BIN, then .tools/, then PATH).
    #[arg(long, value_name = "PATH")]
    nats_server: Option<PathBuf>,
    /// Run the scaled form of the cases that run at the shipped defaults (their [scaled]
    /// windows): what `ci/test` does. Without it they run at the shipped 15 s window, 30 s
    /// lease TTL, 5 s standby retry.
    #[arg(long)]
    scaled: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the catalogue against a daemon and report a verdict per case.
    Qualify {
        #[command(flatten)]
        daemon: DaemonArgs,
        /// Run only this family or case id (repeatable).
        #[arg(long, value_name = "FAMILY_OR_ID")]
        only: Vec<String>,
        /// List the selected cases (id, family, shapes, sentence) and run nothing.
        #[arg(long)]
        list: bool,
        /// Cases run at once (each starts its own brokers).
        #[arg(short = 'j', long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
        jobs: u16,
        /// Rounds per case; figures are reported as p50 and max over them.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
        repeat: u16,
        /// Judge behaviour only: transcripts are not compared (an older release, another
        /// implementation).
        #[arg(long)]
        behaviour_only: bool,
        /// Write the report as JSON.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Write the report as JUnit XML (a suite per family, a test case per case).
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// Keep every case's broker and daemon logs under DIR (failed cases' logs are kept
        /// under ./qualify-logs/ without it).
        #[arg(long, value_name = "DIR")]
        keep: Option<PathBuf>,
        /// The catalogue (default: this checkout's scenarios/).
        #[arg(long, value_name = "DIR")]
        scenarios: Option<PathBuf>,
    },
    /// Run case files and print each normalised transcript and its figures.
    Run {
        /// Case files to run, in order (each on every shape it names).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Apply each mutation kept beside the cases to a scratch copy of this checkout, build the
    /// daemon there and run the case that must fail: KILLED or SURVIVED.
    Mutate {
        /// Only the mutations of this family, case or mutation id (repeatable).
        #[arg(long, value_name = "ID")]
        only: Vec<String>,
        /// List the mutations and run nothing.
        #[arg(long)]
        list: bool,
        /// The scratch copy (default: target/mutants); its build is reused between runs.
        #[arg(long, value_name = "DIR")]
        scratch: Option<PathBuf>,
        /// Write the results as JSON.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// The nats-server binary.
        #[arg(long, value_name = "PATH")]
        nats_server: Option<PathBuf>,
        /// The simulation's mutations instead (scenarios/simulation-mutations.toml): each
        /// broken build runs `harness simulate` with its seed and is KILLED when the verdict is
        /// invalid (docs/simulation.md).
        #[arg(long)]
        simulation: bool,
        /// With --simulation: run each seed against the unmutated build first (a control that
        /// is invalid itself proves nothing), once per seed.
        #[arg(long, requires = "simulation")]
        control: bool,
    },
    /// Run a seeded workload and nemesis against a live mesh, record the history, check it:
    /// valid (exit 0), invalid (1) or unknown (2). docs/simulation.md explains the run.
    #[command(long_about = SIMULATE_ABOUT)]
    Simulate(SimulateArgs),
}

const SIMULATE_ABOUT: &str =
    "Run a seeded simulation against a live mesh and check its history.\n\n\
Starts a mesh (one broker, or the 3-node R3 cluster with --cluster; a second host standing by \
with --standby), provisions a population of agents (default 20) in three durable channels and \
one live channel, and runs, drawn from the seed, a workload (durable posts, id-less posts, live \
posts with @mentions, joins, leaves, rejoins, agents offline and back, ACL rows narrowed and \
widened, lifecycles retired) and a nemesis (daemon SIGKILL, SIGSTOP shorter and longer than the \
broker-gone window, graceful restart, broker SIGKILL or SIGSTOP, a proxy that blackholes or cuts \
the daemon's connection, a cluster node killed, the daemon's credential let expire with and \
without a renewal, the lease row deleted, with --standby the holder killed or stopped). Phases: \
quiet, faults, heal, then a drain (every agent online until nothing is pending, bounded). The \
windows are shrunk through the documented overrides so faults land in a short run.\n\n\
The run directory (--keep DIR, else ./sim-runs/seed-<seed>-<time>) holds history.jsonl, \
snapshot.json, report.json and the daemons' and brokers' logs; it is removed after a valid run \
unless --keep names it. `harness simulate --check <dir>` checks a stored run again. An invalid run prints the command that replays it: `harness simulate \
--replay <dir>` runs the recorded schedule again against a fresh mesh; a replay that passes is \
reported as not reproduced, never as fixed.\n\n\
Exit status: 0 valid, 1 invalid, 2 unknown (something undecided) or could not run (bad flags, \
with a line naming what was wrong).";

#[derive(Debug, Args)]
struct SimulateArgs {
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
    /// Replay the run in DIR: its seed, its mesh shape and its schedule as it really happened.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["seed", "minutes", "cluster", "standby", "agents", "check"])]
    replay: Option<PathBuf>,
    /// Check the stored run in DIR again (its history.jsonl and snapshot.json) and print the
    /// verdict; nothing is started (Jepsen's analyze).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["seed", "minutes", "cluster", "standby", "agents", "keep", "daemon"])]
    check: Option<PathBuf>,
}

/// A run that could not start: the line naming why, and exit 2.
fn refuse(line: &str) -> ! {
    eprintln!("harness: {line}");
    std::process::exit(2);
}

/// `path` as the caller meant it: relative to the directory the command is typed in; a bare
/// name that is no file there stays a PATH lookup.
fn from_caller(path: PathBuf, cwd: &Path) -> PathBuf {
    let bare = path.components().count() == 1 && !cwd.join(&path).exists();
    if path.is_absolute() || bare {
        path
    } else {
        cwd.join(path)
    }
}

/// The program a name runs: itself when it has a directory part, else the first on PATH.
fn locate(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return Some(program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("{} is not an executable file", path.display()));
    }
    Ok(())
}

/// The first line a program prints for `--version`.
fn version_of(program: &Path) -> String {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .ok()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).to_string()
                + &String::from_utf8_lossy(&o.stderr);
            text.lines().next().unwrap_or_default().trim().to_string()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "(no --version)".into())
}

/// The daemon under test from the flags, checked; exits 2 when it cannot run.
fn daemon_under_test(args: &DaemonArgs, cwd: &Path) -> (DaemonUnderTest, String, String) {
    if let Some(bin) = &args.nats_server {
        let bin = from_caller(bin.clone(), cwd);
        if let Err(e) = executable(&bin) {
            refuse(&format!("--nats-server: {e}"));
        }
        // Read by every broker the harness starts (before any thread of the runtime exists).
        std::env::set_var(delivery_harness::rig::server_bin::NATS_SERVER_BIN_ENV, &bin);
    }
    if let Err(e) = delivery_harness::nats_server_bin() {
        refuse(&format!("no usable nats-server: {e} (ci/install-nats-server installs one; or pass --nats-server)"));
    }
    match (&args.daemon, &args.daemon_cmd) {
        (_, Some(t)) => {
            let cmd = DaemonCmd::parse(t).unwrap_or_else(|e| refuse(&e));
            let program = PathBuf::from(t.split_whitespace().next().unwrap_or_default());
            if locate(&program).filter(|p| p.is_file()).is_none() {
                refuse(&format!(
                    "--daemon-cmd: {} is not a file or on PATH",
                    program.display()
                ));
            }
            (
                DaemonUnderTest::Cmd(cmd),
                format!("--daemon-cmd {t}"),
                "(a command template)".into(),
            )
        }
        (Some(bin), None) => {
            let typed = bin.clone();
            let bin = from_caller(bin.clone(), cwd);
            let found = locate(&bin).filter(|p| p.exists()).unwrap_or_else(|| {
                refuse(&format!(
                    "--daemon {}: no such file ({}), and not on PATH",
                    typed.display(),
                    bin.display()
                ))
            });
            if let Err(e) = executable(&found) {
                refuse(&format!("--daemon: {e}"));
            }
            let v = version_of(&found);
            (
                DaemonUnderTest::Bin(found.clone()),
                found.display().to_string(),
                v,
            )
        }
        (None, None) => {
            let bin = delivery_harness::rig::daemon::daemon_bin()
                .unwrap_or_else(|e| refuse(&format!("the checkout's daemon: {e}")));
            let v = version_of(&bin);
            (DaemonUnderTest::Workspace, bin.display().to_string(), v)
        }
    }
}

fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| refuse(&format!("could not start the runtime: {e}")))
}

fn load_catalogue(dir: Option<PathBuf>, cwd: &Path) -> Catalogue {
    let root = dir
        .map(|d| from_caller(d, cwd))
        .unwrap_or_else(catalogue::shipped_root);
    Catalogue::load(&root).unwrap_or_else(|errors| {
        for e in &errors {
            eprintln!("harness: {e}");
        }
        refuse(&format!("{} case file(s) refused", errors.len()));
    })
}

fn main() {
    let cli = Cli::parse();
    let cwd = std::env::current_dir().unwrap_or_default();
    match cli.command {
        Command::Simulate(args) => simulate(args, &cwd),
        Command::Qualify {
            daemon,
            only,
            list,
            jobs,
            repeat,
            behaviour_only,
            json,
            junit,
            keep,
            scenarios,
        } => {
            let cat = load_catalogue(scenarios, &cwd);
            let cases = cat.select(&only).unwrap_or_else(|e| refuse(&e));
            if list {
                for c in &cases {
                    let shapes: Vec<&str> = c.shapes.iter().map(|s| s.as_str()).collect();
                    println!(
                        "{}\t{}\t{}\t{}{}",
                        c.id,
                        c.family,
                        shapes.join(","),
                        c.sentence.split_whitespace().collect::<Vec<_>>().join(" "),
                        c.distribution
                            .as_ref()
                            .map(|d| format!("\t(this distribution only: {d})"))
                            .unwrap_or_default()
                    );
                }
                return;
            }
            let (daemon_ut, daemon_name, daemon_version) = daemon_under_test(&daemon, &cwd);
            let nats =
                delivery_harness::nats_server_bin().unwrap_or_else(|e| refuse(&e.to_string()));
            let subject = Subject {
                daemon: daemon_name,
                daemon_version,
                nats_server: nats.display().to_string(),
                nats_server_version: version_of(&nats),
            };
            println!(
                "nats-server: {} ({})",
                subject.nats_server_version, subject.nats_server
            );
            println!(
                "daemon:      {} ({})",
                subject.daemon_version, subject.daemon
            );
            let units: usize = cases.iter().map(|c| c.shapes.len()).sum();
            println!(
                "cases:       {} ({} runs){}{}\n",
                cases.len(),
                units,
                if daemon.scaled {
                    ", scaled windows"
                } else {
                    ", shipped defaults"
                },
                if behaviour_only {
                    ", behaviour only"
                } else {
                    ""
                }
            );
            let opts = QualifyOptions {
                run: RunOptions {
                    daemon: daemon_ut,
                    scaled: daemon.scaled,
                },
                jobs: usize::from(jobs),
                repeat: usize::from(repeat),
                behaviour_only,
                keep: keep.map(|k| from_caller(k, &cwd)),
                failed_logs: cwd.join("qualify-logs"),
            };
            let report =
                runtime().block_on(catalogue::qualify(&cat, &cases, subject, &opts, |line| {
                    eprintln!("{line}");
                }));
            println!("{}", report.table());
            if let Some(p) = json {
                let p = from_caller(p, &cwd);
                if let Err(e) = write_atomic(&p, &report.json()) {
                    refuse(&format!("write {}: {e}", p.display()));
                }
            }
            if let Some(p) = junit {
                let p = from_caller(p, &cwd);
                if let Err(e) = write_atomic(&p, &report.junit()) {
                    refuse(&format!("write {}: {e}", p.display()));
                }
            }
            std::process::exit(report.exit_code());
        }
        Command::Run { files, daemon } => {
            let (daemon_ut, _, _) = daemon_under_test(&daemon, &cwd);
            let opts = RunOptions {
                daemon: daemon_ut,
                scaled: daemon.scaled,
            };
            let rt = runtime();
            let (mut passed, mut failed) = (0usize, 0usize);
            for (i, file) in files.iter().enumerate() {
                eprintln!("[{}/{}] {}", i + 1, files.len(), file.display());
                let case = match Case::load(&from_caller(file.clone(), &cwd)) {
                    Ok(c) => c,
                    Err(e) => refuse(&e.to_string()),
                };
                for shape in &case.shapes {
                    if let Some(why) = catalogue::skip_reason(&case, &opts) {
                        println!("skipped {} [{shape}]: {why}", case.id);
                        continue;
                    }
                    let run = rt.block_on(run_case(&case, shape, &opts, None));
                    println!("{}", run.transcript);
                    for (name, ms) in &run.figures {
                        println!("figure: {name}: {ms} ms");
                    }
                    match run.outcome {
                        Ok(()) => passed += 1,
                        Err(f) => {
                            failed += 1;
                            eprintln!("FAILED {} [{shape}]: {f}", case.id);
                        }
                    }
                }
            }
            println!("harness: {passed} passed, {failed} failed");
            std::process::exit(if failed == 0 { 0 } else { 1 });
        }
        Command::Mutate {
            only,
            list,
            scratch,
            json,
            nats_server,
            simulation: true,
            control,
        } => simulation_mutants(only, list, scratch, json, nats_server, control, &cwd),
        Command::Mutate {
            only,
            list,
            scratch,
            json,
            nats_server,
            ..
        } => {
            let workspace = catalogue::shipped_root()
                .parent()
                .and_then(|p| p.canonicalize().ok())
                .unwrap_or_default();
            let cat = load_catalogue(None, &cwd);
            let all = mutate::load(&cat, &workspace).unwrap_or_else(|errors| {
                for e in &errors {
                    eprintln!("harness: {e}");
                }
                refuse(&format!("{} mutation(s) refused", errors.len()));
            });
            let selected: Vec<mutate::Mutation> = all
                .into_iter()
                .filter(|m| {
                    only.is_empty()
                        || only.iter().any(|o| {
                            *o == m.id
                                || *o == m.case
                                || m.case.split('/').next() == Some(o.as_str())
                        })
                })
                .collect();
            if selected.is_empty() {
                refuse("no mutation selected");
            }
            if list {
                for m in &selected {
                    println!("{}\t{}\t{}\t{}", m.id, m.case, m.file, m.why);
                }
                return;
            }
            let _ = daemon_under_test(
                &DaemonArgs {
                    daemon: None,
                    daemon_cmd: None,
                    nats_server,
                    scaled: true,
                },
                &cwd,
            );
            let scratch = scratch
                .map(|s| from_caller(s, &cwd))
                .unwrap_or_else(|| workspace.join("target/mutants"));
            let results = runtime()
                .block_on(mutate::run(&cat, &workspace, &scratch, &selected, |l| {
                    eprintln!("{l}")
                }))
                .unwrap_or_else(|e| refuse(&e));
            let mut bad = 0;
            println!("{:<50} {:<45} fate", "mutation", "case");
            for r in &results {
                let fate = match r.fate {
                    mutate::Fate::Killed => "KILLED",
                    mutate::Fate::Survived => "SURVIVED",
                    mutate::Fate::Unbuildable => "UNBUILDABLE",
                    mutate::Fate::ControlFailed => "CONTROL FAILED",
                };
                if r.fate != mutate::Fate::Killed {
                    bad += 1;
                }
                println!("{:<50} {:<45} {fate}", r.mutation.id, r.mutation.case);
            }
            for r in results.iter().filter(|r| r.fate != mutate::Fate::Killed) {
                println!(
                    "\n{} ({:?}): {}\n  {}",
                    r.mutation.id,
                    r.fate,
                    r.mutation.why,
                    r.detail.replace('\n', "\n  ")
                );
            }
            println!("\n{} killed, {bad} not", results.len() - bad);
            if let Some(p) = json {
                let text = serde_json::to_string_pretty(&results).unwrap_or_default();
                if let Err(e) = write_atomic(&from_caller(p, &cwd), &text) {
                    refuse(&format!("write the JSON: {e}"));
                }
            }
            std::process::exit(if bad == 0 { 0 } else { 1 });
        }
    }
}

/// `harness simulate`: checks the flags (exit 2 naming what was wrong), runs, prints the table,
/// exits with the verdict's code.
fn simulate(args: SimulateArgs, cwd: &Path) -> ! {
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
    let recorded_daemon = replay
        .as_ref()
        .map(|r| PathBuf::from(&r.history.header.daemon))
        .filter(|p| p.is_file());
    let daemon_args = DaemonArgs {
        daemon: args.daemon.clone().or(recorded_daemon),
        daemon_cmd: None,
        nats_server: args.nats_server.clone(),
        scaled: false,
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

/// `harness mutate --simulation`: each broken daemon build of scenarios/simulation-mutations.toml
/// against its seed; exit 0 when every one was killed.
fn simulation_mutants(
    only: Vec<String>,
    list: bool,
    scratch: Option<PathBuf>,
    json: Option<PathBuf>,
    nats_server: Option<PathBuf>,
    control: bool,
    cwd: &Path,
) -> ! {
    use delivery_harness::simulation::mutants;
    let workspace = catalogue::shipped_root()
        .parent()
        .and_then(|p| p.canonicalize().ok())
        .unwrap_or_default();
    let all = mutants::load(&workspace).unwrap_or_else(|errors| {
        for e in &errors {
            eprintln!("harness: {e}");
        }
        refuse(&format!("{} mutation(s) refused", errors.len()));
    });
    let selected: Vec<mutants::SimMutation> = all
        .into_iter()
        .filter(|m| only.is_empty() || only.contains(&m.id))
        .collect();
    if selected.is_empty() {
        refuse("no mutation selected");
    }
    if list {
        for m in &selected {
            println!("{}\tseed {}\t{}\t{}", m.id, m.seed, m.file, m.why);
        }
        std::process::exit(0);
    }
    let _ = daemon_under_test(
        &DaemonArgs {
            daemon: None,
            daemon_cmd: None,
            nats_server,
            scaled: false,
        },
        cwd,
    );
    let scratch = scratch
        .map(|s| from_caller(s, cwd))
        .unwrap_or_else(|| workspace.join("target/mutants"));
    let runs = cwd.join("sim-runs").join("mutants");
    let results = runtime()
        .block_on(mutants::run(
            &workspace,
            &scratch,
            &runs,
            &selected,
            control,
            |l| eprintln!("{l}"),
        ))
        .unwrap_or_else(|e| refuse(&e));
    println!(
        "{:<42} {:>20} {:<9} {:>4} {:>6} {:>10} fate",
        "mutation", "seed", "verdict", "lost", "leaked", "unexpected"
    );
    for r in &results {
        println!(
            "{:<42} {:>20} {:<9} {:>4} {:>6} {:>10} {:?}",
            r.mutation.id,
            r.mutation.seed,
            r.verdict
                .map(|v| format!("{v:?}"))
                .unwrap_or_else(|| "-".into()),
            r.lost,
            r.leaked,
            r.unexpected,
            r.fate
        );
    }
    for r in results.iter().filter(|r| r.fate != mutants::Fate::Killed) {
        println!("\n{} ({:?}): {}", r.mutation.id, r.fate, r.why.join("; "));
    }
    println!("run directories: {}", runs.display());
    if let Some(p) = json {
        let text = serde_json::to_string_pretty(&results).unwrap_or_default();
        if let Err(e) = write_atomic(&from_caller(p, cwd), &text) {
            refuse(&format!("write the JSON: {e}"));
        }
    }
    let killed = results.iter().all(|r| r.fate == mutants::Fate::Killed);
    std::process::exit(if killed { 0 } else { 1 });
}
