//! SIGHUP and SIGUSR1 on the multi-space host, as on a single-space daemon: SIGHUP is not a
//! stop, every lane re-reads its credential; SIGUSR1 reopens the host's log and every lane's
//! space log (logrotate). SIGTERM still closes every lane.

use std::time::Duration;

use crate::support::host::{count_lines, wait_count, HOST_BOUND};
use cotal_delivery::base;
use cotal_delivery::provision::Manifest;
use delivery_harness::rig::mesh::Mesh;
use nix::sys::signal::Signal;

fn send(pid: u32, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).expect("signal");
}

/// A two-lane host: SIGHUP makes each lane say its re-read (both keep serving, the host keeps
/// running); with the host's log and alpha's log renamed, SIGUSR1 puts a new file at each path
/// beginning with its reopen line; SIGTERM then closes both lanes, exit 0, the host's last line
/// in the new host log.
/// Mutations seen failing: the lanes started with `Reread::never()` instead of the host's
/// SIGHUP (no lane says a re-read); the host's own `reopen_on_usr1` not spawned (no new host
/// log at the path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_passes_sighup_to_every_lane_and_reopens_every_log_on_sigusr1() {
    let mesh = Mesh::alpha_beta().await.expect("mesh");
    Manifest {
        spaces: mesh.spaces().to_vec(),
    }
    .write(mesh.root())
    .expect("manifest");
    let mut host = crate::support::start_host(mesh.host(mesh.root()), &["alpha", "beta"]).await;
    send(host.pid(), Signal::SIGHUP);
    for lane in ["alpha", "beta"] {
        wait_count(&host, lane, "received SIGHUP", 1).await;
        assert_eq!(
            count_lines(&host, lane, "holds the credential in use"),
            1,
            "{}",
            host.transcript()
        );
    }
    assert!(host.is_running(), "{}", host.transcript());

    let host_log = cotal_delivery::host::host_log_path(mesh.root());
    let alpha_log = base::log_path(mesh.root(), &mesh.spaces()[0]);
    for p in [&host_log, &alpha_log] {
        std::fs::rename(p, p.with_extension("log.1")).expect("rotate");
    }
    send(host.pid(), Signal::SIGUSR1);
    let deadline = tokio::time::Instant::now() + HOST_BOUND;
    let first = |p: &std::path::Path| {
        std::fs::read_to_string(p).ok().and_then(|t| {
            t.lines()
                .next()
                .map(|l| l.get(25..).unwrap_or(l).to_string())
        })
    };
    loop {
        let (h, a) = (first(&host_log), first(&alpha_log));
        if h.is_some() && a.is_some() {
            assert!(
                h.as_deref().is_some_and(
                    |l| l.starts_with("• delivery host: received SIGUSR1, reopened the log ")
                ),
                "{h:?}"
            );
            assert!(
                a.as_deref().is_some_and(
                    |l| l.starts_with("• delivery: received SIGUSR1, reopened the log ")
                ),
                "{a:?}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no new log at both paths: {h:?} {a:?}\n{}",
            host.transcript()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    host.terminate().expect("SIGTERM");
    let st = host.wait_exit(HOST_BOUND).await.expect("exits");
    assert_eq!(st.code(), Some(0), "{}", host.transcript());
    let text = std::fs::read_to_string(&host_log).expect("host log");
    assert!(
        text.lines().last().is_some_and(|l| l.contains(
            "• delivery host: run ended — exit code 0: stopped by SIGTERM; every lane closed"
        )),
        "{text}"
    );
}
