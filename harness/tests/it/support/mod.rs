//! Fixtures the areas share: the data-path mesh and its daemon, the one snapshot macro, the admin-rail mesh, the host's test-side reads, and where snapshots live.

#[macro_use]
pub mod health;
#[macro_use]
pub mod up;
pub mod admin;
pub mod data_path;
pub mod host;

use delivery_harness::rig::daemon::{Daemon, DaemonSpec};

/// What one step of a test may take on a loaded 2-core machine: a daemon starting, stopping or
/// exiting, a row or a connection change reaching the broker, a line being written.
pub const BOUND: std::time::Duration = std::time::Duration::from_secs(20);

/// The line a daemon says once it serves (each lane of a host says it too, behind its prefix).
pub const UP: &str = "delivery daemon up";

/// The tests' one daemon starter: spawns `spec` (the rig's [`DaemonSpec`]: its mesh, server,
/// flags and environment) and waits, bounded by [`BOUND`], until it says [`UP`]. A daemon a test
/// expects to refuse or exit is spawned from its spec directly and judged by its exit.
pub async fn start(spec: DaemonSpec) -> Daemon {
    let mut d = spec.spawn().expect("spawn cotal-delivery");
    d.wait_for_line(UP, BOUND).await.expect("daemon up");
    d
}

/// [`start`] for a delivery host (`deliver --spaces`): spawns `spec` and waits, bounded by
/// [`host::HOST_BOUND`] each, until every lane of `lanes` says [`UP`] behind its prefix. The
/// host's other lanes are the test's to wait for (a refusal, a standby).
pub async fn start_host(spec: DaemonSpec, lanes: &[&str]) -> Daemon {
    let mut d = spec.spawn().expect("spawn the delivery host");
    for lane in lanes {
        d.wait_for_line(&format!("lane {lane}: ✓ {UP}"), host::HOST_BOUND)
            .await
            .unwrap_or_else(|e| panic!("lane {lane} up: {e}\n{}", d.transcript()));
    }
    d
}

/// How long one attempt of [`start_when_free`] waits for [`UP`].
const FREE_ATTEMPT: std::time::Duration = std::time::Duration::from_secs(6);
/// How many attempts [`start_when_free`] makes.
const FREE_ATTEMPTS: usize = 20;

/// [`start`] after a killed predecessor: while its lease has not expired yet the new daemon is
/// refused, so each attempt waits [`FREE_ATTEMPT`] for [`UP`], is killed if it did not serve,
/// and the next one starts 300 ms later; at most [`FREE_ATTEMPTS`].
pub async fn start_when_free(spec: DaemonSpec) -> Daemon {
    for _ in 0..FREE_ATTEMPTS {
        let mut d = spec.spawn().expect("spawn cotal-delivery");
        if d.wait_for_line(UP, FREE_ATTEMPT).await.is_ok() {
            return d;
        }
        let _ = d.kill();
        let _ = d.wait_exit(std::time::Duration::from_secs(5)).await;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    panic!("no daemon came up within {FREE_ATTEMPTS} attempts");
}

/// Asserts the snapshot `name` of `text` normalised by the kit's one normaliser
/// ([`delivery_harness::kit::transcript::normalise`]), with `paths`' directories as their tokens
/// (`&[(root, "[ROOT]")]`); a directory not named is `[TMP]`.
#[macro_export]
macro_rules! snapshot {
    ($name:expr, $text:expr) => {
        $crate::snapshot!($name, $text, &[])
    };
    ($name:expr, $text:expr, $paths:expr) => {{
        let normalised = delivery_harness::kit::transcript::normalise(&$text, $paths);
        $crate::support::snapshot_base().bind(|| insta::assert_snapshot!($name, normalised));
    }};
}

/// Settings every snapshot of this binary starts from: its file is
/// `harness/tests/snapshots/<name>.snap`, the name exactly as the test gives it.
pub fn snapshot_base() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings
}

/// A broker stamp (`YYYY-MM-DDTHH:MM:SS[.fraction]Z`) as unix microseconds.
pub fn rfc3339_us(text: &str) -> Option<i64> {
    delivery_harness::rig::connz::rfc3339_unix_us(text)
}
