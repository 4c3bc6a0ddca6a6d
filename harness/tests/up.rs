//! `cotal-delivery up` in the foreground, run as an operator would: it reports the daemon only
//! once it serves, restarts a daemon that dies while the broker it started still runs, and on
//! Ctrl-C stops the daemon and then the broker, leaving no process behind.

use std::time::Duration;

use cotal_delivery::files::{self, process_alive};
use cotal_delivery::wire::Space;
use delivery_harness::daemon::DaemonSpec;
use delivery_harness::nats_server_bin;

const BOUND: Duration = Duration::from_secs(60);

/// `cotal-delivery up --space demo --root <root> --port 0 <extra…>` as an operator types it.
fn spawn_up(root: &std::path::Path, extra: &[&str]) -> delivery_harness::daemon::Daemon {
    let bin = nats_server_bin().expect("nats-server");
    let root_arg = root.to_str().expect("utf-8 path");
    let mut args = vec!["up", "--space", "demo", "--root", root_arg, "--port", "0"];
    args.extend_from_slice(extra);
    DaemonSpec::command(&args, root)
        .env("NATS_SERVER_BIN", bin.display().to_string())
        .spawn()
        .expect("spawn up")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_up_restarts_a_killed_daemon_and_stops_everything_on_ctrl_c() {
    let root = tempfile::tempdir().expect("root");
    let mut up = spawn_up(root.path(), &["--lease-ttl-secs", "2"]);
    up.wait_for_line("delivery daemon serving space demo", BOUND)
        .await
        .expect("serving");
    let space = Space::parse("demo").expect("space");
    let pid_path = files::pid_path(root.path(), &space);
    let first = files::read_pid(&pid_path).expect("the daemon recorded itself");
    let broker_pid = files::read_pid(&root.path().join(".cotal/nats.pid")).expect("broker pid");

    // A SIGKILL leaves its lease row until the TTL expires; up restarts it and reports it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the daemon");
    up.wait_for_line("while nats-server is running - restarting it", BOUND)
        .await
        .expect("restart announced");
    up.wait_for_line("delivery daemon running again", BOUND)
        .await
        .expect("replacement serving");
    let second = files::read_pid(&pid_path).expect("the replacement recorded itself");
    assert_ne!(
        first,
        second,
        "a new daemon process serves: {}",
        up.transcript()
    );
    assert!(process_alive(second));

    up.interrupt().expect("Ctrl-C");
    let status = up.wait_exit(BOUND).await.expect("up exits");
    assert_eq!(status.code(), Some(0), "{}", up.transcript());
    assert!(up.has_line("delivery daemon stopped") && up.has_line("nats-server stopped"));
    assert!(!process_alive(second), "the daemon is gone");
    assert!(!process_alive(broker_pid), "the broker is gone");
    assert!(
        !pid_path.exists(),
        "a cleanly stopped daemon removes its record"
    );
    let log = std::fs::read_to_string(files::log_path(root.path(), &space)).expect("log");
    assert!(
        log.contains("received SIGTERM, exiting"),
        "the daemon's reason is in its log:\n{log}"
    );
}

/// The README's main job: `up --demo --once` shows a durable post reach an agent that was offline
/// when it was posted, then stops cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_job_delivers_a_durable_post_to_an_agent_that_was_offline() {
    let root = tempfile::tempdir().expect("root");
    let mut up = spawn_up(root.path(), &["--demo", "--once"]);
    let status = up.wait_exit(BOUND).await.expect("up exits");
    assert_eq!(status.code(), Some(0), "{}", up.transcript());
    let t = up.transcript();
    for line in [
        "✓ delivery daemon serving space demo",
        "• demo: bob joined general durably (generation 1",
        "• demo: bob goes offline",
        "while bob is offline",
        "(1 pending, checked on the broker)",
        "✓ demo: bob surfaced [general] alice: hello bob - this was posted while you were offline",
        "• nats-server stopped",
    ] {
        assert!(t.contains(line), "missing {line:?} in:\n{t}");
    }
    let a = t.find("bob goes offline").expect("offline");
    let b = t.find("alice posts").expect("post");
    let c = t.find("bob surfaced").expect("surfaced");
    assert!(a < b && b < c, "offline, then posted, then surfaced:\n{t}");
}
