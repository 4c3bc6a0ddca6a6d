//! What the verbs of the anycast, timer-writer, membership-feed and supervision families keep in
//! the world between their steps: the anycast requests a case sent (each under its name, with
//! the task stream's creation time it was stored under) and the role copies its holders pulled,
//! task-stream creation times remembered by name, the workflow timers a case armed, the
//! `membership-rw` credentials the owner reminted, and the root a supervised mesh (`up`) runs
//! in, with the daemon pids a case remembered there. A supervised root's processes are killed
//! (by the pids its records prove) when the world is dropped, so a failed case leaves nothing
//! running.

use std::collections::BTreeMap;
use std::path::PathBuf;

use cotal_delivery::base::Credential;
use cotal_delivery::wire::Space;

/// One anycast request a case sent.
#[derive(Debug, Clone)]
pub struct TaskRequest {
    /// Its sequence on `TASK_<s>`.
    pub seq: u64,
    pub role: String,
    /// The sending agent's name in the case.
    pub sender: String,
    /// `TASK_<s>`'s creation time (unix ns, decimal) when it was stored: its row's key.
    pub created: String,
}

/// One workflow timer coordinate a case armed (the `wf` endpoint, instance `i1`, epoch 1).
#[derive(Debug, Clone)]
pub struct TimerCoord {
    /// `cotal.<s>.ept.wf.i1.1.<timerId>`.
    pub base: String,
    pub timer_id: String,
    pub generation: u64,
    /// Unix ms.
    pub deadline: i64,
}

impl TimerCoord {
    pub fn schedule(&self) -> String {
        format!("{}.schedule", self.base)
    }
    pub fn armed(&self) -> String {
        format!("{}.armed", self.base)
    }
    pub fn fire(&self) -> String {
        format!("{}.fire", self.base)
    }
}

/// A role copy a holder was handed (kept as plain data: the world must stay `Sync`).
#[derive(Debug, Clone)]
pub struct RoleCopy {
    /// The reply subject its ack goes to.
    pub ack_subject: String,
    pub seq: u64,
    pub delivered: u64,
}

/// The owner's remints of the `membership-rw` credential, in order.
#[derive(Default)]
pub struct RwRemints {
    /// What the mesh was provisioned with (or reminted to before any start).
    pub original: Option<Credential>,
    pub written: Vec<Credential>,
}

/// A mesh `cotal-delivery up` runs in a root of its own.
pub struct SupervisedRoot {
    pub dir: tempfile::TempDir,
    pub space: Space,
}

impl SupervisedRoot {
    pub fn root(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for SupervisedRoot {
    /// Kills what the root's records prove is still running (a daemon, the daemon `up` last
    /// launched, a detached renewal owner, the broker), so a case that failed half-way leaves
    /// no process behind.
    fn drop(&mut self) {
        use cotal_delivery::base::{self, PidLiveness};
        let root = self.dir.path();
        let kill = |pid: u32| {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        };
        for path in [
            base::pid_path(root, &self.space),
            base::launched_path(root, &self.space),
        ] {
            if let Some(pid) = base::read_pid(&path) {
                if let PidLiveness::Alive(p) =
                    base::process_liveness(pid, base::argv_names_delivery_daemon)
                {
                    kill(p);
                }
            }
        }
        if let Some(pid) = base::read_pid(&base::remint_pid_path(root, &self.space)) {
            if let PidLiveness::Alive(p) =
                base::process_liveness(pid, base::argv_names_remint_watch)
            {
                kill(p);
            }
        }
        if let Some(pid) = base::read_pid(&base::broker_pid_path(root)) {
            if let PidLiveness::Alive(p) = base::process_liveness(pid, base::argv_names_nats_server)
            {
                kill(p);
            }
        }
    }
}

/// Everything the new families' verbs keep.
#[derive(Default)]
pub struct Holdings {
    /// Anycast requests by name.
    pub tasks: BTreeMap<String, TaskRequest>,
    /// `TASK_<s>` creation times remembered by name.
    pub created: BTreeMap<String, String>,
    /// Role copies pulled, by (holder, request).
    pub copies: BTreeMap<(String, String), RoleCopy>,
    /// Workflow timers by name.
    pub timers: BTreeMap<String, TimerCoord>,
    pub rw: RwRemints,
    /// The root a supervised mesh runs in, once a step made it.
    pub supervised: Option<SupervisedRoot>,
    /// Daemon pids remembered by name (a supervised mesh's daemons are not the case's children).
    pub pids: BTreeMap<String, u32>,
    /// The delivery credential in up's root as it stood before a case spoiled it (`up_material`).
    pub up_creds: Option<Vec<u8>>,
}
