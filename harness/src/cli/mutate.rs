//! `harness mutate`: each mutation kept beside the cases applied to a scratch copy of this
//! checkout, the daemon built there and its case run on every shape, twice, under the profile of
//! the step it names (KILLED at that step, WRONG-STEP, FLAKY, SURVIVED); with `--simulation`,
//! each broken build of the simulation against its seed; with `--neutral`, the neutral build
//! (cases/neutral.toml) against the whole catalogue under both profiles.

use std::path::{Path, PathBuf};

use clap::Args;
use delivery_harness::kit::catalogue::{self, QualifyOptions};
use delivery_harness::kit::results::Subject;
use delivery_harness::kit::{mutate, neutral, DaemonUnderTest, KitProfile, RunOptions};

use super::common::{
    daemon_under_test, exit, from_caller, load_catalogue, refuse, runtime, version_of,
    write_atomic, DaemonArgs,
};

#[derive(Debug, Args)]
pub struct MutateArgs {
    /// Only the mutations of this family, case or mutation id (repeatable).
    #[arg(long, value_name = "ID")]
    pub only: Vec<String>,
    /// List the mutations and run nothing.
    #[arg(long)]
    pub list: bool,
    /// The scratch copy (default: target/mutants); its build is reused between runs.
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
    /// Write the results as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// The nats-server binary.
    #[arg(long, value_name = "PATH")]
    pub nats_server: Option<PathBuf>,
    /// The simulation's mutations instead (cases/simulation-mutations.toml): each
    /// broken build runs `harness simulate` with its seed and is KILLED when the verdict is
    /// invalid (docs/simulation.md).
    #[arg(long)]
    pub simulation: bool,
    /// With --simulation: run each seed against the unmutated build first (a control that
    /// is invalid itself proves nothing), once per seed.
    #[arg(long, requires = "simulation")]
    pub control: bool,
    /// The neutral build instead (cases/neutral.toml): this daemon with every line and reply
    /// error text the seeds do not quote reworded, every exit code changed and every knob no seed
    /// names ignored, run against the
    /// catalogue (or the families and cases of --only) under the contract profile, then the
    /// distribution profile (scaled); both tables, and exit 0 only when the contract run passes
    /// with no failure and no blocked case and the distribution run fails (docs/qualify.md,
    /// "Proved neutral").
    #[arg(long, conflicts_with_all = ["simulation", "list"])]
    pub neutral: bool,
    /// With --neutral: cases run at once.
    #[arg(short = 'j', long, value_name = "N", default_value_t = 1, requires = "neutral", value_parser = clap::value_parser!(u16).range(1..=16))]
    pub jobs: u16,
}

/// The checkout whose sources every mutation edits: the one this harness was built in, when it
/// runs from inside it. An unpacked kit has no sources, so it is told plainly.
/// Refuses (exit 2) before any build when the broker is unusable or this checkout's daemon is
/// not built, as `qualify` does: the flags of the run, not the daemon it will build, are checked.
fn check_broker_and_build(nats_server: Option<PathBuf>, cwd: &Path) {
    let _ = daemon_under_test(
        &DaemonArgs {
            daemon: None,
            daemon_cmd: None,
            host_cmd: None,
            nats_server,
            scaled: false,
            profile: None,
        },
        cwd,
    );
}

fn sources() -> PathBuf {
    delivery_harness::rig::checkout::root().unwrap_or_else(|| {
        refuse(
            "harness mutate edits and builds this repository's sources (daemon/, cases/), and this harness runs outside the checkout it was built in (an unpacked kit, a copied binary): run it from a cotal-delivery checkout, `cargo run -p delivery-harness -- mutate`",
        )
    })
}

pub fn run(args: MutateArgs, cwd: &Path) -> ! {
    let MutateArgs {
        only,
        list,
        scratch,
        json,
        nats_server,
        simulation,
        control,
        neutral,
        jobs,
    } = args;
    if neutral {
        neutral_build(only, scratch, json, nats_server, usize::from(jobs), cwd)
    }
    if simulation {
        simulation_mutants(only, list, scratch, json, nats_server, control, cwd)
    }
    let workspace = sources();
    let loaded = load_catalogue(Some(workspace.join("cases")), cwd);
    let cat = loaded.cat;
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
                    *o == m.id || *o == m.case || m.case.split('/').next() == Some(o.as_str())
                })
        })
        .collect();
    if selected.is_empty() {
        refuse("no mutation selected");
    }
    if list {
        for m in &selected {
            let profile = cat
                .cases
                .iter()
                .find(|c| c.id == m.case)
                .map(|c| mutate::profile_of(m, c).to_string())
                .unwrap_or_default();
            println!(
                "{}\t{}\tstep {:?}\t{profile}\t{}\t{}",
                m.id, m.case, m.step, m.file, m.why
            );
        }
        exit(0);
    }
    check_broker_and_build(nats_server, cwd);
    let scratch = scratch
        .map(|s| from_caller(s, cwd))
        .unwrap_or_else(|| workspace.join("target/mutants"));
    let results = runtime()
        .block_on(mutate::run(&cat, &workspace, &scratch, &selected, |l| {
            eprintln!("{l}")
        }))
        .unwrap_or_else(|e| refuse(&e));
    let mut bad = 0;
    let shapes_of = |r: &mutate::MutationResult| {
        cat.cases
            .iter()
            .find(|c| c.id == r.mutation.case)
            .map(|c| {
                c.shapes
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default()
    };
    println!(
        "{:<52} {:<48} {:<22} {:<30} fate",
        "mutation", "case", "shape(s)", "step"
    );
    for r in &results {
        if r.fate != mutate::Fate::Killed {
            bad += 1;
        }
        println!(
            "{:<52} {:<48} {:<22} {:<30} {}{}",
            r.mutation.id,
            r.mutation.case,
            shapes_of(r),
            format!("{:?}", r.mutation.step),
            r.fate.as_str(),
            if r.fate == mutate::Fate::Killed && r.proves == KitProfile::Distribution {
                " (distribution profile only)"
            } else {
                ""
            }
        );
    }
    for r in results.iter().filter(|r| r.fate != mutate::Fate::Killed) {
        println!(
            "\n{} ({}): {}\n  {}",
            r.mutation.id,
            r.fate.as_str(),
            r.mutation.why,
            r.detail.replace('\n', "\n  ")
        );
    }
    let killed = results.len() - bad;
    let distribution_only = results
        .iter()
        .filter(|r| r.fate == mutate::Fate::Killed && r.proves == KitProfile::Distribution)
        .count();
    println!(
        "\n{killed} killed at their named step ({} proving the contract profile, {distribution_only} the distribution profile only), {bad} not",
        killed - distribution_only
    );
    if let Some(p) = json {
        let text = serde_json::to_string_pretty(&results).unwrap_or_default();
        if let Err(e) = write_atomic(&from_caller(p, cwd), &text) {
            refuse(&format!("write the JSON: {e}"));
        }
    }
    exit(if bad == 0 { 0 } else { 1 });
}

/// `harness mutate --simulation`: each broken daemon build of cases/simulation-mutations.toml
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
    let workspace = sources();
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
        exit(0);
    }
    check_broker_and_build(nats_server, cwd);
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
    for r in results
        .iter()
        .filter(|r| r.fate != mutants::MutantFate::Killed)
    {
        println!("\n{} ({:?}): {}", r.mutation.id, r.fate, r.why.join("; "));
    }
    println!("run directories: {}", runs.display());
    if let Some(p) = json {
        let text = serde_json::to_string_pretty(&results).unwrap_or_default();
        if let Err(e) = write_atomic(&from_caller(p, cwd), &text) {
            refuse(&format!("write the JSON: {e}"));
        }
    }
    let killed = results
        .iter()
        .all(|r| r.fate == mutants::MutantFate::Killed);
    exit(if killed { 0 } else { 1 });
}

/// `harness mutate --neutral`: the neutral build against the catalogue under the contract
/// profile, then the distribution profile; exit 0 only when it is proved neutral.
fn neutral_build(
    only: Vec<String>,
    scratch: Option<PathBuf>,
    json: Option<PathBuf>,
    nats_server: Option<PathBuf>,
    jobs: usize,
    cwd: &Path,
) -> ! {
    let workspace = sources();
    let loaded = load_catalogue(Some(workspace.join("cases")), cwd);
    let cat = &loaded.cat;
    let cases = cat.select(&only).unwrap_or_else(|e| refuse(&e));
    let edits = neutral::load(&cat.root, &workspace).unwrap_or_else(|errors| {
        for e in &errors {
            eprintln!("harness: {e}");
        }
        refuse(&format!("{} neutral edit(s) refused", errors.len()));
    });
    check_broker_and_build(nats_server, cwd);
    let nats = delivery_harness::nats_server_bin().unwrap_or_else(|e| refuse(&e.to_string()));
    let scratch = scratch
        .map(|s| from_caller(s, cwd))
        .unwrap_or_else(|| workspace.join("target/mutants"));
    let bin = neutral::build(&workspace, &scratch, &edits, &|l| eprintln!("{l}"))
        .unwrap_or_else(|e| refuse(&e));
    let subject = Subject {
        daemon: bin.display().to_string(),
        daemon_version: version_of(&bin),
        nats_server: nats.display().to_string(),
        nats_server_version: version_of(&nats),
        catalogue: loaded.digest.clone(),
        catalogue_origin: loaded.origin.to_string(),
    };
    let units: usize = cases.iter().map(|c| c.shapes.len()).sum();
    println!(
        "daemon:      the neutral build ({} edits of cases/{}), {}",
        edits.len(),
        neutral::FILE,
        bin.display()
    );
    println!(
        "cases:       {} ({units} runs), scaled windows, each profile\n",
        cases.len()
    );
    let mut reports = Vec::new();
    for profile in [KitProfile::Contract, KitProfile::Distribution] {
        eprintln!("the {profile} profile:");
        let opts = QualifyOptions {
            run: RunOptions {
                daemon: DaemonUnderTest::Bin(bin.clone()),
                scaled: true,
                profile,
            },
            jobs,
            repeat: 1,
            behaviour_only: false,
            keep: None,
            failed_logs: cwd.join("qualify-logs").join(format!("neutral-{profile}")),
        };
        let report = runtime().block_on(catalogue::qualify(
            cat,
            &cases,
            subject.clone(),
            &opts,
            |line| eprintln!("{line}"),
        ));
        println!("{}", report.table());
        reports.push(report);
    }
    let (proved, line) = neutral::verdict(&reports[0], &reports[1]);
    println!("{line}");
    if let Some(p) = json {
        let text = format!(
            "{{\"proved\": {proved}, \"contract\": {}, \"distribution\": {}}}",
            reports[0].json(),
            reports[1].json()
        );
        if let Err(e) = write_atomic(&from_caller(p, cwd), &text) {
            refuse(&format!("write the JSON: {e}"));
        }
    }
    exit(if proved { 0 } else { 1 });
}
