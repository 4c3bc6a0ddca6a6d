//! `smoke delivery-standby` inside `ci/test`: one round of each case with the lease TTL
//! shortened through provisioning (3 s) and the standby retry through its documented override
//! (`--standby-retry-ms 1000`, passed to the hosts as `COTAL_DELIVERY_STANDBY_RETRY_MS`),
//! checked from its `--json` lines. The default 5 s retry (docs/host.md) is the default of the
//! suite itself.
//!
//! Asserted: the three cases ran; every post of every case reached the offline member's DLV
//! (`lost == 0`, `surfaced == posts`, and every case carried at least one post); both the
//! standby's first `ctl.delivery` answer (`rail_ms`) and the first post sent once the holder's
//! connections are gone from the broker, seen on an online member's DLV (`post_ms`), both timed
//! from the SIGKILL or SIGTERM, came within the bound, TTL + retry + 1 s (`bound_ms`,
//! 5 s here), plus a 3 s margin for a loaded 2-core machine.
//!
//! The hosts run with `--ack-wait-ms 15000` (`COTAL_DELIVERY_ACK_WAIT_MS`): a post a daemon
//! pulls behind its closed gate (the new holder before `arm` opens it, the stopping holder
//! after its quiesce closed it) is redelivered only after `ack_wait`, and 15 s puts that far
//! outside the 8 s allowed, whatever the machine's load. Nothing legitimate waits on it here:
//! the marker post is sent after the holder left the broker, so no gone holder ever owned it.
//!
//! The lease's own facts, read by the suite from a broker watch of every write to the key, are
//! checked too (`assert_lease_facts`): how each row ended (the release's delete after a stop,
//! the broker's expiry marker after a kill), one create after each end by the standby and no
//! other write, the standby's first answer never before the row's end, and the suite's 1 s
//! answer target held (a stop answered within 1 s of the SIGTERM, a kill or a return within 1 s
//! of the row's expiry as the broker stamped it; docs/host.md): the suite reports it, this test
//! fails on it.
//!
//! Mutations seen failing: the standby lane's claim after its watch's wake delayed by one
//! standby retry (`host/lane.rs`, a sleep of `standby_retry` before the wake's `break`): the
//! first answer 1215 and 1297 ms after the row's end, beyond the 1 s target (3 runs: twice on
//! the target, once the suite itself exited 1 first; the cluster test on the target in 2 runs of
//! 2, 1172 and 1201 ms). The watch's wake ignored
//! (`News::Gone` answered `false`): at this test's 1 s retry the fallback alone still lands
//! within the target in 3 suite runs of 5 (beyond it in 2: 1480 ms return, 1720 ms kill and
//! 1235 ms stop), so this test catches it only by chance; `host::standby` (retry 60 s) is the
//! proof of the wake. The lease bucket provisioned without expiry markers (the two fields
//! dropped in `provision/streams.rs`): the kill and return rows end with no write, the suite
//! says "the holder's row never ended" and exits 1. A standby lane that returns after its
//! first held-lease report instead of retrying (`host/lane.rs`): no takeover, the suite exits 1. `plane/pump.rs` put
//! back as it was before the pull loops waited for the gate (an unadmitted message left
//! pending), with the marker then sent right after the signal: the return case's first post
//! came after 18.5 s, against 8 s allowed. Since the marker is sent once the holder left the
//! broker, that mutation passed this test in 2 runs of 2: the new holder's pre-gate window (its
//! `arm` binding the reader) is too short to catch the marker reliably at TTL 3 s; the default
//! run of docs/performance-history.md (kill case: post one `ack_wait` after the answer before the
//! fix, with it after) and `data_path::posts_waiting_when_a_daemon_starts_serving_are_fanned_out_at_once_and_once`
//! (deterministic) are the evidence for that fix, not this test.

use std::process::Command;

#[test]
fn one_round_of_each_case_takes_over_within_the_bound_and_loses_nothing() {
    let _machine = crate::one_suite();
    let out = Command::new(env!("CARGO_BIN_EXE_smoke"))
        .args([
            "delivery-standby",
            "--rounds",
            "1",
            "--lease-ttl-secs",
            "3",
            "--standby-retry-ms",
            "1000",
            "--initial-creds-secs",
            "10",
            "--ack-wait-ms",
            "15000",
            "--json",
        ])
        .output()
        .expect("run smoke");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "smoke failed:\n{stdout}\n{stderr}");
    // The suite's per-round lines, carried by every assertion below.
    let rounds: String = stderr
        .lines()
        .filter(|l| l.contains(" round "))
        .collect::<Vec<_>>()
        .join("\n");
    let cases: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let names: Vec<&str> = cases.iter().filter_map(|c| c["case"].as_str()).collect();
    assert_eq!(names, vec!["kill", "return", "stop"], "{stdout}");
    for c in &cases {
        let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k} in {c}"));
        assert_eq!(n("rounds"), 1);
        assert!(n("posts") > 0, "{c}\n{rounds}");
        assert_eq!(n("lost"), 0, "{c}\n{rounds}");
        assert_eq!(n("surfaced"), n("posts"), "{c}\n{rounds}");
        let bound = n("bound_ms");
        assert_eq!(bound, 5_000, "TTL 3 s + 1 s retry + 1 s");
        let rail = c["rail_ms"]["max"].as_u64().expect("rail_ms");
        assert!(rail <= bound + 3_000, "{c}\n{rounds}");
        let post = c["post_ms"]["max"].as_u64().expect("post_ms");
        assert!(post <= bound + 3_000, "{c}\n{rounds}");
        let takeover = c["takeover_ms"]["max"].as_u64().expect("takeover_ms");
        assert_eq!(takeover, rail.max(post), "{c}\n{rounds}");
        crate::assert_lease_facts(c, &rounds, 3_000);
    }
}
