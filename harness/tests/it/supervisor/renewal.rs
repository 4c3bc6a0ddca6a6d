//! The renewal owner of a detached mesh, on real processes: `up --detach` leaves `remint
//! --watch` running beside the broker and the daemon (recorded in `.cotal/remint.<key>.pid`,
//! logging to `.cotal/remint.<key>.log`), so the mesh outlives its credentials; `status` shows
//! it; a bare `up` relaunches it when it is missing; `down` stops it first.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::up::*;
use cotal_delivery::base::{self, PidLiveness};
use nix::sys::signal::Signal;

fn owner_record(root: &std::path::Path) -> std::path::PathBuf {
    base::remint_pid_path(root, &demo())
}

fn owner_log(root: &std::path::Path) -> String {
    std::fs::read_to_string(base::remint_log_path(root, &demo())).unwrap_or_default()
}

fn owner_pid(root: &std::path::Path) -> u32 {
    base::read_pid(&owner_record(root)).expect("the renewal owner recorded itself")
}

/// `up --detach` with 12 s credentials: three lifetimes later the same daemon still serves
/// (status healthy, exit 0), on credentials its renewal owner re-signed and it adopted (the
/// live one expires more than two lifetimes after the first); the daemon never logged the
/// expiry. `down` then stops the owner (by its recorded pid) before the daemon, and nothing it
/// started is left running (owner, daemon, broker); the owner's log is framed like the
/// daemon's (every line stamped, a first line naming version, pid, space, root and broker, a
/// last line naming exit code 0 and the SIGTERM).
/// The daemon's broker-gone window is shortened (1 s, backstop 3 s) so a daemon left without
/// renewal exits at the expiry plus 3 s instead of a minute. Mutations seen failing:
/// `ensure_renewal_owner` not called by a detached `up` (no owner line; with the owner checks
/// taken out of the test as well, `status` exits 1 past the expiry: the daemon exited 10);
/// `down` not calling `stop_renewal_owner` (the owner outlives `down`); `status` not reading
/// `.cotal/remint.<key>.pid` (`renewalOwner` absent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_mesh_outlives_its_credentials_through_its_renewal_owner() {
    let root = tempfile::tempdir().expect("root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let env = [
        ("COTAL_DELIVERY_BROKER_GONE_MS", "1000"),
        ("COTAL_DELIVERY_BROKER_GONE_BACKSTOP_MS", "3000"),
    ];
    let mut up = spawn_up(
        root.path(),
        &["--detach", "--creds-lifetime-secs", "12"],
        &env,
    );
    let st = up
        .wait_exit(COMMAND_BOUND)
        .await
        .expect("detached up returns");
    assert_eq!(st.code(), Some(0), "{}", up.transcript());
    assert!(up.has_line("✓ renewal owner running for space demo"));
    let daemon = base::read_pid(&pid_path(root.path())).expect("record");
    let owner = owner_pid(root.path());
    assert!(alive(owner), "the owner outlives up");
    let first = cotal_delivery::base::read_creds_file(&creds_path(root.path()))
        .expect("creds")
        .claims()
        .expect("claims");
    let first_exp = first.exp.expect("a bounded credential");
    let lifetime = first_exp - first.iat;
    // Past the third lifetime's end by more than the daemon's backstop, then judge.
    let past = UNIX_EPOCH + Duration::from_secs((first_exp + 2 * lifetime + 5) as u64);
    until("three lifetimes over", COMMAND_BOUND, || {
        SystemTime::now() > past
    })
    .await;
    let (code, json) = status_json(root.path()).await;
    let daemon_log =
        std::fs::read_to_string(base::log_path(root.path(), &demo())).expect("daemon log");
    assert_eq!(code, 0, "{json}\n{daemon_log}\n{}", owner_log(root.path()));
    assert_eq!(json["pidRecord"]["pid"], daemon, "the same daemon serves");
    assert_eq!(json["renewalOwner"]["verdict"], "alive", "{json}");
    assert_eq!(json["renewalOwner"]["pid"], owner, "{json}");
    assert!(
        json["credential"]["expires"].as_i64().expect("exp") > first_exp + 2 * lifetime,
        "renewed through every lifetime: {json}"
    );
    assert!(!daemon_log.contains("credential expired"), "{daemon_log}");
    let log = owner_log(root.path());
    assert!(
        count(&log, "re-signed and adopted") >= 2,
        "the owner renewed and the daemon adopted, more than once:\n{log}"
    );
    assert!(
        daemon_log.contains("reloadCreds adopted the renewed credential"),
        "{daemon_log}"
    );

    let broker = broker_pid(root.path());
    let (st, t) = down(root.path(), &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");
    assert!(!alive(owner), "{t}");
    assert!(!owner_record(root.path()).exists());
    assert!(
        !alive(daemon) && !alive(broker),
        "nothing left running: {t}"
    );
    let o = t.find("renewal owner (pid").expect("owner stop");
    let d = t.find("delivery daemon (pid").expect("daemon stop");
    assert!(o < d, "the owner first, then the daemon:\n{t}");
    let log = owner_log(root.path());
    let stamp = regex::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ").expect("regex");
    for line in log.lines() {
        assert!(stamp.is_match(line), "an unstamped line: {line:?}\n{log}");
    }
    let first_line = log.lines().next().expect("a first line");
    assert!(
        first_line.contains("• remint: run started — cotal-delivery ")
            && first_line.contains(&format!(
                "pid {owner}, space demo, root {}",
                root.path().display()
            )),
        "{first_line}"
    );
    let last = log.lines().last().expect("a last line");
    assert!(
        last.contains(&format!(
            "• remint: run ended — exit code 0: stopped by SIGTERM (pid {owner})"
        )),
        "{last}"
    );
}

/// The owner SIGKILLed: `status` says nobody renews (verdict `stale`, naming the commands); a
/// bare `up` relaunches it (and leaves the serving daemon alone); a second `remint --watch` is
/// refused while it runs (exit 1); SIGHUP makes it re-sign at once; SIGUSR1 reopens its log
/// (logrotate); `down` stops it (a record left by a SIGKILLed owner is cleared). Mutations seen failing: the bare `up` not ensuring
/// the owner (its transcript lacks the relaunch: snapshot `up_bare_relaunch_owner`); `down` not
/// stopping it (the owner outlives `down`); SIGUSR1 not handled (the owner dies of it: no line
/// at the log's path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_up_relaunches_a_missing_renewal_owner_and_down_stops_it() {
    let root = tempfile::tempdir().expect("root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let (_up, daemon) = detached_up(root.path(), &[], &[]).await;
    let first = owner_pid(root.path());
    signal(first, Signal::SIGKILL);
    until("the owner is dead", COMMAND_BOUND, || !alive(first)).await;
    let (code, json) = status_json(root.path()).await;
    assert_eq!(json["renewalOwner"]["verdict"], "stale", "{json}");
    assert_eq!(code, 0, "the daemon still serves: {json}");
    let (_, human) = status(root.path(), false).await;
    let line = human
        .lines()
        .find(|l| l.starts_with("renewal:"))
        .expect("a renewal line")
        .to_string();
    snapshot!("status_renewal_owner_stale", line);

    let r = root.path().to_str().expect("utf-8").to_string();
    let (st, t) = run(root.path(), &["up", "--space", "demo", "--root", &r], &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");
    snapshot!("up_bare_relaunch_owner", t);
    let second = owner_pid(root.path());
    assert_ne!(second, first);
    assert!(alive(second));
    assert_eq!(base::read_pid(&pid_path(root.path())), Some(daemon));
    let (_, json) = status_json(root.path()).await;
    assert_eq!(json["renewalOwner"]["verdict"], "alive", "{json}");
    assert_eq!(json["renewalOwner"]["pid"], second, "{json}");

    let (st, t) = run(
        root.path(),
        &["remint", "--space", "demo", "--root", &r, "--watch"],
        &[],
    )
    .await;
    assert_eq!(st.code(), Some(1), "{t}");
    assert!(
        t.contains("a renewal owner already runs for space demo"),
        "{t}"
    );
    assert_eq!(
        owner_pid(root.path()),
        second,
        "the record is the running owner's"
    );

    let before = count(&owner_log(root.path()), "re-signed and adopted");
    signal(second, Signal::SIGHUP);
    until("a re-sign on SIGHUP", COMMAND_BOUND, || {
        count(&owner_log(root.path()), "re-signed and adopted") > before
    })
    .await;
    assert!(owner_log(root.path()).contains("• remint: received SIGHUP, re-signing now"));
    // logrotate: the log renamed, SIGUSR1, the next line in a new file at the log's path.
    let log_path = base::remint_log_path(root.path(), &demo());
    std::fs::rename(&log_path, log_path.with_extension("log.1")).expect("rotate");
    signal(second, Signal::SIGUSR1);
    until("the owner reopened its log", COMMAND_BOUND, || {
        std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains("reopened the log"))
    })
    .await;

    let (st, t) = down(root.path(), &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");
    assert!(!alive(second), "{t}");
    assert_eq!(
        base::pid_liveness_of(&owner_record(root.path()), base::argv_names_renewal_owner),
        PidLiveness::Absent
    );
}
