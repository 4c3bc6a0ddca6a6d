//! The space daemon: one space's delivery daemon from start-up to its way out.
//!
//! Owns the process concerns of serving one space: start-up order, the single-flight lease and
//! its keeper, the lease watch, transport health (broker-gone watchdog, credential expiry),
//! credential renewal, `$SYS` admission, and arming/quiescing the data plane and the rails as
//! one unit. Invariant: the plane and the rails are armed only while this space holds its lease,
//! and quiesced before any doubt about it is arbitrated. Imports the rails, the data plane,
//! provisioning and the base files; never the host, the supervisor or the command line.

pub mod admission;
pub mod exit;
pub mod health;
pub(crate) mod keeper;
pub mod lease;
pub(crate) mod lease_watch;
pub mod renew;
pub mod serving;
pub mod signal;
pub mod startup;

pub use exit::Exit;
pub use startup::{run, DeliverConfig};
