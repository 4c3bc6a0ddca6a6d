//! The space daemon: one space's delivery daemon as a value, and the hosts around it.
//!
//! Owns the concerns of serving one space: start-up order, the single-flight lease and its
//! keeper, the lease watch, transport health (broker-gone watchdog, credential expiry),
//! credential renewal, `$SYS` admission, and arming/quiescing the data plane and the rails as
//! one unit ([`SpaceDaemon`], ending in a typed [`Closed`]). Around it: the `deliver --space`
//! process host ([`process`]) and the embeddable [`service::start_delivery_service`].
//! Invariant: the plane and the rails are armed only while this space holds its lease, and
//! quiesced before any doubt about it is arbitrated. Imports the rails, the data plane,
//! provisioning and the base files; never the host, the supervisor or the command line.

pub mod admission;
pub mod closed;
pub mod daemon;
pub mod feed;
pub mod health;
pub(crate) mod keeper;
pub mod lease;
pub(crate) mod lease_watch;
pub mod process;
pub mod renew;
pub mod service;
pub mod serving;
pub mod signal;
pub mod timer;

pub use daemon::{CloseError, Closed, SpaceConfig, SpaceDaemon, StartError, StartErrorKind, Stop};
pub use process::{DeliverConfig, Ended};
pub use service::{start_delivery_service, DeliveryService, HostedContextInputs};
