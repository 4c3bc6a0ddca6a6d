//! The `ctl.delivery-admin` rail itself: its requests answered one at a time in arrival order,
//! and a verb it does not serve refused. The daemon dials through the harness proxy, so one
//! request can be pinned in flight at the broker while others arrive behind it.

use std::time::Duration;

use crate::support::admin as a;
use crate::support::data_path as s;
use cotal_delivery::wire::MEMBERSHIP_OBSERVER_INBOX_PREFIX;
use delivery_harness::daemon::{Daemon, DaemonSpec};
use delivery_harness::manager::{Manager, Outcome};
use delivery_harness::TcpProxy;
use serde_json::json;
use tokio::time::Instant;

/// The daemon (test windows, short `$SYS` settle) dialing through `proxy`, up.
async fn start_via(mesh: &delivery_harness::mesh::Mesh, proxy: &TcpProxy) -> Daemon {
    let mut d = DaemonSpec::deliver(mesh.space().as_str(), mesh.root())
        .server(&proxy.url())
        .env("COTAL_DELIVERY_NAK_DELAY_MS", s::NAK_DELAY_MS)
        .env("COTAL_DELIVERY_ACK_WAIT_MS", s::ACK_WAIT_MS)
        .env("COTAL_DELIVERY_SWEEP_SETTLE_MS", a::SWEEP_SETTLE_MS)
        .spawn()
        .expect("spawn daemon");
    d.wait_for_line("delivery daemon up", s::UP_BOUND)
        .await
        .expect("daemon up");
    d
}

/// One request, with the instant its outcome reached the test.
async fn timed(m: &Manager, op: &str, args: serde_json::Value) -> (Outcome, Instant) {
    let o = m.request_once(op, &args, s::UP_BOUND).await;
    (o, Instant::now())
}

/// Waits until `m` has sent `n` requests (each is published right after it is counted, on the
/// manager's one connection, so the broker sees them in that order).
async fn sent(m: &Manager, n: usize) {
    s::eventually("the request is sent", s::UP_BOUND, || async {
        m.sent().len() >= n
    })
    .await;
}

/// Three admin requests: A, a `principalLiveness` whose `$SYS` CONNZ request the proxy holds at
/// the broker, then B (`reloadStoreIdentity`) and C (an unknown verb), which need no broker
/// round trip at all. While A is held neither B nor C is answered; once A's CONNZ is released
/// the answers reach the test as A, B, C: B's handling starts only after A's reply, C's after
/// B's. The hold names the rail sweep's own reply inbox, so the membership feed's CONNZ sweep
/// (same subject, its own connection) can never be the request held. Mutation seen failing:
/// the rail's dispatch spawning every admin request beside the queue (as it does inventories):
/// B and C are answered at once while A is still held. With the hold armed on the CONNZ subject
/// instead and A sent 380 ms after the manager connected, the feed's sweep was held in 3 of 3
/// runs and the test failed the same way with the daemon's order intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_requests_are_answered_one_at_a_time_in_arrival_order() {
    let mesh = s::mesh().await;
    let proxy = TcpProxy::start(mesh.broker.port()).await.expect("proxy");
    let mut d = start_via(&mesh, &proxy).await;
    let m = a::manager(&mesh).await;
    // A's sweep opens its own observer connection through the proxy and subscribes its reply
    // inbox just before it sends the CONNZ request. The hold names that inbox, not the CONNZ
    // subject: the membership feed sends the same subject on its own observer connection
    // (every interval, and 400 ms after the manager's connect event), and a hold armed on the
    // subject alone caught the feed's sweep instead whenever it came first, leaving A free.
    proxy.hold_from(format!("{MEMBERSHIP_OBSERVER_INBOX_PREFIX}.evict.").as_bytes());
    let first = timed(&m, "principalLiveness", json!({"principal": "local.ghost"}));
    let rest = async {
        proxy
            .wait_held(".CONNZ", s::UP_BOUND)
            .await
            .expect("A's sweep is held at the broker");
        let second = timed(&m, "reloadStoreIdentity", json!({}));
        let third = async {
            sent(&m, 2).await;
            timed(&m, "noSuchVerb", json!({})).await
        };
        let behind = async {
            let both = futures::future::join(second, third);
            tokio::pin!(both);
            // Watched for a while with A held: nothing behind it may be answered.
            let early = tokio::time::timeout(s::QUIET, &mut both).await;
            assert!(early.is_err(), "answered while A was held: {early:?}");
            sent(&m, 3).await;
            let released = Instant::now();
            proxy.release();
            let (b, c) = both.await;
            (released, b, c)
        };
        behind.await
    };
    let ((oa, ta), (released, (ob, tb), (oc, tc))) = tokio::join!(first, rest);
    println!(
        "MEASURED after the release: A answered at {} ms, B at {} ms, C at {} ms",
        (ta - released).as_millis(),
        (tb - released).as_millis(),
        (tc - released).as_millis()
    );
    assert!(matches!(oa, Outcome::Answered(_)), "A answered: {oa:?}");
    assert!(matches!(ob, Outcome::Answered(_)), "B answered: {ob:?}");
    assert!(matches!(oc, Outcome::Refused(_)), "C refused: {oc:?}");
    assert!(ta >= released && ta <= tb && tb <= tc, "in arrival order");
    s::stop_daemon(&mut d).await;
}

/// A verb this daemon does not serve is refused at once with the reference's words, never left
/// to the caller's timeout, and the daemon goes on serving (the next request is answered). This
/// is how a manager's restart meets a daemon that predates `evictPrincipals`.
/// Mutation seen failing: the unknown-verb arm of the admin dispatch answering `ok` with no
/// data (the outcome is `Answered(null)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verb_the_daemon_does_not_serve_is_refused() {
    let mesh = s::mesh().await;
    let mut d = a::start_daemon(&mesh).await;
    let m = a::manager(&mesh).await;
    let started = Instant::now();
    let o = m
        .request_once("evictPrincipalsV2", &json!({"principals": []}), s::UP_BOUND)
        .await;
    let took = started.elapsed();
    assert_eq!(
        a::refused(o),
        "op \"evictPrincipalsV2\" not supported on the delivery admin service"
    );
    assert!(took < Duration::from_secs(5), "answered at once: {took:?}");
    a::answered(
        m.request_once("reloadStoreIdentity", &json!({}), s::UP_BOUND)
            .await,
    );
    assert!(d.is_running());
    s::stop_daemon(&mut d).await;
}
