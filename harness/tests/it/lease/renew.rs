//! A holder whose renew goes unanswered stops serving once its row may have expired, not when
//! the renew's own 5 s bound runs out.
//!
//! With a lease TTL shorter than twice that bound, a renew sent at TTL/2 and never answered used
//! to keep the daemon serving past its row's expiry, while a standby could already take the row:
//! two holders serving one space. The smoke suite's cluster run once saw exactly that shape (a
//! standby answering `ctl.delivery` 21 ms after the row's named holder was killed, TTL 3 s).

use std::time::Duration;

use cotal_delivery::wire::LEASE_KEY;
use delivery_harness::rig::mesh::Mesh;

use crate::support::data_path::start_daemon_via_proxy;

/// The lease TTL of this test: under twice the daemon's 5 s write bound.
const TTL: Duration = Duration::from_secs(4);
/// The daemon's bound on a lease write (`PlaneConfig::request_bound`).
const WRITE_BOUND: Duration = Duration::from_secs(5);

/// The daemon dials through a proxy; the test holds its outgoing bytes from its next lease write
/// on (a renew, sent TTL/2 after the last write), so the renew is never answered. The daemon must
/// say it stopped serving within TTL/2 of that renew (its row's TTL counted from the last write
/// it saw answered), well before the renew's own bound: asserted under `TTL`, while the old
/// behaviour says it after `WRITE_BOUND`.
///
/// Then the row expires on the broker, the hold is released, and the daemon re-creates its row
/// (same holder and incarnation, a later revision) and serves again; its lines from the quiesce
/// on are snapshotted.
///
/// The row's expiry leaves the broker's marker (the lease bucket is provisioned with expiry
/// markers), which the daemon's own lease watch delivers while the renew is held: the renew's
/// failure already covers it, so it must not stop serving a second time once the daemon has
/// re-created its row (one quiesce line in the whole run).
///
/// Mutations seen failing: `on_renew_tick` calling `renew()` instead of `renew_within(ttl)` (the
/// line comes 5 s after the held renew); the quiesce line written after the not-ready write
/// again (that write is held too: the line comes 6.9 s after the renew); the lease watch taking
/// the expiry marker for news (`RowOp::Expired` returned as `Foreign` in `space/lease_watch.rs`:
/// the daemon quiesces again after its re-create, two quiesce lines).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_renew_stops_serving_when_the_row_may_have_expired() {
    let mesh = Mesh::demo_builder()
        .expect("space")
        .lease_ttl(TTL)
        .start()
        .await
        .expect("mesh");
    let insp = mesh.inspector(mesh.space()).await.expect("inspector");
    // Up, and its lease watch bound, before the hold (see `start_daemon_via_proxy`).
    let (proxy, mut daemon) = start_daemon_via_proxy(&mesh).await;

    let before = insp.lease().await.expect("read").expect("the serving row");
    let lease_subject = format!("$KV.{}.{LEASE_KEY}", insp.names.delivery_bucket());
    proxy.hold_from(lease_subject.as_bytes());
    proxy
        .wait_held(&lease_subject, TTL)
        .await
        .expect("the next renew left the daemon and is held");
    let held = tokio::time::Instant::now();
    daemon
        .wait_for_line("stopped serving shard 0", WRITE_BOUND + TTL)
        .await
        .expect("the daemon stops serving");
    let took = held.elapsed();
    eprintln!(
        "MEASURED stopped serving {} ms after the unanswered renew (TTL {} ms, write bound {} ms)",
        took.as_millis(),
        TTL.as_millis(),
        WRITE_BOUND.as_millis()
    );
    assert!(
        took < TTL,
        "stopped serving {} ms after the held renew: past the row's TTL, a standby could serve beside it",
        took.as_millis()
    );

    // The row expires on the broker (nothing renews it); then the held bytes go out. The late
    // renew and not-ready write fail on the gone row, the re-read finds it gone, and the daemon
    // re-creates it and serves again, once.
    let expired = tokio::time::Instant::now() + TTL + Duration::from_secs(2);
    while insp.lease().await.expect("read").is_some() {
        assert!(
            tokio::time::Instant::now() < expired,
            "the row never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.release();
    daemon
        .wait_for_line("serving shard 0 again", WRITE_BOUND + TTL)
        .await
        .expect("serves again");
    let after = insp
        .lease()
        .await
        .expect("read")
        .expect("the re-created row");
    assert_eq!(after.info.holder, before.info.holder);
    assert_eq!(after.info.incarnation, before.info.incarnation);
    assert!(after.revision > before.revision);
    let lines = daemon.lines();
    let from = lines
        .iter()
        .position(|l| l.contains("stopped serving shard 0"))
        .expect("the quiesce line");
    let transcript: Vec<&str> = lines[from..]
        .iter()
        .filter(|l| l.contains("delivery:"))
        .map(String::as_str)
        .collect();
    snapshot!(
        "lease_renew__lease_renew_unanswered",
        transcript.join("\n"),
        &[(mesh.root(), "[ROOT]")]
    );
    daemon.terminate().expect("SIGTERM");
    daemon
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("exit");
    // The row's expiry marker reached the daemon's own lease watch while the renew was held;
    // the renew already told the daemon, so the marker stops nothing again.
    let quiesces = daemon
        .lines()
        .iter()
        .filter(|l| l.contains("stopped serving shard 0"))
        .count();
    assert_eq!(quiesces, 1, "{}", daemon.transcript());
}
