//! `harness`: runs scenario scripts against a daemon binary and prints the normalised
//! transcript and the measured figures.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use delivery_harness::scenario::{self, RunOptions, Scenario};

#[derive(Debug, Parser)]
#[command(
    name = "harness",
    version,
    about = "Qualify the Cotal delivery daemon against real nats-server brokers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run scenario files (scenarios/*.toml) and print each normalised transcript.
    Run {
        /// Scenario files to run, in order.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// The daemon binary to qualify (default: the workspace's own build).
        #[arg(long, value_name = "PATH")]
        daemon: Option<PathBuf>,
    },
}

fn main() {
    let cli = Cli::parse();
    let Command::Run { files, daemon } = cli.command;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("harness: could not start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let options = RunOptions { daemon_bin: daemon };
    let mut failed = 0usize;
    let total = files.len();
    for (i, file) in files.iter().enumerate() {
        eprintln!("[{}/{total}] {}", i + 1, file.display());
        let outcome = runtime.block_on(async {
            let s = Scenario::load(file)?;
            scenario::run(&s, &options).await
        });
        match outcome {
            Ok(o) => {
                println!("{}", o.transcript);
                for (name, ms) in &o.figures {
                    println!("figure: {name}: {ms} ms");
                }
            }
            Err(e) => {
                failed += 1;
                eprintln!("FAILED {}: {e}", file.display());
            }
        }
    }
    println!("harness: {} passed, {failed} failed", total - failed);
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
