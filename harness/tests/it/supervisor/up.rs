//! `cotal-delivery up` in the foreground, run as an operator would: it reports the daemon only
//! once it serves; restarts a daemon that dies while the broker it started still runs; leaves
//! stopped a daemon that exited on SIGTERM (the broker keeps running); stops the daemon and
//! exits, restarting nothing, when the broker exits under it; honours a `down` that races a
//! restart; re-signs the standing credentials so the mesh outlives their lifetime; and on Ctrl-C
//! stops the daemon and then the broker, leaving no process behind.

use std::time::Duration;

use crate::support::up::*;
use nix::sys::signal::Signal;

/// SIGKILL → one restart (the two lines of docs/operations.md), serving again under a new pid;
/// Ctrl-C stops everything, removes the credential after the death.
/// Mutation seen failing: the "restarting it" branch of the foreground tick answering
/// `Phase::Stopped` instead of a restart (the line comes, "delivery daemon running again" never).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_up_restarts_a_killed_daemon_and_stops_everything_on_ctrl_c() {
    let root = tempfile::tempdir().expect("root");
    let (mut up, first) = serving_up(root.path(), &["--lease-ttl-secs", "2"], &[]).await;
    let pid_path = pid_path(root.path());
    let broker = broker_pid(root.path());

    // A SIGKILL leaves its lease row until the TTL expires; up restarts it and reports it.
    signal(first, Signal::SIGKILL);
    up.wait_for_line(
        "while nats-server is running - restarting it",
        COMMAND_BOUND,
    )
    .await
    .expect("restart announced");
    up.wait_for_line("delivery daemon running again", COMMAND_BOUND)
        .await
        .expect("replacement serving");
    let second =
        cotal_delivery::base::read_pid(&pid_path).expect("the replacement recorded itself");
    assert_ne!(
        first,
        second,
        "a new daemon process serves: {}",
        up.transcript()
    );
    assert!(alive(second));
    let (code, json) = status_json(root.path()).await;
    assert_eq!(code, 0, "the replacement is healthy: {json}");
    assert_eq!(json["ctlDelivery"]["answers"], true);
    assert_eq!(json["pidRecord"]["pid"], second);

    up.interrupt().expect("Ctrl-C");
    let status = up.wait_exit(COMMAND_BOUND).await.expect("up exits");
    assert_eq!(status.code(), Some(0), "{}", up.transcript());
    let t = up.transcript();
    assert_eq!(count(&t, "restarting it"), 1, "{t}");
    assert!(!alive(second), "the daemon is gone");
    assert!(!alive(broker), "the broker is gone");
    assert!(
        !pid_path.exists(),
        "a cleanly stopped daemon removes its record"
    );
    assert!(
        !creds_path(root.path()).exists(),
        "credential removed after the death"
    );
    let log =
        std::fs::read_to_string(cotal_delivery::base::log_path(root.path(), &demo())).expect("log");
    assert!(
        log.contains("received SIGTERM, exiting"),
        "the daemon's reason:\n{log}"
    );
    let t = t
        .lines()
        .filter(|l| !l.contains("exited (code 6) without serving"))
        .filter(|l| !l.contains("retrying after the lease TTL"))
        .collect::<Vec<_>>()
        .join("\n");
    snapshot!("up_sigkill_restart_then_ctrl_c", t);
}

/// The stamped log's runs of the daemon: `(pid, started ms, ended ms)` from each run's first
/// and last line (`run started — …, pid <n>, …` / `run ended — … (pid <n>)`), in order.
fn runs(log: &str) -> Vec<(u32, i64, Option<i64>)> {
    fn stamp_ms(line: &str) -> i64 {
        // `2026-12-01T15:46:27.370Z …`: seconds of the day are enough within one test.
        let t = &line[11..23];
        let h: i64 = t[0..2].parse().expect("hour");
        let m: i64 = t[3..5].parse().expect("minute");
        let s: i64 = t[6..8].parse().expect("second");
        let ms: i64 = t[9..12].parse().expect("millis");
        ((h * 60 + m) * 60 + s) * 1000 + ms
    }
    let mut out: Vec<(u32, i64, Option<i64>)> = Vec::new();
    for line in log.lines() {
        if line.contains("• delivery: run started — ") {
            out.push((frame_pid(line), stamp_ms(line), None));
        } else if line.contains("• delivery: run ended — ") {
            let pid = frame_pid(line);
            if let Some(run) = out.iter_mut().rev().find(|r| r.0 == pid) {
                run.2 = Some(stamp_ms(line));
            }
        }
    }
    out
}

/// A failed restart is retried after the lease TTL, not at once (shortened to 3 s through
/// `--lease-ttl-secs`, the documented override of the 30 s default): the daemon's credential is
/// made unreadable and the daemon SIGKILLed; up restarts it at once (a daemon that died), that
/// replacement is refused at start (exit 3) and up logs `retrying after the lease TTL (3 s)`;
/// by the log's own stamps each next replacement's run starts no earlier than the TTL after the
/// refused one's run ended.
/// Mutation seen failing: the failed-restart branch of the foreground tick answering
/// `Phase::RetryAt(Instant::now())` instead of `Instant::now() + cfg.lease_ttl` (the next run
/// started 125 ms after the refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_restart_is_retried_after_the_lease_ttl_not_at_once() {
    const TTL_MS: i64 = 3000;
    let root = tempfile::tempdir().expect("root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let (mut up, first) = serving_up(root.path(), &["--lease-ttl-secs", "3"], &[]).await;
    std::fs::write(creds_path(root.path()), "not a credential\n").expect("spoil the credential");
    signal(first, Signal::SIGKILL);
    up.wait_for_line(
        "while nats-server is running - restarting it",
        COMMAND_BOUND,
    )
    .await
    .expect("the immediate restart");
    // Three refused runs: the immediate restart and two retries, two gaps to measure.
    until("three failed restarts", COMMAND_BOUND, || {
        count(&up.transcript(), "retrying after the lease TTL (3 s)") >= 3
    })
    .await;
    let log =
        std::fs::read_to_string(cotal_delivery::base::log_path(root.path(), &demo())).expect("log");
    let runs = runs(&log);
    let killed_run = runs
        .iter()
        .position(|r| r.0 == first)
        .unwrap_or_else(|| panic!("the first daemon's run in:\n{log}"));
    let after: Vec<_> = runs[killed_run + 1..].to_vec();
    assert!(after.len() >= 3, "the restart and two retries:\n{log}");
    assert!(
        log.contains("run ended — exit code 3"),
        "the replacements were refused at start:\n{log}"
    );
    for pair in after.windows(2) {
        let ended = pair[0]
            .2
            .unwrap_or_else(|| panic!("run {} ended:\n{log}", pair[0].0));
        let gap = pair[1].1 - ended;
        assert!(
            gap >= TTL_MS,
            "the retry came {gap} ms after the refusal, before the {TTL_MS} ms TTL:\n{log}"
        );
    }
    up.interrupt().expect("Ctrl-C");
    let status = up.wait_exit(COMMAND_BOUND).await.expect("up exits");
    assert_eq!(status.code(), Some(0), "{}", up.transcript());
}

/// SIGTERM to the daemon → it stays stopped and nats-server keeps running (status: broker
/// reachable, no lease, record absent, exit 1).
/// Mutation seen failing: `stays_stopped` returning false (the daemon is restarted, the "stays
/// stopped" line never comes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_sigtermed_under_up_stays_stopped_and_the_broker_keeps_running() {
    let root = tempfile::tempdir().expect("root");
    let (mut up, daemon) = serving_up(root.path(), &["--lease-ttl-secs", "2"], &[]).await;
    let broker = broker_pid(root.path());
    signal(daemon, Signal::SIGTERM);
    up.wait_for_line("it stays stopped; nats-server keeps running", COMMAND_BOUND)
        .await
        .expect("stays stopped");
    // Past a lease TTL a restart would have happened: the broker still answers, no daemon does.
    let (code, json) = status_json(root.path()).await;
    assert_eq!(code, 1, "{json}");
    assert_eq!(json["broker"]["reachable"], true, "{json}");
    assert_eq!(json["pidRecord"]["verdict"], "absent", "{json}");
    assert_eq!(json["ctlDelivery"]["answers"], false, "{json}");
    let (_, human) = status(root.path(), false).await;
    snapshot!("status_daemon_stopped_broker_up", human);
    assert!(alive(broker), "the broker keeps running");
    assert!(!up.has_line("restarting it"), "{}", up.transcript());
    assert!(up.is_running(), "up keeps running");
    up.interrupt().expect("Ctrl-C");
    let status = up.wait_exit(COMMAND_BOUND).await.expect("up exits");
    assert_eq!(status.code(), Some(0), "{}", up.transcript());
    assert!(!alive(broker));
    snapshot!("up_sigterm_stays_stopped", up.transcript());
}

/// The broker SIGKILLed under up → up stops the daemon with the shared stop, exits non-zero
/// after it, and restarts nothing.
/// Mutation seen failing: the broker check removed from the tick (`broker_exit` always `None`):
/// the daemon exits 9 once the broker is gone, up announces a restart and never exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_killed_under_up_stops_the_daemon_and_up_exits_without_a_restart() {
    let root = tempfile::tempdir().expect("root");
    let (mut up, daemon) = serving_up(root.path(), &["--lease-ttl-secs", "2"], &[]).await;
    signal(broker_pid(root.path()), Signal::SIGKILL);
    let status = up.wait_exit(COMMAND_BOUND).await.expect("up exits");
    let t = up.transcript();
    assert_eq!(status.code(), Some(1), "{t}");
    assert_eq!(count(&t, "restarting it"), 0, "no restart: {t}");
    assert!(!alive(daemon), "the daemon was stopped before up exited");
    let stopped = t
        .find("delivery daemon (pid")
        .expect("the stop is reported");
    let exited = t
        .find("under up; the delivery daemon was stopped")
        .expect("up's last line");
    assert!(stopped < exited, "up exits after the stop:\n{t}");
    snapshot!("up_broker_killed", t);
}

/// `down` lands while up is restarting a SIGKILLed daemon (the replacement still starting, or
/// refused by the predecessor's lease and waiting out the TTL): the daemon stays stopped, up
/// exits 0 once down stopped the broker.
/// Mutation applied and NOT caught: the two `down`-marker checks in `restart` removed (two runs,
/// both "still starting": the replacement down stops exits on its SIGTERM, which stays stopped
/// anyway; and in the between-attempts order down's broker stop ends up's loop before the retry
/// after the lease TTL is due). The marker check is a second guard this black-box test cannot
/// single out; what it proves is the outcome: no replacement serves or outlives down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_racing_a_restart_leaves_the_daemon_stopped() {
    let root = tempfile::tempdir().expect("root");
    let (mut up, first) = serving_up(root.path(), &["--lease-ttl-secs", "3"], &[]).await;
    signal(first, Signal::SIGKILL);
    up.wait_for_line("restarting it", COMMAND_BOUND)
        .await
        .expect("restart");
    let (st, down_t) = down(root.path(), &[]).await;
    assert_eq!(st.code(), Some(0), "{down_t}");
    let status = up.wait_exit(COMMAND_BOUND).await.expect("up exits");
    let t = up.transcript();
    assert_eq!(status.code(), Some(0), "{t}");
    // Which way the race went, proved from the transcripts.
    let starting = down_t.contains("• down: delivery daemon (pid");
    if starting {
        println!("RACE: down stopped a replacement that was still starting");
        assert!(
            t.contains("stopped by down, it stays stopped") || t.contains("not restarting it"),
            "{t}"
        );
    } else {
        println!("RACE: down landed between two restart attempts");
        assert!(down_t.contains("no delivery daemon running"), "{down_t}");
    }
    assert!(!t.contains("running again"), "never served again: {t}");
    if let Some(p) =
        cotal_delivery::base::read_pid(&cotal_delivery::base::launched_path(root.path(), &demo()))
    {
        assert!(!alive(p), "no replacement left running");
    }
    assert!(t.contains("nats-server stopped by down"), "{t}");
}

/// `up`'s windows shortened for the never-serving replacement: a 3 s serving bound, a 1 s grace.
const SHORT_WINDOWS: [(&str, &str); 2] = [
    ("COTAL_DELIVERY_SERVING_BOUND_MS", "3000"),
    ("COTAL_DELIVERY_STOP_GRACE_MS", "1000"),
];

/// A foreground up whose daemon was SIGKILLed and whose replacement is frozen before it could
/// claim the lease (so it never serves); returns up once it printed the not-bound warning, the
/// frozen pid and the warning line. The replacement is proved frozen and never recorded itself.
async fn up_with_a_replacement_that_never_serves(
    root: &std::path::Path,
) -> (delivery_harness::rig::daemon::Daemon, u32, String) {
    let (mut up, first) = serving_up(root, &["--lease-ttl-secs", "2"], &SHORT_WINDOWS).await;
    signal(first, Signal::SIGKILL);
    let frozen = freeze_the_replacement(root, first).await;
    let warning = up
        .wait_for_line("did not serve space demo within 3 s", COMMAND_BOUND)
        .await
        .expect("the not-bound warning");
    assert_eq!(proc_state(frozen), Some('T'), "still frozen");
    assert_ne!(
        cotal_delivery::base::read_pid(&pid_path(root)),
        Some(frozen),
        "frozen before it claimed the lease"
    );
    assert!(up.is_running(), "{}", up.transcript());
    assert!(!up.has_line("running again"), "{}", up.transcript());
    (up, frozen, warning)
}

/// A replacement that never serves gets the not-bound warning once the serving bound has passed
/// (`COTAL_DELIVERY_SERVING_BOUND_MS`, 3 s here), and up keeps answering: Ctrl-C stops the frozen
/// replacement with the shared stop (SIGKILL after the 1 s grace, credential removed after the
/// death), then the broker, and up exits 0.
/// Mutations seen failing: the warning branch removed from the foreground tick (no warning
/// line); the tick waiting for the replacement to serve (a `while !serving` loop in place of the
/// one bounded look: Ctrl-C is never acted on and up does not exit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_that_never_serves_is_warned_about_and_ctrl_c_still_stops_it() {
    let root = tempfile::tempdir().expect("root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let (mut up, frozen, warning) = up_with_a_replacement_that_never_serves(root.path()).await;
    snapshot!("up_replacement_not_bound", warning);
    let broker = broker_pid(root.path());
    up.interrupt().expect("Ctrl-C");
    let status = up.wait_exit(COMMAND_BOUND).await.expect("up exits");
    let t = up.transcript();
    assert_eq!(status.code(), Some(0), "{t}");
    assert!(
        t.contains("did not exit 1000 ms after SIGTERM - sent SIGKILL"),
        "{t}"
    );
    assert!(!alive(frozen), "the frozen replacement is gone");
    assert!(!alive(broker), "the broker is gone");
    assert!(
        !creds_path(root.path()).exists(),
        "credential removed after the death"
    );
    assert_eq!(count(&t, "restarting it"), 1, "{t}");
}

/// The same never-serving replacement, stopped by `down` instead: down SIGKILLs it after the
/// grace, then stops the broker; up sees the down, restarts nothing and exits 0.
/// Mutation seen failing: the tick waiting for the replacement to serve (as above: up never sees
/// the down and does not exit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_that_never_serves_does_not_block_down() {
    let root = tempfile::tempdir().expect("root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let (mut up, frozen, _) = up_with_a_replacement_that_never_serves(root.path()).await;
    let (st, down_t) = down(root.path(), &SHORT_WINDOWS).await;
    assert_eq!(st.code(), Some(0), "{down_t}");
    assert!(down_t.contains("sent SIGKILL"), "{down_t}");
    assert!(!alive(frozen), "the frozen replacement is gone");
    let status = up.wait_exit(COMMAND_BOUND).await.expect("up exits");
    let t = up.transcript();
    assert_eq!(status.code(), Some(0), "{t}");
    assert!(t.contains("nats-server stopped by down"), "{t}");
    assert_eq!(count(&t, "restarting it"), 1, "{t}");
    assert!(!t.contains("running again"), "{t}");
}

/// A mesh under up with 12 s credentials runs past that lifetime: up re-signs them with a
/// preflight and the daemon adopts them; the same daemon still serves after the first expiry.
/// Mutation seen failing: `RenewalOwner::spawn` not called (no renewal line; the daemon exits 10
/// at the expiry and every restart is refused by the broker for the expired credential).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesh_under_up_outlives_the_credential_lifetime() {
    let root = tempfile::tempdir().expect("root");
    let (mut up, daemon) = serving_up(
        root.path(),
        &["--creds-lifetime-secs", "12"],
        &[("COTAL_DELIVERY_BROKER_GONE_MS", "2000")],
    )
    .await;
    let first = cotal_delivery::base::read_creds_file(&creds_path(root.path()))
        .expect("creds")
        .claims()
        .expect("claims");
    let first_exp = first.exp.expect("a bounded credential");
    up.wait_for_line("re-signed and adopted", COMMAND_BOUND)
        .await
        .expect("renewed");
    // Wait until the first credential is 4 s past its expiry, then judge.
    let past = std::time::UNIX_EPOCH + Duration::from_secs((first_exp + 4) as u64);
    until("first credential long expired", COMMAND_BOUND, || {
        std::time::SystemTime::now() > past
    })
    .await;
    let (code, json) = status_json(root.path()).await;
    assert_eq!(code, 0, "{json}\n{}", up.transcript());
    assert_eq!(
        json["pidRecord"]["pid"], daemon,
        "the same daemon still serves"
    );
    assert!(json["credential"]["expires"].as_i64().expect("exp") > first_exp);
    assert!(!up.has_line("restarting it"), "{}", up.transcript());
    up.interrupt().expect("Ctrl-C");
    let status = up.wait_exit(COMMAND_BOUND).await.expect("up exits");
    assert_eq!(status.code(), Some(0), "{}", up.transcript());
}

/// The README's main job: `up --demo --once` shows a durable post reach an agent that was offline
/// when it was posted, then stops cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_job_delivers_a_durable_post_to_an_agent_that_was_offline() {
    let root = tempfile::tempdir().expect("root");
    let mut up = spawn_up(root.path(), &["--demo", "--once"], &[]);
    let status = up.wait_exit(COMMAND_BOUND).await.expect("up exits");
    assert_eq!(status.code(), Some(0), "{}", up.transcript());
    let t = up.transcript();
    for line in [
        "✓ delivery daemon serving space demo",
        "• demo: bob joined general durably (generation 1",
        "• demo: bob goes offline",
        "while bob is offline",
        "(1 pending, checked on the broker)",
        "✓ demo: bob surfaced [general] alice: hello bob - this was posted while you were offline",
        "• up: nats-server (pid",
    ] {
        assert!(t.contains(line), "missing {line:?} in:\n{t}");
    }
    let a = t.find("bob goes offline").expect("offline");
    let b = t.find("alice posts").expect("post");
    let c = t.find("bob surfaced").expect("surfaced");
    assert!(a < b && b < c, "offline, then posted, then surfaced:\n{t}");
}
