//! Fixtures the areas share: the data-path mesh and its daemon, the health and supervisor
//! snapshot filters, the admin-rail mesh, the host's test-side reads, and where snapshots live.

#[macro_use]
pub mod health;
#[macro_use]
pub mod up;
pub mod admin;
pub mod data_path;
pub mod host;

/// What one step of a test may take on a loaded 2-core machine: a daemon starting, stopping or
/// exiting, a row or a connection change reaching the broker, a line being written.
pub const BOUND: std::time::Duration = std::time::Duration::from_secs(20);

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
