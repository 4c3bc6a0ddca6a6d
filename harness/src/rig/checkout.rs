//! The checkout this harness was built in, and only when it runs from inside it.
//!
//! Why one place: a harness binary copied out of its checkout (the kit `ci/package-kit` packs,
//! a CI artifact, another machine) must not reach back into the directory it was compiled in,
//! even when that directory still exists on the same machine: its catalogue, its nats-server
//! and its daemon build would silently stand in for the ones beside the binary. So every
//! compile-time path of the harness goes through [`root`], which answers only when the running
//! executable lies inside that checkout (`target/<profile>/harness`, a test binary under
//! `target/<profile>/deps/`); the harness's `rings` test refuses the compile-time path anywhere
//! else.

use std::path::{Path, PathBuf};

/// The workspace root this harness was compiled in, when the running executable lies inside
/// it; `None` for a binary copied or unpacked elsewhere.
pub fn root() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?.canonicalize().ok()?;
    inside(&compiled_root()?, &exe)
}

/// The workspace root as compiled (whether or not it still exists).
fn compiled_root() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()?
        .canonicalize()
        .ok()
}

/// `root` when `exe` lies inside it.
fn inside(root: &Path, exe: &Path) -> Option<PathBuf> {
    exe.starts_with(root).then(|| root.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test binary runs from `target/…/deps/` inside its checkout, so it has one; a binary
    /// anywhere else has none, even with the checkout still on disk.
    /// Mutation seen failing: `inside` answering the root whatever `exe` is (a copied binary
    /// would read its build's checkout).
    #[test]
    fn only_a_binary_inside_its_checkout_has_one() {
        let here = root().expect("this test binary runs inside its checkout");
        assert!(here.join("cases").is_dir() && here.join("harness").is_dir());
        let exe = std::env::current_exe().unwrap().canonicalize().unwrap();
        assert_eq!(inside(&here, &exe), Some(here.clone()));
        assert_eq!(inside(&here, Path::new("/tmp/kit/harness")), None);
        // A sibling whose name only starts like the checkout's is not inside it.
        let sibling = PathBuf::from(format!("{}-copy/harness", here.display()));
        assert_eq!(inside(&here, &sibling), None);
    }

    /// No other file of the harness reads the compile-time path outside its tests: every use
    /// goes through [`root`], so none reaches a checkout from a copied binary.
    /// Mutation seen failing: `simulation::runner::commit` reading `env!("CARGO_MANIFEST_DIR")`
    /// again.
    #[test]
    fn the_compile_time_path_is_read_here_only() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let needle = concat!("env!(\"", "CARGO_MANIFEST_DIR", "\")");
        let mut stack = vec![src.clone()];
        let mut offenders = Vec::new();
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("read src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let rel = path
                    .strip_prefix(&src)
                    .unwrap()
                    .to_string_lossy()
                    .to_string();
                // This file, and the structural test that reads the sources it checks.
                if !rel.ends_with(".rs") || rel == "rig/checkout.rs" || rel == "rings.rs" {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("read");
                let code = text
                    .split("#[cfg(test)]\nmod tests")
                    .next()
                    .unwrap_or_default();
                if code.contains(needle) {
                    offenders.push(rel);
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "{needle} outside rig/checkout.rs: {offenders:?}"
        );
    }
}
