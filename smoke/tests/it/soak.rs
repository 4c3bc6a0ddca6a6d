//! `smoke soak` inside `ci/test`, its whole run under 2 minutes: a detached mesh for 90 s on
//! 16 s credentials (the renewal owner re-signs every 8 s, so more than 8 renewals), a 5 s
//! lease TTL (the bare `up` after the daemon's SIGKILL serves once the killed daemon's row
//! expired), members draining every 30 s; checked from its `--json` summary.
//!
//! Asserted: the suite passed; both faults ran (the daemon's SIGKILL and its relaunch, the
//! broker's restart); every member surfaced every post (`lost == 0`, each member's `surfaced`
//! equal to `posts`, no drain without every post stored before its bind); at least 8 renewals;
//! the daemon never logged a credential expiry and never exited while the mesh ran (only the
//! bare `up`s refused on the killed daemon's row, exit 6), its last run ended with exit code 0
//! at the `down`; `status` healthy at the end with a live renewal owner.
//!
//! Mutation seen failing: `up --detach` leaving no renewal owner (`ensure_renewal_owner` not
//! called by the detached path): the daemon logged the credential expiry, the first bare `up`
//! after the SIGKILL ran a daemon the broker refused on the expired credential (exit 4); the
//! owner that bare `up` relaunched renewed from then on, so only those two failures show.

use std::process::Command;

#[test]
fn a_detached_mesh_on_short_credentials_loses_nothing_through_a_kill_and_a_broker_restart() {
    let _machine = crate::one_suite();
    let out = Command::new(env!("CARGO_BIN_EXE_smoke"))
        .args([
            "soak",
            "--minutes",
            "1.5",
            "--creds-lifetime-secs",
            "16",
            "--lease-ttl-secs",
            "5",
            "--drain-every-secs",
            "30",
            "--json",
        ])
        .output()
        .expect("run smoke");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary: serde_json::Value = stdout
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON summary:\n{stdout}\n{stderr}"));
    let n = |k: &str| {
        summary[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {summary}\n{stderr}"))
    };
    assert!(out.status.success(), "{summary}\n{stderr}");
    assert_eq!(summary["passed"], true, "{summary}\n{stderr}");
    assert!(
        summary["daemon_kill"]["relaunched_pid"].as_u64().is_some(),
        "{summary}"
    );
    assert!(
        summary["broker_restart"]["not_listening_ms"]
            .as_u64()
            .is_some(),
        "{summary}"
    );
    assert!(n("posts") > 0, "{summary}");
    assert_eq!(n("lost"), 0, "{summary}\n{stderr}");
    assert_eq!(n("incomplete_drains"), 0, "{summary}\n{stderr}");
    for m in summary["members"].as_array().expect("members") {
        assert_eq!(m["surfaced"].as_u64(), Some(n("posts")), "{m}\n{stderr}");
    }
    assert!(n("renewals") >= 8, "{summary}\n{stderr}");
    assert_eq!(n("daemon_expiry_lines"), 0, "{summary}\n{stderr}");
    assert_eq!(summary["status_healthy"], true, "{summary}\n{stderr}");
    assert_eq!(summary["renewal_owner_alive"], true, "{summary}\n{stderr}");
    let codes: Vec<u64> = summary["daemon_exit_codes"]
        .as_array()
        .expect("daemon_exit_codes")
        .iter()
        .filter_map(|c| c.as_u64())
        .collect();
    let (last, before) = codes.split_last().expect("the daemon's runs ended");
    assert_eq!(*last, 0, "the run the down stopped: {summary}");
    assert!(before.iter().all(|c| *c == 6), "{summary}\n{stderr}");
    assert_eq!(summary["down_exit"], 0, "{summary}");
}
