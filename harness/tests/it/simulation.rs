//! `harness simulate` as CI runs it (issue 31): one fixed-seed run of one minute of quiet,
//! faults and heal on one broker, against this checkout's daemon, must be judged valid by the
//! checker, and its run directory must hold the history and the broker's final state. Longer
//! runs, the cluster and standby hosts are measured by hand (docs/simulation.md, "Measured
//! runs").

use delivery_harness::kit::DaemonUnderTest;
use delivery_harness::simulation::check::{
    History, Liveness, Snapshot, Verdict, HISTORY_FILE, SNAPSHOT_FILE,
};
use delivery_harness::simulation::{run, Options};

/// The seed CI runs (docs/simulation.md names it with its figures).
const CI_SEED: u64 = 31;
/// Minutes of quiet, faults and heal: the whole test stays under two minutes.
const CI_MINUTES: f64 = 1.0;

/// A one-minute simulation on one broker is not invalid (nothing lost, leaked, served twice
/// against the seeds or by two daemons at once, every exit explained), delivery came back after
/// the heal, and the run leaves a history that reads back with posts, frames and at least one
/// fault, and a snapshot that reads back.
///
/// Why not valid only: what the checker cannot decide from outside depends on timing, and a
/// shared host moves it. Seen on this 2-core host beside a mutate run and two other
/// simulations: seed 31's ACL narrowing acknowledged while a proxy blackhole held the
/// daemon's hand-offs of three earlier entries, stored when it healed 8.4 s later; whether the
/// reader's check came before the narrowing is undecided, the verdict unknown (valid on a quiet
/// host). An undecided finding is printed, never an invalid one accepted.
/// Mutation seen failing: the agents' surfacing loop not recording the frames it surfaced
/// (`ctx.recorder.frame(…)` removed in `simulate/agents.rs`): every owed post reads as lost,
/// the verdict is invalid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_minute_simulation_on_one_broker_is_valid_and_keeps_its_history_and_snapshot() {
    // Kept when the test fails, for `harness simulate --check` and `--replay`.
    let run_dir = std::env::temp_dir().join(format!("cotal-sim-ci-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&run_dir);
    let daemon = delivery_harness::rig::daemon::daemon_bin().expect("the checkout's daemon");
    let outcome = run(Options {
        daemon: DaemonUnderTest::Workspace,
        daemon_label: daemon.display().to_string(),
        seed: CI_SEED,
        minutes: CI_MINUTES,
        cluster: false,
        standby: false,
        agents: delivery_harness::simulation::config::DEFAULT_AGENTS,
        dir: run_dir.clone(),
        replay: None,
        progress: false,
    })
    .await
    .unwrap_or_else(|e| panic!("the simulation reached no verdict: {e}"));
    let report = &outcome.report;
    println!(
        "MEASURED simulation seed {CI_SEED}, {CI_MINUTES} min: wall {} ms, {} posts, {} frames, faults {:?}",
        outcome.wall.as_millis(),
        report.counts.posts,
        report.counts.frames,
        report.counts.faults
    );
    assert_ne!(
        report.verdict,
        Verdict::Invalid,
        "{}\nthe run directory: {}",
        report.summary(),
        run_dir.display()
    );
    assert!(
        matches!(report.liveness, Liveness::Met { .. }),
        "{}\nthe run directory: {}",
        report.summary(),
        run_dir.display()
    );
    if report.verdict == Verdict::Unknown {
        println!(
            "UNDECIDED (not invalid): {}\nthe run directory: {}",
            report.why.join("; "),
            run_dir.display()
        );
    }
    assert!(run_dir.join(HISTORY_FILE).is_file());
    assert!(run_dir.join(SNAPSHOT_FILE).is_file());
    let history = History::read_dir(&run_dir).expect("the history reads back");
    assert_eq!(history.header.seed, CI_SEED);
    assert!(!history.frames.is_empty(), "no frame surfaced");
    assert!(
        history.ops.iter().any(|o| matches!(
            o.call,
            delivery_harness::simulation::check::Call::FaultStart { .. }
        )),
        "no fault ran"
    );
    Snapshot::read_dir(&run_dir).expect("the snapshot reads back");
    assert!(report.counts.owed > 0 && report.counts.delivered == report.counts.owed);
    // An undecided run is kept for `harness simulate --check`.
    if report.verdict == Verdict::Valid {
        let _ = std::fs::remove_dir_all(&run_dir);
    }
}
