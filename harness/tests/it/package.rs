//! The kit an integrator downloads: `ci/package-kit` packs one archive, which is unpacked into
//! an empty directory and run from there against the landed daemon, as an integrator runs it:
//! no checkout (the harness finds its catalogue and its broker beside itself, or carries the
//! catalogue), a results bundle to attach to a release, and `harness mutate` saying that it
//! needs the repository's sources.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use delivery_harness::kit::carried;
use delivery_harness::rig::checkout;

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The unpacked kit's `harness`, run from the kit's directory with none of the variables that
/// could point it back into a checkout.
fn kit_harness(kit: &Path, args: &[&str]) -> Output {
    Command::new(kit.join("harness"))
        .args(args)
        .current_dir(kit)
        .env_remove("NATS_SERVER_BIN")
        .env_remove("COTAL_DELIVERY_BIN")
        .env_remove("CARGO")
        .env_remove("CARGO_MANIFEST_DIR")
        .output()
        .expect("run the kit's harness")
}

fn json(path: &Path) -> serde_json::Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Packs the kit (this build's harness), unpacks it into an empty directory and qualifies the
/// landed daemon from there: the archive holds the harness, the catalogue, the guide, the
/// installer and a README; the installer, run from the kit, finds the broker where the harness
/// looks for it (`.tools/` beside it); a case run from the kit's directory passes with its
/// catalogue found beside the binary, and again with `cases/` removed, from the catalogue the
/// binary carries (the same digest as this checkout's `cases/` both times); the results bundle
/// holds JSON, JUnit, the table, the versions and the logs of the case that failed; `harness
/// mutate` refuses, since the unpacked harness sees no checkout. Prints the archive's size and
/// the time to pack it.
/// Mutations seen failing: `catalogue::locate` skipping `cases/` beside the binary (origin is
/// "carried" on the first run); `build.rs` carrying no snapshots (the carried digest differs);
/// `rig::checkout::root` answering the compile-time root whatever the executable (with `cases/`
/// removed, the kit reads the checkout's); `--results` writing no `logs/` (the failing case's daemon log is
/// missing from the bundle).
#[test]
fn the_packed_kit_qualifies_from_an_empty_directory_with_no_checkout() {
    let top = checkout::root().expect("the test runs inside its checkout");
    let out_dir = tempfile::tempdir().expect("out dir");
    let started = Instant::now();
    let packed = Command::new(top.join("ci/package-kit"))
        .args(["--harness", env!("CARGO_BIN_EXE_harness"), "--out"])
        .arg(out_dir.path())
        .output()
        .expect("run ci/package-kit");
    let pack_ms = started.elapsed().as_millis();
    assert!(packed.status.success(), "{}", text(&packed));
    let archive = PathBuf::from(
        String::from_utf8_lossy(&packed.stdout)
            .lines()
            .last()
            .expect("the archive's path")
            .trim(),
    );
    let size = std::fs::metadata(&archive).expect("the archive").len();
    eprintln!(
        "kit archive {} : {size} bytes, packed in {pack_ms} ms",
        archive.display()
    );

    let unpack = tempfile::tempdir().expect("an empty directory");
    assert_eq!(std::fs::read_dir(unpack.path()).unwrap().count(), 0);
    let untar = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(unpack.path())
        .output()
        .expect("tar");
    assert!(untar.status.success(), "{}", text(&untar));
    let mut tops: Vec<PathBuf> = std::fs::read_dir(unpack.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(tops.len(), 1, "one directory in the archive: {tops:?}");
    let kit = tops.pop().unwrap();
    for part in [
        "harness",
        "README.md",
        "VERSION",
        "docs/qualify.md",
        "ci/install-nats-server",
        "cases/lifecycle/clean-start-sigterm.toml",
        "cases/lifecycle/snapshots/clean-start-sigterm.snap",
        "cases/lifecycle/mutations.toml",
    ] {
        assert!(kit.join(part).is_file(), "{part} in the kit");
    }

    // The installer, run from the kit, keeps a present 2.15.1 where it would install one, and
    // that is where the harness looks for it.
    let broker = delivery_harness::nats_server_bin().expect("the broker");
    let tools = kit.join(".tools/nats-server-2.15.1");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::copy(&broker, tools.join("nats-server")).expect("place the broker");
    let install = Command::new(kit.join("ci/install-nats-server"))
        .current_dir(&kit)
        .output()
        .expect("run the kit's installer");
    assert!(install.status.success(), "{}", text(&install));
    let installed = String::from_utf8_lossy(&install.stdout).trim().to_string();
    assert_eq!(
        Path::new(&installed).canonicalize().unwrap(),
        tools.join("nats-server").canonicalize().unwrap(),
        "{}",
        text(&install)
    );

    let ours = carried::digest_of_dir(&top.join("cases")).expect("this checkout's cases/");
    let version = kit_harness(&kit, &["--version"]);
    let version_text = String::from_utf8_lossy(&version.stdout).to_string();
    assert!(
        version_text.contains(&ours[.."sha256:".len() + 12]),
        "the carried catalogue is this checkout's cases/: {}",
        text(&version)
    );

    let daemon = delivery_harness::rig::daemon::daemon_bin().expect("the landed daemon");
    let daemon = daemon.to_string_lossy().to_string();
    let case = "lifecycle/clean-start-sigterm";
    let kit_real = kit.canonicalize().unwrap();
    for (run, origin) in [
        ("beside", "beside the harness binary"),
        ("carried", "carried in the harness binary"),
    ] {
        if run == "carried" {
            std::fs::remove_dir_all(kit.join("cases")).unwrap();
        }
        let results = format!("results-{run}");
        let out = kit_harness(
            &kit,
            &[
                "qualify",
                "--only",
                case,
                "--daemon",
                &daemon,
                "--results",
                &results,
            ],
        );
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "{run}: {all}");
        let bundle = kit.join(&results);
        let versions = json(&bundle.join("versions.json"));
        assert_eq!(versions["catalogue"]["origin"], origin, "{run}: {versions}");
        assert_eq!(
            versions["catalogue"]["digest"],
            ours.as_str(),
            "{run}: {versions}"
        );
        let nats = PathBuf::from(versions["nats_server"]["path"].as_str().unwrap());
        assert!(
            nats.canonicalize().unwrap().starts_with(&kit_real),
            "{run}: the broker beside the kit, not {}",
            nats.display()
        );
        assert!(versions["nats_server"]["version"]
            .as_str()
            .is_some_and(|v| v.contains("v2.15.1")));
        assert!(versions["daemon"]["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("cotal-delivery ")));
        let report = json(&bundle.join("report.json"));
        assert_eq!(report["verdict"], "pass", "{run}: {report}");
        assert_eq!(report["cases"][0]["id"], case);
        assert_eq!(report["catalogue"], ours.as_str());
        let junit = std::fs::read_to_string(bundle.join("junit.xml")).unwrap();
        assert!(junit.contains("clean-start-sigterm [operator]"), "{junit}");
        assert!(std::fs::read_to_string(bundle.join("summary.txt"))
            .unwrap()
            .contains("1 passed"));
    }

    // A failing case leaves its logs in the bundle: the case asks for an exit code the daemon
    // does not give, from a catalogue given with --cases (which holds no case it stands on).
    let scratch = kit.join("my-cases/lifecycle");
    std::fs::create_dir_all(scratch.join("snapshots")).unwrap();
    let shipped =
        std::fs::read_to_string(top.join("cases/lifecycle/clean-start-sigterm.toml")).unwrap();
    let broken: String = shipped
        .lines()
        .filter(|l| !l.starts_with("stands_on"))
        .map(|l| match l.starts_with("distribution = { code = 0 }") {
            true => l.replace("code = 0", "code = 3") + "\n",
            false => format!("{l}\n"),
        })
        .collect();
    assert_ne!(broken, shipped, "the case's exit step moved");
    std::fs::write(scratch.join("clean-start-sigterm.toml"), broken).unwrap();
    let out = kit_harness(
        &kit,
        &[
            "qualify",
            "--cases",
            "my-cases",
            "--daemon",
            &daemon,
            "--results",
            "failed",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let logs = kit.join("failed/logs/lifecycle__clean-start-sigterm@operator");
    for kept in ["broker-0.log", "transcript.txt"] {
        assert!(logs.join(kept).is_file(), "{kept} in {}", logs.display());
    }
    let daemon_log = std::fs::read_dir(&logs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .find(|n| n.starts_with("daemon-") && n.ends_with(".log"));
    assert!(daemon_log.is_some(), "a daemon's log in {}", logs.display());
    let report = json(&kit.join("failed/report.json"));
    assert_eq!(report["cases"][0]["verdict"], "fail", "{report}");
    assert_eq!(
        json(&kit.join("failed/versions.json"))["catalogue"]["origin"],
        "given with --cases"
    );

    let mutate = kit_harness(&kit, &["mutate", "--list"]);
    assert_eq!(mutate.status.code(), Some(2), "{}", text(&mutate));
    let said = String::from_utf8_lossy(&mutate.stderr);
    assert!(
        said.contains("this repository's sources") && said.contains("outside the checkout"),
        "{}",
        text(&mutate)
    );
}

/// A broker older than the cases need is refused before the first case, with the version found
/// and how to get a good one (exit 2), whether it is named by flag or by `NATS_SERVER_BIN`.
/// Mutation seen failing: `nats_server_bin` not comparing with `MIN_VERSION` (the run starts).
#[test]
fn an_old_broker_is_refused_before_the_first_case() {
    let dir = tempfile::tempdir().expect("dir");
    let fake = dir.path().join("nats-server");
    std::fs::write(&fake, "#!/bin/sh\necho 'nats-server: v2.10.22'\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fake = fake.to_string_lossy().to_string();
    for by_flag in [true, false] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_harness"));
        cmd.args([
            "qualify",
            "--only",
            "lifecycle/clean-start-sigterm",
            "--results",
            "r",
        ])
        .current_dir(dir.path());
        if by_flag {
            cmd.args(["--nats-server", &fake]);
        } else {
            cmd.env("NATS_SERVER_BIN", &fake);
        }
        let out = cmd.output().expect("run harness");
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            said.contains("is v2.10.22, older than the required v2.15.1")
                && said.contains("ci/install-nats-server installs v2.15.1"),
            "{}",
            text(&out)
        );
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("[  1/"),
            "no case ran"
        );
        assert!(!dir.path().join("r").exists(), "no bundle");
    }
}
