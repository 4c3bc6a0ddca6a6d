//! Standby hosts: roots prepared for the case's space as an operator provisions two multi-space
//! hosts (a manifest naming the space, the host's own delivery credential with its own nkey, the
//! `$SYS` material), each started with `start = { daemon = …, host = … }`.

use std::time::Duration;

use cotal_delivery::provision::{prepare_standby_hosts, StandbyPlan};
use serde::Deserialize;

use super::{only_here, Ctx, Kind, Refs};
use crate::kit::world::{DaemonUnderTest, Failure, StepResult, World};

pub const VERBS: &[&str] = &["host"];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    Host { name: String },
}

impl Step {
    pub fn default_within(&self) -> Option<Duration> {
        None
    }

    pub fn unsupported(&self, daemon: &DaemonUnderTest) -> Option<String> {
        only_here(
            daemon,
            "a standby host root is this distribution's manifest and layout",
        )
    }

    pub fn refs(&self) -> Refs {
        let Step::Host { name } = self;
        Refs::default().creates(Kind::Host, name)
    }

    pub async fn run(&self, w: &mut World, _ctx: Ctx) -> StepResult {
        let Step::Host { name } = self;
        let root = tempfile::Builder::new()
            .prefix("cotal-host-")
            .tempdir()
            .map_err(|e| Failure::could_not(format!("create the host root: {e}")))?;
        prepare_standby_hosts(
            &w.mesh.authority,
            &StandbyPlan::new(vec![w.mesh.space().clone()]),
            &[root.path()],
        )
        .map_err(|e| Failure::could_not(format!("prepare host {name}: {e}")))?;
        w.hosts.insert(name.clone(), root);
        Ok(format!(
            "standby host {name} prepared for space {}",
            w.mesh.space()
        ))
    }
}
