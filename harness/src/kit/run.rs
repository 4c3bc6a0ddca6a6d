//! Running one case on one shape: start its mesh, run its steps in order with their timing
//! modifiers (a bound or a floor measured from a named earlier event, a figure), stop at the
//! first failure, and turn what was seen into the transcript. The world is dropped at the end,
//! which stops every broker, proxy and process the case started.

use std::path::Path;
use std::time::{Duration, Instant};

use super::case::Case;
use super::profile::KitProfile;
use super::steps::verb::{Ctx, DEFAULT_WITHIN};
use super::transcript::normalise;
use super::world::World;
use crate::kit::failure::Failure;
use crate::kit::shape::Shape;
use crate::kit::under_test::RunOptions;

/// Where a case failed: its step (0 before any step: the mesh did not start) and what it
/// expected against what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailure {
    pub step: usize,
    pub line: usize,
    pub verb: String,
    pub failure: Failure,
    /// The step's label, when it has one (a mutation's evidence is named by it).
    pub label: Option<String>,
    /// The profile of the step that failed.
    pub profile: KitProfile,
    /// The case the failed step stands on: the verdict is blocked by it, not a failure.
    pub stands_on: Option<String>,
}

impl std::fmt::Display for StepFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.step == 0 {
            write!(f, "the mesh did not start: {}", self.failure.actual)
        } else {
            write!(
                f,
                "step {} (line {}, `{}`{}{}): expected {}; got {}",
                self.step,
                self.line,
                self.verb,
                self.label
                    .as_ref()
                    .map(|l| format!(", label {l:?}"))
                    .unwrap_or_default(),
                match self.profile {
                    KitProfile::Distribution => ", a distribution step",
                    KitProfile::Contract => "",
                },
                self.failure.expected,
                self.failure.actual
            )
        }
    }
}

/// What one run of a case produced.
#[derive(Debug)]
pub struct CaseRun {
    pub transcript: String,
    pub figures: Vec<(String, u128)>,
    pub outcome: Result<(), StepFailure>,
    pub duration: Duration,
}

/// Runs `case` on `shape`; with `keep`, leaves its logs there.
pub async fn run_case(
    case: &Case,
    shape: &Shape,
    opts: &RunOptions,
    keep: Option<&Path>,
) -> CaseRun {
    let started = Instant::now();
    let scaled = case.runs_scaled(opts.scaled, opts.profile);
    let env = case.env_for(scaled).map_err(Failure::could_not);
    let started_world = match env {
        Ok(env) => World::start(&case.mesh, shape, env, case.vars_for(scaled), opts).await,
        Err(e) => Err(e),
    };
    let mut world = match started_world {
        Ok(w) => w,
        Err(failure) => {
            return CaseRun {
                transcript: header(case),
                figures: Vec::new(),
                outcome: Err(StepFailure {
                    step: 0,
                    line: 0,
                    verb: String::new(),
                    failure,
                    label: None,
                    profile: KitProfile::Contract,
                    stands_on: None,
                }),
                duration: started.elapsed(),
            }
        }
    };
    let mut log = Vec::new();
    let outcome = steps(case, opts.profile, &mut world, &mut log).await;
    let transcript = transcript(case, &world, &log);
    if let Some(dir) = keep {
        if let Err(e) = world.keep(dir, &transcript) {
            eprintln!("harness: could not keep the logs in {}: {e}", dir.display());
        }
    }
    let figures = std::mem::take(&mut world.figures);
    world.close().await;
    CaseRun {
        transcript,
        figures,
        outcome,
        duration: started.elapsed(),
    }
}

async fn steps(
    case: &Case,
    profile: KitProfile,
    w: &mut World,
    log: &mut Vec<String>,
) -> Result<(), StepFailure> {
    for (i, at) in case.steps.iter().enumerate() {
        let Some(step) = at.for_profile(profile) else {
            log.push(format!("{:>2}. (a distribution step, not run)", i + 1));
            continue;
        };
        let fail = |failure: Failure| StepFailure {
            step: i + 1,
            line: at.line,
            verb: at.verb.clone(),
            failure,
            label: at.label.clone(),
            profile: at.profile,
            stands_on: at.stands_on.clone(),
        };
        let started = Instant::now();
        let base = match &at.timing.since {
            Some(m) => *w
                .marks
                .get(m)
                .ok_or_else(|| fail(Failure::could_not(format!("no event {m:?} happened"))))?,
            None => started,
        };
        let within = match (&at.timing.within, step.default_within()) {
            (Some(d), _) => {
                Duration::from_millis(d.eval(&w.vars).map_err(|m| fail(Failure::could_not(m)))?)
            }
            (None, Some(d)) => d,
            (None, None) => DEFAULT_WITHIN,
        };
        let ctx = Ctx {
            started: base,
            deadline: base + within,
        };
        w.happened_at = None;
        let line = step.run(w, ctx).await.map_err(fail)?;
        // A step that knows when its event happened (a broker's stamp) is timed by that.
        let happened = w.happened_at.take();
        if let (Some(h), Some(since)) = (happened, &at.timing.since) {
            if h < base {
                return Err(fail(Failure::new(
                    format!("this to happen after {since}"),
                    format!(
                        "it happened {} ms before it",
                        base.saturating_duration_since(h).as_millis()
                    ),
                )));
            }
        }
        let done = happened.unwrap_or_else(Instant::now);
        let elapsed = done.saturating_duration_since(base);
        let since_name = at.timing.since.as_deref().unwrap_or("the step began");
        if let Some(floor) = &at.timing.at_least {
            let floor = Duration::from_millis(
                floor
                    .eval(&w.vars)
                    .map_err(|m| fail(Failure::could_not(m)))?,
            );
            if elapsed < floor {
                return Err(fail(Failure::new(
                    format!(
                        "this to happen at least {} ms after {since_name}",
                        floor.as_millis()
                    ),
                    format!("after {} ms", elapsed.as_millis()),
                )));
            }
        }
        // Its bound is checked after the fact: a stamp read late may lie past it.
        if happened.is_some() && at.timing.within.is_some() && done > ctx.deadline {
            return Err(fail(Failure::new(
                format!(
                    "this to happen within {} ms of {since_name}",
                    ctx.deadline.saturating_duration_since(base).as_millis()
                ),
                format!("after {} ms", elapsed.as_millis()),
            )));
        }
        if let Some(name) = &at.timing.figure {
            w.figures.push((name.clone(), elapsed.as_millis()));
        }
        if let Some(m) = &at.timing.mark {
            w.marks.insert(m.clone(), done);
        }
        let timing = match (&at.timing.since, &at.timing.within, &at.timing.at_least) {
            (since, within, at_least) if within.is_some() || at_least.is_some() => {
                let from = since
                    .as_ref()
                    .map(|s| format!(" of {s}"))
                    .unwrap_or_default();
                match (at_least, within) {
                    (Some(a), Some(b)) => format!(" (between {a} and {b}{from})"),
                    (Some(a), None) => format!(" (at least {a}{from})"),
                    (None, Some(b)) => format!(" (within {b}{from})"),
                    (None, None) => String::new(),
                }
            }
            _ => String::new(),
        };
        log.push(format!("{:>2}. {line}{timing}", i + 1));
    }
    Ok(())
}

fn header(case: &Case) -> String {
    format!("case: {}\n{}\n", case.id, case.description.trim())
}

/// The normalised transcript: the header, the steps' lines, each daemon's own lines.
fn transcript(case: &Case, w: &World, log: &[String]) -> String {
    let omit: Vec<regex::Regex> = case
        .transcript
        .omit
        .iter()
        .filter_map(|r| regex::Regex::new(r).ok())
        .collect();
    let mut out = header(case);
    out.push_str("\nsteps:\n");
    for l in log {
        out.push_str(l);
        out.push('\n');
    }
    for (name, d) in &w.daemons {
        out.push_str(&format!("\ndaemon {name}:\n"));
        for l in d.lines() {
            if crate::rig::daemon::is_component_line(&l) || omit.iter().any(|r| r.is_match(&l)) {
                continue;
            }
            out.push_str("  ");
            out.push_str(&l);
            out.push('\n');
        }
    }
    let tokens = w.path_tokens();
    let paths: Vec<(&std::path::Path, &str)> = tokens
        .iter()
        .map(|(p, t)| (p.as_path(), t.as_str()))
        .collect();
    normalise(&out, &paths)
}
