//! A refused request changes nothing: a `durableJoin` refused because the daemon quiesced while
//! it ran leaves no member row and no copies, checked on the broker.
//!
//! Each attempt is a fresh lifecycle (so "no row" means the key never kept one). The test watches
//! the member key on the broker; the moment the join's row write lands there it freezes the
//! daemon, an operator deletes the lease row, and the daemon thaws with the lease watch and the
//! rest of the join racing. A join that completes is a valid outcome of an attempt; a refused
//! one must have left nothing: the key holds no row (its delete marker proves the join had
//! written the row and took it back), and posts made after the refusal are not copied to the
//! lifecycle that was refused. Attempts continue until a refusal came after the row write.

use std::time::Duration;

use cotal_delivery::agent::AgentErrorKind;
use cotal_delivery::base::{Read, Rows};
use cotal_delivery::wire::SpaceNames;
use delivery_harness::rig::agent;
use futures::StreamExt;
use serde_json::json;

use crate::support::data_path::*;

/// Attempts at catching the join after its row write; each one is checked either way.
const ATTEMPTS: usize = 40;

/// Mutation seen failing this test: `undo_join` not called on the stopped-serving path (the
/// refused join's row stays, and the post after the refusal is copied to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_refused_by_a_quiesce_leaves_no_member_row_and_no_copies() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = crate::support::start(daemon_spec(&mesh)).await;
    let (bob, _) = agent::spawn(&mesh, &insp, "bob", &["general"])
        .await
        .unwrap();
    let members = Rows::open(
        &insp.js,
        &insp.names.members_bucket(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();

    let (mut before_write, mut after_write, mut completed) = (0, 0, 0);
    for attempt in 1..=ATTEMPTS {
        let (alice, alice_m) = agent::spawn(&mesh, &insp, &format!("alice{attempt}"), &["general"])
            .await
            .unwrap();
        let resumed_before = daemon
            .lines()
            .iter()
            .filter(|l| l.contains("serving shard 0 again"))
            .count();
        // Posts captured before the join: its cursor lies above them, they are never owed.
        let m = bob.message("general", &format!("before-{attempt}"), None);
        bob.post("general", &m).await.unwrap();
        let key = SpaceNames::member_key("general", &alice_m.principal, &alice_m.lifecycle_uid);
        let mut written = insp
            .client
            .subscribe(format!("$KV.{}.{key}", insp.names.members_bucket()))
            .await
            .unwrap();
        insp.sync().await.unwrap();
        let args = json!({"channel": "general", "lifecycleUid": alice_m.lifecycle_uid.as_str()});
        let join = {
            let alice = &alice;
            async move {
                alice
                    .request("durableJoin", args, Duration::from_secs(15))
                    .await
            }
        };
        let (reply, _) = tokio::join!(join, async {
            // The row write is on the broker: stop the join right there, then quiesce.
            let _ = tokio::time::timeout(Duration::from_secs(5), written.next())
                .await
                .expect("the join writes its row");
            daemon.freeze().unwrap();
            insp.delete_lease().await.unwrap();
            daemon.thaw().unwrap();
        });
        eventually("the daemon resumes", UP_BOUND, || async {
            daemon
                .lines()
                .iter()
                .filter(|l| l.contains("serving shard 0 again"))
                .count()
                > resumed_before
        })
        .await;
        match reply {
            Ok(data) => {
                assert_eq!(data["durable"], true, "a completed join: {data}");
                assert!(
                    matches!(members.read(&key).await.unwrap(), Read::Present(_)),
                    "a completed join has its row"
                );
                completed += 1;
                drop(written);
                continue;
            }
            Err(e) => {
                assert_eq!(e.kind(), AgentErrorKind::Refused, "{e}");
                assert!(
                    e.detail().contains("stopped serving this shard")
                        || e.detail().contains("not serving this shard"),
                    "only the quiesce refusal: {e}"
                );
            }
        }
        // Refused: no row on the broker, whether or not one was written first.
        match members.read(&key).await.unwrap() {
            Read::Present(row) => panic!(
                "a refused join left its member row: {}",
                String::from_utf8_lossy(&row.value)
            ),
            Read::Absent {
                marker_revision: Some(_),
            } => after_write += 1,
            Read::Absent {
                marker_revision: None,
            } => before_write += 1,
        }
        // And no copies, now or for posts after the refusal.
        let m = bob.message("general", &format!("after-{attempt}"), None);
        bob.post("general", &m).await.unwrap();
        drained(&insp, SURFACE_BOUND).await;
        assert_eq!(
            inbox_count(&insp, &alice_m.principal, &alice_m.lifecycle_uid).await,
            0,
            "copies stored for a refused join"
        );
        if after_write > 0 {
            break;
        }
    }
    eprintln!(
        "quiesce refusals: {after_write} after the row write (taken back), {before_write} before it; {completed} joins completed"
    );
    assert!(
        after_write > 0,
        "no attempt caught the join after its row write ({before_write} refusals before it, {completed} completed)"
    );
    stop_daemon(&mut daemon).await;
}

/// A `durableLeave` refused after its leave cursor landed takes the row back. The daemon dials
/// through a proxy that holds its outgoing bytes from the leave's row write on (the `HPUB` of the
/// member key; the read before it carries the key only in a request body), an operator deletes
/// the lease, and the hold is released once the keeper marks the lease not-ready (the gate is
/// closed). The write then lands under a closed gate: the leave must answer the in-flight
/// refusal and restore the row, both seen on the broker (a watch on the key sees the leave
/// cursor written, then the row without it), and bob stays a member once serving again.
///
/// Mutation seen failing this test: the take-back in `durable_leave` replaced by a no-op (the
/// watch on the key never sees the row restored: "the leave write and its take-back" times out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_refused_after_its_write_takes_the_row_back() {
    use cotal_delivery::plane::STOPPED_SERVING;
    use cotal_delivery::wire::LEASE_KEY;

    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (proxy, mut daemon) = start_daemon_via_proxy(&mesh).await;
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    let (p, u) = (bob_m.principal.clone(), bob_m.lifecycle_uid.clone());
    let joined = bob.durable_join("general").await.unwrap();
    let cotal_delivery::agent::Backstop::Durable { generation } = joined.backstop else {
        panic!("bob's join is durable");
    };
    let key = SpaceNames::member_key("general", &p, &u);
    let key_subject = format!("$KV.{}.{key}", insp.names.members_bucket());
    let mut watch = insp.client.subscribe(key_subject.clone()).await.unwrap();
    insp.sync().await.unwrap();
    let write = format!("HPUB {key_subject}");
    let lease_subject = format!("$KV.{}.{LEASE_KEY}", insp.names.delivery_bucket());
    proxy.hold_from(write.as_bytes());

    let args = json!({"channel": "general", "generation": generation, "lifecycleUid": u.as_str()});
    let (reply, _) = tokio::join!(
        bob.request("durableLeave", args, Duration::from_secs(15)),
        async {
            proxy
                .wait_held(&write, Duration::from_secs(3))
                .await
                .unwrap();
            insp.delete_lease().await.unwrap();
            proxy
                .wait_held(&lease_subject, Duration::from_secs(3))
                .await
                .unwrap();
            proxy.release();
        }
    );
    let e = reply.expect_err("a leave across a quiesce is refused");
    assert_eq!(e.kind(), AgentErrorKind::Refused, "{e}");
    assert_eq!(e.detail(), STOPPED_SERVING, "the in-flight refusal: {e}");

    // On the broker: the leave cursor was written, then taken back.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let m = tokio::time::timeout(SURFACE_BOUND, watch.next())
            .await
            .expect("the leave write and its take-back")
            .unwrap();
        seen.push(serde_json::from_slice::<serde_json::Value>(&m.payload).unwrap());
    }
    assert!(
        seen[0]["leaveCursor"].is_u64(),
        "the leave landed: {}",
        seen[0]
    );
    assert!(
        seen[1].get("leaveCursor").is_none(),
        "taken back: {}",
        seen[1]
    );
    let row = member_row(&insp, "general", &p, &u).await.expect("row");
    assert!(row.get("leaveCursor").is_none(), "the row is open: {row}");
    assert_eq!(row["generation"], generation, "{row}");

    // Serving again, bob is still a member: a new post is copied to him.
    daemon
        .wait_for_line("serving shard 0 again", UP_BOUND)
        .await
        .unwrap();
    let m = alice.message("general", "after-refused-leave", None);
    alice.post("general", &m).await.unwrap();
    eventually("the post reaches bob's store", SURFACE_BOUND, || async {
        inbox_count(&insp, &p, &u).await == 1
    })
    .await;
    stop_daemon(&mut daemon).await;
}

/// A post no stream takes (the broker's no-responders answer: nothing stored) is told apart
/// from a refusal, so a sender may send the same post again; the kit's `post` step does until
/// its bound, for a cluster whose CHAT stream has no leader yet after a node loss. Checked on a
/// space whose CHAT stream an operator deleted. Mutation seen failing: `Agent::post` mapping
/// the ack's `StreamNotFound` to `Broker` like every other failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_no_stream_takes_is_told_apart_as_no_responders() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    insp.js
        .delete_stream(insp.names.chat_stream())
        .await
        .expect("the operator deletes the CHAT stream");
    let e = alice
        .post("general", &alice.message("general", "nowhere", None))
        .await
        .expect_err("no stream takes the post");
    assert_eq!(e.kind(), AgentErrorKind::NoResponders, "{e}");
}
