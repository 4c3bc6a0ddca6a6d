//! The membership feed against a real broker (issue 12, "Must show"): its rows and heartbeat
//! appear in `cotal_membership_<s>` from the broker's own CONNZ and the members registry, a
//! feed fault (a missing credential, its bucket deleted under it) leaves delivery serving,
//! `reloadCreds` moves its rw connection onto the renewed credential (`/connz`), `close()`
//! closes both connections for good even when their drains fail, and the `membership-rw`
//! grants are confined.

use std::sync::Arc;
use std::time::Duration;

use crate::support::BOUND;
use cotal_delivery::base::{
    self, read_creds_file, Credential, CredentialCell, DialSpec, DrainErrorKind, FsStore, Journal,
    SecretStore,
};
use cotal_delivery::provision::{remint_daemon_creds_for, Preflight};
use cotal_delivery::provision::{MintOptions, Profile};
use cotal_delivery::space::TIMER_CONNECTION_NAME as TIMER_WRITER;
use cotal_delivery::space::{FeedParts, FeedRow, MembershipFeed, DEBOUNCE, OBSERVER_NAME, RW_NAME};
use delivery_harness::rig::daemon::{Daemon, DaemonSpec};
use delivery_harness::rig::mesh::{Inspector, Mesh};
use delivery_harness::ConnState;
use delivery_harness::TcpProxy;
use serde_json::json;

use crate::support::data_path::{alice_and_bob, dlv_count, eventually, row};
use crate::support::health::Supervisor;

const FEED_UP: &str = "✓ membership feed up (broker-sourced channel membership) — space demo";

/// The data-path tests' daemon with its feed's sweep interval at `interval_ms`.
fn sweeping_every(mesh: &Mesh, interval_ms: &str) -> DaemonSpec {
    crate::support::data_path::daemon_spec(mesh)
        .env("COTAL_DELIVERY_MEMBERSHIP_INTERVAL_MS", interval_ms)
}

async fn feed_row(insp: &Inspector, key: &str) -> Option<FeedRow> {
    row(insp, &insp.names.membership_bucket(), key)
        .await
        .and_then(|v| serde_json::from_value(v).ok())
}

/// The connection named `name` in `/connz?auth=true`: its JWT.
async fn jwt_of(mesh: &Mesh, name: &str) -> Option<String> {
    let open = mesh.broker.connz_named(ConnState::Open, name).await.ok()?;
    open.into_iter().next()?.jwt
}

/// The renewal owner re-mints the space's standing credentials into the workspace; the
/// `membership-rw` credential it wrote, checked to be a new generation of `live`.
async fn remint_rw(mesh: &Mesh, live: &Credential) -> Credential {
    let report = remint_daemon_creds_for(
        mesh.root(),
        mesh.space(),
        None,
        Some(&Preflight::new(mesh.url(), None)),
        Duration::from_secs(600),
    )
    .await;
    assert!(report.all_written(), "{report:?}");
    let rw_path = mesh.workspace().membership_rw_creds_path(mesh.space());
    let renewed = read_creds_file(&rw_path).unwrap();
    assert_ne!(renewed.jwt, live.jwt);
    renewed
}

/// alice live on `general` only (a broker-enforced subscription, no registry row) and bob
/// joined to it durably, both connected (held by the value: bind it whole, or bob leaves), once
/// the feed's rows show exactly that.
struct Principals {
    alice: cotal_delivery::agent::Agent,
    live: async_nats::Subscriber,
    _bob: cotal_delivery::agent::Agent,
    _bob_material: cotal_delivery::provision::AgentMaterial,
    _joined: cotal_delivery::agent::Joined,
}

async fn alice_live_bob_durable(mesh: &Mesh, insp: &Inspector) -> Principals {
    let (alice, (bob, bob_material)) = alice_and_bob(mesh, insp).await;
    let joined = bob.durable_join("general").await.unwrap();
    let live = alice
        .client()
        .subscribe(insp.names.chat_read_subject("general"))
        .await
        .unwrap();
    alice.client().flush().await.unwrap();
    eventually("alice and bob rows", BOUND, || async {
        let a = feed_row(insp, "local.alice").await;
        let b = feed_row(insp, "local.bob").await;
        matches!((a, b), (Some(a), Some(b))
            if a.live == ["general"] && a.durable.is_empty()
            && b.live == ["general"] && b.durable == ["general"])
    })
    .await;
    Principals {
        alice,
        live,
        _bob: bob,
        _bob_material: bob_material,
        _joined: joined,
    }
}

/// Rows appear: one per principal, `live` from the broker's CONNZ (the agents' live chat
/// subscriptions, attributed by their `principal:` JWT tag), `durable` from the members
/// registry, and the `=feed` heartbeat; a principal that disconnects and holds no durable row
/// is pruned. Mutations seen failing: ignoring the `principal:` tag in `Sweeper::conn` (no
/// rows), and skipping the prune loop (alice's row stayed).
#[tokio::test]
async fn rows_and_heartbeat_appear_and_a_gone_principal_is_pruned() {
    let (mesh, insp, mut d) = feed_up("300").await;
    let p = alice_live_bob_durable(&mesh, &insp).await;
    let beat = row(&insp, &insp.names.membership_bucket(), "=feed")
        .await
        .expect("heartbeat");
    assert!(beat["observedAt"].as_u64().unwrap_or(0) > 0, "{beat}");
    // alice goes away: her row is pruned; bob's durable membership keeps his.
    drop(p.live);
    drop(p.alice);
    eventually("alice's row pruned", BOUND, || async {
        feed_row(&insp, "local.alice").await.is_none()
    })
    .await;
    assert!(feed_row(&insp, "local.bob").await.is_some());
    d.terminate().unwrap();
    d.wait_exit(BOUND).await.unwrap();
}

/// The revision of `key`'s last message in the membership bucket (a delete marker counts).
async fn feed_revision(insp: &Inspector, key: &str) -> Option<u64> {
    let kv = insp
        .js
        .get_key_value(insp.names.membership_bucket())
        .await
        .expect("membership bucket");
    kv.entry(key).await.expect("entry").map(|e| e.revision)
}

/// A daemon that starts again in front of the rows its feed wrote rewrites none that has not
/// changed: its first sweep seeds what it wrote from the bucket, so the broker receives only
/// the heartbeat; a row that does change after the restart (alice's live subscription gone) is
/// still written (pruned). Mutation seen failing: the seed skipped in `Sweeper::sweep` (bob's
/// and alice's rows written again by the restarted daemon's first sweep, their revisions
/// advanced).
#[tokio::test]
async fn a_restarted_feed_does_not_rewrite_rows_that_have_not_changed() {
    let (mesh, insp, mut d) = feed_up("300").await;
    let p = alice_live_bob_durable(&mesh, &insp).await;
    let alice_rev = feed_revision(&insp, "local.alice").await.expect("alice");
    let bob_rev = feed_revision(&insp, "local.bob").await.expect("bob");
    d.terminate().unwrap();
    d.wait_exit(BOUND).await.unwrap();
    let beat = feed_revision(&insp, "=feed").await.expect("heartbeat");

    let mut d = crate::support::start(sweeping_every(&mesh, "300")).await;
    d.wait_for_line(FEED_UP, BOUND)
        .await
        .expect("feed up again");
    // The heartbeat is the last write of a sweep: once it moves, the first sweep is done.
    eventually("the restarted daemon's first sweep", BOUND, || async {
        feed_revision(&insp, "=feed").await > Some(beat)
    })
    .await;
    assert_eq!(
        (
            feed_revision(&insp, "local.alice").await,
            feed_revision(&insp, "local.bob").await
        ),
        (Some(alice_rev), Some(bob_rev)),
        "unchanged rows rewritten by the restarted daemon's first sweep"
    );
    drop(p.live);
    p.alice.client().flush().await.unwrap();
    eventually("alice's row pruned after the restart", BOUND, || async {
        feed_row(&insp, "local.alice").await.is_none()
    })
    .await;
    assert_eq!(feed_revision(&insp, "local.bob").await, Some(bob_rev));
    d.terminate().unwrap();
    d.wait_exit(BOUND).await.unwrap();
}

/// A sweep whose inputs have not changed since the last complete one (the same live channels
/// in CONNZ, the members cache not moved) compares no principal and writes only the heartbeat;
/// a change (alice's live subscription gone) is compared and pruned by the next sweep. Read
/// from the feed's `membership sweep` debug line (the pass it skips writes nothing either way,
/// so the broker cannot tell; its cost is CPU, docs/performance-history.md). Mutation seen failing:
/// `unchanged` always false in `Sweeper::sweep` (every sweep compared bob and alice).
#[tokio::test]
async fn a_sweep_with_nothing_changed_compares_no_principal() {
    let mesh = crate::support::data_path::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = crate::support::data_path::daemon_spec(&mesh)
        .env("COTAL_DELIVERY_MEMBERSHIP_INTERVAL_MS", "300")
        .env("RUST_LOG", "cotal_delivery::space::feed=debug")
        .spawn()
        .expect("spawn");
    d.wait_for_line(FEED_UP, BOUND).await.expect("feed up");
    let p = alice_live_bob_durable(&mesh, &insp).await;
    let before = sweeps(&d).len();
    eventually("a sweep that compares no principal", BOUND, || async {
        sweeps(&d)[before..]
            .iter()
            .any(|l| l.contains(" compared=0 "))
    })
    .await;
    let beat = feed_revision(&insp, "=feed").await.expect("heartbeat");
    eventually(
        "the heartbeat written by the quiet sweeps",
        BOUND,
        || async { feed_revision(&insp, "=feed").await > Some(beat) },
    )
    .await;

    let quiet = sweeps(&d).len();
    drop(p.live);
    p.alice.client().flush().await.unwrap();
    eventually("alice's row pruned", BOUND, || async {
        feed_row(&insp, "local.alice").await.is_none()
    })
    .await;
    let after = sweeps(&d);
    assert!(
        after[quiet..]
            .iter()
            .any(|l| l.contains(" compared=1 ") && l.contains(" pruned=1 ")),
        "the change compared (bob) and pruned (alice): {after:#?}"
    );
    d.terminate().unwrap();
    d.wait_exit(BOUND).await.unwrap();
}

/// The feed's `membership sweep` debug lines so far.
fn sweeps(d: &Daemon) -> Vec<String> {
    d.lines()
        .into_iter()
        .filter(|l| l.contains("membership sweep"))
        .collect()
}

/// The membership bucket's last stream sequence: every sweep writes the `=feed` heartbeat, and
/// nothing else changes a row in the burst tests below, so its growth counts the sweeps.
async fn membership_writes(insp: &Inspector) -> u64 {
    let stream = format!("KV_{}", insp.names.membership_bucket());
    let mut s = insp
        .js
        .get_stream(&stream)
        .await
        .expect("membership stream");
    s.info()
        .await
        .expect("membership stream info")
        .state
        .last_sequence
}

/// How long the burst test watches for sweeps after the burst's first one: long enough for
/// several sweeps one [`DEBOUNCE`] apart (a sweep per event), not a wait for readiness.
const SWEEPS_WATCHED: Duration = Duration::from_secs(3);

/// Opens `n` connections in the space's account at once, then closes them at once (2 `n`
/// connect/disconnect events), and returns how many times the burst paused longer than a
/// [`DEBOUNCE`] (gaps between the connects' and closes' completions, as this side saw them):
/// each such pause lets the feed sweep once more.
async fn burst(mesh: &Mesh, n: usize) -> usize {
    let cred = mesh
        .mint(mesh.space(), &Profile::Operator, MintOptions::new())
        .unwrap();
    let names: Vec<String> = (0..n).map(|i| format!("burst-{i}")).collect();
    let opened = futures::future::join_all(names.iter().map(|name| async {
        let c = mesh.connect(&cred, name).await.unwrap();
        (c, tokio::time::Instant::now())
    }))
    .await;
    let closed = futures::future::join_all(opened.iter().map(|(c, _)| async {
        c.drain().await.unwrap();
        tokio::time::Instant::now()
    }))
    .await;
    let mut at: Vec<tokio::time::Instant> = opened.iter().map(|(_, t)| *t).chain(closed).collect();
    at.sort();
    at.windows(2).filter(|w| w[1] - w[0] > DEBOUNCE).count()
}

/// The daemon with its feed sweeping every `interval_ms`, once the feed is up, with the
/// mesh and the test's view of it.
async fn feed_up(interval_ms: &str) -> (Mesh, Inspector, Daemon) {
    let mesh = crate::support::data_path::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = crate::support::start(sweeping_every(&mesh, interval_ms)).await;
    d.wait_for_line(FEED_UP, BOUND).await.expect("feed up");
    (mesh, insp, d)
}

/// A burst of connect and disconnect events is swept once, not once per event (the
/// reference's 400 ms debounce): twenty connections opened and closed at once (forty events)
/// bring exactly one sweep, plus one for each pause longer than [`DEBOUNCE`] that a loaded
/// host put into the burst (measured on this side, printed); the periodic sweep is pushed out
/// of the way (10 min). Mutation seen failing: the old per-event delay (`sleep(DEBOUNCE)` then
/// a sweep, for each event): 5 sweeps in the window.
#[tokio::test]
async fn a_burst_of_connections_is_swept_once() {
    let (mesh, insp, mut d) = feed_up("600000").await;
    // The start's own sweep (the interval's first tick) and the sweeps of the connections made
    // so far (the daemon's, the inspector's) are done once the bucket has been quiet for a while.
    let deadline = tokio::time::Instant::now() + BOUND;
    let mut before = membership_writes(&insp).await;
    loop {
        tokio::time::sleep(DEBOUNCE * 3).await;
        let now = membership_writes(&insp).await;
        if now > 0 && now == before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the feed never went quiet"
        );
        before = now;
    }
    let pauses = burst(&mesh, 20).await;
    eventually("a sweep after the burst", BOUND, || async {
        membership_writes(&insp).await > before
    })
    .await;
    tokio::time::sleep(SWEEPS_WATCHED).await;
    let sweeps = membership_writes(&insp).await - before;
    eprintln!(
        "sweeps after a burst of 40 events with {pauses} pause(s) over the debounce: {sweeps}"
    );
    assert_eq!(
        sweeps,
        1 + pauses as u64,
        "a burst of 40 events with {pauses} pause(s) over the debounce"
    );
    d.terminate().unwrap();
    d.wait_exit(BOUND).await.unwrap();
}

/// Churn that never pauses for a [`DEBOUNCE`] is still swept every interval: a connection
/// opened and closed every 150 ms for 3.5 s under a 1 s interval brings sweeps while it lasts.
/// Mutation seen failing: the interval's branch removed from the debounce wait (1 sweep in the
/// 3.5 s instead of one per interval).
#[tokio::test]
async fn churn_without_a_pause_is_still_swept_every_interval() {
    let (mesh, insp, mut d) = feed_up("1000").await;
    let cred = mesh
        .mint(mesh.space(), &Profile::Operator, MintOptions::new())
        .unwrap();
    let before = membership_writes(&insp).await;
    let until = tokio::time::Instant::now() + Duration::from_millis(3_500);
    let mut opened = 0;
    while tokio::time::Instant::now() < until {
        let c = mesh.connect(&cred, "churn").await.unwrap();
        c.drain().await.unwrap();
        opened += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let during = membership_writes(&insp).await - before;
    eprintln!("{opened} connections in 3.5 s; sweeps while they came: {during}");
    assert!(during >= 2, "{during} sweeps during 3.5 s of churn");
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
    let mesh = crate::support::data_path::mesh().await;
    let space = mesh.space().clone();
    let insp = mesh.inspector(&space).await.unwrap();
    let rw_path = mesh.workspace().membership_rw_creds_path(&space);
    let saved = std::fs::read(&rw_path).unwrap();
    std::fs::remove_file(&rw_path).unwrap();
    let mut d = crate::support::start(sweeping_every(&mesh, "300")).await;
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
    let mut d = crate::support::start(sweeping_every(&mesh, "300")).await;
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
/// renewed JWT on `cotal-membership-rw`; the delivery component adopted the re-signed delivery
/// credential and the timer writer's connection presents it too. Mutations seen failing: not
/// setting the feed's cell in `Renewal::reload_membership` (the old JWT stayed in `/connz`);
/// the writer's forced reconnect on `renewals.changed()` removed (the writer kept the old JWT).
#[tokio::test]
async fn reload_creds_moves_the_feed_onto_the_renewed_credential() {
    let mesh = crate::support::data_path::mesh_with_signer().await;
    let mut d = crate::support::start(sweeping_every(&mesh, "300")).await;
    d.wait_for_line(FEED_UP, BOUND).await.expect("feed up");
    let rw_path = mesh.workspace().membership_rw_creds_path(mesh.space());
    let before = read_creds_file(&rw_path).unwrap();
    assert_eq!(jwt_of(&mesh, RW_NAME).await, Some(before.jwt.clone()));
    let renewed = remint_rw(&mesh, &before).await;
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
    // The same reload adopted the re-signed delivery credential (its own component), and the
    // timer writer's connection moved onto it as well.
    assert!(
        reply["data"]["delivery"]["brokerAccepted"].is_object(),
        "{reply}"
    );
    let delivery = read_creds_file(&mesh.workspace().delivery_creds_path(mesh.space()))
        .unwrap()
        .jwt;
    eventually(
        "the timer writer presents the renewed delivery JWT",
        BOUND,
        || async { jwt_of(&mesh, TIMER_WRITER).await == Some(delivery.clone()) },
    )
    .await;
    d.terminate().unwrap();
    d.wait_exit(BOUND).await.unwrap();
}

/// `close()` with the broker gone: the broker is SIGKILLed by pid under a daemon whose feed is
/// up, the daemon sees the connection drop, and SIGTERM then ends it within [`CLOSE_WITHIN`]
/// with exit 0 and its signalled close line: the lease release, the timer writer's stop and
/// both membership connections' failing drains are each bounded, and the process (so every
/// connection of the feed) is gone (measured ~5 s: the lease release's 5 s reconnect wait).
/// Mutation seen failing: `feed::close_both` never returning after its drains (a hung close:
/// no exit within 20 s). That the closed connections never come back is proved in process,
/// where the process outlives the close: `close_retires_both_feed_connections_even_when_their_drains_fail`.
#[tokio::test]
async fn close_with_the_broker_gone_closes_both_feed_connections_within_a_bound() {
    const CLOSE_WITHIN: Duration = Duration::from_secs(8);
    let mut mesh = crate::support::data_path::mesh().await;
    let mut d = crate::support::start(sweeping_every(&mesh, "300")).await;
    d.wait_for_line(FEED_UP, BOUND).await.expect("feed up");
    let rw_jwt = jwt_of(&mesh, RW_NAME).await;
    assert!(rw_jwt.is_some(), "the rw connection is up before the kill");
    mesh.broker.kill().expect("kill broker");
    mesh.broker.wait_exit(BOUND).await.expect("broker reaped");
    d.wait_for_line("broker connection unavailable, reconnecting", BOUND)
        .await
        .expect("the daemon saw the broker go");
    let asked = std::time::Instant::now();
    d.terminate().unwrap();
    let status = d.wait_exit(BOUND).await.expect("daemon exits");
    let took = asked.elapsed();
    println!(
        "MEASURED SIGTERM with the broker gone -> exit: {} ms",
        took.as_millis()
    );
    assert_eq!(status.code(), Some(0), "{}", d.transcript());
    assert!(
        d.has_line("• delivery: received SIGTERM, exiting (space demo, shard 0)"),
        "{}",
        d.transcript()
    );
    assert!(took < CLOSE_WITHIN, "{took:?}: {}", d.transcript());
}

/// Which of `names` `/connz` lists (every account's connections, the `$SYS` observer's too).
async fn listed(mesh: &Mesh, names: &[&str]) -> Vec<String> {
    let open = mesh.broker.connz(ConnState::Open).await.expect("/connz");
    let mut out: Vec<String> = open
        .into_iter()
        .map(|c| c.name)
        .filter(|n| names.contains(&n.as_str()))
        .collect();
    out.sort();
    out
}

/// How many connections named `name` the broker has seen, open or closed (`/connz?state=all`).
async fn sessions(mesh: &Mesh, name: &str) -> usize {
    let all = mesh.broker.connz_named(ConnState::All, name).await;
    all.expect("/connz").len()
}

/// `close()` closes both membership connections even when a disconnected drain fails, so they
/// cannot reconnect after closure. The feed runs in process (as every lane and embedded
/// service runs it) through a proxy, beside a control connection dialed the same way. The
/// proxy cuts all three and parks their redials (accepted, no bytes); `close()` then meets two
/// connections that are down, so both drains fail, and it says so. The proxy heals: the
/// parked redials reach the broker; the control reconnects (`/connz`), while the feed's two
/// are refused before CONNECT and dropped, so the proxy carries the control alone, `/connz`
/// lists neither feed connection, and `/connz?state=all` shows each feed connection's one
/// session (a reconnect that closed again at once would be a second). Mutations seen failing: `close_both` draining only
/// (no retirement first: both feed connections back in `/connz`); the rw connection closed
/// only when the observer's drain succeeded (rw back); `close()` returning as soon as the
/// observer's drain failed, before closing rw (rw back).
#[tokio::test]
async fn close_retires_both_feed_connections_even_when_their_drains_fail() {
    const CONTROL: &str = "test-control";
    let mesh = crate::support::data_path::mesh().await;
    let space = mesh.space().clone();
    let proxy = TcpProxy::start(mesh.broker.port()).await.expect("proxy");
    let store: Arc<dyn SecretStore> = Arc::new(FsStore::new(mesh.root()));
    let account = mesh.authority.account_public_key(&space).unwrap();
    let mut parts = FeedParts::new(
        DialSpec::new(proxy.url()),
        store,
        space.clone(),
        account,
        Journal::stderr_only(),
    );
    parts.interval = Duration::from_millis(300);
    let feed = MembershipFeed::start(parts).await.expect("feed up");
    // The daemon's renewal keeps a handle on the rw connection past the close; so does the test.
    let (_rw_cell, _rw_handle) = feed.rw();
    let delivery = read_creds_file(&mesh.workspace().delivery_creds_path(&space)).unwrap();
    let control = base::dial(
        &DialSpec::new(proxy.url()).name(CONTROL),
        CredentialCell::new(delivery),
    )
    .await
    .expect("control up");
    let all = [OBSERVER_NAME, RW_NAME, CONTROL];
    eventually("all three listed", BOUND, || async {
        listed(&mesh, &all).await.len() == 3
    })
    .await;
    assert_eq!(proxy.active_count(), 3);
    // Each feed connection presents its own credential.
    let observer_jwt = read_creds_file(&mesh.workspace().membership_observer_creds_path(&space))
        .unwrap()
        .jwt;
    let rw_jwt = read_creds_file(&mesh.workspace().membership_rw_creds_path(&space))
        .unwrap()
        .jwt;
    assert_eq!(jwt_of(&mesh, OBSERVER_NAME).await, Some(observer_jwt));
    assert_eq!(jwt_of(&mesh, RW_NAME).await, Some(rw_jwt));

    // The path goes away: the three are cut and each redial is parked in the proxy.
    proxy.blackhole_new();
    proxy.cut_established();
    eventually("three redials parked, none listed", BOUND, || async {
        proxy.accepted_count() >= 6
            && proxy.active_count() == 3
            && listed(&mesh, &all).await.is_empty()
    })
    .await;
    let closed = feed.close().await;
    for (name, r) in [("observer", &closed.observer), ("rw", &closed.rw)] {
        let e = r.as_ref().expect_err(name);
        assert_eq!(e.kind(), DrainErrorKind::Down, "{name}: {e}");
        assert!(
            e.to_string().contains("the connection is down"),
            "{name}: {e}"
        );
    }

    proxy.heal();
    eventually(
        "the control back and the proxy carrying it alone",
        BOUND,
        || async {
            listed(&mesh, &all).await == [CONTROL.to_string()] && proxy.active_count() == 1
        },
    )
    .await;
    assert_eq!(listed(&mesh, &all).await, [CONTROL.to_string()]);
    // Never back even for a moment: the broker saw each feed connection once (the session the
    // cut closed), the control twice.
    assert_eq!(
        (
            sessions(&mesh, OBSERVER_NAME).await,
            sessions(&mesh, RW_NAME).await,
            sessions(&mesh, CONTROL).await
        ),
        (1, 1, 2)
    );
    control.close(Duration::from_secs(1)).await;
}

/// The feed's `membership-rw` grants are confined, checked against the broker with the
/// workspace's own `membership-rw` credential: it may write rows of `cotal_membership_<s>`
/// (stored) and read the members registry; it may not write the members registry or the lease
/// bucket, post or subscribe on chat, or publish on the `ctl.delivery` rail, and the broker
/// stored none of those. Mutation seen failing: `kv_key(members_bucket, ">")` added to the
/// `membership-rw` profile (the registry write was stored, no violation).
#[tokio::test]
async fn the_membership_rw_grants_are_confined() {
    let mesh = crate::support::data_path::mesh().await;
    let space = mesh.space().clone();
    let insp = mesh.inspector(&space).await.unwrap();
    let names = insp.names.clone();
    let cred = read_creds_file(&mesh.workspace().membership_rw_creds_path(&space)).unwrap();
    let (client, mut events) = mesh.connect_watched(&cred, "confined-rw").await.unwrap();
    let js = async_nats::jetstream::new(client.clone());

    // Allowed: a row of the feed's bucket, and a read of the members registry.
    let row_subject = format!("$KV.{}.local.confined", names.membership_bucket());
    js.publish(row_subject, "{}".into())
        .await
        .expect("sent")
        .await
        .expect("feed row stored");
    assert!(row(&insp, &names.membership_bucket(), "local.confined")
        .await
        .is_some());
    let members = js
        .get_stream_no_info(cotal_delivery::wire::SpaceNames::kv_stream(
            &names.members_bucket(),
        ))
        .await
        .unwrap();
    let registry_row = format!("$KV.{}.general/local.bob.u1", names.members_bucket());
    insp.js
        .publish(registry_row.clone(), "{\"state\":\"durable\"}".into())
        .await
        .expect("sent")
        .await
        .expect("registry row stored by the inspector");
    let read = members
        .get_last_raw_message_by_subject(&registry_row)
        .await
        .expect("the registry read is allowed");
    assert_eq!(&read.payload[..], b"{\"state\":\"durable\"}");

    // Denied: a registry write, a lease write, a chat post, a chat subscription, the rail.
    let member_write = format!("$KV.{}.general/local.x.y", names.members_bucket());
    let lease_write = format!("$KV.{}.lease.0", names.delivery_bucket());
    let post = format!("{}.chat.local.alice.general", space.prefix());
    let rail = format!("{}.ctl.delivery.local.alice", space.prefix());
    for subject in [&member_write, &lease_write, &post, &rail] {
        client
            .publish(subject.to_string(), "{}".into())
            .await
            .expect("sent");
        events
            .expect_denied(BOUND, "Publish", subject)
            .await
            .unwrap_or_else(|e| panic!("{subject}: {e}"));
    }
    let chat = names.chat_all();
    let _sub = client.subscribe(chat.clone()).await.expect("sub sent");
    events
        .expect_denied(BOUND, "Subscription", &chat)
        .await
        .unwrap_or_else(|e| panic!("{chat}: {e}"));
    assert!(row(&insp, &names.members_bucket(), "general/local.x.y")
        .await
        .is_none());
    assert!(row(&insp, &names.delivery_bucket(), "lease.0")
        .await
        .is_none());
    let mut chat_stream = insp.js.get_stream(names.chat_stream()).await.unwrap();
    assert_eq!(chat_stream.info().await.unwrap().state.messages, 0);
}

/// Writes a durable members row of `who` (lifecycle `uid`) on `channel`, in the daemon's shape.
async fn put_member_row(insp: &Inspector, who: &str, uid: &str, channel: &str) {
    let row = json!({
        "channel": channel, "owner": who, "lifecycleUid": uid, "state": "durable-active",
        "joinCursor": 0, "activated": true, "generation": 1,
        "writerIdentity": "local.test", "updatedAt": 1,
    });
    let subject = format!("$KV.{}.{channel}/{who}.{uid}", insp.names.members_bucket());
    insp.js
        .publish(subject, row.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Counts the leader reads (`STREAM.MSG.GET`) the account sends to the members bucket's stream.
async fn count_members_reads(insp: &Inspector) -> Arc<std::sync::atomic::AtomicU64> {
    let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let subject = format!("$JS.API.STREAM.MSG.GET.KV_{}", insp.names.members_bucket());
    let mut sub = insp.client.subscribe(subject).await.unwrap();
    insp.client.flush().await.unwrap();
    let counter = n.clone();
    tokio::spawn(async move {
        use futures::StreamExt;
        while sub.next().await.is_some() {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    n
}

/// A sweep reads the members registry from the plane's members cache, proved current by one
/// leader fence, not row by row from the broker (issue 32): with 300 durable rows of 30
/// principals and a sweep every 300 ms, the members bucket's stream sees a few leader reads
/// per sweep (the fence), where reading each row was 300 per sweep; a principal whose rows
/// appear after the cache loaded gets its row, and one whose rows are deleted is pruned
/// without a listing of the display bucket (its next listing is 10 minutes away).
/// Mutations seen failing: `feed_parts.members` left `None` in `space/startup.rs` (about 300
/// reads per sweep); the prune's branch for the rows the feed wrote itself removed (the
/// deleted principal's row stayed).
#[tokio::test]
async fn a_sweep_reads_the_registry_from_the_proved_cache_not_row_by_row() {
    const PRINCIPALS: usize = 30;
    const CHANNELS: usize = 10;
    let mesh = crate::support::data_path::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let uid = |i: usize| format!("{i:0>26}");
    for i in 0..PRINCIPALS {
        for c in 0..CHANNELS {
            put_member_row(&insp, &format!("local.p{i}"), &uid(i), &format!("c{c}")).await;
        }
    }
    let mut d = crate::support::start(sweeping_every(&mesh, "300")).await;
    d.wait_for_line(FEED_UP, BOUND).await.expect("feed up");
    let every: Vec<String> = (0..CHANNELS).map(|c| format!("c{c}")).collect();
    eventually("every principal's row", BOUND, || async {
        for i in 0..PRINCIPALS {
            match feed_row(&insp, &format!("local.p{i}")).await {
                Some(r) if r.durable == every => {}
                _ => return false,
            }
        }
        true
    })
    .await;
    // A row written now is in a later sweep: the cache is current, not a snapshot.
    put_member_row(&insp, "local.late", &uid(99), "c0").await;
    eventually("the late principal's row", BOUND, || async {
        feed_row(&insp, "local.late")
            .await
            .is_some_and(|r| r.durable == ["c0"])
    })
    .await;

    let reads = count_members_reads(&insp).await;
    let sweeps_before = membership_writes(&insp).await;
    eventually("three more sweeps", BOUND, || async {
        membership_writes(&insp).await >= sweeps_before + 3
    })
    .await;
    let sweeps = membership_writes(&insp).await - sweeps_before;
    let read = reads.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("{read} members reads over {sweeps} sweeps of 301 rows");
    assert!(
        read <= 2 * sweeps,
        "{read} leader reads of the members bucket over {sweeps} sweeps of 301 rows"
    );

    // p0's rows deleted: its display row goes, within the relist period, by the feed's own
    // knowledge of what it wrote.
    for c in 0..CHANNELS {
        let subject = format!(
            "$KV.{}.c{c}/local.p0.{}",
            insp.names.members_bucket(),
            uid(0)
        );
        let mut h = async_nats::HeaderMap::new();
        h.insert("KV-Operation", "DEL");
        insp.js
            .publish_with_headers(subject, h, bytes::Bytes::new())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    eventually("p0's row pruned", BOUND, || async {
        feed_row(&insp, "local.p0").await.is_none()
    })
    .await;
    assert!(feed_row(&insp, "local.p1").await.is_some());
    d.terminate().unwrap();
    d.wait_exit(BOUND).await.unwrap();
}
