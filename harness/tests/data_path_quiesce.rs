//! A request the daemon admitted before it quiesced is refused, never answered `ok`.
//!
//! The daemon is frozen; an agent's `durableJoin` is routed to it (the test sees the broker
//! route it); an operator deletes the lease row; the daemon is thawed with both in its socket.
//! The lease watch quiesces it before the join's handler can finish its round trips, so the
//! handler's reply is the refusal. Whichever wins on a given attempt, a reply is only ever a
//! completed join or that refusal, and the daemon resumes serving under a re-created lease.

mod data_path_support;

use std::time::Duration;

use cotal_delivery::agent::AgentErrorKind;
use delivery_harness::agent;
use futures::StreamExt;
use serde_json::json;

use data_path_support::*;

/// Attempts at catching the handler inside the quiesce; each one is valid either way.
const ATTEMPTS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_admitted_before_a_quiesce_is_refused_not_answered_ok() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = start_daemon(&mesh).await;
    let (alice, alice_m) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    // The test side sees every request the broker routes on the rail.
    let mut routed = insp
        .client
        .subscribe(
            insp.names
                .ctl_serve(cotal_delivery::wire::CtlService::Delivery),
        )
        .await
        .unwrap();
    insp.sync().await.unwrap();

    let mut refusals = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let resumed_before = daemon
            .lines()
            .iter()
            .filter(|l| l.contains("serving shard 0 again"))
            .count();
        daemon.freeze().unwrap();
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
            // Once the broker routed the request (to us and to the frozen daemon), the
            // operator deletes the row, and the daemon thaws with both waiting for it.
            let _ = tokio::time::timeout(Duration::from_secs(5), routed.next())
                .await
                .expect("the request is routed");
            insp.delete_lease().await.unwrap();
            daemon.thaw().unwrap();
        });
        match reply {
            Ok(data) => assert_eq!(data["durable"], true, "a completed join: {data}"),
            Err(e) => {
                assert_eq!(e.kind(), AgentErrorKind::Refused, "{e}");
                assert!(
                    e.detail().contains("stopped serving this shard")
                        || e.detail().contains("not serving this shard"),
                    "only the quiesce refusal: {e}"
                );
                refusals.push(e.detail().to_string());
            }
        }
        // The daemon re-created its lease and serves again.
        eventually("the daemon resumes", UP_BOUND, || async {
            daemon
                .lines()
                .iter()
                .filter(|l| l.contains("serving shard 0 again"))
                .count()
                > resumed_before
        })
        .await;
        insp.lease().await.unwrap().expect("lease re-created");
        if !refusals.is_empty() {
            eprintln!("refused on attempt {attempt}: {}", refusals[0]);
            break;
        }
    }
    assert!(
        !refusals.is_empty(),
        "no attempt caught a request inside the quiesce"
    );
    assert!(daemon.is_running());
    stop_daemon(&mut daemon).await;
}
