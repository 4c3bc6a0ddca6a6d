//! What every part of the live runner shares: the stage the run acts on (the kit's world and
//! what the runner knows of its daemons, behind one lock) and the error that keeps a run from a
//! verdict.

use std::fmt;

use crate::kit::world::World;

/// The world the run acts on and what the runner knows of its daemons, behind one lock: the
/// nemesis, the observer and the supervisor take it in turns.
pub struct Stage {
    pub world: World,
    pub daemons: super::observe::Daemons,
    /// The cluster's route proxies (`--cluster`), what a partition cuts.
    pub routes: Option<crate::rig::cluster::RouteProxies>,
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
