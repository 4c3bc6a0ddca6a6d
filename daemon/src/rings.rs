//! The house's one structural rule, checked: every file of this crate is listed in
//! `docs/architecture.md` under its ring, and no file names a ring above its own.
//!
//! Why a test: the rings keep every import pointing down, so a file can be read knowing only the
//! rings below it. The order and the file list are the document's, so the map a reader follows
//! and the code cannot drift apart. Test code at a file's end (`#[cfg(test)]`) is not checked: a
//! test may build its fixtures with the house above.

use std::collections::BTreeMap;
use std::path::Path;

const ARCHITECTURE: &str = include_str!("../../docs/architecture.md");

/// The rings top to bottom, from the document's "Rings" table.
fn ring_order() -> Vec<String> {
    table_rows("## Rings")
        .into_iter()
        .map(|cells| cells[0].clone())
        .collect()
}

/// Every module file (path under `daemon/src/`) and its ring, from the "Modules" table.
fn module_rings() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for cells in table_rows("## Modules") {
        for path in cells[1].split(',') {
            let path = path.trim().trim_matches('`').to_string();
            if !path.is_empty() {
                out.insert(path, cells[0].clone());
            }
        }
    }
    out
}

/// The body rows of the first table under `heading`, each split into trimmed cells.
fn table_rows(heading: &str) -> Vec<Vec<String>> {
    let start = ARCHITECTURE
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("docs/architecture.md has no {heading:?} section"));
    ARCHITECTURE[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// Every `.rs` file under `daemon/src/`, as a path relative to it.
fn source_files(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("daemon/src is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            source_files(&path, &format!("{prefix}{name}/"), out);
        } else if name.ends_with(".rs") {
            out.push(format!("{prefix}{name}"));
        }
    }
}

/// The crate's top-level module a file belongs to (`plane/fanout.rs` → `plane`).
fn top_module(path: &str) -> &str {
    path.split('/')
        .next()
        .unwrap_or(path)
        .trim_end_matches(".rs")
}

/// The top-level modules a file names through `crate::…`, outside its trailing test code.
fn named_modules(text: &str) -> Vec<String> {
    let code = match text.find("\n#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    // `use crate::{a, b};`
    for (at, _) in code.match_indices("crate::{") {
        let rest = &code[at + "crate::{".len()..];
        let group = &rest[..rest.find('}').unwrap_or(0)];
        for part in group.split(',') {
            let name = part.trim().split("::").next().unwrap_or("").to_string();
            if !name.is_empty() && !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

#[test]
fn every_file_is_listed_under_its_ring_and_imports_only_its_ring_and_those_below() {
    let order = ring_order();
    let rank = |ring: &str| {
        order
            .iter()
            .position(|r| r == ring)
            .unwrap_or_else(|| panic!("ring {ring:?} is not in docs/architecture.md's Rings table"))
    };
    let listed = module_rings();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, "", &mut files);
    // The crate root and the entry point only declare and call; this file is the check itself.
    let unlisted: Vec<_> = files
        .iter()
        .filter(|f| !["lib.rs", "main.rs", "rings.rs"].contains(&f.as_str()))
        .filter(|f| !listed.contains_key(*f))
        .collect();
    assert!(
        unlisted.is_empty(),
        "files missing from docs/architecture.md's Modules table: {unlisted:?}"
    );
    let gone: Vec<_> = listed.keys().filter(|f| !files.contains(f)).collect();
    assert!(
        gone.is_empty(),
        "docs/architecture.md lists files that do not exist: {gone:?}"
    );
    // A top-level module's ring: the ring of its files (one ring per module).
    let mut ring_of_module: BTreeMap<&str, &str> = BTreeMap::new();
    for (file, ring) in &listed {
        rank(ring);
        let prior = ring_of_module.insert(top_module(file), ring);
        assert!(
            prior.is_none_or(|p| p == ring),
            "module {} is listed under two rings",
            top_module(file)
        );
    }
    let mut upward = Vec::new();
    for (file, ring) in &listed {
        let text = std::fs::read_to_string(src.join(file)).expect("a listed file is readable");
        for named in named_modules(&text) {
            let Some(target) = ring_of_module.get(named.as_str()) else {
                continue;
            };
            if rank(target) < rank(ring) {
                upward.push(format!("{file} ({ring}) names crate::{named} ({target})"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports of a higher ring:\n{}",
        upward.join("\n")
    );
}
