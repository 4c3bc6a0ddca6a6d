//! The space daemon: one space's delivery daemon as a value.
//!
//! Owns the concerns of serving one space: start-up order, the single-flight lease and its
//! keeper, the lease watch, transport health (broker-gone watchdog, credential expiry),
//! credential renewal, `$SYS` admission, and arming/quiescing the data plane and the rails as
//! one unit ([`SpaceDaemon`], ending in a typed [`Closed`]). The processes it runs in are the
//! host ring's (`host/`).
//! Invariant: the plane and the rails are armed only while this space holds its lease, and
//! quiesced before any doubt about it is arbitrated. Imports the rails, the data plane,
//! provisioning and the base ring; never the host, the supervisor or the command line.

mod admission;
mod closed;
mod daemon;
mod feed;
mod health;
mod holder;
mod keeper;
mod lease;
mod lease_watch;
mod renew;
mod serving;
mod startup;
mod timer;

pub use admission::{evictor_key, observer_key};
pub use feed::{
    FeedError, FeedErrorKind, FeedParts, FeedRow, MembershipFeed, DEBOUNCE, OBSERVER_NAME, RW_NAME,
};
pub(crate) use health::HARD_EXIT_GRACE;
pub use health::{HealthConfig, Verdict};
pub use holder::STANDBY_WATCH_CONNECTION;
pub(crate) use holder::{
    held_row, holder_state, lease_ttl, HeldRow, HolderState, NOT_RUNNING_HOLDER, NOT_RUNNING_PROOF,
};
pub(crate) use keeper::RELEASE_REDIAL_BOUND;
pub use lease::{ReleaseError, ReleaseErrorKind, Released};
pub use renew::{ContinuityError, ContinuityErrorKind, LifetimeError};
pub use timer::{
    status_key, Armed, ScheduleRefusal, ScheduleRefusalKind, ScheduleRequest, TimerStatus,
    TimerWriter, TimerWriterParts, WriterFault, WriterFaultKind, WriterState,
    CONNECTION_NAME as TIMER_CONNECTION_NAME,
};

pub use daemon::{
    CloseError, Closed, Reread, SpaceConfig, SpaceDaemon, StartError, StartErrorKind, StartPhase,
    Stop,
};
