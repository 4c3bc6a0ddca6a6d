//! What a step gives back: the line it adds to the transcript, or a failure saying what it
//! expected and what happened. Every ring of the kit above this one speaks it.

use crate::rig::error::HarnessError;

/// A case's step did not see what it expected: what it expected, and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub expected: String,
    pub actual: String,
}

impl Failure {
    pub fn new(expected: impl Into<String>, actual: impl Into<String>) -> Failure {
        Failure {
            expected: expected.into(),
            actual: actual.into(),
        }
    }
    /// The step could not do its work at all (a broker request failed, a name was missing).
    pub fn could_not(what: impl std::fmt::Display) -> Failure {
        Failure::new("the step to run", what.to_string())
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "expected {}; got {}", self.expected, self.actual)
    }
}

impl From<HarnessError> for Failure {
    fn from(e: HarnessError) -> Failure {
        Failure::could_not(e)
    }
}

/// A step's result: the line it adds to the transcript, or what went wrong.
pub type StepResult = Result<String, Failure>;
