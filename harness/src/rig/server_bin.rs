//! Finding the nats-server binary. Every broker the harness starts is the pinned v2.15.1 (or a
//! newer one the caller points at); an older or missing binary is refused up front with the fix,
//! instead of surfacing later as an obscure feature error.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::rig::error::HarnessError;

/// Environment variable overriding the binary path.
pub const NATS_SERVER_BIN_ENV: &str = "NATS_SERVER_BIN";
/// The oldest accepted server version.
pub const MIN_VERSION: (u64, u64, u64) = (2, 15, 1);
/// Where `ci/install-nats-server` puts the binary, relative to the workspace root.
pub const PROJECT_LOCAL_BIN: &str = ".tools/nats-server-2.15.1/nats-server";

/// How to get a good one (the script is `ci/install-nats-server` in a checkout and in the kit).
const FIX: &str =
    "ci/install-nats-server installs v2.15.1 and prints its path (for NATS_SERVER_BIN)";

/// The nats-server to run: `$NATS_SERVER_BIN`, else the project-local install, else `nats-server`
/// on `PATH`. The chosen binary must answer `--version` with at least v2.15.1.
pub fn nats_server_bin() -> Result<PathBuf, HarnessError> {
    let path = locate()?;
    let version = run_version(&path)?;
    let parsed = parse_version(&version).ok_or_else(|| {
        HarnessError::ServerBinary(format!(
            "{} --version printed {version:?}, which names no version; {FIX}",
            path.display()
        ))
    })?;
    if parsed < MIN_VERSION {
        let (a, b, c) = MIN_VERSION;
        return Err(HarnessError::ServerBinary(format!(
            "{} is v{}.{}.{}, older than the required v{a}.{b}.{c}; {FIX}",
            path.display(),
            parsed.0,
            parsed.1,
            parsed.2
        )));
    }
    Ok(path)
}

fn locate() -> Result<PathBuf, HarnessError> {
    if let Some(p) = std::env::var_os(NATS_SERVER_BIN_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(HarnessError::ServerBinary(format!(
            "{NATS_SERVER_BIN_ENV}={} is not a file; {FIX}",
            p.display()
        )));
    }
    if let Some(p) = project_local() {
        return Ok(p);
    }
    if let Some(p) = on_path("nats-server") {
        return Ok(p);
    }
    Err(HarnessError::ServerBinary(format!(
        "no nats-server found ({NATS_SERVER_BIN_ENV} unset, no {PROJECT_LOCAL_BIN} beside the harness or above the current directory, none on PATH); {FIX}"
    )))
}

/// The project-local binary (where `ci/install-nats-server` puts it): beside the running
/// executable or above it (a checkout's `target/<profile>/harness`, an unpacked kit's
/// `harness`), else above the current directory. Never the compile-time checkout: a harness
/// copied elsewhere uses the broker beside it (`rig::checkout`).
fn project_local() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok();
    let cwd = std::env::current_dir().ok();
    let from_exe = exe.as_deref().and_then(Path::parent).into_iter();
    from_exe
        .chain(cwd.as_deref())
        .flat_map(Path::ancestors)
        .map(|dir| dir.join(PROJECT_LOCAL_BIN))
        .find(|p| p.is_file())
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn run_version(path: &Path) -> Result<String, HarnessError> {
    let out = Command::new(path).arg("--version").output().map_err(|e| {
        HarnessError::ServerBinary(format!(
            "cannot run {} --version: {e}; {FIX}",
            path.display()
        ))
    })?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        return Err(HarnessError::ServerBinary(format!(
            "{} --version exited with {}; {FIX}",
            path.display(),
            out.status
        )));
    }
    Ok(text)
}

/// `nats-server: v2.15.1` (or `v2.16.0-dev`) -> `(2, 15, 1)`.
fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    let word = text.split_whitespace().find_map(|w| {
        w.strip_prefix('v')
            .filter(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
    })?;
    let mut parts = word.split('.').map(|p| {
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u64>().ok()
    });
    Some((parts.next()??, parts.next()??, parts.next()??))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        assert_eq!(parse_version("nats-server: v2.15.1"), Some((2, 15, 1)));
        assert_eq!(parse_version("nats-server: v2.16.0-dev"), Some((2, 16, 0)));
        assert_eq!(parse_version("nats-server: v2.9"), None);
        assert!(parse_version("nats-server: v2.14.9").is_some_and(|v| v < MIN_VERSION));
    }

    #[test]
    fn finds_the_pinned_binary() {
        let bin = nats_server_bin();
        assert!(bin.is_ok(), "{:?}", bin.err().map(|e| e.to_string()));
    }
}
