//! The multi-space host (`deliver --spaces`) and standby hosts, against a real broker: the
//! manifest refusal, a lane refused alone and retried, lane isolation, a standby's held-lease
//! report (once), the takeover after the holder's death, and a returning host that leaves the
//! new holder's row alone. Every claim about the lease is read from the broker.

mod lanes;
mod service;
mod signals;
mod standby;
mod status;

use std::path::Path;
use std::time::Duration;

use crate::support::host::{
    drain, foreign_row, holder_of, lane_lines, lane_lines_without_wakes, lease_history, wait_row,
    without_not_running_report, HOST_BOUND, RETRY_MS,
};
use async_nats::jetstream::kv::Operation;
use cotal_delivery::provision::Workspace;
use cotal_delivery::provision::{manifest_path, Manifest};
use cotal_delivery::provision::{prepare_standby_hosts, StandbyPlan};
use delivery_harness::mesh::Mesh;
use delivery_harness::scenario::{normalise, normalise_status};
use futures::StreamExt;

/// A malformed manifest refuses the whole start, naming the file and the fault, before any
/// dial: no lane line, no `$SYS` admission (which needs the broker), no lease row, and no
/// lane's log file (a lane's first act is opening it).
/// Mutation seen failing (4 runs of 4): the lanes spawned from a lenient parse of the file
/// before `Manifest::read` in `host/spaces.rs`. The refusal ends the process before such a lane
/// dials, so the admission, lane-line and row checks alone passed under it; the log-file check
/// is what catches it ("version: a lane opened its log" or "unknown_field: …").
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
        let status = d.wait_exit(HOST_BOUND).await.expect("exits");
        assert_eq!(status.code(), Some(3), "{name}: {}", d.transcript());
        assert!(!d.has_line("$SYS sweeps bound"), "{name}: dialed");
        assert!(!d.has_line("lane alpha:"), "{name}: a lane ran");
        assert!(insp.lease().await.expect("read").is_none(), "{name}: row");
        // A lane's first act is opening its space's log: no lane ran, not even briefly.
        assert!(
            !cotal_delivery::base::log_path(mesh.root(), mesh.space()).exists(),
            "{name}: a lane opened its log"
        );
        transcript.push_str(&format!("[{name}]\n{}\n", d.transcript()));
    }
    crate::support::snapshot_base().bind(|| {
        insta::assert_snapshot!(
            "host__malformed_manifest",
            normalise(&transcript, mesh.root(), mesh.root())
        )
    });
}

/// One lane with an invalid credential refuses alone (a line naming the space and the reason,
/// once although retried), the other lane serves, and the refused lane opens once the root
/// holds a valid credential again. Then lane isolation: the served lane's lease is taken by a
/// foreign row; that lane closes and stands by, the other keeps answering `ctl.delivery`.
/// SIGTERM closes every lane (each releases its own row), removes the host record, exits 0.
/// While both lanes serve, neither space's `.cotal/delivery.<key>.pid` exists (a lane writes
/// no record; the host's own record is there).
/// Mutations seen failing: a lane writing the space's pid record on its lease like `deliver
/// --space` does (`on_lease_won` set in `host/lane.rs`: the record of alpha exists);
/// `attempt.release()` instead of `discard()` on a repeated refusal
/// (the lane's own refusal line repeats per retry: snapshot `invalid_lane_beta` differs); a
/// closed lane not reopened (`return` after the close line in `host/lane.rs`: alpha never
/// stands by); no `r.remove()` of the host record (the record-removed assertion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_lane_refuses_alone_is_retried_and_lanes_close_alone() {
    let mesh = Mesh::alpha_beta().await.expect("mesh");
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
    host.wait_for_line("lane alpha: ✓ delivery daemon up", HOST_BOUND)
        .await
        .expect("alpha serves");
    host.wait_for_line("lane beta: ✗ delivery host: the lane refused", HOST_BOUND)
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
        matches!(status, cotal_delivery::base::PidLiveness::Alive(p) if p == host.pid()),
        "{status:?}"
    );

    std::fs::write(&beta_creds, good).expect("restore");
    host.wait_for_line("lane beta: ✓ delivery daemon up", HOST_BOUND)
        .await
        .expect("beta opens on a retry");
    wait_row(&ins_b, "beta holds", |r| {
        r.as_ref().is_some_and(|i| i.ready)
    })
    .await;
    // Both lanes serve, and neither wrote the space's pid record: that record is what
    // `down` signals for one space, and this process serves several (the host has its own).
    for space in [&alpha, &beta] {
        let record = cotal_delivery::base::pid_path(mesh.root(), space);
        assert!(!record.exists(), "lane {space} wrote {}", record.display());
    }
    assert!(cotal_delivery::host::host_pid_path(mesh.root()).exists());

    // Isolation: alpha's lease taken by a foreign holder; beta keeps answering.
    let beta_agent_material =
        delivery_harness::agent::provision(&mesh, &ins_b, &beta, "dave", &["general"])
            .await
            .expect("agent");
    let beta_agent = delivery_harness::agent::connect(&mesh, &beta_agent_material, "dave")
        .await
        .expect("connect");
    beta_agent.list_memberships().await.expect("beta answers");
    let foreign = foreign_row();
    ins_a.put_lease(&foreign).await.expect("take alpha's lease");
    host.wait_for_line("lane alpha: • delivery host: standing by", HOST_BOUND)
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
    let status = host.wait_exit(HOST_BOUND).await.expect("exits");
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
    crate::support::snapshot_base().bind(|| {
        insta::assert_snapshot!(
            "host__invalid_lane_beta",
            normalise(&beta_log.join("\n"), mesh.root(), mesh.root())
        )
    });
    let alpha_log: Vec<String> = lane_lines(&host, "alpha");
    crate::support::snapshot_base().bind(|| {
        insta::assert_snapshot!(
            "host__isolated_lane_alpha",
            normalise(&alpha_log.join("\n"), mesh.root(), mesh.root())
        )
    });
}

/// Two standby hosts for one space: B reports the held lease once (naming A) while retrying;
/// A is SIGKILLed, its row expires with the bucket TTL and B takes over; A returns, reports B
/// as the holder, and never writes the key (every write on it from A's return to B's release
/// is B's); a third host whose credential is another account's, and a fourth lacking the `$SYS`
/// observer, refuse on their own checks without a write on the key.
/// Mutations seen failing: releasing a repeated attempt's lines (`attempt.release()` instead of
/// `discard()`: the daemon's held-lease line repeats per retry, snapshot `standby_b` differs);
/// deleting a held row in the claim path (`Lease::claim` deleting the row its create found:
/// already B's first standby deletes A's row, and B's held-lease line names no holder).
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
    a.wait_for_line("lane alpha: ✓ delivery daemon up", HOST_BOUND)
        .await
        .expect("A serves");
    let mut b = spawn(b_root);
    let held = b
        .wait_for_line("lane alpha: • delivery host: standing by", HOST_BOUND)
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
    cotal_delivery::base::write_creds_file_atomic(&wrong.delivery_creds_path(&space), &other_cred)
        .expect("write");
    std::fs::remove_file(Workspace::new(paths[3]).membership_observer_creds_path(&space))
        .expect("remove observer");
    let mut c = spawn(paths[2]);
    let mut d = spawn(paths[3]);
    c.wait_for_line("lane alpha: ✗ delivery host: the lane refused", HOST_BOUND)
        .await
        .expect("C refused");
    d.wait_for_line("lane alpha: ✗ delivery host: the lane refused", HOST_BOUND)
        .await
        .expect("D refused");
    assert!(c.has_line("belongs to account"), "{}", c.transcript());
    // Several standby retries of B pass (A renews meanwhile).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    for h in [&mut c, &mut d] {
        h.terminate().expect("SIGTERM");
        assert_eq!(h.wait_exit(HOST_BOUND).await.expect("exit").code(), Some(0));
    }

    // A dies without a word: its row expires with the TTL and B takes it on a retry.
    a.kill().expect("SIGKILL");
    a.wait_exit(HOST_BOUND).await.expect("A gone");
    b.wait_for_line("lane alpha: ✓ delivery daemon up", HOST_BOUND)
        .await
        .expect("B takes over");
    wait_row(&insp, "B holds", |r| {
        r.as_ref().is_some_and(|i| i.holder == b_holder && i.ready)
    })
    .await;
    let count = |needle: &str| {
        lane_lines(&b, "alpha")
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    };
    let live = count("standing by — the lease is held by");
    assert_eq!(live, 1, "held lease reported once:\n{}", b.transcript());
    // Between A's death and its row's expiry, a retry may meet the row of a holder that is not
    // running: that outcome is reported once too.
    let gone = count("standing by — the lease row is held by");
    println!("RACE: B met A's row with A not running {gone} time(s) before it expired");
    assert!(gone <= 1, "reported once:\n{}", b.transcript());
    // Until B's takeover, every write was A's renewal, a delete/expiry, or B's claim.
    let b_row = insp.lease().await.expect("read").expect("row");

    // A returns: it stands by for B and never writes.
    let mut a2 = spawn(a_root);
    let held = a2
        .wait_for_line("lane alpha: • delivery host: standing by", HOST_BOUND)
        .await
        .expect("A stands by");
    assert!(held.contains(&b_holder), "{held}");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    a2.terminate().expect("SIGTERM");
    assert_eq!(
        a2.wait_exit(HOST_BOUND).await.expect("exit").code(),
        Some(0)
    );
    let row = insp.lease().await.expect("read").expect("row");
    assert_eq!(
        (row.info.holder.as_str(), row.info.incarnation.as_str()),
        (b_holder.as_str(), b_row.info.incarnation.as_str()),
        "B's row stays B's"
    );
    b.terminate().expect("SIGTERM");
    assert_eq!(b.wait_exit(HOST_BOUND).await.expect("exit").code(), Some(0));
    assert!(insp.lease().await.expect("read").is_none(), "B released");

    // Every write on the key since C and D started: A's renewals, A's expiry, B's claim,
    // renewals and release. None by C, D or the returning A.
    let writes = drain(&mut history).await;
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
    // The attempt that met A's row after A's death (when there was one) is judged above; the
    // snapshot is the rest, the same either way.
    let mut b_lines = lane_lines_without_wakes(&b, "alpha");
    without_not_running_report(&mut b_lines);
    crate::support::snapshot_base().bind(|| {
        insta::assert_snapshot!(
            "host__standby_b",
            normalise(&b_lines.join("\n"), b_root, b_root)
        )
    });
    crate::support::snapshot_base().bind(|| {
        insta::assert_snapshot!(
            "host__returning_a",
            normalise(&lane_lines(&a2, "alpha").join("\n"), a_root, a_root)
        )
    });
}

/// Runs `cotal-delivery status --spaces --root <root>`; returns (exit code, normalised stdout).
fn host_status(root: &Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(delivery_harness::daemon::daemon_bin().expect("bin"))
        .args(["status", "--spaces", "--root"])
        .arg(root)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code(), normalise_status(text.trim(), root))
}

/// The not-provisioned refusal and `status --spaces`. Gamma is provisioned on the broker but
/// not in this root: its lane refuses with "not provisioned for space gamma" and never touches
/// the lease (gamma's foreign row keeps its revision and no write reaches the key while the lane
/// retries), while alpha serves. `status --spaces` reports the running host (exit 0) and, after
/// SIGTERM, no record (exit 1); both outputs snapshotted. (A lane's credential expiring while it
/// serves: `host_lanes.rs`.)
/// Mutation seen failing: the `!dir.is_dir()` check of `host/lane.rs` removed (gamma's lane
/// is refused for its missing credential instead: the line differs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprovisioned_lane_never_touches_the_lease_and_status_reads_the_host() {
    let mesh = Mesh::builder()
        .space("alpha")
        .expect("space")
        .space("gamma")
        .expect("space")
        // Gamma's foreign row must outlive the test (it is never renewed).
        .lease_ttl(Duration::from_secs(300))
        .start()
        .await
        .expect("mesh");
    let (alpha, gamma) = (mesh.spaces()[0].clone(), mesh.spaces()[1].clone());
    let ins_g = mesh.inspector(&gamma).await.expect("inspector");
    Manifest {
        spaces: vec![alpha.clone(), gamma.clone()],
    }
    .write(mesh.root())
    .expect("manifest");
    let ws = Workspace::new(mesh.root());
    std::fs::remove_dir_all(ws.space_dir(&gamma)).expect("unprovision gamma here");
    mesh.leave_for_status().expect("signer and mesh record");
    let foreign = foreign_row();
    let gamma_rev = ins_g
        .put_lease(&foreign)
        .await
        .expect("gamma's row elsewhere");
    let mut gamma_writes = Box::pin(lease_history(&ins_g).await);
    // The initial put is delivered first by the watch: skip it.
    let _ = tokio::time::timeout(HOST_BOUND, gamma_writes.next()).await;

    let mut host = mesh
        .host(mesh.root())
        .env("COTAL_DELIVERY_STANDBY_RETRY_MS", RETRY_MS)
        .env("COTAL_DELIVERY_LANE_BACKOFF_MAX_MS", "1000")
        .spawn()
        .expect("spawn");
    host.wait_for_line("lane alpha: ✓ delivery daemon up", HOST_BOUND)
        .await
        .expect("alpha serves");
    host.wait_for_line(
        "lane gamma: ✗ delivery host: the lane refused (delivery: this host is not provisioned for space gamma",
        HOST_BOUND,
    )
    .await
    .expect("gamma refused");
    let (code, running) = host_status(mesh.root());
    assert_eq!(code, Some(0), "{running}");
    // Several retries of gamma (500 ms, then every 1 s).
    tokio::time::sleep(Duration::from_millis(2_500)).await;

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
    assert_eq!(
        host.wait_exit(HOST_BOUND).await.expect("exit").code(),
        Some(0)
    );
    let (code, stopped) = host_status(mesh.root());
    assert_eq!(code, Some(1), "{stopped}");
    crate::support::snapshot_base()
        .bind(|| insta::assert_snapshot!("host__status_spaces", format!("{running}\n{stopped}")));
    crate::support::snapshot_base().bind(|| {
        insta::assert_snapshot!(
            "host__unprovisioned_lane_gamma",
            normalise(
                &lane_lines(&host, "gamma").join("\n"),
                mesh.root(),
                mesh.root()
            )
        )
    });
}
