//! The long mode's record (`harness simulate --seeds A..B` / `--hours H`): one line per run as
//! it ends, and the table of every run with the totals per shape at the end, the figures
//! docs/simulation.md records (seed, shape, minutes, posts, frames, faults by kind, lost,
//! leaked, duplicates, verdict, each undecided fact, and the host's load beside each run).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::simulation::check::{Report, Verdict};

/// A mesh shape of the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MeshShape {
    pub cluster: bool,
    pub standby: bool,
}

impl MeshShape {
    /// The shapes `--rotate-shapes` cycles through, in order.
    pub const ROTATION: [MeshShape; 3] = [
        MeshShape {
            cluster: false,
            standby: false,
        },
        MeshShape {
            cluster: true,
            standby: false,
        },
        MeshShape {
            cluster: false,
            standby: true,
        },
    ];
    pub fn name(self) -> &'static str {
        match (self.cluster, self.standby) {
            (false, false) => "one broker",
            (true, false) => "cluster",
            (false, true) => "standby",
            (true, true) => "cluster+standby",
        }
    }
}

/// The host's 1-minute load average (`/proc/loadavg`), if it can be read.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What one run of the batch came to.
#[derive(Debug, Clone)]
pub enum RunOutcome {
    Ran {
        verdict: Verdict,
        posts: u64,
        posts_ok: u64,
        frames: u64,
        faults: BTreeMap<String, u64>,
        lost: usize,
        leaked: usize,
        duplicates_allowed: usize,
        duplicates_not: usize,
        /// Each undecided finding's reason, counted (the fact it waits on).
        undecided: BTreeMap<String, usize>,
        /// Why the verdict is not valid, as the checker said.
        why: Vec<String>,
        dir: String,
    },
    /// The run reached no verdict (the mesh did not start, no daemon served).
    CouldNotRun(String),
}

impl RunOutcome {
    pub fn of(report: &Report, dir: &std::path::Path) -> RunOutcome {
        let mut undecided: BTreeMap<String, usize> = BTreeMap::new();
        for u in &report.uncertain {
            *undecided.entry(u.why.clone()).or_default() += 1;
        }
        for f in &report.missing_facts {
            if !report.uncertain.is_empty() {
                undecided.entry(f.clone()).or_default();
            }
        }
        let allowed = report.duplicates.iter().filter(|d| d.allowed).count();
        RunOutcome::Ran {
            verdict: report.verdict,
            posts: report.counts.posts,
            posts_ok: report.counts.posts_ok,
            frames: report.counts.frames,
            faults: report.counts.faults.clone(),
            lost: report.lost.len(),
            leaked: report.leaked.len(),
            duplicates_allowed: allowed,
            duplicates_not: report.duplicates.len() - allowed,
            undecided,
            why: report.why.clone(),
            dir: dir.display().to_string(),
        }
    }
    pub fn verdict(&self) -> Option<Verdict> {
        match self {
            RunOutcome::Ran { verdict, .. } => Some(*verdict),
            RunOutcome::CouldNotRun(_) => None,
        }
    }
}

/// One run of the batch.
#[derive(Debug, Clone)]
pub struct Item {
    pub seed: u64,
    pub shape: MeshShape,
    pub minutes: f64,
    pub wall: Duration,
    /// The load average when the run started and when it ended.
    pub load: (Option<f64>, Option<f64>),
    pub outcome: RunOutcome,
}

fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

fn load(l: Option<f64>) -> String {
    l.map_or("-".into(), |l| format!("{l:.2}"))
}

fn faults_words(faults: &BTreeMap<String, u64>) -> String {
    if faults.is_empty() {
        return "none".into();
    }
    faults
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn verdict_word(v: Option<Verdict>) -> &'static str {
    match v {
        Some(Verdict::Valid) => "valid",
        Some(Verdict::Invalid) => "INVALID",
        Some(Verdict::Unknown) => "unknown",
        None => "could not run",
    }
}

impl Item {
    /// The line printed as the run ends.
    pub fn line(&self, index: usize) -> String {
        let head = format!(
            "run {index}: seed {} {} {:.1} min, wall {}, load {}→{}:",
            self.seed,
            self.shape.name(),
            self.minutes,
            clock(self.wall),
            load(self.load.0),
            load(self.load.1),
        );
        match &self.outcome {
            RunOutcome::CouldNotRun(why) => format!("{head} could not run: {why}"),
            RunOutcome::Ran {
                verdict,
                posts,
                posts_ok,
                frames,
                lost,
                leaked,
                duplicates_allowed,
                duplicates_not,
                undecided,
                faults,
                ..
            } => format!(
                "{head} {} | posts {posts} ({posts_ok} ok), frames {frames}, lost {lost}, leaked {leaked}, duplicates {duplicates_allowed}/{duplicates_not}, undecided {} | faults: {}",
                verdict_word(Some(*verdict)),
                undecided.values().sum::<usize>(),
                faults_words(faults),
            ),
        }
    }
}

/// The batch's table (markdown, as docs/simulation.md records it) and its totals per shape.
pub fn table(items: &[Item]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| seed | shape | min | load (start→end) | posts (ok) | frames | faults by kind | lost | leaked | duplicates (allowed / not) | verdict | undecided facts |"
    );
    let _ = writeln!(
        out,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for it in items {
        match &it.outcome {
            RunOutcome::CouldNotRun(why) => {
                let _ = writeln!(
                    out,
                    "| {} | {} | {:.1} | {}→{} | - | - | - | - | - | - | could not run | {} |",
                    it.seed,
                    it.shape.name(),
                    it.minutes,
                    load(it.load.0),
                    load(it.load.1),
                    why.replace('|', "/")
                );
            }
            RunOutcome::Ran {
                verdict,
                posts,
                posts_ok,
                frames,
                faults,
                lost,
                leaked,
                duplicates_allowed,
                duplicates_not,
                undecided,
                ..
            } => {
                let facts = if undecided.is_empty() {
                    "-".to_string()
                } else {
                    undecided
                        .iter()
                        .map(|(why, n)| format!("{n}× {why}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                        .replace('|', "/")
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {:.1} | {}→{} | {posts} ({posts_ok}) | {frames} | {} | {lost} | {leaked} | {duplicates_allowed} / {duplicates_not} | {} | {facts} |",
                    it.seed,
                    it.shape.name(),
                    it.minutes,
                    load(it.load.0),
                    load(it.load.1),
                    faults_words(faults),
                    verdict_word(Some(*verdict)),
                );
            }
        }
    }
    let mut per: BTreeMap<&str, (usize, usize, f64, Duration)> = BTreeMap::new();
    for it in items {
        let e = per.entry(it.shape.name()).or_default();
        e.1 += 1;
        if matches!(
            it.outcome.verdict(),
            Some(Verdict::Valid | Verdict::Invalid)
        ) {
            e.0 += 1;
        }
        e.2 += it.minutes;
        e.3 += it.wall;
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| shape | runs decided / total | minutes of phases | wall |"
    );
    let _ = writeln!(out, "| --- | --- | --- | --- |");
    let (mut d, mut n, mut m, mut w) = (0, 0, 0.0, Duration::ZERO);
    for (shape, (decided, total, minutes, wall)) in &per {
        let _ = writeln!(
            out,
            "| {shape} | {decided} / {total} | {minutes:.1} | {} |",
            clock(*wall)
        );
        d += decided;
        n += total;
        m += minutes;
        w += *wall;
    }
    let _ = writeln!(out, "| all | {d} / {n} | {m:.1} | {} |", clock(w));
    out
}
