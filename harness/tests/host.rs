//! The multi-space host (`deliver --spaces`) and standby hosts, against a real broker: the
//! manifest refusal, a lane refused alone and retried, lane isolation, a standby's held-lease
//! report (once), the takeover after the holder's death, and a returning host that leaves the
//! new holder's row alone. Every claim about the lease is read from the broker.

use std::path::Path;
use std::time::Duration;

use async_nats::jetstream::kv::Operation;
use cotal_delivery::creds::read_creds_file;
use cotal_delivery::provision::layout::Workspace;
use cotal_delivery::provision::manifest::{manifest_path, Manifest};
use cotal_delivery::provision::standby::{prepare_standby_hosts, StandbyPlan};
use cotal_delivery::space::lease::LeaseInfo;
use cotal_delivery::wire::{Principal, Space, LEASE_KEY};
use delivery_harness::daemon::Daemon;
use delivery_harness::mesh::{Inspector, Mesh};
use delivery_harness::scenario::normalise;
use futures::StreamExt;

const BOUND: Duration = Duration::from_secs(30);
/// The standby retry the tests run with (the seeds' 5 s shrunk through its override).
const RETRY_MS: &str = "500";

fn holder_of(root: &Path, space: &Space) -> String {
    let cred = read_creds_file(&Workspace::new(root).delivery_creds_path(space)).expect("creds");
    Principal::for_nkey(&cred.public_key().expect("nkey"))
        .expect("principal")
        .dot_form()
}

/// The lines of one lane (its `lane <space>: ` prefix removed), in order, without its side
/// components' lines (timer writer, membership feed: their own tests judge them).
fn lane_lines(d: &Daemon, space: &str) -> Vec<String> {
    let prefix = format!("lane {space}: ");
    d.lines()
        .iter()
        .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        .filter(|l| !delivery_harness::daemon::is_component_line(l))
        .collect()
}

/// Every write to the lease key from now on, as (operation, holder, incarnation).
async fn lease_history(
    insp: &Inspector,
) -> impl futures::Stream<Item = (Operation, Option<LeaseInfo>)> {
    let kv = insp
        .js
        .get_key_value(insp.names().delivery_bucket())
        .await
        .expect("lease bucket");
    let watch = kv.watch(LEASE_KEY).await.expect("watch");
    watch.filter_map(|e| async move {
        let e = e.ok()?;
        let info = serde_json::from_slice::<LeaseInfo>(&e.value).ok();
        Some((e.operation, info))
    })
}

async fn wait_row<F: Fn(&Option<LeaseInfo>) -> bool>(insp: &Inspector, what: &str, ok: F) {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let row = insp.lease().await.expect("read").map(|r| r.info);
        if ok(&row) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the lease row is {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A malformed manifest refuses the whole start, naming the file and the fault, before any
/// dial: no lane line, no `$SYS` admission (which needs the broker), no lease row.
/// Mutation named, not yet applied: spawning the lanes before `Manifest::read` (the valid
/// space's lane would dial and write its row; the admission line would appear).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_manifest_refuses_the_whole_start_before_any_dial() {
    let mesh = Mesh::builder()
        .space("alpha")
        .expect("space")
        .start()
        .await
        .expect("mesh");
    let insp = mesh.inspector(mesh.space()).await.expect("inspector");
    let path = manifest_path(mesh.root());
    let cases = [
        ("syntax", "{\"version\": 1, \"spaces\": [\"alpha\""),
        ("version", r#"{"version": 2, "spaces": ["alpha"]}"#),
        (
            "unknown_field",
            r#"{"version": 1, "spaces": ["alpha"], "creds": "alpha.creds"}"#,
        ),
        (
            "duplicate",
            r#"{"version": 1, "spaces": ["alpha", "alpha"]}"#,
        ),
        (
            "invalid_token",
            r#"{"version": 1, "spaces": ["alpha", "no.dots"]}"#,
        ),
    ];
    let mut transcript = String::new();
    for (name, text) in cases {
        std::fs::write(&path, text).expect("manifest");
        let mut d = mesh.host(mesh.root()).spawn().expect("spawn");
        let status = d.wait_exit(BOUND).await.expect("exits");
        assert_eq!(status.code(), Some(3), "{name}: {}", d.transcript());
        assert!(!d.has_line("$SYS sweeps bound"), "{name}: dialed");
        assert!(!d.has_line("lane alpha:"), "{name}: a lane ran");
        assert!(insp.lease().await.expect("read").is_none(), "{name}: row");
        transcript.push_str(&format!("[{name}]\n{}\n", d.transcript()));
    }
    insta::assert_snapshot!(
        "malformed_manifest",
        normalise(&transcript, mesh.root(), mesh.root())
    );
}

/// One lane with an invalid credential refuses alone (a line naming the space and the reason,
/// once although retried), the other lane serves, and the refused lane opens once the root
/// holds a valid credential again. Then lane isolation: the served lane's lease is taken by a
/// foreign row; that lane closes and stands by, the other keeps answering `ctl.delivery`.
/// SIGTERM closes every lane (each releases its own row), removes the host record, exits 0.
/// Mutations seen failing: `attempt.release()` instead of `discard()` on a repeated refusal
/// (the lane's own refusal line repeats per retry: snapshot `invalid_lane_beta` differs); a
/// closed lane not reopened (`return` after the close line in `host/lane.rs`: alpha never
/// stands by); no `r.remove()` of the host record (the record-removed assertion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_lane_refuses_alone_is_retried_and_lanes_close_alone() {
    let mesh = Mesh::builder()
        .space("alpha")
        .expect("space")
        .space("beta")
        .expect("space")
        .start()
        .await
        .expect("mesh");
    let (alpha, beta) = (mesh.spaces()[0].clone(), mesh.spaces()[1].clone());
    let ins_a = mesh.inspector(&alpha).await.expect("inspector");
    let ins_b = mesh.inspector(&beta).await.expect("inspector");
    Manifest {
        spaces: vec![alpha.clone(), beta.clone()],
    }
    .write(mesh.root())
    .expect("manifest");
    let beta_creds = Workspace::new(mesh.root()).delivery_creds_path(&beta);
    let good = std::fs::read(&beta_creds).expect("creds");
    std::fs::write(&beta_creds, "not a credential").expect("corrupt");

    let mut host = mesh
        .host(mesh.root())
        .env("COTAL_DELIVERY_STANDBY_RETRY_MS", RETRY_MS)
        .env("COTAL_DELIVERY_LANE_BACKOFF_MAX_MS", "1000")
        .spawn()
        .expect("spawn");
    host.wait_for_line("lane alpha: ✓ delivery daemon up", BOUND)
        .await
        .expect("alpha serves");
    host.wait_for_line("lane beta: ✗ delivery host: the lane refused", BOUND)
        .await
        .expect("beta refused");
    // Let several retries of beta happen: each one is refused the same way.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert!(
        ins_b.lease().await.expect("read").is_none(),
        "beta never touched its lease"
    );
    let refused_lines = lane_lines(&host, "beta")
        .iter()
        .filter(|l| l.contains("the lane refused"))
        .count();
    assert_eq!(refused_lines, 1, "{}", host.transcript());
    let status = cotal_delivery::host::host_liveness(mesh.root());
    assert!(
        matches!(status, cotal_delivery::files::PidLiveness::Alive(p) if p == host.pid()),
        "{status:?}"
    );

    std::fs::write(&beta_creds, good).expect("restore");
    host.wait_for_line("lane beta: ✓ delivery daemon up", BOUND)
        .await
        .expect("beta opens on a retry");
    wait_row(&ins_b, "beta holds", |r| {
        r.as_ref().is_some_and(|i| i.ready)
    })
    .await;

    // Isolation: alpha's lease taken by a foreign holder; beta keeps answering.
    let beta_agent_material =
        delivery_harness::agent::provision(&mesh, &ins_b, &beta, "dave", &["general"])
            .await
            .expect("agent");
    let beta_agent = delivery_harness::agent::connect(&mesh, &beta_agent_material, "dave")
        .await
        .expect("connect");
    beta_agent.list_memberships().await.expect("beta answers");
    let foreign = LeaseInfo {
        holder: "local.UFOREIGNHOLDER".into(),
        since: 1,
        ready: true,
        incarnation: "f".repeat(32),
    };
    ins_a.put_lease(&foreign).await.expect("take alpha's lease");
    host.wait_for_line("lane alpha: • delivery host: standing by", BOUND)
        .await
        .expect("alpha stands by");
    beta_agent
        .list_memberships()
        .await
        .expect("beta still answers");
    assert!(
        !lane_lines(&host, "beta")
            .iter()
            .any(|l| l.contains("closed")),
        "{}",
        host.transcript()
    );
    let row_a = ins_a.lease().await.expect("read").expect("row");
    assert_eq!(
        row_a.info, foreign,
        "the standby never rewrote the foreign row"
    );

    host.terminate().expect("SIGTERM");
    let status = host.wait_exit(BOUND).await.expect("exits");
    assert_eq!(status.code(), Some(0), "{}", host.transcript());
    assert!(
        ins_b.lease().await.expect("read").is_none(),
        "beta released"
    );
    assert_eq!(
        ins_a.lease().await.expect("read").map(|r| r.info),
        Some(foreign),
        "alpha's foreign row untouched by the stop"
    );
    assert!(!cotal_delivery::host::host_pid_path(mesh.root()).exists());
    let beta_log: Vec<String> = lane_lines(&host, "beta");
    insta::assert_snapshot!(
        "invalid_lane_beta",
        normalise(&beta_log.join("\n"), mesh.root(), mesh.root())
    );
    let alpha_log: Vec<String> = lane_lines(&host, "alpha");
    insta::assert_snapshot!(
        "isolated_lane_alpha",
        normalise(&alpha_log.join("\n"), mesh.root(), mesh.root())
    );
}

/// Two standby hosts for one space: B reports the held lease once (naming A) while retrying;
/// A is SIGKILLed, its row expires with the bucket TTL and B takes over; A returns, reports B
/// as the holder, and never writes the key (every write on it from A's return to B's release
/// is B's); a third host whose credential is another account's, and a fourth lacking the `$SYS`
/// observer, refuse on their own checks without a write on the key.
/// Mutations seen failing: releasing a repeated attempt's lines (`attempt.release()` instead of
/// `discard()`: the daemon's held-lease line repeats per retry, snapshot `standby_b` differs).
/// Named, not yet applied: deleting a held row in the claim path (A's return would show a
/// delete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_after_the_ttl_and_a_returning_host_leaves_the_row() {
    let ttl = Duration::from_secs(3);
    let mesh = Mesh::builder()
        .space("alpha")
        .expect("space")
        .space("other")
        .expect("space")
        .lease_ttl(ttl)
        .start()
        .await
        .expect("mesh");
    let space = mesh.space().clone();
    let other = mesh.spaces()[1].clone();
    let insp = mesh.inspector(&space).await.expect("inspector");
    let roots: Vec<tempfile::TempDir> =
        (0..4).map(|_| tempfile::tempdir().expect("root")).collect();
    let paths: Vec<&Path> = roots.iter().map(|r| r.path()).collect();
    prepare_standby_hosts(
        &mesh.authority,
        &StandbyPlan::new(vec![space.clone()]),
        &paths,
    )
    .expect("provision");
    let (a_root, b_root) = (paths[0], paths[1]);
    let (a_holder, b_holder) = (holder_of(a_root, &space), holder_of(b_root, &space));
    assert_ne!(a_holder, b_holder);
    let spawn = |root: &Path| {
        mesh.host(root)
            .env("COTAL_DELIVERY_STANDBY_RETRY_MS", RETRY_MS)
            .spawn()
            .expect("spawn")
    };

    let mut a = spawn(a_root);
    a.wait_for_line("lane alpha: ✓ delivery daemon up", BOUND)
        .await
        .expect("A serves");
    let mut b = spawn(b_root);
    let held = b
        .wait_for_line("lane alpha: • delivery host: standing by", BOUND)
        .await
        .expect("B stands by");
    assert!(held.contains(&a_holder), "{held}");

    // Hosts that cannot be the space's daemon refuse on their own checks: no write on the key.
    let mut history = Box::pin(lease_history(&insp).await);
    let wrong = Workspace::new(paths[2]);
    let other_cred = mesh
        .mint(
            &other,
            &cotal_delivery::provision::Profile::Delivery,
            Default::default(),
        )
        .expect("mint");
    cotal_delivery::creds::write_creds_file_atomic(&wrong.delivery_creds_path(&space), &other_cred)
        .expect("write");
    std::fs::remove_file(Workspace::new(paths[3]).membership_observer_creds_path(&space))
        .expect("remove observer");
    let mut c = spawn(paths[2]);
    let mut d = spawn(paths[3]);
    c.wait_for_line("lane alpha: ✗ delivery host: the lane refused", BOUND)
        .await
        .expect("C refused");
    d.wait_for_line("lane alpha: ✗ delivery host: the lane refused", BOUND)
        .await
        .expect("D refused");
    assert!(c.has_line("belongs to account"), "{}", c.transcript());
    // Several standby retries of B pass (A renews meanwhile).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    for h in [&mut c, &mut d] {
        h.terminate().expect("SIGTERM");
        assert_eq!(h.wait_exit(BOUND).await.expect("exit").code(), Some(0));
    }

    // A dies without a word: its row expires with the TTL and B takes it on a retry.
    a.kill().expect("SIGKILL");
    a.wait_exit(BOUND).await.expect("A gone");
    b.wait_for_line("lane alpha: ✓ delivery daemon up", BOUND)
        .await
        .expect("B takes over");
    wait_row(&insp, "B holds", |r| {
        r.as_ref().is_some_and(|i| i.holder == b_holder && i.ready)
    })
    .await;
    let reports = lane_lines(&b, "alpha")
        .iter()
        .filter(|l| l.contains("standing by"))
        .count();
    assert_eq!(reports, 1, "held lease reported once:\n{}", b.transcript());
    // Until B's takeover, every write was A's renewal, a delete/expiry, or B's claim.
    let b_row = insp.lease().await.expect("read").expect("row");

    // A returns: it stands by for B and never writes.
    let mut a2 = spawn(a_root);
    let held = a2
        .wait_for_line("lane alpha: • delivery host: standing by", BOUND)
        .await
        .expect("A stands by");
    assert!(held.contains(&b_holder), "{held}");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    a2.terminate().expect("SIGTERM");
    assert_eq!(a2.wait_exit(BOUND).await.expect("exit").code(), Some(0));
    let row = insp.lease().await.expect("read").expect("row");
    assert_eq!(
        (row.info.holder.as_str(), row.info.incarnation.as_str()),
        (b_holder.as_str(), b_row.info.incarnation.as_str()),
        "B's row stays B's"
    );
    b.terminate().expect("SIGTERM");
    assert_eq!(b.wait_exit(BOUND).await.expect("exit").code(), Some(0));
    assert!(insp.lease().await.expect("read").is_none(), "B released");

    // Every write on the key since C and D started: A's renewals, A's expiry, B's claim,
    // renewals and release. None by C, D or the returning A.
    let mut writes = Vec::new();
    while let Ok(Some(w)) = tokio::time::timeout(Duration::from_millis(300), history.next()).await {
        writes.push(w);
    }
    let mut b_incarnations = std::collections::BTreeSet::new();
    for (op, info) in &writes {
        if let (Operation::Put, Some(info)) = (op, info) {
            assert!(
                info.holder == a_holder || info.holder == b_holder,
                "a write by {}",
                info.holder
            );
            if info.holder == b_holder {
                b_incarnations.insert(info.incarnation.clone());
            }
        }
    }
    assert_eq!(
        b_incarnations.len(),
        1,
        "one B incarnation wrote: {writes:?}"
    );
    let first_b = writes
        .iter()
        .position(|(op, i)| {
            *op == Operation::Put && i.as_ref().is_some_and(|i| i.holder == b_holder)
        })
        .expect("B wrote");
    assert!(
        !writes[first_b..].iter().any(
            |(op, i)| *op == Operation::Put && i.as_ref().is_some_and(|i| i.holder == a_holder)
        ),
        "the returning A wrote after B's takeover: {writes:?}"
    );
    let deletes_after = writes[first_b..]
        .iter()
        .filter(|(op, _)| *op != Operation::Put)
        .count();
    assert_eq!(deletes_after, 1, "only B's own release deletes: {writes:?}");
    insta::assert_snapshot!(
        "standby_b",
        normalise(&lane_lines(&b, "alpha").join("\n"), b_root, b_root)
    );
    insta::assert_snapshot!(
        "returning_a",
        normalise(&lane_lines(&a2, "alpha").join("\n"), a_root, a_root)
    );
}

/// Whether the agent's `ctl.delivery` request is answered within 1 s.
async fn answers(p: &cotal_delivery::agent::Agent) -> bool {
    let args = serde_json::json!({"lifecycleUid": p.lifecycle_uid().as_str()});
    p.request("listMemberships", args, Duration::from_secs(1))
        .await
        .is_ok()
}

/// Runs `cotal-delivery status --spaces --root <root>`; returns (exit code, normalised stdout).
fn host_status(root: &Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(delivery_harness::daemon::daemon_bin().expect("bin"))
        .args(["status", "--spaces", "--root"])
        .arg(root)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code(), normalise(text.trim(), root, root))
}

/// Lane isolation on credential expiry, the not-provisioned refusal, and `status --spaces`.
/// Beta's credential expires while the host serves: beta's lane alone stops answering
/// `ctl.delivery` (its daemon reports the expiry and awaits a proved renewal from the host's
/// store, re-read every `COTAL_DELIVERY_REMINT_RETRY_MS`), and answers again once the root
/// holds the renewed credential (same nkey); alpha answers on every probe throughout (one every
/// 200 ms from before the expiry until beta is back) and writes no close or refusal line. Gamma is
/// provisioned on the broker but not in this root: its lane refuses with "not provisioned for
/// space gamma" and never touches the lease (gamma's foreign row keeps its revision and no
/// write reaches the key while the lane retries). `status --spaces` reports the running host
/// (exit 0) and, after SIGTERM, no record (exit 1); both outputs snapshotted.
/// Mutations seen failing: the `!dir.is_dir()` check of `host/lane.rs` removed (gamma's lane
/// is refused for its missing credential instead: the line differs); the renewal written for
/// a new nkey instead of `renewal_of` (beta's renewal is not proved: it never answers again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_lane_closes_alone_and_reopens_and_an_unprovisioned_lane_never_touches_the_lease(
) {
    let mesh = Mesh::builder()
        .space("alpha")
        .expect("space")
        .space("beta")
        .expect("space")
        .space("gamma")
        .expect("space")
        // Gamma's foreign row must outlive the test (it is never renewed).
        .lease_ttl(Duration::from_secs(300))
        .start()
        .await
        .expect("mesh");
    let (alpha, beta, gamma) = (
        mesh.spaces()[0].clone(),
        mesh.spaces()[1].clone(),
        mesh.spaces()[2].clone(),
    );
    let ins_a = mesh.inspector(&alpha).await.expect("inspector");
    let ins_b = mesh.inspector(&beta).await.expect("inspector");
    let ins_g = mesh.inspector(&gamma).await.expect("inspector");
    Manifest {
        spaces: vec![alpha.clone(), beta.clone(), gamma.clone()],
    }
    .write(mesh.root())
    .expect("manifest");
    let ws = Workspace::new(mesh.root());
    std::fs::remove_dir_all(ws.space_dir(&gamma)).expect("unprovision gamma here");
    let foreign = LeaseInfo {
        holder: "local.UFOREIGNHOLDER".into(),
        since: 1,
        ready: true,
        incarnation: "f".repeat(32),
    };
    let gamma_rev = ins_g
        .put_lease(&foreign)
        .await
        .expect("gamma's row elsewhere");
    let mut gamma_writes = Box::pin(lease_history(&ins_g).await);
    // The initial put is delivered first by the watch: skip it.
    let _ = tokio::time::timeout(BOUND, gamma_writes.next()).await;

    // Beta's credential expires a few seconds after the host opens it.
    let lifetime = Duration::from_secs(8);
    let short = mesh
        .mint(
            &beta,
            &cotal_delivery::provision::Profile::Delivery,
            cotal_delivery::provision::MintOptions::new().expires_in(lifetime),
        )
        .expect("mint");
    let minted = tokio::time::Instant::now();
    let beta_creds = ws.delivery_creds_path(&beta);
    cotal_delivery::creds::write_creds_file_atomic(&beta_creds, &short).expect("write");

    let mut host = mesh
        .host(mesh.root())
        .env("COTAL_DELIVERY_STANDBY_RETRY_MS", RETRY_MS)
        .env("COTAL_DELIVERY_LANE_BACKOFF_MAX_MS", "1000")
        .env("COTAL_DELIVERY_REMINT_RETRY_MS", "500")
        .spawn()
        .expect("spawn");
    for space in ["alpha", "beta"] {
        host.wait_for_line(&format!("lane {space}: ✓ delivery daemon up"), BOUND)
            .await
            .expect("lane serves");
    }
    host.wait_for_line(
        "lane gamma: ✗ delivery host: the lane refused (delivery: this host is not provisioned for space gamma",
        BOUND,
    )
    .await
    .expect("gamma refused");
    let (code, running) = host_status(mesh.root());
    assert_eq!(code, Some(0), "{running}");

    // Alpha probed every 200 ms until beta is back.
    let material = delivery_harness::agent::provision(&mesh, &ins_a, &alpha, "erin", &["general"])
        .await
        .expect("agent");
    let probe = delivery_harness::agent::connect(&mesh, &material, "erin")
        .await
        .expect("connect");
    probe.list_memberships().await.expect("alpha answers");
    let probing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let prober = {
        let probing = probing.clone();
        tokio::spawn(async move {
            let (mut ok, mut missed) = (0u32, Vec::new());
            while probing.load(std::sync::atomic::Ordering::SeqCst) {
                let args = serde_json::json!({"lifecycleUid": probe.lifecycle_uid().as_str()});
                match probe
                    .request("listMemberships", args, Duration::from_secs(2))
                    .await
                {
                    Ok(_) => ok += 1,
                    Err(e) => missed.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (ok, missed)
        })
    };

    // Beta stops answering once its credential has expired...
    let beta_material =
        delivery_harness::agent::provision(&mesh, &ins_b, &beta, "fred", &["general"])
            .await
            .expect("agent");
    let beta_probe = delivery_harness::agent::connect(&mesh, &beta_material, "fred")
        .await
        .expect("connect");
    let deadline = tokio::time::Instant::now() + BOUND;
    while answers(&beta_probe).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "beta kept answering past its expiry"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        minted.elapsed() >= lifetime - Duration::from_secs(1),
        "beta stopped answering before its credential expired"
    );
    host.wait_for_line("lane beta: ! delivery: credential expired", BOUND)
        .await
        .expect("beta reports its expiry");
    // ...and answers again once the host's store holds the renewal.
    let renewed = mesh
        .mint(
            &beta,
            &cotal_delivery::provision::Profile::Delivery,
            cotal_delivery::provision::MintOptions::new().renewal_of(&short),
        )
        .expect("renew");
    cotal_delivery::creds::write_creds_file_atomic(&beta_creds, &renewed).expect("replace");
    let deadline = tokio::time::Instant::now() + BOUND;
    while !answers(&beta_probe).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "beta did not answer again: {}",
            host.transcript()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    probing.store(false, std::sync::atomic::Ordering::SeqCst);
    let (ok, missed) = prober.await.expect("prober");
    assert!(ok >= 5, "alpha probed {ok} times");
    assert!(missed.is_empty(), "alpha missed {missed:?}");
    assert!(
        !lane_lines(&host, "alpha")
            .iter()
            .any(|l| l.contains("closed") || l.contains("refused")),
        "{}",
        host.transcript()
    );

    // Gamma never touched its lease while it retried.
    let row = ins_g.lease().await.expect("read").expect("row");
    assert_eq!((row.revision, &row.info), (gamma_rev, &foreign));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), gamma_writes.next())
            .await
            .is_err(),
        "a write reached gamma's key"
    );

    host.terminate().expect("SIGTERM");
    assert_eq!(host.wait_exit(BOUND).await.expect("exit").code(), Some(0));
    let (code, stopped) = host_status(mesh.root());
    assert_eq!(code, Some(1), "{stopped}");
    insta::assert_snapshot!("status_spaces", format!("{running}\n{stopped}"));
    insta::assert_snapshot!(
        "unprovisioned_lane_gamma",
        normalise(
            &lane_lines(&host, "gamma").join("\n"),
            mesh.root(),
            mesh.root()
        )
    );
}
