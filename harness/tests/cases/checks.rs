//! The checks that hold the catalogue together, beside its cases: `harness run` finds the
//! daemon as an integrator names it, docs/conformance.md names every case and only those, every
//! case quotes its seed word for word and has a mutation that still applies.

use std::path::PathBuf;

use delivery_harness::kit::catalogue::{shipped_root, Catalogue};
use libtest_mimic::Trial;

/// The checks, as tests named `catalogue::<check>`.
pub fn all() -> Vec<Trial> {
    fn trial(name: &str, check: fn()) -> Trial {
        Trial::test(format!("catalogue::{name}"), move || {
            check();
            Ok(())
        })
    }
    vec![
        trial(
            "harness_run_resolves_a_relative_daemon_path_against_the_callers_directory",
            harness_run_resolves_a_relative_daemon_path_against_the_callers_directory,
        ),
        trial(
            "the_conformance_matrix_names_every_case_and_only_cases_that_exist",
            the_conformance_matrix_names_every_case_and_only_cases_that_exist,
        ),
        trial(
            "every_case_quotes_its_seed_word_for_word",
            every_case_quotes_its_seed_word_for_word,
        ),
        trial(
            "every_case_has_a_mutation_that_still_applies",
            every_case_has_a_mutation_that_still_applies,
        ),
    ]
}

/// `harness run` with `--daemon` given as an integrator types it from the README, relative to
/// the directory they are in (`target/<profile>/cotal-delivery` from the directory above the
/// target dir): the case runs the daemon in its own root, and passes.
/// Mutation seen failing: `from_caller` returning the path unchanged (`--daemon
/// target/debug/cotal-delivery: no such file`, exit 2).
fn harness_run_resolves_a_relative_daemon_path_against_the_callers_directory() {
    let bin = delivery_harness::rig::daemon::daemon_bin().expect("the workspace's daemon binary");
    let profile = bin.parent().expect("profile dir");
    let target = profile.parent().expect("target dir");
    let base = target.parent().expect("the directory above the target dir");
    let relative = PathBuf::from(target.file_name().expect("target"))
        .join(profile.file_name().expect("profile"))
        .join(bin.file_name().expect("name"));
    assert!(relative.is_relative() && base.join(&relative) == bin);
    let case = shipped_root().join("lifecycle/clean-start-sigterm.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_harness"))
        .arg("run")
        .arg(&case)
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

/// docs/conformance.md names every case of the catalogue, and every case it names exists: the
/// matrix and the kit cannot drift apart.
/// Mutation seen failing: a case id removed from the matrix (and, the other way, a row naming
/// `case lifecycle/no-such-case`).
fn the_conformance_matrix_names_every_case_and_only_cases_that_exist() {
    let cat = Catalogue::load(&shipped_root()).expect("the catalogue loads");
    let matrix = std::fs::read_to_string(shipped_root().join("../docs/conformance.md"))
        .expect("docs/conformance.md");
    let named = named_cases(&matrix);
    for c in &cat.cases {
        assert!(
            named.contains(&c.id),
            "docs/conformance.md does not name case `{}` (write it as case `{}` in the row of the paragraph it proves)",
            c.id,
            c.id
        );
    }
    for id in &named {
        assert!(
            cat.cases.iter().any(|c| &c.id == id),
            "docs/conformance.md names case `{id}`, which the catalogue does not hold"
        );
    }
}

/// The ids the matrix names: `case `<id>``, and the further ids of `cases `<id>`, `<id>``.
fn named_cases(matrix: &str) -> std::collections::BTreeSet<String> {
    let lead = regex::Regex::new(r"\bcases? `([a-z-]+/[a-z0-9-]+)`((?:, `[a-z-]+/[a-z0-9-]+`)*)")
        .expect("pattern");
    let more = regex::Regex::new(r"`([a-z-]+/[a-z0-9-]+)`").expect("pattern");
    let mut out = std::collections::BTreeSet::new();
    for cap in lead.captures_iter(matrix) {
        out.insert(cap[1].to_string());
        for m in more.captures_iter(&cap[2]) {
            out.insert(m[1].to_string());
        }
    }
    out
}

/// Every case quotes its sentence word for word from the seed it names (docs/seeds/, the user's
/// documents): whitespace may be re-flowed and typographic quotes typed plainly, nothing else.
/// Mutation seen failing: a word of a case's sentence changed (`a second binding` for `a second
/// binding the same durables`).
fn every_case_quotes_its_seed_word_for_word() {
    fn plain(text: &str) -> String {
        text.replace(['\u{2019}', '\u{2018}'], "'")
            .replace(['\u{201c}', '\u{201d}'], "\"")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }
    let cat = Catalogue::load(&shipped_root()).expect("the catalogue loads");
    let seeds = shipped_root().join("../docs/seeds");
    for c in &cat.cases {
        let seed = std::fs::read_to_string(seeds.join(&c.seed))
            .unwrap_or_else(|e| panic!("{}: seed {}: {e}", c.id, c.seed));
        let quoted = plain(&c.sentence);
        assert!(
            plain(&seed).contains(&quoted),
            "case {} quotes what {} does not say:\n{quoted}",
            c.id,
            c.seed
        );
    }
}

/// Every case has at least one mutation kept beside it, and every mutation still applies: its
/// text occurs exactly once in its file, its case exists. A daemon change that moves a mutated
/// line makes the mutation stale here, in CI, not silently at the next `harness mutate`.
/// Mutation seen failing: a case's only mutation removed from its family's mutations.toml.
fn every_case_has_a_mutation_that_still_applies() {
    let cat = Catalogue::load(&shipped_root()).expect("the catalogue loads");
    let workspace = shipped_root().join("..");
    let mutations = delivery_harness::kit::mutate::load(&cat, &workspace)
        .unwrap_or_else(|errors| panic!("stale or invalid mutations:\n{}", errors.join("\n")));
    for c in &cat.cases {
        assert!(
            mutations.iter().any(|m| m.case == c.id),
            "case {} has no mutation in cases/{}/mutations.toml",
            c.id,
            c.family
        );
    }
}
