//! The simulation's pure check: the history a run writes and the checker that judges it with
//! the broker's final state.
//!
//! Owns the history format ([`history`]: JSON lines, `"v": 1`, invoke / ok / fail / unknown per
//! operation, every surfaced frame, what the runner saw of the daemons), the final-state snapshot
//! ([`snapshot`]) and the checker ([`checker::check`]) with its report ([`report`]). Invariant:
//! nothing here talks to a broker or reads a clock, so a stored run is checked exactly as it was
//! live, and every rule has a unit test over a hand-written history. The live runner (workload,
//! nemesis, actors) sits above it in the wing and feeds these types; nothing here imports it.

mod bounds;
mod checker;
mod daemons;
pub mod history;
mod model;
pub mod report;
mod rows;
pub mod snapshot;

#[cfg(test)]
mod tests;

pub use bounds::CheckConfig;
pub use checker::check;
pub use daemons::classify_exit;
pub use history::{
    Body, Call, Class, Completion, Done, Event, FaultKind, FaultShape, History, HistoryError,
    HistoryErrorKind, HistoryWriter, Member, MemberError, MemberErrorKind, Ms, Observation, Op,
    Phase, Process, RowBucket, RowChange, RowWrite, RunHeader, Surfaced, HISTORY_FILE,
    HISTORY_VERSION,
};
pub use report::{Liveness, Report, Verdict};
pub use snapshot::{Snapshot, SnapshotError, SnapshotErrorKind, SNAPSHOT_FILE};
