//! The history of a simulation run: every operation as invoke then ok / fail / unknown (Jepsen's
//! `:invoke/:ok/:fail/:info`), every frame an agent surfaced, and what the runner saw of the
//! daemons, one JSON object per line in `<run dir>/history.jsonl`.
//!
//! Why lines: a run killed half-way still leaves every line written before it, and the checker
//! can be run again on a stored history. Why invoke *and* completion: an operation whose reply
//! never came (`unknown`) may or may not have happened, and the checker must know which
//! operations were in flight when, to tell a loss from a legitimate drop. Every line carries
//! `"v": 2` (version 2 added the `row` line: every write to the members and ACL buckets as the
//! broker stored it); a reader reads versions 1 and 2, refuses any other, and any malformed
//! line, naming its number.
//!
//! [`line`] holds the format (the event types and their error); [`io`] writes a history and
//! reads one back, pairing each invoke with its completion.

mod io;
mod line;

pub use io::{Completion, FrameEvent, History, HistoryWriter, Observed, Op, RowEvent};
pub use line::{
    Body, Call, Class, Done, Event, FaultKind, FaultShape, HistoryError, HistoryErrorKind, Member,
    MemberError, MemberErrorKind, Ms, Observation, Phase, Process, RowBucket, RowChange, RowWrite,
    RunHeader, Surfaced, HISTORY_FILE, HISTORY_VERSION, HISTORY_VERSION_OLDEST, MAX_EVENTS,
    MAX_LINE_BYTES,
};
