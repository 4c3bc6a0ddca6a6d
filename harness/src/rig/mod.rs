//! The rig: what every wing of the harness stands on. Real nats-server brokers (single, TLS,
//! operator-mode, clustered), faults against them (signals, restart, a blackholing or delaying
//! proxy), the processes of the daemon under test, the agent and manager actors, the mesh a
//! space is provisioned on, and bounded waits. No mock broker anywhere.
//!
//! ## Rings
//!
//! Top to bottom. A file uses only files of the rings below its own, never one of its own ring
//! or above; the harness's `rings` test holds every file to this table.
//!
//! | ring | files |
//! | --- | --- |
//! | surface | `mod.rs` |
//! | actors on a mesh | `agent.rs`, `manager.rs`, `lease_log.rs` |
//! | the mesh | `mesh.rs` |
//! | views of brokers | `cluster.rs`, `connz.rs` |
//! | processes and links | `broker.rs`, `proxy.rs`, `daemon.rs`, `events.rs` |
//! | parts | `http.rs`, `process.rs`, `server_bin.rs`, `tls.rs`, `wait.rs`, `proxy/delay.rs`, `proxy/latency.rs`, `proxy/route.rs` |
//! | ground | `checkout.rs`, `error.rs`, `frames.rs` |

pub mod agent;
pub mod broker;
pub mod checkout;
pub mod cluster;
pub mod connz;
pub mod daemon;
pub mod error;
pub mod events;
pub mod frames;
pub mod http;
pub mod lease_log;
pub mod manager;
pub mod mesh;
mod process;
pub mod proxy;
pub mod server_bin;
pub mod tls;
pub mod wait;

pub use broker::{Broker, BrokerBuilder};
pub use cluster::Cluster;
pub use connz::{BrokerConn, ConnState};
pub use error::{ErrorKind, HarnessError};
pub use events::ClientEvents;
pub use proxy::TcpProxy;
pub use server_bin::nats_server_bin;
pub use tls::TestPki;
pub use wait::{wait_until, Attempt, Outcome};
