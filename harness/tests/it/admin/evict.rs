//! Verified eviction (`evictPrincipal`) on a real broker with the real daemon, beyond the cases of
//! the `admin` and `bad-input` families: results checked against the broker's own `/connz`, the
//! kicked one-shot client's own events, the ghost without an evictor snapshotted.

use std::time::Duration;

use crate::support::admin as a;
use crate::support::data_path as s;
use delivery_harness::rig::agent;
use delivery_harness::rig::mesh::Mesh;
use delivery_harness::ConnState;
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
    let (mesh, mut d, m, alice) = a::served_with_alice().await;
    let _victim = a::victim(&mesh, &alice).await;
    assert_eq!(live_on_broker(&mesh, "local.alice").await, 1);
    let r = a::ask(&m, "evictPrincipal", json!({"principal": "local.alice"})).await;
    snapshot!("admin_evict__live_victim", r.to_string());
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
    let (mesh, mut d, m, alice) = a::served_with_alice().await;
    let (client, mut events) = mesh
        .connect_watched(&alice.credential, "one-shot")
        .await
        .unwrap();
    assert_eq!(live_on_broker(&mesh, "local.alice").await, 1);
    let r = a::ask(&m, "evictPrincipal", json!({"principal": "local.alice"})).await;
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
    let mut d = crate::support::start(a::admin_spec(&mesh)).await;
    let m = a::manager(&mesh).await;
    let ghost = a::ask(&m, "evictPrincipal", json!({"principal": "local.ghost"})).await;
    let (_alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    let live = a::ask_refused(&m, "evictPrincipal", json!({"principal": "local.alice"})).await;
    snapshot!(
        "admin_evict_ghost_without_evictor",
        format!("{ghost}\n{live}")
    );
    assert_eq!(live_on_broker(&mesh, "local.alice").await, 1);
    s::stop_daemon(&mut d).await;
}
