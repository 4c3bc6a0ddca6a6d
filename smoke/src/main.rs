//! `smoke`: long-running suites against real brokers. `smoke bench-fanout` measures the Plane-3
//! data path (post -> fan-out -> trusted reader -> member's `dlv_` durable -> surfaced) next to a
//! raw JetStream baseline on the same broker in the same run.

mod bench_fanout;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "smoke",
    about = "Long-running suites for the Cotal delivery daemon"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fan-out throughput and post-to-surface latency for 1, 10 and 100 members, with a raw
    /// JetStream baseline (the same copies published straight into INBOX and DLV).
    BenchFanout(bench_fanout::Args),
}

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("smoke: could not start the runtime ({e})");
            std::process::exit(2);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::BenchFanout(args) => bench_fanout::run(args).await,
        }
    });
    std::process::exit(code);
}
