//! Transcripts: what a case saw, one line per step, then each daemon's own lines, with the
//! volatile parts (paths, ports, nkeys, pids, revisions, times, durations) replaced by stable
//! tokens, so a snapshot compares what an operator would read and nothing that changes run to
//! run. Snapshots are insta's files: `cargo test` asserts them with insta, `harness qualify`
//! reads them back and compares.
//!
//! One normaliser serves the kit's cases and every Rust test (`harness/tests/it`): [`normalise`]
//! applies the callers' directories as tokens, then [`RULES`] in order.

use std::path::Path;

/// One normalisation rule: a pattern and what replaces each match (`$1` names a group; a `#`
/// numbers each distinct match in order of first appearance).
pub type Rule = (&'static str, &'static str);

/// An nkey (user, account, operator, server): a prefix letter and 55 base32 characters.
pub const NKEY_PATTERN: &str = r"\b[UAONC][A-Z2-7]{55}\b";

/// The volatile parts of every line the harness snapshots, in the order they are replaced. Each
/// rule is anchored on what surrounds its value (or on a shape no earlier token has), so no rule
/// eats another's input: ports and paths first (a path holds no key), a server id before the
/// nkeys (it is one), an incarnation before the bare uids (it has their alphabet), a status
/// expiry's `(in N s)` after the time it follows. Durations are tokens only where the number is
/// measured (`ms`, an age, a countdown); a case's description keeps its seconds.
pub const RULES: &[Rule] = &[
    // Where.
    (r"127\.0\.0\.1:\d+", "127.0.0.1:[PORT]"),
    (r"localhost:\d+", "localhost:[PORT]"),
    // A temporary directory no caller named (a test's own root, a broker's directory).
    (r"/tmp/[A-Za-z0-9._-]+", "[TMP]"),
    // Who: a server's id is an nkey of its own kind; then every nkey, numbered, so a line still
    // shows whether two keys are the same one (`[NKEY1] vs [NKEY2]` is a torn rotation).
    (r#""serverId":"N[A-Z2-7]{55}""#, r#""serverId":"[SERVER]""#),
    (NKEY_PATTERN, "[NKEY#]"),
    // A lease row's incarnation and a responder's instance: unique per daemon run.
    (r"incarnation [0-9a-f]{32}\b", "incarnation [INCARNATION]"),
    // The lease watch's consumer is named after it (`leasewatch_<inc>`, `leasewatch_<inc>_1`).
    (r"\bleasewatch_[0-9a-f]{32}", "leasewatch_[INCARNATION]"),
    (r#""instance":"[0-9a-f]{32}""#, r#""instance":"[TOKEN]""#),
    // A lifecycle uid (`local.bob.<uid>`, `dlv_local-bob-<uid>`, `lifecycle <uid>`): 26 to 32
    // of [a-z0-9], fresh per provisioning.
    (r"\b[a-z0-9]{26,32}\b", "[UID]"),
    (
        r#"(store\.id |"storeId":")[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"#,
        "${1}[UUID]",
    ),
    // What build.
    (r"\(build [0-9a-f]+\)", "(build [BUILD])"),
    (r"cotal-delivery \d+\.\d+\.\d+", "cotal-delivery [VERSION]"),
    // When, and how long.
    (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "[TIME]"),
    (r"\(in \d+ s\)", "(in [N] s)"),
    // A JWT's expiry as unix seconds (adoption lines: `exp 1796053201`).
    (r"\bexp \d{9,}\b", "exp [EXP]"),
    (r"\bexpires in \d+ s\b", "expires in [N] s"),
    (r"\bage \d+ s\b", "age [N] s"),
    (r"\boldest \d+( min \d+| h \d+)? (s|min)\b", "oldest [AGE]"),
    // A repeated line's summary: how long its window ran before the close.
    (r"\bin the last \d+(\.\d+)? s\b", "in the last [N] s"),
    (r"\b\d+ ms\b", "[N] ms"),
    // Counters the broker or the run chooses.
    (r"\brevision \d+", "revision [REV]"),
    (r"\bsequence: \d+", "sequence: [SEQ]"),
    (r"\bpid \d+", "pid [PID]"),
    (r"\(\d+ requests\)", "([N] requests)"),
    // A reply's numbers by their JSON keys (a connection id is not one: the tests that print
    // one plant it, `"cid":999999`, or name the real one themselves).
    (
        r#""(seq|exp|joinCursor|revision|takenAt)":\d+"#,
        r#""$1":[N]"#,
    ),
];

/// `text` with each directory of `paths` replaced by its token (`[ROOT]`, `[HOST a]`, …), then
/// [`RULES`] applied in order. A directory no caller names is `[TMP]` once under `/tmp`.
pub fn normalise(text: &str, paths: &[(&Path, &str)]) -> String {
    let mut out = text.to_string();
    for (path, token) in paths {
        out = out.replace(&path.display().to_string(), token);
    }
    for (pattern, with) in RULES {
        let Ok(re) = regex::Regex::new(pattern) else {
            continue;
        };
        out = if with.contains('#') {
            numbered(&re, &out, with)
        } else {
            re.replace_all(&out, *with).into_owned()
        };
    }
    out
}

/// Each distinct match of `re` as `with` with its `#` the match's number, in order of first
/// appearance.
fn numbered(re: &regex::Regex, text: &str, with: &str) -> String {
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
        with.replace('#', &n.to_string())
    })
    .into_owned()
}

/// `status --json` with its volatile values replaced (the host's pid, each lease's age,
/// incarnation and expiry, each credential's expiry), pretty, then [`normalise`]d with `root`
/// as `[ROOT]`.
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
    normalise(&text, &[(root, "[ROOT]")])
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

    fn key(prefix: char, fill: char) -> String {
        format!("{prefix}{}", fill.to_string().repeat(55))
    }

    /// The cases' lines (the table the kit's transcripts were written with): a lifecycle uid
    /// after its principal, a lease incarnation of the same alphabet (alone, and in the lease
    /// watch consumer's name), the directories the world
    /// names, a JWT's expiry, a repeated line's window, a port.
    /// Mutations seen failing: the uid rule moved before the incarnation's (`incarnation [UID]`);
    /// the lease watch consumer's rule dropped (its incarnation printed as it was);
    /// the nkeys one shared `[NKEY]` (the torn rotation reads the same whether the keys differ or
    /// not); `exp` dropped (a new number every run).
    #[test]
    fn the_cases_lines_keep_their_tokens() {
        let uid = "k3v9x0a1b2c3d4e5f6g7h8i9j0";
        let inc = "f".repeat(32);
        let line = format!("the member row general/local.bob.{uid} of retired lifecycle local.bob.{uid}: subject_delete_marker_ttl; held by local.UFOREIGN, incarnation {inc}");
        assert_eq!(
            normalise(&line, &[]),
            "the member row general/local.bob.[UID] of retired lifecycle local.bob.[UID]: subject_delete_marker_ttl; held by local.UFOREIGN, incarnation [INCARNATION]"
        );
        let (a, b) = (key('A', 'B'), key('A', 'C'));
        assert_eq!(
            normalise(&format!("signed by {a} vs {b}\naccount {a}"), &[]),
            "signed by [NKEY1] vs [NKEY2]\naccount [NKEY1]"
        );
        let root = Path::new("/tmp/cotal-ws-Ab1/x");
        let line = format!("✓ delivery: adopted the renewed credential from {}/.cotal/space.64656d6f/delivery.creds (the broker accepted {a}, exp 1796053201); reconnecting onto it at nats://127.0.0.1:40123", root.display());
        assert_eq!(
            normalise(&line, &[(root, "[ROOT]")]),
            "✓ delivery: adopted the renewed credential from [ROOT]/.cotal/space.64656d6f/delivery.creds (the broker accepted [NKEY1], exp [EXP]); reconnecting onto it at nats://127.0.0.1:[PORT]"
        );
        let summary = "! delivery: broker connection unavailable, reconnecting (space demo) (repeated 1 time in the last 5.9 s)";
        assert!(normalise(summary, &[]).ends_with("(repeated 1 time in the last [N] s)"));
        let line = format!("! delivery: could not delete the lease watch consumer leasewatch_{inc}_1 (no answer within 2000 ms); the broker reclaims it after five minutes of inactivity");
        assert_eq!(
            normalise(&line, &[]),
            "! delivery: could not delete the lease watch consumer leasewatch_[INCARNATION]_1 (no answer within [N] ms); the broker reclaims it after five minutes of inactivity"
        );
        // A case's description keeps its configured seconds.
        let prose = "The daemon starts on a 16 s row (retrying in 60 s) and the 5 s branch";
        assert_eq!(normalise(prose, &[]), prose);
    }

    /// The health and credential tests' lines (once HEALTH_RULES): a directory no caller named,
    /// a store's id, the URL, the measured durations.
    /// Mutations seen failing: the `/tmp` rule dropped (the directory printed as it was); the
    /// store id rule dropped (a fresh uuid every run).
    #[test]
    fn the_health_lines_keep_their_tokens() {
        let line = "• delivery: received SIGHUP: /tmp/.tmpQ3xYz9/.cotal/space.64656d6f/delivery.creds holds the credential in use (exp 1796053201); nothing to adopt (space demo)";
        assert_eq!(
            normalise(line, &[]),
            "• delivery: received SIGHUP: [TMP]/.cotal/space.64656d6f/delivery.creds holds the credential in use (exp [EXP]); nothing to adopt (space demo)"
        );
        let line = "delivery: this daemon reloads its credentials from the filesystem store /tmp/.tmpA/s (store.id 0f8e2c1a-1b2c-4d3e-8f90-a1b2c3d4e5f6)";
        assert_eq!(
            normalise(line, &[]),
            "delivery: this daemon reloads its credentials from the filesystem store [TMP]/s (store.id [UUID])"
        );
        let line = "• delivery: the broker connection was unavailable for 1834 ms, 12 ms of it credited as this process's own stall (window 4000 ms, backstop 15000 ms)";
        assert_eq!(
            normalise(line, &[]),
            "• delivery: the broker connection was unavailable for [N] ms, [N] ms of it credited as this process's own stall (window [N] ms, backstop [N] ms)"
        );
    }

    /// The supervisor's lines and `status` (once SUPERVISOR_RULES and the status rules): the
    /// build, the version, pids, the lease row, a credential's expiry and its countdown.
    /// Mutations seen failing: the `(in N s)` rule dropped (a countdown every run); the build
    /// rule dropped (a new hash every commit).
    #[test]
    fn the_supervisor_and_status_lines_keep_their_tokens() {
        let line = "• delivery: run started — cotal-delivery 0.1.0 (build 9c1e2ab), pid 48213, space demo, root /tmp/cotal-ws-Zx81, broker tls://127.0.0.1:38211";
        assert_eq!(
            normalise(line, &[]),
            "• delivery: run started — cotal-delivery [VERSION] (build [BUILD]), pid [PID], space demo, root [TMP], broker tls://127.0.0.1:[PORT]"
        );
        let u = key('U', 'D');
        let status = format!("lease:        held by local.{u}, incarnation {}, ready, age 3 s\ncredential:   delivery expires 2026-12-07T16:00:00Z (in 3599 s)\ncredential:   delivery expires 2026-12-07T15:00:00Z (expired)", "0a".repeat(16));
        assert_eq!(
            normalise(&status, &[]),
            "lease:        held by local.[NKEY1], incarnation [INCARNATION], ready, age [N] s\ncredential:   delivery expires [TIME] (in [N] s)\ncredential:   delivery expires [TIME] (expired)"
        );
    }

    /// The data-path, inspect and lease tests' lines (once DATA_PATH_RULES and LEASE_RULES):
    /// a durable's uid, a lifecycle's, `inspect`'s ages, the broker's last sequence.
    /// Mutations seen failing: the uid rule narrowed to a principal's (`dlv_local-bob-<uid>`
    /// printed as it was); the age rule dropped (`oldest 1 min 5 s`).
    #[test]
    fn the_data_path_and_lease_lines_keep_their_tokens() {
        let uid = "a".repeat(20) + "0123456789ab";
        let u = key('U', 'E');
        let line = format!("! delivery: binding dlv_local-bob-{uid} in space demo while the delivery lease is not ready (held by local.{u}); a daemon that starts later delivers through it.");
        assert_eq!(
            normalise(&line, &[]),
            "! delivery: binding dlv_local-bob-[UID] in space demo while the delivery lease is not ready (held by local.[NKEY1]); a daemon that starts later delivers through it."
        );
        let inspect = format!("local.bob in space demo: 3 owed, oldest 1 min 5 s\n  lifecycle {uid} (acl live): 0 in INBOX not yet handed off, 3 in DLV not yet surfaced (oldest 12 s)");
        assert_eq!(
            normalise(&inspect, &[]),
            "local.bob in space demo: 3 owed, oldest [AGE]\n  lifecycle [UID] (acl live): 0 in INBOX not yet handed off, 3 in DLV not yet surfaced (oldest [AGE])"
        );
        let line = "✗ delivery: a lease watch event found the key gone and another daemon has taken shard 0 (wrong last sequence: 17 (key exists)), exiting so the holder is single";
        assert!(normalise(line, &[]).contains("(wrong last sequence: [SEQ] (key exists))"));
    }

    /// A manager's line and a rail's reply (once MANAGER_RULES and REPLY_RULES): the request
    /// count, the JSON numbers and ids that differ per run, a server id apart from user keys.
    /// Mutations seen failing: the server id rule dropped (`"serverId":"[NKEY1]"`); the JSON key
    /// rule dropped (`"seq":42`).
    #[test]
    fn the_manager_and_reply_lines_keep_their_tokens() {
        let line = "✗ manager: the delivery daemon did not answer on ctl.delivery-admin within 4000 ms (12 requests); not starting";
        assert_eq!(
            normalise(line, &[]),
            "✗ manager: the delivery daemon did not answer on ctl.delivery-admin within [N] ms ([N] requests); not starting"
        );
        let (n, u) = (key('N', 'F'), key('U', 'G'));
        let reply = format!(
            r#"{{"seq":42,"takenAt":1765000000,"instance":"{}","tuple":{{"serverId":"{n}","cid":999999,"userNkey":"{u}"}},"storeId":"0f8e2c1a-1b2c-4d3e-8f90-a1b2c3d4e5f6","exp":1796053201}}"#,
            "b".repeat(32)
        );
        assert_eq!(
            normalise(&reply, &[]),
            r#"{"seq":[N],"takenAt":[N],"instance":"[TOKEN]","tuple":{"serverId":"[SERVER]","cid":999999,"userNkey":"[NKEY1]"},"storeId":"[UUID]","exp":[N]}"#
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
