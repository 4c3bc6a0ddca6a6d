//! Mutations kept as data: each names a daemon source file, a text to find in it (exactly
//! once), its replacement, the case expected to fail with it and why. `harness mutate` applies
//! each to a scratch copy of the workspace, builds the daemon there, runs the case against that
//! build (behaviour only: a mutation is killed by what the broker holds, not by a reworded line)
//! and reports KILLED or SURVIVED. A control run of each case against the unmutated scratch
//! build comes first, so a case that fails anyway kills nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::catalogue::Catalogue;
use super::run::run_case;
use crate::kit::under_test::{DaemonUnderTest, RunOptions};

/// `cases/<family>/mutations.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MutationsFile {
    #[serde(rename = "mutation", default)]
    mutations: Vec<Mutation>,
}

/// One mutation.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Mutation {
    pub id: String,
    /// The case that must fail with it.
    pub case: String,
    /// The file, relative to the workspace root.
    pub file: String,
    pub find: String,
    pub replace: String,
    /// What the mutation breaks, in the seed's words.
    pub why: String,
}

/// How a mutation fared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fate {
    /// The case failed against the mutated build.
    Killed,
    /// The case passed against it: the case does not prove its behaviour.
    Survived,
    /// The mutated daemon did not build.
    Unbuildable,
    /// The case failed against the unmutated build too, so this run proves nothing.
    ControlFailed,
}

/// One mutation's result.
#[derive(Debug, Clone, Serialize)]
pub struct MutationResult {
    pub mutation: Mutation,
    pub fate: Fate,
    /// What the case saw (the failing step), or why nothing was run.
    pub detail: String,
    pub seconds: u64,
}

/// Loads every family's mutations and checks them against the catalogue and the sources.
pub fn load(cat: &Catalogue, workspace: &Path) -> Result<Vec<Mutation>, Vec<String>> {
    let mut all = Vec::new();
    let mut errors = Vec::new();
    for family in &cat.families {
        let path = cat.root.join(family).join("mutations.toml");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        match toml::from_str::<MutationsFile>(&text) {
            Ok(f) => all.extend(f.mutations),
            Err(e) => errors.push(format!("{}: {}", path.display(), e.message().trim())),
        }
    }
    let mut ids = std::collections::BTreeSet::new();
    for m in &all {
        if !ids.insert(m.id.clone()) {
            errors.push(format!("mutation {:?}: the id is used twice", m.id));
        }
        if !cat.cases.iter().any(|c| c.id == m.case) {
            errors.push(format!("mutation {:?}: no case {:?}", m.id, m.case));
        }
        errors.extend(stale(workspace, &m.id, &m.file, &m.find));
        if m.find == m.replace {
            errors.push(format!(
                "mutation {:?}: the replacement is the text itself",
                m.id
            ));
        }
    }
    if errors.is_empty() {
        Ok(all)
    } else {
        Err(errors)
    }
}

/// Why mutation `id` cannot be applied, if it cannot: its `find` text must occur exactly once in
/// `file` (relative to `workspace`), or the mutation is stale.
pub(crate) fn stale(workspace: &Path, id: &str, file: &str, find: &str) -> Option<String> {
    match std::fs::read_to_string(workspace.join(file)) {
        Ok(src) => {
            let n = src.matches(find).count();
            (n != 1).then(|| {
                format!(
                    "mutation {id:?}: its text occurs {n} times in {file} (exactly once, or the mutation is stale)"
                )
            })
        }
        Err(e) => Some(format!("mutation {id:?}: {file}: {e}")),
    }
}

/// Copies the workspace's sources (not `target/`, `.git/`, `.tools/`) to `scratch`.
fn copy_sources(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        let name_s = name.to_string_lossy();
        if matches!(
            name_s.as_ref(),
            "target" | ".git" | ".tools" | ".demo" | "qualify-logs" | "sim-runs"
        ) {
            continue;
        }
        let src = entry.path();
        let dst = to.join(&name);
        if entry.file_type()?.is_dir() {
            copy_sources(&src, &dst)?;
        } else {
            let same = std::fs::read(&dst).ok() == std::fs::read(&src).ok();
            if !same {
                std::fs::copy(&src, &dst)?;
            }
        }
    }
    Ok(())
}

/// Builds the daemon in `scratch`; the binary, or the compiler's last lines.
fn build(scratch: &Path) -> Result<PathBuf, String> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "-q",
            "-p",
            "cotal-delivery",
            "--bin",
            "cotal-delivery",
        ])
        .current_dir(scratch)
        .env("CARGO_TARGET_DIR", scratch.join("target"))
        .output()
        .map_err(|e| format!("run cargo: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(12).collect();
        return Err(tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
    }
    Ok(scratch.join("target/debug/cotal-delivery"))
}

/// Copies the sources to `scratch` and builds the daemon there, unmutated; the path of that
/// build, kept beside the scratch copy (each mutated build replaces the target's binary).
pub(crate) fn unmutated(
    workspace: &Path,
    scratch: &Path,
    progress: &impl Fn(&str),
) -> Result<PathBuf, String> {
    copy_sources(workspace, scratch)
        .map_err(|e| format!("copy the sources to {}: {e}", scratch.display()))?;
    progress(&format!(
        "building the unmutated daemon in {}",
        scratch.display()
    ));
    let bin = build(scratch).map_err(|e| format!("the unmutated daemon does not build:\n{e}"))?;
    let control_bin = scratch.join("cotal-delivery-unmutated");
    std::fs::copy(&bin, &control_bin).map_err(|e| format!("keep the unmutated build: {e}"))?;
    Ok(control_bin)
}

/// Applies one mutation (`find` replaced by `replace` once in `file`) to the scratch copy,
/// builds the daemon there and restores the file: the build, or the compiler's last lines (the
/// outer error: the file could not be read, written or restored).
pub(crate) fn build_mutated(
    workspace: &Path,
    scratch: &Path,
    file: &str,
    find: &str,
    replace: &str,
) -> Result<Result<PathBuf, String>, String> {
    let path = scratch.join(file);
    let original =
        std::fs::read_to_string(workspace.join(file)).map_err(|e| format!("read {file}: {e}"))?;
    std::fs::write(&path, original.replacen(find, replace, 1))
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    let built = build(scratch);
    std::fs::write(&path, &original).map_err(|e| format!("restore {}: {e}", path.display()))?;
    Ok(built)
}

/// Applies, builds and runs each of `mutations`; `progress` gets a line per mutation.
pub async fn run(
    cat: &Catalogue,
    workspace: &Path,
    scratch: &Path,
    mutations: &[Mutation],
    progress: impl Fn(&str),
) -> Result<Vec<MutationResult>, String> {
    let control_bin = unmutated(workspace, scratch, &progress)?;
    let mut controls: std::collections::BTreeMap<String, Result<(), String>> = Default::default();
    let mut results = Vec::new();
    for (i, m) in mutations.iter().enumerate() {
        let started = Instant::now();
        let case = cat
            .cases
            .iter()
            .find(|c| c.id == m.case)
            .ok_or_else(|| format!("no case {:?}", m.case))?;
        let shape = case.shapes[0].clone();
        if !controls.contains_key(&case.id) {
            let opts = RunOptions {
                daemon: DaemonUnderTest::Bin(control_bin.clone()),
                scaled: true,
            };
            let r = run_case(case, &shape, &opts, None).await;
            controls.insert(case.id.clone(), r.outcome.map_err(|f| f.to_string()));
        }
        let (fate, detail) = if let Some(Err(why)) = controls.get(&case.id) {
            (Fate::ControlFailed, why.clone())
        } else {
            match build_mutated(workspace, scratch, &m.file, &m.find, &m.replace)? {
                Err(e) => (Fate::Unbuildable, e),
                Ok(bin) => {
                    let opts = RunOptions {
                        daemon: DaemonUnderTest::Bin(bin),
                        scaled: true,
                    };
                    let r = run_case(case, &shape, &opts, None).await;
                    match r.outcome {
                        Err(f) => (Fate::Killed, f.to_string()),
                        Ok(()) => (Fate::Survived, "the case passed".to_string()),
                    }
                }
            }
        };
        let seconds = started.elapsed().as_secs();
        progress(&format!(
            "[{:>3}/{}] {} → {}: {} ({seconds} s)",
            i + 1,
            mutations.len(),
            m.id,
            m.case,
            match fate {
                Fate::Killed => "KILLED",
                Fate::Survived => "SURVIVED",
                Fate::Unbuildable => "UNBUILDABLE",
                Fate::ControlFailed => "CONTROL FAILED",
            }
        ));
        results.push(MutationResult {
            mutation: m.clone(),
            fate,
            detail,
            seconds,
        });
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CASE: &str = r#"id = "lifecycle/x"
family = "lifecycle"
seed = "delivery-daemon-concept.txt"
sentence = "s"
description = "d"
[[step]]
start = { daemon = "a" }
"#;

    fn setup(mutations: &str) -> (tempfile::TempDir, Catalogue) {
        let dir = tempfile::tempdir().unwrap();
        let cat_root = dir.path().join("cases");
        std::fs::create_dir_all(cat_root.join("lifecycle")).unwrap();
        std::fs::write(cat_root.join("lifecycle/x.toml"), CASE).unwrap();
        std::fs::write(cat_root.join("lifecycle/mutations.toml"), mutations).unwrap();
        std::fs::create_dir_all(dir.path().join("daemon/src")).unwrap();
        std::fs::write(
            dir.path().join("daemon/src/a.rs"),
            "if check() {\n    refuse();\n}\nif check() {\n}\n",
        )
        .unwrap();
        let cat = Catalogue::load(&cat_root).unwrap();
        (dir, cat)
    }

    fn mutation(case: &str, find: &str) -> String {
        format!(
            "[[mutation]]\nid = \"m\"\ncase = \"{case}\"\nfile = \"daemon/src/a.rs\"\nfind = \"{find}\"\nreplace = \"x\"\nwhy = \"w\"\n"
        )
    }

    /// A mutation whose text is no longer in its file (or is there twice), or whose case does
    /// not exist, is refused before anything is built: a stale mutation proves nothing.
    /// Mutation seen failing: `load` accepting any count of occurrences above zero.
    #[test]
    fn stale_ambiguous_and_orphan_mutations_are_refused() {
        let (dir, cat) = setup(&mutation("lifecycle/x", "refuse();"));
        assert_eq!(load(&cat, dir.path()).unwrap().len(), 1);
        for (m, says) in [
            (mutation("lifecycle/x", "no such text"), "occurs 0 times"),
            (mutation("lifecycle/x", "if check() {"), "occurs 2 times"),
            (
                mutation("lifecycle/y", "refuse();"),
                "no case \\\"lifecycle/y\\\"",
            ),
        ] {
            let (dir, cat) = setup(&m);
            let errors = load(&cat, dir.path()).unwrap_err();
            assert!(
                errors.iter().any(|e| format!("{e:?}").contains(says)),
                "{says}: {errors:?}"
            );
        }
    }
}
