//! The host ring: the processes a space daemon runs in, and their process concerns.
//!
//! Owns the three ways a [`crate::space::SpaceDaemon`] is hosted: `deliver --space` (`process`:
//! workspace root or `--store`, credential, log file, pid record, signals, the hard-exit grace),
//! the embeddable `start_delivery_service` (`service`: injected store and identity, never exits),
//! and `deliver --spaces` (`spaces`, `lane`, `kicker`, `status`: one lane per manifest space,
//! standby retries, the host as the only kicker). Installing the stop signals (`signal`) is a
//! host's job, never the daemon's. Invariant: a host writes the records and makes the way out a
//! typed value (`Ended`, `HostEnded`); only `cli.rs` turns it into an exit code, and one lane's
//! fault never ends another. Imports every ring below it; never `cli.rs`. See `docs/host.md`.

mod kicker;
mod lane;
mod process;
mod service;
mod signal;
mod spaces;
mod standby_watch;
mod status;

/// The host's own records live with the other workspace files (the lanes name the log too).
pub use crate::base::{host_log_path, host_pid_path, HOST_LOG_FILE, HOST_PID_FILE};
pub use kicker::{HostKicker, HOST_CENSUS_CONNECTION, HOST_KICKER_CONNECTION};
pub use lane::LaneInputs;
pub use process::{run as deliver_space, stamp_stderr, DeliverConfig, Ended, Run};
pub use service::{start_delivery_service, DeliveryService, HostedContextInputs};
pub use spaces::{
    argv_names_host, host_liveness, run as deliver_spaces, HostConfig, HostEnded, HostError,
    HostErrorKind, HostRun, HOST_CLOSE_BOUND,
};
pub use standby_watch::STANDBY_WATCH_CONNECTION;
pub use status::{host_status, HostStatus, HostStatusError, HostStatusErrorKind, LaneStatus, Role};
