//! The harness's structural rules, checked: the wings in the order `lib.rs` lists them, the rings
//! of each wing in the order its `mod.rs` lists them, every import pointing down; one name per
//! type; one file name per thing.
//!
//! Why a test: floors that are only written down drift. Each wing's table is the map a reader
//! follows into it ("a file uses only files of the rings below its own"), so the map and the
//! code are held together here, as `daemon/src/rings.rs` holds the daemon's. Imports are read
//! as text (paths after `crate::`, `delivery_harness::`, `super::` and `self::`, and a
//! `mod.rs`'s own `use child::`); code under `#[cfg(test)]` is not checked, since a test may
//! build its fixtures from above.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `harness/src`, where the wings are.
fn src() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
}

/// Every `.rs` file under `dir`, as a path relative to `harness/src`.
fn rust_files(dir: &Path, out: &mut BTreeSet<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let rel = path.strip_prefix(src()).expect("under src");
            out.insert(rel.to_string_lossy().into_owned());
        }
    }
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(src().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// The rows of the first `| ring | files |`-shaped table in `rel`'s `//!` comment: each row's
/// first cell and the backquoted names in its second.
fn doc_table(rel: &str) -> Vec<(String, Vec<String>)> {
    read(rel)
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(str::trim)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            let names = cells
                .get(1)
                .map(|c| {
                    c.split(',')
                        .map(|n| n.trim().trim_matches('`').to_string())
                        .filter(|n| !n.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            (cells[0].to_string(), names)
        })
        .collect()
}

/// A file's source without its test module and without comment lines.
fn code_of(rel: &str) -> String {
    let text = read(rel);
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module path of a file (`kit/steps/mod.rs` → `kit::steps`, `rig/proxy/delay.rs` →
/// `rig::proxy::delay`).
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The file that defines the longest prefix of `segs` that is a module.
fn file_of(segs: &[String], files: &BTreeSet<String>) -> Option<String> {
    (1..=segs.len()).rev().find_map(|k| {
        let stem = segs[..k].join("/");
        [format!("{stem}.rs"), format!("{stem}/mod.rs")]
            .into_iter()
            .find(|c| files.contains(c))
    })
}

/// The files of this crate that `rel` imports.
fn imports(rel: &str, files: &BTreeSet<String>) -> BTreeSet<String> {
    let code = code_of(rel);
    let module = module_of(rel);
    let path = regex::Regex::new(
        r"\b(crate|delivery_harness|super|self)(?:::(?:super|[A-Za-z_][A-Za-z0-9_]*))*(?:::\{[^{}]*\})?",
    )
    .expect("the path pattern");
    let mut out = BTreeSet::new();
    for m in path.find_iter(&code) {
        let text = m.as_str();
        if !text.contains("::") {
            continue;
        }
        let (head, group) = match text.split_once("::{") {
            Some((h, g)) => (h, Some(g.trim_end_matches('}'))),
            None => (text, None),
        };
        let mut segs: Vec<String> = Vec::new();
        for (i, seg) in head.split("::").enumerate() {
            match (i, seg) {
                (0, "crate" | "delivery_harness") => {}
                (0, "self") => segs = module.clone(),
                (0, "super") => segs = module[..module.len().saturating_sub(1)].to_vec(),
                (_, "super") => {
                    segs.pop();
                }
                (_, s) => segs.push(s.to_string()),
            }
        }
        let targets: Vec<Vec<String>> = match group {
            Some(g) => g
                .split(',')
                .map(|item| {
                    let first = item.trim().split([' ', ':']).next().unwrap_or_default();
                    let mut t = segs.clone();
                    if !first.is_empty() && first != "self" {
                        t.push(first.to_string());
                    }
                    t
                })
                .collect(),
            None => vec![segs],
        };
        for t in targets {
            if let Some(f) = file_of(&t, files) {
                out.insert(f);
            }
        }
    }
    if rel.ends_with("mod.rs") {
        let child = regex::Regex::new(r"(?m)^\s*(?:pub )?use ([a-z_]+)::").expect("pattern");
        for c in child.captures_iter(&code) {
            let mut t = module.clone();
            t.push(c[1].to_string());
            if let Some(f) = file_of(&t, files) {
                out.insert(f);
            }
        }
    }
    out.remove(rel);
    out
}

/// Files declared only for tests (`#[cfg(test)] mod name;` in their parent).
fn test_only(files: &BTreeSet<String>) -> BTreeSet<String> {
    let decl = regex::Regex::new(r"#\[cfg\(test\)\]\s*mod ([a-z_]+);").expect("pattern");
    let mut out = BTreeSet::new();
    for f in files {
        for c in decl.captures_iter(&read(f)) {
            let mut t = module_of(f);
            t.push(c[1].to_string());
            if let Some(child) = file_of(&t, files) {
                out.insert(child);
            }
        }
    }
    out
}

/// Where every file of a wing stands: (wing's place top to bottom, ring's place in its wing,
/// the ring's name).
fn floors(files: &BTreeSet<String>) -> BTreeMap<String, (usize, usize, String)> {
    let wings = doc_table("lib.rs");
    assert!(!wings.is_empty(), "lib.rs has no table of its wings");
    let tests = test_only(files);
    let mut out = BTreeMap::new();
    for (w, (wing, folders)) in wings.iter().enumerate() {
        let folder = folders
            .first()
            .unwrap_or_else(|| panic!("lib.rs names no folder for the wing {wing}"))
            .trim_end_matches('/');
        let table = doc_table(&format!("{folder}/mod.rs"));
        assert!(
            !table.is_empty(),
            "{folder}/mod.rs has no table of its rings"
        );
        for (r, (ring, names)) in table.iter().enumerate() {
            for name in names {
                let path = format!("{folder}/{name}");
                assert!(
                    files.contains(&path),
                    "{folder}/mod.rs lists {name}, which does not exist"
                );
                let before = out.insert(path.clone(), (w, r, format!("{folder}: {ring}")));
                assert!(before.is_none(), "{path} is listed twice");
            }
        }
        for f in files
            .iter()
            .filter(|f| f.starts_with(&format!("{folder}/")))
        {
            assert!(
                out.contains_key(f) || tests.contains(f),
                "{f} is in no ring of {folder}/mod.rs's table"
            );
        }
    }
    out
}

/// Every import of every wing's file points to a ring below its own, or to a wing below its own.
/// Mutation seen failing: `kit/steps/admin.rs` importing `super::rails::RailStep` (a verb group
/// using another: "kit/steps/admin.rs (kit: verb groups) uses kit/steps/rails.rs (kit: verb
/// groups)").
#[test]
fn every_import_points_down_a_ring_or_a_wing() {
    let mut files = BTreeSet::new();
    rust_files(src(), &mut files);
    let floors = floors(&files);
    let mut wrong = Vec::new();
    for (file, (wing, ring, name)) in &floors {
        for target in imports(file, &files) {
            match floors.get(&target) {
                Some((w, r, _)) if w > wing || (w == wing && r > ring) => {}
                Some((_, _, there)) => {
                    wrong.push(format!("{file} ({name}) uses {target} ({there})"))
                }
                None => wrong.push(format!(
                    "{file} ({name}) uses {target}, which is in no wing (import from the wing itself)"
                )),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that do not point down:\n{}",
        wrong.join("\n")
    );
}

/// No type, trait or alias name is defined twice in the harness (test code and the associated
/// types of trait impls aside).
/// Mutation seen failing: a `pub struct Report` added to `kit/results.rs` beside the checker's.
#[test]
fn every_type_name_is_defined_once() {
    let mut files = BTreeSet::new();
    rust_files(src(), &mut files);
    let tests = test_only(&files);
    let def = regex::Regex::new(
        r"(?m)^(?:\s*(?:pub(?:\([a-z]+\))? )?(?:struct|enum|trait)|(?:pub(?:\([a-z]+\))? )?type) ([A-Z][A-Za-z0-9_]*)",
    )
    .expect("pattern");
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in files.iter().filter(|f| !tests.contains(*f)) {
        for c in def.captures_iter(&code_of(f)) {
            seen.entry(c[1].to_string()).or_default().push(f.clone());
        }
    }
    let twice: Vec<String> = seen
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(name, at)| format!("{name}: {}", at.join(", ")))
        .collect();
    assert!(
        twice.is_empty(),
        "type names defined twice:\n{}",
        twice.join("\n")
    );
}

/// No two files of one name, but where their folder says why: `mod.rs`, a subcommand in `cli/`
/// and a verb group in `kit/steps/` are named after what they front.
/// Mutation seen failing: `simulation/check/report.rs` renamed `results.rs`, beside the kit's.
#[test]
fn every_file_name_is_used_once_unless_its_folder_says_why() {
    let mut files = BTreeSet::new();
    rust_files(src(), &mut files);
    let named_by_folder = |f: &str| f.starts_with("cli/") || f.starts_with("kit/steps/");
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in files
        .iter()
        .filter(|f| !f.ends_with("mod.rs") && !named_by_folder(f))
    {
        let name = f.rsplit('/').next().unwrap_or(f).to_string();
        by_name.entry(name).or_default().push(f.clone());
    }
    let twice: Vec<String> = by_name
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(name, at)| format!("{name}: {}", at.join(", ")))
        .collect();
    assert!(
        twice.is_empty(),
        "file names used twice:\n{}",
        twice.join("\n")
    );
}
