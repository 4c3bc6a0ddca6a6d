//! The delivery harness: qualifies a Cotal delivery daemon against real nats-server brokers.
//!
//! ## Wings
//!
//! Top to bottom; a wing uses only the wings below it, and each wing's `mod.rs` lists its own
//! rings (the `rings` test holds both tables to the code):
//!
//! | wing | folder | what |
//! | --- | --- | --- |
//! | the command line | `cli/` | `harness qualify`, `run`, `mutate`, `simulate` (the `harness` binary's modules; `main.rs` only parses and dispatches) |
//! | the simulation | `simulation/` | a seeded workload and nemesis against a live mesh, and the pure checker that judges its history |
//! | the kit | `kit/` | the qualification kit: cases run against the daemon under test |
//! | the rig | `rig/` | brokers, faults, processes, actors, the mesh and bounded waits that both stand on |

pub mod kit;
pub mod rig;
pub mod simulation;

#[cfg(test)]
mod rings;

pub use rig::{
    nats_server_bin, wait_until, Attempt, Broker, BrokerBuilder, BrokerConn, ClientEvents, Cluster,
    ConnState, ErrorKind, HarnessError, Outcome, TcpProxy, TestPki,
};
