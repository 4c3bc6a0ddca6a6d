//! `harness run`: case files, each on every shape it names, with their transcripts and figures,
//! under one profile (`--profile`).

use std::path::{Path, PathBuf};

use clap::Args;
use delivery_harness::kit::catalogue;
use delivery_harness::kit::{run_case, Case, RunOptions};

use super::common::{daemon_under_test, from_caller, profile_of, refuse, runtime, DaemonArgs};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Case files to run, in order (each on every shape it names).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

pub fn run(args: RunArgs, cwd: &Path) -> ! {
    let RunArgs { files, daemon } = args;
    let (daemon_ut, _, _) = daemon_under_test(&daemon, cwd);
    let profile = profile_of(&daemon, &daemon_ut);
    let opts = RunOptions {
        daemon: daemon_ut,
        scaled: daemon.scaled,
        profile,
    };
    let rt = runtime();
    let (mut passed, mut failed) = (0usize, 0usize);
    for (i, file) in files.iter().enumerate() {
        eprintln!("[{}/{}] {}", i + 1, files.len(), file.display());
        let case = match Case::load(&from_caller(file.clone(), cwd)) {
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
                    match &f.stands_on {
                        Some(by) => eprintln!("BLOCKED {} [{shape}] by {by}: {f}", case.id),
                        None => eprintln!("FAILED {} [{shape}]: {f}", case.id),
                    }
                }
            }
        }
    }
    println!("harness: {passed} passed, {failed} failed");
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
