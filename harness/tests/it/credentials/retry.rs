//! The missed remint's cadence, counted at the store: an embedded service (in this process)
//! reads its injected [`MemoryStore`], so every read of the delivery credential is counted.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::BOUND;
use cotal_delivery::base::{delivery_creds_key, MemoryStore, SecretStore, StoreIdentity};
use cotal_delivery::provision::{MintOptions, Profile, SpaceMaterial};
use cotal_delivery::space::{evictor_key, observer_key, HealthConfig};
use cotal_delivery::{start_delivery_service, HostedContextInputs};
use delivery_harness::rig::mesh::Mesh;

/// The retry the service runs with (its documented input, `tuning.remint_retry`).
const RETRY: Duration = Duration::from_secs(2);
/// How long the reads are counted from just before the 75 % point: it ends before the
/// credential's expiry (`LIFETIME`), where an expired daemon reads its store at once.
const WINDOW: Duration = Duration::from_millis(5_000);
/// The credential's lifetime: its 75 % point (15 s) plus the window ends 0.5 s before the exp.
const LIFETIME: Duration = Duration::from_secs(20);
/// The window opens this long before the 75 % point, so the first re-read is inside it.
const LEAD: Duration = Duration::from_millis(500);

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

async fn sleep_until_unix_ms(at: u64) {
    tokio::time::sleep(Duration::from_millis(at.saturating_sub(unix_ms()))).await;
}

/// Past the 75 % point, a store that still holds the live credential is read once per retry
/// (2 s here), not once per second: over 5 s from just before that point the delivery
/// credential is read at most 3 times (at the point, then every 2 s), and at least twice.
/// The live credential stays until its expiry (20 s), after the window: at the expiry the
/// daemon reads its store at once (the expired re-read), a read this test does not count (an
/// 8 s credential and a 7 s window crossing its expiry counted it, 5 reads, in 2 runs of 4).
/// The service does not close on it within the window (backstop 30 s). Mutation seen failing:
/// `on_due` setting the next re-read 1 s after a missed remint instead of `retry` (5 reads in
/// the window, against at most 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_remint_reads_the_store_once_per_retry_not_once_per_second() {
    let mesh = Mesh::demo().await.expect("mesh");
    let space = mesh.space().clone();
    let material = SpaceMaterial::mint(&mesh.authority, &space).expect("material");
    let short = mesh
        .mint(
            &space,
            &Profile::Delivery,
            MintOptions::new()
                .renewal_of(&material.delivery)
                .expires_in(LIFETIME),
        )
        .expect("mint");
    let store = Arc::new(MemoryStore::new("mem:retry"));
    let key = delivery_creds_key(&space);
    store.put(&key, &short.to_creds_text()).expect("put");
    store
        .put(
            &observer_key(&space),
            &material.membership_observer.to_creds_text(),
        )
        .expect("put");
    if let Some(e) = &material.connection_evictor {
        store
            .put(&evictor_key(&space), &e.to_creds_text())
            .expect("put");
    }
    let state = tempfile::tempdir().expect("state");
    let mut inputs = HostedContextInputs::new(
        material.account_id.clone(),
        "retry000000000000000000000000000",
        space.clone(),
        mesh.url(),
        store.clone() as Arc<dyn SecretStore>,
        StoreIdentity::Injected {
            coordinate: "mem:retry".into(),
        },
        state.path(),
    );
    inputs.tuning.health = HealthConfig::new(30_000, 30_000).expect("health");
    inputs.tuning.remint_retry = RETRY;
    let service = tokio::time::timeout(BOUND, start_delivery_service(inputs))
        .await
        .expect("start within the bound")
        .expect("the service starts");

    let claims = short.claims().expect("claims");
    let exp = claims.exp.expect("exp");
    let due_ms = (claims.iat + (exp - claims.iat) * 3 / 4) as u64 * 1000;
    let lead = LEAD.as_millis() as u64;
    assert!(
        unix_ms() + lead < due_ms,
        "the service took until past the 75 % point to start"
    );
    sleep_until_unix_ms(due_ms - lead).await;
    let before = store.reads_of(&key);
    sleep_until_unix_ms(due_ms - lead + WINDOW.as_millis() as u64).await;
    let reads = store.reads_of(&key) - before;
    println!(
        "MEASURED delivery credential reads in {} ms from the 75 % point (retry {} ms): {reads}",
        WINDOW.as_millis(),
        RETRY.as_millis()
    );
    let log = std::fs::read_to_string(service.log_path()).unwrap_or_default();
    let most = WINDOW.as_millis() / RETRY.as_millis() + 1;
    assert!(
        (2..=most as u64).contains(&reads),
        "{reads} reads, expected 2..={most}:\n{log}"
    );
    assert!(
        log.contains("still holds the previous cred"),
        "the missed remint was reported:\n{log}"
    );
    // Not closed by the missed remint, nor by the expiry within the window.
    assert!(
        tokio::time::timeout(Duration::from_millis(10), service.closed())
            .await
            .is_err(),
        "{log}"
    );
    // Its connection is down on the expired credential: not worth the release's redial wait.
    let _ = tokio::time::timeout(Duration::from_secs(1), service.close()).await;
}
