//! `harness simulate`: a seeded workload and nemesis against a live mesh, built on the
//! qualification kit's world and verbs, recorded as a history (`crate::sim`) and judged by its
//! checker (docs/simulation.md).
//!
//! Owns the live side of the simulation suite: the population and its workload ([`workload`],
//! [`agents`]), the faults ([`nemesis`]), what the runner sees of the daemons and the lease
//! ([`observe`]), the broker's final state ([`snapshot`]), the phases and the run directory
//! ([`runner`]), and replaying a run's schedule ([`replay`]). Invariant: every operation is
//! recorded as invoke before it starts and as ok / fail / unknown once it is answered, and a
//! timeout is never recorded as fail; every wait is bounded. Imports the kit (actors, verbs)
//! and `crate::sim` (the history format and the checker), never the other way round.
//!
//! Anchors: Jepsen (a generator and a nemesis on a schedule, a history, a checker; exit 0/1/2)
//! and TigerBeetle's Vortex (real processes, faults drawn by weight from a seed, liveness once
//! the faults heal; the schedule as it really happened is what a replay follows).

pub mod agents;
pub mod config;
pub mod mutants;
pub mod nemesis;
pub mod observe;
pub mod prng;
pub mod record;
pub mod replay;
pub mod runner;
pub mod snapshot;
pub mod summary;
pub mod workload;

use std::fmt;

use crate::kit::world::World;

pub use runner::{run, Options, Outcome};

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
