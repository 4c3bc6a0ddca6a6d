//! `cotal-delivery`: picks the allocator, parses arguments and calls the library. Nothing else
//! lives here.

/// The daemon allocates and frees small buffers per message (headers, subjects, parsed
/// entries) on two worker threads; glibc's malloc spent a fifth of the daemon's CPU doing so
/// (docs/performance.md, "The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Structured diagnostics beside the human lines, only when asked for (`RUST_LOG`): the human
    // lines are the interface and stay unmixed by default.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    std::process::exit(cotal_delivery::cli::main_with(
        std::env::args_os().collect(),
    ));
}
