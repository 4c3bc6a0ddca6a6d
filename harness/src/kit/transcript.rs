//! Transcripts: what a case saw, one line per step, then each daemon's own lines, with the
//! volatile parts (paths, ports, nkeys, pids, revisions, times, durations) replaced by stable
//! tokens, so a snapshot compares what an operator would read and nothing that changes run to
//! run. Snapshots are insta's files: `cargo test` asserts them with insta, `harness qualify`
//! reads them back and compares.

use std::path::{Path, PathBuf};

/// An nkey (user, account, operator, server): a prefix letter and 55 base32 characters.
pub const NKEY_PATTERN: &str = r"\b[UAONC][A-Z2-7]{55}\b";

/// Replaces each distinct nkey with `[NKEY<n>]`, numbered in order of first appearance, so a
/// transcript still shows whether two keys are the same one (`[NKEY1] vs [NKEY2]` is a torn
/// rotation, `[NKEY1] vs [NKEY1]` would not be).
pub fn number_nkeys(text: &str) -> String {
    let Ok(re) = regex::Regex::new(NKEY_PATTERN) else {
        return text.to_string();
    };
    let mut seen: Vec<String> = Vec::new();
    re.replace_all(text, |caps: &regex::Captures<'_>| {
        let key = caps[0].to_string();
        let n = match seen.iter().position(|k| *k == key) {
            Some(i) => i + 1,
            None => {
                seen.push(key);
                seen.len()
            }
        };
        format!("[NKEY{n}]")
    })
    .into_owned()
}

/// Replaces each path of `tokens` with its token, then the volatile parts with stable tokens.
pub fn normalise_paths(text: &str, tokens: &[(PathBuf, String)]) -> String {
    let mut out = text.to_string();
    for (path, token) in tokens {
        out = out.replace(&path.display().to_string(), token);
    }
    out = number_nkeys(&out);
    let rules: &[(&str, &str)] = &[
        (r"127\.0\.0\.1:\d+", "127.0.0.1:[PORT]"),
        (r"localhost:\d+", "localhost:[PORT]"),
        (r"revision \d+", "revision [REV]"),
        // A lease row's incarnation: unique per daemon run.
        (r"incarnation [0-9a-f]{32}\b", "incarnation [INCARNATION]"),
        (r"wrong last sequence: \d+", "wrong last sequence: [SEQ]"),
        (r"\bpid \d+", "pid [PID]"),
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "[TIME]"),
        (r"expires in \d+ s\b", "expires in [N] s"),
        // A JWT's expiry as unix seconds (adoption lines: `exp 1796053201`).
        (r"\bexp \d{9,}\b", "exp [EXP]"),
        (r"\b\d+ ms\b", "[N] ms"),
        // A repeated line's summary: how long its window ran before the close.
        (r"in the last \d+(\.\d+)? s\b", "in the last [N] s"),
        (r"/tmp/[A-Za-z0-9._-]+", "[TMP]"),
        // A lifecycle uid after its principal (`local.bob.<uid>`): 26 to 32 of [a-z0-9], fresh
        // per provisioning. Only there: a lease incarnation has the same alphabet and its own
        // token in the status rules.
        (
            r"(\b[a-z][a-z0-9_-]*\.[A-Za-z0-9_-]+\.)[a-z0-9]{26,32}\b",
            "${1}[UID]",
        ),
    ];
    replace_all(out, rules)
}

/// [`normalise_paths`] with the workspace root as `[ROOT]` and another directory as
/// `[OUTSIDE]`.
pub fn normalise(text: &str, root: &Path, outside: &Path) -> String {
    normalise_paths(
        text,
        &[
            (root.to_path_buf(), "[ROOT]".into()),
            (outside.to_path_buf(), "[OUTSIDE]".into()),
        ],
    )
}

/// Applies each `(pattern, replacement)` of `rules` in order.
pub fn replace_all(mut out: String, rules: &[(&str, &str)]) -> String {
    for (pattern, replacement) in rules {
        if let Ok(re) = regex::Regex::new(pattern) {
            out = re.replace_all(&out, *replacement).into_owned();
        }
    }
    out
}

/// [`normalise`], plus the volatile parts of a `status` report: lease ages, incarnations and
/// credential expiry times.
pub fn normalise_status(text: &str, root: &Path) -> String {
    let rules: &[(&str, &str)] = &[
        (r"age \d+ s", "age [N] s"),
        (r"incarnation [0-9a-f]{32}", "incarnation [INCARNATION]"),
        (r"expires \S+ \((in \d+ s|expired)\)", "expires [EXP]"),
    ];
    replace_all(normalise(text, root, root), rules)
}

/// The body of an insta snapshot file (after its `---` header), or `None` without a header.
pub fn snapshot_body(file_text: &str) -> Option<&str> {
    let rest = file_text.strip_prefix("---\n")?;
    let end = rest.find("\n---\n")?;
    Some(&rest[end + 5..])
}

/// Whether `transcript` is what the snapshot file holds (insta's own comparison ignores
/// trailing whitespace at the end).
pub fn matches_snapshot(file_text: &str, transcript: &str) -> bool {
    snapshot_body(file_text).is_some_and(|b| b.trim_end() == transcript.trim_end())
}

/// A line-by-line difference, for a report: the first lines that differ, both sides.
pub fn first_difference(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    for i in 0..e.len().max(a.len()) {
        let (x, y) = (e.get(i).copied(), a.get(i).copied());
        if x != y {
            return format!(
                "line {}: snapshot {:?}, this run {:?}",
                i + 1,
                x.unwrap_or("(end)"),
                y.unwrap_or("(end)")
            );
        }
    }
    "no difference".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation caught: one shared `[NKEY]` token for every key (the old filter) makes the
    /// torn-rotation line read the same whether the two keys differ or not.
    #[test]
    fn nkeys_are_numbered_in_order_of_appearance() {
        let a = format!("A{}", "B".repeat(55));
        let b = format!("A{}", "C".repeat(55));
        let text = format!("signed by {a} vs {b}\naccount {a}");
        assert_eq!(
            number_nkeys(&text),
            "signed by [NKEY1] vs [NKEY2]\naccount [NKEY1]"
        );
        assert_eq!(number_nkeys(&format!("{a} vs {a}")), "[NKEY1] vs [NKEY1]");
    }

    /// A lifecycle uid after its principal is a token in a line the daemon prints (a member key,
    /// a retired lifecycle); a lease incarnation of the same alphabet is its own token, never
    /// `[UID]`.
    /// Mutations seen failing: the uid rule dropped (the uid printed as it was); the rule
    /// unanchored (`\b[a-z0-9]{26,32}\b`: the incarnation became `[UID]`, and five host
    /// snapshots with it).
    #[test]
    fn lifecycle_uids_are_tokens() {
        let uid = "k3v9x0a1b2c3d4e5f6g7h8i9j0";
        let inc = "f".repeat(32);
        let line = format!("the member row general/local.bob.{uid} of retired lifecycle local.bob.{uid}: subject_delete_marker_ttl; held by local.UFOREIGN, incarnation {inc}");
        assert_eq!(
            normalise_paths(&line, &[]),
            format!("the member row general/local.bob.[UID] of retired lifecycle local.bob.[UID]: subject_delete_marker_ttl; held by local.UFOREIGN, incarnation [INCARNATION]")
        );
    }

    /// Mutation seen failing: the rule removed (`exp 1796053201` kept, a new number every run).
    #[test]
    fn a_jwt_expiry_and_a_summary_window_are_normalised() {
        let line = "✓ delivery: adopted the renewed credential from x (the broker accepted U, exp 1796053201); reconnecting onto it";
        let out = normalise_paths(line, &[]);
        assert!(out.contains("exp [EXP])"), "{out}");
        let summary = "! delivery: broker connection unavailable, reconnecting (space demo) (repeated 1 time in the last 5.9 s)";
        assert!(
            normalise_paths(summary, &[]).ends_with("(repeated 1 time in the last [N] s)"),
            "{summary}"
        );
    }

    /// Mutation seen failing: the body taken from after the first `---` (the header's
    /// `source:` line compared as transcript).
    #[test]
    fn a_snapshot_file_is_compared_by_its_body() {
        let file = "---\nsource: x.rs\n---\ncase: a/b\n 1. one\n";
        assert!(matches_snapshot(file, "case: a/b\n 1. one"));
        assert!(!matches_snapshot(file, "case: a/b\n 1. two"));
        assert!(!matches_snapshot("no header", "no header"));
        assert_eq!(
            first_difference("a\nb", "a\nc\nd"),
            "line 2: snapshot \"b\", this run \"c\""
        );
    }
}
