//! A lane: one space of a multi-space host, as a [`SpaceDaemon`] the host (re)opens.
//!
//! Why its own loop: a lane must refuse, stand by, close and reopen without touching any other
//! lane. Each attempt reads the space's credential from the host's root and checks it on its
//! own (provisioned here, well-formed, the space's account, not expired) before any dial, so a
//! lane that cannot be the space's daemon never reaches the lease. A held lease is a standby:
//! reported once (holder named), retried every [`Tuning::standby_retry`]. Any other refusal
//! or a close is retried with a bounded exponential backoff. An attempt's lines are written
//! only when its outcome differs from the previous attempt's, so a retry every few seconds does
//! not repeat the same lines.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::base::{
    self, epoch_ms, read_creds_file, Credential, CredsErrorKind, DialSpec, FsStore, Journal, RowOp,
    SecretStore, Tuning, LANE_BACKOFF_MIN,
};
use crate::host::kicker::HostKicker;
use crate::host::signal::ProcessSignals;
use crate::host::standby_watch::{News, StandbyWatch, WatchSpec, STANDBY_WATCH_CONNECTION};
use crate::provision::Workspace;
use crate::space::HARD_EXIT_GRACE;
use crate::space::RELEASE_REDIAL_BOUND;
use crate::space::{Closed, SpaceConfig, SpaceDaemon, StartError, StartErrorKind};
use crate::wire::{Principal, Space, SpaceNames};

/// What every lane of a host shares.
#[derive(Clone)]
pub struct LaneInputs {
    pub root: PathBuf,
    pub server: String,
    pub tls: bool,
    pub tls_ca: Option<PathBuf>,
    /// The host's timing (each lane's daemon, the standby retry, the backoff cap).
    pub tuning: Tuning,
    /// The host's one registry; each lane counts under its own `space` label.
    pub metrics: crate::base::MetricsRegistry,
}

/// An attempt's outcome, compared with the previous one to decide whether to report it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refusal {
    kind: StartErrorKind,
    detail: String,
    holder: Option<String>,
}

/// Runs the lane of `space` until `stop` fires (then its daemon releases its own row).
pub async fn run(
    space: Space,
    inputs: Arc<LaneInputs>,
    signals: ProcessSignals,
    kicker: Arc<HostKicker>,
) {
    let stop = signals.stop.clone();
    let journal = Journal::with_repeat_window(inputs.tuning.log_repeat_window);
    match base::open_log(&base::log_path(&inputs.root, &space)) {
        Ok(Some(f)) => journal.attach_file(f),
        Ok(None) => {}
        Err(e) => journal.line(format!("! {e}")),
    }
    // The lane's run in its space's log, framed like a `deliver` run's.
    journal.file_line(format!(
        "• delivery: lane run started — cotal-delivery {} (build {}), host pid {}, space {space}, root {}, broker {}",
        env!("CARGO_PKG_VERSION"),
        crate::BUILD_ID,
        std::process::id(),
        inputs.root.display(),
        inputs.server
    ));
    // SIGUSR1 reopens this lane's space log; SIGHUP reaches its daemon as a re-read.
    let reopen = super::signal::reopen_on_usr1(
        &signals,
        journal.clone(),
        Some(base::log_path(&inputs.root, &space)),
        "delivery",
    );
    serve(&space, &inputs, &signals, &kicker, &journal).await;
    reopen.abort();
    journal.file_line(format!(
        "• delivery: lane run ended — stopped by {} with its host (pid {}; the host's exit code is in {})",
        stop.cause().unwrap_or("its host"),
        std::process::id(),
        base::HOST_LOG_FILE
    ));
}

async fn serve(
    space: &Space,
    inputs: &Arc<LaneInputs>,
    signals: &ProcessSignals,
    kicker: &Arc<HostKicker>,
    journal: &Journal,
) {
    let mut stop = signals.stop.clone();
    let space = space.clone();
    let kicker = kicker.clone();
    let journal = journal.prefixed(format!("lane {space}: "));
    let mut last: Option<Refusal> = None;
    let mut backoff = LANE_BACKOFF_MIN;
    let mut watching = Watching::default();
    loop {
        if stop.cause().is_some() {
            watching.retire().await;
            return;
        }
        let attempt = journal.held();
        let mut own = None;
        let mut credential = None;
        let started = match config(&space, inputs, &kicker, &attempt) {
            Ok(mut cfg) => {
                own = own_holder(&cfg);
                cfg.reread = signals.reread.clone();
                credential = Some(cfg.credential.clone());
                SpaceDaemon::start(cfg, stop.clone()).await
            }
            Err(e) => Err(e),
        };
        let wait = match started {
            Ok(daemon) => {
                // Serving: the daemon's own lease watch takes over.
                watching.retire_in_background();
                attempt.release();
                last = None;
                backoff = LANE_BACKOFF_MIN;
                let closed = wait_closed(&daemon, &attempt).await;
                if matches!(closed, Closed::Stopped { .. }) || stop.cause().is_some() {
                    return;
                }
                attempt.line(format!(
                    "! delivery host: the lane closed ({closed}); reopening it in {} ms",
                    backoff.as_millis()
                ));
                next_backoff(&mut backoff, inputs.tuning.lane_backoff_max)
            }
            Err(e) if e.kind() == StartErrorKind::Stopped => {
                watching.retire().await;
                return;
            }
            Err(e) => {
                let refusal = Refusal {
                    kind: e.kind(),
                    // A holder that is not running is said with the seconds until its row
                    // expires, which change on every retry: the outcome is that it is not
                    // running, not the count.
                    detail: match e.not_running_holder_expires_in() {
                        Some(_) => "a holder that is not running".to_string(),
                        None => e.to_string(),
                    },
                    holder: e.holder().map(str::to_string),
                };
                let repeated = last.as_ref() == Some(&refusal);
                let wait = if e.kind() == StartErrorKind::LeaseHeld {
                    inputs.tuning.standby_retry
                } else {
                    next_backoff(&mut backoff, inputs.tuning.lane_backoff_max)
                };
                if repeated {
                    attempt.discard();
                } else {
                    attempt.release();
                    attempt.line(report(&e, own.as_deref(), &inputs.tuning, wait));
                }
                last = Some(refusal);
                match (e.kind(), credential) {
                    // A standby: watch the row it stands by for (bound once, kept across
                    // retries; its redials present the credential read on this attempt).
                    (StartErrorKind::LeaseHeld, Some(credential)) => {
                        watching.watch(&space, inputs, &credential)
                    }
                    // A refused lane is on its backoff: nothing to wake it for.
                    _ => watching.retire_in_background(),
                }
                wait
            }
        };
        // The retry's wait; a watched row that goes ends it early. A wake only shortens the
        // wait: the claim on the next attempt still decides.
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                news = watching.next() => {
                    if watching.heard(news, &journal, &inputs.tuning, &space) {
                        break;
                    }
                }
                _ = stop.stopped() => {
                    watching.retire().await;
                    return;
                }
            }
        }
    }
}

/// A standby lane's watch on its lease row, and what the lane has said about it.
#[derive(Default)]
struct Watching {
    watch: Option<StandbyWatch>,
    /// The loss was reported; said again only after the watch was bound again.
    lost_said: bool,
    /// The bucket's missing expiry markers were reported.
    no_markers_said: bool,
}

impl Watching {
    /// Binds the watch if there is none (a lost one is bound again on the next retry).
    fn watch(&mut self, space: &Space, inputs: &LaneInputs, credential: &Credential) {
        match &self.watch {
            Some(w) => w.credential(credential),
            None => {
                let spec = WatchSpec {
                    space: space.clone(),
                    dial: DialSpec::new(inputs.server.clone())
                        .tls(inputs.tls, inputs.tls_ca.clone())
                        .ping_interval(inputs.tuning.ping_interval)
                        .name(STANDBY_WATCH_CONNECTION),
                };
                self.watch = Some(StandbyWatch::spawn(spec, credential.clone()));
            }
        }
    }

    /// The watch's next news; pending while there is no watch.
    async fn next(&mut self) -> News {
        match self.watch.as_mut() {
            Some(w) => w.next().await,
            None => std::future::pending().await,
        }
    }

    /// Reports `news` as the lane's lines say it; `true` when the lane should claim now.
    fn heard(&mut self, news: News, journal: &Journal, timing: &Tuning, space: &Space) -> bool {
        match news {
            News::Bound { markers } => {
                if self.lost_said {
                    self.lost_said = false;
                    journal.line("• delivery host: this standby's lease watch is bound again; a deleted, purged or expired lease row wakes it at once");
                }
                if markers {
                    self.no_markers_said = false;
                } else if !self.no_markers_said {
                    self.no_markers_said = true;
                    journal.line(format!(
                        "! delivery host: the lease bucket {} leaves no marker when a row expires (it has no subject_delete_marker_ttl), so this standby sees an expired row only on its {} ms retry; a cotal-delivery up --space {space} that starts the space's mesh provisions it again, migrating it in place (reported once)",
                        SpaceNames::kv_stream(&SpaceNames::new(space).delivery_bucket()),
                        timing.standby_retry.as_millis()
                    ));
                }
                false
            }
            News::Gone(gone) => {
                let what = match gone.op {
                    RowOp::Expired => "expired",
                    RowOp::Purged => "was purged",
                    _ => "was deleted",
                };
                journal.line(format!(
                    "• delivery host: the lease row {what} (revision {}, seen by this standby's lease watch); claiming the lease now",
                    gone.revision
                ));
                true
            }
            News::Lost(why) => {
                self.watch = None;
                if !self.lost_said {
                    self.lost_said = true;
                    journal.line(format!(
                        "! delivery host: this standby's lease watch is lost ({why}); standing by on the {} ms retry alone, binding it again on each retry (reported once)",
                        timing.standby_retry.as_millis()
                    ));
                }
                false
            }
        }
    }

    /// Retires the watch and waits for it (bounded): a lane that stops leaves no consumer.
    async fn retire(&mut self) {
        if let Some(w) = self.watch.take() {
            w.retire().await;
        }
    }

    /// Retires the watch without holding up the lane (a takeover, a refused lane).
    fn retire_in_background(&mut self) {
        if let Some(w) = self.watch.take() {
            tokio::spawn(w.retire());
        }
    }
}

/// Returns the current backoff and doubles it up to `max`.
fn next_backoff(backoff: &mut Duration, max: Duration) -> Duration {
    let now = *backoff;
    *backoff = (*backoff * 2).min(max);
    now
}

/// The lease holder this lane's credential writes (`local.<nkey>`).
fn own_holder(cfg: &SpaceConfig) -> Option<String> {
    let nkey = cfg.credential.public_key().ok()?;
    Some(Principal::for_nkey(&nkey).ok()?.dot_form())
}

/// The host's one line about a refused attempt. `own` is the holder this lane writes: a held
/// row of its own is a previous daemon of this lane that could not release it (it closed on
/// an expired credential or a gone broker), left to the bucket TTL.
fn report(e: &StartError, own: Option<&str>, timing: &Tuning, wait: Duration) -> String {
    match e.kind() {
        StartErrorKind::LeaseHeld if e.holder().is_some() && e.holder() == own => format!(
            "• delivery host: the lease still holds this host's own row ({}), which a closed lane could not release; it expires with the bucket TTL. No lane opened, retrying every {} ms (reported once)",
            e.holder().unwrap_or_default(),
            timing.standby_retry.as_millis()
        ),
        StartErrorKind::LeaseHeld if e.not_running_holder_expires_in().is_some() => format!(
            "• delivery host: standing by — the lease row is held by {}, a holder that is not running ({}); it expires in {} s and is claimed once it has. No lane opened, retrying every {} ms (reported once)",
            e.holder().unwrap_or("a holder"),
            crate::space::NOT_RUNNING_PROOF,
            e.not_running_holder_expires_in()
                .unwrap_or_default()
                .as_millis()
                .div_ceil(1000),
            timing.standby_retry.as_millis()
        ),
        StartErrorKind::LeaseHeld => format!(
            "• delivery host: standing by — the lease is held by {}; no lane opened, retrying every {} ms (reported once)",
            e.holder().unwrap_or("another live holder"),
            timing.standby_retry.as_millis()
        ),
        _ => format!(
            "✗ delivery host: the lane refused ({e}); retrying in {} ms, backoff up to {} ms",
            wait.as_millis(),
            timing.lane_backoff_max.as_millis()
        ),
    }
}

/// Waits for the daemon's end; after a transport verdict it gets [`HARD_EXIT_GRACE`] to close.
async fn wait_closed(daemon: &SpaceDaemon, journal: &Journal) -> Closed {
    tokio::select! {
        closed = daemon.closed() => closed,
        verdict = daemon.verdict() => {
            match tokio::time::timeout(HARD_EXIT_GRACE, daemon.closed()).await {
                Ok(closed) => closed,
                Err(_) => {
                    journal.line(format!(
                        "! delivery host: the lane did not close within {} ms of the verdict; reopening it anyway",
                        HARD_EXIT_GRACE.as_millis()
                    ));
                    Closed::of_verdict(verdict)
                }
            }
        }
    }
}

fn refuse(journal: &Journal, kind: StartErrorKind, text: String) -> StartError {
    journal.line(format!("✗ {text}"));
    StartError::new(kind, text)
}

/// The lane's own checks, before any dial, and its daemon's inputs.
fn config(
    space: &Space,
    inputs: &LaneInputs,
    kicker: &Arc<HostKicker>,
    journal: &Journal,
) -> Result<SpaceConfig, StartError> {
    let ws = Workspace::new(&inputs.root);
    let dir = ws.space_dir(space);
    if !dir.is_dir() {
        return Err(refuse(
            journal,
            StartErrorKind::Config,
            format!(
                "delivery: this host is not provisioned for space {space} (no {})",
                dir.display()
            ),
        ));
    }
    let path = ws.delivery_creds_path(space);
    let credential = match read_creds_file(&path) {
        Ok(c) => c,
        Err(e) if e.kind() == CredsErrorKind::Io && !path.exists() => {
            return Err(refuse(
                journal,
                StartErrorKind::Config,
                format!("delivery: no delivery credential at {}", path.display()),
            ))
        }
        Err(e) => {
            return Err(refuse(
                journal,
                StartErrorKind::Config,
                format!(
                    "delivery: malformed credential at {} ({})",
                    path.display(),
                    e.detail()
                ),
            ))
        }
    };
    let claims = credential.claims().map_err(|e| {
        refuse(
            journal,
            StartErrorKind::Config,
            format!(
                "delivery: malformed credential at {} ({})",
                path.display(),
                e.detail()
            ),
        )
    })?;
    let account_path = ws.membership_json_path(space);
    let assigned = std::fs::read_to_string(&account_path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| {
            v.get("accountId")
                .and_then(|a| a.as_str())
                .map(str::to_string)
        });
    let Some(assigned) = assigned else {
        return Err(refuse(
            journal,
            StartErrorKind::Config,
            format!(
                "delivery: no account record for space {space} at {} (expected {{\"accountId\": …}})",
                account_path.display()
            ),
        ));
    };
    if claims.account() != assigned {
        return Err(refuse(
            journal,
            StartErrorKind::Account,
            format!(
                "delivery: the credential at {} belongs to account {}, not space {space}'s account {assigned}",
                path.display(),
                claims.account()
            ),
        ));
    }
    if let Some(exp) = claims.exp {
        if exp.saturating_mul(1000) <= epoch_ms() as i64 {
            return Err(refuse(
                journal,
                StartErrorKind::CredentialExpired,
                format!(
                    "delivery: the credential at {} expired (exp {exp}); awaiting a renewed one in the host's store",
                    path.display()
                ),
            ));
        }
    }
    let store: Arc<dyn SecretStore> = Arc::new(FsStore::new(inputs.root.clone()));
    let mut cfg = SpaceConfig::new(space.clone(), inputs.server.clone(), credential, store);
    cfg.sweeps_bound_to = format!("{}/{}", inputs.root.display(), base::COTAL_DIR);
    // A lane writes no pid record: it stops with its host.
    cfg.stop_with = format!(
        "SIGTERM to the delivery host (pid {}), which stops every lane",
        std::process::id()
    );
    cfg.tls = inputs.tls;
    cfg.tls_ca = inputs.tls_ca.clone();
    cfg.tuning = inputs.tuning.clone();
    // A lane does not await a renewal on an expired credential: it closes, and the reopen
    // runs the checks above (docs/host.md, "A lane's credential expires").
    cfg.tuning.health = inputs.tuning.health.closing_on_expiry();
    cfg.redial_wait = RELEASE_REDIAL_BOUND;
    cfg.journal = journal.clone();
    // The lane opens no kick credential: its evictions ask the host.
    cfg.kicker = Some(kicker.for_lane(space, &assigned));
    cfg.metrics = inputs.metrics.for_space(&space.to_string());
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation seen failing: `next_backoff` without the `min(max)` cap.
    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let mut b = LANE_BACKOFF_MIN;
        let max = Duration::from_millis(3_000);
        let waits: Vec<u128> = (0..5)
            .map(|_| next_backoff(&mut b, max).as_millis())
            .collect();
        assert_eq!(waits, vec![500, 1_000, 2_000, 3_000, 3_000]);
    }
}
