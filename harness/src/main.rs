//! `harness`: qualifies a Cotal delivery daemon against real nats-server brokers.
//!
//! `harness qualify` runs the catalogue of cases (cases/<family>/*.toml, docs/qualify.md)
//! and reports a verdict per case, as a table, JSON and JUnit; `harness run FILE...` runs single
//! case files and prints their transcripts; `harness mutate` proves each case fails without its
//! behaviour; `harness simulate` runs a seeded workload and nemesis against a live mesh and checks
//! the history (docs/simulation.md). Exit 0 when everything selected passed (a simulation:
//! valid), 1 when something failed (invalid), 2 when it could not run (bad flags, no broker
//! binary, the daemon not executable; a simulation: unknown).

mod cli;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "harness",
    version,
    about = "Qualify a Cotal delivery daemon against real nats-server brokers",
    long_about = "Qualify a Cotal delivery daemon against real nats-server brokers.\n\n\
`harness qualify` runs every case of the catalogue (cases/<family>/*.toml: one seed sentence \
each, judged from what the broker holds) against the daemon under test and prints a verdict \
table; --json and --junit write reports a CI can gate on. docs/qualify.md explains the report; \
docs/cases.md is the language of the cases.\n\n\
Exit status: 0 every selected case passed, 1 one failed, 2 the run could not start."
)]
struct Cli {
    #[command(subcommand)]
    command: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Run the catalogue against a daemon and report a verdict per case.
    Qualify(cli::qualify::QualifyArgs),
    /// Run case files and print each normalised transcript and its figures.
    Run(cli::run::RunArgs),
    /// Apply each mutation kept beside the cases to a scratch copy of this checkout, build the
    /// daemon there and run the case that must fail: KILLED or SURVIVED (from a checkout only:
    /// an unpacked kit has no sources to edit).
    Mutate(cli::mutate::MutateArgs),
    /// Run a seeded workload and nemesis against a live mesh, record the history, check it:
    /// valid (exit 0), invalid (1) or unknown (2). docs/simulation.md explains the run.
    #[command(long_about = cli::simulate::SIMULATE_ABOUT)]
    Simulate(cli::simulate::SimulateArgs),
}

/// `harness --version`: the version and the catalogue the binary carries.
fn version() -> &'static str {
    let text = format!(
        "{} (carries a catalogue of {})",
        env!("CARGO_PKG_VERSION"),
        delivery_harness::kit::carried::named()
    );
    Box::leak(text.into_boxed_str())
}

fn main() {
    // A report piped into `head` or `grep -m1` ends the harness quietly, as a command line tool
    // does, instead of panicking on the closed pipe.
    // SAFETY: set once, before any thread exists; SIG_DFL installs no handler of ours.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        );
    }
    let matches = Cli::command().version(version()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let cwd = std::env::current_dir().unwrap_or_default();
    match cli.command {
        Action::Qualify(args) => cli::qualify::run(args, &cwd),
        Action::Run(args) => cli::run::run(args, &cwd),
        Action::Mutate(args) => cli::mutate::run(args, &cwd),
        Action::Simulate(args) => cli::simulate::run(args, &cwd),
    }
}
