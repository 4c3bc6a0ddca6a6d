//! The neutral build, kept as data beside the mutations (`cases/neutral.toml`): this
//! distribution's daemon with every line and reply error text the seeds do not quote reworded
//! and every exit code changed (`kit::reword`), and every environment knob no seed names
//! ignored, by a few edits at the daemon's choke points.
//! `harness mutate --neutral` builds it in the scratch copy and runs the catalogue against it
//! under both profiles: the contract profile must pass it whole (no contract verdict turns on
//! this distribution's wording, exit codes or knobs) and the distribution profile must fail it.
//!
//! [`coverage`] holds the edits complete: every place the daemon's sources write to stderr or
//! stdout, answer a reply's error or end the process is one the edits route through
//! `kit::reword`, or one named here with why it needs no rewording.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::mutate;
use super::results::QualifyReport;

/// `cases/neutral.toml`, from the catalogue's root.
pub const FILE: &str = "neutral.toml";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NeutralFile {
    #[serde(rename = "edit", default)]
    edits: Vec<Edit>,
}

/// One edit: `find` (exactly once in `file`, relative to the workspace root) replaced by
/// `replace`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    pub id: String,
    pub file: String,
    pub find: String,
    pub replace: String,
    /// What goes through this choke point.
    pub why: String,
}

/// Loads the edits of `cases` (a catalogue root) and checks each against the sources of
/// `workspace`: its text occurs exactly once in its file, ids are unique, and the edited
/// sources pass [`coverage`].
pub fn load(cases: &Path, workspace: &Path) -> Result<Vec<Edit>, Vec<String>> {
    let path = cases.join(FILE);
    let text =
        std::fs::read_to_string(&path).map_err(|e| vec![format!("{}: {e}", path.display())])?;
    let file: NeutralFile = toml::from_str(&text)
        .map_err(|e| vec![format!("{}: {}", path.display(), e.message().trim())])?;
    let mut errors = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for e in &file.edits {
        if !ids.insert(e.id.clone()) {
            errors.push(format!("edit {:?}: the id is used twice", e.id));
        }
        errors.extend(mutate::stale(workspace, &e.id, &e.file, &e.find));
        if e.find == e.replace {
            errors.push(format!(
                "edit {:?}: the replacement is the text itself",
                e.id
            ));
        }
    }
    if errors.is_empty() {
        errors.extend(coverage(workspace, &file.edits));
    }
    if errors.is_empty() {
        Ok(file.edits)
    } else {
        Err(errors)
    }
}

/// A place the daemon writes, answers or exits that needs no rewording: the file, a text of
/// its line, how many such lines the file has, and why.
type Exempt = (&'static str, &'static str, usize, &'static str);

/// The sites [`coverage`] looks for: what a line of the daemon's sources shows when it writes
/// to stderr or stdout, answers a reply's error or ends the process.
const SITES: &[&str] = &[
    "stderr()",
    "stdout()",
    ".print()",
    "dup2",
    "from_raw_fd(",
    "process::exit",
    "_exit(",
    "ExitCode",
    "error: Some(",
    "std::eprintln!",
    "std::println!",
    "std::eprint!",
    "std::print!",
];

/// Sites of the edited sources that need no rewording, each with why.
const EXEMPT: &[Exempt] = &[
    ("daemon/src/base/journal.rs", "let _ = std::io::stdout().flush();", 2,
        "the stamped log's redirect flushes stdout before moving it: it writes no text"),
    ("daemon/src/base/journal.rs", "let mut err = std::io::stderr().lock();", 2,
        "the journal's write and file_line, whose text the edits reword first"),
    ("daemon/src/base/journal.rs", "nix::unistd::dup2_std", 4,
        "the stamped log's redirect: the process's own stderr and stdout, already reworded, into the log file"),
    ("daemon/src/cli.rs", "if e.use_stderr() {", 1,
        "clap's message: which stream it goes to, through the reworded print macros"),
    ("daemon/src/main.rs", "std::process::exit(cotal_delivery::reword::exit_code(", 1,
        "the process's one exit, through the changed codes"),
    ("daemon/src/wire/control.rs", "error: Some(crate::reword::line(", 2,
        "a refused reply's error text, reworded"),
    ("daemon/src/lib.rs", "std::eprintln!", 2,
        "the neutral print macros themselves"),
    ("daemon/src/lib.rs", "std::println!", 2,
        "the neutral print macros themselves"),
    ("daemon/src/lib.rs", "std::eprint!", 1,
        "the neutral print macros themselves"),
    ("daemon/src/lib.rs", "std::print!", 1,
        "the neutral print macros themselves"),
];

/// The daemon's sources after `edits`, file by file (`daemon/src/…` → its text, test modules
/// cut: code under `#[cfg(test)]` never runs in the daemon).
fn edited_sources(workspace: &Path, edits: &[Edit]) -> Result<Vec<(String, String)>, String> {
    let mut files = Vec::new();
    rust_files(&workspace.join("daemon/src"), workspace, &mut files)?;
    let mut out = Vec::new();
    for rel in files {
        let mut text = std::fs::read_to_string(workspace.join(&rel))
            .map_err(|e| format!("read {rel}: {e}"))?;
        for e in edits.iter().filter(|e| e.file == rel) {
            text = text.replacen(&e.find, &e.replace, 1);
        }
        if let Some(i) = text.find("#[cfg(test)]\nmod tests") {
            text.truncate(i);
        }
        out.push((rel, text));
    }
    Ok(out)
}

fn rust_files(dir: &Path, root: &Path, out: &mut Vec<String>) -> Result<(), String> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("read {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, root, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(root).unwrap_or(&p);
            out.push(rel.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

/// What the edits leave unreworded: each site of [`SITES`] in the edited daemon sources that no
/// [`EXEMPT`] entry names (or more of them than it counts), an exempt entry that no longer
/// matches, the print macros not shadowed before the library's first module, and a print macro
/// in `main.rs` (its own crate, which the shadowing does not reach).
pub fn coverage(workspace: &Path, edits: &[Edit]) -> Vec<String> {
    let sources = match edited_sources(workspace, edits) {
        Ok(s) => s,
        Err(e) => return vec![e],
    };
    let mut problems = Vec::new();
    for (rel, text) in &sources {
        for (n, l) in text.lines().enumerate() {
            let code = l.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for site in SITES {
                if !code.contains(site) {
                    continue;
                }
                let exempt = EXEMPT
                    .iter()
                    .any(|(f, t, _, _)| f == rel && code.contains(t) && t.contains(site));
                if !exempt {
                    problems.push(format!(
                        "{rel}:{}: `{site}` writes, answers or exits without the neutral edits: {}",
                        n + 1,
                        code
                    ));
                }
            }
        }
        if rel == "daemon/src/lib.rs" {
            let shadow = text.find("macro_rules! eprintln");
            let first_mod = text.find("pub mod agent;");
            if !matches!((shadow, first_mod), (Some(s), Some(m)) if s < m)
                || ["println", "eprint", "print"]
                    .iter()
                    .any(|m| !text.contains(&format!("macro_rules! {m} ")))
            {
                problems.push(
                    "daemon/src/lib.rs: the print macros are not shadowed before its first module"
                        .into(),
                );
            }
        }
        if rel == "daemon/src/main.rs" {
            for m in ["println!", "eprintln!", "print!", "eprint!"] {
                // The macro by its whole name: `println!` is not read inside `eprintln!`.
                let named = text.match_indices(m).any(|(i, _)| {
                    !text[..i]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                });
                if named {
                    problems.push(format!(
                        "daemon/src/main.rs: `{m}` in the binary's own crate is not reworded"
                    ));
                }
            }
        }
    }
    for (file, text, count, _) in EXEMPT {
        // A count is how many lines hold the text: a new one is a site to look at.
        let lines = sources
            .iter()
            .filter(|(rel, _)| rel == file)
            .flat_map(|(_, t)| t.lines())
            .filter(|l| !l.trim_start().starts_with("//") && l.contains(text))
            .count();
        if lines != *count {
            problems.push(format!(
                "{file}: {lines} line(s) hold {text:?}, the neutral build's exemption counts {count}"
            ));
        }
    }
    problems
}

/// The neutral build: the edits applied to the scratch copy (the sources copied there first),
/// the daemon built, the edits undone; the build kept as `cotal-delivery-neutral` beside it.
pub fn build(
    workspace: &Path,
    scratch: &Path,
    edits: &[Edit],
    progress: &impl Fn(&str),
) -> Result<PathBuf, String> {
    mutate::copy_sources(workspace, scratch)
        .map_err(|e| format!("copy the sources to {}: {e}", scratch.display()))?;
    progress(&format!(
        "building the neutral daemon ({} edits) in {}",
        edits.len(),
        scratch.display()
    ));
    let triples: Vec<(&str, &str, &str)> = edits
        .iter()
        .map(|e| (e.file.as_str(), e.find.as_str(), e.replace.as_str()))
        .collect();
    let bin = mutate::build_edited(workspace, scratch, &triples)?
        .map_err(|e| format!("the neutral daemon does not build:\n{e}"))?;
    let kept = scratch.join("cotal-delivery-neutral");
    std::fs::copy(&bin, &kept).map_err(|e| format!("keep the neutral build: {e}"))?;
    Ok(kept)
}

/// The verdict of the two runs: proved neutral when the contract run had no failure and no
/// blocked case and the distribution run failed at least once; the line that says so.
pub fn verdict(contract: &QualifyReport, distribution: &QualifyReport) -> (bool, String) {
    let proved = contract.failed + contract.blocked == 0 && distribution.failed > 0;
    let behaviour = distribution
        .cases
        .iter()
        .filter(|c| c.verdict == super::results::CaseVerdict::Fail)
        .count();
    let line = format!(
        "neutral: contract {} passed, {} failed, {} blocked, {} skipped; distribution {} failed ({} by a step, {} by a transcript only), {} blocked, {} passed, {} skipped: {}",
        contract.passed,
        contract.failed,
        contract.blocked,
        contract.skipped,
        distribution.failed,
        behaviour,
        distribution.failed - behaviour.min(distribution.failed),
        distribution.blocked,
        distribution.passed,
        distribution.skipped,
        if proved {
            "PROVED (no contract verdict turns on this distribution's wording, exit codes or knobs; the distribution profile tells them apart)"
        } else if contract.failed + contract.blocked > 0 {
            "NOT PROVED (a contract verdict turns on this distribution's wording, exit codes or knobs: the cases above)"
        } else {
            "NOT PROVED (the distribution profile did not tell the neutral build apart)"
        }
    );
    (proved, line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// The shipped edits apply to this checkout (each text exactly once in its file) and leave
    /// no place the daemon writes, answers or exits outside them.
    /// Mutations seen failing: the `a-refusal-reply` edit removed from cases/neutral.toml
    /// (control.rs's `error: Some(self.text)` reported); a new `eprintln!` added to main.rs
    /// (reported: the binary's crate is not shadowed).
    #[test]
    fn the_shipped_edits_apply_and_cover_every_line_and_exit() {
        let ws = workspace();
        let edits = load(&ws.join("cases"), &ws).unwrap_or_else(|e| panic!("{e:#?}"));
        assert!(edits.len() >= 5, "{edits:?}");
        for drop in [
            "a-refusal-reply",
            "the-exit-status",
            "the-wording-and-every-print",
        ] {
            let fewer: Vec<Edit> = edits.iter().filter(|e| e.id != drop).cloned().collect();
            assert!(
                !coverage(&ws, &fewer).is_empty(),
                "without {drop} something is left unreworded"
            );
        }
    }

    /// An edit whose text is not in its file exactly once is refused, as a stale mutation is.
    /// Mutation seen failing: `load` skipping `mutate::stale`.
    #[test]
    fn a_stale_edit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("cases")).unwrap();
        std::fs::create_dir_all(dir.path().join("daemon/src")).unwrap();
        std::fs::write(dir.path().join("daemon/src/a.rs"), "fn a() {}\n").unwrap();
        std::fs::write(
            dir.path().join("cases").join(FILE),
            "[[edit]]\nid = \"x\"\nfile = \"daemon/src/a.rs\"\nfind = \"fn b()\"\nreplace = \"fn c()\"\nwhy = \"w\"\n",
        )
        .unwrap();
        let errors = load(&dir.path().join("cases"), dir.path()).unwrap_err();
        assert!(
            errors.iter().any(|e| e.contains("occurs 0 times")),
            "{errors:?}"
        );
    }
}
