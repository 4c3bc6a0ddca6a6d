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

/// One normalisation rule: a pattern and what replaces each match (`$1` names a group).
pub type Rule = (&'static str, &'static str);

// The rule tables of the snapshots the harness's own tests (`harness/tests/it`) keep from
// before the kit: each names the volatile parts of its family of lines with the tokens those
// snapshots were written with, so they are defined here, once, beside the cases' rules, and the
// tests hold no pattern of their own. Apply one with [`replace_all`] (in order).

/// The broker-gone and credential tests' daemon lines (after [`number_nkeys`]): times, the
/// credited stall (a daemon never stopped still credits scheduling jitter, 100 ms seen on two
/// busy cores: under 500 ms reads `[NOT STALLED]`, 500 ms or more `[STALLED]`, the stalled
/// tests freeze the daemon for 1.5 s and more), digests, uuids, paths, ports, revisions,
/// durations, JWT expiries.
pub const HEALTH_RULES: &[Rule] = &[
    (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "[TIME]"),
    (
        r"\b([0-9]{1,2}|[0-4][0-9]{2}) ms of it credited",
        "[NOT STALLED] of it credited",
    ),
    (
        r"\b([5-9][0-9]{2}|[1-9][0-9]{3,}) ms of it credited",
        "[STALLED] of it credited",
    ),
    (r"\b[0-9a-f]{64}\b", "[DIGEST]"),
    (
        r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b",
        "[UUID]",
    ),
    (r"(/[A-Za-z0-9._-]+)+", "[PATH]"),
    (r"127\.0\.0\.1:\d+", "127.0.0.1:[PORT]"),
    (r"revision \d+", "revision [REV]"),
    (r"\d+(\.\d+)? ?(ms|s)\b", "[DURATION]"),
    (r"\bexp \d+", "exp [EXP]"),
];

/// A loopback broker's URL, `nats://[HOST]:[PORT]` (or `tls://`).
pub const URL_RULE: Rule = (r"(nats|tls)://127\.0\.0\.1:\d+", "$1://[HOST]:[PORT]");

/// The supervisor's lines (`up`, `down`, `remint`, the daemon log) and `status`.
pub const SUPERVISOR_RULES: &[Rule] = &[
    (r"\b[A-Z0-9]{56}\b", "[NKEY]"),
    (r"\b[0-9a-f]{32}\b", "[INCARNATION]"),
    (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "[TIME]"),
    (r"\(build [0-9a-f]+\)", "(build [BUILD])"),
    (r"cotal-delivery \d+\.\d+\.\d+", "cotal-delivery [VERSION]"),
    (r"\bexp \d+", "exp [EXP]"),
    URL_RULE,
    (r"(/[A-Za-z0-9._-]+)+", "[PATH]"),
    (r"pid \d+", "pid [PID]"),
    (r"\d+ (ms|s)\b", "[N] $1"),
];

/// The data-path and admin tests' lines and answers: nkeys, 32-character ids, ports, paths,
/// revisions; and `inspect`'s ages.
pub const DATA_PATH_RULES: &[Rule] = &[
    (r"oldest \d+( min \d+| h \d+)? (s|min)", "oldest [AGE]"),
    (r"[A-Z0-9]{56}", "[NKEY]"),
    (r"\b[a-z0-9]{32}\b", "[UID]"),
    (r"127\.0\.0\.1:\d+", "127.0.0.1:[PORT]"),
    (r"/tmp/[^\s]+", "[PATH]"),
    (r"revision \d+", "revision [REV]"),
];

/// A keeper's closing line (the lease tests): nkeys and the broker's last sequence.
pub const LEASE_RULES: &[Rule] = &[
    (r"[A-Z0-9]{56}", "[NKEY]"),
    (r"sequence: \d+", "sequence: [SEQ]"),
];

/// A manager's line (the admin tests): how many requests it made.
pub const MANAGER_RULES: &[Rule] = &[(r"\(\d+ requests\)", "([N] requests)")];

/// A rail's reply as its subscriber reads it (the wire tests): user nkeys, the numbers and ids
/// that differ per run, by their JSON keys.
pub const REPLY_RULES: &[Rule] = &[
    (r"U[A-Z2-7]{55}", "[NKEY]"),
    (
        r#""(seq|exp|joinCursor|revision|takenAt|cid)":\d+"#,
        r#""$1":[N]"#,
    ),
    (r#""instance":"[0-9a-f]{32}""#, r#""instance":"[TOKEN]""#),
    (r#""storeId":"[0-9a-f-]{36}""#, r#""storeId":"[ID]""#),
    (r#""serverId":"[A-Z0-9]+""#, r#""serverId":"[SERVER]""#),
];

/// `status --json` with its volatile values replaced (the host's pid, each lease's age,
/// incarnation and expiry, each credential's expiry), pretty, then [`normalise`]d.
pub fn normalise_status_json(mut v: serde_json::Value, root: &Path) -> String {
    if v["hostRecord"]["pid"].is_number() {
        v["hostRecord"]["pid"] = "[PID]".into();
    }
    if let Some(spaces) = v["spaces"].as_array_mut() {
        for s in spaces {
            if s["lease"].is_object() {
                s["lease"]["ageMs"] = "[N]".into();
                s["lease"]["incarnation"] = "[INCARNATION]".into();
                if s["lease"]["expiresInS"].is_number() {
                    s["lease"]["expiresInS"] = "[N]".into();
                }
            }
            if s["credential"]["expires"].is_number() {
                s["credential"]["expires"] = "[EXP]".into();
            }
        }
    }
    let text = serde_json::to_string_pretty(&v).unwrap_or_default();
    normalise(&text, root, root)
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
