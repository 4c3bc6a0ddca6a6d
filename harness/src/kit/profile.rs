//! The two profiles a case is judged under (docs/qualify.md). `contract` judges only what the
//! seeds require of any Cotal delivery daemon: what the broker holds, the process (alive,
//! exited, timing, a non-zero exit where the seeds say so) and the lines the seeds quote.
//! `distribution` adds this distribution's own promises: its exit codes, its lines and
//! transcripts, its commands. Every step of a case belongs to one of them, visibly in its file.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A profile (named `KitProfile` so it is never read for the daemon's credential profiles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KitProfile {
    /// What the seeds require of any implementation.
    Contract,
    /// The contract and this distribution's own promises (the default for `--daemon`).
    #[default]
    Distribution,
}

impl KitProfile {
    pub fn as_str(self) -> &'static str {
        match self {
            KitProfile::Contract => "contract",
            KitProfile::Distribution => "distribution",
        }
    }

    /// The profile named `text`, or the refusal naming both.
    pub fn parse(text: &str) -> Result<KitProfile, String> {
        match text {
            "contract" => Ok(KitProfile::Contract),
            "distribution" => Ok(KitProfile::Distribution),
            other => Err(format!(
                "profile {other:?} is not one of contract, distribution"
            )),
        }
    }

    /// Whether a run of this profile runs a step of `step`'s profile.
    pub fn runs(self, step: KitProfile) -> bool {
        step == KitProfile::Contract || self == KitProfile::Distribution
    }
}

impl fmt::Display for KitProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
