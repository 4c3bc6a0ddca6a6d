//! The trusted reader's re-authorization, with an entry placed while the daemon is down so the
//! reader meets it only after the ACL was narrowed. Broker state is checked from the test side.
//! A retired lifecycle and an owner with no ACL row are the `retired` cases
//! (`scenarios/retired/`).

use cotal_delivery::provision::set_read_acl;
use delivery_harness::agent::{self, surface_for};

use crate::support::data_path::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_narrowed_between_post_and_read_is_not_surfaced() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = start_daemon(&mesh).await;
    let (alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    let (bob, bob_m) = agent::spawn(&mesh, &insp, "bob", &["general", "ops"])
        .await
        .unwrap();
    let (p, u) = (bob_m.principal.clone(), bob_m.lifecycle_uid.clone());
    bob.durable_join("general").await.unwrap();
    stop_daemon(&mut daemon).await;

    let m = alice.message("general", "secret", None);
    alice.post("general", &m).await.unwrap();
    set_read_acl(&insp.js, &insp.names, &p, &u, vec!["ops".into()])
        .await
        .unwrap();

    let mut daemon = start_daemon(&mesh).await;
    // The fan-out routes by membership (the copy lands in INBOX); the reader drops it.
    eventually("the copy is in INBOX", SURFACE_BOUND, || async {
        inbox_count(&insp, &p, &u).await == 1
    })
    .await;
    eventually("the reader settled it", SURFACE_BOUND, || async {
        let r = consumer(&insp, &insp.names.inbox_stream(), "reader").await;
        r.num_pending == 0 && r.num_ack_pending == 0 && r.delivered.stream_sequence >= 1
    })
    .await;
    assert_eq!(dlv_count(&insp, &p, &u).await, 0);
    let mut delivery = bob.bind_delivery().await.unwrap();
    assert!(surface_for(&mut delivery, QUIET).await.is_empty());
    stop_daemon(&mut daemon).await;
}
