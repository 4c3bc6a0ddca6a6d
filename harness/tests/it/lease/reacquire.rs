//! The keeper's re-acquire of a lease key found gone while serving: a create the broker refuses
//! because a live row exists, and a create it refuses for any other reason. The daemon dials
//! through the harness proxy, which holds its re-create in flight (the first create expecting
//! no history at all) while the test changes the broker under it.

use crate::support::data_path::{set_max_msg_size, start_daemon_via_proxy};
use crate::support::BOUND;
use cotal_delivery::base::Rows;
use cotal_delivery::wire::{LeaseInfo, SpaceNames, LEASE_KEY};
use delivery_harness::rig::daemon::Daemon;
use delivery_harness::rig::mesh::{Inspector, Mesh};
use delivery_harness::TcpProxy;

/// The header of a create: a write expecting the key never written (a renew or a not-ready
/// mark names the row's revision, which is never 0).
const CREATE: &str = "Nats-Expected-Last-Subject-Sequence: 0\r\n";

/// A serving daemon behind a proxy, its lease watch bound, with the proxy armed to hold its
/// next create; then the lease row deleted, and the re-create held at the proxy.
async fn reacquire_held() -> (Mesh, Inspector, TcpProxy, Daemon) {
    let mesh = Mesh::demo().await.expect("mesh");
    let insp = mesh.inspector(mesh.space()).await.expect("inspector");
    let (proxy, d) = start_daemon_via_proxy(&mesh).await;
    proxy.hold_from(CREATE.as_bytes());
    insp.delete_lease().await.expect("delete the row");
    proxy
        .wait_held(CREATE, BOUND)
        .await
        .expect("the daemon re-creates its row");
    assert!(d.has_line("stopped serving shard 0"), "{}", d.transcript());
    (mesh, insp, proxy, d)
}

/// The keeper's closing line, with its volatile parts (nkeys, sequences) normalised.
fn closing_line(d: &Daemon) -> String {
    let line = d
        .lines()
        .into_iter()
        .find(|l| l.starts_with("✗ delivery:"))
        .unwrap_or_else(|| panic!("no closing line: {}", d.transcript()));
    delivery_harness::kit::transcript::normalise(&line, &[])
}

/// The row found gone is re-created, but another daemon took the key first (the test writes a
/// rival's row while the create is held): the create is refused because a live row exists, so
/// the daemon says another daemon has taken the shard, exits 6 without touching the row.
/// Mutation seen failing: the `ClaimError::Held` arms of `Keeper::reacquire`'s line removed (the
/// refusal is quoted as "could not re-acquire the lease": the snapshot differs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_create_refused_by_a_live_lease_says_another_daemon_has_taken_the_shard() {
    let (_mesh, insp, proxy, mut d) = reacquire_held().await;
    let rival = LeaseInfo {
        holder: "local.URIVALTOOKTHEKEY".into(),
        since: 1,
        ready: true,
        incarnation: "rival".into(),
    };
    // Over the delete marker, as a rival daemon's own claim would.
    let rows = Rows::open(&insp.js, &insp.names.delivery_bucket(), BOUND)
        .await
        .expect("lease rows");
    let body = serde_json::to_vec(&rival).expect("row");
    rows.create(LEASE_KEY, body.into())
        .await
        .expect("a rival takes the key");
    proxy.release();
    let status = d.wait_exit(BOUND).await.expect("exits");
    assert_eq!(status.code(), Some(6), "{}", d.transcript());
    assert_eq!(
        insp.lease().await.expect("read").map(|r| r.info),
        Some(rival),
        "the rival's row is untouched"
    );
    let line = closing_line(&d);
    crate::support::snapshot_base().bind(|| {
        insta::assert_snapshot!("lease_reacquire_taken", line);
    });
}

/// The row found gone is re-created, and the broker refuses the create for another reason (the
/// lease bucket's `max_msg_size` lowered below the row while the create is held): the refusal
/// is quoted, the line says it could not re-acquire the lease, and the daemon exits 8 all the
/// same, because it serves only under its lease; no row is left. Mutation seen failing: a
/// refused create classified as `ClaimError::Held` in `Lease::classify_claim` (the line says
/// another daemon has taken the shard, exit 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_create_refused_for_another_reason_is_quoted_and_the_daemon_exits() {
    let (_mesh, insp, proxy, mut d) = reacquire_held().await;
    let stream = SpaceNames::kv_stream(&insp.names.delivery_bucket());
    set_max_msg_size(&insp, &stream, 32).await;
    proxy.release();
    let status = d.wait_exit(BOUND).await.expect("exits");
    assert_eq!(status.code(), Some(8), "{}", d.transcript());
    assert!(
        insp.lease().await.expect("read").is_none(),
        "nothing re-created"
    );
    assert!(
        !d.has_line("another daemon has taken"),
        "{}",
        d.transcript()
    );
    let line = closing_line(&d);
    crate::support::snapshot_base().bind(|| {
        insta::assert_snapshot!("lease_reacquire_refused", line);
    });
}
