//! Credential expiry, renewal and store identity against a real broker (issue 5, "Must show").
//!
//! Short lifetimes are minted for real (the JWT `exp` the broker enforces), and the windows are
//! shrunk through the documented overrides (docs/operations.md). Measured figures print as
//! `MEASURED …` lines.

use std::time::{Duration, Instant};

use crate::support::BOUND;
use cotal_delivery::base::{read_creds_file, write_creds_file_atomic, Credential};
use cotal_delivery::provision::{remint_daemon_creds_for, RemintOutcome};
use cotal_delivery::provision::{MeshAuthority, MintOptions, Profile};
use delivery_harness::rig::daemon::{Daemon, DaemonSpec};
use delivery_harness::rig::mesh::Mesh;
use delivery_harness::ConnState;
use delivery_harness::TcpProxy;
use serde_json::{json, Value};

use crate::support::data_path::mesh_with_signer;
use crate::support::health::{own_lines, wait_started, Supervisor};

const MISSED: &str = "still holds the previous cred — the renewal owner has not re-signed it";

/// Re-signs the daemon's delivery credential (same nkey) to live `lifetime` from now.
fn shorten(mesh: &Mesh, lifetime: Duration) -> Credential {
    let path = mesh.workspace().delivery_creds_path(mesh.space());
    let current = read_creds_file(&path).expect("read creds");
    let short = mesh
        .mint(
            mesh.space(),
            &Profile::Delivery,
            MintOptions::new().renewal_of(&current).expires_in(lifetime),
        )
        .expect("mint");
    write_creds_file_atomic(&path, &short).expect("write creds");
    short
}

/// The renewal owner's remint of `live` (same nkey) to live `lifetime`, written to the store;
/// returns it and the `reloadCreds` args that expect it.
fn remint_delivery(mesh: &Mesh, live: &Credential, lifetime: Duration) -> (Credential, Value) {
    let next = mesh
        .mint(
            mesh.space(),
            &Profile::Delivery,
            MintOptions::new().renewal_of(live).expires_in(lifetime),
        )
        .expect("mint");
    let path = mesh.workspace().delivery_creds_path(mesh.space());
    write_creds_file_atomic(&path, &next).expect("write creds");
    let expected = json!({"expected": {"delivery": next.fingerprint()}});
    (next, expected)
}

/// The JWT the broker holds for the daemon's connection (`/connz?auth=true`).
async fn broker_jwt_of_daemon(mesh: &Mesh) -> Option<String> {
    let open = mesh.broker.connz_named(ConnState::Open, "cotal:delivery");
    open.await.ok()?.into_iter().next()?.jwt
}

/// The mesh's daemon with `env`, started and its start-up complete (lease watch bound).
async fn started(mesh: &Mesh, env: &[(&str, &str)]) -> Daemon {
    let d = crate::support::start(mesh.deliver(mesh.space()).envs(env)).await;
    wait_started(mesh, mesh.space(), BOUND).await;
    d
}

/// A rogue remint asked for on `reloadCreds` is refused in the reference shape (`ok:false`,
/// per-component `data`: the refused one without `brokerAccepted`, no digest quoted), the live
/// credential undisturbed and the rail still answering. (The 75 % re-read's refusal of a rogue
/// and the reconnect 250 ms after an adoption's reply are the cases `credentials/rogue-remint-refused`
/// and `credentials/reconnect-after-reply`.) Mutation caught: the failure answered as a bare refusal
/// (no `data`).
#[tokio::test]
async fn reload_creds_refuses_a_rogue_remint_in_the_reference_shape() {
    let mesh = mesh_with_signer().await;
    let space = mesh.space().clone();
    let mut d = started(&mesh, &[]).await;
    let boss = Supervisor::connect(&mesh, &space).await;
    let path = mesh.workspace().delivery_creds_path(&space);
    let live = read_creds_file(&path).unwrap();
    let live_jwt_at_broker = broker_jwt_of_daemon(&mesh).await;

    // A rogue signer with the same space label re-signs the same nkey.
    let mut rogue = MeshAuthority::new();
    rogue.add_space(&space);
    let forged = rogue
        .mint(
            &space,
            &Profile::Delivery,
            MintOptions::new().renewal_of(&live),
        )
        .unwrap();
    write_creds_file_atomic(&path, &forged).unwrap();
    let reply = boss
        .request("reloadCreds", json!({}), Duration::from_secs(15))
        .await
        .expect("answered");
    println!("rogue reply: {reply}");
    assert_eq!(reply["ok"], false);
    let error = reply["error"].as_str().unwrap_or_default();
    assert!(error.contains("did not accept"), "{reply}");
    assert!(!has_digest(&reply.to_string()), "{reply}");
    // The reference shape: `ok:false` with both components reported, the refused one without
    // `brokerAccepted`, the other one proved.
    let delivery = &reply["data"]["delivery"];
    assert_eq!(delivery["ok"], false, "{reply}");
    assert!(delivery.get("brokerAccepted").is_none(), "{reply}");
    assert!(
        delivery["error"]
            .as_str()
            .is_some_and(|e| e.contains("did not accept")),
        "{reply}"
    );
    assert_eq!(reply["data"]["membership"]["ok"], true, "{reply}");
    // The live credential is undisturbed and the rail still answers.
    assert_eq!(broker_jwt_of_daemon(&mesh).await, live_jwt_at_broker);
    let id = boss
        .request("reloadStoreIdentity", json!({}), Duration::from_secs(5))
        .await
        .expect("rail answers");
    assert_eq!(id["ok"], true, "{id}");
    assert!(d.is_running());
    d.terminate().unwrap();
    let _ = d.wait_exit(BOUND).await;
}

fn has_digest(text: &str) -> bool {
    let b = text.as_bytes();
    let mut run = 0;
    for c in b {
        if c.is_ascii_hexdigit() {
            run += 1;
            if run >= 64 {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

/// Per-request timeout of the start-up race.
const RACE_REQUEST_BOUND: Duration = Duration::from_millis(2_000);

#[tokio::test]
async fn reload_creds_raced_against_start_up_adopts_or_refuses_never_dies() {
    let mesh = mesh_with_signer().await;
    let space = mesh.space().clone();
    let boss = Supervisor::connect(&mesh, &space).await;
    let path = mesh.workspace().delivery_creds_path(&space);
    let (mut adopted, mut refused, mut silent) = (0, 0, 0);
    for offset_ms in [0u64, 40, 80, 120] {
        // A renewal is waiting in the store when the daemon starts.
        let live = read_creds_file(&path).unwrap();
        let next = mesh
            .mint(
                &space,
                &Profile::Delivery,
                MintOptions::new()
                    .renewal_of(&live)
                    .expires_in(Duration::from_secs(20 * 3600 + offset_ms)),
            )
            .unwrap();
        write_creds_file_atomic(&path, &next).unwrap();
        let mut d = mesh.deliver(&space).spawn().expect("spawn");
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        let started = Instant::now();
        let mut done_after: Option<Instant> = None;
        loop {
            // Each answer needs a preflight connection (the membership component): 300-500 ms
            // on two busy cores, so a shorter timeout would read a slow answer as silence.
            match boss
                .request("reloadCreds", json!({}), RACE_REQUEST_BOUND)
                .await
            {
                Ok(reply) if reply["ok"] == true => {
                    adopted += 1;
                    done_after.get_or_insert_with(Instant::now);
                }
                Ok(reply) => {
                    let e = reply["error"].as_str().unwrap_or_default().to_string();
                    assert!(
                        e.contains("has not finished starting"),
                        "a refusal other than the start-up one: {reply}"
                    );
                    refused += 1;
                }
                Err(_) => silent += 1,
            }
            assert!(d.is_running(), "the daemon died: {}", d.transcript());
            if done_after.is_some_and(|t| t.elapsed() > Duration::from_millis(300)) {
                break;
            }
            assert!(started.elapsed() < BOUND, "{}", d.transcript());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        d.terminate().unwrap();
        let st = d.wait_exit(BOUND).await.expect("exit");
        assert_eq!(st.code(), Some(0), "{}", d.transcript());
    }
    println!(
        "MEASURED reloadCreds raced against start-up: {adopted} adopted, {refused} refused (not finished starting), {silent} unanswered before the rail bound"
    );
    assert!(adopted >= 4);
}

/// `reloadCreds` with `expected` answered `ok`, then the resident connection moved onto it.
async fn reload_and_move_onto_it(boss: &Supervisor, d: &mut Daemon, expected: Value) {
    let reply = boss
        .request("reloadCreds", expected, Duration::from_secs(15))
        .await
        .expect("answered");
    assert_eq!(reply["ok"], true, "{reply}");
    d.wait_for_line("broker connection restored", BOUND)
        .await
        .expect("moved onto it");
}

/// Every open of a file in `dir` (inotify `IN_OPEN` on the directory's entries), read without
/// blocking: the names opened since the last call.
struct Opens(nix::sys::inotify::Inotify);

impl Opens {
    fn watch(dir: &std::path::Path) -> Opens {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let fd = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).expect("inotify");
        fd.add_watch(dir, AddWatchFlags::IN_OPEN | AddWatchFlags::IN_ACCESS)
            .expect("watch the signer directory");
        Opens(fd)
    }
    fn since(&self) -> Vec<String> {
        let mut names = Vec::new();
        loop {
            match self.0.read_events() {
                Ok(events) if !events.is_empty() => names.extend(events.into_iter().map(|e| {
                    e.name
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| "(the directory)".into())
                })),
                Ok(_) | Err(nix::errno::Errno::EAGAIN) => return names,
                Err(e) => panic!("inotify: {e}"),
            }
        }
    }
}

/// The daemon never holds the account signing key and never loads the signer, although the
/// renewal tests and `up` keep it in the daemon's own root (`.cotal/auth/`): an inotify watch on
/// that directory sees no open of any file in it while the daemon starts, serves, re-reads its
/// store at 75 % of an 8 s credential (a missed remint), adopts a renewal by `reloadCreds`, and
/// stops on SIGTERM. The watch is proved live at the end by the test opening the signer itself.
/// Mutation seen failing: the daemon loading the signer at start (`MeshAuthority::load` of the
/// root's `.cotal/auth` in `host/process.rs`): the watch sees `broker.json` opened.
#[tokio::test]
async fn the_daemon_never_opens_the_signer_in_its_root() {
    let mesh = mesh_with_signer().await;
    let auth = mesh.workspace().auth_dir();
    let signer_files = std::fs::read_dir(&auth).expect("signer saved").count();
    assert!(signer_files >= 2, "broker.json and the account file");
    // Built first (when stale), so the short credential's lifetime is not spent on a build.
    delivery_harness::rig::daemon::daemon_bin().expect("daemon binary");
    let live = shorten(&mesh, Duration::from_secs(8));
    let opens = Opens::watch(&auth);
    let mut d = started(&mesh, &[("COTAL_DELIVERY_REMINT_RETRY_MS", "1000")]).await;
    d.wait_for_line(MISSED, BOUND)
        .await
        .expect("the 75 % re-read");
    let boss = Supervisor::connect(&mesh, mesh.space()).await;
    let (_, expected) = remint_delivery(&mesh, &live, Duration::from_secs(3600));
    reload_and_move_onto_it(&boss, &mut d, expected).await;
    d.terminate().expect("SIGTERM");
    assert_eq!(d.wait_exit(BOUND).await.expect("exit").code(), Some(0));
    assert_eq!(opens.since(), Vec::<String>::new(), "{}", d.transcript());
    // The instrument sees an open when there is one.
    std::fs::read(auth.join("broker.json")).expect("read the signer");
    assert_eq!(
        opens.since().first().map(String::as_str),
        Some("broker.json")
    );
}

/// The other branch of "answered once that reconnect completes, or after 5s": after a
/// `reloadCreds` adoption the daemon's reconnect onto the new credential never completes (the
/// proxy it dials through takes new connections but carries nothing), and an admin request read
/// just before that reconnect (right after the adoption's reply) is handled 5 s later anyway,
/// while the connection is still down, as the daemon's own rail counter shows on its metrics
/// endpoint (scraped over loopback, beside the proxy); the answer reaches the caller once the
/// path heals. Mutation seen failing: both 5 s bounds removed (`settled()` without its timeout
/// and the reconnect's wait for `Connected` unbounded in `ReconnectGate::schedule`; either
/// alone still ends the wait at about 5 s): the request is handled only after the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_request_read_during_a_reconnect_that_never_completes_is_answered_after_5_s() {
    let mesh = mesh_with_signer().await;
    let space = mesh.space().clone();
    let insp = mesh.inspector(&space).await.expect("inspector");
    let proxy = TcpProxy::start(mesh.broker.port()).await.expect("proxy");
    let port = crate::metrics::free_port();
    let mut d = crate::support::start(
        DaemonSpec::deliver(space.as_str(), mesh.root())
            .server(&proxy.url())
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{port}")),
    )
    .await;
    crate::support::data_path::wait_lease_watch_bound(&insp).await;
    let boss = std::sync::Arc::new(Supervisor::connect(&mesh, &space).await);
    let live = read_creds_file(&mesh.workspace().delivery_creds_path(&space)).unwrap();
    let (_, expected) = remint_delivery(&mesh, &live, Duration::from_secs(25 * 3600));
    let reply = boss
        .request("reloadCreds", expected, Duration::from_secs(15))
        .await
        .expect("answered");
    assert_eq!(reply["ok"], true, "{reply}");
    // Within the 250 ms before the reconnect: its redial will carry nothing, and the next
    // request is read on the connection that is about to be replaced.
    proxy.blackhole_new();
    let replied = Instant::now();
    let next = tokio::spawn({
        let boss = boss.clone();
        async move {
            boss.request("reloadStoreIdentity", json!({}), Duration::from_secs(30))
                .await
        }
    });
    let handled = "cotal_delivery_rail_requests_total{space=\"demo\",verb=\"reloadStoreIdentity\"}";
    let connected = "cotal_delivery_broker_connected{space=\"demo\"}";
    let (handled_after, down_then) = loop {
        let text = crate::metrics::scrape(port).await;
        if crate::metrics::sample(&text, handled).unwrap_or(0.0) >= 1.0 {
            break (replied.elapsed(), crate::metrics::sample(&text, connected));
        }
        assert!(
            replied.elapsed() < Duration::from_secs(12),
            "never handled while the reconnect hangs:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "MEASURED adoption reply -> the next admin request handled: {} ms (reconnect still hanging)",
        handled_after.as_millis()
    );
    assert!(
        handled_after >= Duration::from_millis(4_500) && handled_after < Duration::from_secs(8),
        "handled {handled_after:?} after the reply"
    );
    assert_eq!(
        down_then,
        Some(0.0),
        "handled while the connection was down"
    );
    proxy.heal();
    let answer = tokio::time::timeout(BOUND, next)
        .await
        .expect("answered once the path heals")
        .expect("join")
        .expect("answered");
    assert_eq!(answer["ok"], true, "{answer}");
    d.wait_for_line("broker connection restored", BOUND)
        .await
        .expect("reconnected");
    d.terminate().unwrap();
    let _ = d.wait_exit(BOUND).await;
}

/// `reloadStoreIdentity` names the workspace store with its `store.id`; the same challenge is
/// accepted, and one naming the same root with another `store.id`, or with none at all, or an
/// injected store, is refused naming both. Mutation seen failing: `StoreIdentity::same_store`
/// accepting a challenge without `storeId` on the root path alone (the bare challenge answered
/// `ok: true`).
#[tokio::test]
async fn store_identity_is_the_workspace_store_and_a_divergent_challenge_is_refused() {
    let mesh = mesh_with_signer().await;
    let space = mesh.space().clone();
    let mut d = started(&mesh, &[]).await;
    let boss = Supervisor::connect(&mesh, &space).await;
    let reply = boss
        .request("reloadStoreIdentity", json!({}), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    let ours = reply["data"].clone();
    assert_eq!(ours["kind"], "fs");
    assert_eq!(ours["root"], mesh.root().display().to_string());
    let store_id = std::fs::read_to_string(mesh.root().join(".cotal/store.id")).unwrap();
    assert_eq!(ours["storeId"], store_id.trim());
    // The same challenge is accepted.
    let same = boss
        .request(
            "reloadStoreIdentity",
            json!({"expected": ours.clone()}),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(same["ok"], true, "{same}");
    // Same path, another host's store (another store.id): refused, naming both.
    let mut other_host = ours.clone();
    other_host["storeId"] = json!("00000000-0000-4000-8000-000000000000");
    let refused = boss
        .request(
            "reloadStoreIdentity",
            json!({"expected": other_host}),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    println!("divergent reply: {refused}");
    assert_eq!(refused["ok"], false);
    let e = refused["error"].as_str().unwrap_or_default();
    assert!(e.contains(store_id.trim()) && e.contains("00000000-0000-4000-8000-000000000000"));
    // Same path and no storeId at all: a path alone never proves one store (two hosts may
    // share it), so it is refused too, naming ours.
    let mut bare = ours.clone();
    bare.as_object_mut().expect("object").remove("storeId");
    let bare_refused = boss
        .request(
            "reloadStoreIdentity",
            json!({"expected": bare}),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(bare_refused["ok"], false, "{bare_refused}");
    let e = bare_refused["error"].as_str().unwrap_or_default();
    assert!(e.contains(store_id.trim()), "{e}");
    let injected = boss
        .request(
            "reloadStoreIdentity",
            json!({"expected": {"kind": "injected", "coordinate": "vault:prod"}}),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(injected["ok"], false);
    assert!(injected["error"]
        .as_str()
        .unwrap_or_default()
        .contains("vault:prod"));
    assert!(d.is_running());
    // The renewal owner refuses offline to overwrite with another account's chain.
    let mut rogue = MeshAuthority::new();
    rogue.add_space(&space);
    let other = tempfile::tempdir().unwrap();
    rogue.save(&other.path().join(".cotal/auth")).unwrap();
    std::fs::create_dir_all(other.path().join(".cotal").join(space.segment())).unwrap();
    std::fs::copy(
        mesh.workspace().delivery_creds_path(&space),
        other
            .path()
            .join(".cotal")
            .join(space.segment())
            .join("delivery.creds"),
    )
    .unwrap();
    let report =
        remint_daemon_creds_for(other.path(), &space, None, None, Duration::from_secs(60)).await;
    match report.outcome("delivery.creds") {
        Some(RemintOutcome::Refused(e)) => assert!(e.contains("offline re-sign refused"), "{e}"),
        other => panic!("{other:?}"),
    }
    snapshot!(
        "renewal_store_identity",
        format!(
            "{}\n{}",
            own_lines(&d.transcript()),
            refused["error"].as_str().unwrap_or_default()
        )
    );
    d.terminate().unwrap();
    let _ = d.wait_exit(BOUND).await;
}
