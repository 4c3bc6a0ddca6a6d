//! `smoke`: long-running suites against real brokers. `smoke bench-fanout` measures the Plane-3
//! data path (post -> fan-out -> trusted reader -> member's `dlv_` durable) next to the raw
//! JetStream pipeline it wraps, on the same broker (or cluster) in the same run
//! (docs/performance.md). `smoke delivery-standby` runs two standby hosts through takeover
//! (docs/host.md). `smoke soak` leaves a detached mesh running on short credentials through a
//! daemon SIGKILL and a broker restart (docs/operations.md).

mod bench_fanout;
mod bench_scale;
mod cluster;
mod soak;
mod standby;

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
    /// Fan-out throughput, CPU per frame and post-to-frame latency for 10 and 100 members,
    /// next to the raw JetStream pipeline (the same messages, no checks) on the same broker.
    BenchFanout(bench_fanout::Args),
    /// What the daemon costs as the space grows: start-up, idle broker work, the feed's sweep,
    /// inventories and inspection, CPU per frame of a fixed workload and RSS, per registry size.
    BenchScale(bench_scale::Args),
    /// The raw pipeline of `bench-fanout`, which starts it as a process of its own.
    #[command(hide = true)]
    BenchFanoutRaw(bench_fanout::raw::Args),
    /// Two `deliver --spaces` hosts for one space on one broker: takeover after the holder is
    /// SIGKILLed, returns, or is stopped (SIGTERM), with observed takeover times, a durable
    /// sender whose every post must reach an offline member, credentials replaced through each
    /// host's store, and a third host with an invalid manifest. Observations, not an SLA.
    DeliveryStandby(standby::Args),
    /// A detached mesh (`up --detach`) for N minutes on short credentials: steady durable posts
    /// to offline members, its renewal owner re-signing them, one daemon SIGKILL (a bare `up`
    /// relaunches it) and one broker restart in the middle. Passes when nothing was lost, the
    /// daemon never ended on a credential expiry, there were enough renewals and `status` is
    /// healthy at the end.
    Soak(soak::Args),
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
            Command::BenchScale(args) => bench_scale::run(args).await,
            Command::BenchFanoutRaw(args) => bench_fanout::raw::run(args).await,
            Command::DeliveryStandby(args) => standby::run(args).await,
            Command::Soak(args) => soak::run(args).await,
        }
    });
    std::process::exit(code);
}
