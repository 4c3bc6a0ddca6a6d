//! `$SYS` observer admission, checked before the endpoint is built or the lease claimed.
//!
//! Eviction and liveness sweeps scan the broker through an account-scoped `$SYS` observer. A
//! daemon that would sweep with an observer of another account, or with half of a rotated
//! observer/evictor pair, must refuse to start rather than attribute connections wrongly, so
//! this runs before the daemon touches the lease.

// The pair's store read lives with the sweeps that re-read it on every eviction and liveness
// call; admission checks the same read once, before the lease.
use crate::base::{connz_accounts, pinned_to};
pub use crate::base::{evictor_key, observer_key, SysPair};

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

/// Checks the observer (required) and evictor (optional) next to the daemon's credentials.
pub fn admit(pair: &SysPair, expected_account: &str) -> Result<Admitted, AdmissionError> {
    let refuse = |detail: String| Err(AdmissionError { detail });
    let observer_at = &pair.observer.at;
    let observer = match &pair.observer.value {
        Ok(Some(c)) => c,
        Ok(None) => {
            return refuse(format!(
                "the $SYS membership-observer credential is missing ({observer_at})"
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
            "the $SYS membership-observer credential ({observer_at}) grants no $SYS.REQ.ACCOUNT.<account>.CONNZ scan"
        ));
    }
    if !pinned_to(&accounts, expected_account) {
        if accounts.iter().any(|a| a == expected_account) {
            return refuse(format!(
                "the $SYS membership-observer credential ({observer_at}) scans accounts {}, not only account {expected_account} this daemon serves; it must be pinned to that one account",
                accounts.join(", ")
            ));
        }
        return refuse(format!(
            "the $SYS membership-observer credential ({observer_at}) scans account {} but this daemon serves account {}",
            accounts.join(", "),
            expected_account
        ));
    }
    let evictor_present = match &pair.evictor.value {
        Ok(None) => false,
        Ok(Some(evictor)) => {
            let evictor = evictor.claims().map_err(|e| AdmissionError {
                detail: format!("the $SYS connection-evictor credential is unreadable ({e})"),
            })?;
            if evictor.iss != claims.iss {
                return refuse(format!(
                    "the $SYS observer and evictor were signed by different system-account keys ({} vs {}): a torn rotation",
                    claims.iss, evictor.iss
                ));
            }
            true
        }
        Err(e) => {
            return refuse(format!(
                "the $SYS connection-evictor credential is unreadable ({e})"
            ))
        }
    };
    Ok(Admitted {
        account: expected_account.to_string(),
        evictor_present,
    })
}
