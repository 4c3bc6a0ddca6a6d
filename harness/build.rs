//! Carries the catalogue in the `harness` binary: every file under the workspace's `cases/` is
//! listed in `$OUT_DIR/carried.rs` as `(path relative to cases/, include_bytes!(…))`, so a
//! harness binary copied out of this checkout (the kit `ci/package-kit` packs, a CI artifact)
//! still has the cases it was built with (`harness/src/kit/carried.rs` reads the list).
//! Cargo reruns this script when anything under `cases/` changes.

use std::path::{Path, PathBuf};

fn files(dir: &Path, rel: &str, out: &mut Vec<(String, PathBuf)>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_else(|| panic!("{} is not UTF-8", path.display()))
            .to_string();
        // Editors' and the snapshot tool's leftovers are no part of the catalogue.
        // The same names as `kit::carried::is_leftover`.
        if name.starts_with('.')
            || name.ends_with('~')
            || name.ends_with(".pending-snap")
            || name.ends_with(".snap.new")
        {
            continue;
        }
        let rel = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        if path.is_dir() {
            files(&path, &rel, out);
        } else {
            out.push((rel, path));
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let cases = manifest.join("../cases");
    println!("cargo:rerun-if-changed={}", cases.display());
    let mut found = Vec::new();
    files(&cases, "", &mut found);
    let mut text = String::from("pub static CARRIED: &[(&str, &[u8])] = &[\n");
    for (rel, path) in &found {
        let abs = path
            .canonicalize()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.push_str(&format!("    ({rel:?}, include_bytes!({:?})),\n", abs));
    }
    text.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("carried.rs");
    std::fs::write(&out, text).unwrap_or_else(|e| panic!("write {}: {e}", out.display()));
}
