//! The bytes each control rail and the `live.delivery` responder publish, as a raw core-NATS
//! subscriber on the reply subject receives them: every reply's keys in the reference's order
//! (`principal, kicked, remaining, verifiedGone, scanComplete, note?` for an eviction result, …),
//! for every verb of `ctl.delivery`, `ctl.delivery-admin`, the anycast take rail and
//! `live.delivery`. Values that differ per run (nkeys, uids, sequences, revisions, times, the
//! root, the server id) are replaced by placeholders; everything else is compared byte for
//! byte.
//!
//! Mutation seen failing (both tests, every shape with more than one key): `encode_reply`
//! serializing through `serde_json::to_value` (serde_json without `preserve_order` writes a
//! `Value` map with its keys sorted), and the `live.delivery` answer built with `json!`.

use cotal_delivery::provision::{MintOptions, Profile};
use cotal_delivery::wire::{CtlService, Principal};
use delivery_harness::rig::agent;
use futures::StreamExt;
use serde_json::{json, Value};

use crate::anycast::{send, ROLE};
use crate::support::data_path as s;
use crate::support::BOUND;

/// One request on `subject`, answered on `<subject>.reply.<nonce>`: the reply's bytes as
/// published (or a probe's, for an empty `body`).
async fn raw(client: &async_nats::Client, subject: String, body: Vec<u8>) -> String {
    let reply = format!("{subject}.reply.{}", uuid::Uuid::new_v4().simple());
    let mut sub = client.subscribe(reply.clone()).await.expect("subscribe");
    client
        .publish_with_reply(subject, reply, body.into())
        .await
        .expect("publish");
    let m = tokio::time::timeout(BOUND, sub.next())
        .await
        .expect("answered within the bound")
        .expect("subscription open");
    String::from_utf8(m.payload.to_vec()).expect("UTF-8 reply")
}

/// A control request `{op, args, from}` of `from` on its own rail subject.
async fn request(
    client: &async_nats::Client,
    names: &cotal_delivery::wire::SpaceNames,
    service: CtlService,
    from: &Principal,
    op: &str,
    args: Value,
) -> String {
    let body = json!({"op": op, "args": args, "from": {"id": from.dot_form(), "name": "wire"}});
    raw(
        client,
        names.ctl_subject(service, from),
        body.to_string().into_bytes(),
    )
    .await
}

/// The reply with the values that differ per run replaced: `replace`'s exact strings, then the
/// kit's one normaliser.
fn normalized(reply: &str, replace: &[(&str, &str)]) -> String {
    let mut out = reply.to_string();
    for (from, to) in replace {
        out = out.replace(from, to);
    }
    delivery_harness::kit::transcript::normalise(&out, &[])
}

/// `ctl.delivery` (durable join, list, leave, the anycast sender verbs and a refusal), the
/// anycast take rail, and `live.delivery`, each reply as its subscriber reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_delivery_take_and_liveness_reply_is_written_in_the_reference_key_order() {
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.expect("inspector");
    let mut d = crate::support::start(s::daemon_spec(&mesh)).await;
    let (alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .expect("alice");
    let (bob, _) = agent::spawn_holder(&mesh, &insp, "bob", &["general"], &[ROLE])
        .await
        .expect("bob");
    let names = alice.names().clone();
    let me = alice.principal().clone();
    let uid = alice.lifecycle_uid().to_string();
    let delivery = |op: &'static str, args: Value| {
        let (client, names, me) = (alice.client().clone(), names.clone(), me.clone());
        async move { request(&client, &names, CtlService::Delivery, &me, op, args).await }
    };
    let n = |r: String| normalized(&r, &[(&uid, "[UID]")]);

    assert_eq!(
        n(delivery(
            "durableJoin",
            json!({"channel": "general", "lifecycleUid": uid})
        )
        .await),
        r#"{"ok":true,"data":{"durable":true,"generation":1}}"#
    );
    assert_eq!(
        n(delivery("listMemberships", json!({"lifecycleUid": uid})).await),
        r#"{"ok":true,"data":{"memberships":[{"channel":"general","generation":1,"activated":true}]}}"#
    );
    assert_eq!(
        n(delivery(
            "durableLeave",
            json!({"channel": "general", "generation": 1, "lifecycleUid": uid})
        )
        .await),
        r#"{"ok":true,"data":{"channel":"general"}}"#
    );
    assert_eq!(
        n(delivery(
            "durableLeave",
            json!({"channel": "general", "generation": 1, "lifecycleUid": uid})
        )
        .await),
        r#"{"ok":true,"data":{"channel":"general","alreadyLeft":true}}"#
    );
    assert_eq!(
        n(delivery("durableJoin", json!({"channel": "a.*"})).await),
        r#"{"ok":false,"error":"durableJoin: \"a.*\" must be a concrete channel (durable membership is per-concrete-channel, not wildcard)"}"#
    );

    // The anycast sender verbs and the take, for one request taken and one cancelled.
    let created = bob.task_created().await.expect("task stream");
    let taken = send(&alice).await;
    assert_eq!(
        n(delivery("anycastStatus", json!({ "seq": taken })).await),
        r#"{"ok":true,"data":{"seq":[N],"state":"queued","inQueue":true}}"#
    );
    let take = json!({"seq": taken, "streamCreated": created, "delivered": 1, "lifecycleUid": bob.lifecycle_uid().to_string()});
    assert_eq!(
        n(request(
            bob.client(),
            &names,
            CtlService::Anycast,
            bob.principal(),
            "take",
            take
        )
        .await),
        r#"{"ok":true,"data":{"seq":[N],"took":"taken","holder":"local.bob","sender":"local.alice"}}"#
    );
    assert_eq!(
        n(delivery("anycastStatus", json!({ "seq": taken })).await),
        r#"{"ok":true,"data":{"seq":[N],"state":"taken","holder":"local.bob","previousHolder":null,"moves":0,"takenAt":[N],"cancelledAt":null,"inQueue":true}}"#
    );
    let cancelled = send(&alice).await;
    assert_eq!(
        n(delivery("anycastCancel", json!({ "seq": cancelled })).await),
        r#"{"ok":true,"data":{"seq":[N],"state":"cancelled","deleted":true}}"#
    );

    // The probe an agent sends (an empty body on its own live.delivery subject).
    let probe = raw(alice.client(), names.live_delivery_subject(&me), Vec::new()).await;
    assert_eq!(
        n(probe),
        r#"{"plane":"delivery","responder":"bound","instance":"[TOKEN]"}"#
    );
    s::stop_daemon(&mut d).await;
}

/// `ctl.delivery-admin`: the credential verbs, the inventory, eviction of one and of a batch,
/// both liveness oracles and an unknown verb, each reply as the manager's subscriber reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_reply_is_written_in_the_reference_key_order() {
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.expect("inspector");
    let mut d = crate::support::start(crate::support::admin::admin_spec(&mesh)).await;
    let (alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .expect("alice");
    alice.durable_join("general").await.expect("alice joins");
    let uid = alice.lifecycle_uid().to_string();
    let manager = Principal::parse("local.manager").expect("principal");
    let cred = mesh
        .mint(
            mesh.space(),
            &Profile::Supervisor {
                principal: manager.clone(),
            },
            MintOptions::new(),
        )
        .expect("supervisor credential");
    let client = mesh.connect(&cred, "wire-manager").await.expect("connect");
    let names = alice.names().clone();
    let admin = |op: &'static str, args: Value| {
        let (client, names, manager) = (client.clone(), names.clone(), manager.clone());
        async move {
            request(
                &client,
                &names,
                CtlService::DeliveryAdmin,
                &manager,
                op,
                args,
            )
            .await
        }
    };
    let root = mesh.root().display().to_string();
    let n = |r: String| normalized(&r, &[(&uid, "[UID]"), (&root, "[ROOT]")]);

    assert_eq!(
        n(admin("reloadStoreIdentity", json!({})).await),
        r#"{"ok":true,"data":{"kind":"fs","root":"[ROOT]","storeId":"[UUID]"}}"#
    );
    let reload = n(admin("reloadCreds", json!({})).await);
    let membership = [
        r#"{"ok":true,"brokerAccepted":{"identity":"[NKEY2]","exp":[N]},"residentSwap":"best-effort"}"#,
        r#"{"ok":true,"brokerAccepted":{"identity":"[NKEY2]","exp":[N]},"residentSwap":"none (the membership feed is not running)"}"#,
    ];
    assert!(
        membership.iter().any(|m| reload
            == format!(
                r#"{{"ok":true,"data":{{"delivery":{{"ok":true,"brokerAccepted":{{"identity":"[NKEY1]","exp":[N]}}}},"membership":{m}}}}}"#
            )),
        "{reload}"
    );
    assert_eq!(
        n(admin(
            "lifecycleMemberships",
            json!({"principal": "local.alice", "lifecycleUid": uid})
        )
        .await),
        r#"{"ok":true,"data":{"principal":"local.alice","lifecycleUid":"[UID]","fenced":true,"read":1,"memberships":[{"channel":"general","generation":1,"activated":true,"joinCursor":[N],"revision":[N]}]}}"#
    );
    let ghost = r#"{"principal":"local.ghost","kicked":0,"remaining":0,"verifiedGone":true,"scanComplete":true,"note":"principal not currently live - nothing to evict"}"#;
    assert_eq!(
        n(admin("evictPrincipal", json!({"principal": "local.ghost"})).await),
        format!(r#"{{"ok":true,"data":{ghost}}}"#)
    );
    assert_eq!(
        n(admin(
            "evictPrincipals",
            json!({"principals": ["local.ghost", "local.phantom"]})
        )
        .await),
        format!(
            r#"{{"ok":true,"data":[{ghost},{}]}}"#,
            ghost.replace("local.ghost", "local.phantom")
        )
    );
    assert_eq!(
        n(admin("principalLiveness", json!({"principal": "local.ghost"})).await),
        r#"{"ok":true,"data":{"principal":"local.ghost","state":"gone","sweepComplete":true}}"#
    );
    let tuple = json!({"serverId": "NOSUCHSERVER", "cid": 424242, "userNkey": format!("U{}", "A".repeat(55))});
    assert_eq!(
        n(admin(
            "planeConnLiveness",
            json!({"query": {"ledger": tuple, "records": tuple}})
        )
        .await),
        r#"{"ok":true,"data":{"ledger":{"tuple":{"serverId":"NOSUCHSERVER","cid":424242,"userNkey":"[NKEY1]"},"state":"gone"},"records":{"tuple":{"serverId":"NOSUCHSERVER","cid":424242,"userNkey":"[NKEY1]"},"state":"gone"},"sweepComplete":true}}"#
    );
    assert_eq!(
        n(admin("nope", json!({})).await),
        r#"{"ok":false,"error":"op \"nope\" not supported on the delivery admin service"}"#
    );
    s::stop_daemon(&mut d).await;
}
