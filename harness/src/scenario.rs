//! Transcript normalisation, as the tests that snapshot daemon lines use it. The scenario runner
//! itself is the qualification kit ([`crate::kit`]).

pub use crate::kit::transcript::{normalise, normalise_status, number_nkeys, NKEY_PATTERN};
