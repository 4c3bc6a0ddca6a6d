//! `pending` and `members` run as the real binary against a real broker and daemon: a member
//! owed DLV frames, a member whose ACL row is gone owed INBOX entries, a member who left, a
//! presence record making one member online; unknown and malformed tokens and an unreachable
//! broker each refused with one line and their exit code, nothing written. The inspection
//! credential is confined to its reads (the broker denies one token outside each grant).

use std::path::Path;
use std::time::Duration;

use async_nats::Event;
use cotal_delivery::agent::Backstop;
use cotal_delivery::provision::remove_acl;
use cotal_delivery::wire::{Principal, SpaceNames};
use delivery_harness::rig::agent;
use delivery_harness::rig::events::ClientEvents;
use delivery_harness::rig::mesh::{Inspector, Mesh};
use serde_json::{json, Value};

use crate::support::data_path::*;

const RUN_BOUND: Duration = Duration::from_secs(30);

/// One run of the binary: exit code, stdout, stderr.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn cli(mesh: &Mesh, args: &[&str], server: Option<&str>) -> Run {
    let bin = delivery_harness::rig::daemon::daemon_bin().expect("daemon binary");
    let url = mesh.url();
    let root = mesh.root().display().to_string();
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(args)
        .args([
            "--space",
            "demo",
            "--root",
            &root,
            "--server",
            server.unwrap_or(&url),
        ])
        .env("COTAL_HOME", mesh.root().join("home"))
        .kill_on_drop(true);
    let out = tokio::time::timeout(RUN_BOUND, cmd.output())
        .await
        .expect("the command ends")
        .expect("the command runs");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn generation(b: &Backstop) -> u64 {
    match b {
        Backstop::Durable { generation } => *generation,
        other => panic!("not durable: {other:?}"),
    }
}

/// Every stream's last sequence, the broker's record of every write.
async fn writes(insp: &Inspector) -> Vec<(String, u64)> {
    let n = &insp.names;
    let mut out = Vec::new();
    for stream in [
        n.chat_stream(),
        n.inbox_stream(),
        n.dlv_stream(),
        SpaceNames::kv_stream(&n.members_bucket()),
        SpaceNames::kv_stream(&n.acl_bucket()),
        SpaceNames::kv_stream(&n.presence_bucket()),
    ] {
        let s = insp.js.get_stream(&stream).await.expect("stream");
        out.push((stream, s.cached_info().state.last_sequence));
    }
    out
}

/// The files under the workspace root with their sizes.
fn files(root: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                out.push((p.display().to_string(), len));
            }
        }
    }
    out.sort();
    out
}

/// Mutations applied and seen caught: INBOX entries not matched against DLV frames (bob's
/// handed-off entries above the reader's floor, held back by carol's, counted as owed);
/// `online` always `false` (bob offline); the unknown member answered with an empty report and
/// exit 0 (code 1 expected).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_and_members_report_what_the_broker_holds() {
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    // Entries whose owner has no ACL row stay owed in INBOX for the whole test.
    let mut daemon =
        crate::support::start(daemon_spec(&mesh).env("COTAL_DELIVERY_NAK_DELAY_MS", "60000")).await;
    let (alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    let mut joined = Vec::new();
    let mut material = Vec::new();
    for name in ["bob", "carol", "dave"] {
        let (a, m) = agent::spawn(&mesh, &insp, name, &["general"])
            .await
            .unwrap();
        joined.push(generation(
            &a.durable_join("general").await.unwrap().backstop,
        ));
        material.push((a, m));
    }
    let [(_bob, bob), (_carol, carol), (dave_agent, _)] = &material[..] else {
        unreachable!()
    };
    dave_agent
        .durable_leave("general", joined[2])
        .await
        .unwrap();
    remove_acl(
        &insp.js,
        &insp.names,
        &carol.principal,
        &carol.lifecycle_uid,
    )
    .await
    .unwrap();
    for i in 0..3 {
        let m = alice.message("general", &format!("owed-{i}"), None);
        alice.post("general", &m).await.unwrap();
    }
    eventually(
        "bob's 3 frames handed off, carol's 3 entries stored",
        SURFACE_BOUND,
        || async {
            dlv_count(&insp, &bob.principal, &bob.lifecycle_uid).await == 3
                && inbox_count(&insp, &carol.principal, &carol.lifecycle_uid).await == 3
                && consumer(&insp, &insp.names.inbox_stream(), "reader")
                    .await
                    .num_pending
                    == 0
        },
    )
    .await;
    // bob is online: a fresh presence heartbeat.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    insp.js
        .publish(
            format!("$KV.{}.local.bob", insp.names.presence_bucket()),
            json!({"card": {"id": "local.bob", "name": "bob"}, "status": "idle", "ts": now_ms})
                .to_string()
                .into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let before = (writes(&insp).await, files(mesh.root()));

    let mut transcript = Vec::new();
    for args in [
        ["pending", "local.bob"],
        ["pending", "local.carol"],
        ["pending", "local.dave"],
        ["members", "general"],
    ] {
        let r = cli(&mesh, &args, None).await;
        assert_eq!(r.code, Some(0), "{args:?}: {}", r.stderr);
        transcript.push(format!("$ {}\n{}", args.join(" "), r.stdout.trim_end()));
    }
    // Bad input: one line on stderr each, nothing on stdout, the documented code.
    let free = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let unreachable = format!("nats://127.0.0.1:{free}");
    for (args, server, code) in [
        (vec!["pending", "local.zed"], None, 1),
        (vec!["members", "nochannel"], None, 1),
        (vec!["pending", "bob"], None, 3),
        (vec!["members", "gen>eral"], None, 3),
        (vec!["pending", "local.bob"], Some(unreachable.as_str()), 4),
    ] {
        let r = cli(&mesh, &args, server).await;
        assert_eq!(r.code, Some(code), "{args:?}: {}{}", r.stdout, r.stderr);
        assert_eq!(r.stdout, "", "{args:?}");
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: {}", r.stderr);
        transcript.push(format!(
            "$ {} (exit {code})\n{}",
            args.join(" "),
            r.stderr.trim_end()
        ));
    }
    snapshot!("inspect_reports", transcript.join("\n"));

    // --json, parsed.
    let parse = |r: Run| -> Value {
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        serde_json::from_str(&r.stdout).expect("one JSON object")
    };
    let b = parse(cli(&mesh, &["pending", "--json", "local.bob"], None).await);
    assert_eq!(b["owed"], 3, "{b}");
    assert_eq!(b["lifecycles"][0]["uid"], bob.lifecycle_uid.to_string());
    assert_eq!(b["lifecycles"][0]["acl"], "live");
    assert_eq!(b["lifecycles"][0]["inbox"]["owed"], 0, "{b}");
    assert_eq!(b["lifecycles"][0]["dlv"]["owed"], 3, "{b}");
    assert_eq!(b["lifecycles"][0]["dlv"]["channels"]["general"], 3, "{b}");
    assert!(b["oldestAgeMs"].as_u64().is_some(), "{b}");
    let c = parse(cli(&mesh, &["pending", "--json", "local.carol"], None).await);
    assert_eq!(c["lifecycles"][0]["acl"], "absent", "{c}");
    assert_eq!(c["lifecycles"][0]["inbox"]["owed"], 3, "{c}");
    assert_eq!(c["lifecycles"][0]["dlv"]["owed"], 0, "{c}");
    let d = parse(cli(&mesh, &["pending", "--json", "local.dave"], None).await);
    assert_eq!(d["owed"], 0, "{d}");
    let m = parse(cli(&mesh, &["members", "--json", "general"], None).await);
    assert_eq!(m["current"], 2, "{m}");
    let rows = m["members"].as_array().unwrap();
    let row = |who: &str| {
        rows.iter()
            .find(|r| r["member"] == who)
            .unwrap_or_else(|| panic!("{who} in {m}"))
    };
    assert_eq!(row("local.bob")["online"], true);
    assert_eq!(row("local.carol")["online"], false);
    assert_eq!(row("local.bob")["generation"], joined[0]);
    assert!(row("local.bob")["leaveCursor"].is_null());
    let left = row("local.dave");
    assert!(left["leaveCursor"].as_u64().is_some(), "{left}");
    assert!(left["leaveCursor"].as_u64() >= left["joinCursor"].as_u64());

    // Nothing written: no stream moved, no file changed.
    assert_eq!((writes(&insp).await, files(mesh.root())), before);
    stop_daemon(&mut daemon).await;
}

/// Waits for the broker's `Permissions Violation for <op> to "<subject>"`.
async fn expect_denied(events: &mut ClientEvents, op: &str, subject: &str) {
    let needle = format!("Permissions Violation for {op} to \"{subject}\"");
    events
        .wait_for(Duration::from_secs(5), &needle, |e| match e {
            Event::ServerError(err) => err.to_string().contains(&needle),
            _ => false,
        })
        .await
        .unwrap_or_else(|e| panic!("expected the broker to deny {op} {subject}: {e}"));
}

/// The inspection credential reads what `pending` and `members` read, and the broker denies one
/// token outside each grant. Mutation applied and seen caught: a
/// `stream_info(&n.chat_stream())` grant added to `inspector` (the CHAT info is answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspection_credential_is_confined_to_its_reads() {
    let mesh = mesh().await;
    let n = SpaceNames::new(mesh.space());
    let cred =
        cotal_delivery::base::read_creds_file(&mesh.workspace().inspect_creds_path(mesh.space()))
            .expect("inspect.creds provisioned with the space");
    let (client, mut events) = mesh.connect_watched(&cred, "inspect").await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    // Allowed: what the commands read.
    for stream in [n.inbox_stream(), n.dlv_stream()] {
        js.get_stream(&stream).await.expect("stream info");
    }
    js.get_stream(SpaceNames::kv_stream(&n.members_bucket()))
        .await
        .expect("members bucket info");
    let rows = cotal_delivery::base::Rows::open(&js, &n.acl_bucket(), Duration::from_secs(5))
        .await
        .expect("acl bucket");
    rows.read("local.x.abcdefghijklmnopqrstuvwxyz")
        .await
        .expect("a leader-served row read");

    // Denied: one token outside each grant.
    let alice = Principal::parse("local.alice").unwrap();
    let uid = cotal_delivery::wire::LifecycleUid::generate();
    let denied_pubs = [
        format!("$JS.API.STREAM.INFO.{}", n.chat_stream()),
        format!("$JS.API.STREAM.MSG.GET.{}", n.chat_stream()),
        format!("$JS.API.STREAM.MSG.DELETE.{}", n.inbox_stream()),
        format!("$JS.API.CONSUMER.INFO.{}.fanout", n.inbox_stream()),
        format!("$JS.API.CONSUMER.CREATE.{}", n.dlv_stream()),
        format!("$JS.API.STREAM.MSG.GET.KV_{}", n.delivery_bucket()),
        format!("$KV.{}.general/local.alice.{uid}", n.members_bucket()),
        n.dinbox_subject(&alice, &uid),
        n.dlv_subject(&alice, &uid),
        n.chat_subject(&alice, "general"),
    ];
    for subject in &denied_pubs {
        client.publish(subject.clone(), "{}".into()).await.unwrap();
        expect_denied(&mut events, "Publish", subject).await;
    }
    let _sub = client.subscribe(n.chat_all()).await.unwrap();
    expect_denied(&mut events, "Subscription", &n.chat_all()).await;
}

/// `pending` finds a member's lifecycles by subject filters (its ACL rows, its INBOX and DLV
/// subjects) and lists the whole members registry only for a member none of those names
/// (issue 32: the listing is every key of the registry): `pending local.bob` (an ACL row)
/// sends no `STREAM.INFO` with a subject filter to the members bucket's stream, and
/// `pending local.erin`, known only by a membership row, is still reported (nothing owed, exit
/// 0), not refused as unknown. Mutations seen failing: the members listing made
/// unconditional (bob's run lists the bucket); the listing removed (erin is unknown, exit 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_lists_the_registry_only_for_a_member_no_filter_finds() {
    use futures::StreamExt;
    let mesh = mesh().await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (_bob, _) = agent::spawn(&mesh, &insp, "bob", &["general"])
        .await
        .unwrap();
    let erin_row = json!({
        "channel": "general", "owner": "local.erin", "lifecycleUid": "e".repeat(26),
        "state": "durable-active", "joinCursor": 0, "activated": true, "generation": 1,
        "writerIdentity": "local.test", "updatedAt": 1,
    });
    insp.js
        .publish(
            format!(
                "$KV.{}.general/local.erin.{}",
                insp.names.members_bucket(),
                "e".repeat(26)
            ),
            erin_row.to_string().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let mut info = insp
        .client
        .subscribe(format!(
            "$JS.API.STREAM.INFO.KV_{}",
            insp.names.members_bucket()
        ))
        .await
        .unwrap();
    insp.client.flush().await.unwrap();
    // Every request the account sends to the members stream's info, as they arrive.
    let (tx, mut listings) = tokio::sync::mpsc::unbounded_channel();
    let counter = tokio::spawn(async move {
        while let Some(m) = info.next().await {
            let _ = tx.send(String::from_utf8_lossy(&m.payload).contains("subjects_filter"));
        }
    });
    let listed = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<bool>| {
        let mut n = 0;
        while let Ok(l) = rx.try_recv() {
            n += usize::from(l);
        }
        n
    };

    let bob = cli(&mesh, &["pending", "local.bob"], None).await;
    assert_eq!(bob.code, Some(0), "{}", bob.stderr);
    // The run's requests reached the broker before its answer; the flush brings this side's
    // copies of them in before they are counted.
    insp.client.flush().await.unwrap();
    assert_eq!(
        listed(&mut listings),
        0,
        "bob's pending listed the registry"
    );

    let erin = cli(&mesh, &["pending", "local.erin"], None).await;
    assert_eq!(erin.code, Some(0), "{}{}", erin.stdout, erin.stderr);
    assert!(
        erin.stdout
            .contains("local.erin in space demo: nothing owed"),
        "{}",
        erin.stdout
    );
    insp.client.flush().await.unwrap();
    // async-nats pages a listing (a request per page, and one past the last).
    let erins = listed(&mut listings);
    assert!(erins >= 1, "erin's pending did not list the registry");
    counter.abort();
}
