//! The manager side of the admin rail against the real daemon (and against test-side stand-ins
//! for a silent or refusing daemon): the start-up wait and its retry cadence, the restart's
//! batched family eviction with its ledger, and a 50-seat retirement whose inventories do not
//! queue behind evictions.

use std::time::Duration;

use crate::support::admin as a;
use crate::support::data_path as s;
use delivery_harness::rig::agent;
use delivery_harness::rig::manager::{AdminAnswer, Ledger, ManagerWaits};
use futures::StreamExt;
use serde_json::json;
use tokio::time::Instant;

/// The documented cadence (docs/admin.md) in the send times: at least `min` requests, the first
/// retry at once, later ones at most 1 s apart (with scheduling slack).
fn assert_cadence(sent: &[Instant], min: usize) {
    assert!(sent.len() >= min, "{} requests", sent.len());
    let gaps: Vec<Duration> = sent.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps[0] < Duration::from_millis(200),
        "first retry at once: {gaps:?}"
    );
    assert!(
        gaps.iter().all(|g| *g <= Duration::from_millis(1200)),
        "later retries at most 1 s apart: {gaps:?}"
    );
}

fn waits(startup: Duration) -> ManagerWaits {
    ManagerWaits {
        startup,
        ..ManagerWaits::default()
    }
}

/// A manager that starts before the daemon is still answered when the daemon binds in the last
/// seconds of its wait: the daemon is started only 2.5 s before the (shrunk, 6 s) wait ends.
/// The first retry goes at once and later ones at most 1 s apart.
///
/// Mutation seen failing (applied alone): spacing later retries a fixed 3 s apart in
/// `Manager::with_retries` (the bind in the last seconds is missed: "did not answer ... within
/// 6000 ms (3 requests)").
#[tokio::test]
async fn a_manager_is_answered_when_the_daemon_binds_in_the_last_seconds() {
    let wait = Duration::from_secs(6);
    let mesh = s::mesh().await;
    let m = a::manager(&mesh).await.with_waits(waits(wait));
    let started = Instant::now();
    let late_start = async {
        tokio::time::sleep_until(started + wait - Duration::from_millis(2500)).await;
        crate::support::start(a::admin_spec(&mesh)).await
    };
    let (answer, mut d) = tokio::join!(m.start(), late_start);
    let took = started.elapsed();
    answer.expect("answered within the wait");
    println!(
        "MEASURED manager start answered after {} ms of a {} ms wait",
        took.as_millis(),
        wait.as_millis()
    );
    assert!(took >= wait - Duration::from_millis(2500) && took < wait);
    assert_cadence(&m.sent(), 4);
    snapshot!(
        "admin_manager__manager_start_answered",
        m.lines().join("\n")
    );
    s::stop_daemon(&mut d).await;
}

/// A daemon that stays silent for the whole wait (a test-side subscriber that never answers)
/// fails the start and the manager's line names the rail; the broker sees no request after the
/// wait ended, and exactly the requests the manager counted.
///
/// Mutation seen failing (applied alone): one more request sent when the loop of
/// `Manager::with_retries` ends (the silent subscriber sees it arrive at 4.007 s of a 4 s wait).
#[tokio::test]
async fn a_silent_daemon_fails_the_start_naming_the_rail_and_nothing_is_sent_after() {
    let wait = Duration::from_secs(4);
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let m = a::manager(&mesh).await.with_waits(waits(wait));
    let mut silent = insp.client.subscribe(m.subject()).await.unwrap();
    insp.sync().await.unwrap();
    let started = Instant::now();
    // Arrival times on the broker side, recorded as they come.
    let collector = tokio::spawn(async move {
        let mut arrivals = Vec::new();
        while let Ok(Some(_)) =
            tokio::time::timeout_at(started + wait + Duration::from_millis(1500), silent.next())
                .await
        {
            arrivals.push(started.elapsed());
        }
        arrivals
    });
    let err = m.start().await.unwrap_err();
    let took = started.elapsed();
    assert!(
        took >= wait && took < wait + Duration::from_millis(300),
        "{took:?}"
    );
    let arrivals = collector.await.unwrap();
    assert_eq!(arrivals.len(), m.sent().len());
    assert!(
        arrivals.iter().all(|t| *t < wait),
        "a request arrived after the wait: {arrivals:?}"
    );
    snapshot!("admin_manager__manager_silent_daemon", err.line);
}

/// A daemon that refuses, or whose reply cannot be read, fails the start at once: one request,
/// no retry.
///
/// Mutation seen failing (applied alone): every outcome but an answer retryable in
/// `AdminAnswer::retryable` (the refused start retries for the whole wait instead of failing within
/// 1 s).
#[tokio::test]
async fn a_refusal_or_an_unreadable_reply_fails_the_start_at_once() {
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let m = a::manager(&mesh)
        .await
        .with_waits(waits(Duration::from_secs(10)));
    let mut fake = insp.client.subscribe(m.subject()).await.unwrap();
    insp.sync().await.unwrap();
    let answers = [
        json!({"ok": false, "error": "delivery: no"}).to_string(),
        "not json".to_string(),
    ];
    let client = insp.client.clone();
    let responder = tokio::spawn(async move {
        for body in answers {
            let Some(msg) = fake.next().await else { return };
            if let Some(reply) = msg.reply {
                client.publish(reply, body.into()).await.unwrap();
            }
        }
    });
    let mut lines = Vec::new();
    for _ in 0..2 {
        let before = m.sent().len();
        let started = Instant::now();
        let err = m.start().await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(m.sent().len(), before + 1, "no retry");
        lines.push(err.line);
    }
    responder.await.unwrap();
    snapshot!(
        "admin_manager__manager_refusal_and_unreadable",
        lines.join("\n")
    );
}

/// A restart's family eviction resumes after the last recorded request of 256: with the first
/// request already in the ledger, only the second is sent (counted on the broker), its live
/// holders are evicted, and a further call sends nothing.
///
/// Mutation seen failing (applied alone): ignoring the ledger in `Manager::evict_family` (the
/// resumed restart sends 2 requests, not 1).
#[tokio::test]
async fn a_restart_resumes_after_the_last_recorded_batch() {
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = crate::support::start(a::admin_spec(&mesh)).await;
    let m = a::manager(&mesh).await;
    let mut holders: Vec<_> = (0..298)
        .map(|i| cotal_delivery::wire::Principal::new("local", &format!("h{i}")).unwrap())
        .collect();
    let mut live = Vec::new();
    for i in 298..300 {
        let mat = agent::provision(&mesh, &insp, mesh.space(), &format!("h{i}"), &["general"])
            .await
            .unwrap();
        live.push(a::victim(&mesh, &mat).await);
        holders.push(mat.principal.clone());
    }
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::at(dir.path().join("ledger.json"));
    std::fs::write(ledger.path(), json!({"verifiedBatches": 1}).to_string()).unwrap();
    let mut seen = insp.client.subscribe(m.subject()).await.unwrap();
    insp.sync().await.unwrap();
    let sent = m.evict_family(&holders, &ledger).await.expect("verified");
    assert_eq!(sent, 1);
    assert_eq!(ledger.verified_batches(), 2);
    let first = tokio::time::timeout(Duration::from_secs(2), seen.next())
        .await
        .unwrap()
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&first.payload).unwrap();
    let named = body["args"]["principals"].as_array().unwrap();
    assert_eq!(named.len(), 300 - 256);
    assert_eq!(named[0], json!("local.h256"));
    assert!(
        tokio::time::timeout(Duration::from_millis(500), seen.next())
            .await
            .is_err()
    );
    assert_eq!(m.evict_family(&holders, &ledger).await.unwrap(), 0);
    drop(live);
    s::stop_daemon(&mut d).await;
}

/// Retiring 50 seats: their inventories are answered beside the evictions, not behind them.
/// Inventory answer times are measured alone and while 50 evictions queue on the rail, printed,
/// and bounded: with evictions queued, the slowest inventory still answers in under 2 s and well
/// before the queued evictions finish.
///
/// Mutation seen failing: routing `lifecycleMemberships` through the serial queue (`is_inventory`
/// false): the inventories wait behind the evictions.
#[tokio::test]
async fn fifty_seat_inventories_do_not_queue_behind_evictions() {
    const SEATS: usize = 50;
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = crate::support::start(a::admin_spec(&mesh)).await;
    let m = a::manager(&mesh).await;
    let mut seats = Vec::new();
    let mut conns = Vec::new();
    for i in 0..SEATS {
        let mat = agent::provision(
            &mesh,
            &insp,
            mesh.space(),
            &format!("seat{i}"),
            &["general"],
        )
        .await
        .unwrap();
        let ag = agent::connect(&mesh, &mat, &format!("seat{i}"))
            .await
            .unwrap();
        ag.durable_join("general").await.unwrap();
        drop(ag);
        conns.push(a::victim(&mesh, &mat).await);
        seats.push(mat);
    }
    let alone = inventories(&m, &seats).await;
    let evictions = async {
        let started = Instant::now();
        let results = futures::future::join_all(seats.iter().map(|mat| {
            let args = json!({"principal": mat.principal.dot_form()});
            let m = &m;
            async move {
                m.request_once("evictPrincipal", &args, Duration::from_secs(60))
                    .await
            }
        }))
        .await;
        for r in results {
            assert!(matches!(r, AdminAnswer::Answered(_)), "{r:?}");
        }
        started.elapsed()
    };
    let beside = async {
        // Let the evictions reach the rail first, so the inventories arrive behind them.
        tokio::time::sleep(Duration::from_millis(100)).await;
        inventories(&m, &seats).await
    };
    let (evicting, beside) = tokio::join!(evictions, beside);
    println!(
        "MEASURED 50-seat inventories: slowest {} ms alone, {} ms with 50 evictions queued (the evictions took {} ms)",
        alone.as_millis(),
        beside.as_millis(),
        evicting.as_millis()
    );
    assert!(beside < Duration::from_secs(2), "{beside:?}");
    assert!(beside * 2 < evicting, "{beside:?} vs {evicting:?}");
    drop(conns);
    s::stop_daemon(&mut d).await;
}

/// Sends one inventory per seat at once; the slowest answer time.
async fn inventories(
    m: &delivery_harness::rig::manager::Manager,
    seats: &[cotal_delivery::provision::AgentMaterial],
) -> Duration {
    let started = Instant::now();
    let times = futures::future::join_all(seats.iter().map(|mat| async move {
        let o = m
            .inventory(&mat.principal, &mat.lifecycle_uid, Duration::from_secs(30))
            .await;
        let inv = a::answered(o);
        assert_eq!(a::listed(&inv).len(), 1);
        started.elapsed()
    }))
    .await;
    times.into_iter().max().unwrap_or_default()
}

/// The verified-eviction wait is 15 s in total (docs/admin.md), with the start-up cadence: against
/// a space whose daemon is not there (every request finds no responder) `evict_batch` retries at
/// once, then at most 1 s apart, sends nothing after 15 s and gives up at 15 s with the line saying
/// the lifecycle stays held. The default waits are used, not shrunk.
///
/// Mutation seen failing: `evict_batch` waiting `self.waits.startup` (60 s) instead of
/// `self.waits.evict` (the 20 s outer bound expires).
#[tokio::test]
async fn an_unanswered_eviction_gives_up_after_fifteen_seconds_total() {
    let mesh = s::mesh().await;
    let m = a::manager(&mesh).await;
    assert_eq!(m.waits.evict, Duration::from_secs(15), "documented");
    let started = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        m.evict_batch(&[cotal_delivery::wire::Principal::parse("local.gone").unwrap()]),
    )
    .await
    .expect("gives up within 20 s")
    .unwrap_err();
    let took = started.elapsed();
    println!(
        "MEASURED unanswered eviction gave up after {} ms",
        took.as_millis()
    );
    assert!(
        took >= Duration::from_secs(15) && took < Duration::from_millis(15_300),
        "{took:?}"
    );
    let sent = m.sent();
    assert_cadence(&sent, 15);
    // The manager's wait starts just before its first send (which it makes at once), so a send
    // within 15 s of that first one is within the wait; the test's own start is earlier still.
    let first = *sent.first().expect("sent at least once");
    assert!(
        first - started < Duration::from_secs(1),
        "the first send at once"
    );
    assert!(
        sent.iter().all(|t| *t - first < Duration::from_secs(15)),
        "nothing sent after the wait: {:?}",
        sent.iter().map(|t| *t - first).collect::<Vec<_>>()
    );
    snapshot!("admin_manager__manager_evict_wait", err.line);
}

/// A responder gap inside the 15 s wait (the daemon binding 3 s into it, as after it adopts a
/// credential) does not abandon the retirement: the retried request is answered and verified.
///
/// Mutation seen failing: `AdminAnswer::retryable` false for `NoResponders` (the first no-responders
/// answer fails the eviction at once).
#[tokio::test]
async fn a_responder_gap_inside_the_eviction_wait_does_not_abandon_it() {
    let mesh = s::mesh().await;
    let m = a::manager(&mesh).await;
    let started = Instant::now();
    let late = async {
        tokio::time::sleep_until(started + Duration::from_secs(3)).await;
        crate::support::start(a::admin_spec(&mesh)).await
    };
    let gone = [cotal_delivery::wire::Principal::parse("local.gone").unwrap()];
    let (answer, mut d) = tokio::join!(m.evict_batch(&gone), late);
    let results = answer.expect("answered within the wait");
    assert_eq!(results[0]["verifiedGone"], true);
    assert!(m.sent().len() >= 3, "retried through the gap");
    assert!(started.elapsed() < Duration::from_secs(15));
    s::stop_daemon(&mut d).await;
}
