//! `smoke delivery-standby --cluster` inside `ci/test`: a 3-node loopback cluster with R3
//! streams and buckets, one round of each case plus the loss of the broker node the holder is
//! connected to, lease TTL 3 s (provisioning) and standby retry 1 s
//! (`COTAL_DELIVERY_STANDBY_RETRY_MS`), checked from its `--json` lines.
//!
//! Asserted: the four cases ran; nothing lost in any case; after the node loss exactly one of
//! the two outcomes happened, and which one the suite proved from the lease row (same holder
//! and incarnation: the lane rode the failover; another holder: the standby took over); the
//! process-level cases answered, and delivered the first post sent after the kill or stop,
//! within TTL + retry + 1 s plus a 3 s margin (the hosts' `ack_wait` lengthened to 15 s, so a
//! post held behind a closed gate, redelivered only after `ack_wait`, cannot pass for a
//! takeover; nothing legitimate waits on it: the marker post is sent once the holder left the
//! broker). The node case's
//! answer includes the client's detection of the dead node (pings, 2.5 s) and R3 leader
//! elections, so it is bounded at 20 s here and reported, not held to the lease bound; its post at
//! 20 s plus one `ack_wait` (a first delivery lost with the node, or caught by a quiesce). The
//! suite's 1 s answer target is held for the process-level cases (`assert_lease_facts`), not
//! for the node's loss.
//!
//! This is the one run of `smoke delivery-standby` in `ci/test`: the same takeovers on one
//! broker are proved by the cases `standby/holder-killed-takeover`,
//! `standby/returning-host-leaves-row` and `standby/graceful-stop-takeover` (the lease's writes
//! from a broker watch, one create after each end, nothing lost), and the watch's wake by
//! `host::standby` in `harness/tests/it` (retry 60 s).
//!
//! Mutations seen failing: `ProvisionOptions::replicas` ignoring its argument (every stream
//! R1): the suite's R3 check on the broker refuses, exit 1. The standby lane's claim after its
//! watch's wake delayed by one standby retry (`host/lane.rs`): the kill case's first answer 1172
//! and 1201 ms after the row's end, beyond the 1 s target (2 runs of 2). The lease bucket
//! provisioned without expiry markers (`provision/streams.rs`): the kill and return rows end
//! with no write, "the holder's row never ended", exit 1 (seen on the one-broker run this test
//! replaced).

use std::process::Command;

/// The hosts' `ack_wait` (`--ack-wait-ms`): long, so a post held one `ack_wait` stands out.
const ACK_WAIT_MS: u64 = 15_000;
/// The node case's bound on the first `ctl.delivery` answer: the client's detection of the dead
/// node (pings, 2.5 s), R3 leader elections, and a takeover if the lane lost its lease meanwhile.
const NODE_RAIL_BOUND_MS: u64 = 20_000;

#[test]
fn cluster_round_takes_over_or_rides_the_failover_and_loses_nothing() {
    let _machine = crate::one_suite();
    let out = Command::new(env!("CARGO_BIN_EXE_smoke"))
        .args([
            "delivery-standby",
            "--cluster",
            "--rounds",
            "1",
            "--lease-ttl-secs",
            "3",
            "--standby-retry-ms",
            "1000",
            "--initial-creds-secs",
            "10",
            "--ack-wait-ms",
            &ACK_WAIT_MS.to_string(),
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
    assert_eq!(names, vec!["kill", "return", "stop", "node"], "{stdout}");
    for c in &cases {
        let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k} in {c}"));
        assert_eq!(c["cluster"], true, "{c}\n{rounds}");
        assert_eq!(n("rounds"), 1);
        assert!(n("posts") > 0, "{c}\n{rounds}");
        assert_eq!(n("lost"), 0, "{c}\n{rounds}");
        assert_eq!(n("surfaced"), n("posts"), "{c}\n{rounds}");
        assert_eq!(n("bound_ms"), 5_000, "TTL 3 s + 1 s retry + 1 s");
        let rail = c["rail_ms"]["max"].as_u64().expect("rail_ms");
        let post = c["post_ms"]["max"].as_u64().expect("post_ms");
        if c["case"] == "node" {
            assert_eq!(n("lane_kept") + n("standby_took_over"), 1, "{c}\n{rounds}");
            assert!(rail <= NODE_RAIL_BOUND_MS, "{c}\n{rounds}");
            // The post's first delivery may be lost with the dead node's connection, or made to
            // a lane that rode the failover and then lost its lease to the standby (a message
            // admitted and then caught by a quiesce is left to its ack_wait, by design); it then
            // comes back one ack_wait (15 s here) after that first delivery, which itself may
            // come as late as the node case's answer (seen: 15016 ms; and 21131 ms with the
            // standby serving at 11.8 s, consistent with a first delivery about 6 s after the kill).
            assert!(post <= NODE_RAIL_BOUND_MS + ACK_WAIT_MS, "{c}\n{rounds}");
        } else {
            assert!(rail <= n("bound_ms") + 3_000, "{c}\n{rounds}");
            assert!(post <= n("bound_ms") + 3_000, "{c}\n{rounds}");
        }
        crate::assert_lease_facts(c, &rounds, 3_000);
    }
}
