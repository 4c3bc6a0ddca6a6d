//! Runs every scenario under `scenarios/` against the real daemon binary and compares its
//! normalised transcript with the snapshot in `scenarios/snapshots/`. A changed transcript
//! fails the test; read the diff before accepting it.

use std::path::PathBuf;

use delivery_harness::scenario::{run, RunOptions, Scenario};

fn scenarios_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

async fn check(name: &str) {
    let path = scenarios_dir().join(format!("{name}.toml"));
    let scenario = Scenario::load(&path).expect("scenario parses");
    assert_eq!(
        scenario.name, name,
        "the file name and the scenario name agree"
    );
    let outcome = run(&scenario, &RunOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for (figure, ms) in &outcome.figures {
        eprintln!("{name}: {figure}: {ms} ms");
    }
    insta::with_settings!({
        snapshot_path => scenarios_dir().join("snapshots"),
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name, outcome.transcript);
    });
}

macro_rules! scenarios {
    ($($(#[$doc:meta])* $test:ident => $file:literal),* $(,)?) => {
        $(
            $(#[$doc])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                check($file).await;
            }
        )*

        /// Every scenario file is run by one of the tests above.
        #[test]
        fn every_scenario_file_has_a_test() {
            let listed = [$($file),*];
            for entry in std::fs::read_dir(scenarios_dir()).expect("scenarios dir") {
                let path = entry.expect("entry").path();
                if path.extension().and_then(|e| e.to_str()) == Some("toml") {
                    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
                    assert!(listed.contains(&stem.as_str()), "scenario {stem} has no test");
                }
            }
        }
    };
}

scenarios! {
    clean_start_then_sigterm => "clean-start-sigterm",
    second_daemon_is_refused => "second-daemon-refused",
    lease_permission_denial_names_subject_and_operation => "lease-permission-denied",
    broker_refusal_is_quoted => "broker-refusal-quoted",
    deleted_lease_with_no_rival_is_reacquired => "lease-deleted-no-rival",
    identical_rewrite_is_still_its_own => "lease-rewritten-identical",
    foreign_incarnation_is_not_adopted => "lease-foreign-incarnation",
    frozen_holder_loses_the_handover => "handover-while-frozen",
    reused_pid_is_reported_stale => "stale-pid-record",
    no_workspace_root_is_refused => "no-workspace-root",
    creds_under_another_workspace_is_refused => "creds-under-another-workspace",
    tls_demanded_refuses_a_plaintext_listener => "tls-demanded-plaintext-refused",
    tls_mesh_serves => "tls-mesh-serves",
    admission_refuses_without_an_observer => "admission-observer-missing",
    admission_refuses_an_observer_of_another_account => "admission-observer-other-account",
    /// Mutation seen failing: `sys::pinned_to` accepting any grant list that names the
    /// daemon's account (the daemon is admitted and serves).
    admission_refuses_an_observer_of_several_accounts => "admission-observer-several-accounts",
    admission_refuses_a_torn_rotation => "admission-torn-rotation",
    admission_without_an_evictor_is_deny_new_only => "admission-no-evictor",
    lease_expired_while_frozen_is_recreated => "lease-expired-while-frozen",
}

/// `harness run` with `--daemon` given as an integrator types it from the README, relative to
/// the directory they are in (`target/<profile>/cotal-delivery` from the directory above the
/// target dir): the scenario runs the daemon in its own root, and passes.
/// Mutation seen failing: `from_caller` returning the path unchanged (`spawn
/// target/debug/cotal-delivery: No such file or directory`, `0 passed, 1 failed`, exit 1).
#[test]
fn harness_run_resolves_a_relative_daemon_path_against_the_callers_directory() {
    let bin = delivery_harness::daemon::daemon_bin().expect("the workspace's daemon binary");
    // <base>/<target>/<profile>/cotal-delivery: run from <base>, name it relative to it.
    let profile = bin.parent().expect("profile dir");
    let target = profile.parent().expect("target dir");
    let base = target.parent().expect("the directory above the target dir");
    let relative = PathBuf::from(target.file_name().expect("target"))
        .join(profile.file_name().expect("profile"))
        .join(bin.file_name().expect("name"));
    assert!(relative.is_relative() && base.join(&relative) == bin);
    let scenario = scenarios_dir().join("clean-start-sigterm.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_harness"))
        .arg("run")
        .arg(&scenario)
        .arg("--daemon")
        .arg(&relative)
        .current_dir(base)
        .output()
        .expect("run harness");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "harness run --daemon {}:\n{stdout}\n{stderr}",
        relative.display()
    );
    assert!(stdout.contains("harness: 1 passed, 0 failed"), "{stdout}");
}
