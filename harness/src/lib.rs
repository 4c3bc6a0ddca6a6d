//! The delivery harness: qualifies a Cotal delivery daemon against real nats-server brokers.
//!
//! Wings, each using only the ones listed under it:
//! - [`simulation`]: a seeded workload and nemesis against a live mesh, and the pure checker
//!   that judges its history (`harness simulate`);
//! - [`kit`]: the qualification kit, cases run against the daemon under test
//!   (`harness qualify`, `run`, `mutate`);
//! - [`rig`]: brokers, faults, processes, actors, the mesh and bounded waits that both stand on.
//!
//! The command line (`harness`, `src/cli/`) sits above them all.

pub mod kit;
pub mod rig;
pub mod simulation;

pub use rig::{
    nats_server_bin, wait_until, Attempt, Broker, BrokerBuilder, BrokerConn, ClientEvents, Cluster,
    ConnState, ErrorKind, HarnessError, Outcome, TcpProxy, TestPki,
};
