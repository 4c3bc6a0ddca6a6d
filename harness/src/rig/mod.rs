//! The rig: what every wing of the harness stands on. Real nats-server brokers (single, TLS,
//! operator-mode, clustered), faults against them (signals, restart, a blackholing or delaying
//! proxy), the processes of the daemon under test, the agent and manager actors, the mesh a
//! space is provisioned on, and bounded waits. No mock broker anywhere.

pub mod agent;
pub mod broker;
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
