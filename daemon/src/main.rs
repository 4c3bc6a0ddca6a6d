//! `cotal-delivery`: picks and tunes the allocator, parses arguments and calls the library.
//! Nothing else lives here.

use std::os::raw::{c_int, c_long};

/// The daemon allocates and frees small buffers per message (headers, subjects, parsed
/// entries) on two worker threads; glibc's malloc spent a fifth of the daemon's CPU doing so
/// (docs/performance.md, "The allocator"; the profiles in docs/performance-history.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long mimalloc keeps memory freed before it gives it back to the OS, in milliseconds.
/// mimalloc 3 (the `libmimalloc-sys` default) keeps it 1,000 ms, mimalloc 2 kept it 10 ms. With
/// 1,000 ms a restarted daemon draining a backlog while it loads 100,000 rows held 104-114 MB
/// at most against 91-100 MB at 10 ms (ten runs each, alternating), at the same CPU per entry,
/// and its settled size came out at either 85 or 104 MB depending on what it freed in the last
/// second before it was measured (docs/performance-history.md, "The drain, fifth look"). An
/// operator's `MIMALLOC_PURGE_DELAY` wins.
const PURGE_DELAY_MS: c_long = 10;

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_t` (`include/mimalloc.h` of the vendored
/// sources): `libmimalloc-sys` 0.1.49 names no constant for it. The test below reads the
/// option's default there (1,000 ms, the only option with that default) to prove the index.
const MI_OPTION_PURGE_DELAY: c_int = 15;

extern "C" {
    fn mi_option_set(option: c_int, value: c_long);
}

/// Sets the purge delay, unless the operator set `MIMALLOC_PURGE_DELAY` (mimalloc read it when
/// the process started).
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: plain setters of mimalloc's option table; the index is proved by the test.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

fn main() {
    tune_allocator();
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

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" {
        fn mi_option_get(option: c_int) -> c_long;
    }

    /// The option tuned is mimalloc's purge delay (its 1,000 ms default read at the index), and
    /// `tune_allocator` sets it to 10 ms. Mutation, seen failing: `tune_allocator`'s setter
    /// commented out (`left: 1000, right: 10`); an index naming another option fails at the
    /// default. The bench's drain figures are the effect (docs/performance-history.md, "The
    /// drain, fifth look").
    #[test]
    fn the_allocator_gives_freed_memory_back_after_ten_milliseconds() {
        assert!(
            std::env::var_os("MIMALLOC_PURGE_DELAY").is_none(),
            "the test reads mimalloc's own default: run it without MIMALLOC_PURGE_DELAY"
        );
        // SAFETY: a getter of mimalloc's option table.
        let default = unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(
            default, 1_000,
            "mimalloc 3's purge delay default at the index"
        );
        tune_allocator();
        let tuned = unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(tuned, PURGE_DELAY_MS);
    }
}
