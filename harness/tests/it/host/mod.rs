//! The multi-space host (`deliver --spaces`) and standby hosts, against a real broker: the
//! manifest refusal, a lane refused alone and retried, lane isolation, an unprovisioned lane and
//! `status --spaces`. Every claim about the lease is read from the broker. The standby host's
//! held-lease report, retry, takeover after the holder's death, graceful stop and returning
//! host are the `standby` cases of the kit (`cases/standby/`).

mod lanes;
mod service;
mod signals;
mod standby;
mod status;

use std::path::Path;
use std::time::Duration;

use crate::support::host::{
    foreign_row, lane_lines, lease_history, wait_row, HOST_BOUND, RETRY_MS,
};
use cotal_delivery::provision::Workspace;
use cotal_delivery::provision::{manifest_path, Manifest};
use delivery_harness::kit::transcript::normalise;
use delivery_harness::rig::mesh::Mesh;
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
    snapshot!(
        "host__malformed_manifest",
        transcript,
        &[(mesh.root(), "[ROOT]")]
    );
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

    let mut host = alpha_serving(&mesh).await;
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
        delivery_harness::rig::agent::provision(&mesh, &ins_b, &beta, "dave", &["general"])
            .await
            .expect("agent");
    let beta_agent = delivery_harness::rig::agent::connect(&mesh, &beta_agent_material, "dave")
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
    snapshot!(
        "host__invalid_lane_beta",
        beta_log.join("\n"),
        &[(mesh.root(), "[ROOT]")]
    );
    let alpha_log: Vec<String> = lane_lines(&host, "alpha");
    snapshot!(
        "host__isolated_lane_alpha",
        alpha_log.join("\n"),
        &[(mesh.root(), "[ROOT]")]
    );
}

/// The host of `mesh`'s root with the short standby retry and a 1 s lane backoff, started
/// once lane alpha serves (its other lanes are the test's to wait for).
async fn alpha_serving(mesh: &Mesh) -> delivery_harness::rig::daemon::Daemon {
    crate::support::start_host(
        mesh.host(mesh.root())
            .env("COTAL_DELIVERY_STANDBY_RETRY_MS", RETRY_MS)
            .env("COTAL_DELIVERY_LANE_BACKOFF_MAX_MS", "1000"),
        &["alpha"],
    )
    .await
}

/// Runs `cotal-delivery status --spaces --root <root>`; returns (exit code, normalised stdout).
fn host_status(root: &Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(delivery_harness::rig::daemon::daemon_bin().expect("bin"))
        .args(["status", "--spaces", "--root"])
        .arg(root)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (
        out.status.code(),
        normalise(text.trim(), &[(root, "[ROOT]")]),
    )
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

    let mut host = alpha_serving(&mesh).await;
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
    snapshot!(
        "host__unprovisioned_lane_gamma",
        lane_lines(&host, "gamma").join("\n"),
        &[(mesh.root(), "[ROOT]")]
    );
}
