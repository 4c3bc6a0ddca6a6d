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

    let (_up, daemon) = detached_up(root.path(), &[], &[]).await;
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
            let r = delivery_harness::rig::http::get(port, "/metrics", Duration::from_secs(5))
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
    let (_up, first) = detached_up(root.path(), &["--metrics-addr", &addr], &[]).await;
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

/// `up` for a space the running mesh's signer has no account for (a mesh started for `demo`,
/// then `up --space other` at the same root, as an operator types it) is refused (exit 1)
/// before anything is touched: no renewal owner for `other`, the `demo` daemon still serving.
/// The line names only commands of this distribution, and the one it says to run works: `up
/// --space other` at a root of its own serves. `status --space other` at the first root says
/// the signer holds `demo` only and names the command that adds a space. Snapshot of both. The
/// mesh's own space, its account file removed: a bare `up` still says its daemon serves, and
/// once that daemon is missing is refused naming the restart (`down`, then `up`), which serves
/// again.
/// Mutations seen failing: `refuse_unknown_space` not called by `relaunch` (the refusal is the
/// library's line, a renewal owner for `other` is started); the signer's old text
/// `(add_space first)` restored in `MeshAuthority::account` (the status line asserted below);
/// the own-space branch of `refuse_unknown_space` never taken (the line tells to serve demo
/// from another root); the serving daemon's early return removed from it (the bare `up`
/// while demo's daemon serves is refused, exit 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_for_a_space_the_running_mesh_lacks_names_the_commands_to_run() {
    let root = tempfile::tempdir().expect("root");
    let own = tempfile::tempdir().expect("the other space's own root");
    let other = cotal_delivery::wire::Space::parse("other").expect("space");
    let _guard = MeshGuard(root.path().to_path_buf());
    let _stray = MeshGuardOf(root.path().to_path_buf(), other.clone());
    let _own = MeshGuardOf(own.path().to_path_buf(), other.clone());
    let r = root.path().to_str().expect("utf-8");
    let (_up, daemon) = detached_up(root.path(), &[], &[]).await;

    let (st, t) = run(root.path(), &["up", "--space", "other", "--root", r], &[]).await;
    assert_eq!(st.code(), Some(1), "{t}");
    let line = names_only_commands(root.path(), &t).await;
    assert!(
        line.contains("has no account for space other: a running broker takes no new space"),
        "{line}"
    );
    assert!(
        base::read_pid(&base::remint_pid_path(root.path(), &other)).is_none(),
        "no renewal owner was started for other: {t}"
    );
    assert_eq!(
        base::read_pid(&pid_path(root.path())),
        Some(daemon),
        "the mesh is left as it was"
    );
    assert!(alive(daemon));

    let (st, status) = run(
        root.path(),
        &["status", "--space", "other", "--root", r],
        &[],
    )
    .await;
    assert_eq!(st.code(), Some(1), "{status}");
    let broker = status
        .lines()
        .find(|l| l.starts_with("broker:"))
        .unwrap_or_else(|| panic!("no broker line: {status}"));
    assert!(
        broker.ends_with("(mesh signer: space \"other\" has no data account in this signer (it holds \"demo\"); `cotal-delivery up --space other` adds it when it starts a mesh)"),
        "{broker}"
    );
    snapshot!(
        "up_another_space_on_a_running_mesh",
        format!("{t}\n{broker}\n")
    );

    // What the line says to run, run: the other space served from a root of its own.
    let o = own.path().to_str().expect("utf-8");
    let (st, t) = run(
        own.path(),
        &[
            "up", "--space", "other", "--root", o, "--port", "0", "--detach",
        ],
        &[],
    )
    .await;
    assert_eq!(st.code(), Some(0), "{t}");
    assert!(t.contains("✓ delivery daemon serving space other"), "{t}");
    let (st, t) = run(own.path(), &["down", "--space", "other", "--root", o], &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");

    // The mesh's own space, its account gone from the signer and its daemon missing: a bare
    // `up` is refused the same way, and the restart it names serves again.
    let auth = cotal_delivery::provision::Workspace::new(root.path()).auth_dir();
    let accounts: Vec<_> = std::fs::read_dir(&auth)
        .expect("the signer")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("account.") && name.ends_with(".json")
        })
        .collect();
    assert_eq!(accounts.len(), 1, "demo's account only: {accounts:?}");
    std::fs::remove_file(&accounts[0]).expect("remove the account file");
    // While its daemon serves, a bare `up` needs nothing of the signer.
    let (code, t) = up_at(root.path(), &[]).await;
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("already serving space demo"), "{t}");
    signal(daemon, Signal::SIGTERM);
    until("the daemon stopped", COMMAND_BOUND, || !alive(daemon)).await;
    let (code, t) = up_at(root.path(), &[]).await;
    assert_eq!(code, Some(1), "{t}");
    let line = names_only_commands(root.path(), &t).await;
    assert!(
        line.contains("was started for space demo, but its signer")
            && line.contains("no longer holds the space's account; start the mesh again: cotal-delivery down --space demo --root"),
        "{line}"
    );
    let (st, t) = down(root.path(), &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");
    let (_up, _) = detached_up(root.path(), &[], &[]).await;
    let (st, t) = down(root.path(), &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");
}

/// The `✗ up:` line of `transcript`, asserted to name no library function and only commands
/// `cotal-delivery --help` lists.
async fn names_only_commands(root: &std::path::Path, transcript: &str) -> String {
    let line = transcript
        .lines()
        .find(|l| l.starts_with("✗ up:"))
        .unwrap_or_else(|| panic!("no refusal line: {transcript}"));
    assert!(
        !line.contains("add_space") && !line.contains("first)"),
        "{line}"
    );
    let (_, help) = run(root, &["--help"], &[]).await;
    let named: Vec<&str> = line
        .split("cotal-delivery ")
        .skip(1)
        .map(|rest| rest.split_whitespace().next().expect("a command"))
        .collect();
    assert!(!named.is_empty(), "the line names no command: {line}");
    for command in &named {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{command} "))),
            "`cotal-delivery {command}` is not a command:\n{help}"
        );
    }
    line.to_string()
}
