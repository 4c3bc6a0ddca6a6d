//! `cotal-delivery down`: stops what `up` started at a root, its renewal owner and the delivery
//! daemon first (the daemon with the stop `up` uses, so it holds the same reservation), then the
//! broker. It leaves a marker first, so a foreground `up` never restarts a daemon `down` stopped:
//! not one it had to kill, not a replacement still starting, not one between two restart attempts.

use std::path::Path;
use std::time::{Duration, Instant};

use super::stop::{self, StopError, StopErrorKind};
use crate::base::{self, Journal};
use crate::wire::Space;

/// How long `down` retries a reservation held for a moment (an `up` spawning a replacement)
/// before it reports a concurrent stop.
const RESERVATION_RETRY: Duration = Duration::from_secs(1);

/// Stops the space's daemon, then the broker recorded at `root`.
pub async fn down(
    root: &Path,
    space: &Space,
    grace: Duration,
    journal: &Journal,
) -> Result<(), StopError> {
    // The marker goes first: whoever reaps the daemon (a foreground `up`) sees it.
    let _ = base::write_atomic(
        &base::down_marker_path(root, space),
        format!("{}\n", std::process::id()).as_bytes(),
    );
    // The renewal owner first: it would otherwise re-sign a credential the stop removes.
    super::remint::stop_renewal_owner(root, space, grace, "down", journal).await;
    let deadline = Instant::now() + RESERVATION_RETRY;
    loop {
        match stop::stop_daemon(root, space, None, grace, "down", journal).await {
            Err(e) if e.kind() == StopErrorKind::Busy && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
            Ok(_) => break,
        }
    }
    stop::stop_recorded_broker(root, grace, "down", journal).await;
    Ok(())
}
