//! The simulation wing (`harness simulate`, docs/simulation.md): a seeded workload and nemesis
//! against a live mesh, recorded as a history and judged by a pure checker.
//!
//! Rings, bottom up: [`check`] is pure (the history format, the final-state snapshot, the
//! checker and its report: nothing there talks to a broker or reads a clock, so a stored run is
//! checked exactly as it was live); above it the live runner: the population and its workload
//! ([`population`], [`workload`]), the faults ([`nemesis`]), what the runner sees of the daemons
//! and the lease ([`observe`]), the broker's final state read into the snapshot ([`capture`]),
//! the phases and the run directory ([`runner`]), and replaying a run's schedule ([`replay`]).
//! Invariant: every operation is recorded as invoke before it starts and as ok / fail / unknown
//! once it is answered, and a timeout is never recorded as fail; every wait is bounded. The live
//! runner imports the kit (actors, verbs) and [`check`]; [`check`] imports nothing of the wing.
//!
//! ## Rings
//!
//! Top to bottom. A file uses only files of the rings below its own, never one of its own ring
//! or above; the harness's `rings` test holds every file to this table.
//!
//! | ring | files |
//! | --- | --- |
//! | surface | `mod.rs` |
//! | broken builds | `mutants.rs` |
//! | the run | `runner.rs` |
//! | replay, final state, summary, the long mode's record | `replay.rs`, `capture.rs`, `summary.rs`, `batch.rs` |
//! | faults (a leave raced on a store-full is the workload's move, timed by the nemesis) | `nemesis.rs` |
//! | workload | `workload.rs` |
//! | the stage | `stage.rs` |
//! | what the runner watches | `observe.rs`, `population.rs`, `rowwatch.rs` |
//! | ground of the runner | `record.rs`, `config.rs`, `prng.rs` |
//! | the check's surface | `check/mod.rs` |
//! | the rules | `check/checker.rs` |
//! | single flight and exits | `check/daemons.rs` |
//! | the model of the run | `check/model.rs` |
//! | the row log, replayed | `check/rows.rs` |
//! | what the check reads and says | `check/report.rs`, `check/snapshot.rs`, `check/bounds.rs` |
//! | the history's surface | `check/history/mod.rs` |
//! | writing and reading a history | `check/history/io.rs` |
//! | history lines | `check/history/line.rs` |
//!
//! Anchors: Jepsen (a generator and a nemesis on a schedule, a history, a checker; exit 0/1/2)
//! and TigerBeetle's Vortex (real processes, faults drawn by weight from a seed, liveness once
//! the faults heal; the schedule as it really happened is what a replay follows).

pub mod batch;
pub mod capture;
pub mod check;
pub mod config;
pub mod mutants;
pub mod nemesis;
pub mod observe;
pub mod population;
pub mod prng;
pub mod record;
pub mod replay;
pub mod rowwatch;
pub mod runner;
pub mod stage;
pub mod summary;
pub mod workload;

pub use runner::{run, Finished, Options};
pub use stage::{SimError, SimErrorKind, Stage};
