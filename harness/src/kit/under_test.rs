//! Which daemon a run qualifies (this workspace's build, a binary, or another implementation
//! through a command template) and the options of a run.

use std::path::PathBuf;

use super::profile::KitProfile;
use super::template::DaemonCmd;
use crate::rig::error::HarnessError;

/// Which daemon a run qualifies.
#[derive(Debug, Clone, Default)]
pub enum DaemonUnderTest {
    /// This workspace's own build (`target/<profile>/cotal-delivery`, built when stale).
    #[default]
    Workspace,
    /// A `cotal-delivery` binary of this distribution.
    Bin(PathBuf),
    /// Any binary that speaks the wire, started through a command template.
    Cmd(DaemonCmd),
}

/// Options of a run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub daemon: DaemonUnderTest,
    /// Run the scaled form (the `[scaled]` table): what `ci/test` does.
    pub scaled: bool,
    /// The profile the steps are judged under (docs/qualify.md): a contract run skips the
    /// distribution steps (and distribution cases).
    pub profile: KitProfile,
}

impl RunOptions {
    /// The binary of this distribution that runs commands (`status`, `remint`, `up`…), or why
    /// there is none.
    pub fn distribution_bin(&self) -> Result<PathBuf, HarnessError> {
        match &self.daemon {
            DaemonUnderTest::Workspace => crate::rig::daemon::daemon_bin(),
            DaemonUnderTest::Bin(b) => Ok(b.clone()),
            DaemonUnderTest::Cmd(_) => Err(HarnessError::Usage(
                "a daemon given by --daemon-cmd has no commands of this distribution".into(),
            )),
        }
    }
}
