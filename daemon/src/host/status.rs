//! `cotal-delivery status --spaces`: what a multi-space host looks like from outside. The host's
//! own pid record (lanes write none), then, for each space its manifest names, what the
//! single-space `status` checks on the broker (lease row, credential expiry, `ctl.delivery`)
//! and whether this host or another one holds the row.
//!
//! Why in the host ring: it reads the host's record and manifest, and reuses the space checks of
//! `supervise::status` below it. The exit code follows the host's record only (a standby host
//! is running as it should while another host serves its spaces); a root or manifest it cannot
//! read is a refusal (exit 3), as for `deliver --spaces`. See `docs/host.md`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::base::{self, read_creds_file, PidLiveness};
use crate::provision::Workspace;
use crate::provision::{manifest_path, Manifest, ManifestError};
use crate::supervise::{status, StatusReport};
use crate::wire::{Principal, Space};

/// Whose the space's lease row is, seen from this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The row names this host's delivery identity.
    Holder,
    /// Another holder's row: this host's lane stands by.
    Standby,
    /// The broker holds no row for the space.
    Unheld,
    /// The broker could not be checked, or this host's credential read.
    Unknown,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Holder => "holder",
            Role::Standby => "standby",
            Role::Unheld => "unheld",
            Role::Unknown => "unknown",
        }
    }

    /// What the role means, for the human report.
    fn meaning(self) -> &'static str {
        match self {
            Role::Holder => "the lease row is this host's",
            Role::Standby => "another holder's lease row; this host stands by",
            Role::Unheld => "no lease row; nobody serves the space",
            Role::Unknown => {
                "the broker could not be checked, or this host's delivery credential could not be read"
            }
        }
    }
}

/// One space of the manifest as `status --spaces` sees it.
#[derive(Debug, Clone)]
pub struct LaneStatus {
    pub report: StatusReport,
    pub role: Role,
}

impl LaneStatus {
    /// The human block: the role, then the single-space checks indented, without the pid
    /// record line (lanes write none) and the single-space verdict (it needs that record).
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "space {}: {} ({})",
            self.report.space,
            self.role.as_str(),
            self.role.meaning()
        )];
        out.extend(self.report.check_lines().map(|l| format!("  {l}")));
        out
    }

    /// The single-space JSON without what does not apply to a lane: no pid record (lanes write
    /// none), hence no `healthy` verdict, and the root is the host's.
    pub fn to_json(&self) -> Value {
        let mut v = self.report.to_json();
        if let Some(o) = v.as_object_mut() {
            for key in ["pidRecord", "healthy", "root"] {
                o.remove(key);
            }
            o.insert("role".into(), self.role.as_str().into());
        }
        v
    }
}

/// Everything `status --spaces` found.
#[derive(Debug, Clone)]
pub struct HostStatus {
    pub root: PathBuf,
    pub record: PidLiveness,
    pub spaces: Vec<LaneStatus>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostStatusErrorKind {
    /// No workspace root.
    Root,
    /// The manifest is missing or malformed.
    Manifest,
}

/// Why `status --spaces` could not report (exit 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostStatusError {
    kind: HostStatusErrorKind,
    detail: String,
    /// The manifest's path, once the root is known.
    manifest: Option<PathBuf>,
}

impl HostStatusError {
    pub fn kind(&self) -> HostStatusErrorKind {
        self.kind
    }
    pub fn to_json(&self) -> Value {
        json!({
            "error": {
                "kind": match self.kind {
                    HostStatusErrorKind::Root => "root",
                    HostStatusErrorKind::Manifest => "manifest",
                },
                "detail": self.detail,
                "manifest": self.manifest,
            }
        })
    }
}

impl fmt::Display for HostStatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for HostStatusError {}

impl From<ManifestError> for HostStatusError {
    fn from(e: ManifestError) -> Self {
        HostStatusError {
            kind: HostStatusErrorKind::Manifest,
            manifest: Some(e.path().to_path_buf()),
            detail: e.to_string(),
        }
    }
}

impl HostStatus {
    /// Whether the host's record names a live host (the exit code's only input).
    pub fn running(&self) -> bool {
        self.record.daemon_pid().is_some()
    }

    pub fn to_json(&self) -> Value {
        json!({
            "root": self.root,
            "running": self.running(),
            "hostRecord": {
                "path": base::host_pid_path(&self.root),
                "verdict": self.record.verdict(),
                "pid": self.record.recorded_pid(),
            },
            "manifest": manifest_path(&self.root),
            "spaces": self.spaces.iter().map(LaneStatus::to_json).collect::<Vec<_>>(),
        })
    }

    /// The human report: the host's record, then a block per space of the manifest.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![self.line()];
        for lane in &self.spaces {
            out.extend(lane.lines());
        }
        out
    }

    /// The human line of the host's record.
    pub fn line(&self) -> String {
        let root = self.root.display();
        let path = base::host_pid_path(&self.root);
        match &self.record {
            PidLiveness::Alive(pid) => format!("delivery host of {root}: running (pid {pid})"),
            PidLiveness::Unverified(pid) => format!("delivery host of {root}: running (pid {pid}; its command line could not be read, trusted)"),
            PidLiveness::Stale(pid) | PidLiveness::Foreign(pid) => format!("delivery host of {root}: stale record ({} names pid {pid}, which is not a running delivery host)", path.display()),
            PidLiveness::Unreadable => format!("delivery host of {root}: unreadable record at {}", path.display()),
            PidLiveness::Absent => format!("delivery host of {root}: not running (no record at {})", path.display()),
        }
    }
}

/// This host's holder name for `space` (as its lease row would name it), if its credential reads.
fn own_holder(root: &Path, space: &Space) -> Option<String> {
    let cred = read_creds_file(&Workspace::new(root).delivery_creds_path(space)).ok()?;
    let nkey = cred.public_key().ok()?;
    Some(Principal::for_nkey(&nkey).ok()?.dot_form())
}

fn role(report: &StatusReport, own: Option<&str>) -> Role {
    if report.broker.is_err() {
        return Role::Unknown;
    }
    match (&report.lease, own) {
        (None, _) => Role::Unheld,
        (Some(l), Some(own)) if l.holder == own => Role::Holder,
        (Some(_), Some(_)) => Role::Standby,
        (Some(_), None) => Role::Unknown,
    }
}

/// Reads the host's record and manifest at `root` (resolved from `cwd` as `deliver --spaces`
/// does), then checks every space of the manifest at once (each check is bounded).
pub async fn host_status(root: Option<&Path>, cwd: &Path) -> Result<HostStatus, HostStatusError> {
    let root = base::resolve_root(root, cwd).map_err(|e| HostStatusError {
        kind: HostStatusErrorKind::Root,
        detail: e.to_string(),
        manifest: None,
    })?;
    let manifest = Manifest::read(&manifest_path(&root))?;
    let record = super::host_liveness(&root);
    let checks = manifest.spaces.iter().map(|space| {
        let root = root.clone();
        async move {
            let report = status(&root, space).await;
            let role = role(&report, own_holder(&root, space).as_deref());
            LaneStatus { report, role }
        }
    });
    let spaces = futures::future::join_all(checks).await;
    Ok(HostStatus {
        root,
        record,
        spaces,
    })
}
