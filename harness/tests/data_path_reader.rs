//! The trusted reader's re-authorization, with entries placed while the daemon is down so the
//! reader meets them only after the ACL changed: a narrowed ACL, a retired lifecycle, an owner
//! with no ACL row. Broker state is checked from the test side.

mod data_path_support;

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use cotal_delivery::provision::agent::{remove_acl, retire, set_read_acl};
use delivery_harness::agent::{self, surface_for};

use data_path_support::*;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_lifecycle_is_cleaned_up_and_never_redelivered() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = start_daemon(&mesh).await;
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    let (p, u) = (bob_m.principal.clone(), bob_m.lifecycle_uid.clone());
    bob.durable_join("general").await.unwrap();
    drop(bob);
    stop_daemon(&mut daemon).await;
    for i in 0..3 {
        let m = alice.message("general", &format!("to-retired-{i}"), None);
        alice.post("general", &m).await.unwrap();
    }
    retire(&insp.js, &insp.names, &p, &u).await.unwrap();

    let mut daemon = start_daemon(&mesh).await;
    eventually("fan-out and reader settled", SURFACE_BOUND, || async {
        let f = consumer(&insp, &insp.names.chat_stream(), "fanout").await;
        let r = consumer(&insp, &insp.names.inbox_stream(), "reader").await;
        f.num_pending == 0 && f.num_ack_pending == 0 && r.num_pending == 0 && r.num_ack_pending == 0
    })
    .await;
    // Entries deleted from the store, the member row removed, nothing handed off.
    eventually("entries deleted and row removed", SURFACE_BOUND, || async {
        inbox_count(&insp, &p, &u).await == 0
            && member_row(&insp, "general", &p, &u).await.is_none()
    })
    .await;
    assert_eq!(dlv_count(&insp, &p, &u).await, 0);
    // A fresh reader (a new consumer from the start of INBOX) finds nothing for it.
    let stream = insp
        .js
        .get_stream_no_info(insp.names.inbox_stream())
        .await
        .unwrap();
    let fresh = stream
        .create_consumer(pull::Config {
            filter_subject: insp.names.dinbox_subject(&p, &u),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(fresh.cached_info().num_pending, 0);
    stop_daemon(&mut daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_without_an_acl_row_is_retried_ten_times_then_given_up_and_kept() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = start_daemon(&mesh).await;
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    let (p, u) = (bob_m.principal.clone(), bob_m.lifecycle_uid.clone());
    bob.durable_join("general").await.unwrap();
    stop_daemon(&mut daemon).await;
    let m = alice.message("general", "orphan", None);
    alice.post("general", &m).await.unwrap();
    remove_acl(&insp.js, &insp.names, &p, &u).await.unwrap();

    let mut daemon = start_daemon(&mesh).await;
    let line = daemon
        .wait_for_line(
            "gave up on entry for unknown owner",
            Duration::from_secs(15),
        )
        .await
        .unwrap();
    eventually("the reader terminated it", SURFACE_BOUND, || async {
        let r = consumer(&insp, &insp.names.inbox_stream(), "reader").await;
        r.num_pending == 0 && r.num_ack_pending == 0
    })
    .await;
    let r = consumer(&insp, &insp.names.inbox_stream(), "reader").await;
    // Ten deliveries: the first and nine redeliveries.
    assert_eq!(
        r.num_redelivered, 0,
        "terminated entries are not pending redelivery"
    );
    assert!(r.delivered.consumer_sequence >= 10, "{:?}", r.delivered);
    // Term does not delete: the entry is kept in the stream.
    assert_eq!(inbox_count(&insp, &p, &u).await, 1);
    assert_eq!(dlv_count(&insp, &p, &u).await, 0);
    snapshot_settings().bind(|| {
        insta::assert_snapshot!("data_path_unknown_owner_given_up", line);
    });
    stop_daemon(&mut daemon).await;
}
