//! A lease row whose holder is not running (a SIGKILLed daemon, a broker that crashed under
//! its daemon), as an operator meets it: `deliver`, `up` and `status` name it as such with the
//! seconds until the row expires, never as another daemon running; a detached `up` keeps the
//! broker it started; a bare `up` serves once the row has expired. A live holder's row keeps
//! the refusal that another daemon is running.

use std::time::{Duration, Instant};

use crate::support::up::*;
use cotal_delivery::base;
use nix::sys::signal::Signal;

/// A short lease TTL (`--lease-ttl-secs`), so a killed holder's row expires within the test.
const TTL_SECS: &str = "12";
const NOT_RUNNING: &str = "belongs to a holder that is not running";
const LIVE: &str = "another delivery daemon is running";

/// The seconds `expires in <n> s` names in `text`.
fn expires_in(text: &str) -> u64 {
    let at = text.find("expires in ").expect("an expiry") + "expires in ".len();
    text[at..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("seconds")
}

/// A detached mesh whose daemon is SIGKILLed: `deliver` typed by hand in the root is refused
/// naming the holder not running (no connection of its credential on the broker) and when its
/// row expires, exit 6; `status` says the same of the row and is not healthy; a bare `up`
/// says it could not claim yet, when, and that nats-server keeps running, exit 1, the broker
/// alive. Once the row has expired a bare `up` serves. Then a daemon typed by hand meets a live
/// holder and is refused as before ("another delivery daemon is running").
/// Mutations seen failing: `holder_state` answering `Connected` always (the old refusal for a
/// dead holder); the daemon's own connection not excepted from the sweep (its own credential
/// counts as the holder's: the old refusal); `status` not judging the holder (no "not running"
/// in its lease line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_daemons_row_is_named_not_running_with_its_expiry() {
    let root = tempfile::tempdir().expect("root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let mut up = spawn_up(
        root.path(),
        &["--detach", "--lease-ttl-secs", TTL_SECS],
        &[],
    );
    assert_eq!(
        up.wait_exit(COMMAND_BOUND).await.expect("returns").code(),
        Some(0)
    );
    let first = base::read_pid(&pid_path(root.path())).expect("record");
    let broker = broker_pid(root.path());
    signal(first, Signal::SIGKILL);
    until("the daemon died", COMMAND_BOUND, || !alive(first)).await;
    let killed = Instant::now();

    // Typed by hand, from the root (the nearest .cotal/).
    let (st, typed) = run(root.path(), &["deliver", "--space", "demo"], &[]).await;
    assert_eq!(st.code(), Some(6), "{typed}");
    assert!(typed.contains(NOT_RUNNING), "{typed}");
    assert!(
        typed.contains("no connection of its credential is on the broker"),
        "{typed}"
    );
    assert!(!typed.contains(LIVE), "{typed}");
    let left = expires_in(&typed);
    assert!((1..=12).contains(&left), "{typed}");

    let (st, human) = status(root.path(), false).await;
    assert_eq!(st.code(), Some(1), "{human}");
    assert!(human.contains("its holder is not running"), "{human}");
    let (_, json) = status_json(root.path()).await;
    assert_eq!(json["lease"]["holderRunning"], false, "{json}");
    assert!(json["lease"]["expiresInS"].as_u64().is_some(), "{json}");

    let (code, bare) = up_at(root.path(), &[]).await;
    assert_eq!(code, Some(1), "{bare}");
    assert!(
        bare.contains("could not claim the lease of space demo yet"),
        "{bare}"
    );
    assert!(bare.contains("nats-server keeps running"), "{bare}");
    assert!(!bare.contains(LIVE), "{bare}");
    assert!(alive(broker), "the broker keeps running");

    // Once the row has expired (the broker's TTL from its last write), a bare up serves.
    let expired = killed + Duration::from_secs(12);
    until("the killed holder's row expired", COMMAND_BOUND, || {
        Instant::now() >= expired
    })
    .await;
    let (code, served) = up_at(root.path(), &[]).await;
    assert_eq!(code, Some(0), "{served}");
    assert!(
        served.contains("✓ delivery daemon serving space demo"),
        "{served}"
    );
    let (code, json) = status_json(root.path()).await;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["lease"]["holderRunning"], true, "{json}");

    // A live holder keeps today's refusal.
    let (st, live) = run(root.path(), &["deliver", "--space", "demo"], &[]).await;
    assert_eq!(st.code(), Some(6), "{live}");
    assert!(live.contains(LIVE), "{live}");
    assert!(!live.contains(NOT_RUNNING), "{live}");

    let refused = |t: &str| {
        t.lines()
            .filter(|l| l.starts_with('✗'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let lease_line = human
        .lines()
        .find(|l| l.starts_with("lease:"))
        .unwrap_or_default()
        .to_string();
    snapshot!(
        "holder_not_running",
        format!(
            "{}\n--- status ---\n{lease_line}\n--- bare up ---\n{bare}\n--- live holder ---\n{}",
            refused(&typed),
            refused(&live)
        )
    );
    let (st, t) = down(root.path(), &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");
}

/// The broker SIGKILLed under a detached mesh: the daemon exits at its (shortened) window;
/// `down`, then `up --detach` starts a broker on the same store, whose lease row (the crashed
/// daemon's) has not expired yet: up says the daemon could not claim yet and when, keeps that
/// broker running (pid alive, the mesh recorded), exit 1. A bare `up` after the expiry serves.
/// Mutation seen failing: `up` stopping its broker on `NotClaimedYet` like on any failure (the
/// broker is gone after up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_broker_crash_a_detached_up_keeps_its_broker_until_the_row_expires() {
    let root = tempfile::tempdir().expect("root");
    let _guard = MeshGuard(root.path().to_path_buf());
    let window = [("COTAL_DELIVERY_BROKER_GONE_MS", "1000")];
    let detach = ["--detach", "--lease-ttl-secs", "20"];
    let mut up = spawn_up(root.path(), &detach, &window);
    assert_eq!(
        up.wait_exit(COMMAND_BOUND).await.expect("returns").code(),
        Some(0)
    );
    let daemon = base::read_pid(&pid_path(root.path())).expect("record");
    signal(broker_pid(root.path()), Signal::SIGKILL);
    let crashed = Instant::now();
    until("the daemon exited at its window", COMMAND_BOUND, || {
        !alive(daemon)
    })
    .await;
    let (st, t) = down(root.path(), &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");

    let mut again = spawn_up(root.path(), &detach, &window);
    let st = again.wait_exit(COMMAND_BOUND).await.expect("returns");
    let t = again.transcript();
    assert_eq!(st.code(), Some(1), "{t}");
    assert!(
        t.contains("could not claim the lease of space demo yet"),
        "{t}"
    );
    assert!(t.contains("nats-server keeps running (pid"), "{t}");
    assert!(!t.contains(LIVE), "{t}");
    let broker = broker_pid(root.path());
    assert!(alive(broker), "the broker up started keeps running:\n{t}");
    snapshot!("up_detached_not_claimed_yet", t);

    let expired = crashed + Duration::from_secs(20);
    until("the crashed holder's row expired", COMMAND_BOUND, || {
        Instant::now() >= expired
    })
    .await;
    let (code, served) = up_at(root.path(), &[]).await;
    assert_eq!(code, Some(0), "{served}");
    assert!(
        served.contains("✓ delivery daemon serving space demo"),
        "{served}"
    );
    let (st, t) = down(root.path(), &[]).await;
    assert_eq!(st.code(), Some(0), "{t}");
}
