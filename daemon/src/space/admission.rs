//! `$SYS` observer admission, checked before the endpoint is built or the lease claimed.
//!
//! Eviction and liveness sweeps scan the broker through an account-scoped `$SYS` observer. A
//! daemon that would sweep with an observer of another account, or with half of a rotated
//! observer/evictor pair, must refuse to start rather than attribute connections wrongly, so
//! this runs before the daemon touches the lease.

use std::path::{Path, PathBuf};

use crate::creds::{read_creds_file, CredsErrorKind};

/// The admitted sweep authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The data account the observer is pinned to (= the daemon's account).
    pub account: String,
    /// Whether a connection-evictor credential is present (else deny-new-only posture).
    pub evictor_present: bool,
}

/// Why admission refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionError {
    pub detail: String,
}

impl std::fmt::Display for AdmissionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "delivery startup: {}. Refusing before endpoint construction and lease admission",
            self.detail
        )
    }
}

impl std::error::Error for AdmissionError {}

/// The account a `$SYS.REQ.ACCOUNT.<acc>.CONNZ` publish grant names, if any.
fn connz_accounts(claims: &serde_json::Value) -> Vec<String> {
    claims["pub"]["allow"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str())
                .filter_map(|s| {
                    s.strip_prefix("$SYS.REQ.ACCOUNT.")
                        .and_then(|r| r.strip_suffix(".CONNZ"))
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Checks the observer (required) and evictor (optional) next to the daemon's credentials.
pub fn admit(
    observer_path: &Path,
    evictor_path: &Path,
    expected_account: &str,
) -> Result<Admitted, AdmissionError> {
    let refuse = |detail: String| Err(AdmissionError { detail });
    let observer = match read_creds_file(observer_path) {
        Ok(c) => c,
        Err(e) if e.kind() == CredsErrorKind::Io && !observer_path.exists() => {
            return refuse(format!(
                "the $SYS membership-observer credential is missing ({})",
                observer_path.display()
            ))
        }
        Err(e) => {
            return refuse(format!(
                "the $SYS membership-observer credential is unreadable ({e})"
            ))
        }
    };
    let claims = match observer.claims() {
        Ok(c) => c,
        Err(e) => {
            return refuse(format!(
                "the $SYS membership-observer JWT is malformed ({e})"
            ))
        }
    };
    let accounts = connz_accounts(&claims.nats);
    if accounts.is_empty() {
        return refuse(format!(
            "the $SYS membership-observer credential ({}) grants no $SYS.REQ.ACCOUNT.<account>.CONNZ scan",
            observer_path.display()
        ));
    }
    if !accounts.iter().any(|a| a == expected_account) {
        return refuse(format!(
            "the $SYS membership-observer credential ({}) scans account {} but this daemon serves account {}",
            observer_path.display(),
            accounts.join(", "),
            expected_account
        ));
    }
    let evictor_present = evictor_path.exists();
    if evictor_present {
        let evictor = read_creds_file(evictor_path)
            .and_then(|c| c.claims())
            .map_err(|e| AdmissionError {
                detail: format!("the $SYS connection-evictor credential is unreadable ({e})"),
            })?;
        if evictor.iss != claims.iss {
            return refuse(format!(
                "the $SYS observer and evictor were signed by different system-account keys ({} vs {}): a torn rotation",
                claims.iss, evictor.iss
            ));
        }
    }
    Ok(Admitted {
        account: expected_account.to_string(),
        evictor_present,
    })
}

/// Paths of the `$SYS` pair for a space directory.
pub fn sys_pair_paths(space_dir: &Path) -> (PathBuf, PathBuf) {
    (
        space_dir.join("membership-observer.creds"),
        space_dir.join("connection-evictor.creds"),
    )
}
