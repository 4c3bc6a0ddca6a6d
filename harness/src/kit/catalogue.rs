//! The catalogue: every case under `cases/<family>/`, loaded and checked together (a file
//! whose id is not its place, a family that is not its folder, a folder whose name cannot be a
//! family, a `stands_on` naming no case are refused). The families are
//! the folders of the catalogue, read, never listed: a new family is a new folder, a new case its
//! file and its snapshot. Selected by family or id, and run as `harness qualify` runs it under
//! one profile: each (case, shape) in parallel up to `-j`, `--repeat` rounds each, a failure at a
//! step that stands on another case reported as blocked by it, transcripts compared with their
//! snapshots (distribution profile), logs kept for the failures.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::case::{is_family_name, Case, LoadError};
use super::profile::KitProfile;
use super::results::{
    figure, CaseReport, CaseVerdict, FailureReport, QualifyReport, Subject, TranscriptVerdict,
};
use super::run::run_case;
use super::transcript::{first_difference, matches_snapshot};
use crate::kit::shape::Shape;
use crate::kit::under_test::RunOptions;

/// The loaded catalogue.
#[derive(Debug)]
pub struct Catalogue {
    pub root: PathBuf,
    /// The folders of `root`, sorted: each a family.
    pub families: Vec<String>,
    pub cases: Vec<Case>,
}

/// The checkout's own `cases/` (tests read it; the `harness` binary finds its catalogue with
/// [`locate`]). Empty when this binary runs outside its checkout.
pub fn shipped_root() -> PathBuf {
    crate::rig::checkout::root()
        .map(|r| r.join("cases"))
        .unwrap_or_default()
}

/// Where a run's catalogue was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `--cases DIR`.
    Given,
    /// `cases/` beside the harness binary (an unpacked kit).
    BesideBinary,
    /// The checkout's `cases/`, the harness running from inside the checkout it was built in.
    Checkout,
    /// Carried in the harness binary, unpacked into a temporary directory for the run.
    Carried,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Origin::Given => "given with --cases",
            Origin::BesideBinary => "beside the harness binary",
            Origin::Checkout => "the checkout's cases/",
            Origin::Carried => "carried in the harness binary",
        })
    }
}

/// A catalogue directory found for a run: where, how, its digest (`kit::carried`'s), and the
/// temporary directory the carried one was unpacked into (removed when this is dropped).
#[derive(Debug)]
pub struct Located {
    pub root: PathBuf,
    pub origin: Origin,
    pub digest: String,
    pub unpacked: Option<tempfile::TempDir>,
}

/// The catalogue of a run: `given` (`--cases`), else `cases/` beside the running binary, else
/// the checkout's when the binary runs from inside the checkout it was built in, else the one
/// the binary carries.
pub fn locate(given: Option<PathBuf>) -> Result<Located, String> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("cases")))
        .filter(|d| d.is_dir());
    let checkout = crate::rig::checkout::root()
        .map(|r| r.join("cases"))
        .filter(|d| d.is_dir());
    let (root, origin, unpacked) = match (given, beside, checkout) {
        (Some(dir), _, _) => (dir, Origin::Given, None),
        (None, Some(dir), _) => (dir, Origin::BesideBinary, None),
        (None, None, Some(dir)) => (dir, Origin::Checkout, None),
        (None, None, None) => {
            let tmp = tempfile::Builder::new()
                .prefix("harness-catalogue-")
                .tempdir()
                .map_err(|e| format!("unpack the carried catalogue: {e}"))?;
            super::carried::unpack(tmp.path())
                .map_err(|e| format!("unpack the carried catalogue: {e}"))?;
            (tmp.path().to_path_buf(), Origin::Carried, Some(tmp))
        }
    };
    let digest = super::carried::digest_of_dir(&root)
        .map_err(|e| format!("read the catalogue {}: {e}", root.display()))?;
    Ok(Located {
        root,
        origin,
        digest,
        unpacked,
    })
}

impl Catalogue {
    /// Loads every case under `root`; every refusal at once.
    pub fn load(root: &Path) -> Result<Catalogue, Vec<LoadError>> {
        let mut cases: Vec<Case> = Vec::new();
        let mut families = Vec::new();
        let mut errors = Vec::new();
        let entries = match std::fs::read_dir(root) {
            Ok(e) => e,
            Err(e) => {
                return Err(vec![LoadError {
                    file: root.to_path_buf(),
                    line: 0,
                    message: format!("cannot read the catalogue: {e}"),
                }])
            }
        };
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        dirs.sort();
        for dir in dirs {
            if !dir.is_dir() {
                continue;
            }
            let family = dir
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            if !is_family_name(&family) {
                errors.push(LoadError {
                    file: dir.clone(),
                    line: 0,
                    message: format!(
                        "the folder {family:?} cannot be a family (lower-case letters, digits and '-')"
                    ),
                });
                continue;
            }
            families.push(family.clone());
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map(|e| e.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            files.sort();
            for file in files {
                if file.extension().and_then(|e| e.to_str()) != Some("toml")
                    || file.file_name().and_then(|n| n.to_str()) == Some("mutations.toml")
                {
                    continue;
                }
                match Case::load(&file) {
                    Ok(case) => {
                        let stem = file
                            .file_stem()
                            .and_then(|s| s.to_str())
                            .unwrap_or_default();
                        let want = format!("{family}/{stem}");
                        if case.id != want {
                            errors.push(LoadError {
                                file: file.clone(),
                                line: 0,
                                message: format!(
                                    "its id is {:?}, its place says {want:?}",
                                    case.id
                                ),
                            });
                        } else {
                            cases.push(case);
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        for case in &cases {
            for at in &case.steps {
                if let Some(id) = &at.stands_on {
                    if !cases.iter().any(|c| &c.id == id) {
                        errors.push(LoadError {
                            file: case.path.clone(),
                            line: at.line,
                            message: format!("`stands_on = {id:?}` names no case of the catalogue"),
                        });
                    }
                }
            }
        }
        if errors.is_empty() {
            Ok(Catalogue {
                root: root.to_path_buf(),
                families,
                cases,
            })
        } else {
            Err(errors)
        }
    }

    /// The cases of the named families or ids (all without a name); an unknown name is refused.
    pub fn select(&self, only: &[String]) -> Result<Vec<&Case>, String> {
        if only.is_empty() {
            return Ok(self.cases.iter().collect());
        }
        for name in only {
            if !self.families.contains(name) && !self.cases.iter().any(|c| &c.id == name) {
                return Err(format!(
                    "--only {name:?}: no family or case of that name (families: {}; `harness qualify --list` lists the cases)",
                    self.families.join(", ")
                ));
            }
        }
        Ok(self
            .cases
            .iter()
            .filter(|c| only.iter().any(|n| *n == c.family || *n == c.id))
            .collect())
    }

    /// The snapshot of a case.
    pub fn snapshot_path(&self, case: &Case) -> PathBuf {
        self.root
            .join(&case.family)
            .join("snapshots")
            .join(format!("{}.snap", case.name()))
    }
}

/// How `harness qualify` runs.
#[derive(Debug, Clone)]
pub struct QualifyOptions {
    pub run: RunOptions,
    pub jobs: usize,
    pub repeat: usize,
    pub behaviour_only: bool,
    /// Keep every case's logs here; without it, failures' logs go to `failed_logs`.
    pub keep: Option<PathBuf>,
    pub failed_logs: PathBuf,
}

/// A directory name for a (case, shape).
fn dir_name(case: &Case, shape: &Shape) -> String {
    format!(
        "{}@{}",
        case.id.replace('/', "__"),
        shape.as_str().replace('+', "_")
    )
}

/// Runs the selected cases and reports; `progress` gets a line per finished (case, shape).
pub async fn qualify(
    cat: &Catalogue,
    cases: &[&Case],
    subject: Subject,
    opts: &QualifyOptions,
    progress: impl Fn(&str) + Send + Sync + 'static,
) -> QualifyReport {
    let started = Instant::now();
    let mut units: Vec<(&Case, Shape)> = Vec::new();
    for c in cases {
        for s in &c.shapes {
            units.push((c, s.clone()));
        }
    }
    let total = units.len();
    let progress = Arc::new(progress);
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let semaphore = Arc::new(tokio::sync::Semaphore::new(opts.jobs.max(1)));
    let mut reports: Vec<Option<CaseReport>> = vec![None; total];
    let futures = units.iter().enumerate().map(|(i, (case, shape))| {
        let semaphore = semaphore.clone();
        let progress = progress.clone();
        let done = done.clone();
        async move {
            let _permit = semaphore.acquire().await.ok();
            let report = qualify_one(cat, case, shape, opts).await;
            let n = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let verdict = match (&report.verdict, report.fails(opts.behaviour_only)) {
                (CaseVerdict::Skipped, _) => format!(
                    "skipped ({})",
                    report.skip_reason.as_deref().unwrap_or_default()
                ),
                (CaseVerdict::Blocked, _) => format!(
                    "BLOCKED by {}",
                    report.blocked_by.as_deref().unwrap_or_default()
                ),
                (_, true) if report.verdict == CaseVerdict::Pass => "DRIFT".to_string(),
                (_, true) => "FAIL".to_string(),
                _ => "pass".to_string(),
            };
            let verdict = match &report.shipped_because {
                Some(why) if report.verdict != CaseVerdict::Skipped => format!("{verdict} ({why})"),
                _ => verdict,
            };
            progress(&format!(
                "[{n:>3}/{total}] {} [{}] {verdict} {:.1} s",
                case.id,
                shape,
                report.duration_ms as f64 / 1000.0
            ));
            (i, report)
        }
    });
    for (i, r) in futures::future::join_all(futures).await {
        reports[i] = Some(r);
    }
    // Passing cases leave nothing behind: the directory goes when no failure kept logs in it.
    if opts.keep.is_none() {
        let _ = std::fs::remove_dir(&opts.failed_logs);
    }
    QualifyReport::new(
        subject,
        opts.run.profile,
        opts.run.scaled,
        opts.behaviour_only || opts.run.profile == KitProfile::Contract,
        reports.into_iter().flatten().collect(),
        started.elapsed().as_millis(),
    )
}

/// One (case, shape), every round.
async fn qualify_one(
    cat: &Catalogue,
    case: &Case,
    shape: &Shape,
    opts: &QualifyOptions,
) -> CaseReport {
    let mut report = CaseReport {
        id: case.id.clone(),
        family: case.family.clone(),
        seed: case.seed.clone(),
        sentence: case.sentence.trim().to_string(),
        shape: shape.to_string(),
        case_profile: case.profile,
        preconditions: case
            .preconditions()
            .into_iter()
            .map(str::to_string)
            .collect(),
        verdict: CaseVerdict::Pass,
        blocked_by: None,
        transcript: TranscriptVerdict::NotCompared,
        skip_reason: None,
        transcript_difference: None,
        duration_ms: 0,
        rounds: 0,
        figures: Vec::new(),
        failure: None,
        logs: None,
        form: case.form(opts.run.scaled, opts.run.profile),
        shipped_because: case.shipped_because(opts.run.scaled, opts.run.profile),
    };
    if let Some(why) = skip_reason(case, &opts.run) {
        report.verdict = CaseVerdict::Skipped;
        report.skip_reason = Some(why);
        return report;
    }
    let mut values: Vec<(String, Vec<u128>)> = Vec::new();
    let mut transcript = String::new();
    for round in 1..=opts.repeat.max(1) {
        let dir = opts
            .keep
            .as_ref()
            .unwrap_or(&opts.failed_logs)
            .join(dir_name(case, shape))
            .join(if opts.repeat > 1 {
                format!("round-{round}")
            } else {
                String::new()
            });
        let run = run_case(case, shape, &opts.run, Some(&dir)).await;
        report.rounds = round;
        report.duration_ms += run.duration.as_millis();
        for (name, ms) in run.figures {
            match values.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => v.push(ms),
                None => values.push((name, vec![ms])),
            }
        }
        transcript = run.transcript;
        if opts.keep.is_none() && run.outcome.is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        if let Err(f) = run.outcome {
            report.verdict = match &f.stands_on {
                Some(_) => CaseVerdict::Blocked,
                None => CaseVerdict::Fail,
            };
            report.blocked_by = f.stands_on.clone();
            report.failure = Some(FailureReport {
                step: f.step,
                line: f.line,
                verb: f.verb,
                expected: f.failure.expected,
                actual: f.failure.actual,
                round,
                label: f.label,
                profile: f.profile,
            });
            report.logs = Some(dir.display().to_string());
            break;
        }
    }
    report.figures = values.into_iter().map(|(n, v)| figure(&n, v)).collect();
    // Transcripts are this distribution's: compared in its profile only.
    if report.verdict == CaseVerdict::Pass
        && !opts.behaviour_only
        && opts.run.profile == KitProfile::Distribution
    {
        let path = cat.snapshot_path(case);
        match std::fs::read_to_string(&path) {
            Ok(text) if matches_snapshot(&text, &transcript) => {
                report.transcript = TranscriptVerdict::Match;
            }
            Ok(text) => {
                report.transcript = TranscriptVerdict::Drift;
                let body = super::transcript::snapshot_body(&text).unwrap_or_default();
                report.transcript_difference = Some(first_difference(body, &transcript));
                let dir = opts
                    .keep
                    .as_ref()
                    .unwrap_or(&opts.failed_logs)
                    .join(dir_name(case, shape));
                if std::fs::create_dir_all(&dir).is_ok()
                    && std::fs::write(dir.join("transcript.txt"), &transcript).is_ok()
                {
                    report.logs = Some(dir.display().to_string());
                }
            }
            Err(_) => report.transcript = TranscriptVerdict::Missing,
        }
    }
    report
}

/// Why a case cannot run against the daemon under test in the run's profile: a distribution
/// case under the contract profile, or (under `--daemon-cmd`) a step the template cannot express.
pub fn skip_reason(case: &Case, opts: &RunOptions) -> Option<String> {
    if case.profile == KitProfile::Distribution && opts.profile == KitProfile::Contract {
        return Some(format!(
            "a distribution case, judged by the distribution profile only: {}",
            case.why.as_deref().unwrap_or_default()
        ));
    }
    if !matches!(opts.daemon, crate::kit::under_test::DaemonUnderTest::Cmd(_)) {
        return None;
    }
    case.steps.iter().find_map(|s| {
        s.for_profile(opts.profile)?
            .unsupported(&opts.daemon)
            .map(|why| format!("line {}: {why}", s.line))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case_file(id: &str, family: &str) -> String {
        format!(
            "id = \"{id}\"\nfamily = \"{family}\"\nseed = \"delivery-service-contracts.txt\"\nsentence = \"s\"\ndescription = \"d\"\n\n[[step]]\nexpect_lease = {{ absent = true }}\n"
        )
    }

    /// A family is a folder: a new folder with a case file is a family the catalogue loads and
    /// `--only` selects, with no list to edit; a case whose `family` is not its folder, and a
    /// folder whose name cannot be a family, are refused by name.
    /// Mutations seen failing: `Case::load` not comparing the family with the folder (the
    /// misplaced case loads); the folder name not checked (`Bad_Folder` becomes a family).
    #[test]
    fn the_families_are_the_folders() {
        let dir = tempfile::tempdir().expect("scratch catalogue");
        let write = |family_dir: &str, name: &str, text: String| {
            std::fs::create_dir_all(dir.path().join(family_dir)).expect("folder");
            std::fs::write(dir.path().join(family_dir).join(name), text).expect("case");
        };
        write(
            "brand-new",
            "first.toml",
            case_file("brand-new/first", "brand-new"),
        );
        let cat = Catalogue::load(dir.path()).expect("a new family loads");
        assert_eq!(cat.families, vec!["brand-new".to_string()]);
        assert_eq!(cat.cases.len(), 1);
        let selected = cat
            .select(&["brand-new".into()])
            .expect("selected by family");
        assert_eq!(selected.len(), 1);
        let refused = cat
            .select(&["lifecycle".into()])
            .expect_err("no such family");
        assert!(refused.contains("families: brand-new"), "{refused}");

        write(
            "lifecycle",
            "misplaced.toml",
            case_file("standby/misplaced", "standby"),
        );
        write(
            "Bad_Folder",
            "x.toml",
            case_file("Bad_Folder/x", "Bad_Folder"),
        );
        let errors = Catalogue::load(dir.path()).expect_err("refused");
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(errors.len(), 2, "{text:?}");
        assert!(
            text.iter().any(|t| t
                .contains("misplaced.toml:2: family \"standby\" is not its folder \"lifecycle\"")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("the folder \"Bad_Folder\" cannot be a family")),
            "{text:?}"
        );
    }
}
