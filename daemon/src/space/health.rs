//! Transport health: the broker-gone watchdog and the credential-expiry state.
//!
//! Why: the daemon is coupled to its broker, so it must leave when the broker is gone, but it
//! must not open probe connections to find out (it opens no other connection to check the
//! broker, docs/operations.md), and a starved host must not make a live broker look gone. So the only inputs
//! are the resident connection's own events: a disconnect starts a clock, a reconnect stops it.
//! Time the daemon's own event loop was stalled (a `LoopLagMeter` on the 250 ms evaluation tick)
//! is credited against the window; wall time has a backstop no credit can defer. An
//! authentication-expiry error is not a disconnect: it starts its own state that only a renewal
//! proved against the broker clears, and that ends the process at the backstop.
//!
//! The decision logic ([`TransportHealth`], [`LoopLagMeter`]) is pure and takes literal times in
//! milliseconds; [`Watchdog`] drives it from the connection's event feed on its own task, so a
//! busy run loop is never mistaken for a stalled process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc, watch};

pub use crate::base::HealthConfig;
use crate::base::{ConnEvent, Journal};

/// The evaluation tick, also the lag meter's interval (reference `LoopLagMeter(250)`).
pub const EVAL_TICK_MS: u64 = 250;
/// After a verdict a process host gives its daemon this long to close on its own before it
/// ends the process anyway (the reference's hard-exit timer). Host policy: this module never
/// exits a process; `cli.rs` applies it, a multi-space host retires only that lane.
pub const HARD_EXIT_GRACE: Duration = Duration::from_millis(2_000);

/// The lines docs/operations.md lists, verbatim.
pub const LINE_BROKER_GONE: &str = "✗ delivery: broker connection unavailable (broker unreachable), exiting (coupled to the broker)";
pub const LINE_BACKSTOP: &str = "✗ delivery: broker connection unavailable past backstop (broker unreachable), exiting (coupled to the broker)";
pub const LINE_EXPIRED: &str = "! delivery: credential expired, awaiting proved renewal";
pub const LINE_EXPIRED_EXIT: &str = "✗ delivery: credential expired without renewal";
/// A host's lane does not await a renewal: it closes and its host reopens it (docs/host.md).
pub const LINE_EXPIRED_CLOSE: &str = "✗ delivery: credential expired, closing without awaiting a renewal; the host reopens the lane once its store holds a valid credential";

/// Event-loop stall measured by a periodic tick: a tick that comes later than its interval
/// charges the excess as stall. Charges are unioned intervals, so overlapping charges count once.
#[derive(Debug, Clone)]
pub struct LoopLagMeter {
    interval_ms: u64,
    last_tick_ms: Option<u64>,
    /// Disjoint, sorted `[start, end)` spans.
    spans: Vec<(u64, u64)>,
}

impl LoopLagMeter {
    pub fn new(interval_ms: u64) -> LoopLagMeter {
        LoopLagMeter {
            interval_ms,
            last_tick_ms: None,
            spans: Vec::new(),
        }
    }

    /// Records a tick at `now_ms`; returns the lag it charged (0 on the first tick).
    pub fn tick(&mut self, now_ms: u64) -> u64 {
        let lag = match self.last_tick_ms {
            None => 0,
            Some(prev) => now_ms.saturating_sub(prev).saturating_sub(self.interval_ms),
        };
        self.last_tick_ms = Some(now_ms);
        if lag > 0 {
            self.credit(lag, now_ms);
        }
        lag
    }

    /// Charges `[ended_at - lag, ended_at)`.
    pub fn credit(&mut self, lag_ms: u64, ended_at_ms: u64) {
        if lag_ms == 0 {
            return;
        }
        let mut start = ended_at_ms.saturating_sub(lag_ms);
        let mut end = ended_at_ms;
        let mut kept = Vec::with_capacity(self.spans.len() + 1);
        for &(s, e) in &self.spans {
            if e < start || s > end {
                kept.push((s, e));
            } else {
                start = start.min(s);
                end = end.max(e);
            }
        }
        kept.push((start, end));
        kept.sort_unstable();
        self.spans = kept;
    }

    /// Total charged stall, at most `span_ms`.
    pub fn starved_ms_within(&self, span_ms: u64) -> u64 {
        let total: u64 = self.spans.iter().map(|(s, e)| e - s).sum();
        total.min(span_ms)
    }

    /// Clears the charges; the tick baseline is set to `now_ms` (the meter is (re)armed).
    pub fn rearm(&mut self, now_ms: u64) {
        self.spans.clear();
        self.last_tick_ms = Some(now_ms);
    }
}

/// Why the daemon must leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Disconnected for the window, less credited stall.
    BrokerGone,
    /// Disconnected for the backstop in wall time, whatever the stall.
    Backstop,
    /// The credential expired and no proved renewal arrived by the backstop.
    CredentialExpired,
    /// The credential expired and this daemon does not await a renewal
    /// ([`HealthConfig::closing_on_expiry`]: a host's lane, reopened by its host).
    CredentialLapsed,
}

impl Verdict {
    /// The documented line for this verdict.
    pub fn line(self) -> &'static str {
        match self {
            Verdict::BrokerGone => LINE_BROKER_GONE,
            Verdict::Backstop => LINE_BACKSTOP,
            Verdict::CredentialExpired => LINE_EXPIRED_EXIT,
            Verdict::CredentialLapsed => LINE_EXPIRED_CLOSE,
        }
    }
}

/// The pure state machine. Times are milliseconds on any monotonic clock.
#[derive(Debug, Clone)]
pub struct TransportHealth {
    cfg: HealthConfig,
    connected: bool,
    disconnected_at_ms: Option<u64>,
    expired: bool,
    lag: LoopLagMeter,
}

/// What a fed event changed, so the driver can say it once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    /// The connection dropped and the clock started.
    ClockStarted,
    /// The connection is back and the clock stopped.
    ClockStopped,
    /// The credential expired (first report of this episode).
    Expired,
    /// A proved adoption cleared the expiry state.
    ExpiryCleared,
}

impl TransportHealth {
    /// Starts connected (the start-up dial succeeded).
    pub fn new(cfg: HealthConfig) -> TransportHealth {
        TransportHealth {
            cfg,
            connected: true,
            disconnected_at_ms: None,
            expired: false,
            lag: LoopLagMeter::new(EVAL_TICK_MS),
        }
    }

    /// Whether the evaluation tick must run (disconnected or expired).
    pub fn armed(&self) -> bool {
        self.disconnected_at_ms.is_some()
    }

    fn start_clock(&mut self, now_ms: u64) -> bool {
        if self.disconnected_at_ms.is_none() {
            self.disconnected_at_ms = Some(now_ms);
            self.lag.rearm(now_ms);
            true
        } else {
            false
        }
    }

    /// A transport edge. A reconnect stops the clock unless the credential has expired.
    pub fn transport(&mut self, connected: bool, now_ms: u64) -> Change {
        self.connected = connected;
        if !connected {
            return if self.start_clock(now_ms) {
                Change::ClockStarted
            } else {
                Change::None
            };
        }
        if self.expired || self.disconnected_at_ms.is_none() {
            return Change::None;
        }
        self.disconnected_at_ms = None;
        Change::ClockStopped
    }

    /// The broker said the credential expired.
    pub fn credential_expired(&mut self, now_ms: u64) -> Change {
        self.start_clock(now_ms);
        if self.expired {
            return Change::None;
        }
        self.expired = true;
        Change::Expired
    }

    /// A renewal the broker accepted was adopted. Clears the expiry state; while connected it
    /// also stops the clock (otherwise the reconnect that follows does). An expiry is not a
    /// broker outage, so a clock it started restarts at the adoption: the window then measures
    /// the reconnect onto the renewal, not the time spent awaiting it (which may be longer than
    /// the window, and would otherwise end the daemon the moment it was renewed).
    pub fn adopted(&mut self, now_ms: u64) -> Change {
        let was = self.expired;
        self.expired = false;
        if self.connected {
            self.disconnected_at_ms = None;
        } else if was && self.disconnected_at_ms.is_some() {
            self.disconnected_at_ms = Some(now_ms);
            self.lag.rearm(now_ms);
        }
        if was {
            Change::ExpiryCleared
        } else {
            Change::None
        }
    }

    /// Evaluation tick: measures stall, then decides.
    pub fn tick(&mut self, now_ms: u64) -> Option<Verdict> {
        if !self.armed() {
            return None;
        }
        self.lag.tick(now_ms);
        self.verdict(now_ms)
    }

    /// When the verdict falls due if nothing changes and no more stall is credited: the window
    /// past the disconnect plus the stall credited so far, at most the backstop (an expiry
    /// awaits only the backstop). `None` while the clock is not running.
    pub fn due_ms(&self) -> Option<u64> {
        let since = self.disconnected_at_ms?;
        let backstop = since.saturating_add(self.cfg.backstop_ms());
        if self.expired {
            return Some(backstop);
        }
        let credited = self.lag.starved_ms_within(u64::MAX);
        Some(
            since
                .saturating_add(self.cfg.window_ms())
                .saturating_add(credited)
                .min(backstop),
        )
    }

    /// Wall time since the clock started (0 when it is not running).
    pub fn elapsed_ms(&self, now_ms: u64) -> u64 {
        self.disconnected_at_ms
            .map(|since| now_ms.saturating_sub(since))
            .unwrap_or(0)
    }

    /// Charged stall so far in this episode.
    pub fn stall_credited_ms(&self, now_ms: u64) -> u64 {
        match self.disconnected_at_ms {
            Some(since) => self.lag.starved_ms_within(now_ms.saturating_sub(since)),
            None => 0,
        }
    }

    /// The verdict at `now_ms`, without ticking the meter.
    pub fn verdict(&self, now_ms: u64) -> Option<Verdict> {
        let since = self.disconnected_at_ms?;
        if self.expired && self.cfg.expiry_closes() {
            return Some(Verdict::CredentialLapsed);
        }
        let elapsed = now_ms.saturating_sub(since);
        if elapsed >= self.cfg.backstop_ms() {
            return Some(if self.expired {
                Verdict::CredentialExpired
            } else {
                Verdict::Backstop
            });
        }
        // An expired credential is not a broker outage: only the backstop ends it.
        if self.expired {
            return None;
        }
        if elapsed - self.lag.starved_ms_within(elapsed) >= self.cfg.window_ms() {
            return Some(Verdict::BrokerGone);
        }
        None
    }
}

/// The handle the rest of the daemon holds on a running watchdog.
#[derive(Clone)]
pub struct HealthHandle {
    adopted: mpsc::UnboundedSender<()>,
    verdict: watch::Receiver<Option<Verdict>>,
    /// From an expiry's line until a proved adoption clears it: when it began (unix ms). The
    /// renewal's re-read comes sooner meanwhile.
    expired: watch::Receiver<Option<i64>>,
    /// Set when the daemon begins its own shutdown: the connection events that follow (its own
    /// drain) are not the broker going away, so the watchdog says nothing more.
    retired: Arc<AtomicBool>,
}

impl HealthHandle {
    /// The daemon is leaving on its own account: stop watching, quietly.
    pub fn stand_down(&self) {
        self.retired.store(true, Ordering::SeqCst);
    }

    /// Reports a broker-proved adoption (the only thing that clears an expiry).
    pub fn adopted(&self) {
        let _ = self.adopted.send(());
    }

    /// Whether the credential has expired and no proved renewal has cleared it yet.
    pub fn expired_now(&self) -> bool {
        self.expired.borrow().is_some()
    }

    /// The expiry state as it changes: since when (unix ms) the credential has expired
    /// unrenewed, `None` while it has not.
    pub fn expiry(&self) -> watch::Receiver<Option<i64>> {
        self.expired.clone()
    }

    /// The verdict, if the watchdog has reached one.
    pub fn verdict_now(&self) -> Option<Verdict> {
        *self.verdict.borrow()
    }

    /// Resolves once the watchdog has decided the daemon must leave.
    pub async fn verdict(&mut self) -> Verdict {
        loop {
            if let Some(v) = *self.verdict.borrow() {
                return v;
            }
            if self.verdict.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Drives [`TransportHealth`] from the resident connection's events on its own task.
pub struct Watchdog;

impl Watchdog {
    /// Spawns the watchdog. It logs the episode lines itself; on a verdict it logs the documented
    /// line and publishes the verdict (the daemon closes on it; nothing here exits a process).
    pub fn spawn(
        cfg: HealthConfig,
        mut events: broadcast::Receiver<ConnEvent>,
        client: async_nats::Client,
        journal: Journal,
        space: String,
    ) -> HealthHandle {
        let (adopted_tx, mut adopted_rx) = mpsc::unbounded_channel::<()>();
        let (verdict_tx, verdict_rx) = watch::channel(None);
        let (expired_tx, expired_rx) = watch::channel(None);
        let base = Instant::now();
        let now_ms = move || base.elapsed().as_millis() as u64;
        let retired = Arc::new(AtomicBool::new(false));
        let standing_down = retired.clone();
        tokio::spawn(async move {
            let mut health = TransportHealth::new(cfg);
            let mut tick = tokio::time::interval(Duration::from_millis(EVAL_TICK_MS));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut feed_open = true;
            let verdict = loop {
                let armed = health.armed();
                // The verdict is evaluated on the tick and also at the instant it falls due,
                // so the exit comes at the window, not up to a tick after it.
                let due = health
                    .due_ms()
                    .map(|ms| tokio::time::Instant::from_std(base + Duration::from_millis(ms)));
                let change = tokio::select! {
                    biased;
                    ev = events.recv(), if feed_open => match ev {
                        Ok(ConnEvent::Connected) => health.transport(true, now_ms()),
                        Ok(ConnEvent::Disconnected) | Ok(ConnEvent::Closed) => {
                            health.transport(false, now_ms())
                        }
                        Ok(ConnEvent::CredentialExpired) => health.credential_expired(now_ms()),
                        Ok(_) => Change::None,
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            use async_nats::connection::State;
                            let up = client.connection_state() == State::Connected;
                            health.transport(up, now_ms())
                        }
                        Err(broadcast::error::RecvError::Closed) => {
                            feed_open = false;
                            health.transport(false, now_ms())
                        }
                    },
                    Some(()) = adopted_rx.recv() => health.adopted(now_ms()),
                    _ = async {
                        tokio::select! {
                            _ = tick.tick() => {}
                            _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => {}
                        }
                    }, if armed => {
                        let now = now_ms();
                        if let Some(v) = health.tick(now) {
                            journal.line(format!(
                                "• delivery: the broker connection was unavailable for {} ms, {} ms of it credited as this process's own stall (window {} ms, backstop {} ms)",
                                health.elapsed_ms(now),
                                health.stall_credited_ms(now),
                                cfg.window_ms(),
                                cfg.backstop_ms()
                            ));
                            break v;
                        }
                        Change::None
                    }
                };
                if standing_down.load(Ordering::SeqCst) {
                    return;
                }
                if !armed && health.armed() {
                    tick.reset();
                }
                // A lane closes on the expiry itself: nothing to await, no episode line.
                if change == Change::Expired && cfg.expiry_closes() {
                    break Verdict::CredentialLapsed;
                }
                match change {
                    // A flapping connection: each of the pair once per window, with its count.
                    Change::ClockStarted => journal.repeated(
                        &format!("reconnecting:{space}"),
                        format!(
                            "! delivery: broker connection unavailable, reconnecting (space {space})"
                        ),
                    ),
                    Change::ClockStopped => journal.repeated(
                        &format!("restored:{space}"),
                        format!("✓ delivery: broker connection restored (space {space})"),
                    ),
                    Change::Expired => {
                        journal.line(LINE_EXPIRED);
                        expired_tx.send_replace(Some(crate::base::epoch_ms() as i64));
                    }
                    Change::ExpiryCleared => {
                        expired_tx.send_replace(None);
                        journal.line(format!(
                            "✓ delivery: a renewal the broker accepted was adopted; the credential-expiry state is cleared (space {space})"
                        ))
                    }
                    Change::None => {}
                }
            };
            match verdict {
                // The space named as the lane's own log is read alone.
                Verdict::CredentialLapsed => journal.line(verdict.line().replacen(
                    "credential expired",
                    &format!("credential expired (space {space})"),
                    1,
                )),
                _ => journal.line(verdict.line()),
            }
            let _ = verdict_tx.send(Some(verdict));
        });
        HealthHandle {
            adopted: adopted_tx,
            verdict: verdict_rx,
            expired: expired_rx,
            retired,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(w: u64, b: u64) -> HealthConfig {
        HealthConfig::new(w, b).unwrap()
    }

    /// Ticks every 250 ms from `from` (exclusive) to `to` (inclusive); the first verdict.
    fn ticks(h: &mut TransportHealth, from: u64, to: u64) -> Option<(Verdict, u64)> {
        let mut t = from;
        while t < to {
            t += EVAL_TICK_MS;
            if let Some(v) = h.tick(t) {
                return Some((v, t));
            }
        }
        None
    }

    /// The verdict's due time is the window past the drop plus the stall credited so far,
    /// capped by the backstop; an expiry awaits the backstop; none while connected.
    /// Mutation seen failing: the credited stall left out of `due_ms` (due at 1000, not 1300).
    #[test]
    fn the_verdict_falls_due_at_the_window_plus_credited_stall() {
        let mut h = TransportHealth::new(cfg(1_000, 4_000));
        assert_eq!(h.due_ms(), None);
        h.transport(false, 100);
        assert_eq!(h.due_ms(), Some(1_100));
        // A tick 550 ms after the last one charges 300 ms of stall.
        h.tick(350);
        h.tick(900);
        assert_eq!(h.due_ms(), Some(1_400));
        assert_eq!(h.verdict(1_399), None);
        assert_eq!(h.verdict(1_400), Some(Verdict::BrokerGone));
        let mut e = TransportHealth::new(cfg(1_000, 4_000));
        e.credential_expired(0);
        assert_eq!(e.due_ms(), Some(4_000));
    }

    #[test]
    fn meter_charges_late_ticks_as_unioned_spans() {
        let mut m = LoopLagMeter::new(2_000);
        assert_eq!(m.tick(0), 0);
        // Reference figure: a 30 s gap on a 2 s interval charges 28 s.
        assert_eq!(m.tick(30_000), 28_000);
        assert_eq!(m.starved_ms_within(60_000), 28_000);
        // An overlapping credit counts once; a disjoint one adds.
        m.credit(5_000, 30_000);
        assert_eq!(m.starved_ms_within(60_000), 28_000);
        m.credit(1_000, 40_000);
        assert_eq!(m.starved_ms_within(60_000), 29_000);
        assert_eq!(m.starved_ms_within(10_000), 10_000);
        m.rearm(50_000);
        assert_eq!(m.starved_ms_within(60_000), 0);
        assert_eq!(m.tick(50_250), 0);
    }

    #[test]
    fn a_disconnect_exits_after_the_window() {
        let mut h = TransportHealth::new(cfg(1_500, 6_000));
        assert_eq!(h.tick(100), None);
        assert_eq!(h.transport(false, 1_000), Change::ClockStarted);
        let mut t = 1_000;
        let mut verdict = None;
        while verdict.is_none() {
            t += 250;
            verdict = h.tick(t);
        }
        assert_eq!(verdict, Some(Verdict::BrokerGone));
        assert_eq!(t, 2_500);
    }

    #[test]
    fn a_reconnect_stops_the_clock() {
        let mut h = TransportHealth::new(cfg(1_500, 6_000));
        h.transport(false, 0);
        assert_eq!(h.tick(1_250), None);
        assert_eq!(h.transport(true, 1_400), Change::ClockStopped);
        assert!(!h.armed());
        assert_eq!(h.tick(10_000), None);
        // A new episode starts its own clock.
        h.transport(false, 20_000);
        assert_eq!(
            ticks(&mut h, 20_000, 30_000),
            Some((Verdict::BrokerGone, 21_500))
        );
    }

    #[test]
    fn a_stall_longer_than_the_window_is_credited() {
        let mut h = TransportHealth::new(cfg(1_500, 6_000));
        h.transport(false, 0);
        assert_eq!(h.tick(250), None);
        // Frozen for 3 s: the next tick is 3 s late.
        assert_eq!(h.tick(3_500), None);
        assert_eq!(h.stall_credited_ms(3_500), 3_000);
        // Unstalled time reaches the window 1.5 s after the disconnect plus the stall.
        assert_eq!(
            ticks(&mut h, 3_500, 9_000),
            Some((Verdict::BrokerGone, 4_500))
        );
    }

    #[test]
    fn the_backstop_ignores_stall_credit() {
        let mut h = TransportHealth::new(cfg(2_000, 6_000));
        h.transport(false, 0);
        let mut t = 0;
        // Frozen 1.5 s, awake 0.1 s, over and over.
        let mut verdict = None;
        while verdict.is_none() {
            t += 1_500;
            verdict = h.tick(t);
            if verdict.is_none() {
                t += 100;
                verdict = h.tick(t);
            }
        }
        assert_eq!(verdict, Some(Verdict::Backstop));
        assert!((6_000..6_000 + 1_500).contains(&t), "t = {t}");
        assert!(h.stall_credited_ms(t) > 4_000);
    }

    #[test]
    fn expiry_is_not_a_disconnect_and_ends_at_the_backstop() {
        let mut h = TransportHealth::new(cfg(1_500, 6_000));
        assert_eq!(h.credential_expired(1_000), Change::Expired);
        assert_eq!(h.credential_expired(1_010), Change::None);
        h.transport(false, 1_020);
        // A reconnect alone does not clear it.
        assert_eq!(h.transport(true, 1_500), Change::None);
        assert_eq!(h.tick(3_000), None);
        assert_eq!(h.tick(6_750), None);
        assert_eq!(h.tick(7_000), Some(Verdict::CredentialExpired));
    }

    /// A host's lane closes on the expiry itself; without the setting nothing changes.
    /// Mutation seen failing: the `expiry_closes` check removed from `verdict` (the lane would
    /// await the backstop: `None` at 1 250 ms).
    #[test]
    fn a_lane_closes_on_the_expiry_itself() {
        let mut h = TransportHealth::new(cfg(1_500, 6_000).closing_on_expiry());
        assert_eq!(h.tick(500), None);
        assert_eq!(h.credential_expired(1_000), Change::Expired);
        assert_eq!(h.tick(1_250), Some(Verdict::CredentialLapsed));
        assert_eq!(Verdict::CredentialLapsed.line(), LINE_EXPIRED_CLOSE);
        let mut plain = TransportHealth::new(cfg(1_500, 6_000));
        plain.credential_expired(1_000);
        assert_eq!(plain.tick(1_250), None);
    }

    /// A renewal adopted after an expiry longer than the window does not end the daemon at
    /// once: the window runs from the adoption (the reconnect onto the renewal stops it).
    /// Mutation seen failing: the restart of the clock removed (a verdict at 4 500 ms, the
    /// expiry's 4.5 s counted as an outage).
    #[test]
    fn a_renewal_after_a_long_expiry_starts_the_window_at_the_adoption() {
        let mut h = TransportHealth::new(cfg(1_000, 6_000));
        h.credential_expired(0);
        h.transport(false, 5);
        assert_eq!(h.tick(4_000), None);
        assert_eq!(h.adopted(4_000), Change::ExpiryCleared);
        assert_eq!(h.verdict(4_500), None);
        assert_eq!(h.due_ms(), Some(5_000));
        assert_eq!(h.verdict(5_000), Some(Verdict::BrokerGone));
        assert_eq!(h.transport(true, 4_800), Change::ClockStopped);
        assert_eq!(h.verdict(9_000), None);
    }

    #[test]
    fn a_proved_adoption_clears_expiry() {
        let mut h = TransportHealth::new(cfg(1_500, 6_000));
        h.credential_expired(0);
        h.transport(false, 5);
        // Adopted while disconnected: expiry clears, the clock runs until the reconnect.
        assert_eq!(h.adopted(2_000), Change::ExpiryCleared);
        assert!(h.armed());
        assert_eq!(h.transport(true, 2_100), Change::ClockStopped);
        assert_eq!(h.tick(9_000), None);
        // Adopted while connected (after a stale reconnect): clears both at once.
        h.credential_expired(10_000);
        h.transport(true, 10_100);
        assert_eq!(h.adopted(10_200), Change::ExpiryCleared);
        assert!(!h.armed());
    }
}
