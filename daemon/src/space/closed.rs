//! How a space daemon ends: the typed closure reason every way out carries, and the typed
//! refusal of a start.
//!
//! Its own file so the keeper (which decides most reasons), the start-up phases and the daemon
//! handle (which reports them) all use it without using each other. A refused lease claim is
//! classified here once ([`claim_outcome`]) for the start and the serving keeper alike. Only the
//! command line and the hosts turn a reason into an exit code or a reopen.

use std::fmt;

use crate::space::health::Verdict;
use crate::space::{lease::ClaimError, lease::ReleaseError, lease::Released};
use crate::wire::Space;
use crate::wire::SHARD;

/// The cause a `SpaceDaemon::close()` stops with.
pub const CLOSE_CAUSE: &str = "close()";

/// Why a running space daemon ended. Every way out carries one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// Stopped by request (a signal's name, or [`CLOSE_CAUSE`]); `release` says what became of
    /// the row this instance owned.
    Stopped {
        by: &'static str,
        release: Result<Released, ReleaseError>,
    },
    /// The broker-gone watchdog expired ([`Verdict::BrokerGone`] or [`Verdict::Backstop`]).
    BrokerGone { verdict: Verdict },
    /// The credential expired and no proved renewal arrived by the backstop.
    CredentialExpired,
    /// The credential expired and the daemon closed at once, as a host's lane does (its host
    /// reopens it; the row is left to the bucket TTL: this credential can no longer write it).
    CredentialLapsed,
    /// Another holder's row is (or took) the lease; the row was not touched.
    LeaseTaken { by: String },
    /// Re-acquiring the lease was denied by permissions (quoted).
    LeaseDenied { detail: String },
    /// Re-acquiring the lease was refused for another reason (quoted).
    LeaseRefused { detail: String },
    /// An unexpected fault.
    Fault { detail: String },
}

impl Closed {
    pub(crate) fn of_verdict(verdict: Verdict) -> Closed {
        match verdict {
            Verdict::CredentialExpired => Closed::CredentialExpired,
            Verdict::CredentialLapsed => Closed::CredentialLapsed,
            v => Closed::BrokerGone { verdict: v },
        }
    }
}

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Closed::Stopped { by, release } => match release {
                Ok(_) => write!(f, "stopped by {by}; the lease was released"),
                Err(e) => write!(f, "stopped by {by}; the lease release was not proved ({e})"),
            },
            Closed::BrokerGone { verdict } => f.write_str(verdict.line()),
            Closed::CredentialExpired => f.write_str(Verdict::CredentialExpired.line()),
            Closed::CredentialLapsed => f.write_str(Verdict::CredentialLapsed.line()),
            Closed::LeaseTaken { by } => write!(f, "the lease is held by {by}"),
            Closed::LeaseDenied { detail } => write!(f, "the lease write was denied ({detail})"),
            Closed::LeaseRefused { detail } => write!(f, "the lease write was refused ({detail})"),
            Closed::Fault { detail } => write!(f, "fault: {detail}"),
        }
    }
}

/// A refused lease claim, classified once: the kind a start refuses with, and the reason a
/// serving daemon that could not re-acquire its lease closes with.
pub(crate) fn claim_outcome(e: &ClaimError) -> (StartErrorKind, Closed) {
    match e {
        ClaimError::Held { detail } => (
            StartErrorKind::LeaseHeld,
            Closed::LeaseTaken { by: detail.clone() },
        ),
        ClaimError::Denied { .. } => (
            StartErrorKind::LeaseDenied,
            Closed::LeaseDenied {
                detail: e.to_string(),
            },
        ),
        ClaimError::Refused { .. } => (
            StartErrorKind::LeaseRefused,
            Closed::LeaseRefused {
                detail: e.to_string(),
            },
        ),
    }
}

/// Why a start refused. Every refusal closed what the start had opened (connections, a won
/// claim) before it was returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartError {
    kind: StartErrorKind,
    phase: StartPhase,
    detail: String,
    /// The live holder of the lease, when a `LeaseHeld` refusal could read its row.
    holder: Option<String>,
    /// For a `LeaseHeld` refusal whose row belongs to a holder proved not running: how long
    /// until the row expires (a start after that claims it).
    not_running: Option<std::time::Duration>,
}

/// The phase of the start that refused (`space/startup.rs`). Each phase refuses with its own
/// kinds: `Inputs` with `Config` (and a host's own checks: `StoreIdentity`, `Account`,
/// `CredentialExpired`, `Fault`), `Dial` with `Unreachable` or `OpenMode`, `Admit` with `Admission` or
/// `Fault`, `Claim` with `LeaseHeld`, `LeaseDenied` or `LeaseRefused`, `Arm` and `Companions`
/// with `Fault`; from `Dial` on, any phase with `Stopped`, `BrokerGone` or
/// `CredentialExpired`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartPhase {
    /// Before any dial: the inputs (the credential, a host's own checks).
    Inputs,
    /// The resident connection's first dial (reachability).
    Dial,
    /// `$SYS` observer admission.
    Admit,
    /// The single-flight lease claim.
    Claim,
    /// The parts under the lease (renewal, plane context, keeper).
    Wire,
    /// Binding the fan-out writer, the reader and both rails; marking the lease ready.
    Arm,
    /// The lease watch, then the membership feed, the timer writer and the sampler.
    Companions,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartErrorKind {
    /// Refused before dialing: the credential or another input is unusable.
    Config,
    /// The injected store declares no stable identity, or another one than assigned.
    StoreIdentity,
    /// The initial delivery credential belongs to another account than assigned.
    Account,
    /// The broker did not answer the reachability check, refused the connection, or offered no
    /// TLS while TLS was demanded.
    Unreachable,
    /// The broker requires no authentication: open dev mode, which has no delivery daemon.
    OpenMode,
    /// `$SYS` observer admission refused.
    Admission,
    /// Another daemon holds the lease.
    LeaseHeld,
    /// The credential may not write the lease.
    LeaseDenied,
    /// The broker refused the lease write for another reason.
    LeaseRefused,
    /// The broker-gone watchdog expired during the start.
    BrokerGone,
    /// The credential expired during the start.
    CredentialExpired,
    /// Stopped by request during the start (a won claim was released).
    Stopped,
    /// An unexpected fault (a won claim was released).
    Fault,
}

impl StartError {
    pub fn new(kind: StartErrorKind, detail: impl Into<String>) -> StartError {
        StartError {
            kind,
            phase: StartPhase::Inputs,
            detail: detail.into(),
            holder: None,
            not_running: None,
        }
    }
    pub fn kind(&self) -> StartErrorKind {
        self.kind
    }
    /// The phase that refused.
    pub fn phase(&self) -> StartPhase {
        self.phase
    }
    pub(crate) fn at(mut self, phase: StartPhase) -> StartError {
        self.phase = phase;
        self
    }
    pub(crate) fn held_by(mut self, holder: Option<String>) -> StartError {
        self.holder = holder;
        self
    }
    pub(crate) fn holder_not_running(mut self, expires_in: std::time::Duration) -> StartError {
        self.not_running = Some(expires_in);
        self
    }
    /// For a `LeaseHeld` refusal: `Some(time until the row expires)` when the row's holder was
    /// proved not running (a crashed daemon's row), `None` for a live holder or no proof.
    pub fn not_running_holder_expires_in(&self) -> Option<std::time::Duration> {
        self.not_running
    }
    /// Who holds the lease, for a `LeaseHeld` refusal (read from the row after the claim lost;
    /// `None` when that read did not answer or the row was gone by then).
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref()
    }
    pub(crate) fn of_verdict(verdict: Verdict) -> StartError {
        let kind = match verdict {
            Verdict::CredentialExpired | Verdict::CredentialLapsed => {
                StartErrorKind::CredentialExpired
            }
            _ => StartErrorKind::BrokerGone,
        };
        StartError::new(kind, verdict.line().trim_start_matches("✗ "))
    }
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for StartError {}

/// The line a requested stop is reported with.
pub(crate) fn stop_line(by: &str, space: &Space) -> String {
    if by == CLOSE_CAUSE {
        format!("• delivery: close() requested, closing (space {space}, shard {SHARD})")
    } else {
        format!("• delivery: received {by}, exiting (space {space}, shard {SHARD})")
    }
}
