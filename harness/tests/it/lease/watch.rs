//! The lease watch's consumer over its life, read from the broker: its inactivity threshold,
//! its retirement before a manual reconnect of the live connection (the move onto an adopted
//! credential) and its rebind after it, and a bind in flight when that reconnect or the stop is
//! asked for.
//! The broker's consumer advisories (`CREATED`/`DELETED`, with their timestamps) and its
//! `/connz` of closed connections (their `stop`) give the order of what happened.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::data_path::{start_daemon_via_proxy, wait_lease_watch_bound, UP_BOUND};
use crate::support::health::Supervisor;
use crate::support::{rfc3339_us, BOUND};
use cotal_delivery::base::{read_creds_file, write_creds_file_atomic, Credential};
use cotal_delivery::provision::{MintOptions, Profile};
use cotal_delivery::wire::{LeaseInfo, SpaceNames};
use delivery_harness::rig::daemon::Daemon;
use delivery_harness::rig::mesh::{Inspector, Mesh};
use delivery_harness::ConnState;
use futures::StreamExt;
use serde_json::json;

/// The watch consumer's inactivity threshold (docs/operations.md).
const FIVE_MINUTES: Duration = Duration::from_secs(5 * 60);
const NO_DELETE_WARNING: &str = "could not delete the lease watch consumer";
/// A bind whose answer is lost ends the daemon's JetStream request bound (5 s) after its create
/// was sent. Bound again at once, the next consumer is created just after that; after the
/// watch's rebind retry (5 s more, `space/lease_watch.rs`) it would be 10 s after. This bound,
/// counted from when the create was seen held, lies between the two.
const AT_ONCE_BEFORE: Duration = Duration::from_millis(7_500);

/// The wall clock in µs since the epoch (the broker's advisories are stamped on the same clock).
fn unix_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// A mesh and its daemon, serving with its lease watch bound.
async fn serving() -> (Mesh, Inspector, Daemon) {
    let mesh = Mesh::demo().await.expect("mesh");
    let insp = mesh.inspector(mesh.space()).await.expect("inspector");
    let d = crate::support::start(mesh.deliver(mesh.space())).await;
    wait_lease_watch_bound(&insp).await;
    (mesh, insp, d)
}

/// The lease watch consumers on the lease bucket's stream, by name.
async fn watch_consumers(insp: &Inspector) -> Vec<async_nats::jetstream::consumer::Info> {
    let stream = SpaceNames::kv_stream(&insp.names.delivery_bucket());
    let s = insp.js.get_stream(&stream).await.expect("lease stream");
    let mut infos: Vec<_> = s
        .consumers()
        .filter_map(|i| async move { i.ok() })
        .filter(|i| std::future::ready(i.name.starts_with("leasewatch_")))
        .collect()
        .await;
    infos.sort_by(|a, b| a.name.cmp(&b.name));
    infos
}

/// Waits until the only watch consumer is `name` and the broker sees its subscriber.
async fn only_watch(insp: &Inspector, name: &str) {
    crate::support::data_path::eventually(&format!("{name} alone, bound"), UP_BOUND, || async {
        let infos = watch_consumers(insp).await;
        infos.len() == 1 && infos[0].name == name && infos[0].push_bound
    })
    .await;
}

/// The incarnation of the serving daemon, from its lease row.
async fn incarnation(insp: &Inspector) -> String {
    insp.lease()
        .await
        .expect("read")
        .expect("a row")
        .info
        .incarnation
}

/// The broker's consumer advisories on the lease stream as they arrive:
/// `(action, consumer, broker timestamp in µs)`.
#[derive(Clone, Default)]
struct Advisories(Arc<Mutex<Vec<(String, String, i64)>>>);

impl Advisories {
    async fn record(insp: &Inspector) -> Advisories {
        let stream = SpaceNames::kv_stream(&insp.names.delivery_bucket());
        let mut sub = insp
            .client
            .subscribe(format!("$JS.EVENT.ADVISORY.CONSUMER.*.{stream}.*"))
            .await
            .expect("advisories");
        insp.client.flush().await.expect("flush");
        let seen = Advisories::default();
        let into = seen.clone();
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let kind = msg
                    .subject
                    .split('.')
                    .nth(4)
                    .unwrap_or_default()
                    .to_string();
                let v: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap_or_default();
                let at = v["timestamp"].as_str().and_then(rfc3339_us).unwrap_or(0);
                let consumer = v["consumer"].as_str().unwrap_or_default().to_string();
                into.0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((kind, consumer, at));
            }
        });
        seen
    }
    /// When the broker announced `kind` (`CREATED`, `DELETED`) of `consumer`; waits for it.
    async fn at(&self, kind: &str, consumer: &str) -> i64 {
        crate::support::data_path::eventually(
            &format!("{kind} {consumer} announced"),
            UP_BOUND,
            || async { self.find(kind, consumer).is_some() },
        )
        .await;
        self.find(kind, consumer).unwrap_or_default()
    }
    fn find(&self, kind: &str, consumer: &str) -> Option<i64> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(k, c, _)| k == kind && c == consumer)
            .map(|(_, _, at)| *at)
    }
    fn all(&self) -> Vec<(String, String, i64)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// When the broker closed the daemon's one replaced resident connection (`/connz` `stop`, µs).
async fn replaced_connection_stop(mesh: &Mesh) -> i64 {
    let closed = mesh
        .broker
        .connz_named(ConnState::Closed, "cotal:delivery")
        .await
        .expect("/connz closed");
    assert_eq!(closed.len(), 1, "one replaced connection: {closed:?}");
    let stop = closed[0].raw["stop"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    rfc3339_us(&stop).unwrap_or_else(|| panic!("unreadable stop {stop:?}"))
}

/// A daemon dialing through the proxy whose watch is binding again after a cut, with that
/// rebind's create (`leasewatch_<inc>_1`) held at the proxy; the broker's advisories recorded
/// from before the cut.
struct HeldRebind {
    mesh: Mesh,
    insp: Inspector,
    proxy: delivery_harness::TcpProxy,
    d: Daemon,
    advisories: Advisories,
    /// `leasewatch_<inc>`, `leasewatch_<inc>_1` (held), `leasewatch_<inc>_2`.
    names: [String; 3],
    /// When the test saw the create held (µs since the epoch, the broker's clock).
    held_at: i64,
}

async fn a_rebind_held() -> HeldRebind {
    let mesh = Mesh::demo().await.expect("mesh");
    let insp = mesh.inspector(mesh.space()).await.expect("inspector");
    let (proxy, d) = start_daemon_via_proxy(&mesh).await;
    let inc = incarnation(&insp).await;
    let names = [
        format!("leasewatch_{inc}"),
        format!("leasewatch_{inc}_1"),
        format!("leasewatch_{inc}_2"),
    ];
    let advisories = Advisories::record(&insp).await;
    let stream = SpaceNames::kv_stream(&insp.names.delivery_bucket());
    let create = format!("$JS.API.CONSUMER.CREATE.{stream}.{}", names[1]);
    proxy.hold_from(create.as_bytes());
    proxy.cut_established();
    proxy
        .wait_held(&create, BOUND)
        .await
        .expect("the rebind's create is held");
    let held_at = unix_us();
    HeldRebind {
        mesh,
        insp,
        proxy,
        d,
        advisories,
        names,
        held_at,
    }
}

/// When the broker closed the last of the daemon's resident connections (`/connz` `stop`, µs).
async fn last_connection_stop(mesh: &Mesh) -> i64 {
    let closed = mesh
        .broker
        .connz_named(ConnState::Closed, "cotal:delivery")
        .await
        .expect("/connz closed");
    closed
        .iter()
        .filter_map(|c| c.raw["stop"].as_str().and_then(rfc3339_us))
        .max()
        .expect("a closed connection of the daemon")
}

/// The renewal owner's remint of the daemon's delivery credential (same nkey), written to the
/// workspace store; returns the `reloadCreds` args that expect it.
fn remint(mesh: &Mesh) -> serde_json::Value {
    let path = mesh.workspace().delivery_creds_path(mesh.space());
    let live: Credential = read_creds_file(&path).expect("read creds");
    let next = mesh
        .mint(
            mesh.space(),
            &Profile::Delivery,
            MintOptions::new()
                .renewal_of(&live)
                .expires_in(Duration::from_secs(25 * 3600)),
        )
        .expect("mint");
    write_creds_file_atomic(&path, &next).expect("write creds");
    json!({"expected": {"delivery": next.fingerprint()}})
}

/// An operator rewrites the lease row to another holder: the daemon's (current) watch sees it
/// and the daemon leaves the lease to that holder (exit 6).
async fn the_watch_still_sees_the_key(insp: &Inspector, d: &mut Daemon) {
    let rival = LeaseInfo {
        holder: "local.UOPERATORREWROTE".into(),
        since: 1,
        ready: true,
        incarnation: "rival".into(),
    };
    insp.put_lease(&rival).await.expect("operator rewrite");
    let status = d.wait_exit(BOUND).await.expect("exits");
    assert_eq!(status.code(), Some(6), "{}", d.transcript());
    assert!(
        d.has_line("a lease watch event read the key as held by local.UOPERATORREWROTE"),
        "{}",
        d.transcript()
    );
}

/// The watch consumer is the daemon's own push consumer with the broker's inactivity threshold
/// at five minutes, so a daemon whose connection closed before it could delete the consumer (a
/// SIGKILL) leaves it to the broker for that long: after the kill it is still there, unbound,
/// with that threshold. Mutation seen failing: the threshold left out of the consumer's config
/// (the broker then gives the consumer 5 s; async-nats's ordered consumer, used before, fixed
/// it at 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_reclaims_a_watch_left_by_a_closed_connection_after_five_minutes() {
    let (_mesh, insp, mut d) = serving().await;
    let name = format!("leasewatch_{}", incarnation(&insp).await);
    let infos = watch_consumers(&insp).await;
    assert_eq!(infos.len(), 1, "{infos:?}");
    assert_eq!(infos[0].name, name);
    assert_eq!(
        infos[0].config.inactive_threshold, FIVE_MINUTES,
        "{infos:?}"
    );
    d.kill().expect("SIGKILL");
    let _ = d.wait_exit(BOUND).await;
    crate::support::data_path::eventually("the subscriber gone", UP_BOUND, || async {
        watch_consumers(&insp)
            .await
            .iter()
            .any(|i| i.name == name && !i.push_bound)
    })
    .await;
    let left = watch_consumers(&insp).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].config.inactive_threshold, FIVE_MINUTES);
}

/// A `reloadCreds` adoption reconnects the live connection onto the new credential. The watch
/// is retired first: the broker deletes `leasewatch_<inc>` before it closes the replaced
/// connection, and the watch binds `leasewatch_<inc>_1` on the new one, after it. That watch is
/// the one in use (an operator's rewrite then ends the daemon through it), and no delete ever
/// failed. Mutation seen failing: the reconnect not retiring the watch (`before_reconnect`
/// skipped in `ReconnectGate::schedule`): the old consumer is deleted only on the new
/// connection, after the old one closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_reconnect_retires_the_watch_before_closing_the_connection_and_rebinds() {
    let (mesh, insp, mut d) = serving().await;
    let inc = incarnation(&insp).await;
    let advisories = Advisories::record(&insp).await;
    let boss = Supervisor::connect(&mesh, mesh.space()).await;
    let reply = boss
        .request("reloadCreds", remint(&mesh), Duration::from_secs(15))
        .await
        .expect("answered");
    assert_eq!(reply["ok"], true, "{reply}");
    d.wait_for_line("broker connection restored", BOUND)
        .await
        .expect("reconnected");
    let (old, new) = (format!("leasewatch_{inc}"), format!("leasewatch_{inc}_1"));
    only_watch(&insp, &new).await;
    let deleted = advisories.at("DELETED", &old).await;
    let created = advisories.at("CREATED", &new).await;
    let stop = replaced_connection_stop(&mesh).await;
    println!(
        "MEASURED old watch deleted {} µs before its connection closed; new one created {} µs after",
        stop - deleted,
        created - stop
    );
    assert!(deleted <= stop, "{:?}, stop {stop}", advisories.all());
    assert!(stop <= created, "{:?}, stop {stop}", advisories.all());
    the_watch_still_sees_the_key(&insp, &mut d).await;
    assert!(!d.has_line(NO_DELETE_WARNING), "{}", d.transcript());
}

/// A manual reconnect waits for a bind in flight and its cleanup. The daemon dials through the
/// proxy; a cut makes it redial, so the watch binds again (`leasewatch_<inc>_1`), and the proxy
/// holds that bind's create. A SIGHUP then makes the daemon adopt a renewed credential (no
/// reply to wait for), so its reconnect asks the watch to retire while the create is held. The
/// hold is released a second later: the create reaches the broker, and since a retirement was
/// asked for meanwhile the watch deletes that consumer instead of installing it, on the
/// connection still up; only then is the connection replaced, and the watch binds
/// `leasewatch_<inc>_2` on the new one. Mutation seen failing: `before_reconnect` not waiting
/// for the watch's answer (the reconnect closes the held connection at once; the create is
/// never created).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_reconnect_waits_for_a_bind_in_flight_and_deletes_what_it_bound() {
    let HeldRebind {
        mesh,
        insp,
        proxy,
        mut d,
        advisories,
        names: [first, held, last],
        ..
    } = a_rebind_held().await;
    let _ = remint(&mesh);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .expect("SIGHUP");
    d.wait_for_line("adopted the renewed credential", BOUND)
        .await
        .expect("adopted on SIGHUP");
    // The reconnect is waiting for the watch: the held connection is still the daemon's.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(advisories.find("CREATED", &held).is_none());
    proxy.release();
    d.wait_for_line("broker connection restored", BOUND)
        .await
        .expect("reconnected");
    only_watch(&insp, &last).await;
    let created = advisories.at("CREATED", &held).await;
    let deleted = advisories.at("DELETED", &held).await;
    let recreated = advisories.at("CREATED", &last).await;
    // The replaced connections: the one the proxy cut, then the held one; the latter's stop.
    let stop = last_connection_stop(&mesh).await;
    println!(
        "MEASURED held bind created -> deleted {} µs; deleted -> its connection closed {} µs",
        deleted - created,
        stop - deleted
    );
    assert!(
        created <= deleted && deleted <= stop && stop <= recreated,
        "{:?}, stop {stop}",
        advisories.all()
    );
    assert!(
        advisories.find("DELETED", &first).is_some(),
        "{:?}",
        advisories.all()
    );
    the_watch_still_sees_the_key(&insp, &mut d).await;
    assert!(!d.has_line(NO_DELETE_WARNING), "{}", d.transcript());
}

/// The endpoint's stop waits for a bind in flight and its cleanup before the connection closes.
/// The daemon dials through the proxy; a cut makes it redial, so the watch binds again
/// (`leasewatch_<inc>_1`), and the proxy holds that bind's create. SIGTERM then asks the watch
/// to retire while the create is held: for a second nothing is created and the daemon is still
/// running. Released, the create reaches the broker, and the watch deletes that consumer
/// instead of installing it (it is deleted before `leasewatch_<inc>`, which it would otherwise
/// have replaced first: the proof that the stop was asked while the bind was in flight), then
/// the installed one, both on the connection still up; only then is the lease released and the
/// connection closed. Exit 0, no watch consumer left, no warning. Mutations seen failing:
/// `LeaseWatch::retire` not waiting for the watch's answer (the watch dropped at once, its task
/// ended: `leasewatch_<inc>_1` is created and never deleted); `Watcher::rebind` not reading a
/// retirement while its bind is in flight (the bind installs `_1` and deletes `leasewatch_<inc>`
/// first: the deletes' order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stop_waits_for_a_bind_in_flight_and_deletes_what_it_bound() {
    let HeldRebind {
        mesh,
        insp,
        proxy,
        mut d,
        advisories,
        names: [first, held, _],
        ..
    } = a_rebind_held().await;
    d.terminate().expect("SIGTERM");
    // The stop is waiting for the watch: the daemon runs on, nothing created yet.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(d.is_running(), "{}", d.transcript());
    assert!(advisories.find("CREATED", &held).is_none());
    proxy.release();
    let status = d.wait_exit(BOUND).await.expect("exits");
    assert_eq!(status.code(), Some(0), "{}", d.transcript());
    let created = advisories.at("CREATED", &held).await;
    let deleted = advisories.at("DELETED", &held).await;
    let deleted_first = advisories.at("DELETED", &first).await;
    let stop = last_connection_stop(&mesh).await;
    println!(
        "MEASURED held bind created -> deleted {} µs; the last delete -> the connection closed {} µs",
        deleted - created,
        stop - deleted_first
    );
    assert!(
        created <= deleted && deleted <= deleted_first && deleted_first <= stop,
        "{:?}, stop {stop}",
        advisories.all()
    );
    assert!(watch_consumers(&insp).await.is_empty());
    assert!(insp.lease().await.expect("read").is_none(), "released");
    assert!(!d.has_line(NO_DELETE_WARNING), "{}", d.transcript());
}

/// Replacement during binding: a cut makes the watch bind again (`leasewatch_<inc>_1`) and the
/// proxy holds that bind's create; a second cut then replaces the connection the bind is on, so
/// the create never reaches the broker and its answer never comes. The bind ends with its
/// connection replaced: the watch asks the broker to delete the name in case it landed (it did
/// not, so nothing is said), and binds again on the new connection (`leasewatch_<inc>_2`, from
/// the key's last row), deleting `leasewatch_<inc>`, as soon as that bind ended (its 5 s
/// request bound), not a rebind retry later. That watch is the one in use, and no warning is
/// written. Mutations seen failing: the bind's lost answer treated like a failed delete of an
/// installed consumer (`Absent::Failure` for it: a warning that `leasewatch_<inc>_1` could not
/// be deleted, "consumer not found", although it never existed); `Watcher::next_retry` as it
/// was, a bind again only when no consumer is installed (the bind read the new connection's
/// `Connected` itself, so `_2` is never bound and `leasewatch_<inc>` stays); `next_retry`
/// without its at-once arm (`_2` bound a rebind retry later, 9993 ms after the held create).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_whose_connection_is_replaced_binds_again_on_the_new_one() {
    let HeldRebind {
        mesh: _mesh,
        insp,
        proxy,
        mut d,
        advisories,
        names: [first, held, last],
        held_at,
    } = a_rebind_held().await;
    // The held create goes with the connection it was written on (never released: a release
    // racing the cut could still hand it to the broker).
    proxy.cut_established();
    only_watch(&insp, &last).await;
    let deleted = advisories.at("DELETED", &first).await;
    let created = advisories.at("CREATED", &last).await;
    println!(
        "MEASURED {last} created {} ms after the held create, {} µs before {first} was deleted",
        (created - held_at) / 1000,
        deleted - created
    );
    assert!(created <= deleted, "{:?}", advisories.all());
    assert!(
        created - held_at < AT_ONCE_BEFORE.as_micros() as i64,
        "bound again at once once its bind ended: {} ms after the held create",
        (created - held_at) / 1000
    );
    assert!(
        advisories.find("CREATED", &held).is_none(),
        "{:?}",
        advisories.all()
    );
    the_watch_still_sees_the_key(&insp, &mut d).await;
    assert!(!d.has_line(NO_DELETE_WARNING), "{}", d.transcript());
}
