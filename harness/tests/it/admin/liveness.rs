//! Liveness oracles on a real broker with the real daemon: `principalLiveness`,
//! `planeConnLiveness` (closed shapes, echoed tuples) and the `live.delivery` responder, including
//! a probe whose connection the broker closes under it.

use std::time::Duration;

use crate::support::admin as a;
use crate::support::data_path as s;
use crate::support::BOUND;
use cotal_delivery::agent::ProbeWhy;
use cotal_delivery::base::read_creds_file;
use delivery_harness::rig::agent;
use delivery_harness::rig::mesh::Mesh;
use delivery_harness::ConnState;
use futures::StreamExt;
use serde_json::{json, Value};

/// The monitor's row of the (first) connection tagged `principal:<p>`.
async fn conn_of(mesh: &Mesh, principal: &str) -> Option<Value> {
    let open = mesh.broker.connz(ConnState::Open).await.ok()?;
    open.into_iter()
        .find(|c| c.is_principal(principal))
        .map(|c| c.raw)
}

/// `principalLiveness`: a connected principal is `live`, an absent one `gone` (one server, no
/// cluster: the single-server proof), a malformed one refused; `planeConnLiveness` echoes both
/// tuples and judges the live connection by its nkey and an unknown tuple `gone`; a wider query
/// is refused.
///
/// Mutation seen failing: answering `gone` without `single_server_proven` is invisible here (one
/// server), so the mutation applied was the inverse: requiring two servers for `gone` (the ghost
/// turns `unknown`).
#[tokio::test]
async fn principal_and_plane_liveness_judge_from_one_complete_sweep() {
    let (mesh, mut d, m, alice) = a::served_with_alice().await;
    let _conn = a::victim(&mesh, &alice).await;
    let live = a::ask(
        &m,
        "principalLiveness",
        json!({"principal": " local.alice "}),
    )
    .await;
    let ghost = a::ask(&m, "principalLiveness", json!({"principal": "local.ghost"})).await;
    let bad = a::ask_refused(&m, "principalLiveness", json!({"principal": "nobody"})).await;
    let row = conn_of(&mesh, "local.alice")
        .await
        .expect("alice on /connz");
    let varz = mesh.broker.varz().await.unwrap();
    let server_id = varz["server_id"].as_str().unwrap().to_string();
    let ledger = json!({
        "serverId": server_id,
        "cid": row["cid"],
        "userNkey": row["authorized_user"],
    });
    let records =
        json!({"serverId": server_id, "cid": 999_999, "userNkey": format!("U{}", "A".repeat(55))});
    let plane = a::ask(
        &m,
        "planeConnLiveness",
        json!({"query": {"ledger": ledger, "records": records}}),
    )
    .await;
    assert_eq!(plane["ledger"]["tuple"], ledger, "the tuple is echoed");
    let wider = a::ask_refused(
        &m,
        "planeConnLiveness",
        json!({"query": {"ledger": ledger, "records": records, "extra": 1}}),
    )
    .await;
    snapshot!(
        "admin_liveness_verdicts",
        [live, ghost, json!(bad), plane, json!(wider)]
            .iter()
            .map(|v| v
                .to_string()
                .replace(&server_id, "[SERVER]")
                .replace(&format!("\"cid\":{}", row["cid"]), "\"cid\":[CID]"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    s::stop_daemon(&mut d).await;
}

/// Starts the daemon and checks `agent`'s probe is answered `bound`.
async fn serving_and_bound(
    mesh: &Mesh,
    agent: &cotal_delivery::agent::Agent,
) -> (
    delivery_harness::rig::daemon::Daemon,
    cotal_delivery::agent::Probe,
) {
    let d = crate::support::start(a::admin_spec(mesh)).await;
    let bound = agent.probe_delivery(Duration::from_secs(5)).await;
    assert_eq!(
        (bound.responder.as_str(), &bound.why),
        ("bound", &ProbeWhy::Answered)
    );
    (d, bound)
}

/// `live.delivery`: a serving daemon answers `bound` with an instance token; with no daemon the
/// probe is `unbound` (the broker's no-responders); and a probe whose connection the broker
/// closes under it (a `$SYS` KICK while a silent responder holds the probe) is `unknown`
/// because the connection closed, well before its timeout, never `unbound`.
///
/// Mutation seen failing: classifying a closed connection as `unbound` in
/// `agent/liveness.rs`.
#[tokio::test]
async fn the_live_delivery_probe_is_bound_unbound_or_unknown_when_its_connection_closes() {
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    let none = alice.probe_delivery(Duration::from_secs(5)).await;
    assert_eq!(
        (none.responder.as_str(), &none.why),
        ("unbound", &ProbeWhy::NoResponders)
    );

    let (mut d, bound) = serving_and_bound(&mesh, &alice).await;
    assert!(bound.instance.as_deref().is_some_and(|i| !i.is_empty()));
    s::stop_daemon(&mut d).await;
    let after = alice.probe_delivery(Duration::from_secs(5)).await;
    assert_eq!(after.responder, "unbound", "{after:?}");

    // A silent responder holds the probe; the broker then kicks alice's connection.
    let mut silent = insp
        .client
        .subscribe(insp.names.live_delivery_serve())
        .await
        .unwrap();
    insp.sync().await.unwrap();
    let probe_timeout = Duration::from_secs(10);
    let started = tokio::time::Instant::now();
    let probe = alice.probe_delivery(probe_timeout);
    let kick = async {
        let held = silent
            .next()
            .await
            .expect("the probe reached the silent responder");
        assert!(held.subject.as_str().ends_with("live.delivery.local.alice"));
        let row = conn_of(&mesh, "local.alice")
            .await
            .expect("alice on /connz");
        let server_id = mesh.broker.varz().await.unwrap()["server_id"]
            .as_str()
            .unwrap()
            .to_string();
        let evictor =
            read_creds_file(&mesh.workspace().connection_evictor_creds_path(mesh.space())).unwrap();
        let sys = cotal_delivery::base::connect_with_inbox(
            &mesh.url(),
            mesh.tls_ca().as_deref(),
            &evictor,
            "test-evictor",
            "_INBOX",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        sys.request(
            format!("$SYS.REQ.SERVER.{server_id}.KICK"),
            json!({"cid": row["cid"]}).to_string().into(),
        )
        .await
        .expect("kick answered");
    };
    let (probe, ()) = tokio::join!(probe, kick);
    let took = started.elapsed();
    assert_eq!(
        (probe.responder.as_str(), &probe.why),
        ("unknown", &ProbeWhy::ConnectionClosed)
    );
    assert!(
        took < probe_timeout,
        "answered by the close, not the timeout ({took:?})"
    );
}

/// Waits for the broker's `Permissions Violation for <op> to "<subject>"`.
async fn expect_denied(events: &mut delivery_harness::ClientEvents, op: &str, subject: &str) {
    let needle = format!("Permissions Violation for {op} to \"{subject}\"");
    events
        .wait_for(Duration::from_secs(5), &needle, |e| match e {
            async_nats::Event::ServerError(err) => err.to_string().contains(&needle),
            _ => false,
        })
        .await
        .unwrap_or_else(|e| panic!("expected the broker to deny {op} {subject}: {e}"));
}

/// The `live.delivery` grants (docs/admin.md) are confined, each denied one token outside: the
/// `delivery` credential serves `live.delivery.*.*` but not a sibling rail, and replies under
/// `….reply.>` but not on the request subject itself; an agent probes its own subject but not
/// another principal's, and hears its own reply subtree but not another's. The allowed side is
/// proved by the broker delivering the reply to the inspector (and by the probe test above).
///
/// Mutation seen failing (applied): widening the responder's reply grant to
/// `cotal.<s>.live.delivery.>` in `provision/profiles.rs` (the request-subject publish is no
/// longer denied: no permissions violation within 5 s).
#[tokio::test]
async fn the_live_delivery_grants_are_confined() {
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let names = insp.names.clone();
    let alice = cotal_delivery::wire::Principal::parse("local.alice").unwrap();
    let bob = cotal_delivery::wire::Principal::parse("local.bob").unwrap();
    let prefix = names.space().prefix();

    let cred = read_creds_file(&mesh.workspace().delivery_creds_path(mesh.space())).unwrap();
    let (daemon, mut events) = mesh.connect_watched(&cred, "confined").await.unwrap();
    let sibling = format!("{prefix}.live.timer.*.*");
    let _s = daemon.subscribe(sibling.clone()).await.unwrap();
    expect_denied(&mut events, "Subscription", &sibling).await;
    let request = names.live_delivery_subject(&alice);
    daemon.publish(request.clone(), "x".into()).await.unwrap();
    expect_denied(&mut events, "Publish", &request).await;
    let mut heard = insp
        .client
        .subscribe(names.live_delivery_reply_subtree(&alice))
        .await
        .unwrap();
    insp.sync().await.unwrap();
    let reply = format!("{request}.reply.r1");
    daemon.publish(reply.clone(), "ok".into()).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), heard.next())
        .await
        .expect("the reply arrives")
        .unwrap();
    assert_eq!(got.subject.as_str(), reply);

    let mat = agent::provision(&mesh, &insp, mesh.space(), "alice", &["general"])
        .await
        .unwrap();
    let (agent_client, mut agent_events) = mesh
        .connect_watched(&mat.credential, "alice")
        .await
        .unwrap();
    let other = names.live_delivery_subject(&bob);
    agent_client
        .publish(other.clone(), "".into())
        .await
        .unwrap();
    expect_denied(&mut agent_events, "Publish", &other).await;
    let others_replies = names.live_delivery_reply_subtree(&bob);
    let _r = agent_client
        .subscribe(others_replies.clone())
        .await
        .unwrap();
    expect_denied(&mut agent_events, "Subscription", &others_replies).await;
}

/// Paging and an incomplete sweep on a real broker. With one connection per CONNZ page the
/// account (daemon, manager, alice: at least 4 connections, counted on the broker) is swept over
/// several pages and still proves alice `live` and a ghost `gone`. With at most 2 pages of one
/// connection the broker's answer is truncated: the ghost is `unknown` with the under-reported
/// note, never `gone`, and so is an unknown plane tuple.
///
/// Mutation seen failing: `Sweep::complete` ignoring `truncated` (the truncated sweep proves the
/// ghost `gone`).
#[tokio::test]
async fn a_paged_sweep_proves_gone_and_a_truncated_one_is_unknown() {
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let alice = agent::provision(&mesh, &insp, mesh.space(), "alice", &["general"])
        .await
        .unwrap();
    let _conn = a::victim(&mesh, &alice).await;
    let m = a::manager(&mesh).await;
    let mut d = crate::support::start(
        a::admin_spec(&mesh).envs(&[("COTAL_DELIVERY_SWEEP_PAGE_LIMIT", "1")]),
    )
    .await;
    let account = mesh.authority.account_public_key(mesh.space()).unwrap();
    let open = mesh.broker.connz(ConnState::Open).await.expect("/connz");
    let in_account = open.iter().filter(|c| c.account == account).count();
    assert!(in_account >= 4, "{in_account} connections in the account");
    let ask = |p: &'static str| {
        let m = &m;
        async move { a::ask(m, "principalLiveness", json!({"principal": p})).await }
    };
    assert_eq!(
        ask("local.alice").await,
        json!({"principal": "local.alice", "state": "live", "sweepComplete": true})
    );
    assert_eq!(
        ask("local.ghost").await,
        json!({"principal": "local.ghost", "state": "gone", "sweepComplete": true})
    );
    s::stop_daemon(&mut d).await;

    let mut d = crate::support::start(a::admin_spec(&mesh).envs(&[
        ("COTAL_DELIVERY_SWEEP_PAGE_LIMIT", "1"),
        ("COTAL_DELIVERY_SWEEP_MAX_PAGES", "2"),
    ]))
    .await;
    let ghost = ask("local.ghost").await;
    let server_id = mesh.broker.varz().await.unwrap()["server_id"]
        .as_str()
        .unwrap()
        .to_string();
    let tuple =
        json!({"serverId": server_id, "cid": 999_999, "userNkey": format!("U{}", "A".repeat(55))});
    let plane = a::ask(
        &m,
        "planeConnLiveness",
        json!({"query": {"ledger": tuple, "records": tuple}}),
    )
    .await;
    snapshot!(
        "admin_liveness_truncated",
        format!(
            "{ghost}\n{}",
            plane.to_string().replace(&server_id, "[SERVER]")
        )
    );
    s::stop_daemon(&mut d).await;
}

/// A 3-node loopback cluster of real brokers (operator mode, the daemon on node 0, alice on
/// node 2, the manager on node 1): the account-scoped CONNZ answers come from the cluster, so
/// alice is `live` although she is on another node, while a ghost and an unknown plane tuple are
/// `unknown` with the cluster note, never `gone`. After node 2 is killed (alice's connection
/// with it) alice is `unknown` too: a partitioned member could still hold her connection.
///
/// Mutation seen failing: `shortfall` without its `cluster_declared` branch in
/// `rails/liveness.rs` (one server answers the ghost's sweep: it turns `gone`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_liveness_is_unknown_never_gone() {
    use cotal_delivery::provision::{MintOptions, Profile};
    use cotal_delivery::wire::Principal;
    use delivery_harness::rig::manager::Manager;

    // The rig's mesh on a 3-node cluster (every stream and bucket R3), the daemon on node 0.
    let mut mesh = Mesh::demo_builder()
        .unwrap()
        .cluster(3)
        .start()
        .await
        .unwrap();
    let space = mesh.space().clone();
    let urls: Vec<String> = (0..mesh.node_count())
        .map(|i| mesh.node(i).expect("node").client_url())
        .collect();
    let mut d = crate::support::start(
        mesh.deliver(&space)
            .env("COTAL_DELIVERY_SWEEP_SETTLE_MS", a::SWEEP_SETTLE_MS),
    )
    .await;
    let authority = &mesh.authority;
    let mint = |p: &str| {
        authority
            .mint(
                &space,
                &Profile::Supervisor {
                    principal: Principal::parse(p).unwrap(),
                },
                MintOptions::new(),
            )
            .unwrap()
    };
    let connect = |url: String, cred: cotal_delivery::base::Credential, name: &'static str| async move {
        cotal_delivery::base::connect_with_credential(
            &url,
            None,
            &cred,
            name,
            Duration::from_secs(5),
        )
        .await
        .unwrap()
    };
    let manager = Principal::parse("local.manager").unwrap();
    let m = Manager::over(
        connect(urls[1].clone(), mint("local.manager"), "manager").await,
        &space,
        &manager,
    );
    let _alice = connect(urls[2].clone(), mint("local.alice"), "alice").await;
    let ask = |p: &'static str| {
        let m = &m;
        async move { a::ask(m, "principalLiveness", json!({"principal": p})).await }
    };
    let live = ask("local.alice").await;
    assert_eq!(live["state"], "live", "{live}");
    let ghost = ask("local.ghost").await;
    let tuple = json!({"serverId": "NOSUCHSERVER", "cid": 999_999, "userNkey": format!("U{}", "A".repeat(55))});
    let plane = a::ask(
        &m,
        "planeConnLiveness",
        json!({"query": {"ledger": tuple, "records": tuple}}),
    )
    .await;
    let node = mesh.node_mut(2).expect("node 2");
    node.kill().unwrap();
    node.wait_exit(BOUND).await.unwrap();
    let partitioned = ask("local.alice").await;
    snapshot!(
        "admin_liveness_cluster",
        format!("{live}\n{ghost}\n{plane}\n{partitioned}")
    );
    d.terminate().unwrap();
    d.wait_exit(BOUND).await.unwrap();
}

/// `stale` on a real broker: the daemon serves, then its lease row becomes another holder's
/// ready row while its `live.delivery` responder is still bound. To observe that window the
/// test first deletes the daemon's lease-watch consumer on the broker (the daemon would
/// otherwise stop serving within milliseconds of the foreign write); the probe then reaches the
/// still-bound responder, which reads the row leader-served and answers `stale`, with its own
/// instance token. The row is then restored and the daemon stopped.
///
/// Mutation seen failing: grading a foreign ready row `bound` in `rails::liveness::grade`.
#[tokio::test]
async fn a_responder_whose_row_belongs_to_another_holder_answers_stale() {
    use cotal_delivery::wire::LeaseInfo;
    use cotal_delivery::wire::SpaceNames;

    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    let (mut d, bound) = serving_and_bound(&mesh, &alice).await;

    let stream_name = SpaceNames::kv_stream(&insp.names.delivery_bucket());
    let stream = insp.js.get_stream(&stream_name).await.unwrap();
    // The watch is bound once start-up completes, shortly after the up line.
    let names_of = || async {
        stream
            .consumer_names()
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .map(|n| n.unwrap())
            .collect::<Vec<String>>()
    };
    s::eventually("the daemon's lease watch consumer", BOUND, || async {
        names_of().await.len() == 1
    })
    .await;
    let consumers = names_of().await;
    stream.delete_consumer(&consumers[0]).await.unwrap();
    let own = insp.lease().await.unwrap().expect("the daemon's row");
    let foreign = LeaseInfo {
        holder: "local.UFOREIGNHOLDER".into(),
        since: 1,
        ready: true,
        incarnation: "f".repeat(32),
    };
    insp.put_lease(&foreign).await.unwrap();
    let stale = alice.probe_delivery(Duration::from_secs(5)).await;
    assert_eq!(
        (stale.responder.as_str(), stale.instance.as_deref()),
        ("stale", bound.instance.as_deref()),
        "{stale:?}\n{}",
        d.transcript()
    );
    insp.put_lease(&own.info).await.unwrap();
    d.kill().unwrap();
    d.wait_exit(BOUND).await.unwrap();
}
