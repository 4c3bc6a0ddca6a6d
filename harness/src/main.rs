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
        /// The daemon binary to qualify (default: the workspace's own build). A relative path
        /// is taken from the working directory `harness` runs in (the scenarios run the daemon
        /// in their own roots); a bare name with no such file there is looked up on PATH.
        #[arg(long, value_name = "PATH")]
        daemon: Option<PathBuf>,
    },
}

/// `--daemon` as the caller meant it: the scenarios spawn the daemon with their own roots as its
/// working directory, so a relative path typed in a shell is made absolute against the caller's
/// (`target/release/cotal-delivery`); a bare name that is no file here stays a PATH lookup.
fn from_caller(path: PathBuf, cwd: &std::path::Path) -> PathBuf {
    let bare = path.components().count() == 1 && !cwd.join(&path).exists();
    if path.is_absolute() || bare {
        path
    } else {
        cwd.join(path)
    }
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
    let cwd = std::env::current_dir().unwrap_or_default();
    let options = RunOptions {
        daemon_bin: daemon.map(|d| from_caller(d, &cwd)),
    };
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
