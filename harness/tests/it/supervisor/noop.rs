//! No silent no-ops in `up`: a flag that would do nothing is refused with a line that names it,
//! a registry record of the space replaced from another root is said with both roots, and
//! `--metrics-addr` reaches every daemon `up` starts.

use std::time::Duration;

use cotal_delivery::base::{self, MeshRecord};
use nix::sys::signal::Signal;

use crate::support::up::*;

/// A loopback port nothing listens on (bound, then released).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// On a root whose detached mesh runs, each flag only the `up` starting a mesh uses is refused
/// (exit 2, the usage code) with a line that names it and says how to apply it, and the mesh is
/// left as it was (the same daemon serves); `--metrics-addr` and `--creds-lifetime-secs` are
/// refused while the daemon serves;
/// `--port 0` (any port) and the running broker's own port are not refused. `--demo` with
/// `--detach` is refused by the command line itself (exit 2) on any root.
/// Mutation seen failing: `start_only` left empty by the CLI (`up --demo` on the running mesh
/// says the mesh is already running and exits 0, the demo never runs); the
/// `--creds-lifetime-secs` refusal removed from `refuse_start_only` (exit 0, "already serving").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_a_running_mesh_would_ignore_are_refused_naming_them() {
    let root = tempfile::tempdir().expect("root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let (code, t) = up_at(root.path(), &["--detach", "--demo"]).await;
    assert_eq!(code, Some(2), "--demo with --detach: {t}");
    assert!(
        t.contains("cannot be used with") && t.contains("'--demo'") && t.contains("'--detach'"),
        "{t}"
    );
    assert!(
        !base::broker_pid_path(root.path()).exists(),
        "nothing was started: {t}"
    );

    let mut up = spawn_up(root.path(), &["--detach"], &[]);
    assert_eq!(
        up.wait_exit(COMMAND_BOUND).await.expect("returns").code(),
        Some(0)
    );
    let daemon = base::read_pid(&pid_path(root.path())).expect("record");
    let server = MeshRecord::read(&base::mesh_state_path(root.path()))
        .expect("mesh.json")
        .expect("recorded")
        .server;
    let own_port = server.rsplit(':').next().expect("a port").to_string();

    let refused: &[(&[&str], &str)] = &[
        (&["--demo"], "--demo"),
        (&["--port", "1"], "--port 1"),
        (&["--lease-ttl-secs", "5"], "--lease-ttl-secs"),
        (&["--once"], "--once"),
        (&["--metrics-addr", "127.0.0.1:0"], "--metrics-addr"),
        (&["--creds-lifetime-secs", "60"], "--creds-lifetime-secs"),
    ];
    for (args, named) in refused {
        let (code, t) = up_at(root.path(), args).await;
        assert_eq!(code, Some(2), "up {}: {t}", args.join(" "));
        let line = t
            .lines()
            .find(|l| l.starts_with("✗ up:"))
            .unwrap_or_else(|| panic!("no refusal line: {t}"));
        assert!(line.contains(named), "{line}");
        assert!(line.contains("would do nothing: the mesh at"), "{line}");
        assert!(
            line.contains("cotal-delivery down --space demo --root"),
            "{line}"
        );
        assert_eq!(
            base::read_pid(&pid_path(root.path())),
            Some(daemon),
            "the mesh is left as it was"
        );
    }
    for port in ["0", own_port.as_str()] {
        let (code, t) = up_at(root.path(), &["--port", port]).await;
        assert_eq!(code, Some(0), "--port {port}: {t}");
        assert!(t.contains("already serving space demo"), "{t}");
    }
    let (st, t) = down(root.path(), &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");
}

/// A registry record of the space that names another root is replaced by `up` with a warning
/// naming both roots (and the broker it named), and the record then names this root.
/// Mutation seen failing: the replaced-record warning removed from `record_mesh` (the record is
/// replaced silently).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_record_from_another_root_is_replaced_with_both_roots_named() {
    let root = tempfile::tempdir().expect("root");
    let other = tempfile::tempdir().expect("the other root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let registry = base::registry_path(&root.path().join("home"), &demo());
    MeshRecord {
        space: "demo".into(),
        server: "nats://127.0.0.1:4999".into(),
        root: other.path().to_path_buf(),
        tls_required: false,
        tls_ca: None,
    }
    .write(&registry)
    .expect("plant the other root's record");

    let mut up = spawn_up(root.path(), &["--once"], &[]);
    let st = up.wait_exit(COMMAND_BOUND).await.expect("returns");
    let t = up.transcript();
    assert_eq!(st.code(), Some(0), "{t}");
    let warning = format!(
        "! up: the mesh registry record of space demo named root {} (broker nats://127.0.0.1:4999); it now names root {}",
        other.path().display(),
        root.path().display()
    );
    assert!(t.contains(&warning), "{warning:?} not in:\n{t}");
    let now = MeshRecord::read(&registry).expect("read").expect("record");
    assert_eq!(now.root, root.path(), "the record names this root now");
    // The same root again replaces nothing and says nothing.
    let mut again = spawn_up(root.path(), &["--once"], &[]);
    assert_eq!(
        again
            .wait_exit(COMMAND_BOUND)
            .await
            .expect("returns")
            .code(),
        Some(0)
    );
    assert!(
        !again
            .transcript()
            .contains("mesh registry record of space demo named root"),
        "{}",
        again.transcript()
    );
}

/// `up --detach --metrics-addr ADDR` starts its daemon with it: the daemon's command line
/// carries it and `GET http://ADDR/metrics` answers with the space's series; after the daemon
/// is stopped, a bare `up --metrics-addr ADDR` relaunches it serving metrics there again.
/// Mutation seen failing: `start_daemon` not passing `--metrics-addr` (the daemon's command line
/// has none, and nothing would listen at ADDR).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_passes_metrics_addr_to_the_daemon_it_starts_and_relaunches() {
    let root = tempfile::tempdir().expect("root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // The endpoint answers at once; the space's series once the daemon sampled them.
    let scrape = || async move {
        let deadline = std::time::Instant::now() + COMMAND_BOUND;
        loop {
            let r = delivery_harness::http::get(port, "/metrics", Duration::from_secs(5))
                .await
                .unwrap_or_else(|e| panic!("no metrics at 127.0.0.1:{port}: {e}"));
            assert_eq!(r.status, 200);
            let body = String::from_utf8_lossy(&r.body).into_owned();
            if body.contains("cotal_delivery_lease_held{space=\"demo\"} 1") {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{body}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let mut up = spawn_up(root.path(), &["--detach", "--metrics-addr", &addr], &[]);
    assert_eq!(
        up.wait_exit(COMMAND_BOUND).await.expect("returns").code(),
        Some(0),
        "{}",
        up.transcript()
    );
    let first = base::read_pid(&pid_path(root.path())).expect("record");
    let argv = base::process_argv(first).expect("argv");
    assert!(
        argv.windows(2)
            .any(|w| w[0] == "--metrics-addr" && w[1] == addr),
        "{argv:?}"
    );
    scrape().await;

    signal(first, Signal::SIGTERM);
    until("the daemon stopped", COMMAND_BOUND, || !alive(first)).await;
    let (code, t) = up_at(root.path(), &["--metrics-addr", &addr]).await;
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("relaunching the missing delivery daemon"), "{t}");
    scrape().await;
    let (st, t) = down(root.path(), &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");
}
