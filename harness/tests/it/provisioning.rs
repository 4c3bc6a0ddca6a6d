//! Provisioning against a real operator-mode broker: the space is really there, credentials
//! really expire, and the `delivery` credential is really confined. Every verdict is the
//! broker's, observed from the client side.

use std::time::Duration;

use async_nats::Event;
use cotal_delivery::kv::Rows;
use cotal_delivery::provision::{MintOptions, Profile};
use cotal_delivery::wire::{LifecycleUid, Principal, SpaceNames, LEASE_KEY};
use delivery_harness::events::ClientEvents;
use delivery_harness::mesh::Mesh;
use delivery_harness::wait_until;
use futures::StreamExt;

const BOUND: Duration = Duration::from_secs(5);

async fn mesh() -> Mesh {
    Mesh::demo_builder()
        .expect("valid space")
        .lease_ttl(Duration::from_secs(7))
        .start()
        .await
        .expect("mesh starts")
}

/// Waits for the broker's `Permissions Violation for <op> to "<subject>"`.
async fn expect_denied(events: &mut ClientEvents, op: &str, subject: &str) {
    let needle = format!("Permissions Violation for {op} to \"{subject}\"");
    events
        .wait_for(BOUND, &needle, |e| match e {
            Event::ServerError(err) => err.to_string().contains(&needle),
            _ => false,
        })
        .await
        .unwrap_or_else(|e| panic!("expected the broker to deny {op} {subject}: {e}"));
}

#[tokio::test]
async fn operator_mode_broker_holds_the_provisioned_space() {
    let mesh = mesh().await;
    let space = mesh.space().clone();
    let names = SpaceNames::new(&space);
    let insp = mesh.inspector(&space).await.expect("inspector");
    for stream in [
        names.chat_stream(),
        names.dm_stream(),
        names.task_stream(),
        names.inbox_stream(),
        names.dlv_stream(),
        names.ept_req_stream(),
        names.ept_stream(),
    ] {
        let mut s = insp.js.get_stream(&stream).await.expect("stream exists");
        s.info().await.expect("stream info");
    }
    let mut lease = insp
        .js
        .get_stream(SpaceNames::kv_stream(&names.delivery_bucket()))
        .await
        .expect("lease bucket");
    let info = lease.info().await.expect("lease bucket info");
    assert_eq!(
        info.config.max_age,
        Duration::from_secs(7),
        "lease TTL is the bucket max_age"
    );
    // The workspace holds the daemon's material in the reference layout.
    let dir = mesh
        .root()
        .join(".cotal")
        .join(format!("space.{}", space.key()));
    for f in [
        "delivery.creds",
        "membership-rw.creds",
        "membership-observer.creds",
        "connection-evictor.creds",
        "inspect.creds",
        "membership.json",
    ] {
        assert!(dir.join(f).is_file(), "{f} is provisioned");
    }
    assert_eq!(space.key(), "64656d6f");
}

#[tokio::test]
async fn an_expired_user_jwt_is_refused_and_a_fresh_one_accepted() {
    let mesh = mesh().await;
    let space = mesh.space().clone();
    let short = mesh
        .mint(
            &space,
            &Profile::Delivery,
            MintOptions::new().expires_in(Duration::from_secs(1)),
        )
        .expect("mint");
    let exp = short.claims().expect("claims").exp.expect("has exp");
    // Wait (bounded) until the broker itself refuses the credential.
    let refusal = wait_until(
        Duration::from_secs(6),
        Duration::from_millis(200),
        "the broker to refuse the expired JWT",
        || async {
            match mesh.connect(&short, "expired").await {
                Ok(_) => None,
                Err(e) => Some(e.to_string()),
            }
        },
    )
    .await
    .expect("expired credential refused");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    assert!(now >= exp, "refused only once expired ({now} vs exp {exp})");
    assert!(
        refusal.to_lowercase().contains("authorization")
            || refusal.to_lowercase().contains("expired"),
        "the refusal is the broker's auth error: {refusal}"
    );
    let fresh = mesh
        .mint(
            &space,
            &Profile::Delivery,
            MintOptions::new().renewal_of(&short),
        )
        .expect("re-sign the same nkey");
    assert_eq!(fresh.public_key().ok(), short.public_key().ok());
    let client = mesh
        .connect(&fresh, "fresh")
        .await
        .expect("fresh JWT accepted");
    assert!(
        client.server_info().max_payload > 0,
        "the broker greeted the fresh credential"
    );
}

#[tokio::test]
async fn the_delivery_credential_is_confined_to_its_grants() {
    let mesh = mesh().await;
    let space = mesh.space().clone();
    let names = SpaceNames::new(&space);
    let insp = mesh.inspector(&space).await.expect("inspector");
    let cred =
        cotal_delivery::creds::read_creds_file(&mesh.workspace().delivery_creds_path(&space))
            .expect("delivery creds");
    let (client, mut events) = mesh
        .connect_watched(&cred, "confined")
        .await
        .expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    let alice = Principal::parse("local.alice").expect("principal");
    let uid = LifecycleUid::generate();

    // Denied: native subscriptions on the content subjects.
    let _chat = client.subscribe(names.chat_all()).await.expect("sub sent");
    expect_denied(&mut events, "Subscription", &names.chat_all()).await;
    let _dinbox = client
        .subscribe(names.dinbox_all())
        .await
        .expect("sub sent");
    expect_denied(&mut events, "Subscription", &names.dinbox_all()).await;

    // Denied: a chat post, an ACL-bucket write, a request on the ctl.delivery request subject.
    let post = names.chat_subject(&alice, "general");
    client
        .publish(post.clone(), "x".into())
        .await
        .expect("pub sent");
    expect_denied(&mut events, "Publish", &post).await;
    let acl = format!(
        "$KV.{}.{}",
        names.acl_bucket(),
        SpaceNames::acl_key(&alice, &uid)
    );
    client
        .publish(acl.clone(), "{}".into())
        .await
        .expect("pub sent");
    expect_denied(&mut events, "Publish", &acl).await;
    let ctl = names.ctl_subject(cotal_delivery::wire::CtlService::Delivery, &alice);
    client
        .publish(ctl.clone(), "{}".into())
        .await
        .expect("pub sent");
    expect_denied(&mut events, "Publish", &ctl).await;

    // The broker stored none of the denied writes.
    for stream in [
        names.chat_stream(),
        SpaceNames::kv_stream(&names.acl_bucket()),
    ] {
        let mut s = insp.js.get_stream(&stream).await.expect("stream");
        assert_eq!(
            s.info().await.expect("info").state.messages,
            0,
            "{stream} is empty"
        );
    }

    // Allowed: dinbox and dlv publishes (stored), lease writes, members writes.
    for subject in [
        names.dinbox_subject(&alice, &uid),
        names.dlv_subject(&alice, &uid),
    ] {
        js.publish(subject.clone(), "{}".into())
            .await
            .expect("publish sent")
            .await
            .unwrap_or_else(|e| panic!("{subject} is stored: {e}"));
    }
    let rows = Rows::open(&js, &names.delivery_bucket(), BOUND)
        .await
        .expect("rows");
    let rev = rows
        .create(LEASE_KEY, "{}".into())
        .await
        .expect("lease write allowed");
    rows.delete_expecting(LEASE_KEY, rev)
        .await
        .expect("lease delete allowed");
    let member = format!(
        "$KV.{}.{}",
        names.members_bucket(),
        SpaceNames::member_key("general", &alice, &uid)
    );
    js.publish(member, "{}".into())
        .await
        .expect("publish sent")
        .await
        .expect("members write allowed");

    // Allowed: a reply on the ctl.delivery reply leaf, received by the inspector.
    let reply = format!("{ctl}.reply.r1");
    let mut watch = insp
        .client
        .subscribe(format!("{ctl}.reply.>"))
        .await
        .expect("inspector sub");
    // flush() only writes the socket; a request round trip proves the broker holds the SUB.
    insp.sync().await.expect("inspector round trip");
    client
        .publish(reply.clone(), "ok".into())
        .await
        .expect("reply sent");
    let got = tokio::time::timeout(BOUND, watch.next())
        .await
        .unwrap_or_else(|_| panic!("reply arrives; events: {:?}", events.seen()))
        .expect("subscription open");
    assert_eq!(got.subject.as_str(), reply);
}

#[tokio::test]
async fn malformed_names_are_refused_at_the_provisioning_boundary() {
    let err = Mesh::builder().space("bad.space").err().expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("\"bad.space\"") && text.contains("[A-Za-z0-9_-]"),
        "{text}"
    );
    let err = cotal_delivery::provision::ReadChannels::new(["eng..alerts"]).expect_err("refused");
    assert!(err.to_string().contains("eng..alerts"), "{err}");
    let err = Principal::parse("local.al-ice").expect_err("refused");
    assert!(err.to_string().contains("al-ice") && err.to_string().contains("[A-Za-z0-9_]"));
}
