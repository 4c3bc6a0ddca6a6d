//! Verified eviction (`evictPrincipal`, `evictPrincipals`) on a real broker with the real daemon:
//! results checked against the broker's own `/connz`, the `$SYS` traffic counted from a
//! test-side observer, refusals snapshotted.

use std::time::Duration;

use crate::support::admin as a;
use crate::support::data_path as s;
use crate::support::BOUND;
use cotal_delivery::base::{read_creds_file, write_creds_file_atomic};
use cotal_delivery::provision::{MeshAuthority, MintOptions, SystemProfile};
use cotal_delivery::wire::MEMBERSHIP_OBSERVER_INBOX_PREFIX;
use delivery_harness::agent;
use delivery_harness::mesh::Mesh;
use delivery_harness::ConnState;
use futures::StreamExt;
use serde_json::json;

/// Connections the broker's monitor lists carrying the tag `principal:<p>`.
async fn live_on_broker(mesh: &Mesh, principal: &str) -> usize {
    let open = mesh.broker.connz(ConnState::Open).await.expect("connz");
    open.iter().filter(|c| c.is_principal(principal)).count()
}

/// A live victim is kicked and verified gone: the broker listed its tagged connection before,
/// and lists none after.
///
/// Mutation seen failing: dropping the `principal:` tags from `Profile::tags` (the scan
/// attributes nothing, the result says "nothing to evict" and the connection stays).
#[tokio::test]
async fn a_live_victim_is_kicked_and_gone_from_connz() {
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = a::start_daemon(&mesh).await;
    let m = a::manager(&mesh).await;
    let alice = agent::provision(&mesh, &insp, mesh.space(), "alice", &["general"])
        .await
        .unwrap();
    let _victim = a::victim(&mesh, &alice).await;
    assert_eq!(live_on_broker(&mesh, "local.alice").await, 1);
    let r = a::answered(
        m.request_once(
            "evictPrincipal",
            &json!({"principal": "local.alice"}),
            BOUND,
        )
        .await,
    );
    crate::support::snapshot_base()
        .bind(|| insta::assert_snapshot!("admin_evict__live_victim", r.to_string()));
    s::eventually("alice gone from /connz", Duration::from_secs(5), || async {
        live_on_broker(&mesh, "local.alice").await == 0
    })
    .await;
    assert_eq!(
        live_on_broker(&mesh, "local.manager").await,
        1,
        "the manager is untouched"
    );
    s::stop_daemon(&mut d).await;
}

/// A kicked one-shot client stays gone: the client gives up after its one refused redial
/// (`MaxReconnects`, observed through its own events), and the broker lists no connection of
/// the principal afterwards, although its credential is still valid.
///
/// Mutation seen failing: the options before the fix back in `cotal_delivery::base::credential_options`
/// (`max_reconnects(Some(0))`, which async-nats reads as unlimited, and a signer that signs every
/// handshake): the client redials at once and never reports `MaxReconnects`.
#[tokio::test]
async fn a_kicked_one_shot_client_stays_gone() {
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = a::start_daemon(&mesh).await;
    let m = a::manager(&mesh).await;
    let alice = agent::provision(&mesh, &insp, mesh.space(), "alice", &["general"])
        .await
        .unwrap();
    let (client, mut events) = mesh
        .connect_watched(&alice.credential, "one-shot")
        .await
        .unwrap();
    assert_eq!(live_on_broker(&mesh, "local.alice").await, 1);
    let r = a::answered(
        m.request_once(
            "evictPrincipal",
            &json!({"principal": "local.alice"}),
            BOUND,
        )
        .await,
    );
    assert_eq!(r["verifiedGone"], true, "{r}");
    events
        .wait_for(
            Duration::from_secs(10),
            "the one-shot client giving up",
            |e| {
                matches!(
                    e,
                    async_nats::Event::ClientError(async_nats::ClientError::MaxReconnects)
                )
            },
        )
        .await
        .expect("the kicked client gives up instead of redialing");
    assert_eq!(live_on_broker(&mesh, "local.alice").await, 0);
    assert_eq!(
        client.connection_state(),
        async_nats::connection::State::Disconnected
    );
    assert!(
        client.flush().await.is_err(),
        "a given-up client has no connection to flush on"
    );
    s::stop_daemon(&mut d).await;
}

/// Without an evictor credential a principal that is not live is still verified gone (the
/// evictor is never loaded), while a live one is refused with the reference text.
///
/// Mutation seen failing: loading the evictor before the first scan in `rails/evict.rs` (the
/// ghost is refused too).
#[tokio::test]
async fn a_ghost_is_verified_gone_without_an_evictor_and_a_live_one_is_refused() {
    let mesh = Mesh::demo_builder()
        .unwrap()
        .evictor(false)
        .start()
        .await
        .unwrap();
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = a::start_daemon(&mesh).await;
    let m = a::manager(&mesh).await;
    let ghost = a::answered(
        m.request_once(
            "evictPrincipal",
            &json!({"principal": "local.ghost"}),
            BOUND,
        )
        .await,
    );
    let (_alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    let live = a::refused(
        m.request_once(
            "evictPrincipal",
            &json!({"principal": "local.alice"}),
            BOUND,
        )
        .await,
    );
    let settings = s::snapshot_settings();
    settings.bind(|| {
        insta::assert_snapshot!(
            "admin_evict_ghost_without_evictor",
            format!("{ghost}\n{live}")
        );
    });
    assert_eq!(live_on_broker(&mesh, "local.alice").await, 1);
    s::stop_daemon(&mut d).await;
}

/// Malformed, missing and too many principals, and a torn observer/evictor rotation, are
/// refused with the reference texts, and nothing is kicked.
///
/// Mutation seen failing: dropping the issuer comparison in `sys.rs` (the torn pair
/// evicts alice).
#[tokio::test]
async fn malformed_oversized_and_torn_requests_are_refused() {
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = a::start_daemon(&mesh).await;
    let m = a::manager(&mesh).await;
    let (_alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    let mut texts = Vec::new();
    for (op, args) in [
        ("evictPrincipal", json!({"principal": "evil.alice"})),
        ("evictPrincipal", json!({"principal": "  "})),
        ("evictPrincipal", json!({})),
        (
            "evictPrincipals",
            json!({"principals": (0..257).map(|i| format!("local.a{i}")).collect::<Vec<_>>()}),
        ),
        (
            "evictPrincipals",
            json!({"principals": ["local.a", "local.a"]}),
        ),
        ("evictPrincipals", json!({"principals": []})),
    ] {
        texts.push(a::refused(m.request_once(op, &args, BOUND).await));
    }
    // A torn rotation: the evictor re-minted by another system-account key.
    let mut other = MeshAuthority::new();
    other.add_space(mesh.space());
    let torn = other
        .mint_system(
            mesh.space(),
            SystemProfile::ConnectionEvictor,
            MintOptions::new(),
        )
        .unwrap();
    let path = mesh.workspace().connection_evictor_creds_path(mesh.space());
    assert!(read_creds_file(&path).is_ok());
    write_creds_file_atomic(&path, &torn).unwrap();
    texts.push(a::refused(
        m.request_once(
            "evictPrincipal",
            &json!({"principal": "local.alice"}),
            BOUND,
        )
        .await,
    ));
    let settings = s::snapshot_settings();
    settings.bind(|| {
        insta::assert_snapshot!("admin_evict_refusals", texts.join("\n"));
    });
    assert_eq!(
        live_on_broker(&mesh, "local.alice").await,
        1,
        "nothing was kicked"
    );
    s::stop_daemon(&mut d).await;
}

/// 256 principals in one `evictPrincipals` are answered with one shared sweep: the test-side
/// `$SYS` observer counts the CONNZ answers the daemon's sweep drew (one per request on a
/// single server): one scan and one verify re-scan, not one per principal. Results come back
/// in order, the live ones kicked and gone from `/connz`, the rest verified gone untouched.
///
/// Mutation seen failing: answering `evictPrincipals` one principal at a time (each with its own
/// scan) draws 256+ CONNZ answers.
#[tokio::test]
async fn two_hundred_fifty_six_principals_share_one_sweep() {
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = a::start_daemon(&mesh).await;
    let m = a::manager(&mesh).await;
    let mut live = Vec::new();
    for i in 0..3 {
        let mat = agent::provision(
            &mesh,
            &insp,
            mesh.space(),
            &format!("holder{i}"),
            &["general"],
        )
        .await
        .unwrap();
        live.push(a::victim(&mesh, &mat).await);
    }
    let observer = read_creds_file(
        &mesh
            .workspace()
            .membership_observer_creds_path(mesh.space()),
    )
    .unwrap();
    let watcher = cotal_delivery::base::connect_with_inbox(
        &mesh.url(),
        mesh.tls_ca().as_deref(),
        &observer,
        "test-observer",
        MEMBERSHIP_OBSERVER_INBOX_PREFIX,
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let mut answers = watcher
        // The eviction sweep's replies only (the membership feed sweeps under the same prefix).
        .subscribe(format!("{MEMBERSHIP_OBSERVER_INBOX_PREFIX}.evict.>"))
        .await
        .unwrap();
    watcher.flush().await.unwrap();
    let mut principals: Vec<String> = (0..3).map(|i| format!("local.holder{i}")).collect();
    principals.extend((0..253).map(|i| format!("local.ghost{i}")));
    let started = tokio::time::Instant::now();
    let r = a::answered(
        m.request_once("evictPrincipals", &json!({"principals": principals}), BOUND)
            .await,
    );
    let took = started.elapsed();
    let mut connz = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(300), answers.next()).await {
        connz += 1;
    }
    println!(
        "MEASURED evictPrincipals of 256 (3 live): {} ms, {connz} CONNZ answers",
        took.as_millis()
    );
    let results = r.as_array().unwrap();
    assert_eq!(results.len(), 256);
    for (want, got) in principals.iter().zip(results) {
        assert_eq!(got["principal"].as_str(), Some(want.as_str()));
        assert_eq!(got["verifiedGone"], json!(true), "{got}");
        let kicked = if want.contains("holder") { 1 } else { 0 };
        assert_eq!(got["kicked"], json!(kicked), "{got}");
    }
    assert_eq!(connz, 2, "one scan and one verify re-scan");
    for i in 0..3 {
        let p = format!("local.holder{i}");
        s::eventually(
            &format!("{p} gone from /connz"),
            Duration::from_secs(5),
            || async { live_on_broker(&mesh, &p).await == 0 },
        )
        .await;
    }
    drop(live);
    s::stop_daemon(&mut d).await;
}

/// A reply on the admin rail larger than the broker's `max_payload` is answered with the size
/// refusal: 60 results of `evictPrincipals` do not fit in 4096 bytes, so the manager gets the
/// refusal at once instead of waiting out its timeout.
///
/// Mutation seen failing (applied): skipping the size check in `rails::encode_reply` (the
/// reply is never delivered and the request times out).
#[tokio::test]
async fn an_oversized_eviction_reply_is_refused_with_its_size() {
    let mesh = Mesh::demo_builder()
        .unwrap()
        .broker(|b| b.max_payload_bytes(4096))
        .start()
        .await
        .unwrap();
    let mut d = a::start_daemon(&mesh).await;
    let m = a::manager(&mesh).await;
    let principals: Vec<String> = (0..60).map(|i| format!("local.ghost{i}")).collect();
    let started = tokio::time::Instant::now();
    let refusal = a::refused(
        m.request_once(
            "evictPrincipals",
            &json!({"principals": principals}),
            Duration::from_secs(5),
        )
        .await,
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let mut settings = crate::support::snapshot_base();
    settings.add_filter(r"reply is \d+ bytes", "reply is [N] bytes");
    settings.bind(|| insta::assert_snapshot!("admin_evict__oversized_eviction_reply", refusal));
    s::stop_daemon(&mut d).await;
}
