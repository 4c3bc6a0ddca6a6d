//! The checker catches what it claims (issue 31): daemon builds with one behaviour broken, kept
//! as data in `cases/simulation-mutations.toml` (file, text found exactly once, its
//! replacement, why, and the seed of a default run that catches it). `harness mutate
//! --simulation` applies each to a scratch copy of the checkout (the kit's mutation machinery:
//! the same copy and build), runs the simulation with its seed against that build, and reports
//! KILLED when the verdict is invalid. With `--control`, the unmutated scratch build runs each
//! seed first (once per seed): a control that is itself invalid proves nothing (one that is
//! unknown, nothing invalid but something undecided, still proves the invalid findings are the
//! broken build's).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::runner::{self, Options};
use crate::kit::mutate::{build_mutated, stale, unmutated};
use crate::kit::under_test::DaemonUnderTest;
use crate::simulation::check::Verdict;

/// The file the simulation's mutations are kept in, under `cases/`.
pub const MUTATIONS_FILE: &str = "simulation-mutations.toml";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimMutationsFile {
    #[serde(rename = "mutation", default)]
    mutations: Vec<SimMutation>,
}

/// One broken daemon build and the seed that catches it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SimMutation {
    pub id: String,
    /// The file, relative to the workspace root.
    pub file: String,
    pub find: String,
    pub replace: String,
    /// What the mutation breaks.
    pub why: String,
    /// A seed whose default run judges this build invalid.
    pub seed: u64,
    /// The run's minutes (default: the simulation's default).
    #[serde(default)]
    pub minutes: Option<f64>,
}

/// How a mutation fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MutantFate {
    /// The run was invalid.
    Killed,
    /// The run was valid: the checker did not see the broken behaviour with this seed.
    Survived,
    /// The run was unknown: nothing invalid, something undecided.
    Undecided,
    /// The mutated daemon did not build, or the run could not reach a verdict.
    CouldNotRun,
    /// The unmutated build was invalid with this seed.
    ControlFailed,
}

/// One mutation's result, with the findings that decided it.
#[derive(Debug, Clone, Serialize)]
pub struct MutantResult {
    pub mutation: SimMutation,
    pub fate: MutantFate,
    pub verdict: Option<Verdict>,
    pub lost: usize,
    pub leaked: usize,
    pub unexpected: usize,
    pub disallowed_duplicates: usize,
    /// The checker's reasons, or why it could not run.
    pub why: Vec<String>,
    pub run_dir: PathBuf,
    pub seconds: u64,
}

/// Loads the mutations and checks each against the sources (its text exactly once).
pub fn load(workspace: &Path) -> Result<Vec<SimMutation>, Vec<String>> {
    let path = workspace.join("cases").join(MUTATIONS_FILE);
    let text =
        std::fs::read_to_string(&path).map_err(|e| vec![format!("{}: {e}", path.display())])?;
    let file: SimMutationsFile = toml::from_str(&text)
        .map_err(|e| vec![format!("{}: {}", path.display(), e.message().trim())])?;
    let mut errors = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for m in &file.mutations {
        if !ids.insert(m.id.clone()) {
            errors.push(format!("mutation {:?}: the id is used twice", m.id));
        }
        errors.extend(stale(workspace, &m.id, &m.file, &m.find));
    }
    if errors.is_empty() {
        Ok(file.mutations)
    } else {
        Err(errors)
    }
}

async fn simulate(
    bin: &Path,
    seed: u64,
    minutes: f64,
    dir: PathBuf,
) -> Result<super::runner::Finished, String> {
    let _ = std::fs::remove_dir_all(&dir);
    runner::run(Options {
        daemon: DaemonUnderTest::Bin(bin.to_path_buf()),
        daemon_label: bin.display().to_string(),
        seed,
        minutes,
        cluster: false,
        standby: false,
        agents: super::config::DEFAULT_AGENTS,
        dir,
        replay: None,
        progress: true,
    })
    .await
    .map_err(|e| e.to_string())
}

/// Applies, builds and runs each of `mutations` (after its control, with `control`); run
/// directories go under `runs`; `progress` gets a line per mutation.
pub async fn run(
    workspace: &Path,
    scratch: &Path,
    runs: &Path,
    mutations: &[SimMutation],
    control: bool,
    progress: impl Fn(&str),
) -> Result<Vec<MutantResult>, String> {
    let control_bin = unmutated(workspace, scratch, &progress)?;
    let mut out = Vec::new();
    // One control run per seed and length, shared by the mutations that name them.
    let mut controls: std::collections::BTreeMap<(u64, u64), Result<(), Vec<String>>> =
        Default::default();
    for (i, m) in mutations.iter().enumerate() {
        let started = Instant::now();
        let minutes = m.minutes.unwrap_or(super::config::DEFAULT_MINUTES);
        let dir = runs.join(&m.id);
        let mut result = MutantResult {
            mutation: m.clone(),
            fate: MutantFate::CouldNotRun,
            verdict: None,
            lost: 0,
            leaked: 0,
            unexpected: 0,
            disallowed_duplicates: 0,
            why: Vec::new(),
            run_dir: dir.clone(),
            seconds: 0,
        };
        if control {
            let key = (m.seed, (minutes * 1000.0) as u64);
            if let std::collections::btree_map::Entry::Vacant(slot) = controls.entry(key) {
                progress(&format!(
                    "control: seed {} against the unmutated build",
                    m.seed
                ));
                let dir = runs.join(format!("control-seed-{}", m.seed));
                let verdict = match simulate(&control_bin, m.seed, minutes, dir).await {
                    Ok(o) if o.report.verdict != Verdict::Invalid => Ok(()),
                    Ok(o) => Err(o.report.why.clone()),
                    Err(e) => Err(vec![e]),
                };
                slot.insert(verdict);
            }
            if let Some(Err(why)) = controls.get(&key) {
                result.fate = MutantFate::ControlFailed;
                result.why = why.clone();
            }
        }
        if result.fate != MutantFate::ControlFailed {
            match build_mutated(workspace, scratch, &m.file, &m.find, &m.replace)? {
                Err(e) => result.why = vec![format!("does not build: {e}")],
                Ok(bin) => {
                    let mutant = scratch.join(format!("cotal-delivery-{}", m.id));
                    std::fs::copy(&bin, &mutant).map_err(|e| format!("keep the build: {e}"))?;
                    match simulate(&mutant, m.seed, minutes, dir).await {
                        Ok(o) => {
                            let r = &o.report;
                            result.verdict = Some(r.verdict);
                            result.lost = r.lost.len();
                            result.leaked = r.leaked.len();
                            result.unexpected = r.unexpected.len();
                            result.disallowed_duplicates =
                                r.duplicates.iter().filter(|d| !d.allowed).count();
                            result.why = r.why.clone();
                            result.fate = match r.verdict {
                                Verdict::Invalid => MutantFate::Killed,
                                Verdict::Valid => MutantFate::Survived,
                                Verdict::Unknown => MutantFate::Undecided,
                            };
                        }
                        Err(e) => result.why = vec![e],
                    }
                }
            }
        }
        result.seconds = started.elapsed().as_secs();
        progress(&format!(
            "[{}/{}] {} (seed {}): {:?} ({} s)",
            i + 1,
            mutations.len(),
            m.id,
            m.seed,
            result.fate,
            result.seconds
        ));
        out.push(result);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped mutations each name text that is in their file exactly once: a stale one
    /// (the code moved on) is refused before anything is built.
    /// Mutation seen failing: a `find` text edited by one character.
    #[test]
    fn the_shipped_simulation_mutations_are_current() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace");
        let all = load(workspace).unwrap_or_else(|e| panic!("{e:?}"));
        // Issue 31's four, issue 43's three at the membership edges, and the reader that
        // ignores only the current leave cursor (caught by the held leave).
        assert_eq!(all.len(), 8, "{all:?}");
    }
}
