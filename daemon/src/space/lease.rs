//! The single-flight delivery lease (`cotal_delivery_<s>` key `lease.0`).
//!
//! One daemon serves a space: the lease row is the only arbiter. It is claimed by an atomic
//! create, marked `ready` only once every binding is established, renewed by compare-and-set, and
//! released at the broker's revision, never by deleting a row another holder wrote. Ownership is
//! holder *and* incarnation, so a restarted daemon with the same credential never mistakes a
//! predecessor's row, or a rival's copy of its holder name, for its own.

use std::fmt;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::base::{Read, RowError, RowErrorKind, Rows, Violations};
use crate::wire::{LeaseInfo, LEASE_KEY};

/// Who this process is, for ownership checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Principal dot-form `local.<nkey>`.
    pub holder: String,
    /// Unique per process run.
    pub incarnation: String,
}

impl Identity {
    pub fn owns(&self, info: &LeaseInfo) -> bool {
        info.holder == self.holder && info.incarnation == self.incarnation
    }
}

/// What a re-read of the lease key shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// Still our row, at this broker revision.
    Held { revision: u64 },
    /// No live row.
    Gone,
    /// Another holder's row (or ours from another incarnation).
    Taken { by: String },
    /// The broker did not answer the read.
    Unknown { why: String },
}

/// Why a claim did not win.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimError {
    /// A live row exists: another daemon holds the lease (or a crashed holder's has not expired).
    Held { detail: String },
    /// The credential may not make the write.
    Denied { operation: String, subject: String },
    /// The broker refused for another reason; quoted as it gave it.
    Refused { detail: String },
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimError::Held { detail } => write!(f, "a live lease exists ({detail})"),
            ClaimError::Denied { operation, subject } => {
                write!(f, "{operation} \"{subject}\" was denied")
            }
            ClaimError::Refused { detail } => f.write_str(detail),
        }
    }
}

/// The daemon's handle on its lease row.
pub struct Lease {
    rows: Rows,
    me: Identity,
    since: u64,
    ready: bool,
    /// The revision of our last successful write, `None` when we hold nothing (or gave it up).
    revision: Option<u64>,
    /// When our last write known to have landed was sent: the broker stamped it later, so the
    /// row cannot expire before this plus the TTL.
    written_at: Option<Instant>,
    violations: Violations,
}

impl Lease {
    pub fn new(rows: Rows, me: Identity, violations: Violations) -> Lease {
        Lease {
            rows,
            me,
            since: crate::base::epoch_ms(),
            ready: false,
            revision: None,
            written_at: None,
            violations,
        }
    }

    pub fn revision(&self) -> Option<u64> {
        self.revision
    }
    pub fn subject(&self) -> String {
        self.rows.subject(LEASE_KEY)
    }

    fn body(&self) -> Bytes {
        let info = LeaseInfo {
            holder: self.me.holder.clone(),
            since: self.since,
            ready: self.ready,
            incarnation: self.me.incarnation.clone(),
        };
        Bytes::from(serde_json::to_vec(&info).unwrap_or_default())
    }

    /// Atomic create with `ready:false`. A permission denial is told apart from a timeout by the
    /// broker's `-ERR` on the lease subject.
    pub async fn claim(&mut self) -> Result<u64, ClaimError> {
        self.ready = false;
        self.since = crate::base::epoch_ms();
        let started = Instant::now();
        let result = self.create_racing_denial(started).await;
        let result = self.settle_unanswered(result).await;
        self.classify_claim(result, started)
    }

    /// The create, cut short when the broker denies the write (a denied publish is never
    /// acknowledged, so waiting for the ack would only wait out the bound).
    async fn create_racing_denial(&self, started: Instant) -> Result<u64, RowError> {
        let subject = self.subject();
        tokio::select! {
            r = self.rows.create(LEASE_KEY, self.body()) => r,
            op = self.violations.denied(&subject, started) => {
                Err(RowError::from_detail(format!("{op} \"{subject}\" denied")))
            }
        }
    }

    /// A create whose answer was lost may still have won at the broker: a leader-served re-read
    /// decides, so a won claim is never left behind unreleased.
    async fn settle_unanswered(&self, result: Result<u64, RowError>) -> Result<u64, RowError> {
        match &result {
            Err(e) if e.kind() == RowErrorKind::TimedOut => match self.read_own().await {
                Reading::Held { revision } => Ok(revision),
                _ => result,
            },
            _ => result,
        }
    }

    fn classify_claim(
        &mut self,
        result: Result<u64, RowError>,
        started: Instant,
    ) -> Result<u64, ClaimError> {
        match result {
            Ok(rev) => {
                self.revision = Some(rev);
                self.written_at = Some(started);
                Ok(rev)
            }
            Err(e) => {
                if let Some(operation) = self.violations.denied_since(&self.subject(), started) {
                    return Err(ClaimError::Denied {
                        operation,
                        subject: self.subject(),
                    });
                }
                match e.kind() {
                    RowErrorKind::Conflict => Err(ClaimError::Held {
                        detail: e.detail().to_string(),
                    }),
                    _ => Err(ClaimError::Refused {
                        detail: e.detail().to_string(),
                    }),
                }
            }
        }
    }

    /// CAS write of our row with the given readiness, at our last revision.
    async fn rewrite(&mut self, ready: bool) -> Result<u64, RowError> {
        let Some(expected) = self.revision else {
            return Err(RowError::from_detail(
                "this process holds no lease revision",
            ));
        };
        let was = self.ready;
        self.ready = ready;
        let started = Instant::now();
        match self
            .rows
            .put_expecting(LEASE_KEY, self.body(), expected)
            .await
        {
            Ok(rev) => {
                self.revision = Some(rev);
                self.written_at = Some(started);
                Ok(rev)
            }
            Err(e) => {
                self.ready = was;
                Err(e)
            }
        }
    }

    pub async fn mark_ready(&mut self) -> Result<u64, RowError> {
        self.rewrite(true).await
    }
    pub async fn mark_not_ready(&mut self) -> Result<u64, RowError> {
        self.rewrite(false).await
    }
    /// Renewal: the same row written again at our revision, which restarts the bucket TTL.
    pub async fn renew(&mut self) -> Result<u64, RowError> {
        let ready = self.ready;
        self.rewrite(ready).await
    }

    /// How long the row stays ours for certain under a bucket TTL of `ttl`: the TTL counted
    /// from the sending of our last write known to have landed (zero when we hold nothing).
    fn valid_for(&self, ttl: Duration) -> Duration {
        self.written_at
            .map(|at| ttl.saturating_sub(at.elapsed()))
            .unwrap_or(Duration::ZERO)
    }

    /// [`Lease::renew`], given up once the row may have expired: past that moment a standby
    /// may hold the lease, so the caller must stop serving rather than wait for the write's
    /// own bound (longer than half a short TTL). The write may still land; a re-read decides.
    pub async fn renew_within(&mut self, ttl: Duration) -> Result<u64, RowError> {
        let left = self.valid_for(ttl);
        if left.is_zero() {
            // Nothing left to guard (the daemon already stopped serving, or cannot tell when
            // the row was written): a renew that gives up at once would never renew again.
            return self.renew().await;
        }
        match tokio::time::timeout(left, self.renew()).await {
            Ok(result) => result,
            Err(_) => Err(RowError::timed_out(format!(
                "no answer before its row's TTL ({} ms) ran out since its last write",
                ttl.as_millis()
            ))),
        }
    }

    /// The bucket the lease row lives in (a refused claim dates its row there).
    pub fn rows(&self) -> &Rows {
        &self.rows
    }

    /// Re-reads the key from the leader.
    pub async fn read_own(&self) -> Reading {
        match self.rows.read(LEASE_KEY).await {
            Err(e) => Reading::Unknown {
                why: e.detail().to_string(),
            },
            Ok(Read::Absent { .. }) => Reading::Gone,
            Ok(Read::Present(row)) => match serde_json::from_slice::<LeaseInfo>(&row.value) {
                Ok(info) if self.me.owns(&info) => Reading::Held {
                    revision: row.revision,
                },
                Ok(info) => Reading::Taken { by: info.holder },
                Err(_) => Reading::Taken {
                    by: "an unreadable row".into(),
                },
            },
        }
    }

    /// Adopts the broker's revision after a re-read proved the row is still ours. `written_at`
    /// stays that of the last answered write: a timed-out write that landed made the row
    /// fresher, never older, and the resume that follows the re-read writes it again.
    pub fn adopt_revision(&mut self, revision: u64) {
        self.revision = Some(revision);
    }

    /// Forgets our revision (the lease was lost): nothing will be released on the way out.
    pub fn forget(&mut self) {
        self.revision = None;
        self.written_at = None;
    }

    /// Re-creates the row after it was found gone.
    pub async fn reacquire(&mut self) -> Result<u64, ClaimError> {
        // Like the first claim: not ready until the plane is re-armed.
        self.ready = false;
        let started = Instant::now();
        let result = self.create_racing_denial(started).await;
        let result = self.settle_unanswered(result).await;
        self.classify_claim(result, started)
    }

    /// Releases the row at the broker's current revision, only if it is still ours (holder and
    /// incarnation). A row that is already gone is released; another holder's row is never
    /// touched and is reported by name.
    pub async fn release(&mut self) -> Result<Released, ReleaseError> {
        if self.revision.is_none() {
            return Ok(Released::NotHeld);
        }
        match self.read_own().await {
            Reading::Held { revision } => {
                match self.rows.delete_expecting(LEASE_KEY, revision).await {
                    Ok(_) => {
                        self.revision = None;
                        Ok(Released::Released)
                    }
                    Err(e) if e.kind() == RowErrorKind::Conflict => {
                        // written between the read and the delete: say who holds it now.
                        match self.read_own().await {
                            Reading::Taken { by } => Err(self.foreign(by)),
                            Reading::Gone => {
                                self.revision = None;
                                Ok(Released::Released)
                            }
                            _ => Err(ReleaseError::new(
                                ReleaseErrorKind::NotCommitted,
                                format!("the broker refused the release ({})", e.detail()),
                            )),
                        }
                    }
                    Err(e) => Err(ReleaseError::new(
                        match e.kind() {
                            RowErrorKind::Refused => ReleaseErrorKind::NotCommitted,
                            _ => ReleaseErrorKind::Unconfirmed,
                        },
                        e.detail().to_string(),
                    )),
                }
            }
            Reading::Unknown { why } => Err(ReleaseError::new(ReleaseErrorKind::Unconfirmed, why)),
            Reading::Gone => {
                self.revision = None;
                Ok(Released::Released)
            }
            Reading::Taken { by } => Err(self.foreign(by)),
        }
    }

    fn foreign(&mut self, by: String) -> ReleaseError {
        self.revision = None;
        ReleaseError::new(
            ReleaseErrorKind::Foreign,
            format!("another instance's lease row is there ({by})"),
        )
        .holder(by)
    }
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// This instance's row is gone from the broker (deleted now, or already gone).
    Released,
    /// This instance held no row (it never won one, or it lost it earlier).
    NotHeld,
}

/// Why a release was not proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseError {
    kind: ReleaseErrorKind,
    detail: String,
    holder: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseErrorKind {
    /// The broker refused the delete.
    NotCommitted,
    /// The broker could not confirm it (no answer, or the connection was down).
    Unconfirmed,
    /// Another instance's row is there; [`ReleaseError::holder`] names it.
    Foreign,
}

impl ReleaseError {
    pub fn new(kind: ReleaseErrorKind, detail: impl Into<String>) -> ReleaseError {
        ReleaseError {
            kind,
            detail: detail.into(),
            holder: None,
        }
    }
    fn holder(mut self, by: String) -> ReleaseError {
        self.holder = Some(by);
        self
    }
    pub fn kind(&self) -> ReleaseErrorKind {
        self.kind
    }
    /// The holder of the foreign row ([`ReleaseErrorKind::Foreign`]).
    pub fn foreign_holder(&self) -> Option<&str> {
        self.holder.as_deref()
    }
}

impl fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for ReleaseError {}

/// Half the TTL, never under a second: the renew interval.
pub fn renew_interval(ttl: Duration) -> Duration {
    (ttl / 2).max(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_needs_holder_and_incarnation() {
        let me = Identity {
            holder: "local.UA".into(),
            incarnation: "i1".into(),
        };
        let mut info = LeaseInfo {
            holder: "local.UA".into(),
            since: 1,
            ready: true,
            incarnation: "i1".into(),
        };
        assert!(me.owns(&info));
        info.incarnation = "i2".into();
        assert!(!me.owns(&info));
    }

    #[test]
    fn lease_row_is_wire_compatible() {
        let info = LeaseInfo {
            holder: "local.UA".into(),
            since: 5,
            ready: false,
            incarnation: "x".into(),
        };
        assert_eq!(
            serde_json::to_string(&info).unwrap(),
            r#"{"holder":"local.UA","since":5,"ready":false,"incarnation":"x"}"#
        );
        let old: LeaseInfo =
            serde_json::from_str(r#"{"holder":"h","since":1,"ready":true}"#).unwrap();
        assert_eq!(old.incarnation, "");
    }

    #[test]
    fn renew_runs_at_half_the_ttl() {
        assert_eq!(
            renew_interval(Duration::from_secs(30)),
            Duration::from_secs(15)
        );
        assert_eq!(
            renew_interval(Duration::from_secs(1)),
            Duration::from_secs(1)
        );
    }
}
