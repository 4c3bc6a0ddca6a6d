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
//! Anchors: Jepsen (a generator and a nemesis on a schedule, a history, a checker; exit 0/1/2)
//! and TigerBeetle's Vortex (real processes, faults drawn by weight from a seed, liveness once
//! the faults heal; the schedule as it really happened is what a replay follows).

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
pub mod runner;
pub mod summary;
pub mod workload;

use std::fmt;

use crate::kit::world::World;

pub use runner::{run, Finished, Options};

/// The world the run acts on and what the runner knows of its daemons, behind one lock: the
/// nemesis, the observer and the supervisor take it in turns.
pub struct Stage {
    pub world: World,
    pub daemons: observe::Daemons,
}

/// Why a simulation could not run to a verdict.
#[derive(Debug)]
pub struct SimError {
    kind: SimErrorKind,
    detail: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// What kind of failure kept the run from a verdict (each exits 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimErrorKind {
    /// Bad input: a run directory that cannot be used, a history that cannot be replayed.
    Usage,
    /// The mesh (brokers, provisioning, proxies, hosts) could not be started.
    Mesh,
    /// No daemon served before the workload was to start.
    NoDaemon,
    /// The history, the snapshot or the report could not be written or read back.
    Files,
}

impl SimError {
    pub fn new(kind: SimErrorKind, detail: impl Into<String>) -> SimError {
        SimError {
            kind,
            detail: detail.into(),
            source: None,
        }
    }
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }
    pub fn kind(&self) -> SimErrorKind {
        self.kind
    }
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for SimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
