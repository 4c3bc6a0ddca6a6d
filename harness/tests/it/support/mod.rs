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

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z` as unix microseconds (the broker reports UTC; `/connz`
/// trims trailing zeros of the fraction, advisories keep nine digits).
pub fn rfc3339_us(text: &str) -> Option<i64> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let us: i64 = format!("{frac:0<6}")[..6].parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((((days * 24 + hh) * 60 + mm) * 60 + ss) * 1_000_000 + us)
}
