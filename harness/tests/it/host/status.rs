//! `cotal-delivery status --spaces --root <dir> [--json]`, the multi-space host's status, on a
//! real host process and a real broker: its exit codes (0 a live host's record, 1 none or a
//! stale or foreign one, 3 no root or no readable manifest) and the `--json` report of every
//! space of the manifest, each checked on the broker (the lease row and whether this host holds
//! it, `ctl.delivery`). Human and JSON outputs are snapshotted.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use crate::support::host::HOST_BOUND;
use cotal_delivery::base::ENV_STANDBY_RETRY_MS;
use cotal_delivery::host::HOST_PID_FILE;
use cotal_delivery::provision::{manifest_path, Manifest};
use cotal_delivery::wire::LeaseInfo;
use delivery_harness::kit::transcript::{normalise, normalise_status_json};
use delivery_harness::rig::mesh::Mesh;
use serde_json::Value;

const FOREIGN: &str = "local.UFOREIGNHOLDER";

/// Runs `cotal-delivery status --spaces --root <root> [extra]`.
fn status(root: &Path, extra: &[&str]) -> Output {
    std::process::Command::new(delivery_harness::rig::daemon::daemon_bin().expect("bin"))
        .args(["status", "--spaces", "--root"])
        .arg(root)
        .args(extra)
        .output()
        .expect("status")
}

/// Exit code and the one JSON object `--json` printed.
fn status_json(root: &Path) -> (Option<i32>, Value) {
    let out = status(root, &["--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {text}"));
    (out.status.code(), v)
}

/// A live host serving alpha and standing by for beta (a foreign holder's row): `--json` says
/// so per space from the broker and exits 0; after SIGTERM exit 1 and alpha's row is gone while
/// beta's is still the foreign one; a stale and a foreign host record exit 1 with their
/// verdicts.
/// The human report (host line, then a block per space) is snapshotted running and with a stale
/// or foreign record.
/// Mutations seen failing: `running()` made always true (the stopped host's exit is 0, not 1);
/// the role's holder comparison inverted in `host/status.rs` (alpha reads `standby`, beta
/// `holder`); the per-space block built from every single-space line instead of
/// `check_lines()` (pid record and verdict appear: `status_spaces_stale_and_foreign` differs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_spaces_reports_each_space_and_exits_on_the_host_record() {
    let mesh = Mesh::builder()
        .space("alpha")
        .expect("space")
        .space("beta")
        .expect("space")
        // The foreign row on beta must outlive the test (it is never renewed).
        .lease_ttl(Duration::from_secs(300))
        .start()
        .await
        .expect("mesh");
    let (alpha, beta) = (mesh.spaces()[0].clone(), mesh.spaces()[1].clone());
    let root = mesh.root();
    // `status` finds the broker in .cotal/mesh.json and checks with a credential minted from
    // the root's signer, as on a mesh `up` prepared.
    mesh.leave_for_status().expect("signer and mesh record");
    Manifest {
        spaces: vec![alpha.clone(), beta.clone()],
    }
    .write(root)
    .expect("manifest");
    let ins_b = mesh.inspector(&beta).await.expect("inspector");
    let foreign = LeaseInfo {
        holder: FOREIGN.into(),
        since: 1,
        ready: true,
        incarnation: "f".repeat(32),
    };
    ins_b
        .put_lease(&foreign)
        .await
        .expect("beta's row elsewhere");

    let mut host =
        crate::support::start_host(mesh.host(root).env(ENV_STANDBY_RETRY_MS, "500"), &["alpha"])
            .await;
    host.wait_for_line("lane beta: • delivery host: standing by", HOST_BOUND)
        .await
        .expect("beta stands by");

    let (code, running) = status_json(root);
    assert_eq!(code, Some(0), "{running}");
    assert_eq!(running["running"], true, "{running}");
    assert_eq!(running["hostRecord"]["verdict"], "alive", "{running}");
    assert_eq!(running["hostRecord"]["pid"], host.pid(), "{running}");
    let a = &running["spaces"][0];
    let b = &running["spaces"][1];
    assert_eq!(
        (&a["space"], &b["space"]),
        (&"alpha".into(), &"beta".into())
    );
    assert_eq!(a["role"], "holder", "{running}");
    assert_eq!(a["lease"]["ready"], true, "{running}");
    assert_eq!(a["ctlDelivery"]["answers"], true, "{running}");
    assert_eq!(b["role"], "standby", "{running}");
    assert_eq!(b["lease"]["holder"], FOREIGN, "{running}");
    assert_eq!(b["ctlDelivery"]["answers"], false, "{running}");
    let human = status(root, &[]);
    assert_eq!(human.status.code(), Some(0));
    let human = String::from_utf8_lossy(&human.stdout).trim().to_string();
    assert_eq!(
        human.lines().next(),
        Some(
            format!(
                "delivery host of {}: running (pid {})",
                root.display(),
                host.pid()
            )
            .as_str()
        )
    );
    let running_human = normalise(&human, &[(root, "[ROOT]")]);

    host.terminate().expect("SIGTERM");
    assert_eq!(
        host.wait_exit(HOST_BOUND).await.expect("exit").code(),
        Some(0)
    );
    let (code, stopped) = status_json(root);
    assert_eq!(code, Some(1), "{stopped}");
    assert_eq!(stopped["running"], false, "{stopped}");
    assert_eq!(stopped["hostRecord"]["verdict"], "absent", "{stopped}");
    assert_eq!(stopped["spaces"][0]["role"], "unheld", "{stopped}");
    assert_eq!(stopped["spaces"][0]["ctlDelivery"]["answers"], false);
    assert_eq!(stopped["spaces"][1]["role"], "standby", "{stopped}");

    // A record naming a pid that is not running, then one naming another program (this test).
    let record = root.join(".cotal").join(HOST_PID_FILE);
    let mut gone = std::process::Command::new("true").spawn().expect("true");
    let gone_pid = gone.id();
    gone.wait().expect("reaped");
    let mut lines = Vec::new();
    for (pid, verdict) in [(gone_pid, "stale"), (std::process::id(), "foreign")] {
        std::fs::write(&record, format!("{pid}\n")).expect("record");
        let (code, v) = status_json(root);
        assert_eq!(code, Some(1), "{verdict}: {v}");
        assert_eq!(v["hostRecord"]["verdict"], verdict, "{v}");
        assert_eq!(v["hostRecord"]["pid"], pid, "{v}");
        let out = status(root, &[]);
        assert_eq!(out.status.code(), Some(1), "{verdict}");
        lines.push(normalise(
            String::from_utf8_lossy(&out.stdout).trim(),
            &[(root, "[ROOT]")],
        ));
    }
    crate::support::snapshot_base().bind(|| {
        insta::assert_snapshot!(
            "status_spaces__status_spaces_stale_and_foreign",
            lines.join("\n")
        )
    });
    crate::support::snapshot_base().bind(|| {
        insta::assert_snapshot!("status_spaces__status_spaces_human_running", running_human)
    });
    crate::support::snapshot_base().bind(|| {
        insta::assert_snapshot!(
            "status_spaces__status_spaces_json",
            format!(
                "[running]\n{}\n[stopped]\n{}",
                normalise_status_json(running, root),
                normalise_status_json(stopped, root)
            )
        )
    });
}

/// Exit 3, before any check, when the root holds no `.cotal/` or its manifest is missing or
/// malformed: one line naming the fault on stderr, and with `--json` one error object.
/// Mutation seen failing: the manifest error mapped to exit 1 in `cli.rs` (`Exit::Config`
/// replaced by 1: every case here exits 1).
#[test]
fn status_spaces_refuses_a_missing_root_or_a_bad_manifest_with_exit_3() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path();
    let mut transcript = Vec::new();
    let mut check = |name: &str, kind: &str| {
        let out = status(root, &[]);
        assert_eq!(out.status.code(), Some(3), "{name}");
        assert!(out.stdout.is_empty(), "{name}: {:?}", out.stdout);
        let (code, v) = status_json(root);
        assert_eq!(code, Some(3), "{name}: {v}");
        assert_eq!(v["error"]["kind"], kind, "{name}: {v}");
        transcript.push(format!(
            "[{name}]\n{}",
            normalise(
                String::from_utf8_lossy(&out.stderr).trim(),
                &[(root, "[ROOT]")]
            )
        ));
    };
    check("no_root", "root");
    std::fs::create_dir_all(root.join(".cotal")).expect(".cotal");
    check("no_manifest", "manifest");
    std::fs::write(
        manifest_path(root),
        r#"{"version": 2, "spaces": ["alpha"]}"#,
    )
    .expect("manifest");
    check("wrong_version", "manifest");
    std::fs::write(
        manifest_path(root),
        r#"{"version": 1, "spaces": ["alpha", "alpha"]}"#,
    )
    .expect("manifest");
    check("duplicate", "manifest");
    crate::support::snapshot_base().bind(|| {
        insta::assert_snapshot!(
            "status_spaces__status_spaces_refused",
            transcript.join("\n")
        )
    });
}
