//! A durable join is atomic across the broker-confirmed live subscribe and the membership write:
//! when the broker refuses the live subscription (here: the ACL row is wider than what the
//! credential may subscribe to), the join fails and no live membership is left behind, whether
//! the refusal arrived before the daemon wrote the row or after (then the row is taken back).

use cotal_delivery::agent::AgentErrorKind;
use cotal_delivery::provision::set_read_acl;
use delivery_harness::rig::agent;

use crate::support::data_path::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_live_subscription_leaves_no_durable_membership() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = crate::support::start(daemon_spec(&mesh)).await;
    // bob's credential may subscribe to `general` only; his ACL row also lists `secret`.
    let (bob, bob_m) = agent::spawn(&mesh, &insp, "bob", &["general"])
        .await
        .unwrap();
    set_read_acl(
        &insp.js,
        &insp.names,
        &bob_m.principal,
        &bob_m.lifecycle_uid,
        vec!["general".into(), "secret".into()],
    )
    .await
    .unwrap();

    let err = match bob.durable_join("secret").await {
        Ok(j) => panic!(
            "joined despite a refused live subscription: {:?}",
            j.backstop
        ),
        Err(e) => e,
    };
    assert_eq!(err.kind(), AgentErrorKind::Broker, "{err}");
    assert!(
        err.detail().contains("refused the live subscription"),
        "{err}"
    );
    eprintln!("{err}");
    // Broker state: no live membership row for `secret` (absent, or a tombstone).
    let row = member_row(&insp, "secret", &bob_m.principal, &bob_m.lifecycle_uid).await;
    if let Some(row) = &row {
        assert!(
            row.get("leaveCursor").is_some_and(|c| c.is_u64()),
            "a membership row without a leave cursor was left: {row}"
        );
    }
    // The allowed channel still joins durably.
    bob.durable_join("general").await.unwrap();
    stop_daemon(&mut daemon).await;
}
