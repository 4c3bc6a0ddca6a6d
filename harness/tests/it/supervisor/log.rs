//! The daemon's log, `.cotal/delivery.<key>.log`, read as an operator reads it in an incident:
//! every line stamped, whichever way the daemon was started; each run framed by a first line
//! naming what ran and a last line naming its exit code and why; under detached `up`, whatever
//! else the daemon writes on stderr lands there too.

use std::path::Path;

use crate::support::up::*;
use cotal_delivery::base;

/// `YYYY-MM-DDTHH:MM:SS.mmmZ ` (RFC 3339, UTC) at the start of a log line.
fn stamped(line: &str) -> bool {
    let b = line.as_bytes();
    let digits = |r: std::ops::Range<usize>| r.into_iter().all(|i| b[i].is_ascii_digit());
    b.len() > 25
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..23)
        && &line[23..25] == "Z "
}

fn log(root: &Path) -> String {
    std::fs::read_to_string(base::log_path(root, &demo())).unwrap_or_default()
}

/// The log's lines without their timestamps.
fn bodies(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.get(25..).unwrap_or(l).to_string())
        .collect()
}

/// A detached mesh with `RUST_LOG` set, a daemon typed by hand from the root (no `--root`: the
/// nearest `.cotal/`) that is refused by the live lease, then `down`: every line of the log
/// begins with an RFC 3339 UTC timestamp; the file begins with a run's first line (version,
/// build id, pid, space, root, broker) and each run that exited ends with its exit code and
/// reason (0 for the SIGTERMed detached daemon, 6 for the refused one); a `RUST_LOG` diagnostic,
/// which only the daemon's stderr carries, is in the file, stamped.
/// Mutations seen failing: `stamp_stderr` returning `None` (the journal's lines and the
/// diagnostics land unstamped: the first unstamped line is named); up's daemon spawned with its
/// stderr on `/dev/null` instead of the log (no diagnostic in the file: the redirect is what
/// puts it there, the journal writes its own lines itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_of_the_daemon_log_is_stamped_and_each_run_is_framed() {
    let root = tempfile::tempdir().expect("root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let diagnostics = [("RUST_LOG", "cotal_delivery::plane::cache=info")];
    let (_up, detached) = detached_up(root.path(), &[], &diagnostics).await;
    // The side components are up: nothing more is written by the detached daemon until down.
    until(
        "the detached daemon's components are up",
        COMMAND_BOUND,
        || {
            let l = log(root.path());
            l.contains("timer writer up") && l.contains("membership feed up")
        },
    )
    .await;

    // Typed by hand in the root, as an operator would: refused by the live lease.
    let (st, typed) = run(root.path(), &["deliver", "--space", "demo"], &[]).await;
    assert_eq!(st.code(), Some(6), "{typed}");
    let (st, t) = down(root.path(), &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");

    let text = log(root.path());
    if let Some(bad) = text.lines().find(|l| !stamped(l)) {
        panic!("an unstamped line {bad:?} in:\n{text}");
    }
    let lines = bodies(&text);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("INFO cotal_delivery::plane::cache")),
        "the RUST_LOG diagnostic (stderr only) is in the log:\n{text}"
    );
    let first = &lines[0];
    for part in [
        "• delivery: run started — cotal-delivery ",
        env!("CARGO_PKG_VERSION"),
        cotal_delivery::BUILD_ID,
        &format!("pid {detached}"),
        "space demo",
        &format!("root {}", root.path().display()),
        "broker nats://127.0.0.1:",
    ] {
        assert!(
            first.contains(part),
            "{part:?} not in the first line {first:?}"
        );
    }
    let started: Vec<u32> = lines
        .iter()
        .filter(|l| l.contains("run started"))
        .map(|l| frame_pid(l))
        .collect();
    let ended: Vec<(u32, &String)> = lines
        .iter()
        .filter(|l| l.contains("run ended"))
        .map(|l| (frame_pid(l), l))
        .collect();
    assert_eq!(started.len(), 2, "{text}");
    assert_eq!(started[0], detached);
    let typed_pid = started[1];
    let end_of = |pid: u32| {
        ended
            .iter()
            .find(|(p, _)| *p == pid)
            .map(|(_, l)| l.as_str())
            .unwrap_or_else(|| panic!("no last line for pid {pid}:\n{text}"))
    };
    assert!(
        end_of(typed_pid).contains("exit code 6: refused at start: delivery: a live lease"),
        "{text}"
    );
    assert!(
        end_of(detached).contains("exit code 0: stopped by SIGTERM; the lease was released"),
        "{text}"
    );
    assert_eq!(lines.last(), Some(&end_of(detached).to_string()), "{text}");
    let judged: Vec<String> = lines
        .into_iter()
        .filter(|l| !l.contains(" INFO "))
        // Their order beside each other depends on scheduling; they were awaited above.
        .filter(|l| !delivery_harness::rig::daemon::is_component_line(l))
        .map(|l| {
            l.replace(&typed_pid.to_string(), "[TYPED PID]")
                .replace(&detached.to_string(), "[DETACHED PID]")
        })
        .collect();
    snapshot!("daemon_log_framed", judged.join("\n"));
}

fn send(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).expect("signal");
}

/// Logrotate's move: the detached daemon's log is renamed, then the daemon gets SIGUSR1: a new
/// file appears at the log's path, beginning with the reopen line, and every later line (a
/// SIGHUP's re-read, the stop at `down`, the run's last line) goes there, stamped, while the
/// renamed file keeps what came before and nothing after.
/// Mutation seen failing: `reopen_on_usr1` not spawned by the `deliver` host (the SIGUSR1 is
/// swallowed: no file appears at the path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_log_is_reopened_on_sigusr1() {
    use nix::sys::signal::Signal;
    let root = tempfile::tempdir().expect("root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let (_up, daemon) = detached_up(root.path(), &[], &[]).await;
    until(
        "the detached daemon is done starting",
        COMMAND_BOUND,
        || log(root.path()).contains("timer writer up"),
    )
    .await;
    let path = base::log_path(root.path(), &demo());
    let rotated = path.with_extension("log.1");
    std::fs::rename(&path, &rotated).expect("rotate");
    send(daemon, Signal::SIGUSR1);
    until("a new log file with the reopen line", COMMAND_BOUND, || {
        log(root.path()).contains("received SIGUSR1, reopened the log")
    })
    .await;
    send(daemon, Signal::SIGHUP);
    until("the SIGHUP's line in the new file", COMMAND_BOUND, || {
        log(root.path()).contains("received SIGHUP")
    })
    .await;
    let (st, t) = down(root.path(), &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");
    let new = log(root.path());
    let old = std::fs::read_to_string(&rotated).expect("rotated log");
    for text in [&new, &old] {
        if let Some(bad) = text.lines().find(|l| !stamped(l)) {
            panic!("an unstamped line {bad:?} in:\n{text}");
        }
    }
    let new_lines = bodies(&new);
    assert!(
        new_lines[0].starts_with("• delivery: received SIGUSR1, reopened the log "),
        "{new}"
    );
    assert!(
        new_lines
            .last()
            .is_some_and(|l| l.contains("run ended — exit code 0")),
        "{new}"
    );
    assert!(old.contains("run started"), "{old}");
    for later in ["SIGUSR1", "SIGHUP", "SIGTERM", "run ended"] {
        assert!(
            !old.contains(later),
            "{later:?} went to the renamed file:\n{old}"
        );
    }
    let judged = new_lines
        .iter()
        .map(|l| l.replace(&daemon.to_string(), "[DAEMON PID]"))
        .collect::<Vec<_>>()
        .join("\n");
    snapshot!("daemon_log_reopened", judged);
}

/// A foreground `up` is not ended by SIGHUP (a terminal hang-up, `systemctl reload` of the
/// unit that runs it): it passes SIGHUP and SIGUSR1 on to the daemon it started, which re-reads
/// its credential and reopens its log; the mesh keeps serving and Ctrl-C still stops it.
/// Mutation seen failing: the SIGHUP arm removed from the foreground loop (the signal is
/// swallowed by the installed handler: no line in up's transcript, none in the daemon's log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_up_passes_sighup_and_sigusr1_on_to_its_daemon() {
    use nix::sys::signal::Signal;
    let root = tempfile::tempdir().expect("root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let (mut up, daemon) = serving_up(root.path(), &[], &[]).await;
    send(up.pid(), Signal::SIGHUP);
    up.wait_for_line(
        "• up: received SIGHUP: passed it on to the delivery daemon",
        COMMAND_BOUND,
    )
    .await
    .expect("passed on");
    until("the daemon's re-read in its log", COMMAND_BOUND, || {
        log(root.path()).contains("received SIGHUP")
    })
    .await;
    send(up.pid(), Signal::SIGUSR1);
    up.wait_for_line(
        "• up: received SIGUSR1: passed it on to the delivery daemon",
        COMMAND_BOUND,
    )
    .await
    .expect("passed on");
    until("the daemon's reopen line", COMMAND_BOUND, || {
        log(root.path()).contains("received SIGUSR1, reopened the log")
    })
    .await;
    assert!(up.is_running(), "{}", up.transcript());
    assert_eq!(base::read_pid(&pid_path(root.path())), Some(daemon));
    up.interrupt().expect("Ctrl-C");
    let st = up.wait_exit(COMMAND_BOUND).await.expect("up exits");
    assert_eq!(st.code(), Some(0), "{}", up.transcript());
    let passed: Vec<String> = up
        .lines()
        .into_iter()
        .filter(|l| l.contains("passed it on"))
        .map(|l| l.replace(&daemon.to_string(), "[PID]"))
        .collect();
    snapshot!("up_passes_signals_on", passed.join("\n"));
}
