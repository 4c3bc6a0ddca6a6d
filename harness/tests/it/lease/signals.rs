//! Signals at the edges of the lease, where a script cannot place them: SIGTERM after the lease
//! row was created but before it was marked ready. The test watches the row from the broker,
//! freezes the daemon the moment the `ready:false` row appears, proves from the broker that the
//! daemon is frozen inside that window (the row is still not ready), and only then signals it.

use std::time::Duration;

use crate::support::BOUND;
use async_nats::jetstream::kv::Operation;
use cotal_delivery::base;
use cotal_delivery::wire::LeaseInfo;
use cotal_delivery::wire::{CtlService, SpaceNames, LEASE_KEY};
use delivery_harness::rig::mesh::Mesh;
use futures::{StreamExt, TryStreamExt};

/// Attempts at catching the daemon inside the create→ready window; each is conclusive or not.
const ATTEMPTS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_between_create_and_ready_releases_the_row_for_a_clean_successor() {
    let mesh = Mesh::demo().await.expect("mesh");
    let space = mesh.space().clone();
    let insp = mesh.inspector(&space).await.expect("inspector");
    let kv = insp
        .js
        .get_key_value(insp.names().delivery_bucket())
        .await
        .expect("lease bucket");

    let mut caught = None;
    for attempt in 1..=ATTEMPTS {
        let mut watch = kv.watch(LEASE_KEY).await.expect("watch");
        let mut d = mesh.deliver(&space).spawn().expect("spawn");
        // The first row the daemon writes is its claim, `ready:false`.
        let entry = tokio::time::timeout(BOUND, async {
            loop {
                match watch.next().await {
                    Some(Ok(e)) if e.operation == Operation::Put => return e,
                    Some(_) => continue,
                    None => panic!("watch ended"),
                }
            }
        })
        .await
        .expect("the claim appears");
        d.freeze().expect("freeze");
        let claim: LeaseInfo = serde_json::from_slice(&entry.value).expect("lease row");
        assert!(!claim.ready, "a claim is written not ready");
        let row = insp.lease().await.expect("read").expect("row present");
        let inside = !row.info.ready;
        d.terminate().expect("SIGTERM");
        d.thaw().expect("thaw");
        let status = d.wait_exit(BOUND).await.expect("exits");
        assert_eq!(status.code(), Some(0), "{}", d.transcript());
        // Whatever the interleaving, a signalled daemon leaves no row and no record behind.
        assert!(insp.lease().await.expect("read").is_none(), "row released");
        assert!(
            !base::pid_path(mesh.root(), &space).exists(),
            "record removed"
        );
        if inside && !d.has_line("delivery daemon up") {
            eprintln!("caught inside the create→ready window on attempt {attempt}");
            caught = Some(d);
            break;
        }
        eprintln!("attempt {attempt}: the daemon passed the window before the freeze; again");
    }
    let d = caught.unwrap_or_else(|| {
        panic!("never caught the daemon inside the window in {ATTEMPTS} attempts")
    });
    snapshot!(
        "lease_signals__sigterm_between_create_and_ready",
        d.transcript(),
        &[(mesh.root(), "[ROOT]")]
    );

    // A successor starts cleanly: no "a live lease already exists".
    let mut b = crate::support::start(mesh.deliver(&space)).await;
    assert!(!b.has_line("a live lease already exists"));
    b.terminate().expect("SIGTERM");
    assert_eq!(b.wait_exit(BOUND).await.expect("exit").code(), Some(0));
}

/// A signal that arrives while the claim is on its way never abandons it: the daemon waits for
/// the broker's answer and releases a claim that won. The daemon dials through a proxy that holds
/// its outgoing bytes from the claim's create (`HPUB $KV.<bucket>.lease.0`) on, so the claim is
/// proved in flight when SIGTERM lands. The daemon writes its signal line while the claim is
/// still held (the line comes before the release: it is written when the signal lands), is seen
/// still running (waiting) for a quiet spell, then the hold is released. The broker then shows the
/// claim written and deleted (the release), and the daemon exits as signalled, with the signal line
/// written once.
/// Mutations caught: the claim raced against the stop signal in `space/daemon.rs` (the daemon
/// exits during the hold and the lease stream never sees the create); the signal line written
/// only after the claim answered (as before this change: the line is not seen while the claim is
/// held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_during_the_claim_waits_for_the_answer_and_releases_a_claim_that_won() {
    let (mesh, space, insp, proxy, mut d) = daemon_behind_a_proxy(|names| {
        Some(format!("HPUB $KV.{}.{LEASE_KEY} ", names.delivery_bucket()))
    })
    .await;
    let claim = format!("HPUB $KV.{}.{LEASE_KEY} ", insp.names().delivery_bucket());
    proxy
        .wait_held(&claim, BOUND)
        .await
        .expect("the claim left the daemon");
    assert!(
        insp.lease().await.expect("read").is_none(),
        "not yet written"
    );
    d.terminate().expect("SIGTERM");
    // The signal line is written while the claim is still held.
    d.wait_for_line("received SIGTERM, exiting", BOUND)
        .await
        .expect("the signal line while the claim is in flight");
    assert!(
        insp.lease().await.expect("read").is_none(),
        "the claim is still held"
    );
    // Held claim: the daemon waits for its answer instead of exiting on the signal.
    assert!(
        d.wait_exit(HELD_QUIET).await.is_err(),
        "exited with its claim in flight: {}",
        d.transcript()
    );
    proxy.release();
    let status = d.wait_exit(BOUND).await.expect("exits");
    assert_eq!(status.code(), Some(0), "{}", d.transcript());
    assert_eq!(
        d.transcript().matches("received SIGTERM, exiting").count(),
        1,
        "{}",
        d.transcript()
    );
    assert!(!d.has_line("delivery daemon up"), "{}", d.transcript());
    assert!(
        insp.lease().await.expect("read").is_none(),
        "no orphan claim: {}",
        d.transcript()
    );
    // The broker saw the claim win and then its release: the key's last record is a delete
    // marker that follows the create.
    let stream = insp
        .js
        .get_stream(SpaceNames::kv_stream(&insp.names().delivery_bucket()))
        .await
        .expect("lease stream");
    let last = stream
        .get_last_raw_message_by_subject(&format!(
            "$KV.{}.{LEASE_KEY}",
            insp.names().delivery_bucket()
        ))
        .await
        .expect("the key has records");
    let op = last
        .headers
        .get("KV-Operation")
        .map(|v| v.as_str().to_string());
    assert_eq!(op.as_deref(), Some("DEL"), "released by a delete marker");
    assert!(last.sequence >= 2, "the delete follows the create");
    assert!(!base::pid_path(mesh.root(), &space).exists());
}

/// Readiness is marked only after every binding: the proxy holds the daemon's bytes from the
/// last binding of the plane on (the admin rail's SUB; fan-out, reader and the delivery rail are
/// bound before it), and while they are held the broker shows the claimed row still
/// `ready:false` and the daemon has not said it is up. Released, the row turns ready. Mutation
/// caught: `mark_ready` moved before `keeper.plane.arm()` in `space/daemon.rs` (the row is
/// already ready while the admin rail's binding is held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_turns_ready_only_after_the_last_binding() {
    let (_mesh, _space, insp, proxy, mut d) = daemon_behind_a_proxy(|names| {
        Some(format!(
            "SUB {} ",
            names.ctl_serve(CtlService::DeliveryAdmin)
        ))
    })
    .await;
    let admin_sub = format!("SUB {} ", insp.names().ctl_serve(CtlService::DeliveryAdmin));
    proxy
        .wait_held(&admin_sub, BOUND)
        .await
        .expect("the daemon reached its last binding");
    let row = insp.lease().await.expect("read").expect("claimed");
    assert!(!row.info.ready, "ready before the last binding: {row:?}");
    assert!(!d.has_line("delivery daemon up"), "{}", d.transcript());
    proxy.release();
    d.wait_for_line("delivery daemon up", BOUND)
        .await
        .expect("up once bound");
    delivery_harness::wait_until(
        BOUND,
        Duration::from_millis(20),
        "the row ready",
        || async {
            insp.lease()
                .await
                .ok()
                .flatten()
                .filter(|r| r.info.ready)
                .map(|_| ())
        },
    )
    .await
    .expect("ready after the bindings");
    d.terminate().expect("SIGTERM");
    assert_eq!(d.wait_exit(BOUND).await.expect("exit").code(), Some(0));
}

/// How long a daemon with its claim held is watched for not exiting.
const HELD_QUIET: Duration = Duration::from_millis(1_000);

/// A signal that arrives while the connection is redialing still ends in a release once the
/// redial completes, never in a row left to the TTL. The proxy drops the daemon's connection
/// and holds its redial; the daemon is signalled; the proxy lets the redial through. (The daemon
/// waits up to 5 s from the drop before sending the release; async-nats would also queue a
/// request across the redial, so this outcome does not single out that wait.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_during_a_redial_waits_for_it_and_then_releases() {
    // The mesh stays bound: dropping it stops the broker.
    let (_mesh, _space, insp, proxy, mut d) = daemon_behind_a_proxy(|_| None).await;
    d.wait_for_line("delivery daemon up", BOUND)
        .await
        .expect("serving");
    assert!(insp.lease().await.expect("read").is_some());
    // The watch subscribes, then creates its consumer: the consumer exists and is `push_bound`
    // on the broker before the create's answer reaches the daemon, and a cut between the two
    // fails the start-up (CI saw "the lease watch could not be bound (timed out)" and exit 1,
    // once with the consumer already bound). Start-up is complete once the companions started
    // after the watch are up (`timer writer up`), as in lease::release.
    let lease_stream = SpaceNames::kv_stream(&insp.names().delivery_bucket());
    delivery_harness::wait_until(
        BOUND,
        Duration::from_millis(50),
        "the lease watch consumer bound",
        || async {
            let stream = insp.js.get_stream_no_info(&lease_stream).await.ok()?;
            let infos: Vec<_> = stream.consumers().try_collect().await.ok()?;
            infos
                .iter()
                .any(|i| i.name.starts_with("leasewatch_") && i.push_bound)
                .then_some(())
        },
    )
    .await
    .expect("the lease watch consumer");
    d.wait_for_line("timer writer up", BOUND)
        .await
        .expect("start-up complete");
    proxy.blackhole_new();
    proxy.cut_established();
    d.wait_for_line("broker connection unavailable, reconnecting", BOUND)
        .await
        .expect("the drop is seen");
    d.terminate().expect("SIGTERM");
    proxy.heal();
    let status = d.wait_exit(BOUND).await.expect("exits");
    assert_eq!(status.code(), Some(0), "{}", d.transcript());
    assert!(
        insp.lease().await.expect("read").is_none(),
        "released after the redial, not left to the TTL: {}",
        d.transcript()
    );
}

/// A mesh and its inspector, and a daemon that dials the broker through a proxy the test holds;
/// the proxy's hold is armed, before the daemon dials, on the pattern `hold` gives (if any).
async fn daemon_behind_a_proxy(
    hold: impl FnOnce(&SpaceNames) -> Option<String>,
) -> (
    Mesh,
    cotal_delivery::wire::Space,
    delivery_harness::rig::mesh::Inspector,
    delivery_harness::TcpProxy,
    delivery_harness::rig::daemon::Daemon,
) {
    let mesh = Mesh::demo().await.expect("mesh");
    let space = mesh.space().clone();
    let insp = mesh.inspector(&space).await.expect("inspector");
    let proxy = delivery_harness::TcpProxy::start(mesh.broker.port())
        .await
        .expect("proxy");
    if let Some(pattern) = hold(insp.names()) {
        proxy.hold_from(pattern.as_bytes());
    }
    let d = delivery_harness::rig::daemon::DaemonSpec::deliver(space.as_str(), mesh.root())
        .server(&proxy.url())
        .spawn()
        .expect("spawn");
    (mesh, space, insp, proxy, d)
}
