//! The foreground `up` loop: one bounded tick at a time, so no wait (a replacement that never
//! serves, a retry after the lease TTL) can block Ctrl-C, a broker exit or `down`.
//!
//! Each tick looks at, in order: a signal, the broker `up` started, the daemon it started, the
//! `down` marker, a due restart and a due credential renewal. A restart happens only when the
//! daemon died while that broker still runs and no `down` stopped it; a clean exit or a
//! SIGTERM/SIGINT leaves it stopped. Spawning takes the stop reservation, so a `down` that lands
//! between two restart attempts is seen before the next spawn.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, Signal, SignalKind};

use super::renewal::RenewalOwner;
use super::stop::{self, Reservation};
use super::{
    exit_cause, last_line, not_bound, start_daemon, BrokerChild, DaemonChild, LeaseWatch,
    Transport, UpConfig, UpError, UpErrorKind, POLL,
};
use crate::base::{self, Journal, RemintTarget};
use crate::provision::Workspace;

/// SIGINT and SIGTERM (stop), SIGHUP and SIGUSR1 (passed on to the daemon), installed once at
/// `up`'s start: a terminal hang-up or a `systemctl reload` of the unit running `up` must not
/// end the mesh (the default action of SIGHUP would).
pub(super) struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
    usr1: Signal,
}

impl Signals {
    pub(super) fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            usr1: signal(SignalKind::user_defined1())?,
        })
    }
}

/// Passes `sig` on to the daemon `up` started, while it runs: SIGHUP makes it re-read its
/// credential, SIGUSR1 reopen its log.
fn pass_on(sig: nix::sys::signal::Signal, daemon: Option<&DaemonChild>, journal: &Journal) {
    let name = sig.as_str();
    match daemon {
        Some(d) => {
            let sent = i32::try_from(d.pid)
                .map_err(|_| nix::errno::Errno::ESRCH)
                .and_then(|p| nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), sig));
            match sent {
                Ok(()) => journal.line(format!(
                    "• up: received {name}: passed it on to the delivery daemon (pid {})",
                    d.pid
                )),
                Err(e) => journal.line(format!(
                    "! up: received {name} but could not pass it on to the delivery daemon (pid {}): {e}",
                    d.pid
                )),
            }
        }
        None => journal.line(format!(
            "• up: received {name}; no delivery daemon is running to pass it on to"
        )),
    }
}

/// What the loop works with.
pub(super) struct Ctx<'a> {
    pub cfg: &'a UpConfig,
    pub workspace: &'a Workspace,
    pub url: &'a str,
    pub transport: &'a Transport,
    pub watch: &'a LeaseWatch,
    pub journal: &'a Journal,
}

/// Where the daemon stands.
enum Phase {
    /// The replacement was started; `since` bounds the not-bound warning.
    Starting {
        since: Instant,
        warned: bool,
    },
    Serving,
    /// No daemon; a restart is due at this instant.
    RetryAt(Instant),
    /// No daemon, and none will be started (clean exit, signal, `down`).
    Stopped,
}

/// Why the loop ended.
enum End {
    Signal(&'static str),
    BrokerExited(ExitStatus),
}

/// A daemon that ended this way stays stopped: clean, or SIGTERM/SIGINT (with or without its
/// handlers in place).
fn stays_stopped(status: &ExitStatus) -> bool {
    status.success()
        || matches!(
            status.signal(),
            Some(s) if s == libc_sig(nix::sys::signal::Signal::SIGTERM)
                || s == libc_sig(nix::sys::signal::Signal::SIGINT)
        )
}

fn libc_sig(s: nix::sys::signal::Signal) -> i32 {
    s as i32
}

/// Runs until Ctrl-C/SIGTERM or the broker exits; then stops the daemon with the shared stop
/// and returns (the caller stops the broker).
pub(super) async fn run(
    ctx: &Ctx<'_>,
    broker: &mut BrokerChild,
    daemon: DaemonChild,
    mut signals: Signals,
) -> Result<(), UpError> {
    let cfg = ctx.cfg;
    let space = &cfg.space;
    let root = ctx.workspace.root();
    let journal = ctx.journal;
    let mut daemon = Some(daemon);
    let mut phase = Phase::Serving;
    let renewal = RenewalOwner::new(space, RemintTarget::Workspace(root.to_path_buf()), "up")
        .server(Some(ctx.url.to_string()), ctx.transport.tls_ca.clone())
        .lifetime(cfg.creds_lifetime)
        .spawn();
    journal.line("• mesh serving; Ctrl-C stops the daemon, then the broker");
    let end = loop {
        tokio::select! {
            _ = signals.int.recv() => break End::Signal("SIGINT"),
            _ = signals.term.recv() => break End::Signal("SIGTERM"),
            _ = signals.hup.recv() => {
                pass_on(nix::sys::signal::Signal::SIGHUP, daemon.as_ref(), journal);
                continue;
            }
            _ = signals.usr1.recv() => {
                pass_on(nix::sys::signal::Signal::SIGUSR1, daemon.as_ref(), journal);
                continue;
            }
            _ = tokio::time::sleep(POLL) => {}
        }
        // Looked at first, acted on last: a daemon that exited in the same tick is still
        // reported, and never restarted without its broker.
        let broker_exit = broker.child.try_wait().ok().flatten();
        let down = base::down_marker_path(root, space).exists();
        if let Some(d) = daemon.as_mut() {
            match d.child.try_wait() {
                Ok(Some(status)) => {
                    daemon = None;
                    let cause = exit_cause(&status);
                    phase = if down {
                        journal.line(format!(
                            "• delivery daemon exited ({cause}) - stopped by down, it stays stopped"
                        ));
                        Phase::Stopped
                    } else if stays_stopped(&status) && broker_exit.is_none() {
                        journal.line(format!(
                            "• delivery daemon exited ({cause}) - it stays stopped; nats-server keeps running"
                        ));
                        Phase::Stopped
                    } else if broker_exit.is_some() {
                        journal.line(format!(
                            "• delivery daemon exited ({cause}) with nats-server - not restarting it"
                        ));
                        Phase::Stopped
                    } else if matches!(phase, Phase::Starting { .. }) {
                        let last = last_line(&ctx.workspace.log_path(space))
                            .unwrap_or_else(|| "no output".into());
                        journal.line(format!(
                            "! up: the restarted delivery daemon exited ({cause}) without serving: {last}; retrying after the lease TTL ({} s)",
                            cfg.lease_ttl.as_secs()
                        ));
                        Phase::RetryAt(Instant::now() + cfg.lease_ttl)
                    } else {
                        journal.line(format!(
                            "delivery daemon exited ({cause}) while nats-server is running - restarting it"
                        ));
                        Phase::RetryAt(Instant::now())
                    };
                }
                Ok(None) => {
                    if let Phase::Starting { since, warned } = &mut phase {
                        if ctx.watch.serving(space, ctx.workspace, d).await {
                            journal.line("delivery daemon running again");
                            phase = Phase::Serving;
                        } else if !*warned && since.elapsed() > cfg.serving_bound {
                            *warned = true;
                            journal.line(format!(
                                "! up: {}",
                                not_bound(space, ctx.workspace, cfg.serving_bound)
                            ));
                        }
                    }
                }
                Err(e) => {
                    journal.line(format!("! up: could not wait for the delivery daemon: {e}"))
                }
            }
        }
        if let Some(status) = broker_exit {
            break End::BrokerExited(status);
        }
        if let Phase::RetryAt(at) = phase {
            if Instant::now() >= at {
                phase = restart(ctx, down, &mut daemon);
            }
        }
    };
    renewal.abort();
    let code = match &end {
        End::Signal(name) => {
            journal.line(format!(
                "• received {name}: stopping the delivery daemon, then nats-server"
            ));
            Ok(())
        }
        End::BrokerExited(status) => {
            if base::down_marker_path(root, space).exists() {
                journal.line("• nats-server stopped by down");
                Ok(())
            } else {
                journal.line(format!(
                    "! up: nats-server exited ({}) - stopping the delivery daemon",
                    exit_cause(status)
                ));
                Err(UpError::new(UpErrorKind::Broker, format!(
                    "✗ up: nats-server exited ({}) under up; the delivery daemon was stopped, nothing restarted",
                    exit_cause(status)
                )))
            }
        }
    };
    stop_under_up(ctx, daemon.as_mut()).await;
    code
}

/// A restart attempt under the reservation: none when `down` stopped the daemon.
fn restart(ctx: &Ctx<'_>, down: bool, daemon: &mut Option<DaemonChild>) -> Phase {
    let cfg = ctx.cfg;
    let space = &cfg.space;
    let root = ctx.workspace.root();
    if down {
        ctx.journal
            .line("• delivery daemon stopped by down - not restarting it");
        return Phase::Stopped;
    }
    // A stop holds the reservation: look again on the next tick.
    let Ok(_reservation) = Reservation::take(root, space, "up") else {
        return Phase::RetryAt(Instant::now());
    };
    if base::down_marker_path(root, space).exists() {
        ctx.journal
            .line("• delivery daemon stopped by down - not restarting it");
        return Phase::Stopped;
    }
    match start_daemon(space, ctx.workspace, ctx.url, ctx.transport, false) {
        Ok(d) => {
            *daemon = Some(d);
            Phase::Starting {
                since: Instant::now(),
                warned: false,
            }
        }
        Err(e) => {
            ctx.journal.line(format!(
                "! {e}; retrying after the lease TTL ({} s)",
                cfg.lease_ttl.as_secs()
            ));
            Phase::RetryAt(Instant::now() + cfg.lease_ttl)
        }
    }
}

/// The shared stop, for `up`'s own child too. When `down` holds the reservation, `up` waits for
/// that stop to finish (bounded by the grace plus the kill confirmation) and then makes sure.
async fn stop_under_up(ctx: &Ctx<'_>, mut daemon: Option<&mut DaemonChild>) {
    let cfg = ctx.cfg;
    let root = ctx.workspace.root();
    let bound = cfg.stop_grace + Duration::from_secs(10);
    for _ in 0..2 {
        let own = daemon.as_mut().map(|d| &mut d.child);
        match stop::stop_daemon(root, &cfg.space, own, cfg.stop_grace, "up", ctx.journal).await {
            Err(e) if e.kind() == stop::StopErrorKind::Busy => {
                ctx.journal
                    .line("• up: a stop of the delivery daemon is running - waiting for it");
                Reservation::wait_released(root, &cfg.space, bound).await;
            }
            Err(e) => {
                ctx.journal.line(e.to_string());
                return;
            }
            Ok(_) => return,
        }
    }
}
