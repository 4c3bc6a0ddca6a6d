//! `harness qualify`: the catalogue against a daemon, a verdict per case, a table, JSON and JUnit.

use std::path::{Path, PathBuf};

use clap::Args;
use delivery_harness::kit::catalogue::{self, QualifyOptions};
use delivery_harness::kit::results::Subject;
use delivery_harness::kit::RunOptions;

use super::common::{
    daemon_under_test, exit, from_caller, load_catalogue, profile_of, refuse, runtime, version_of,
    write_atomic, DaemonArgs,
};

#[derive(Debug, Args)]
pub struct QualifyArgs {
    #[command(flatten)]
    pub daemon: DaemonArgs,
    /// Run only this family or case id (repeatable).
    #[arg(long, value_name = "FAMILY_OR_ID")]
    pub only: Vec<String>,
    /// List the selected cases (id, family, shapes, profile, the cases each stands on, sentence)
    /// and run nothing.
    #[arg(long)]
    pub list: bool,
    /// Cases run at once (each starts its own brokers).
    #[arg(short = 'j', long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub jobs: u16,
    /// Rounds per case; figures are reported as p50 and max over them.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub repeat: u16,
    /// Judge behaviour only: transcripts are not compared (an older release). The contract
    /// profile never compares them.
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
    #[arg(long, value_name = "DIR", conflicts_with = "results")]
    pub keep: Option<PathBuf>,
    /// Write the bundle to attach to a release into DIR (created; it must be empty):
    /// report.json, junit.xml, summary.txt (the table), versions.json (harness, daemon,
    /// nats-server, the catalogue's digest, the command line) and logs/ with the broker and
    /// daemon logs of every case that did not pass.
    #[arg(long, value_name = "DIR")]
    pub results: Option<PathBuf>,
    /// The catalogue (default: cases/ beside the harness binary, else the checkout's when the
    /// harness runs from inside the checkout it was built in, else the one the binary carries:
    /// `harness --version` names it).
    #[arg(long, value_name = "DIR")]
    #[arg(alias = "scenarios")]
    pub cases: Option<PathBuf>,
}

pub fn run(args: QualifyArgs, cwd: &Path) -> ! {
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
        results,
        cases,
    } = args;
    let loaded = load_catalogue(cases, cwd);
    let cat = &loaded.cat;
    let cases = cat.select(&only).unwrap_or_else(|e| refuse(&e));
    if list {
        for c in &cases {
            let shapes: Vec<&str> = c.shapes.iter().map(|s| s.as_str()).collect();
            let stands_on: Vec<&str> = c.preconditions().into_iter().collect();
            println!(
                "{}\t{}\t{}\t{}\t{}\t{}{}",
                c.id,
                c.family,
                shapes.join(","),
                c.profile,
                if stands_on.is_empty() {
                    "stands on nothing".to_string()
                } else {
                    format!("stands on {}", stands_on.join(", "))
                },
                c.sentence.split_whitespace().collect::<Vec<_>>().join(" "),
                c.why
                    .as_ref()
                    .map(|d| format!("\t(a distribution case: {d})"))
                    .unwrap_or_default()
            );
        }
        exit(0);
    }
    let (daemon_ut, daemon_name, daemon_version) = daemon_under_test(&daemon, cwd);
    let profile = profile_of(&daemon, &daemon_ut);
    let nats = delivery_harness::nats_server_bin().unwrap_or_else(|e| refuse(&e.to_string()));
    let results = results.map(|d| bundle_dir(cwd.join(d)));
    let subject = Subject {
        daemon: daemon_name,
        daemon_version,
        nats_server: nats.display().to_string(),
        nats_server_version: version_of(&nats),
        catalogue: loaded.digest.clone(),
        catalogue_origin: loaded.origin.to_string(),
    };
    println!(
        "nats-server: {} ({})",
        subject.nats_server_version, subject.nats_server
    );
    println!(
        "daemon:      {} ({})",
        subject.daemon_version, subject.daemon
    );
    println!("catalogue:   {}", loaded.describe());
    println!("profile:     {profile}");
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
            profile,
        },
        jobs: usize::from(jobs),
        repeat: usize::from(repeat),
        behaviour_only,
        keep: keep.map(|k| from_caller(k, cwd)),
        failed_logs: match &results {
            Some(dir) => dir.join("logs"),
            None => cwd.join("qualify-logs"),
        },
    };
    let report = runtime().block_on(catalogue::qualify(cat, &cases, subject, &opts, |line| {
        eprintln!("{line}");
    }));
    println!("{}", report.table());
    if let Some(dir) = &results {
        let versions = serde_json::json!({
            "harness": env!("CARGO_PKG_VERSION"),
            "daemon": {"under_test": report.subject.daemon, "version": report.subject.daemon_version},
            "nats_server": {"path": report.subject.nats_server, "version": report.subject.nats_server_version},
            "catalogue": {
                "digest": loaded.digest,
                "origin": loaded.origin.to_string(),
                "cases": cat.cases.len(),
            },
            "command": std::env::args().collect::<Vec<_>>(),
        });
        for (name, text) in [
            ("report.json", report.json()),
            ("junit.xml", report.junit()),
            ("summary.txt", report.table()),
            (
                "versions.json",
                serde_json::to_string_pretty(&versions).unwrap_or_default(),
            ),
        ] {
            let p = dir.join(name);
            if let Err(e) = write_atomic(&p, &text) {
                refuse(&format!("write {}: {e}", p.display()));
            }
        }
        println!("results:     {}", dir.display());
    }
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
    exit(report.exit_code());
}

/// The `--results` directory: created, or an empty one; a bundle never mixes two runs.
fn bundle_dir(dir: PathBuf) -> PathBuf {
    if let Ok(mut entries) = std::fs::read_dir(&dir) {
        if entries.next().is_some() {
            refuse(&format!(
                "--results {}: the directory is not empty (a bundle holds one run)",
                dir.display()
            ));
        }
    }
    if let Err(e) = std::fs::create_dir_all(&dir) {
        refuse(&format!("--results {}: {e}", dir.display()));
    }
    dir
}
