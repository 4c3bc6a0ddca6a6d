//! Provisioning against a real nats-server in operator mode: a space is provisioned twice
//! (idempotence), a half-finished run is completed, configs are checked from the client side,
//! and the minted profiles are exercised (allowed and denied requests).
//!
//! The broker is started here from a `ServerConf` (the full harness lives in another crate);
//! the binary is `$NATS_SERVER_BIN` or the project-local `.tools/nats-server-2.15.1`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::stream::{DiscardPolicy, RetentionPolicy};
use cotal_delivery::base::{connect_with_credential, connect_with_inbox};
use cotal_delivery::provision::{
    connect_provisioner, create_agent_consumer, ensure_stream, provision_space,
    space_stream_configs, Ensured, MeshAuthority, MintOptions, Profile, ProvisionOptions,
    ReadChannels, Roles, ServerConf, SystemProfile,
};
use cotal_delivery::wire::{
    LifecycleUid, Principal, Space, SpaceNames, MEMBERSHIP_OBSERVER_INBOX_PREFIX,
};

fn nats_server_bin() -> PathBuf {
    match std::env::var_os("NATS_SERVER_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/nats-server-2.15.1/nats-server")
        }
    }
}

/// Kills the broker by pid when the test ends, pass or fail.
struct Broker {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_broker(authority: &MeshAuthority) -> Broker {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = ServerConf::new()
        .jetstream(dir.path().join("js"))
        .operator(authority.operator_auth().expect("operator auth"));
    let conf_path = dir.path().join("server.conf");
    std::fs::write(&conf_path, conf.render()).expect("write server.conf");
    let ports_dir = dir.path().join("ports");
    std::fs::create_dir(&ports_dir).expect("ports dir");
    let log = std::fs::File::create(dir.path().join("nats.log")).expect("log file");
    let log_err = log.try_clone().expect("log clone");
    let bin = nats_server_bin();
    let mut child = Command::new(&bin)
        .arg("-c")
        .arg(&conf_path)
        .arg("--ports_file_dir")
        .arg(&ports_dir)
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let ports_file = ports_dir.join(format!("nats-server_{}.ports", child.id()));
    let deadline = Instant::now() + Duration::from_secs(15);
    let url = loop {
        if let Ok(text) = std::fs::read_to_string(&ports_file) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                if let Some(url) = v["nats"][0].as_str() {
                    break url.to_string();
                }
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.path().join("nats.log")).unwrap_or_default();
            panic!("nats-server exited early ({status}):\n{log}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let log = std::fs::read_to_string(dir.path().join("nats.log")).unwrap_or_default();
            panic!("no ports file within 15 s:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Broker {
        child,
        url,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisions_a_space_idempotently_on_a_real_broker() {
    let demo = Space::parse("demo").unwrap();
    let half = Space::parse("half").unwrap();
    let mut authority = MeshAuthority::new();
    authority.add_space(&demo);
    authority.add_space(&half);
    let broker = start_broker(&authority);
    let opts = ProvisionOptions::new();

    // First run creates all 15 streams and buckets (the anycast bucket is the 15th); the second
    // changes nothing.
    let first = provision_space(&authority, &broker.url, None, &demo, &opts)
        .await
        .expect("first provision");
    assert_eq!(first.created(), 15, "{first:?}");
    let second = provision_space(&authority, &broker.url, None, &demo, &opts)
        .await
        .expect("second provision");
    assert!(second.all_unchanged(), "{second:?}");

    // A half-finished run (two streams only) is completed by the next one.
    let (_client, js) = connect_provisioner(&authority, &broker.url, None, &half, &opts)
        .await
        .expect("provisioner connect");
    let half_names = SpaceNames::new(&half);
    for config in space_stream_configs(&half_names, &opts).iter().take(2) {
        assert_eq!(ensure_stream(&js, config).await.unwrap(), Ensured::Created);
    }
    let rest = provision_space(&authority, &broker.url, None, &half, &opts)
        .await
        .expect("completing provision");
    assert_eq!(rest.created(), 13, "{rest:?}");

    // Client-side view of the configs, read with a provisioner credential.
    let (_client, js) = connect_provisioner(&authority, &broker.url, None, &demo, &opts)
        .await
        .expect("provisioner connect");
    let names = SpaceNames::new(&demo);
    let info = |name: String| {
        let js = js.clone();
        async move {
            js.get_stream(&name)
                .await
                .unwrap_or_else(|e| panic!("stream {name}: {e}"))
                .cached_info()
                .config
                .clone()
        }
    };
    let dlv = info(names.dlv_stream()).await;
    assert_eq!(dlv.max_messages_per_subject, 1000);
    assert_eq!(dlv.discard, DiscardPolicy::Old);
    assert_eq!(dlv.duplicate_window, Duration::from_secs(7200));
    assert_eq!(
        info(names.task_stream()).await.retention,
        RetentionPolicy::WorkQueue
    );
    assert!(info(names.chat_stream()).await.allow_direct);
    assert!(!info(names.dm_stream()).await.allow_direct);
    assert!(info(names.ept_stream()).await.allow_message_schedules);
    let lease = info(SpaceNames::kv_stream(&names.delivery_bucket())).await;
    assert_eq!(lease.max_age, Duration::from_secs(30));
    assert_eq!(lease.max_messages_per_subject, 1);
    let membership = info(SpaceNames::kv_stream(&names.membership_bucket())).await;
    assert_eq!(membership.max_bytes, 64 * 1024 * 1024);
    let records = info(SpaceNames::kv_stream(&names.records_bucket())).await;
    assert!(records.deny_purge && !records.allow_rollup);

    // A safe difference (the lease TTL) is updated in place, and back.
    let short = ProvisionOptions::new().lease_ttl(Duration::from_secs(5));
    let changed = provision_space(&authority, &broker.url, None, &demo, &short)
        .await
        .expect("lease ttl update");
    let lease_name = SpaceNames::kv_stream(&names.delivery_bucket());
    let (_, outcome) = changed
        .streams
        .iter()
        .find(|(n, _)| *n == lease_name)
        .expect("lease stream in report");
    // The expiry markers live as long as a row (docs/host.md), so they follow the TTL too.
    assert_eq!(
        *outcome,
        Ensured::Updated(vec![
            "max_age",
            "duplicate_window",
            "subject_delete_marker_ttl"
        ])
    );
    let lease = info(lease_name.clone()).await;
    assert_eq!(lease.max_age, Duration::from_secs(5));
    assert_eq!(
        lease.subject_delete_marker_ttl,
        Some(Duration::from_secs(5))
    );
    let back = provision_space(&authority, &broker.url, None, &demo, &opts)
        .await
        .expect("lease ttl restore");
    assert_eq!(
        back.streams
            .iter()
            .filter(|(_, e)| *e != Ensured::Unchanged)
            .count(),
        1
    );

    // The agent's bind-only durable: created once, then accepted.
    let alice = Principal::parse("local.alice").unwrap();
    let uid = LifecycleUid::generate();
    assert_eq!(
        create_agent_consumer(&js, &names, &alice, &uid)
            .await
            .unwrap(),
        Ensured::Created
    );
    assert_eq!(
        create_agent_consumer(&js, &names, &alice, &uid)
            .await
            .unwrap(),
        Ensured::Unchanged
    );

    // The agent binds it with its own credential, and may not create DLV consumers.
    let agent = authority
        .mint(
            &demo,
            &Profile::Agent {
                principal: alice.clone(),
                lifecycle_uid: uid.clone(),
                read: ReadChannels::new(["general"]).unwrap(),
                roles: Roles::none(),
            },
            MintOptions::new(),
        )
        .unwrap();
    let agent_client =
        connect_with_credential(&broker.url, None, &agent, "agent", Duration::from_secs(5))
            .await
            .expect("agent connect");
    let mut agent_js = async_nats::jetstream::new(agent_client);
    agent_js.set_timeout(Duration::from_secs(1));
    let bound: Result<PullConsumer, _> = agent_js
        .get_consumer_from_stream(SpaceNames::dlv_durable(&alice, &uid), names.dlv_stream())
        .await;
    assert!(
        bound.is_ok(),
        "agent binds its own durable: {:?}",
        bound.err()
    );
    let other = LifecycleUid::generate();
    let denied = agent_js
        .create_consumer_on_stream(
            cotal_delivery::provision::agent_consumer_config(&names, &alice, &other),
            names.dlv_stream(),
        )
        .await;
    assert!(denied.is_err(), "agent must not create DLV consumers");

    // The delivery credential reads what its grants allow and nothing else.
    let delivery = authority
        .mint(&demo, &Profile::Delivery, MintOptions::new())
        .unwrap();
    let dclient = connect_with_credential(
        &broker.url,
        None,
        &delivery,
        "delivery",
        Duration::from_secs(5),
    )
    .await
    .expect("delivery connect");
    let mut djs = async_nats::jetstream::new(dclient);
    djs.set_timeout(Duration::from_secs(1));
    assert!(djs.get_stream(names.chat_stream()).await.is_ok());
    assert!(djs.get_stream(names.dm_stream()).await.is_err());

    // The $SYS observer (signed by the system account) answers a CONNZ of the space account.
    let observer = authority
        .mint_system(&demo, SystemProfile::MembershipObserver, MintOptions::new())
        .unwrap();
    let oclient = connect_with_inbox(
        &broker.url,
        None,
        &observer,
        "observer",
        MEMBERSHIP_OBSERVER_INBOX_PREFIX,
        Duration::from_secs(5),
    )
    .await
    .expect("observer connect");
    let account = authority.account_public_key(&demo).unwrap();
    let reply = tokio::time::timeout(
        Duration::from_secs(5),
        oclient.request(format!("$SYS.REQ.ACCOUNT.{account}.CONNZ"), "{}".into()),
    )
    .await
    .expect("CONNZ answered in time")
    .expect("CONNZ request");
    let connz: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert!(
        connz["data"]["num_connections"].as_u64().unwrap_or(0) >= 2,
        "{connz}"
    );

    drop(broker);
}
