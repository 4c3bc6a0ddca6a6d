//! Logs that never flood: 500 entries owed to a principal whose ACL row was deleted are given
//! up by the real daemon over three runs (two restarts), and the give-up warning is written a
//! bounded number of times, its counts adding up to the 500 entries the broker shows terminated.

use std::time::Duration;

use cotal_delivery::plane::READER_LANES;
use cotal_delivery::provision::remove_acl;
use delivery_harness::rig::daemon::Daemon;
use delivery_harness::rig::mesh::Inspector;

use crate::support::data_path::*;

const OWED: usize = 500;
const GIVE_UP: &str = "gave up on entry for unknown owner";

/// The give-up lines of one run, and the entries they account for: 1 for a first occurrence,
/// N for `… (repeated N times in the last W s)`.
fn give_ups(d: &Daemon) -> (usize, u64) {
    let lines: Vec<String> = d
        .lines()
        .into_iter()
        .filter(|l| l.contains(GIVE_UP))
        .collect();
    let counted = lines
        .iter()
        .map(|l| match l.split_once("(repeated ") {
            Some((_, rest)) => rest
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("a summary with a count: {l}")),
            None => 1,
        })
        .sum();
    (lines.len(), counted)
}

async fn reader(insp: &Inspector) -> async_nats::jetstream::consumer::Info {
    consumer(insp, &insp.names.inbox_stream(), "reader").await
}

/// Mutations applied and seen caught: the reader writing the warning with `journal.line`
/// instead of `journal.repeated` (one line per entry: run 2 wrote 499); the reader not counting
/// `gave_up(UnknownOwner)` (run 2's `give_ups_total` 0 against its lines' count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_entries_of_a_gone_principal_log_a_bounded_number_of_lines_over_two_restarts()
{
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = crate::support::start(daemon_spec(&mesh)).await;
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    let (p, u) = (bob_m.principal.clone(), bob_m.lifecycle_uid.clone());
    bob.durable_join("general").await.unwrap();
    stop_daemon(&mut daemon).await;
    // Posted while no daemon runs; then the principal is gone (its ACL row deleted).
    for i in 0..OWED {
        let m = alice.message("general", &format!("owed-{i}"), None);
        alice.post("general", &m).await.unwrap();
    }
    remove_acl(&insp.js, &insp.names, &p, &u).await.unwrap();

    // Run 1: stopped as soon as the first give-up was written (the rest still owed).
    let mut first = crate::support::start(daemon_spec(&mesh)).await;
    first
        .wait_for_line(GIVE_UP, Duration::from_secs(30))
        .await
        .expect("a give-up");
    stop_daemon(&mut first).await;
    // Run 2: until the broker shows every post copied and every entry settled.
    // (with metrics: its give-ups by reason are compared with its lines)
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut second = crate::support::start(
        daemon_spec(&mesh)
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{port}")),
    )
    .await;
    eventually(
        "every entry copied and given up",
        Duration::from_secs(90),
        || async {
            let f = consumer(&insp, &insp.names.chat_stream(), "fanout").await;
            let r = reader(&insp).await;
            f.num_pending == 0
                && f.num_ack_pending == 0
                && inbox_count(&insp, &p, &u).await == OWED as u64
                && r.num_pending == 0
                && r.num_ack_pending == 0
        },
    )
    .await;
    let scraped = delivery_harness::rig::http::get(port, "/metrics", Duration::from_secs(5))
        .await
        .expect("scrape");
    let text = String::from_utf8(scraped.body).unwrap();
    let gave_up_metric: u64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "cotal_delivery_give_ups_total{space=\"demo\",reason=\"unknown_owner\"} ",
            )
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    stop_daemon(&mut second).await;
    // Run 3: nothing left to give up, so nothing is re-swept.
    let mut third = crate::support::start(daemon_spec(&mesh)).await;
    eventually("the reader is idle", SURFACE_BOUND, || async {
        let r = reader(&insp).await;
        r.num_pending == 0 && r.num_ack_pending == 0
    })
    .await;
    tokio::time::sleep(QUIET).await;
    stop_daemon(&mut third).await;

    let runs = [give_ups(&first), give_ups(&second), give_ups(&third)];
    drop(bob);
    println!("MEASURED give-up lines per run (lines, entries accounted): {runs:?}");
    // Term does not delete: every entry is still in the store, none handed off.
    assert_eq!(inbox_count(&insp, &p, &u).await, OWED as u64);
    assert_eq!(dlv_count(&insp, &p, &u).await, 0);
    // Each run: the first occurrence, and its summary at the close (or at a window's end).
    for (i, (lines, _)) in runs.iter().enumerate() {
        assert!(
            *lines <= 3,
            "run {}: {lines} lines:\n{}",
            i + 1,
            [&first, &second, &third][i].transcript()
        );
    }
    assert_eq!(runs[2], (0, 0), "run 3 re-swept:\n{}", third.transcript());
    // The metric counts each give-up of run 2 that its lines account for.
    assert_eq!(gave_up_metric, runs[1].1, "give_ups_total in run 2");
    // Every give-up is accounted for. A give-up in flight when run 1 stopped is written, then
    // left unsettled by the closed gate and given up again in run 2: at most one per lane.
    let accounted: u64 = runs.iter().map(|(_, n)| n).sum();
    assert!(
        (OWED as u64..=OWED as u64 + READER_LANES as u64).contains(&accounted),
        "{accounted} give-ups accounted for {OWED} entries:\n{}\n{}",
        first.transcript(),
        second.transcript()
    );
    // The line itself is the seed's, unchanged.
    let line = first
        .lines()
        .into_iter()
        .find(|l| l.contains(GIVE_UP))
        .unwrap();
    assert!(
        line.starts_with("! plane-3 reader: gave up on entry for unknown owner local.bob.")
            && line.ends_with(" after 10 redeliveries"),
        "{line}"
    );
}
