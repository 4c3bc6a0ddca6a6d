//! Mutations kept as data: each names a daemon source file, a text to find in it (exactly
//! once), its replacement, the case expected to fail with it, the step of that case that is the
//! evidence (its `label`) and why. `harness mutate` applies each to a scratch copy of the
//! workspace, builds the daemon there and runs the case against that build on every shape the
//! case runs on, twice each (behaviour only, scaled), under the profile of the named step: the
//! contract profile when it is a contract step, so a kill there proves the contract; the
//! distribution profile when the step (or the mutation) says so, and that kill proves the
//! distribution profile only. The fate: KILLED only when the named step failed in every run;
//! FLAKY when the two runs of a shape disagree; WRONG-STEP when the case failed at another step;
//! SURVIVED when it passed. A control run of the case against the unmutated scratch build, on
//! each shape, comes first, so a case that fails anyway kills nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::catalogue::Catalogue;
use super::profile::KitProfile;
use super::run::{run_case, StepFailure};
use crate::kit::shape::Shape;
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
    /// The label of the case's step that must fail: the evidence.
    pub step: String,
    /// `distribution`: judged under the distribution profile although the named step is a
    /// contract step (what kills it is the step's `distribution = { … }` expectation).
    #[serde(default)]
    pub profile: Option<KitProfile>,
}

/// Runs of each mutated build on each shape.
pub const RUNS_PER_SHAPE: usize = 2;

/// How a mutation fared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fate {
    /// The named step failed in every run on every shape.
    Killed,
    /// The case failed at another step than the named one (in both runs of a shape).
    WrongStep,
    /// The two runs of a shape disagreed: no verdict.
    Flaky,
    /// The case passed against it: the case does not prove its behaviour.
    Survived,
    /// The mutated daemon did not build.
    Unbuildable,
    /// The case failed against the unmutated build too, so this run proves nothing.
    ControlFailed,
}

impl Fate {
    pub fn as_str(&self) -> &'static str {
        match self {
            Fate::Killed => "KILLED",
            Fate::WrongStep => "WRONG-STEP",
            Fate::Flaky => "FLAKY",
            Fate::Survived => "SURVIVED",
            Fate::Unbuildable => "UNBUILDABLE",
            Fate::ControlFailed => "CONTROL FAILED",
        }
    }
}

/// What one run of a mutated build saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "outcome")]
pub enum MutantRun {
    Passed,
    Failed {
        step: usize,
        #[serde(skip_serializing_if = "Option::is_none")]
        label: Option<String>,
        detail: String,
    },
}

impl MutantRun {
    fn of(outcome: &Result<(), StepFailure>) -> MutantRun {
        match outcome {
            Ok(()) => MutantRun::Passed,
            Err(f) => MutantRun::Failed {
                step: f.step,
                label: f.label.clone(),
                detail: f.to_string(),
            },
        }
    }

    /// Whether this run failed at the step labelled `label`.
    fn at(&self, label: &str) -> bool {
        matches!(self, MutantRun::Failed { label: Some(l), .. } if l == label)
    }

    /// Whether two runs saw the same: both passed, or both failed at one step.
    fn agrees(&self, other: &MutantRun) -> bool {
        match (self, other) {
            (MutantRun::Passed, MutantRun::Passed) => true,
            (MutantRun::Failed { step: a, .. }, MutantRun::Failed { step: b, .. }) => a == b,
            _ => false,
        }
    }
}

/// The runs on one shape.
#[derive(Debug, Clone, Serialize)]
pub struct ShapeRuns {
    pub shape: String,
    pub runs: Vec<MutantRun>,
}

/// The fate of runs on every shape, judged against the step labelled `label`.
pub fn fate_of(shapes: &[ShapeRuns], label: &str) -> Fate {
    let all: Vec<&MutantRun> = shapes.iter().flat_map(|s| &s.runs).collect();
    if !all.is_empty() && all.iter().all(|r| r.at(label)) {
        return Fate::Killed;
    }
    if shapes
        .iter()
        .any(|s| s.runs.windows(2).any(|w| !w[0].agrees(&w[1])))
    {
        return Fate::Flaky;
    }
    if all
        .iter()
        .any(|r| matches!(r, MutantRun::Failed { .. }) && !r.at(label))
    {
        return Fate::WrongStep;
    }
    Fate::Survived
}

/// One mutation's result.
#[derive(Debug, Clone, Serialize)]
pub struct MutationResult {
    pub mutation: Mutation,
    pub fate: Fate,
    /// The profile it was judged under: a kill under `distribution` proves that profile only.
    pub proves: KitProfile,
    /// The runs on each shape (none when it did not build or its control failed).
    pub shapes: Vec<ShapeRuns>,
    /// Why nothing was run, or what set the fate apart.
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
        match cat.cases.iter().find(|c| c.id == m.case) {
            None => errors.push(format!("mutation {:?}: no case {:?}", m.id, m.case)),
            Some(case) => match case.labelled(&m.step) {
                None => errors.push(format!(
                    "mutation {:?}: case {} has no step labelled {:?} (its evidence: `label = {:?}` on the step that must fail)",
                    m.id, m.case, m.step, m.step
                )),
                Some((_, at))
                    if at.profile == KitProfile::Distribution
                        && m.profile == Some(KitProfile::Contract) =>
                {
                    errors.push(format!(
                        "mutation {:?}: step {:?} is a distribution step, judged by the distribution profile only",
                        m.id, m.step
                    ))
                }
                Some(_) => {}
            },
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
pub(crate) fn copy_sources(from: &Path, to: &Path) -> std::io::Result<()> {
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
    build_edited(workspace, scratch, &[(file, find, replace)])
}

/// Applies `edits` (each `(file, find, replace)`: `find` replaced once; several may edit one
/// file, in order) to the scratch copy, builds the daemon there and restores every edited file:
/// the build, or the compiler's last lines (the outer error: a file could not be read, written
/// or restored).
pub(crate) fn build_edited(
    workspace: &Path,
    scratch: &Path,
    edits: &[(&str, &str, &str)],
) -> Result<Result<PathBuf, String>, String> {
    let mut edited: BTreeMap<&str, (String, String)> = BTreeMap::new();
    for (file, find, replace) in edits {
        if !edited.contains_key(file) {
            let original = std::fs::read_to_string(workspace.join(file))
                .map_err(|e| format!("read {file}: {e}"))?;
            edited.insert(file, (original.clone(), original));
        }
        if let Some((_, text)) = edited.get_mut(file) {
            *text = text.replacen(find, replace, 1);
        }
    }
    for (file, (_, text)) in &edited {
        let path = scratch.join(file);
        std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    let built = build(scratch);
    for (file, (original, _)) in &edited {
        let path = scratch.join(file);
        std::fs::write(&path, original).map_err(|e| format!("restore {}: {e}", path.display()))?;
    }
    Ok(built)
}

/// The profile mutation `m` is judged under on `case`: the named step's, or the mutation's own
/// `profile = "distribution"`.
pub fn profile_of(m: &Mutation, case: &super::case::Case) -> KitProfile {
    match (m.profile, case.labelled(&m.step)) {
        (Some(KitProfile::Distribution), _) => KitProfile::Distribution,
        (_, Some((_, at))) => at.profile,
        (_, None) => KitProfile::Distribution,
    }
}

/// Applies, builds and runs each of `mutations`; `progress` gets a line per run and per
/// mutation.
pub async fn run(
    cat: &Catalogue,
    workspace: &Path,
    scratch: &Path,
    mutations: &[Mutation],
    progress: impl Fn(&str),
) -> Result<Vec<MutationResult>, String> {
    let control_bin = unmutated(workspace, scratch, &progress)?;
    let mut controls: BTreeMap<(String, String, KitProfile), Result<(), String>> = BTreeMap::new();
    let mut results = Vec::new();
    for (i, m) in mutations.iter().enumerate() {
        let started = Instant::now();
        let case = cat
            .cases
            .iter()
            .find(|c| c.id == m.case)
            .ok_or_else(|| format!("no case {:?}", m.case))?;
        let profile = profile_of(m, case);
        let opts_of = |bin: PathBuf| RunOptions {
            daemon: DaemonUnderTest::Bin(bin),
            scaled: true,
            profile,
        };
        let mut control_failed = None;
        for shape in &case.shapes {
            let key = (case.id.clone(), shape.to_string(), profile);
            if !controls.contains_key(&key) {
                let r = run_case(case, shape, &opts_of(control_bin.clone()), None).await;
                controls.insert(key.clone(), r.outcome.map_err(|f| f.to_string()));
            }
            if let Some(Err(why)) = controls.get(&key) {
                control_failed = Some(format!("[{shape}] {why}"));
                break;
            }
        }
        let (fate, shapes, detail) = if let Some(why) = control_failed {
            (Fate::ControlFailed, Vec::new(), why)
        } else {
            match build_mutated(workspace, scratch, &m.file, &m.find, &m.replace)? {
                Err(e) => (Fate::Unbuildable, Vec::new(), e),
                Ok(bin) => {
                    let shapes =
                        runs_on_shapes(case, &case.shapes, &opts_of(bin), &m.id, &progress).await;
                    let fate = fate_of(&shapes, &m.step);
                    let detail = match fate {
                        Fate::Killed => format!("step {:?} failed in every run", m.step),
                        _ => shapes
                            .iter()
                            .flat_map(|s| {
                                s.runs.iter().enumerate().map(move |(n, r)| match r {
                                    MutantRun::Passed => {
                                        format!("[{}] run {}: passed", s.shape, n + 1)
                                    }
                                    MutantRun::Failed { detail, .. } => {
                                        format!("[{}] run {}: {detail}", s.shape, n + 1)
                                    }
                                })
                            })
                            .collect::<Vec<_>>()
                            .join("\n"),
                    };
                    (fate, shapes, detail)
                }
            }
        };
        let seconds = started.elapsed().as_secs();
        progress(&format!(
            "[{:>3}/{}] {} -> {} step {:?}: {}{} ({seconds} s)",
            i + 1,
            mutations.len(),
            m.id,
            m.case,
            m.step,
            fate.as_str(),
            if fate == Fate::Killed && profile == KitProfile::Distribution {
                " (distribution profile only)"
            } else {
                ""
            }
        ));
        results.push(MutationResult {
            mutation: m.clone(),
            fate,
            proves: profile,
            shapes,
            detail,
            seconds,
        });
    }
    Ok(results)
}

/// Runs `case` against the mutated build in `opts` on each of `shapes`, [`RUNS_PER_SHAPE`] times.
async fn runs_on_shapes(
    case: &super::case::Case,
    shapes: &[Shape],
    opts: &RunOptions,
    id: &str,
    progress: &impl Fn(&str),
) -> Vec<ShapeRuns> {
    let mut out = Vec::new();
    for shape in shapes {
        let mut runs = Vec::new();
        for n in 1..=RUNS_PER_SHAPE {
            let r = run_case(case, shape, opts, None).await;
            let outcome = MutantRun::of(&r.outcome);
            progress(&format!(
                "      {id} [{shape}] run {n}: {}",
                match &outcome {
                    MutantRun::Passed => "passed".to_string(),
                    MutantRun::Failed { detail, .. } => detail.clone(),
                }
            ));
            runs.push(outcome);
        }
        out.push(ShapeRuns {
            shape: shape.to_string(),
            runs,
        });
    }
    out
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
[[step]]
expect_exit = { daemon = "a", nonzero = true }
label = "refused"
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
            "[[mutation]]\nid = \"m\"\nstep = \"refused\"\ncase = \"{case}\"\nfile = \"daemon/src/a.rs\"\nfind = \"{find}\"\nreplace = \"x\"\nwhy = \"w\"\n"
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

    /// A mutation names its evidence: a step of its case by label. One naming no such step is
    /// refused before anything is built.
    /// Mutation seen failing: `load` not looking the label up (the missing step loads).
    #[test]
    fn a_mutation_names_a_labelled_step_of_its_case() {
        let m =
            mutation("lifecycle/x", "refuse();").replace("step = \"refused\"", "step = \"gone\"");
        let (dir, cat) = setup(&m);
        let errors = load(&cat, dir.path()).unwrap_err();
        assert!(
            errors
                .iter()
                .any(|e| e.contains("no step labelled \"gone\"")),
            "{errors:?}"
        );
    }

    fn failed(step: usize, label: Option<&str>) -> MutantRun {
        MutantRun::Failed {
            step,
            label: label.map(str::to_string),
            detail: String::new(),
        }
    }

    fn shapes(runs: &[&[MutantRun]]) -> Vec<ShapeRuns> {
        runs.iter()
            .enumerate()
            .map(|(i, r)| ShapeRuns {
                shape: format!("s{i}"),
                runs: r.to_vec(),
            })
            .collect()
    }

    /// KILLED only when the named step failed in every run on every shape; runs of one shape
    /// that disagree are FLAKY; a failure elsewhere is WRONG-STEP; a pass is SURVIVED.
    /// Mutation seen failing: `fate_of` answering KILLED when any run failed at the step (a
    /// kill on one shape and a pass on the other read as a proof).
    #[test]
    fn a_kill_is_the_named_step_failing_every_time() {
        let at = || failed(3, Some("refused"));
        let elsewhere = || failed(2, None);
        assert_eq!(
            fate_of(&shapes(&[&[at(), at()], &[at(), at()]]), "refused"),
            Fate::Killed
        );
        assert_eq!(
            fate_of(
                &shapes(&[&[at(), at()], &[MutantRun::Passed, MutantRun::Passed]]),
                "refused"
            ),
            Fate::Survived
        );
        assert_eq!(
            fate_of(&shapes(&[&[at(), MutantRun::Passed]]), "refused"),
            Fate::Flaky
        );
        assert_eq!(
            fate_of(&shapes(&[&[at(), elsewhere()]]), "refused"),
            Fate::Flaky
        );
        assert_eq!(
            fate_of(&shapes(&[&[elsewhere(), elsewhere()]]), "refused"),
            Fate::WrongStep
        );
        assert_eq!(
            fate_of(
                &shapes(&[&[MutantRun::Passed, MutantRun::Passed]]),
                "refused"
            ),
            Fate::Survived
        );
        assert_eq!(fate_of(&[], "refused"), Fate::Survived);
    }
}
