//! The broker-gone watchdog against real brokers and real faults (issue 5, "Must show").
//!
//! Windows are shrunk through the documented overrides (docs/operations.md)
//! (`COTAL_DELIVERY_BROKER_GONE_MS`, `..._BACKSTOP_MS`, `COTAL_DELIVERY_PING_INTERVAL_MS`);
//! measured delays are printed as `MEASURED …` lines (run with `--nocapture` to see them).

use std::time::{Duration, Instant};

use crate::support::BOUND;
use delivery_harness::daemon::Daemon;
use delivery_harness::mesh::Mesh;
use delivery_harness::proxy::TcpProxy;

use crate::support::data_path::mesh;
use crate::support::health::{measured, own_lines, total_connections, wait_started};

const UP: &str = "delivery daemon up";
const LOST: &str = "broker connection unavailable, reconnecting";
const RESTORED: &str = "broker connection restored";
const GONE: &str = "✗ delivery: broker connection unavailable (broker unreachable), exiting (coupled to the broker)";
const BACKSTOP: &str = "✗ delivery: broker connection unavailable past backstop (broker unreachable), exiting (coupled to the broker)";
/// Slack on every upper bound, on top of what the configured window, backstop and ping interval
/// already explain: two 250 ms evaluation ticks, the exit and its reaping by the harness
/// (polled), and scheduling on two cores that other builds and tests keep busy.
const MARGIN: Duration = Duration::from_millis(2_500);
/// The window these tests configure (`COTAL_DELIVERY_BROKER_GONE_MS`).
const WINDOW: Duration = Duration::from_millis(1_500);
/// The ping interval these tests configure (`COTAL_DELIVERY_PING_INTERVAL_MS`).
const PING: Duration = Duration::from_millis(500);
/// The backstop of [`blackhole_with_repeated_stalls_ends_at_the_backstop`].
const BACKSTOP_AFTER: Duration = Duration::from_millis(6_000);
/// How long each freeze of that test lasts.
const FROZEN: Duration = Duration::from_millis(1_500);

fn ms(d: Duration) -> String {
    d.as_millis().to_string()
}

fn exit_code(status: std::process::ExitStatus) -> Option<i32> {
    status.code()
}

/// The daemon dials through `proxy` instead of the broker.
fn via_proxy(mesh: &Mesh, proxy: &TcpProxy) -> delivery_harness::daemon::DaemonSpec {
    delivery_harness::daemon::DaemonSpec::deliver(mesh.space().as_str(), mesh.root())
        .server(&proxy.url())
}

/// Up and done starting (its lease watch bound, judged from the broker).
async fn up(mesh: &Mesh, d: &mut Daemon) {
    d.wait_for_line(UP, BOUND).await.expect("daemon up");
    wait_started(mesh, mesh.space(), BOUND).await;
    // The timer writer's own connection is dialed once start-up completes.
    d.wait_for_line("timer writer up", BOUND)
        .await
        .expect("timer writer up");
}

/// Healthy, the watchdog opens no connection of its own: observed for three ping intervals
/// (a probe per interval or per missed ping would show), read from the broker's `/varz`, where a
/// failed read fails the test instead of reading as 0 (mutation caught: `/varz` read through a
/// wrong path made the old `unwrap_or(0)` compare 0 with 0 and pass). Then the broker is killed
/// and the daemon exits after the window, within the window plus [`MARGIN`].
#[tokio::test]
async fn broker_sigkill_exits_after_the_window_and_healthy_makes_no_connections() {
    let mut mesh = mesh().await;
    let space = mesh.space().clone();
    let mut d = mesh
        .deliver(&space)
        .env("COTAL_DELIVERY_BROKER_GONE_MS", ms(WINDOW))
        .env("COTAL_DELIVERY_PING_INTERVAL_MS", ms(PING))
        .spawn()
        .expect("spawn");
    up(&mesh, &mut d).await;
    // Healthy: no probe connections at all, over more than two ping intervals.
    let observed = PING * 3 + Duration::from_millis(100);
    let before = total_connections(&mesh).await;
    tokio::time::sleep(observed).await;
    let after = total_connections(&mesh).await;
    println!(
        "MEASURED healthy {} ms (ping {} ms): total_connections {before} -> {after}",
        observed.as_millis(),
        PING.as_millis()
    );
    assert!(before > 0, "the daemon's own connection is counted");
    assert_eq!(after, before, "no extra broker connections while healthy");
    assert!(d.is_running(), "{}", d.transcript());

    let killed = Instant::now();
    mesh.broker.kill().expect("kill broker");
    let status = d.wait_exit(BOUND).await.expect("daemon exits");
    let delay = killed.elapsed();
    measured("broker SIGKILL -> daemon exit (window 1500 ms)", delay);
    assert_eq!(exit_code(status), Some(9), "{}", d.transcript());
    assert!(d.has_line(GONE), "{}", d.transcript());
    assert!(delay >= WINDOW, "{delay:?}");
    assert!(delay < WINDOW + MARGIN, "{delay:?}");
    snapshot!("health_broker_sigkill", own_lines(&d.transcript()));
}

#[tokio::test]
async fn broker_sigstop_starts_the_clock_only_after_pings_fail() {
    let mut mesh = mesh().await;
    let space = mesh.space().clone();
    let mut d = mesh
        .deliver(&space)
        .env("COTAL_DELIVERY_BROKER_GONE_MS", "1500")
        .env("COTAL_DELIVERY_PING_INTERVAL_MS", "500")
        .spawn()
        .expect("spawn");
    up(&mesh, &mut d).await;
    let frozen = Instant::now();
    mesh.broker.freeze().expect("freeze broker");
    d.wait_for_line(LOST, BOUND).await.expect("pings fail");
    let detected = frozen.elapsed();
    let status = d.wait_exit(BOUND).await.expect("daemon exits");
    let total = frozen.elapsed();
    let _ = mesh.broker.thaw();
    measured(
        "broker SIGSTOP -> disconnect seen (ping 500 ms, 2 out)",
        detected,
    );
    measured("broker SIGSTOP -> daemon exit (window 1500 ms)", total);
    measured("disconnect seen -> daemon exit", total - detected);
    assert_eq!(exit_code(status), Some(9), "{}", d.transcript());
    assert!(d.has_line(GONE));
    // The socket stayed open: the clock started only once two pings went unanswered.
    assert!(detected >= Duration::from_millis(1_000), "{detected:?}");
    assert!(
        total - detected >= Duration::from_millis(1_400),
        "{total:?}"
    );
    assert!(total >= Duration::from_millis(2_500), "{total:?}");
    snapshot!("health_broker_sigstop", own_lines(&d.transcript()));
}

#[tokio::test]
async fn daemon_frozen_past_the_window_is_credited_and_survives() {
    let mesh = mesh().await;
    let space = mesh.space().clone();
    let proxy = TcpProxy::start(mesh.broker.port()).await.expect("proxy");
    let mut d = via_proxy(&mesh, &proxy)
        .env("COTAL_DELIVERY_BROKER_GONE_MS", "1500")
        .spawn()
        .expect("spawn");
    up(&mesh, &mut d).await;
    // The broker path goes away with a close: the clock starts at once.
    proxy.blackhole_new();
    proxy.cut_established();
    d.wait_for_line(LOST, BOUND).await.expect("disconnect");
    // The host starves the daemon for twice the window.
    d.freeze().expect("freeze daemon");
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    proxy.heal();
    let thawed = Instant::now();
    d.thaw().expect("thaw daemon");
    d.wait_for_line(RESTORED, BOUND)
        .await
        .expect("reconnects instead of exiting");
    measured("thaw -> connection restored", thawed.elapsed());
    // Well past another window: still serving, still holding its lease.
    assert!(
        d.wait_exit(Duration::from_millis(2_500)).await.is_err(),
        "the daemon exited: {}",
        d.transcript()
    );
    assert!(!d.has_line(GONE) && !d.has_line(BACKSTOP));
    let insp = mesh.inspector(&space).await.expect("inspector");
    assert!(insp.lease().await.expect("lease").is_some());
    snapshot!("health_daemon_frozen", own_lines(&d.transcript()));
}

/// Ends at the backstop, never at the window, within the backstop plus one freeze plus
/// [`MARGIN`]. Mutation caught: stall credit applied to the backstop too (`elapsed - starved >=
/// backstop` in `TransportHealth::verdict`): the daemon then exits at the window instead.
#[tokio::test]
async fn blackhole_with_repeated_stalls_ends_at_the_backstop() {
    let mesh = mesh().await;
    let proxy = TcpProxy::start(mesh.broker.port()).await.expect("proxy");
    let mut d = via_proxy(&mesh, &proxy)
        .env("COTAL_DELIVERY_BROKER_GONE_MS", "2000")
        .env("COTAL_DELIVERY_BROKER_GONE_BACKSTOP_MS", ms(BACKSTOP_AFTER))
        .env("COTAL_DELIVERY_PING_INTERVAL_MS", ms(PING))
        .spawn()
        .expect("spawn");
    up(&mesh, &mut d).await;
    proxy.blackhole();
    d.wait_for_line(LOST, BOUND).await.expect("pings fail");
    let lost = Instant::now();
    // Freeze 1.5 s, run 0.1 s, over and over: stall credit keeps deferring the window.
    let mut cycles = 0;
    let status = loop {
        d.freeze().expect("freeze");
        tokio::time::sleep(FROZEN).await;
        d.thaw().expect("thaw");
        cycles += 1;
        if let Ok(s) = d.wait_exit(Duration::from_millis(100)).await {
            break s;
        }
        assert!(lost.elapsed() < BOUND, "{}", d.transcript());
    };
    let delay = lost.elapsed();
    measured(
        "disconnect -> backstop exit (window 2000, backstop 6000)",
        delay,
    );
    println!("MEASURED freeze cycles: {cycles}");
    if let Some(l) = d
        .lines()
        .into_iter()
        .find(|l| l.contains("credited as this process"))
    {
        println!("MEASURED daemon says: {l}");
    }
    assert_eq!(exit_code(status), Some(9), "{}", d.transcript());
    assert!(d.has_line(BACKSTOP), "{}", d.transcript());
    assert!(!d.has_line(GONE), "{}", d.transcript());
    assert!(delay >= BACKSTOP_AFTER, "{delay:?}");
    // The backstop can fall inside a freeze: the exit then waits for the thaw.
    assert!(delay < BACKSTOP_AFTER + FROZEN + MARGIN, "{delay:?}");
    snapshot!("health_backstop_under_stalls", own_lines(&d.transcript()));
}

/// The window is measured from the disconnect the failed pings prove; the upper bound is that
/// window plus [`MARGIN`], derived from the configured values instead of a fixed figure.
#[tokio::test]
async fn blackhole_without_stall_exits_at_the_window() {
    let mesh = mesh().await;
    let proxy = TcpProxy::start(mesh.broker.port()).await.expect("proxy");
    let mut d = via_proxy(&mesh, &proxy)
        .env("COTAL_DELIVERY_BROKER_GONE_MS", ms(WINDOW))
        .env("COTAL_DELIVERY_PING_INTERVAL_MS", ms(PING))
        .spawn()
        .expect("spawn");
    up(&mesh, &mut d).await;
    let holed = Instant::now();
    proxy.blackhole();
    d.wait_for_line(LOST, BOUND).await.expect("pings fail");
    let detected = holed.elapsed();
    let status = d.wait_exit(BOUND).await.expect("exit");
    let total = holed.elapsed();
    measured("blackhole -> disconnect seen (ping 500 ms)", detected);
    measured("blackhole -> window exit (window 1500 ms)", total);
    assert_eq!(exit_code(status), Some(9), "{}", d.transcript());
    assert!(d.has_line(GONE) && !d.has_line(BACKSTOP));
    assert!(
        total - detected >= WINDOW - Duration::from_millis(100),
        "{total:?}"
    );
    assert!(
        total - detected < WINDOW + MARGIN,
        "{total:?} {}",
        d.transcript()
    );
    snapshot!("health_blackhole_window", own_lines(&d.transcript()));
}

/// The window this test configures: long enough that a renew at the short lease TTL's half
/// fails inside it (the renew tick lands while the broker is gone).
const RENEWING_WINDOW: Duration = Duration::from_millis(3_000);
/// The bound on the exit after the window (issue 5's "window + 0.5 s").
const AT_THE_WINDOW: Duration = Duration::from_millis(500);

/// The broker SIGKILLed while the daemon renews its lease every second (2 s TTL): at the window
/// it logs the broker-gone line (docs/operations.md) and exits 9, with no lease re-check or release
/// against the broker that is gone after the verdict and without the host's hard-exit fallback; the
/// exit is within the window plus 0.5 s of the kill.
/// Mutation seen failing: the serve loop's handlers not raced against the verdict (the renew
/// tick's arbitration runs on: `stopped serving … re-checks who owns the lease` after the
/// verdict, then `the run loop did not exit within 2000 ms of the verdict`, exit 5.3 s after the
/// kill).
#[tokio::test]
async fn broker_sigkill_during_renewals_exits_at_the_window_without_rechecking_the_lease() {
    let mut mesh = Mesh::demo_builder()
        .expect("builder")
        .lease_ttl(Duration::from_secs(2))
        .start()
        .await
        .expect("mesh");
    let space = mesh.space().clone();
    let mut d = mesh
        .deliver(&space)
        .env("COTAL_DELIVERY_BROKER_GONE_MS", ms(RENEWING_WINDOW))
        .env("COTAL_DELIVERY_PING_INTERVAL_MS", ms(PING))
        .spawn()
        .expect("spawn");
    up(&mesh, &mut d).await;
    let killed = Instant::now();
    mesh.broker.kill().expect("kill broker");
    let status = d.wait_exit(BOUND).await.expect("daemon exits");
    let delay = killed.elapsed();
    measured(
        "broker SIGKILL -> daemon exit (window 3000 ms, TTL 2 s)",
        delay,
    );
    let t = d.transcript();
    assert_eq!(exit_code(status), Some(9), "{t}");
    let verdict = t
        .find(GONE)
        .unwrap_or_else(|| panic!("no verdict line:\n{t}"));
    let after = &t[verdict..];
    for never in [
        "re-checks who owns the lease",
        "release",
        "run loop did not exit",
    ] {
        assert!(!after.contains(never), "{never:?} after the verdict:\n{t}");
    }
    assert!(delay >= RENEWING_WINDOW, "{delay:?}");
    assert!(delay < RENEWING_WINDOW + AT_THE_WINDOW, "{delay:?}\n{t}");
}
