//! The smoke suites as tests: `smoke delivery-standby` at test timings, on one broker and on
//! the 3-node cluster.

mod standby;
mod standby_cluster;

/// One suite at a time: each times takeovers against its own brokers, and two at once on a
/// 2-core machine would measure each other.
static ONE_SUITE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds the machine for one suite (a panicked suite still releases it).
fn one_suite() -> std::sync::MutexGuard<'static, ()> {
    ONE_SUITE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
