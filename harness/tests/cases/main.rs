//! The qualification kit's catalogue as tests: every case of `cases/<family>/*.toml` run once
//! per shape against this checkout's daemon in its scaled form, each transcript compared with
//! its insta snapshot in `cases/<family>/snapshots/`, and the checks that hold the catalogue
//! together (it loads, every case quotes its seed, is named by docs/conformance.md and has a
//! mutation that still applies).
//!
//! The cases are read from the folders when this binary runs, never listed: a new case needs
//! only its file and its snapshot (no test to write, no line to add), a new family only its
//! folder.
//! Each (case, shape) is one test named `<family>/<name>@<shape>`, so libtest's filters apply:
//! `cargo test -p delivery-harness --test cases data-path/` runs a family, `... --test cases
//! -- --exact lifecycle/clean-start-sigterm@operator` one case on one shape.
//!
//! Why a test harness of its own (`harness = false`, libtest-mimic): the list of tests is the
//! list of files, and a case waits out real windows most of its time, so the cases get their
//! own budget of cases run at once ([`CASE_JOBS`], libtest's `--test-threads` overrides it) and
//! start longest first ([`order`]) so the long waits overlap the short cases.

mod checks;
mod order;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use delivery_harness::kit::catalogue::{shipped_root, Catalogue};
use delivery_harness::kit::shape::Shape;
use delivery_harness::kit::{run_case, RunOptions};
use libtest_mimic::{Arguments, Failed, Trial};

/// Cases run at once when `--test-threads` is not given. A case's brokers and daemons are
/// mostly idle while it waits out a window: the 85 runs of the catalogue at fb97ef1 took 996 s
/// of case time and 125 s of CPU, 266 s of wall time four at once and 402 s two at once on the
/// 2-core development host (docs/cases.md, "Running the catalogue in `cargo test`"). Their
/// bounds are judged against real clocks, so this stays well below what would keep both cores
/// busy.
pub const CASE_JOBS: usize = 4;

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    if args.test_threads.is_none() {
        args.test_threads = Some(CASE_JOBS);
    }
    let mut trials = checks::all();
    match Catalogue::load(&shipped_root()) {
        Ok(cat) => trials.extend(case_trials(Arc::new(cat))),
        Err(errors) => {
            let text = errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n");
            trials.push(Trial::test("catalogue::loads", move || {
                Err(Failed::from(format!(
                    "the catalogue does not load:\n{text}"
                )))
            }));
        }
    }
    libtest_mimic::run(&args, trials).exit_code()
}

/// One test per (case, shape), longest first.
fn case_trials(cat: Arc<Catalogue>) -> Vec<Trial> {
    let mut units: Vec<(usize, Shape)> = Vec::new();
    for (i, case) in cat.cases.iter().enumerate() {
        for shape in &case.shapes {
            units.push((i, shape.clone()));
        }
    }
    order::longest_first(&cat, &mut units);
    units
        .into_iter()
        .map(|(i, shape)| {
            let cat = cat.clone();
            let name = format!("{}@{}", cat.cases[i].id, shape);
            Trial::test(name, move || check(&cat, i, &shape))
        })
        .collect()
}

/// Runs case `i` of `cat` on `shape`, scaled, and compares its transcript with its snapshot.
fn check(cat: &Catalogue, i: usize, shape: &Shape) -> Result<(), Failed> {
    let case = &cat.cases[i];
    let id = &case.id;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("{id} [{shape}]: a runtime: {e}"))?;
    let opts = RunOptions {
        scaled: true,
        ..RunOptions::default()
    };
    let started = Instant::now();
    let run = runtime.block_on(run_case(case, shape, &opts, None));
    for (figure, ms) in &run.figures {
        eprintln!("MEASURED {id} [{shape}] {figure}: {ms} ms");
    }
    eprintln!(
        "MEASURED {id} [{shape}] the whole case: {} ms",
        started.elapsed().as_millis()
    );
    if let Err(f) = &run.outcome {
        return Err(format!(
            "{id} [{shape}]: {f}\n--- transcript so far ---\n{}",
            run.transcript
        )
        .into());
    }
    let dir = cat.snapshot_path(case);
    insta::with_settings!({
        snapshot_path => dir.parent().expect("snapshots dir"),
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(case.name().to_string(), run.transcript);
    });
    Ok(())
}
