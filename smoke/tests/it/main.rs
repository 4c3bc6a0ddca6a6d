//! The smoke suites as tests: `smoke delivery-standby` at test timings on the 3-node cluster
//! (on one broker its kill, return and stop are the cases of `cases/standby/`, which are their
//! proofs; the cluster run keeps the command and its output proved, and adds the node's loss);
//! `smoke soak` at its 2-minute setting; `smoke bench-scale` at its smallest sizes.

mod scale;
mod soak;
mod standby_cluster;

/// One suite at a time: each times takeovers against its own brokers, and two at once on a
/// 2-core machine would measure each other.
static ONE_SUITE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds the machine for one suite (a panicked suite still releases it).
fn one_suite() -> std::sync::MutexGuard<'static, ()> {
    ONE_SUITE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The lease fields of one `--json` case line of `smoke delivery-standby`, run with
/// `--lease-ttl-secs 3` (`ttl_ms`) at one round: the row's end as the case predicts it (a stop's
/// release deletes it; a kill leaves it to the broker's expiry marker, within a second of its
/// nominal expiry), one create by the standby after it and no other write (`single_winner`), and
/// the standby's first answer and first post never before the row's end and within the case's
/// bound plus the machine's margin, and the first answer within the suite's 1 s target (from
/// the SIGTERM for a stop, from the row's end for a kill or a return; not set for a node's
/// loss). A node case whose lane rode the failover has no row's end;
/// one whose lane rode it and then lost its row answered first as the holder (seen: 320 ms
/// after the node's kill, the row expiring 6.6 s after it), so its figures may be negative.
fn assert_lease_facts(c: &serde_json::Value, rounds: &str, ttl_ms: i64) {
    let case = c["case"].as_str().unwrap_or_default();
    assert_eq!(c["single_winner"], true, "{c}\n{rounds}");
    assert_eq!(c["answer_target_ms"], 1000, "{c}");
    let gone = &c["gone_by"];
    let stat = |k: &str, s: &str| c[k][s].as_i64();
    let (deletes, expiries) = (gone["delete"].as_u64(), gone["expiry"].as_u64());
    match case {
        "stop" => assert_eq!((deletes, expiries), (Some(1), Some(0)), "{c}\n{rounds}"),
        "kill" | "return" => {
            assert_eq!((deletes, expiries), (Some(0), Some(1)), "{c}\n{rounds}");
            let lag = stat("expiry_lag_ms", "max").expect("expiry_lag_ms");
            assert!((0..=1_000).contains(&lag), "{c}\n{rounds}");
            let gone_ms = stat("row_gone_ms", "max").expect("row_gone_ms");
            assert!((0..=ttl_ms + 1_000).contains(&gone_ms), "{c}\n{rounds}");
        }
        _ => {}
    }
    if c["answer_after_gone_ms"].is_null() {
        assert_eq!(
            case, "node",
            "only a lane that rode the failover has no row's end: {c}"
        );
        return;
    }
    let bound = c["bound_ms"].as_i64().expect("bound_ms");
    for k in ["answer_after_gone_ms", "post_after_gone_ms"] {
        let (min, max) = (stat(k, "min").expect(k), stat(k, "max").expect(k));
        if case != "node" {
            assert!(min >= 0, "{k}: served before the row ended: {c}\n{rounds}");
            assert!(max <= bound + 3_000, "{k}: {c}\n{rounds}");
        }
    }
    // The suite's 1 s target (issue 24; docs/host.md: reported by the suite, not failed on):
    // a graceful stop answered within it of the SIGTERM, a kill within it of the row's expiry.
    // Held here for every case but the node's loss (which it was never set for): checked on the
    // figures themselves, and the suite's own flag must agree with them.
    let target = c["answer_target_ms"].as_i64().expect("answer_target_ms");
    if case == "node" {
        assert!(c["answer_within_target"].is_boolean(), "{c}");
    } else {
        let answer = if case == "stop" {
            c["rail_ms"]["max"].as_i64().expect("rail_ms")
        } else {
            stat("answer_after_gone_ms", "max").expect("answer_after_gone_ms")
        };
        assert!(
            answer <= target,
            "{case}: the first answer {answer} ms after the {}, beyond the {target} ms target: {c}\n{rounds}",
            if case == "stop" { "SIGTERM" } else { "row's end" }
        );
        assert_eq!(c["answer_within_target"], true, "{c}\n{rounds}");
    }
}
