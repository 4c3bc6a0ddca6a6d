//! The process exit codes a space daemon's way out maps to (`docs/operations.md`).

/// Exit codes a supervisor can act on. Documented in `docs/operations.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Stopped by SIGTERM/SIGINT; lease released.
    Signalled = 0,
    /// An unexpected fault during start-up or serving.
    Fault = 1,
    /// Refused before dialing: workspace root, credential, flags.
    Config = 3,
    /// The broker did not answer the start-up reachability check (or offered no TLS).
    Unreachable = 4,
    /// `$SYS` observer admission refused.
    Admission = 5,
    /// Another daemon holds (or took) the lease.
    LeaseHeld = 6,
    /// The credential may not write the lease.
    LeaseDenied = 7,
    /// The broker refused a lease write for another reason.
    LeaseRefused = 8,
    /// The broker-gone watchdog expired.
    BrokerGone = 9,
    /// The credential expired without a proved renewal.
    CredentialExpired = 10,
}

impl Exit {
    pub fn code(self) -> i32 {
        self as i32
    }
}
