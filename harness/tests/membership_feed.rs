//! The membership feed against a real broker (issue 12, "Must show"): its rows and heartbeat
//! appear in `cotal_membership_<s>` from the broker's own CONNZ and the members registry, a
//! feed fault (a missing credential, its bucket deleted under it) leaves delivery serving, and
//! `reloadCreds` moves its rw connection onto the renewed credential (`/connz`).

#[macro_use]
mod health_support;
mod data_path_support;

use std::time::Duration;

use cotal_delivery::creds::read_creds_file;
use cotal_delivery::space::feed::{FeedRow, RW_NAME};
use cotal_delivery::space::renew::{remint_daemon_creds_for, Preflight};
use delivery_harness::daemon::Daemon;
use delivery_harness::mesh::{Inspector, Mesh};
use serde_json::json;

use data_path_support::{alice_and_bob, dlv_count, eventually, row};
use health_support::Supervisor;

const FEED_UP: &str = "✓ membership feed up (broker-sourced channel membership) — space demo";
const BOUND: Duration = Duration::from_secs(20);

async fn start(mesh: &Mesh) -> Daemon {
    let mut d = data_path_support::daemon_spec(mesh)
        .env("COTAL_DELIVERY_MEMBERSHIP_INTERVAL_MS", "300")
        .spawn()
        .expect("spawn");
    d.wait_for_line("delivery daemon up", BOUND)
        .await
        .expect("daemon up");
    d
}

async fn feed_row(insp: &Inspector, key: &str) -> Option<FeedRow> {
    row(insp, &insp.names.membership_bucket(), key)
        .await
        .and_then(|v| serde_json::from_value(v).ok())
}

/// The connection named `name` in `/connz?auth=true`: its JWT.
async fn jwt_of(mesh: &Mesh, name: &str) -> Option<String> {
    let connz = mesh.broker.monitor("/connz?auth=true").await.ok()?;
    connz["connections"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
        .and_then(|c| c["jwt"].as_str().map(str::to_string))
}

/// Rows appear: one per principal, `live` from the broker's CONNZ (the agents' live chat
/// subscriptions, attributed by their `principal:` JWT tag), `durable` from the members
/// registry, and the `=feed` heartbeat; a principal that disconnects and holds no durable row
/// is pruned. Mutations seen failing: ignoring the `principal:` tag in `Sweeper::conn` (no
/// rows), and skipping the prune loop (alice's row stayed).
#[tokio::test]
async fn rows_and_heartbeat_appear_and_a_gone_principal_is_pruned() {
    let mesh = data_path_support::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = start(&mesh).await;
    d.wait_for_line(FEED_UP, BOUND).await.expect("feed up");
    let (alice, (bob, _bob_m)) = alice_and_bob(&mesh, &insp).await;
    let _joined = bob.durable_join("general").await.unwrap();
    // alice joins live only: a broker-enforced subscription, no registry row.
    let live = alice
        .client()
        .subscribe(insp.names.chat_read_subject("general"))
        .await
        .unwrap();
    alice.client().flush().await.unwrap();
    eventually("alice and bob rows", BOUND, || async {
        let a = feed_row(&insp, "local.alice").await;
        let b = feed_row(&insp, "local.bob").await;
        matches!((a, b), (Some(a), Some(b))
            if a.live == ["general"] && a.durable.is_empty()
            && b.live == ["general"] && b.durable == ["general"])
    })
    .await;
    let beat = row(&insp, &insp.names.membership_bucket(), "=feed")
        .await
        .expect("heartbeat");
    assert!(beat["observedAt"].as_u64().unwrap_or(0) > 0, "{beat}");
    // alice goes away: her row is pruned; bob's durable membership keeps his.
    drop(live);
    drop(alice);
    eventually("alice's row pruned", BOUND, || async {
        feed_row(&insp, "local.alice").await.is_none()
    })
    .await;
    assert!(feed_row(&insp, "local.bob").await.is_some());
    d.terminate().unwrap();
    d.wait_exit(BOUND).await.unwrap();
}

/// A feed fault does not disturb delivery. Without its `membership-rw` credential the feed
/// says it is down (the reference line) and the daemon serves; with its bucket deleted under
/// it, the feed reports the degradation once and a durable post is still handed off, on the
/// daemon still running. Mutation seen failing: refusing the start when the feed is down
/// (`SpaceDaemon::start` returning an error): the post was never handed off.
#[tokio::test]
async fn a_feed_fault_does_not_disturb_delivery() {
    let mesh = data_path_support::mesh().await;
    let space = mesh.space().clone();
    let insp = mesh.inspector(&space).await.unwrap();
    let rw_path = mesh.workspace().membership_rw_creds_path(&space);
    let saved = std::fs::read(&rw_path).unwrap();
    std::fs::remove_file(&rw_path).unwrap();
    let mut d = start(&mesh).await;
    d.wait_for_line("• membership: no membership-rw credential at ", BOUND)
        .await
        .expect("down line");
    assert!(d.has_line(". The graph falls back to traffic-only; delivery is unaffected."));
    let (alice, (bob, bob_m)) = alice_and_bob(&mesh, &insp).await;
    let _joined = bob.durable_join("general").await.unwrap();
    let (p, u) = (bob_m.principal.clone(), bob_m.lifecycle_uid.clone());
    alice
        .post("general", &alice.message("general", "feed-down", None))
        .await
        .unwrap();
    eventually("handed off with the feed down", BOUND, || async {
        dlv_count(&insp, &p, &u).await == 1
    })
    .await;
    d.terminate().unwrap();
    d.wait_exit(BOUND).await.unwrap();

    // A runtime fault: the feed's bucket is deleted under a running feed.
    std::fs::write(&rw_path, saved).unwrap();
    let mut d = start(&mesh).await;
    d.wait_for_line(FEED_UP, BOUND).await.expect("feed up");
    insp.js
        .delete_stream(cotal_delivery::wire::SpaceNames::kv_stream(
            &insp.names.membership_bucket(),
        ))
        .await
        .unwrap();
    d.wait_for_line("; graph membership degraded, delivery unaffected", BOUND)
        .await
        .expect("degraded line");
    alice
        .post("general", &alice.message("general", "feed-faulted", None))
        .await
        .unwrap();
    eventually("handed off with the feed faulted", BOUND, || async {
        dlv_count(&insp, &p, &u).await == 2
    })
    .await;
    assert!(d.is_running());
    let degraded = d
        .lines()
        .iter()
        .filter(|l| l.contains("graph membership degraded"))
        .count();
    assert_eq!(degraded, 1, "reported once per episode: {}", d.transcript());
    d.terminate().unwrap();
    d.wait_exit(BOUND).await.unwrap();
}

/// `reloadCreds` moves the feed's rw connection onto the renewed `membership-rw` credential:
/// the reply's membership component says `residentSwap: "best-effort"` and `/connz` shows the
/// renewed JWT on `cotal-membership-rw`. Mutation seen failing: not setting the feed's cell in
/// `Renewal::reload_membership` (the old JWT stayed in `/connz`).
#[tokio::test]
async fn reload_creds_moves_the_feed_onto_the_renewed_credential() {
    let mesh = data_path_support::mesh().await;
    mesh.authority
        .save(&mesh.workspace().auth_dir())
        .expect("save signer");
    let mut d = start(&mesh).await;
    d.wait_for_line(FEED_UP, BOUND).await.expect("feed up");
    let rw_path = mesh.workspace().membership_rw_creds_path(mesh.space());
    let before = read_creds_file(&rw_path).unwrap();
    assert_eq!(jwt_of(&mesh, RW_NAME).await, Some(before.jwt.clone()));
    let report = remint_daemon_creds_for(
        mesh.root(),
        mesh.space(),
        None,
        Some(&Preflight::new(mesh.url(), None)),
        Duration::from_secs(600),
    )
    .await;
    assert!(report.all_written(), "{report:?}");
    let renewed = read_creds_file(&rw_path).unwrap();
    assert_ne!(renewed.jwt, before.jwt);
    let boss = Supervisor::connect(&mesh, mesh.space()).await;
    let reply = boss
        .request("reloadCreds", json!({}), Duration::from_secs(15))
        .await
        .expect("answered");
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(
        reply["data"]["membership"]["residentSwap"], "best-effort",
        "{reply}"
    );
    eventually(
        "the rw connection presents the renewed JWT",
        BOUND,
        || async { jwt_of(&mesh, RW_NAME).await == Some(renewed.jwt.clone()) },
    )
    .await;
    d.terminate().unwrap();
    d.wait_exit(BOUND).await.unwrap();
}
