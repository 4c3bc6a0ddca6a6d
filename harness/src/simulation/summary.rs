//! What a person sees of a run: a progress line every few seconds while it runs (phase, time,
//! posts, frames, faults so far, agents online, who serves), and at the end one row of figures
//! (posts, frames, faults by kind, lost, leaked, duplicates explained or not, the verdict)
//! above the checker's own table.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use super::config::Phases;
use super::population::Population;
use super::record::{Recorder, Tally};
use super::stage::Stage;
use crate::simulation::check::{Phase, Report};

fn clock(ms: u64) -> String {
    let s = ms / 1000;
    format!("{}:{:02}", s / 60, s % 60)
}

fn faults_words(faults: &std::collections::BTreeMap<String, u64>) -> String {
    if faults.is_empty() {
        return "none".to_string();
    }
    faults
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Prints the progress line to stderr every `every` until aborted.
pub async fn progress(
    recorder: Arc<Recorder>,
    population: Population,
    stage: Arc<Mutex<Stage>>,
    every: Duration,
    phases: Phases,
) {
    let total = phases.drain_from();
    let started = recorder.now_ms();
    loop {
        tokio::time::sleep(every).await;
        let t = recorder.tally();
        let (online, alive) = {
            let pop = population.lock().unwrap_or_else(|p| p.into_inner());
            (
                pop.iter().filter(|s| s.online).count(),
                pop.iter().filter(|s| s.member.is_some()).count(),
            )
        };
        let serving = match stage.try_lock() {
            Ok(s) => {
                let names: Vec<&str> = s.daemons.serving.iter().map(String::as_str).collect();
                if names.is_empty() {
                    "no daemon serving".to_string()
                } else {
                    format!("serving: {}", names.join(", "))
                }
            }
            Err(_) => "serving: (a fault step holds the mesh)".to_string(),
        };
        let phase = match t.phase {
            Some(Phase::Quiet) => "quiet",
            Some(Phase::Faults) => "faults",
            Some(Phase::Heal) => "heal",
            Some(Phase::Drain) => "drain",
            Some(Phase::End) => "end",
            None => "setup",
        };
        eprintln!(
            "sim {}/{} {phase:<6} | posts {} ({} ok) | frames {} | faults: {} | online {online}/{alive} | {serving}",
            clock(recorder.now_ms().saturating_sub(started)),
            clock(total),
            t.posts,
            t.posts_ok,
            t.frames,
            faults_words(&t.faults),
        );
    }
}

/// The seed's swarm, as the run starts: each fault kind's weight (0: not drawn in this run) and
/// the workload's.
pub fn swarm_line(
    specs: &[super::config::FaultSpec],
    mix: &[(super::config::WorkKind, u64)],
) -> String {
    let mut faults: std::collections::BTreeMap<&str, u64> = Default::default();
    for f in specs {
        *faults.entry(f.kind.name()).or_default() += f.weight;
    }
    let faults: Vec<String> = faults.iter().map(|(k, w)| format!("{k} {w}")).collect();
    let work: Vec<String> = mix.iter().map(|(k, w)| format!("{k:?} {w}")).collect();
    format!(
        "swarm: faults {}; workload {}",
        faults.join(", "),
        work.join(", ")
    )
}

/// The run's row: what the issue asks of each measured run.
pub struct Row<'a> {
    pub seed: u64,
    pub minutes: f64,
    pub cluster: bool,
    pub standby: bool,
    pub report: &'a Report,
    pub tally: &'a Tally,
    pub wall: Duration,
    pub drained: bool,
}

impl Row<'_> {
    /// Duplicates the seeds allow, and those they do not.
    pub fn duplicates(&self) -> (usize, usize) {
        let ok = self.report.duplicates.iter().filter(|d| d.allowed).count();
        (ok, self.report.duplicates.len() - ok)
    }

    /// The summary table: one header, one row, then the checker's table.
    pub fn table(&self) -> String {
        let r = self.report;
        let (dup_ok, dup_bad) = self.duplicates();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "| seed | minutes | shape | standby | posts (ok) | frames | faults | lost | leaked | duplicates (allowed / not) | verdict |"
        );
        let _ = writeln!(
            out,
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        let _ = writeln!(
            out,
            "| {} | {:.1} | {} | {} | {} ({}) | {} | {} | {} | {} | {} / {} | {:?} |",
            self.seed,
            self.minutes,
            if self.cluster {
                "cluster"
            } else {
                "one broker"
            },
            if self.standby { "yes" } else { "no" },
            r.counts.posts,
            r.counts.posts_ok,
            r.counts.frames,
            faults_words(&r.counts.faults),
            r.lost.len(),
            r.leaked.len(),
            dup_ok,
            dup_bad,
            r.verdict,
        );
        let _ = writeln!(
            out,
            "\nwall time {} (the phases took {:.1} minutes; setup, drain and the check the rest); {} operations, {} skipped (agent busy); {} daemon exits; drain {}",
            clock(self.wall.as_millis() as u64),
            self.minutes,
            self.tally.ops,
            self.tally.skipped,
            self.tally.exits,
            if self.drained {
                "found nothing pending"
            } else {
                "ended at its bound with work pending"
            }
        );
        out.push('\n');
        out.push_str(&r.summary());
        out
    }
}
