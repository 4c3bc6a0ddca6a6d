//! Why a space daemon ended: the typed closure reason every way out carries.
//!
//! Its own file so the keeper (which decides most reasons) and the daemon handle (which reports
//! them) both use it without using each other. Only the command line and the hosts turn a
//! reason into an exit code or a reopen.

use std::fmt;

use crate::space::health::Verdict;
use crate::space::{lease::ReleaseError, lease::Released};
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

/// The line a requested stop is reported with.
pub(crate) fn stop_line(by: &str, space: &Space) -> String {
    if by == CLOSE_CAUSE {
        format!("• delivery: close() requested, closing (space {space}, shard {SHARD})")
    } else {
        format!("• delivery: received {by}, exiting (space {space}, shard {SHARD})")
    }
}
