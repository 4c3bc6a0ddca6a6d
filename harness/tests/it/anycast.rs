//! Anycast take records on a real broker with the real daemon (docs/anycast.md): the take /
//! cancel race, a take from a recreated task stream, the sender's DMs and their resend after a
//! SIGKILL, the day-old sweep, sender-only status and cancel, a buffered copy of a cancelled
//! request, takes only by holders of the request's role, the agent with no daemon and with a
//! daemon or seat that predates takes, and the confinement of every new grant (the role
//! durables included).

use std::time::{Duration, Instant};

use crate::support::data_path as s;
use crate::support::BOUND;
use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::{self, stream};
use async_nats::Event;
use cotal_delivery::agent::{Agent, AgentErrorKind};
use cotal_delivery::agent::{TakeVerdict, NO_DAEMON};
use cotal_delivery::base::{Read, Rows, ENV_FAULT_HOLD_AFTER_ANYCAST_ROW};
use cotal_delivery::plane::{row_key, FAULT_HOLD_LINE};
use cotal_delivery::wire::{CtlService, Principal, SpaceNames};
use delivery_harness::rig::agent;
use delivery_harness::rig::events::ClientEvents;
use delivery_harness::rig::mesh::{Inspector, Mesh};
use futures::StreamExt;
use serde_json::Value;

pub(crate) const ROLE: &str = "review";

/// The lease TTL of these tests' mesh (2 s): short, so a killed predecessor's lease expires
/// within a respawn or two of the next daemon ([`crate::support::start_when_free`]).
const LEASE_TTL: Duration = Duration::from_secs(2);

/// Publishes one `@review` request as `sender` (its own agent credential) and returns its seq.
pub(crate) async fn send(sender: &Agent) -> u64 {
    let js = jetstream::new(sender.client().clone());
    let subject = sender.names().anycast_subject(ROLE, sender.principal());
    js.publish(subject, "{\"parts\":[]}".into())
        .await
        .expect("publish")
        .await
        .expect("stored")
        .sequence
}

/// The row of `seq` as the broker holds it (leader-served).
async fn row(insp: &Inspector, created: &str, seq: u64) -> Option<Value> {
    let rows = Rows::open(&insp.js, &insp.names.anycast_bucket(), BOUND)
        .await
        .expect("rows");
    match rows.read(&row_key(created, seq)).await.expect("read") {
        Read::Present(r) => Some(serde_json::from_slice(&r.value).expect("JSON row")),
        Read::Absent { .. } => None,
    }
}

/// Whether `TASK_<s>` still holds seq `seq`.
async fn queued(insp: &Inspector, seq: u64) -> bool {
    let s = insp
        .js
        .get_stream_no_info(insp.names.task_stream())
        .await
        .expect("task stream");
    s.get_raw_message(seq).await.is_ok()
}

/// Every DM stored for `recipient`, oldest first.
async fn dms_to(insp: &Inspector, recipient: &str) -> Vec<Value> {
    use async_nats::jetstream::consumer::DeliverPolicy;
    let filter = format!("{}.inst.{recipient}.>", insp.names.space().prefix());
    let st = insp
        .js
        .get_stream_no_info(insp.names.dm_stream())
        .await
        .expect("dm stream");
    let c = st
        .create_consumer(pull::Config {
            filter_subject: filter,
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .expect("consumer");
    let pending = c.cached_info().num_pending as usize;
    let mut out = Vec::new();
    if pending == 0 {
        return out;
    }
    let mut msgs = c.messages().await.expect("pull");
    for _ in 0..pending {
        let m = tokio::time::timeout(BOUND, msgs.next())
            .await
            .expect("dm read back")
            .expect("open")
            .expect("msg");
        let mut v: Value = serde_json::from_slice(&m.payload).expect("JSON");
        v["subject"] = Value::String(m.subject.to_string());
        out.push(v);
    }
    out
}

/// A role durable on the task stream created by the operator (what the provisioner
/// pre-creates for a role; a shorter ack wait, the role's own setting, lets a redelivery happen
/// inside the test). Provisioning a holder afterwards keeps it as it is.
async fn role_consumer(
    insp: &Inspector,
    ack_wait: Duration,
) -> jetstream::consumer::Consumer<pull::Config> {
    insp.js
        .get_stream_no_info(insp.names.task_stream())
        .await
        .expect("task stream")
        .create_consumer(pull::Config {
            durable_name: Some(format!("svc_{ROLE}")),
            filter_subject: format!("{}.svc.{ROLE}.>", insp.names.space().prefix()),
            ack_policy: AckPolicy::Explicit,
            ack_wait,
            ..Default::default()
        })
        .await
        .expect("role durable")
}

async fn next_copy(c: &jetstream::consumer::Consumer<pull::Config>) -> jetstream::Message {
    let mut batch = c
        .fetch()
        .max_messages(1)
        .expires(BOUND)
        .messages()
        .await
        .expect("fetch");
    batch
        .next()
        .await
        .expect("a copy is delivered")
        .expect("message")
}

/// Alice sends (she serves no role); bob and carol hold `@review`.
async fn three(mesh: &Mesh, insp: &Inspector) -> (Agent, Agent, Agent) {
    let (alice, _) = agent::spawn(mesh, insp, "alice", &["general"])
        .await
        .expect("alice");
    let (bob, _) = agent::spawn_holder(mesh, insp, "bob", &["general"], &[ROLE])
        .await
        .expect("bob");
    let (carol, _) = agent::spawn_holder(mesh, insp, "carol", &["general"], &[ROLE])
        .await
        .expect("carol");
    (alice, bob, carol)
}

/// A take and a cancel of one request, sent at once, 200 times: exactly one wins every trial,
/// as the broker's row says (`taken` by bob, the request still queued; or `cancelled`, the
/// request deleted), and the loser's refusal names the winner.
///
/// Mutation seen failing: a take whose row create lost (conflict) answering as the winner
/// instead of re-reading: trial 0 had both the take and the cancel answered ok.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn take_and_cancel_race_with_exactly_one_winner_over_200_trials() {
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = crate::support::start_when_free(s::daemon_spec(&mesh)).await;
    let (alice, bob, _carol) = three(&mesh, &insp).await;
    let created = bob.task_created().await.expect("creation time");
    let (mut takes, mut cancels) = (0, 0);
    let started = Instant::now();
    for trial in 0..200 {
        let seq = send(&alice).await;
        let (t, c) = tokio::join!(
            bob.anycast_take(seq, &created, 1),
            alice.anycast_cancel(seq)
        );
        let row = row(&insp, &created, seq)
            .await
            .expect("one row per request");
        match (t, c) {
            (Ok(_), Err(e)) => {
                takes += 1;
                assert_eq!(row["state"], "taken", "trial {trial}: {row}");
                assert_eq!(row["holder"], "local.bob");
                assert!(
                    e.detail().contains("already taken by local.bob"),
                    "{}",
                    e.detail()
                );
                assert!(queued(&insp, seq).await, "a taken request stays queued");
            }
            (Err(e), Ok(v)) => {
                cancels += 1;
                assert_eq!(row["state"], "cancelled", "trial {trial}: {row}");
                assert_eq!(v["state"], "cancelled");
                assert!(
                    e.detail()
                        .contains("was cancelled by its sender local.alice"),
                    "{}",
                    e.detail()
                );
                assert!(!queued(&insp, seq).await, "a cancelled request is deleted");
            }
            (t, c) => panic!("trial {trial}: not exactly one winner: take {t:?}, cancel {c:?}"),
        }
    }
    println!(
        "race: {takes} takes won, {cancels} cancels won, 200 trials in {} ms",
        started.elapsed().as_millis()
    );
    assert_eq!(takes + cancels, 200);
    s::stop_daemon(&mut d).await;
}

/// A take naming the creation time of a task stream since recreated is refused (seq 1 exists
/// again on the new stream); the holder's `take_before_showing` re-reads the creation time,
/// finds it moved and naks its copy, which the broker redelivers at once (well inside the
/// 30 s ack wait).
///
/// Mutation seen failing: the daemon's creation-time check removed (the take was recorded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_from_a_recreated_task_stream_is_refused_and_the_copy_naked() {
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, bob, _carol) = three(&mesh, &insp).await;
    let old = bob.task_created().await.unwrap();
    // Recreate TASK_<s> (no daemon runs, as docs/anycast.md requires) with the same config.
    let config = insp
        .js
        .get_stream(insp.names.task_stream())
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    insp.js
        .delete_stream(insp.names.task_stream())
        .await
        .unwrap();
    insp.js
        .create_stream(stream::Config { ..config })
        .await
        .unwrap();
    let new = bob.task_created().await.unwrap();
    assert_ne!(old, new);
    let mut d = crate::support::start_when_free(s::daemon_spec(&mesh)).await;
    let seq = send(&alice).await;
    assert_eq!(seq, 1, "the new stream reuses seqs");
    let refused = bob.anycast_take(seq, &old, 1).await.expect_err("refused");
    assert!(
        refused.detail().contains("was recreated since you read it"),
        "{}",
        refused.detail()
    );
    assert!(row(&insp, &new, seq).await.is_none(), "no row written");
    // The role's durable went with the old stream; the provisioner creates it again.
    role_consumer(&insp, Duration::from_secs(30)).await;
    let c = bob.role_queue(ROLE).await.unwrap();
    let copy = next_copy(&c).await;
    let started = Instant::now();
    match bob.take_before_showing(&copy, &old).await.unwrap() {
        TakeVerdict::Naked { created, .. } => assert_eq!(created, new),
        other => panic!("expected a nak, got {other:?}"),
    }
    let again = next_copy(&c).await;
    assert_eq!(again.info().unwrap().stream_sequence, seq);
    assert_eq!(again.info().unwrap().delivered, 2, "redelivered");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "at once, not after the ack wait"
    );
    match bob.take_before_showing(&again, &new).await.unwrap() {
        TakeVerdict::Show { took } => assert_eq!(took, "taken"),
        other => panic!("expected show, got {other:?}"),
    }
    s::stop_daemon(&mut d).await;
}

/// A winning take DMs the sender from the daemon's own principal naming the holder; when the
/// ack wait runs out and the broker delivers the request again to carol, her take moves the
/// row and a second DM names her (and bob before her). Bob's later take is refused.
///
/// Mutation seen failing: the move branch (`delivered > row.delivered`) removed: carol's take
/// was refused as "already taken by local.bob".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_dms_reach_the_sender_from_the_daemon_principal() {
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = crate::support::start_when_free(s::daemon_spec(&mesh)).await;
    role_consumer(&insp, Duration::from_secs(1)).await;
    let (alice, bob, carol) = three(&mesh, &insp).await;
    let created = bob.task_created().await.unwrap();
    let (bq, cq) = (
        bob.role_queue(ROLE).await.unwrap(),
        carol.role_queue(ROLE).await.unwrap(),
    );
    assert_eq!(
        cq.cached_info().config.ack_wait,
        Duration::from_secs(1),
        "provisioning kept the role's durable"
    );
    let seq = send(&alice).await;
    let first = next_copy(&bq).await;
    assert!(matches!(
        bob.take_before_showing(&first, &created).await.unwrap(),
        TakeVerdict::Show { .. }
    ));
    // Bob never acks: the 1 s ack wait runs out and the broker delivers the copy again.
    let second = next_copy(&cq).await;
    assert_eq!(second.info().unwrap().delivered, 2);
    match carol.take_before_showing(&second, &created).await.unwrap() {
        TakeVerdict::Show { took } => assert_eq!(took, "moved"),
        other => panic!("expected a move, got {other:?}"),
    }
    let late = bob
        .anycast_take(seq, &created, 1)
        .await
        .expect_err("bob's stale take");
    assert!(
        late.detail().contains("already taken by local.carol"),
        "{}",
        late.detail()
    );
    let r = row(&insp, &created, seq).await.unwrap();
    assert_eq!(
        (
            r["holder"].as_str(),
            r["moves"].as_u64(),
            r["noticeSent"].as_bool()
        ),
        (Some("local.carol"), Some(1), Some(true))
    );
    s::eventually("two DMs to alice", BOUND, || async {
        dms_to(&insp, "local.alice").await.len() >= 2
    })
    .await;
    let dms = dms_to(&insp, "local.alice").await;
    assert_eq!(dms.len(), 2, "{dms:?}");
    let from = dms[0]["from"]["id"].as_str().unwrap().to_string();
    assert!(
        from.starts_with("local.U"),
        "the daemon's principal local.<nkey>: {from}"
    );
    for dm in &dms {
        assert_eq!(dm["from"]["id"], from.as_str());
        assert!(dm["subject"]
            .as_str()
            .unwrap()
            .ends_with(&format!(".inst.local.alice.{from}")));
        assert_eq!(dm["to"], "local.alice");
    }
    assert_eq!(
        dms[0]["parts"][0]["text"],
        format!("Your @review request seq {seq} was taken by local.bob.")
    );
    assert_eq!(
        dms[1]["parts"][0]["text"],
        format!("Your @review request seq {seq} moved to local.carol: the ack wait ran out for local.bob and a later delivery went to local.carol.")
    );
    assert_eq!(
        dms[1]["parts"][1]["data"]["anycast"]["previousHolder"],
        "local.bob"
    );
    s::stop_daemon(&mut d).await;
}

/// The crash window between a take's row and its DM: the documented fault-injection knob
/// holds the take right after its row is written, and the test SIGKILLs the daemon there (by
/// pid, once the hold's line is logged). The row says `noticeSent: false` and no DM exists;
/// the next daemon's start-up sweep (default ten-minute interval, so only the start sweep runs
/// inside the bound) sends it and marks the row.
///
/// Mutation seen failing: the sweep's resend of unsent notices removed (no DM after restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_a_sigkill_left_unsent_is_resent_at_start() {
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = crate::support::start_when_free(
        s::daemon_spec(&mesh).envs(&[(ENV_FAULT_HOLD_AFTER_ANYCAST_ROW, "1")]),
    )
    .await;
    let (alice, bob, _carol) = three(&mesh, &insp).await;
    let created = bob.task_created().await.unwrap();
    let seq = send(&alice).await;
    let key = row_key(&created, seq);
    let (lost, held) = tokio::join!(bob.anycast_take(seq, &created, 1), async {
        let line = d
            .wait_for_line(&format!("{FAULT_HOLD_LINE} {key} "), BOUND)
            .await
            .expect("the take holds after its row");
        d.kill().expect("SIGKILL");
        line
    });
    assert!(lost.is_err(), "the daemon died before answering: {lost:?}");
    let status = d.wait_exit(BOUND).await.expect("the daemon exits");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL ({held})");
    let r = row(&insp, &created, seq)
        .await
        .expect("the row was written");
    assert_eq!(
        (r["state"].as_str(), r["noticeSent"].as_bool()),
        (Some("taken"), Some(false))
    );
    assert!(
        dms_to(&insp, "local.alice").await.is_empty(),
        "no DM before the restart"
    );
    let mut d = crate::support::start_when_free(s::daemon_spec(&mesh)).await;
    s::eventually("the notice is resent", BOUND, || async {
        row(&insp, &created, seq).await.unwrap()["noticeSent"] == true
    })
    .await;
    let dms = dms_to(&insp, "local.alice").await;
    assert_eq!(dms.len(), 1, "{dms:?}");
    assert_eq!(
        dms[0]["parts"][0]["text"],
        format!("Your @review request seq {seq} was taken by local.bob.")
    );
    s::stop_daemon(&mut d).await;
}

/// The sweep with the age shortened to 3 s (every 300 ms): a row whose request was acked is
/// marked `leftQueueAt`, kept for the age, then removed; a row whose request is still queued
/// stays. The age is judged against the row's own `leftQueueAt` (the daemon's clock, this
/// machine's), so a slow test side cannot make it pass or fail: the row is still there whenever
/// it is read before `leftQueueAt` + age, and first found gone after it.
///
/// Mutation seen failing: the age comparison dropped (the row was gone at the first look).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_removed_the_row_age_after_their_request_left_the_queue() {
    const AGE_MS: u64 = 3000;
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = crate::support::start_when_free(s::daemon_spec(&mesh).envs(&[
        ("COTAL_DELIVERY_ANYCAST_ROW_AGE_MS", "3000"),
        ("COTAL_DELIVERY_ANYCAST_SWEEP_MS", "300"),
    ]))
    .await;
    let (alice, bob, _carol) = three(&mesh, &insp).await;
    let created = bob.task_created().await.unwrap();
    let c = bob.role_queue(ROLE).await.unwrap();
    let done = send(&alice).await;
    let copy = next_copy(&c).await;
    bob.take_before_showing(&copy, &created).await.unwrap();
    let waiting = send(&alice).await;
    bob.anycast_take(waiting, &created, 1).await.unwrap();
    copy.ack().await.unwrap(); // the request leaves the queue
    s::eventually("leftQueueAt is set", BOUND, || async {
        row(&insp, &created, done).await.unwrap()["leftQueueAt"]
            .as_u64()
            .is_some()
    })
    .await;
    let left = row(&insp, &created, done).await.unwrap()["leftQueueAt"]
        .as_u64()
        .unwrap();
    let (mut seen_late, deadline) = (0u64, Instant::now() + BOUND);
    let gone_at = loop {
        let asked = cotal_delivery::base::epoch_ms();
        let present = row(&insp, &created, done).await.is_some();
        if !present {
            break asked;
        }
        seen_late = seen_late.max(asked);
        assert!(Instant::now() < deadline, "the row was never removed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        gone_at >= left + AGE_MS,
        "removed {} ms after it left the queue, before the {AGE_MS} ms age",
        gone_at.saturating_sub(left)
    );
    assert!(
        seen_late >= left + AGE_MS / 2,
        "the row was read at half its age or later (last seen {} ms after leaving)",
        seen_late.saturating_sub(left)
    );
    let kept = row(&insp, &created, waiting)
        .await
        .expect("a queued request's row stays");
    assert!(kept.get("leftQueueAt").is_none());
    s::stop_daemon(&mut d).await;
}

/// A cancel a crash cut short between its row and its delete (the cancelled row is on the
/// broker, the request still queued; the state is written on the broker by the operator, as
/// the crash leaves it) is finished by the next daemon's start-up sweep: the request is
/// deleted from `TASK_<s>`, the row marked `leftQueueAt`, and a holder's take of its buffered
/// copy is refused as cancelled.
///
/// Mutation seen failing: the sweep's re-delete of a cancelled row's request removed (the
/// request stayed queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_a_crash_cut_short_is_finished_by_the_start_sweep() {
    use cotal_delivery::plane::AnycastRow;
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, bob, _carol) = three(&mesh, &insp).await;
    let created = bob.task_created().await.unwrap();
    let seq = send(&alice).await;
    let q = bob.role_queue(ROLE).await.unwrap();
    let buffered = next_copy(&q).await;
    let cut_short = AnycastRow::cancelled(
        seq,
        created.clone(),
        ROLE.into(),
        "local.alice".into(),
        cotal_delivery::base::epoch_ms(),
    );
    Rows::open(&insp.js, &insp.names.anycast_bucket(), BOUND)
        .await
        .unwrap()
        .create(
            &row_key(&created, seq),
            serde_json::to_vec(&cut_short).unwrap().into(),
        )
        .await
        .expect("the cancelled row");
    assert!(
        queued(&insp, seq).await,
        "the crash left the request queued"
    );
    let mut d = crate::support::start_when_free(s::daemon_spec(&mesh)).await;
    s::eventually("the start sweep deletes the request", BOUND, || async {
        !queued(&insp, seq).await
    })
    .await;
    s::eventually("the row is marked as left", BOUND, || async {
        row(&insp, &created, seq).await.unwrap()["leftQueueAt"]
            .as_u64()
            .is_some()
    })
    .await;
    assert_eq!(
        row(&insp, &created, seq).await.unwrap()["state"],
        "cancelled"
    );
    match bob.take_before_showing(&buffered, &created).await.unwrap() {
        TakeVerdict::Forget { why } => assert!(
            why.contains("was cancelled by its sender local.alice"),
            "{why}"
        ),
        other => panic!("expected forget, got {other:?}"),
    }
    s::stop_daemon(&mut d).await;
}

/// A row of a task stream since recreated belongs to a request that left the queue, even
/// though the new stream stores another request at the same seq: the start sweep marks it
/// `leftQueueAt` (so it is removed a day later), and leaves the new request alone.
///
/// Mutation seen failing: the sweep's creation-time comparison dropped (the old row was taken
/// for the new stream's seq 1 and never marked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_of_a_recreated_task_stream_is_marked_as_left() {
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = crate::support::start_when_free(s::daemon_spec(&mesh)).await;
    let (alice, bob, _carol) = three(&mesh, &insp).await;
    let old = bob.task_created().await.unwrap();
    let seq = send(&alice).await;
    bob.anycast_take(seq, &old, 1).await.unwrap();
    assert!(row(&insp, &old, seq)
        .await
        .unwrap()
        .get("leftQueueAt")
        .is_none());
    // Recreate TASK_<s> with every daemon stopped, as docs/anycast.md requires.
    s::stop_daemon(&mut d).await;
    let config = insp
        .js
        .get_stream(insp.names.task_stream())
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    insp.js
        .delete_stream(insp.names.task_stream())
        .await
        .unwrap();
    insp.js.create_stream(config).await.unwrap();
    let reused = send(&alice).await;
    assert_eq!(reused, seq, "the new stream reuses the seq");
    let mut d = crate::support::start_when_free(s::daemon_spec(&mesh)).await;
    s::eventually("the old row is marked as left", BOUND, || async {
        row(&insp, &old, seq).await.unwrap()["leftQueueAt"]
            .as_u64()
            .is_some()
    })
    .await;
    assert!(queued(&insp, reused).await, "the new request stays queued");
    s::stop_daemon(&mut d).await;
}

/// Status and cancel answer only the request's sender; a cancel of a taken request is refused;
/// a cancel of an untaken one writes the cancelled row and deletes the request, and the buffered
/// copy a holder then tries to take is refused and forgotten.
///
/// Mutation seen failing: the sender check in `own()` made to pass (carol read alice's status).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_cancel_are_the_senders_and_a_cancelled_copy_is_forgotten() {
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = crate::support::start_when_free(s::daemon_spec(&mesh)).await;
    let (alice, bob, carol) = three(&mesh, &insp).await;
    let created = bob.task_created().await.unwrap();
    let taken = send(&alice).await;
    assert_eq!(
        alice.anycast_status(taken).await.unwrap()["state"],
        "queued"
    );
    for e in [
        carol.anycast_status(taken).await,
        carol.anycast_cancel(taken).await,
    ] {
        let e = e.expect_err("not carol's");
        assert_eq!(e.kind(), AgentErrorKind::Refused);
        assert!(e.detail().contains("was not sent by you"), "{}", e.detail());
    }
    assert!(queued(&insp, taken).await, "carol's cancel deleted nothing");
    bob.anycast_take(taken, &created, 1).await.unwrap();
    let st = alice.anycast_status(taken).await.unwrap();
    assert_eq!(
        (st["state"].as_str(), st["holder"].as_str()),
        (Some("taken"), Some("local.bob"))
    );
    let e = alice.anycast_cancel(taken).await.expect_err("taken");
    assert!(
        e.detail().contains("already taken by local.bob"),
        "{}",
        e.detail()
    );

    let c = bob.role_queue(ROLE).await.unwrap();
    let _first = next_copy(&c).await; // seq `taken`, held by bob
    let cancelled = send(&alice).await;
    let buffered = next_copy(&c).await;
    assert_eq!(buffered.info().unwrap().stream_sequence, cancelled);
    let v = alice.anycast_cancel(cancelled).await.unwrap();
    assert_eq!(
        (v["state"].as_str(), v["deleted"].as_bool()),
        (Some("cancelled"), Some(true))
    );
    assert!(
        !queued(&insp, cancelled).await,
        "deleted from the task stream"
    );
    assert_eq!(
        row(&insp, &created, cancelled).await.unwrap()["state"],
        "cancelled"
    );
    match bob.take_before_showing(&buffered, &created).await.unwrap() {
        TakeVerdict::Forget { why } => assert!(
            why.contains("was cancelled by its sender local.alice"),
            "{why}"
        ),
        other => panic!("expected forget, got {other:?}"),
    }
    assert_eq!(
        alice.anycast_status(cancelled).await.unwrap()["state"],
        "cancelled"
    );
    s::stop_daemon(&mut d).await;
}

/// With no daemon running, the agent's anycast calls say "no delivery daemon is answering".
///
/// Mutation seen failing: `no_daemon()` returning the error unchanged (the rail's generic text).
#[tokio::test]
async fn the_agent_reports_no_delivery_daemon_is_answering() {
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let (alice, bob, _carol) = three(&mesh, &insp).await;
    let created = bob.task_created().await.unwrap();
    let seq = send(&alice).await;
    for e in [
        alice.anycast_status(seq).await.unwrap_err(),
        alice.anycast_cancel(seq).await.unwrap_err(),
        bob.anycast_take(seq, &created, 1).await.unwrap_err(),
    ] {
        assert_eq!(e.kind(), AgentErrorKind::NoResponders);
        assert!(
            e.detail().starts_with(&format!("anycast: {NO_DAEMON}")),
            "{}",
            e.detail()
        );
    }
}

async fn expect_denied(events: &mut ClientEvents, op: &str, subject: &str) {
    let needle = format!("Permissions Violation for {op} to \"{subject}\"");
    events
        .wait_for(BOUND, &needle, |e| match e {
            Event::ServerError(err) => err.to_string().contains(&needle),
            _ => false,
        })
        .await
        .unwrap_or_else(|e| panic!("expected the broker to deny {op} {subject}: {e}"));
}

/// Every new grant, one token outside it denied by the broker: the delivery credential's DMs
/// only from its own principal, deletes only on `TASK_<s>` (not `DM_<s>`), writes only to
/// `cotal_anycast_<s>` (not its neighbour), the take rail's replies only on the reply leaf; the
/// agent's requests only as their own sender, its own take subject only, its own take reply
/// subtree only.
///
/// Mutation seen failing: the DM grant widened to `inst.>` (the forged-sender DM was stored).
#[tokio::test]
async fn every_new_anycast_grant_is_confined() {
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let names: &SpaceNames = &insp.names;
    let cred =
        cotal_delivery::base::read_creds_file(&mesh.workspace().delivery_creds_path(mesh.space()))
            .expect("delivery creds");
    let me = Principal::for_nkey(&cred.public_key().unwrap()).unwrap();
    let alice = Principal::parse("local.alice").unwrap();
    let bob = Principal::parse("local.bob").unwrap();
    let (client, mut events) = mesh
        .connect_watched(&cred, "confined")
        .await
        .expect("connect");
    let js = jetstream::new(client.clone());
    // Allowed: a DM from its own principal is stored.
    js.publish(names.dm_subject(&alice, &me), "{}".into())
        .await
        .unwrap()
        .await
        .expect("own DM stored");
    let denied = [
        names.dm_subject(&alice, &bob),
        format!("$JS.API.STREAM.MSG.DELETE.{}", names.dm_stream()),
        format!("$KV.{}.x", names.records_bucket()),
        names.ctl_subject(CtlService::Anycast, &alice),
    ];
    for subject in &denied {
        client.publish(subject.clone(), "{}".into()).await.unwrap();
        expect_denied(&mut events, "Publish", subject).await;
    }
    let dms = dms_to(&insp, "local.alice").await;
    assert_eq!(dms.len(), 1, "only the own-principal DM was stored");

    let alice_m = agent::provision(&mesh, &insp, mesh.space(), "alice", &["general"])
        .await
        .unwrap();
    let (ac, mut aevents) = mesh
        .connect_watched(&alice_m.credential, "alice")
        .await
        .unwrap();
    let ajs = jetstream::new(ac.clone());
    ajs.publish(names.anycast_subject(ROLE, &alice), "{}".into())
        .await
        .unwrap()
        .await
        .expect("own request stored");
    for subject in [
        names.anycast_subject(ROLE, &bob),
        names.ctl_subject(CtlService::Anycast, &bob),
        format!("$JS.API.STREAM.MSG.DELETE.{}", names.task_stream()),
        format!("$JS.API.STREAM.MSG.GET.{}", names.task_stream()),
    ] {
        ac.publish(subject.clone(), "{}".into()).await.unwrap();
        expect_denied(&mut aevents, "Publish", &subject).await;
    }
    let foreign = names.ctl_reply_subtree(CtlService::Anycast, &bob);
    let _sub = ac.subscribe(foreign.clone()).await.unwrap();
    expect_denied(&mut aevents, "Subscription", &foreign).await;
    let s = insp
        .js
        .get_stream_no_info(names.task_stream())
        .await
        .unwrap();
    assert!(
        s.get_raw_message(2).await.is_err(),
        "bob's forged request was not stored"
    );
}

/// Only a holder of the request's role takes it: the daemon reads the ACL row of the lifecycle
/// the take names under the caller's own (broker-authenticated) principal. Alice (no role),
/// mallory (`@deploy` only), mallory naming bob's lifecycle, and bob once his lifecycle is
/// retired are each refused with what was wrong, and none of them writes a row; bob's take
/// while his lifecycle is live wins.
///
/// Mutation seen failing: the `check_serves` call in `Anycast::take` removed (alice's take was
/// recorded: "expected a refusal, got Ok").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_holder_of_the_role_takes_its_request() {
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut d = crate::support::start_when_free(s::daemon_spec(&mesh)).await;
    let (alice, bob, _carol) = three(&mesh, &insp).await;
    let (mallory, _) = agent::spawn_holder(&mesh, &insp, "mallory", &["general"], &["deploy"])
        .await
        .expect("mallory");
    let created = bob.task_created().await.unwrap();
    let seq = send(&alice).await;
    let refused = |who: &str, e: Result<Value, cotal_delivery::agent::AgentError>| {
        let e = e.expect_err(&format!("{who}: expected a refusal, got Ok"));
        assert_eq!(e.kind(), AgentErrorKind::Refused, "{who}: {}", e.detail());
        e.detail().to_string()
    };
    let why = refused("alice", alice.anycast_take(seq, &created, 1).await);
    assert_eq!(
        why,
        format!(
            "take: refused: local.alice does not serve @review (the ACL row of its lifecycle {} lists no role); request seq {seq} is addressed to @review and only its holders take it",
            alice.lifecycle_uid()
        )
    );
    let why = refused("mallory", mallory.anycast_take(seq, &created, 1).await);
    assert!(
        why.contains("local.mallory does not serve @review") && why.contains("lists @deploy)"),
        "{why}"
    );
    // Naming another principal's lifecycle does not borrow its roles: the row is keyed by
    // the caller's own principal.
    let take_subject = insp
        .names
        .ctl_subject(CtlService::Anycast, mallory.principal());
    let body = serde_json::json!({
        "op": "take",
        "args": {"seq": seq, "streamCreated": created, "delivered": 1,
                 "lifecycleUid": bob.lifecycle_uid().to_string()},
        "from": {"id": "local.mallory", "name": "mallory", "kind": "agent"},
    });
    let why = refused(
        "mallory as bob's lifecycle",
        mallory
            .request_raw(
                &take_subject,
                &format!("{take_subject}.reply.forged"),
                body.to_string().into_bytes(),
                BOUND,
            )
            .await,
    );
    assert!(
        why.contains(&format!(
            "local.mallory does not serve @review (its lifecycle {} has no ACL row)",
            bob.lifecycle_uid()
        )),
        "{why}"
    );
    assert!(
        row(&insp, &created, seq).await.is_none(),
        "no refused take wrote a row"
    );
    let won = bob
        .anycast_take(seq, &created, 1)
        .await
        .expect("bob holds @review");
    assert_eq!(won["took"], "taken");
    assert_eq!(
        row(&insp, &created, seq).await.unwrap()["holder"],
        "local.bob"
    );
    // A retired lifecycle serves nothing any more.
    cotal_delivery::provision::retire(&insp.js, &insp.names, bob.principal(), bob.lifecycle_uid())
        .await
        .expect("retire bob");
    let next = send(&alice).await;
    let why = refused("retired bob", bob.anycast_take(next, &created, 1).await);
    assert!(
        why.contains(&format!(
            "local.bob does not serve @review (its lifecycle {} is retired)",
            bob.lifecycle_uid()
        )),
        "{why}"
    );
    assert!(row(&insp, &created, next).await.is_none());
    s::stop_daemon(&mut d).await;
}

/// The role durable grants, on the broker: bob (`@review`) binds `svc_review`, pulls a
/// request and acks it (it leaves the queue); he cannot read, pull from or ack on the
/// `@deploy` durable, create any consumer on `TASK_<s>` (ephemeral, named or durable) or
/// delete his role's durable. Alice, who serves no role, cannot bind `svc_review`. The task
/// stream still holds exactly the two durables the operator made.
///
/// Mutation seen failing: the agent's role grants widened to `consumer_info_any` /
/// `consumer_next_any` on `TASK_<s>` (bob's INFO of `svc_deploy` was not denied).
#[tokio::test]
async fn role_durable_grants_are_confined() {
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let names: &SpaceNames = &insp.names;
    let (alice, bob, _carol) = three(&mesh, &insp).await;
    // Another role's durable, as the provisioner makes it for its holders.
    let deploy = cotal_delivery::wire::Role::parse("deploy").unwrap();
    cotal_delivery::provision::create_role_consumer(&insp.js, names, &deploy)
        .await
        .expect("svc_deploy");
    let seq = send(&alice).await;
    let q = bob.role_queue(ROLE).await.expect("bob binds svc_review");
    let copy = next_copy(&q).await;
    assert_eq!(copy.info().unwrap().stream_sequence, seq);
    copy.double_ack()
        .await
        .expect("bob acks his role's request");
    assert!(
        !queued(&insp, seq).await,
        "the acked request left the queue"
    );

    let e = alice
        .role_queue(ROLE)
        .await
        .expect_err("alice serves no role");
    assert_eq!(e.kind(), AgentErrorKind::Broker, "{}", e.detail());
    assert!(
        e.detail()
            .ends_with("the broker denied it (this credential does not serve @review)"),
        "{}",
        e.detail()
    );

    let bob_m = agent::provision_holder(&mesh, &insp, mesh.space(), "bob", &["general"], &[ROLE])
        .await
        .unwrap();
    let (bc, mut bevents) = mesh
        .connect_watched(&bob_m.credential, "bob-raw")
        .await
        .unwrap();
    let task = names.task_stream();
    for subject in [
        format!("$JS.API.CONSUMER.INFO.{task}.svc_deploy"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{task}.svc_deploy"),
        format!("$JS.ACK.{task}.svc_deploy.1.1.1.1.1"),
        format!("$JS.API.CONSUMER.CREATE.{task}"),
        format!(
            "$JS.API.CONSUMER.CREATE.{task}.peek.{}",
            names.task_role_filter(&deploy)
        ),
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{task}.peek"),
        format!("$JS.API.CONSUMER.DELETE.{task}.svc_review"),
    ] {
        bc.publish(subject.clone(), "{}".into()).await.unwrap();
        expect_denied(&mut bevents, "Publish", &subject).await;
    }
    let mut consumers: Vec<String> = insp
        .js
        .get_stream(task.clone())
        .await
        .unwrap()
        .consumer_names()
        .map(|n| n.expect("consumer name"))
        .collect()
        .await;
    consumers.sort();
    assert_eq!(consumers, vec!["svc_deploy", "svc_review"]);
}

/// The other two cases of a holder whose takes cannot be recorded, each told apart on
/// the broker: a seat minted before takes (its credential lacks the take subject, so the broker
/// denies the publish) and a daemon whose credential predates takes (it serves delivery and
/// answers the liveness probe `bound`, but no take rail is reachable). Both answer "restart the
/// daemon or respawn the seat", at once rather than after the request timeout; neither writes
/// a row.
///
/// Mutations seen failing: the broker-denial watch removed from `anycast_take` (the old seat's
/// take timed out instead); the probe's verdict ignored (the daemon case said "no delivery
/// daemon is answering").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_says_to_restart_the_daemon_or_respawn_the_seat_when_either_predates_takes() {
    use cotal_delivery::agent::PREDATES_FIX;
    use cotal_delivery::provision::{MintOptions, Profile, ReadChannels, Roles};
    let mesh = s::mesh_with_lease_ttl(LEASE_TTL).await;
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let no_take = |p: &mut cotal_delivery::provision::Permissions| {
        p.pub_allow.retain(|s| !s.contains(".ctl.anycast."));
        p.sub_allow.retain(|s| !s.contains(".ctl.anycast."));
    };
    // A daemon whose delivery credential was minted before takes.
    let creds_path = mesh.workspace().delivery_creds_path(mesh.space());
    let current = cotal_delivery::base::read_creds_file(&creds_path).unwrap();
    let old_daemon = mesh
        .authority
        .mint_narrowed(
            mesh.space(),
            &Profile::Delivery,
            MintOptions::new(),
            no_take,
        )
        .unwrap();
    cotal_delivery::base::write_creds_file_atomic(&creds_path, &old_daemon).unwrap();
    let mut d = crate::support::start_when_free(s::daemon_spec(&mesh)).await;
    let (alice, bob, _carol) = three(&mesh, &insp).await;
    let created = bob.task_created().await.unwrap();
    let seq = send(&alice).await;
    let started = Instant::now();
    let e = bob.anycast_take(seq, &created, 1).await.unwrap_err();
    assert_eq!(e.kind(), AgentErrorKind::NoResponders, "{}", e.detail());
    assert!(
        e.detail().starts_with(
            "anycast: the delivery daemon serving this space does not answer takes on"
        ) && e.detail().ends_with(PREDATES_FIX),
        "{}",
        e.detail()
    );
    assert!(started.elapsed() < Duration::from_secs(4), "at once");
    assert!(row(&insp, &created, seq).await.is_none());
    s::stop_daemon(&mut d).await;

    // A seat minted before takes, against a daemon that records them.
    cotal_delivery::base::write_creds_file_atomic(&creds_path, &current).unwrap();
    let mut d = crate::support::start_when_free(s::daemon_spec(&mesh)).await;
    let mut seat =
        agent::provision_holder(&mesh, &insp, mesh.space(), "dave", &["general"], &[ROLE])
            .await
            .unwrap();
    seat.credential = mesh
        .authority
        .mint_narrowed(
            mesh.space(),
            &Profile::Agent {
                principal: seat.principal.clone(),
                lifecycle_uid: seat.lifecycle_uid.clone(),
                read: ReadChannels::new(["general"]).unwrap(),
                roles: Roles::new([ROLE]).unwrap(),
            },
            MintOptions::new(),
            no_take,
        )
        .unwrap();
    let dave = agent::connect(&mesh, &seat, "dave").await.unwrap();
    let started = Instant::now();
    let e = dave.anycast_take(seq, &created, 1).await.unwrap_err();
    assert_eq!(e.kind(), AgentErrorKind::Broker, "{}", e.detail());
    assert_eq!(
        e.detail(),
        format!(
            "anycast: the broker denied this seat's take subject {}: its credential predates takes, so role requests wait on the queue; {PREDATES_FIX}",
            insp.names.ctl_subject(CtlService::Anycast, dave.principal())
        )
    );
    assert!(started.elapsed() < Duration::from_secs(4), "at once");
    assert!(row(&insp, &created, seq).await.is_none());
    // The same request is taken by a seat minted with takes.
    assert_eq!(
        bob.anycast_take(seq, &created, 1).await.unwrap()["took"],
        "taken"
    );
    s::stop_daemon(&mut d).await;
}
