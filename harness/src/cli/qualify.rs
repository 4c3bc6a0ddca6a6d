//! `harness qualify`: the catalogue against a daemon, a verdict per case, a table, JSON and JUnit.

use std::path::{Path, PathBuf};

use clap::Args;
use delivery_harness::kit::catalogue::{self, QualifyOptions};
use delivery_harness::kit::results::Subject;
use delivery_harness::kit::RunOptions;

use super::common::{
    daemon_under_test, from_caller, load_catalogue, refuse, runtime, version_of, write_atomic,
    DaemonArgs,
};

#[derive(Debug, Args)]
pub struct QualifyArgs {
    #[command(flatten)]
    pub daemon: DaemonArgs,
    /// Run only this family or case id (repeatable).
    #[arg(long, value_name = "FAMILY_OR_ID")]
    pub only: Vec<String>,
    /// List the selected cases (id, family, shapes, sentence) and run nothing.
    #[arg(long)]
    pub list: bool,
    /// Cases run at once (each starts its own brokers).
    #[arg(short = 'j', long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub jobs: u16,
    /// Rounds per case; figures are reported as p50 and max over them.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub repeat: u16,
    /// Judge behaviour only: transcripts are not compared (an older release, another
    /// implementation).
    #[arg(long)]
    pub behaviour_only: bool,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the report as JUnit XML (a suite per family, a test case per case).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Keep every case's broker and daemon logs under DIR (failed cases' logs are kept
    /// under ./qualify-logs/ without it).
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
    /// The catalogue (default: this checkout's cases/).
    #[arg(long, value_name = "DIR")]
    #[arg(alias = "scenarios")]
    pub cases: Option<PathBuf>,
}

pub fn run(args: QualifyArgs, cwd: &Path) {
    let QualifyArgs {
        daemon,
        only,
        list,
        jobs,
        repeat,
        behaviour_only,
        json,
        junit,
        keep,
        cases,
    } = args;
    let cat = load_catalogue(cases, cwd);
    let cases = cat.select(&only).unwrap_or_else(|e| refuse(&e));
    if list {
        for c in &cases {
            let shapes: Vec<&str> = c.shapes.iter().map(|s| s.as_str()).collect();
            println!(
                "{}\t{}\t{}\t{}{}",
                c.id,
                c.family,
                shapes.join(","),
                c.sentence.split_whitespace().collect::<Vec<_>>().join(" "),
                c.distribution
                    .as_ref()
                    .map(|d| format!("\t(this distribution only: {d})"))
                    .unwrap_or_default()
            );
        }
        return;
    }
    let (daemon_ut, daemon_name, daemon_version) = daemon_under_test(&daemon, cwd);
    let nats = delivery_harness::nats_server_bin().unwrap_or_else(|e| refuse(&e.to_string()));
    let subject = Subject {
        daemon: daemon_name,
        daemon_version,
        nats_server: nats.display().to_string(),
        nats_server_version: version_of(&nats),
    };
    println!(
        "nats-server: {} ({})",
        subject.nats_server_version, subject.nats_server
    );
    println!(
        "daemon:      {} ({})",
        subject.daemon_version, subject.daemon
    );
    let units: usize = cases.iter().map(|c| c.shapes.len()).sum();
    println!(
        "cases:       {} ({} runs){}{}\n",
        cases.len(),
        units,
        if daemon.scaled {
            ", scaled windows"
        } else {
            ", shipped defaults"
        },
        if behaviour_only {
            ", behaviour only"
        } else {
            ""
        }
    );
    let opts = QualifyOptions {
        run: RunOptions {
            daemon: daemon_ut,
            scaled: daemon.scaled,
        },
        jobs: usize::from(jobs),
        repeat: usize::from(repeat),
        behaviour_only,
        keep: keep.map(|k| from_caller(k, cwd)),
        failed_logs: cwd.join("qualify-logs"),
    };
    let report = runtime().block_on(catalogue::qualify(&cat, &cases, subject, &opts, |line| {
        eprintln!("{line}");
    }));
    println!("{}", report.table());
    if let Some(p) = json {
        let p = from_caller(p, cwd);
        if let Err(e) = write_atomic(&p, &report.json()) {
            refuse(&format!("write {}: {e}", p.display()));
        }
    }
    if let Some(p) = junit {
        let p = from_caller(p, cwd);
        if let Err(e) = write_atomic(&p, &report.junit()) {
            refuse(&format!("write {}: {e}", p.display()));
        }
    }
    std::process::exit(report.exit_code());
}
