//! Provisioning against a real operator-mode broker: the space is really there, credentials
//! really expire, and the `delivery` credential is really confined. Every verdict is the
//! broker's, observed from the client side.

use std::time::Duration;

use crate::support::data_path::mesh_with_lease_ttl;
use crate::support::BOUND;
use async_nats::Event;
use cotal_delivery::base::Rows;
use cotal_delivery::provision::{MintOptions, Profile};
use cotal_delivery::wire::{LifecycleUid, Principal, SpaceNames, LEASE_KEY};
use delivery_harness::rig::events::ClientEvents;
use delivery_harness::rig::mesh::Mesh;
use delivery_harness::wait_until;
use futures::StreamExt;

/// The lease TTL these tests provision (7 s): not the default, so the bucket's `max_age`
/// proves the option was applied.
const LEASE_TTL: Duration = Duration::from_secs(7);

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
    let mesh = mesh_with_lease_ttl(LEASE_TTL).await;
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
        info.config.max_age, LEASE_TTL,
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
    let mesh = mesh_with_lease_ttl(LEASE_TTL).await;
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
    let mesh = mesh_with_lease_ttl(LEASE_TTL).await;
    let space = mesh.space().clone();
    let names = SpaceNames::new(&space);
    let insp = mesh.inspector(&space).await.expect("inspector");
    let cred = cotal_delivery::base::read_creds_file(&mesh.workspace().delivery_creds_path(&space))
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

/// The next two entries of a KV watch: the row written at `revision`, then its expiry, which
/// async-nats reads as a `Purge` stamped no earlier than `ttl` after the row; returns the latter.
async fn row_then_expiry(
    watch: &mut async_nats::jetstream::kv::Watch,
    revision: u64,
    ttl: Duration,
) -> async_nats::jetstream::kv::Entry {
    use async_nats::jetstream::kv::Operation;
    let mut next = async |bound: Duration, what: &str| {
        tokio::time::timeout(bound, watch.next())
            .await
            .unwrap_or_else(|_| panic!("the watch sees {what}"))
            .expect("open")
            .expect("entry")
    };
    let put = next(BOUND, "the row").await;
    assert_eq!((put.operation, put.revision), (Operation::Put, revision));
    let marker = next(ttl + BOUND, "the row's expiry").await;
    assert_eq!(marker.operation, Operation::Purge, "{marker:?}");
    assert!(marker.revision > revision);
    let lived = (marker.created - put.created).unsigned_abs();
    assert!(lived >= ttl, "the marker came {lived:?} after the row");
    marker
}

/// The lease bucket's raw last message for the key: (sequence, headers, payload length).
async fn last_lease_message(
    insp: &delivery_harness::rig::mesh::Inspector,
) -> (u64, Vec<String>, usize) {
    let stream = insp
        .js
        .get_stream_no_info(SpaceNames::kv_stream(&insp.names().delivery_bucket()))
        .await
        .expect("lease stream");
    let subject = format!("$KV.{}.{LEASE_KEY}", insp.names().delivery_bucket());
    let msg = stream
        .get_last_raw_message_by_subject(&subject)
        .await
        .expect("last message");
    let mut headers: Vec<String> = msg
        .headers
        .iter()
        .map(|(k, v)| format!("{k}: {}", v[0].as_str()))
        .collect();
    headers.sort();
    (msg.sequence, headers, msg.payload.len())
}

/// A lease row that runs out its TTL leaves the broker's own marker (the lease bucket is
/// provisioned with `allow_msg_ttl` and `subject_delete_marker_ttl`: a new message on the key,
/// `Nats-Marker-Reason: MaxAge`, no `KV-Operation`, no value), stamped no earlier than the TTL
/// after the row. Every reader sees the row gone: the daemon's leader-served read reads it absent
/// at the marker's revision, the `delivery` credential's create lands over the marker, and
/// async-nats reads it as the reference's TypeScript client reads it (a plain KV read gives no
/// value, the entry is a `Purge` at the marker's revision, a KV watch delivers a `Purge`): nats.js
/// reports the same marker as `PURGE`, which the reference's `readEntry` maps to no row.
/// Mutation seen failing: `Rows::read` taking the marker for a row (the `Nats-Marker-Reason` arm
/// of `kv::row_op` removed): `Inspector::lease` fails on the empty value ("lease row is not a
/// LeaseInfo: EOF …").
#[tokio::test]
async fn an_expired_lease_row_leaves_a_marker_every_reader_reads_as_absent() {
    use async_nats::jetstream::kv::Operation;
    use cotal_delivery::base::Read;
    let ttl = Duration::from_secs(2);
    let mesh = mesh_with_lease_ttl(ttl).await;
    let space = mesh.space().clone();
    let insp = mesh.inspector(&space).await.expect("inspector");
    let config = insp.lease_bucket_config().await.expect("config");
    assert!(config.allow_message_ttl, "{config:?}");
    assert_eq!(
        config.subject_delete_marker_ttl,
        Some(ttl),
        "marker TTL = lease TTL"
    );

    let kv = insp
        .js
        .get_key_value(insp.names().delivery_bucket())
        .await
        .expect("kv");
    let mut watch = kv.watch(LEASE_KEY).await.expect("watch");
    let row = crate::support::host::foreign_row();
    let revision = insp.put_lease(&row).await.expect("row");
    let marker = row_then_expiry(&mut watch, revision, ttl).await;

    let (seq, headers, len) = last_lease_message(&insp).await;
    assert_eq!(seq, marker.revision);
    assert_eq!(
        headers,
        vec![
            "Nats-Marker-Reason: MaxAge",
            "Nats-Rollup: sub",
            "Nats-TTL: 2s"
        ],
        "the broker's own marker, with no KV-Operation"
    );
    assert_eq!(len, 0);

    // async-nats, as the reference's client reads the bucket.
    assert_eq!(
        kv.get(LEASE_KEY).await.expect("get"),
        None,
        "a plain KV read"
    );
    let entry = kv.entry(LEASE_KEY).await.expect("entry").expect("an entry");
    assert_eq!((entry.operation, entry.revision), (Operation::Purge, seq));
    // The daemon's own reads and create, under the delivery credential.
    assert!(insp.lease().await.expect("read").is_none());
    let cred = cotal_delivery::base::read_creds_file(&mesh.workspace().delivery_creds_path(&space))
        .expect("delivery creds");
    let client = mesh.connect(&cred, "delivery").await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let rows = Rows::open(&js, &insp.names().delivery_bucket(), BOUND)
        .await
        .expect("rows");
    assert_eq!(
        rows.read(LEASE_KEY).await.expect("read"),
        Read::Absent {
            marker_revision: Some(seq)
        }
    );
    let body = serde_json::to_vec(&row).expect("json");
    let created = rows.create(LEASE_KEY, body.into()).await.expect("create");
    assert_eq!(created, seq + 1, "the create names the marker's revision");
}

/// A lease bucket made before expiry markers (the same config without them), holding a live
/// row, is migrated in place when the space is provisioned again: the report says the stream was
/// updated with exactly `allow_msg_ttl` and `subject_delete_marker_ttl` (and `up`'s line names
/// both), the broker's config has both, the row is still there at its revision, and its expiry
/// leaves the broker's marker, seen by a watch bound before the migration. A third run changes
/// nothing.
/// Mutation seen failing: the two marker entries of `provision::streams::diff` removed: the
/// stream reads `Unchanged` (no update is sent, so no marker could follow).
#[tokio::test]
async fn an_existing_lease_bucket_is_migrated_to_expiry_markers_in_place() {
    use cotal_delivery::provision::{self, Ensured, ProvisionOptions};
    let ttl = Duration::from_secs(3);
    let mesh = mesh_with_lease_ttl(ttl).await;
    let space = mesh.space().clone();
    let insp = mesh.inspector(&space).await.expect("inspector");
    insp.lease_bucket_without_markers()
        .await
        .expect("old bucket");
    let old = insp.lease_bucket_config().await.expect("config");
    assert!(!old.allow_message_ttl && old.subject_delete_marker_ttl.is_none());
    let kv = insp
        .js
        .get_key_value(insp.names().delivery_bucket())
        .await
        .expect("kv");
    let mut watch = kv.watch(LEASE_KEY).await.expect("watch");
    let revision = insp
        .put_lease(&crate::support::host::foreign_row())
        .await
        .expect("a live row");

    let options = ProvisionOptions::new().lease_ttl(ttl);
    let ca = mesh.broker.ca_pem_path();
    let report = provision::provision_space(
        &mesh.authority,
        &mesh.url(),
        ca.as_deref(),
        &space,
        &options,
    )
    .await
    .expect("provision again");
    let lease_stream = SpaceNames::kv_stream(&insp.names().delivery_bucket());
    let changed: Vec<&(String, Ensured)> = report
        .streams
        .iter()
        .filter(|(_, e)| *e != Ensured::Unchanged)
        .collect();
    assert_eq!(
        changed,
        vec![&(
            lease_stream.clone(),
            Ensured::Updated(vec!["allow_msg_ttl", "subject_delete_marker_ttl"])
        )]
    );
    assert_eq!(
        report.summary(),
        format!("0 created, the rest already in place; {lease_stream} updated in place (allow_msg_ttl, subject_delete_marker_ttl)")
    );
    let now = insp.lease_bucket_config().await.expect("config");
    assert!(now.allow_message_ttl);
    assert_eq!(now.subject_delete_marker_ttl, Some(ttl));
    assert_eq!(
        insp.lease().await.expect("read").map(|r| r.revision),
        Some(revision),
        "the row lives through the migration"
    );

    let marker = row_then_expiry(&mut watch, revision, ttl).await;
    let (seq, headers, _) = last_lease_message(&insp).await;
    assert_eq!(seq, marker.revision);
    assert!(
        headers.contains(&"Nats-Marker-Reason: MaxAge".to_string()),
        "{headers:?}"
    );
    let again = provision::provision_space(
        &mesh.authority,
        &mesh.url(),
        ca.as_deref(),
        &space,
        &options,
    )
    .await
    .expect("provision a third time");
    assert!(again.all_unchanged(), "{:?}", again.streams);
}

/// Open dev mode has no delivery daemon: pointed at a broker that requires no authentication
/// (its INFO has no `auth_required`), the daemon refuses on its first dial, says why in one
/// line, exits 3, and creates nothing there (no stream, no consumer; it never reached `$SYS`
/// admission or the lease). The same workspace against the auth mesh serves. Mutation seen
/// failing: the `auth_required` check removed from `SpaceDaemon::start` (the daemon goes on to
/// admission and fails later, on the missing lease bucket, with exit 8 and another line).
#[tokio::test]
async fn an_open_broker_is_refused_at_start_saying_open_mode_has_no_daemon() {
    let mesh = mesh_with_lease_ttl(LEASE_TTL).await;
    let open = delivery_harness::Broker::builder()
        .start()
        .await
        .expect("open broker");
    let mut d =
        delivery_harness::rig::daemon::DaemonSpec::deliver(mesh.space().as_str(), mesh.root())
            .server(&open.client_url())
            .spawn()
            .expect("spawn");
    let status = d.wait_exit(BOUND).await.expect("exits");
    assert_eq!(status.code(), Some(3), "{}", d.transcript());
    assert!(!d.has_line("$SYS sweeps bound"), "{}", d.transcript());
    let jsz = open.jsz().await.expect("jsz");
    assert_eq!(jsz["streams"], 0, "{jsz}");
    assert_eq!(jsz["consumers"], 0, "{jsz}");
    snapshot!("provisioning_open_broker_refused", d.transcript());
    let mut served = crate::support::start(mesh.deliver(mesh.space())).await;
    served.terminate().expect("SIGTERM");
    assert_eq!(served.wait_exit(BOUND).await.expect("exit").code(), Some(0));
}
