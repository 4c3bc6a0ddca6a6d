//! The multi-space host is the only kicker (`deliver --spaces`, two lanes, one real broker): a
//! lane's verified eviction hands its live matches to the host, which kicks only what its own
//! census of the lane's account lists, with users it mints from the retained system seed. The
//! spaces hold no evictor credential at all, so a kick can only come from the host; the
//! broker's own `/connz` shows who connected.

use std::time::Duration;

use crate::support::admin as a;
use crate::support::data_path as s;
use crate::support::BOUND;
use cotal_delivery::base::ConnRow;
use cotal_delivery::host::{HostKicker, HOST_CENSUS_CONNECTION, HOST_KICKER_CONNECTION};
use cotal_delivery::provision::Manifest;
use cotal_delivery::provision::MeshAuthority;
use cotal_delivery::provision::{retain_system_seed, system_seed_path};
use cotal_delivery::wire::Principal;
use delivery_harness::rig::agent;
use delivery_harness::rig::manager::Manager;
use delivery_harness::rig::mesh::Mesh;
use delivery_harness::{BrokerConn, ConnState};
use serde_json::json;

/// Open connections tagged `principal:<p>`.
async fn live(mesh: &Mesh, principal: &str) -> Vec<BrokerConn> {
    let mut open = mesh.broker.connz(ConnState::Open).await.expect("connz");
    open.retain(|c| c.is_principal(principal));
    open
}

/// Closed connections whose client name is `name`.
async fn closed_named(mesh: &Mesh, name: &str) -> usize {
    let closed = mesh.broker.connz_named(ConnState::Closed, name).await;
    closed.expect("connz").len()
}

/// On a two-lane host whose spaces hold no evictor credential, `evictPrincipal` on lane
/// alpha's rail evicts alice (alpha) through the host: verified gone, gone from `/connz`, and
/// the broker saw the host's census and kick-only connections and no lane evictor. bob (beta)
/// is not evicted through alpha: alpha's sweep does not see him, and a forged target naming his
/// connection is refused by the host's census of alpha's account. A retained seed of another
/// system account is inconsistent authority, and without any retained seed the host has no kick
/// authority: a live principal's eviction is refused either way.
///
/// Mutations seen failing: dropping `cfg.kicker = Some(kicker.for_lane(..))` in
/// `host/lane.rs` (the lane falls back to its own evictor, which is not provisioned: refused);
/// kicking every target without the census lookup in `host/kicker.rs` (bob's forged target is
/// kicked and he leaves `/connz`); dropping the issuer comparison in `HostKicker::authority`
/// (the foreign seed's census user is refused by the broker: another refusal text).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_is_the_only_kicker_and_kicks_only_what_its_census_of_the_lane_lists() {
    let mesh = Mesh::builder()
        .space("alpha")
        .unwrap()
        .space("beta")
        .unwrap()
        .evictor(false)
        .start()
        .await
        .unwrap();
    let (alpha, beta) = (mesh.spaces()[0].clone(), mesh.spaces()[1].clone());
    Manifest {
        spaces: vec![alpha.clone(), beta.clone()],
    }
    .write(mesh.root())
    .unwrap();
    // Only beta retained the seed: the host's authority serves every lane of its root.
    let seed = retain_system_seed(mesh.workspace(), &beta, &mesh.authority).unwrap();
    let ins_a = mesh.inspector(&alpha).await.unwrap();
    let ins_b = mesh.inspector(&beta).await.unwrap();
    let mut host = crate::support::start_host(
        mesh.host(mesh.root())
            .env("COTAL_DELIVERY_SWEEP_SETTLE_MS", a::SWEEP_SETTLE_MS),
        &["alpha", "beta"],
    )
    .await;
    let m = Manager::connect(&mesh, &alpha, &Principal::parse("local.manager").unwrap())
        .await
        .unwrap();
    let alice = agent::provision(&mesh, &ins_a, &alpha, "alice", &["general"])
        .await
        .unwrap();
    let bob = agent::provision(&mesh, &ins_b, &beta, "bob", &["general"])
        .await
        .unwrap();
    let _alice = a::victim(&mesh, &alice).await;
    let _bob = a::victim(&mesh, &bob).await;
    assert_eq!(live(&mesh, "local.alice").await.len(), 1);
    assert_eq!(live(&mesh, "local.bob").await.len(), 1);

    let started = std::time::Instant::now();
    let r = a::ask(&m, "evictPrincipal", json!({"principal": "local.alice"})).await;
    println!(
        "MEASURED evictPrincipal through the host kicker: {} ms",
        started.elapsed().as_millis()
    );
    assert_eq!(
        r,
        json!({"principal": "local.alice", "kicked": 1, "remaining": 0, "verifiedGone": true, "scanComplete": true}),
        "{}",
        host.transcript()
    );
    s::eventually("alice gone from /connz", Duration::from_secs(5), || async {
        live(&mesh, "local.alice").await.is_empty()
    })
    .await;
    assert!(closed_named(&mesh, HOST_CENSUS_CONNECTION).await >= 1);
    assert_eq!(closed_named(&mesh, HOST_KICKER_CONNECTION).await, 1);
    assert_eq!(
        closed_named(&mesh, "cotal-delivery-evictor").await,
        0,
        "no lane opened an evictor"
    );

    // bob lives in beta's account: alpha's sweep does not see him.
    let r = a::ask(&m, "evictPrincipal", json!({"principal": "local.bob"})).await;
    assert_eq!(r["kicked"], 0, "{r}");
    assert_eq!(r["note"], "principal not currently live - nothing to evict");
    // A target forged with bob's real connection is refused by the host's census of alpha.
    let bob_conn = live(&mesh, "local.bob").await.remove(0);
    let server_id = mesh.broker.monitor("/varz").await.unwrap()["server_id"]
        .as_str()
        .unwrap()
        .to_string();
    let forged = ConnRow {
        cid: bob_conn.cid,
        server_id,
        principal: Some(Principal::parse("local.bob").unwrap()),
        user_nkey: bob_conn.raw["authorized_user"].as_str().map(str::to_string),
        name: None,
    };
    let kicker = HostKicker::new(
        mesh.root().to_path_buf(),
        vec![alpha.clone(), beta.clone()],
        mesh.url(),
        mesh.tls_ca(),
    );
    let alpha_account = mesh.authority.account_public_key(&alpha).unwrap();
    let outcome = kicker
        .for_lane(&alpha, &alpha_account)
        .kick("evictPrincipal", std::slice::from_ref(&forged))
        .await
        .expect("the host has kick authority");
    let refusal = outcome[0]
        .clone()
        .expect_err("bob is not in alpha's census");
    assert!(
        refusal.contains("its own census of account") && refusal.contains(&alpha_account),
        "{refusal}"
    );
    assert_eq!(live(&mesh, "local.bob").await.len(), 1, "bob untouched");
    assert_eq!(closed_named(&mesh, HOST_KICKER_CONNECTION).await, 1);

    let carol = agent::provision(&mesh, &ins_a, &alpha, "carol", &["general"])
        .await
        .unwrap();
    let _carol = a::victim(&mesh, &carol).await;
    let evict_carol = || async {
        a::ask_refused(&m, "evictPrincipal", json!({"principal": "local.carol"})).await
    };
    // A seed of another system account: inconsistent authority, refused.
    let other = MeshAuthority::new().system_account_seed().unwrap();
    std::fs::write(&seed, format!("{other}\n")).unwrap();
    let inconsistent = evict_carol().await;
    // No retained seed: no kick authority, refused.
    std::fs::remove_file(&seed).unwrap();
    assert!(!system_seed_path(mesh.workspace(), &alpha).exists());
    let missing = evict_carol().await;
    snapshot!(
        "admin_host_kick_no_authority",
        format!("{inconsistent}\n{missing}")
    );
    assert_eq!(live(&mesh, "local.carol").await.len(), 1, "carol untouched");

    host.terminate().expect("SIGTERM");
    let status = host.wait_exit(BOUND).await.expect("host exits");
    assert_eq!(status.code(), Some(0), "{}", host.transcript());
}
