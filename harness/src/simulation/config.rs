//! What a simulation run is made of, as data: the windows it shrinks through the documented
//! overrides (docs/operations.md, "Timing overrides"), the population and its channels, the
//! phases' share of the run, the workload's mix and the nemesis's faults with their weights and
//! durations per mesh shape. The shipped defaults belong to the kit's cases; a simulation
//! shrinks them so that faults land in a run of minutes.

use crate::simulation::check::{CheckConfig, FaultKind};

/// `COTAL_DELIVERY_BROKER_GONE_MS` of a simulation.
pub const BROKER_GONE_WINDOW_MS: u64 = 8_000;
/// `COTAL_DELIVERY_BROKER_GONE_BACKSTOP_MS`: three windows.
pub const BROKER_GONE_BACKSTOP_MS: u64 = 24_000;
/// `COTAL_DELIVERY_PING_INTERVAL_MS`.
pub const PING_INTERVAL_MS: u64 = 1_000;
/// The lease bucket's TTL (`max_age`, set at provisioning).
pub const LEASE_TTL_MS: u64 = 6_000;
/// `COTAL_DELIVERY_ACK_WAIT_MS` of `fanout` and `reader`.
pub const ACK_WAIT_MS: u64 = 2_000;
/// `COTAL_DELIVERY_NAK_DELAY_MS`.
pub const NAK_DELAY_MS: u64 = 200;
/// `COTAL_DELIVERY_REMINT_RETRY_MS`: how soon an expired daemon reads its store again.
pub const REMINT_RETRY_MS: u64 = 1_000;
/// `COTAL_DELIVERY_STANDBY_RETRY_MS` of a standby host.
pub const STANDBY_RETRY_MS: u64 = 1_000;
/// `COTAL_DELIVERY_LANE_BACKOFF_MAX_MS` of a standby host.
pub const LANE_BACKOFF_MAX_MS: u64 = 2_000;
/// The lifetime a credential fault remints the daemon's credential to.
pub const SHORT_CREDENTIAL_MS: u64 = 5_000;
/// The lifetime of every other remint the runner writes (longer than any run).
pub const LONG_CREDENTIAL_MS: u64 = 6 * 3600 * 1000;
/// The DLV stream's duplicate window (`BACKSTOP_DUPLICATE_WINDOW`, 2 h).
pub const DLV_DEDUP_WINDOW_MS: u64 = 2 * 3600 * 1000;
/// Slack on either side of a broker-gone exit: the checker's 3 s default plus 2 s for this
/// runner's 100 ms observation tick and two cores shared with builds.
pub const EXIT_MARGIN_MS: u64 = 5_000;

/// The daemons' environment: every window above, through its documented variable.
pub fn daemon_env(standby: bool) -> Vec<(String, String)> {
    let mut env = vec![
        ("COTAL_DELIVERY_BROKER_GONE_MS", BROKER_GONE_WINDOW_MS),
        (
            "COTAL_DELIVERY_BROKER_GONE_BACKSTOP_MS",
            BROKER_GONE_BACKSTOP_MS,
        ),
        ("COTAL_DELIVERY_PING_INTERVAL_MS", PING_INTERVAL_MS),
        ("COTAL_DELIVERY_ACK_WAIT_MS", ACK_WAIT_MS),
        ("COTAL_DELIVERY_NAK_DELAY_MS", NAK_DELAY_MS),
        ("COTAL_DELIVERY_REMINT_RETRY_MS", REMINT_RETRY_MS),
    ];
    if standby {
        env.push(("COTAL_DELIVERY_STANDBY_RETRY_MS", STANDBY_RETRY_MS));
        env.push(("COTAL_DELIVERY_LANE_BACKOFF_MAX_MS", LANE_BACKOFF_MAX_MS));
    }
    let mut env: Vec<(String, String)> = env
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // The daemon's structured diagnostics (its `RUST_LOG`, off by default) for a diagnosis: a
    // run started with `COTAL_SIM_DAEMON_RUST_LOG=<filter>` gives it to every daemon, and their
    // lines land in the run directory's `logs/` beside the human ones (the observer leaves them
    // out of an exit's last line).
    if let Ok(filter) = std::env::var(DAEMON_RUST_LOG) {
        env.push(("RUST_LOG".to_string(), filter));
    }
    env
}

/// The variable whose value, when set, is every simulated daemon's `RUST_LOG`.
pub const DAEMON_RUST_LOG: &str = "COTAL_SIM_DAEMON_RUST_LOG";

/// The checker's bounds for what the runner gave the daemons.
pub fn check_config() -> CheckConfig {
    CheckConfig {
        broker_gone_window_ms: BROKER_GONE_WINDOW_MS,
        broker_gone_backstop_ms: BROKER_GONE_BACKSTOP_MS,
        // Two unanswered pings plus one interval for where the clock stood.
        silent_detect_ms: 3 * PING_INTERVAL_MS,
        exit_margin_ms: EXIT_MARGIN_MS,
        lease_ttl_ms: LEASE_TTL_MS,
        dedup_window_ms: DLV_DEDUP_WINDOW_MS,
        ..CheckConfig::default()
    }
}

/// The space every run provisions.
pub const SPACE: &str = "sim";
/// The durable channels (each agent joins some at the start).
pub const DURABLE_CHANNELS: &[&str] = &["ops", "dev", "design"];
/// The live channel (posts there reach only mentioned peers through the backstop).
pub const LIVE_CHANNEL: &str = "lobby";
/// A name no agent carries: a mention of it resolves to no one.
pub const NOBODY: &str = "nobody";
/// The population when `--agents` is not given.
pub const DEFAULT_AGENTS: usize = 20;
/// Most agents a run may have.
pub const MAX_AGENTS: usize = 64;
/// The run's length when `--minutes` is not given.
pub const DEFAULT_MINUTES: f64 = 5.0;
/// Longest run `--minutes` accepts.
pub const MAX_MINUTES: f64 = 600.0;

/// How a run's time (`--minutes`) is shared among the phases before the drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phases {
    pub quiet_ms: u64,
    pub faults_ms: u64,
    pub heal_ms: u64,
}

impl Phases {
    /// 15 % quiet (at least 10 s), 60 % faults, the rest heal (at least 20 s: a lease that
    /// outlived its holder expires, a daemon starts again, the first post after it is judged).
    pub fn of(total_ms: u64) -> Phases {
        let quiet_ms = (total_ms * 15 / 100).max(10_000);
        let heal_ms = (total_ms * 25 / 100).max(20_000);
        let faults_ms = total_ms.saturating_sub(quiet_ms + heal_ms).max(5_000);
        Phases {
            quiet_ms,
            faults_ms,
            heal_ms,
        }
    }
    pub fn faults_from(&self) -> u64 {
        self.quiet_ms
    }
    pub fn heal_from(&self) -> u64 {
        self.quiet_ms + self.faults_ms
    }
    pub fn drain_from(&self) -> u64 {
        self.quiet_ms + self.faults_ms + self.heal_ms
    }
}

/// Bound on the final drain: every agent online until nothing is pending, or this passes.
pub const DRAIN_BOUND_MS: u64 = 90_000;

/// One kind of workload operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkKind {
    DurablePost,
    MentionPost,
    Join,
    Leave,
    Offline,
    Online,
    Narrow,
    Widen,
    Retire,
    /// A post raced on purpose against a join, a leave or a leave and rejoin of another
    /// member of the channel: the posts at a join's frontier and at a leave's cursor.
    Race,
}

/// The workload's mix: relative weights. Narrowings leave the member in the channel (a post
/// then must not surface: the reader's ACL re-check), and leaves are followed by posts on the
/// channel (the leave cursor): both are what the checker catches a broken reader by.
pub const WORK_MIX: &[(WorkKind, u64)] = &[
    (WorkKind::DurablePost, 560),
    (WorkKind::MentionPost, 120),
    (WorkKind::Join, 80),
    (WorkKind::Leave, 60),
    (WorkKind::Offline, 30),
    (WorkKind::Online, 60),
    (WorkKind::Narrow, 30),
    (WorkKind::Widen, 25),
    (WorkKind::Retire, 8),
    (WorkKind::Race, 60),
];

/// Fewest fault kinds a swarm draw leaves in a run (`nemesis::swarm`).
pub const SWARM_MIN_FAULT_KINDS: usize = 3;

/// A proxy latency's base and jitter, drawn in these ranges (ms): one way below half the
/// ping interval, so a ping's round trip stays under it (a slow link, never a silent one).
pub const LATENCY_BASE_MS: (u64, u64) = (20, 250);
pub const LATENCY_JITTER_MS: (u64, u64) = (0, 200);
/// A slow broker's stops and the gaps between them (ms): each stop below the ping interval.
pub const STUTTER_STOP_MS: (u64, u64) = (150, 700);
pub const STUTTER_GAP_MS: (u64, u64) = (300, 1_500);
/// Posts a race sends (the first at the frontier or the cursor, the next just past it).
pub const RACE_POSTS: usize = 2;
/// The held leave (`nemesis::hold_member_writes`, on a store-full of `DLV_<s>`): how long the
/// serving daemon's first member row write is waited for at its proxy once the leave is asked,
/// how long it is held there once seen (the posts sent meanwhile, past the leave's cursor, are
/// stored and routed by the fan-out writer, which does not see the leave yet), and how many
/// posts are sent meanwhile.
pub const HELD_WRITE_WAIT_MS: u64 = 1_000;
pub const HELD_WRITE_MS: u64 = 300;
pub const HELD_POSTS: usize = 2;
/// After the held write is released the store stays full this long (the leave is answered, the
/// reader's refused entries come back after a nak delay and are judged after the answer), and
/// at most this long from the draw (the longest store-full drawn), well below the reader's
/// give-up (ten failed hand-offs, ten nak delays: 2 s here).
pub const STORE_FULL_AFTER_RELEASE_MS: u64 = 500;
pub const STORE_FULL_MAX_MS: u64 = 1_500;
/// Per mille of posts that carry no id (no duplicate suppression).
pub const IDLESS_PER_MILLE: u64 = 100;
/// The workload's pace: one operation every this many ms, drawn uniformly.
pub const WORK_GAP_MS: (u64, u64) = (100, 600);
/// How long a retired lifecycle's successor waits before it is provisioned.
pub const SUCCESSOR_AFTER_MS: (u64, u64) = (2_000, 6_000);

/// One fault the nemesis may draw, with its weight and how long it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultSpec {
    pub kind: FaultKind,
    /// What it aims at.
    pub aim: Aim,
    pub weight: u64,
    /// Planned duration, ms, drawn uniformly in this range.
    pub duration_ms: (u64, u64),
}

/// What a fault aims at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aim {
    /// The daemon that holds the lease (`daemon:<name>`).
    Holder,
    /// The broker (one broker), or a cluster node drawn at random.
    Broker,
    /// The holder's proxy.
    HolderProxy,
    /// The holder's proxy, from its first write to a store drawn (`INBOX_<s>` or `DLV_<s>`).
    HolderWrites,
    /// A stream the daemon writes, drawn (`INBOX_<s>` or `DLV_<s>`).
    Store,
    /// The lease row.
    Lease,
}

/// The faults of a mesh shape. Pauses come shorter and longer than the broker-gone window
/// (the longer ones also outlive the lease TTL); broker and network faults shorter and longer
/// than the window too.
pub fn faults(cluster: bool, standby: bool) -> Vec<FaultSpec> {
    use FaultKind::*;
    let w = BROKER_GONE_WINDOW_MS;
    let f = |kind, aim, weight, duration_ms| FaultSpec {
        kind,
        aim,
        weight,
        duration_ms,
    };
    let mut out = vec![
        f(DaemonKill, Aim::Holder, 12, (1_000, 6_000)),
        f(DaemonPause, Aim::Holder, 7, (1_000, w / 2)),
        f(DaemonPause, Aim::Holder, 6, (w + w / 4, 2 * w)),
        f(DaemonRestart, Aim::Holder, 7, (0, 0)),
        f(ProxyBlackhole, Aim::HolderProxy, 10, (2_000, w + w / 2)),
        f(ProxyCut, Aim::HolderProxy, 8, (1_000, w + w / 4)),
        f(ProxySwallow, Aim::HolderWrites, 5, (3_000, w)),
        // Writes refused while everything else works: what a daemon that settles work as done
        // although its write failed is caught by.
        // Short: the reader gives an entry up after ten failed hand-offs (ten nak delays).
        f(StoreFull, Aim::Store, 10, (500, 1_500)),
        f(LeaseDelete, Aim::Lease, 6, (0, 0)),
        f(ProxyLatency, Aim::HolderProxy, 8, (3_000, 2 * w)),
        f(BrokerSlow, Aim::Broker, 6, (3_000, 2 * w)),
    ];
    if cluster {
        out.push(f(NodeKill, Aim::Broker, 16, (2_000, 2 * w)));
        // A node drawn: node 0 is the one the daemons dial (the daemon on the minority side),
        // another leaves it on the majority side.
        out.push(f(Partition, Aim::Broker, 12, (2_000, 2 * w)));
    } else {
        out.push(f(BrokerKill, Aim::Broker, 8, (1_000, w + w / 2)));
        out.push(f(BrokerPause, Aim::Broker, 6, (1_000, w + w / 2)));
    }
    if !standby {
        // A standby host's lane reads its own store; the runner remints the workspace's.
        out.push(f(CredentialExpiry, Aim::Holder, 3, (0, 0)));
        out.push(f(CredentialExpiryReminted, Aim::Holder, 4, (1_000, w / 2)));
    }
    out
}

/// The quiet time between two faults, ms.
pub const FAULT_GAP_MS: (u64, u64) = (2_000, 8_000);
/// How long the nemesis waits for a daemon to serve before it starts the next fault anyway.
pub const SERVING_WAIT_MS: u64 = 30_000;

#[cfg(test)]
mod tests {
    use super::*;

    /// The phases fill the run and keep their floors; a pause drawn "long" outlasts both the
    /// window and the lease TTL, a "short" one neither.
    /// Mutation seen failing: the heal floor dropped (a 1-minute run heals 15 s).
    #[test]
    fn phases_fill_the_run_and_pauses_straddle_the_window() {
        let p = Phases::of(60_000);
        assert_eq!(p.quiet_ms + p.faults_ms + p.heal_ms, 60_000);
        assert!(p.heal_ms >= 20_000 && p.quiet_ms >= 10_000);
        let p = Phases::of(300_000);
        assert_eq!(
            (p.quiet_ms, p.faults_ms, p.heal_ms),
            (45_000, 180_000, 75_000)
        );
        let pauses: Vec<(u64, u64)> = faults(false, false)
            .into_iter()
            .filter(|f| f.kind == FaultKind::DaemonPause)
            .map(|f| f.duration_ms)
            .collect();
        let (shortest_window, longest_window) = (
            BROKER_GONE_WINDOW_MS.min(LEASE_TTL_MS),
            BROKER_GONE_WINDOW_MS.max(LEASE_TTL_MS),
        );
        assert!(pauses.iter().any(|(_, hi)| *hi < shortest_window));
        assert!(pauses.iter().any(|(lo, _)| *lo > longest_window));
        assert!(!faults(false, true)
            .iter()
            .any(|f| f.kind == FaultKind::CredentialExpiry));
        assert!(faults(true, false)
            .iter()
            .any(|f| f.kind == FaultKind::NodeKill));
        // A latency's round trip and a slow broker's stop stay below the ping interval.
        assert!(2 * (LATENCY_BASE_MS.1 + LATENCY_JITTER_MS.1) < PING_INTERVAL_MS);
        assert!(STUTTER_STOP_MS.1 < PING_INTERVAL_MS);
    }
}
