//! A request the daemon admitted before it quiesced is refused, never answered `ok`.
//!
//! The daemon dials through a proxy that holds its outgoing bytes from the join handler's first
//! round trip on (the leader read of alice's ACL row), so the handler is admitted and pinned in
//! flight. An operator deletes the lease row; the watch event still reaches the daemon (only its
//! outgoing direction is held), and the test waits until the held bytes show the keeper marking
//! the lease not-ready, which it does only after the serving gate closed. Then the hold is
//! released: the handler's round trips complete under a closed gate, and its reply must be the
//! in-flight refusal, with nothing written on the broker.

use std::time::Duration;

use cotal_delivery::agent::AgentErrorKind;
use cotal_delivery::plane::{NOT_SERVING, STOPPED_SERVING};
use cotal_delivery::rails::HANDLER_JOIN_BOUND;
use cotal_delivery::wire::{SpaceNames, LEASE_KEY};
use delivery_harness::rig::agent;
use serde_json::json;

use crate::support::data_path::*;

/// Bound on seeing the held bytes reach a given request. The handler's held read times out
/// after the daemon's 5 s request bound, so the release must come well before that.
const HELD_BOUND: Duration = Duration::from_secs(3);

/// Mutations caught: the quiesce line said after the plane's unbinding (`Keeper::quiesce` as
/// before cc9198c: the line arrives only once the pinned handler's bound ran out); the in-flight
/// checks removed (`still(epoch)` in `plane/durable.rs` and in the
/// rail's reply path always true) — the held join then completes and answers `ok`, and its
/// member row appears on the broker. The drain's `not serving` refusal cannot stand in for it:
/// the test demands the `stopped serving` text and the handler is proved admitted (its ACL read
/// is what triggered the hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_admitted_before_a_quiesce_is_refused_not_answered_ok() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (proxy, mut daemon) = start_daemon_via_proxy(&mesh).await;
    let (alice, alice_m) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    let acl_subject = format!(
        "$KV.{}.{}",
        insp.names.acl_bucket(),
        SpaceNames::acl_key(&alice_m.principal, &alice_m.lifecycle_uid)
    );
    let lease_subject = format!("$KV.{}.{LEASE_KEY}", insp.names.delivery_bucket());
    proxy.hold_from(acl_subject.as_bytes());

    let args = json!({"channel": "general", "lifecycleUid": alice_m.lifecycle_uid.as_str()});
    let (reply, _) = tokio::join!(
        alice.request("durableJoin", args.clone(), Duration::from_secs(15)),
        async {
            // Admitted and in flight: its ACL read left the daemon and is held.
            proxy.wait_held(&acl_subject, HELD_BOUND).await.unwrap();
            insp.delete_lease().await.unwrap();
            // The quiesce line is said as the gate closes, while the pinned handler still holds
            // the unbinding up (the rail waits up to HANDLER_JOIN_BOUND for it): well before
            // that bound, with the not-ready write, which follows the unbinding, not yet sent.
            daemon
                .wait_for_line("stopped serving shard 0", HANDLER_JOIN_BOUND / 2)
                .await
                .unwrap();
            assert!(
                !String::from_utf8_lossy(&proxy.held()).contains(&lease_subject),
                "the not-ready write went out before the quiesce line"
            );
            // The keeper closed the gate, unbound, and is now marking the lease not-ready.
            proxy.wait_held(&lease_subject, HELD_BOUND).await.unwrap();
            proxy.release();
        }
    );
    let e = reply.expect_err("an admitted join across a quiesce is refused");
    assert_eq!(e.kind(), AgentErrorKind::Refused, "{e}");
    assert_eq!(e.detail(), STOPPED_SERVING, "the in-flight refusal: {e}");
    assert_ne!(e.detail(), NOT_SERVING);

    // The daemon re-created its lease and serves again.
    daemon
        .wait_for_line("serving shard 0 again", UP_BOUND)
        .await
        .unwrap();
    assert!(daemon.has_line("stopped serving shard 0"));
    insp.lease().await.unwrap().expect("lease re-created");
    // The refused join wrote nothing.
    assert_eq!(
        member_row(&insp, "general", &alice_m.principal, &alice_m.lifecycle_uid).await,
        None,
        "a refused join left a member row"
    );
    // Serving again, the same join completes and is on the broker.
    let data = alice
        .request("durableJoin", args, Duration::from_secs(15))
        .await
        .expect("joins once serving again");
    assert_eq!(data["durable"], true, "{data}");
    assert!(
        member_row(&insp, "general", &alice_m.principal, &alice_m.lifecycle_uid)
            .await
            .is_some(),
        "the completed join's member row"
    );
    assert!(daemon.is_running());
    stop_daemon(&mut daemon).await;
}
