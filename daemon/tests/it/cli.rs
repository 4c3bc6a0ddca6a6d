//! The command line as an operator meets it, run as the built binary: the exit code of a bad
//! flag is the one every command's `--help` and docs/operations.md say, a `--json` command that
//! fails prints one JSON object, and `--version` names the build id.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_cotal-delivery");

/// Every subcommand an operator types, with the arguments that make it otherwise well formed.
const COMMANDS: &[&[&str]] = &[
    &["deliver", "--space", "demo"],
    &["status", "--space", "demo"],
    &["up", "--space", "demo"],
    &["down", "--space", "demo"],
    &["remint", "--space", "demo"],
    &["pending", "--space", "demo", "local.bob"],
    &["members", "--space", "demo", "ops"],
];

fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .output()
        .expect("run cotal-delivery")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The code a help text's `Exit codes:` paragraph gives to `bad flags` (`… 2 bad flags; …`).
fn bad_flags_code(text: &str) -> Option<i32> {
    let at = text.find(" bad flags")?;
    // `… 2 bad flags`, a table's `| 2 | bad flags |` or a bold `**2** bad flags`.
    let before = text[..at].trim_end_matches(|c: char| c.is_whitespace() || c == '|' || c == '*');
    let digits: String = before
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

/// A flag no command has exits with the usage code, for every command, and that code is what
/// the command's `--help` says of bad flags (the daemon's `deliver` points at the table of
/// docs/operations.md, whose row for it is the usage error), and what docs/operations.md's
/// supervisor table says; no help text or doc gives bad flags another code.
/// Mutations seen failing: `UP_HELP` saying `3 bad flags` again (the help names 3, the binary
/// exits 2); `main_with` returning `Exit::Config` for a parse error (every command exits 3).
#[test]
fn a_bad_flag_exits_with_the_code_every_help_text_and_doc_gives_it() {
    let dir = tempfile::tempdir().expect("dir");
    let operations = include_str!("../../../docs/operations.md");
    let usage_row = operations
        .lines()
        .find(|l| l.starts_with("| 2 |"))
        .expect("the exit-code table has a row for 2");
    assert!(usage_row.contains("usage error"), "{usage_row}");
    for args in COMMANDS {
        let mut bad = args.to_vec();
        bad.push("--no-such-flag");
        let out = run_in(dir.path(), &bad);
        let help = stdout(&run_in(dir.path(), &[args[0], "--help"]));
        let said = match args[0] {
            "deliver" => {
                assert!(help.contains("Exit codes: docs/operations.md"), "{help}");
                2
            }
            _ => bad_flags_code(&help).unwrap_or_else(|| {
                panic!("`{} --help` names no code for bad flags:\n{help}", args[0])
            }),
        };
        assert_eq!(
            out.status.code(),
            Some(said),
            "`{}` exits as its help says ({said}) for a bad flag; stderr:\n{}",
            bad.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for row in operations.lines().filter(|l| l.contains("bad flags")) {
        assert_eq!(
            bad_flags_code(row),
            Some(2),
            "docs/operations.md gives bad flags another code: {row}"
        );
    }
    for doc in [
        include_str!("../../../docs/host.md"),
        include_str!("../../../README.md"),
    ] {
        for line in doc.lines().filter(|l| l.contains("bad flags")) {
            assert_eq!(bad_flags_code(line), Some(2), "{line}");
        }
    }
}

/// Each `--json` command prints one JSON object on stdout when it fails, naming the failure and
/// the exit code it exits with: a bad flag (usage, 2), a malformed `--space` and a directory with
/// no workspace root (3) for `status`, `pending`, `members` and `remint`; `status --spaces`
/// without a root.
/// Mutations seen failing: the JSON line of `space_and_root` removed (stdout empty for the
/// malformed space); `main_with` printing nothing for a parse error under `--json`; `remint`'s
/// refusal printing its older `{"space","renewed","error"}` object (no `exitCode`).
#[test]
fn a_json_command_that_fails_prints_one_json_object() {
    let dir = tempfile::tempdir().expect("a directory with no .cotal/ above it");
    let cases: &[(&[&str], &str, i32)] = &[
        (
            &["status", "--json", "--space", "demo", "--no-such-flag"],
            "usage",
            2,
        ),
        (&["status", "--json", "--space", "not a space!"], "space", 3),
        (&["status", "--json", "--space", "demo"], "root", 3),
        (
            &["pending", "--json", "--space", "demo", "local.bob"],
            "root",
            3,
        ),
        (
            &["members", "--json", "--space", "bad space", "ops"],
            "space",
            3,
        ),
        (&["status", "--json", "--spaces"], "root", 3),
        (&["remint", "--json", "--space", "not a space!"], "space", 3),
        (&["remint", "--json", "--space", "demo"], "root", 3),
    ];
    for (args, kind, code) in cases {
        let out = run_in(dir.path(), args);
        let text = stdout(&out);
        let v: serde_json::Value = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("`{}` printed no JSON ({e}): {text:?}", args.join(" ")));
        assert_eq!(out.status.code(), Some(*code), "{}: {v}", args.join(" "));
        assert_eq!(v["error"]["kind"], *kind, "{}: {v}", args.join(" "));
        assert_eq!(v["exitCode"], *code, "{}: {v}", args.join(" "));
        assert!(
            v["error"]["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{v}"
        );
    }
}

/// `--version` names the version and the build id the binary reports (`build-id`), the pair a
/// run's first log line names.
/// Mutation seen failing: `version` without `= VERSION` (clap prints the package version only).
#[test]
fn version_names_the_build_id() {
    let dir = tempfile::tempdir().expect("dir");
    let version = stdout(&run_in(dir.path(), &["--version"]));
    let id = stdout(&run_in(dir.path(), &["build-id"]));
    assert_eq!(id.trim(), cotal_delivery::BUILD_ID);
    assert_eq!(
        version.trim(),
        format!(
            "cotal-delivery {} (build {})",
            env!("CARGO_PKG_VERSION"),
            cotal_delivery::BUILD_ID
        )
    );
}
