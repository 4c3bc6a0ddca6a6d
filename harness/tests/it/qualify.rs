//! `harness qualify` as an integrator's CI runs it: the binary, its exit status, its JSON and
//! JUnit reports, the logs it keeps, a drifted transcript, bad flags, and another
//! implementation given as a command template. Failing and drifting catalogues are built in a
//! scratch directory from copies of shipped cases, so the shipped catalogue stays as it is.

use std::path::{Path, PathBuf};
use std::process::Output;

use delivery_harness::kit::catalogue::shipped_root;

fn qualify(args: &[&str], cwd: &Path) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_harness"))
        .arg("qualify")
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run harness qualify")
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("the JSON report")).expect("JSON")
}

/// A change to a case's text.
type Edit = fn(String) -> String;

/// A scratch catalogue holding copies of shipped cases (`family/name`), each with its snapshot,
/// the case text passed through `edit`.
fn catalogue_of(cases: &[(&str, Edit)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("scratch catalogue");
    for (id, edit) in cases {
        let (family, name) = id.split_once('/').expect("family/name");
        let from = shipped_root().join(family);
        let to = dir.path().join(family);
        std::fs::create_dir_all(to.join("snapshots")).expect("dirs");
        let case = std::fs::read_to_string(from.join(format!("{name}.toml"))).expect("case");
        std::fs::write(to.join(format!("{name}.toml")), edit(case)).expect("write case");
        std::fs::copy(
            from.join("snapshots").join(format!("{name}.snap")),
            to.join("snapshots").join(format!("{name}.snap")),
        )
        .expect("copy snapshot");
    }
    dir
}

fn unchanged(s: String) -> String {
    s
}

/// Every selected case passes: exit 0, the versions first, a table row, and reports a CI can
/// read: the JSON's verdict and per-case fields, the JUnit suite of the family.
/// Mutation seen failing: `QualifyReport::exit_code` answering 1 when nothing failed.
#[test]
fn a_passing_run_exits_0_with_versions_a_table_json_and_junit() {
    let work = tempfile::tempdir().expect("work dir");
    let out = qualify(
        &[
            "--only",
            "lifecycle/clean-start-sigterm",
            "--json",
            "report.json",
            "--junit",
            "report.xml",
        ],
        work.path(),
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("nats-server: nats-server: v"), "{all}");
    assert!(stdout.contains("daemon:      cotal-delivery "), "{all}");
    assert!(
        stdout.contains("lifecycle/clean-start-sigterm [operator]")
            && stdout.contains("1 passed, 0 failed, 0 blocked, 0 skipped"),
        "{all}"
    );
    let json = read_json(&work.path().join("report.json"));
    assert_eq!(json["verdict"], "pass", "{json}");
    assert_eq!(json["profile"], "distribution", "{json}");
    let case = &json["cases"][0];
    assert_eq!(case["id"], "lifecycle/clean-start-sigterm");
    assert_eq!(case["family"], "lifecycle");
    assert_eq!(case["shape"], "operator");
    assert_eq!(case["verdict"], "pass");
    assert_eq!(case["transcript"], "match");
    assert!(
        case["sentence"]
            .as_str()
            .is_some_and(|s| s.contains("SIGTERM")),
        "{case}"
    );
    assert!(
        case["duration_ms"].as_u64().is_some_and(|d| d > 0),
        "{case}"
    );
    let xml = std::fs::read_to_string(work.path().join("report.xml")).expect("JUnit");
    assert!(
        xml.contains(
            "<testsuite name=\"lifecycle\" tests=\"1\" failures=\"0\" errors=\"0\" skipped=\"0\""
        ),
        "{xml}"
    );
    assert!(
        xml.contains("name=\"lifecycle/clean-start-sigterm [operator]\""),
        "{xml}"
    );
    // Nothing failed, so no logs were kept.
    assert!(!work.path().join("qualify-logs").exists());
}

/// A case whose daemon does not do what it states fails the run: exit 1, the failing case
/// listed with its sentence, the step's line, what it expected and what happened, the same in
/// the JSON and as a JUnit failure, and its broker and daemon logs kept under ./qualify-logs.
/// Mutation seen failing: `qualify_one` recording the failure's step as 0 (the JSON's
/// `failure.step` is not the failing step).
#[test]
fn a_failing_case_exits_1_names_its_step_and_keeps_its_logs() {
    let cat = catalogue_of(&[
        ("lifecycle/clean-start-sigterm", |s| {
            s.replace("distribution = { code = 0 }", "distribution = { code = 3 }")
        }),
        ("lifecycle/ready-once-bound", unchanged),
    ]);
    let work = tempfile::tempdir().expect("work dir");
    let cases = cat.path().display().to_string();
    let out = qualify(
        &[
            "--cases",
            &cases,
            "--only",
            "lifecycle/clean-start-sigterm",
            "--json",
            "r.json",
            "--junit",
            "r.xml",
        ],
        work.path(),
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("FAILED lifecycle/clean-start-sigterm [operator]"),
        "{all}"
    );
    assert!(
        stdout.contains("expected: daemon a to exit with code 3"),
        "{all}"
    );
    assert!(stdout.contains("happened: exit status: 0"), "{all}");
    let json = read_json(&work.path().join("r.json"));
    assert_eq!(json["verdict"], "fail");
    let f = &json["cases"][0]["failure"];
    assert_eq!(f["verb"], "expect_exit", "{f}");
    assert_eq!(f["step"], 6, "{f}");
    assert!(f["line"].as_u64().is_some_and(|l| l > 10), "{f}");
    let logs = PathBuf::from(json["cases"][0]["logs"].as_str().expect("logs kept"));
    assert!(
        logs.starts_with(work.path().join("qualify-logs")),
        "{logs:?}"
    );
    let daemon_log = std::fs::read_to_string(logs.join("daemon-a.log")).expect("daemon log");
    assert!(
        daemon_log.contains("received SIGTERM, exiting"),
        "{daemon_log}"
    );
    assert!(logs.join("broker-0.log").is_file(), "{logs:?}");
    assert!(logs.join("transcript.txt").is_file(), "{logs:?}");
    let xml = std::fs::read_to_string(work.path().join("r.xml")).expect("JUnit");
    assert!(xml.contains("<failure type=\"behaviour\""), "{xml}");
    assert!(xml.contains("failures=\"1\""), "{xml}");
}

/// A release whose lines changed but whose behaviour holds: the behaviour passes, the
/// transcript drifts, and that fails the run for this distribution (exit 1, "pass, drift", the
/// first differing line); `--behaviour-only` leaves transcripts out (exit 0), and the JSON
/// keeps the two verdicts apart.
/// Mutation seen failing: `CaseReport::fails` ignoring the transcript (the drifted run exits 0).
#[test]
fn a_drifted_transcript_is_its_own_verdict_and_behaviour_only_ignores_it() {
    let cat = catalogue_of(&[("lifecycle/tls-mesh-serves", unchanged)]);
    let snap = cat.path().join("lifecycle/snapshots/tls-mesh-serves.snap");
    let old = std::fs::read_to_string(&snap).expect("snapshot");
    std::fs::write(
        &snap,
        old.replace("delivery daemon up", "delivery daemon started"),
    )
    .expect("edit");
    let work = tempfile::tempdir().expect("work dir");
    let cases = cat.path().display().to_string();
    let strict = qualify(&["--cases", &cases, "--json", "s.json"], work.path());
    let all = text(&strict);
    assert_eq!(strict.status.code(), Some(1), "{all}");
    assert!(
        String::from_utf8_lossy(&strict.stdout).contains("pass, drift"),
        "{all}"
    );
    assert!(
        String::from_utf8_lossy(&strict.stdout).contains("its transcript changed: line"),
        "{all}"
    );
    let json = read_json(&work.path().join("s.json"));
    assert_eq!(json["cases"][0]["verdict"], "pass");
    assert_eq!(json["cases"][0]["transcript"], "drift");
    let lenient = qualify(
        &["--cases", &cases, "--behaviour-only", "--json", "b.json"],
        work.path(),
    );
    assert_eq!(lenient.status.code(), Some(0), "{}", text(&lenient));
    let json = read_json(&work.path().join("b.json"));
    assert_eq!(json["behaviour_only"], true);
    assert_eq!(json["cases"][0]["transcript"], "not-compared");
}

/// A run that cannot start exits 2 with a line naming what was wrong, and writes no report.
/// Mutation seen failing: `refuse` exiting 1.
#[test]
fn bad_flags_a_missing_daemon_or_broker_binary_exit_2() {
    let work = tempfile::tempdir().expect("work dir");
    for (args, says) in [
        (
            vec!["--daemon", "no/such/daemon"],
            "--daemon no/such/daemon",
        ),
        (
            vec!["--nats-server", "/no/such/nats-server"],
            "--nats-server",
        ),
        (
            vec!["--only", "no-such-family"],
            "no family or case of that name",
        ),
        (vec!["-j", "0"], "0"),
        (
            vec!["--daemon-cmd", "daemon --server {server}"],
            "must pass {space}",
        ),
        (
            vec!["--daemon-cmd", "/no/such/daemon --space {space}"],
            "is not a file or on PATH",
        ),
        (
            vec![
                "--daemon-cmd",
                "true --space {space}",
                "--profile",
                "distribution",
            ],
            "--daemon-cmd runs the contract profile",
        ),
        (vec!["--profile", "strict"], "--profile"),
        (
            vec![
                "--daemon-cmd",
                "true --space {space}",
                "--host-cmd",
                "true --server {server}",
            ],
            "--host-cmd: the template must pass {root}",
        ),
        (
            vec![
                "--daemon-cmd",
                "true --space {space}",
                "--host-cmd",
                "/no/such/host --root {root}",
            ],
            "--host-cmd: /no/such/host is not a file or on PATH",
        ),
        (vec!["--host-cmd", "true --root {root}"], "--daemon-cmd"),
    ] {
        let mut with_json = args.clone();
        with_json.extend(["--json", "r.json"]);
        let out = qualify(&with_json, work.path());
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {all}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{args:?}: {all}"
        );
        assert!(!work.path().join("r.json").exists(), "{args:?}");
    }
}

/// Another implementation, given as a command template, runs the contract profile: a contract
/// case runs without its distribution steps (here against this distribution's binary behind the
/// template), a case that needs a standby host is skipped when no `--host-cmd` says how to start
/// one, a distribution case is skipped with its `why`, and skips do not fail the run.
/// Mutation seen failing: `skip_reason` ignoring the template (the standby case runs and fails
/// on the host start the template cannot make).
#[test]
fn a_command_template_runs_the_contract_profile_and_skips_what_it_cannot_express() {
    let bin = delivery_harness::rig::daemon::daemon_bin().expect("the workspace's daemon binary");
    let template = format!(
        "{} deliver --space {{space}} --server {{server}} --root {{root}} [ --tls --tls-ca {{tls_ca}} ] [ --creds {{creds}} ]",
        bin.display()
    );
    let work = tempfile::tempdir().expect("work dir");
    let out = qualify(
        &[
            "--daemon-cmd",
            &template,
            "--only",
            "lifecycle/clean-start-sigterm",
            "--only",
            "standby/refuses-without-observer",
            "--only",
            "anycast/row-removed-after-the-age",
            "--json",
            "t.json",
        ],
        work.path(),
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let json = read_json(&work.path().join("t.json"));
    assert_eq!(json["daemon_version"], "(a command template)");
    assert_eq!(json["profile"], "contract");
    let cases = json["cases"].as_array().expect("cases");
    let find = |id: &str| {
        cases
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {json}"))
    };
    let ran = find("lifecycle/clean-start-sigterm");
    assert_eq!(ran["verdict"], "pass", "{ran}");
    assert_eq!(ran["transcript"], "not-compared", "{ran}");
    let host = find("standby/refuses-without-observer");
    assert_eq!(host["verdict"], "skipped", "{host}");
    assert!(
        host["skip_reason"]
            .as_str()
            .is_some_and(|r| r.contains("a standby host")),
        "{host}"
    );
    let distribution = find("anycast/row-removed-after-the-age");
    assert_eq!(distribution["verdict"], "skipped", "{distribution}");
    assert!(
        distribution["skip_reason"]
            .as_str()
            .is_some_and(|r| r.contains("a distribution case")),
        "{distribution}"
    );
}

/// Renewal and standby under templates that start this distribution's daemon and host: the
/// kit remints into the workspace's store the template names with `{root}`, asks `reloadCreds`
/// on the rail (refused while starting, then answered ok) and reads on the broker that the
/// daemon's connection moved from the first JWT onto the remint
/// (`credentials/reload-refused-before-startup`); the
/// `--host-cmd` template starts two standby hosts and the second takes the released lease row
/// (`standby/graceful-stop-takeover`, at the seeds' 5 s retry although the run scales: its
/// scaled form shortens a knob no seed names). Both run and pass, neither is skipped; without
/// `--host-cmd` the standby case is skipped, naming it.
/// Mutations seen failing: `CredStep::unsupported` skipping `expect_broker_jwt` under a template
/// again (the renewal case is skipped); `verb::no_host_cmd` answering a reason whatever the
/// run (the standby case is skipped although `--host-cmd` was given); the host start ignoring
/// `--host-cmd` for this distribution's `deliver --spaces` (could not run: no commands of this
/// distribution under a template); `Case::runs_scaled` ignoring the profile (the standby case
/// reports the scaled form).
#[test]
fn renewal_and_standby_run_under_templates() {
    let bin = delivery_harness::rig::daemon::daemon_bin().expect("the workspace's daemon binary");
    let daemon = format!(
        "{} deliver --space {{space}} --server {{server}} --root {{root}} [ --tls --tls-ca {{tls_ca}} ] [ --creds {{creds}} ]",
        bin.display()
    );
    let host = format!(
        "{} deliver --spaces --root {{root}} --server {{server}} [ --tls --tls-ca {{tls_ca}} ]",
        bin.display()
    );
    let work = tempfile::tempdir().expect("work dir");
    let cases = [
        "credentials/reload-refused-before-startup",
        "standby/graceful-stop-takeover",
    ];
    let mut args = vec!["--daemon-cmd", &daemon, "--host-cmd", &host, "--scaled"];
    for c in cases {
        args.extend(["--only", c]);
    }
    args.extend(["--json", "t.json"]);
    let out = qualify(&args, work.path());
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let json = read_json(&work.path().join("t.json"));
    assert_eq!(json["profile"], "contract");
    assert_eq!(json["skipped"], 0, "{json}");
    for id in cases {
        let case = json["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {json}"));
        assert_eq!(case["verdict"], "pass", "{case}");
    }
    // The standby retry is a knob no seed names: asked to scale, the contract run waits out
    // the seeds' 5 s retry rather than shorten it, and says why.
    let takeover = json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["id"] == "standby/graceful-stop-takeover")
        .expect("the standby case");
    assert_eq!(takeover["form"], "as-written", "{takeover}");
    assert!(
        takeover["shipped_because"]
            .as_str()
            .is_some_and(|r| r.contains("COTAL_DELIVERY_STANDBY_RETRY_MS")),
        "{takeover}"
    );
    assert!(
        all.contains(
            "pass (its shipped form: the scaled one shortens COTAL_DELIVERY_STANDBY_RETRY_MS"
        ),
        "{all}"
    );

    let out = qualify(
        &[
            "--daemon-cmd",
            &daemon,
            "--only",
            "standby/graceful-stop-takeover",
            "--json",
            "u.json",
        ],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let json = read_json(&work.path().join("u.json"));
    let case = &json["cases"][0];
    assert_eq!(case["verdict"], "skipped", "{case}");
    assert!(
        case["skip_reason"]
            .as_str()
            .is_some_and(|r| r.contains("--host-cmd")),
        "{case}"
    );
}

/// A listing piped into a reader that stops early (`harness qualify --list | head -1`) ends the
/// harness by SIGPIPE, as a command line tool ends, with nothing on stderr: no panic.
/// Mutation seen failing: the SIGPIPE reset at the top of `main` removed (the harness panics
/// with "failed printing to stdout: Broken pipe" and exits 101).
#[test]
fn a_listing_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["qualify", "--list"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run harness qualify --list");
    // The reader is gone before the harness has loaded its catalogue and printed a line.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("its end");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(nix::sys::signal::Signal::SIGPIPE as i32),
        "{:?}; stderr: {stderr}",
        out.status
    );
    assert!(stderr.is_empty(), "{stderr}");
}

/// The two profiles on one case whose distribution step fails (a `status` that expects what
/// this distribution never prints): the contract profile does not run that step and passes,
/// comparing no transcript; the distribution profile runs it and fails there, naming the step
/// as a distribution step.
/// Mutation seen failing: `StepAt::for_profile` running every step in either profile (the
/// contract run fails at the `status` step).
#[test]
fn the_contract_profile_does_not_run_distribution_steps() {
    let cat = catalogue_of(&[
        ("lifecycle/clean-start-sigterm", |s| {
            s.replace(
                "status = { contains = \"running\", code = 0 }",
                "status = { contains = \"no such report\", code = 0 }",
            )
        }),
        ("lifecycle/ready-once-bound", unchanged),
    ]);
    let work = tempfile::tempdir().expect("work dir");
    let cases = cat.path().display().to_string();
    let args = |profile: &'static str, json: &'static str| {
        vec![
            "--cases".to_string(),
            cases.clone(),
            "--only".into(),
            "lifecycle/clean-start-sigterm".into(),
            "--profile".into(),
            profile.into(),
            "--json".into(),
            json.into(),
        ]
    };
    let contract: Vec<String> = args("contract", "c.json");
    let out = qualify(
        &contract.iter().map(String::as_str).collect::<Vec<_>>(),
        work.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let json = read_json(&work.path().join("c.json"));
    assert_eq!(json["profile"], "contract");
    assert_eq!(json["cases"][0]["verdict"], "pass");
    assert_eq!(json["cases"][0]["transcript"], "not-compared");
    let distribution: Vec<String> = args("distribution", "d.json");
    let out = qualify(
        &distribution.iter().map(String::as_str).collect::<Vec<_>>(),
        work.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let json = read_json(&work.path().join("d.json"));
    let f = &json["cases"][0]["failure"];
    assert_eq!(f["verb"], "status", "{f}");
    assert_eq!(f["profile"], "distribution", "{f}");
}

/// A case whose daemon never serves, at a step that stands on the case proving a daemon serves:
/// blocked by that case, not failed. Exit 1, the summary counts it as blocked, the table names
/// the case it stands on, the JSON says `blocked` with `blocked_by`, and the JUnit makes it an
/// `<error type="blocked">`, never a `<failure>`.
/// Mutation seen failing: `qualify_one` ignoring the failed step's `stands_on` (a FAIL, a JUnit
/// `<failure>`).
#[test]
fn a_failed_precondition_blocks_the_case() {
    let cat = catalogue_of(&[
        ("lifecycle/clean-start-sigterm", |s| {
            s.replacen(
                "[[step]]\nstart = { daemon = \"a\" }",
                "[[step]]\nsys_material = { observer = \"missing\" }\n[[step]]\nstart = { daemon = \"a\" }",
                1,
            )
            .replace(
                "expect_serving = { daemon = \"a\" }\n",
                "expect_serving = { daemon = \"a\" }\nwithin = 3000\n",
            )
        }),
        ("lifecycle/ready-once-bound", unchanged),
    ]);
    let work = tempfile::tempdir().expect("work dir");
    let cases = cat.path().display().to_string();
    let out = qualify(
        &[
            "--cases",
            &cases,
            "--only",
            "lifecycle/clean-start-sigterm",
            "--json",
            "b.json",
            "--junit",
            "b.xml",
        ],
        work.path(),
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("0 passed, 0 failed, 1 blocked, 0 skipped"),
        "{all}"
    );
    assert!(
        stdout.contains(
            "BLOCKED lifecycle/clean-start-sigterm [operator] by lifecycle/ready-once-bound"
        ),
        "{all}"
    );
    let json = read_json(&work.path().join("b.json"));
    assert_eq!(json["verdict"], "fail");
    assert_eq!(json["blocked"], 1);
    assert_eq!(json["failed"], 0);
    let case = &json["cases"][0];
    assert_eq!(case["verdict"], "blocked", "{case}");
    assert_eq!(case["blocked_by"], "lifecycle/ready-once-bound", "{case}");
    assert_eq!(case["failure"]["verb"], "expect_serving", "{case}");
    let xml = std::fs::read_to_string(work.path().join("b.xml")).expect("JUnit");
    assert!(
        xml.contains("<error type=\"blocked\" message=\"blocked by lifecycle/ready-once-bound\">"),
        "{xml}"
    );
    assert!(!xml.contains("<failure"), "{xml}");
}

/// A case closes every connection it opened while its brokers still run, so nothing it opened
/// outlives it inside the runtime `harness qualify` runs every case on. A client dropped after
/// its broker is gone keeps redialling (its connection task is busy reconnecting and never sees
/// the drop), and dials the port a later case's broker takes: under `qualify -j 2`, two agents of
/// `data-path/live-mention-reaches-authorized-non-member` were counted three minutes later
/// against `standby/refuses-malformed-credential`'s daemon. Judged on the runtime: once the case
/// has returned, its tasks end (the count of live tasks falls back to where it was), bounded.
/// Mutation seen failing: `run_case` dropping the world (`drop(world)`) instead of
/// `world.close().await` (the agents' and the inspector's connection tasks stay alive).
#[test]
fn a_case_leaves_no_connection_redialling_after_it_ends() {
    use delivery_harness::kit::case::Case;
    use delivery_harness::kit::run::run_case;
    use delivery_harness::kit::shape::Shape;
    use delivery_harness::kit::under_test::RunOptions;
    const TEXT: &str = r#"
id = "local/agents-closed"
family = "local"
seed = "delivery-daemon-concept.txt"
sentence = """x"""
description = """two agents on a live channel, one announcing, one posting; no daemon"""
[[step]]
channel = { name = "lobby", class = "live" }
[[step]]
agent = { name = "alice", read = ["lobby"] }
[[step]]
agent = { name = "dave", read = ["lobby"] }
[[step]]
announce = { agent = "dave" }
[[step]]
post = { agent = "alice", channel = "lobby", text = "hey" }
[[step]]
expect_member_rows = { agent = "alice", channels = [] }
"#;
    let case = Case::parse(TEXT, Path::new("agents-closed.toml")).expect("the case parses");
    let shape = Shape::parse("operator").expect("a shape");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        let run = run_case(&case, &shape, &RunOptions::default(), None).await;
        assert!(run.outcome.is_ok(), "{:?}\n{}", run.outcome, run.transcript);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let alive = metrics.num_alive_tasks();
            if alive <= before {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{alive} tasks alive 10 s after the case ended, {before} before it"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    });
}
