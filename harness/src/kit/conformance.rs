//! The seed documents split into sentences, and the conformance map (docs/conformance.md, "The
//! map") that names each sentence's proof: the cases that quote it, or the Rust tests that prove
//! it with the reason it cannot be a case, or why it is out of scope. The unit test at the
//! bottom holds the map complete: every sentence of the three seeds has exactly one item, every
//! case an item names exists and quotes that sentence, every Rust test it names exists.
//!
//! Why here: the seeds are the contract (docs/seeds/README.md); a sentence nobody mapped is a
//! requirement nobody proved, and only a test that reads the documents themselves notices one.

use std::collections::BTreeMap;

/// The three seed documents, in the order the map lists them.
pub const SEED_FILES: &[&str] = &[
    "delivery-service-contracts.txt",
    "embedded-daemon-lifecycle.txt",
    "delivery-daemon-concept.txt",
];

/// The comparison form of a quotation: typographic quotes typed plainly, markdown emphasis,
/// code marks and link targets dropped, whitespace collapsed. Two seeds that say one sentence,
/// one of them with markdown, say it once.
pub fn plain(text: &str) -> String {
    let text = text
        .replace(['\u{2019}', '\u{2018}'], "'")
        .replace(['\u{201c}', '\u{201d}'], "\"");
    // `[label](target)` -> `label`.
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(open) = rest.find('[') {
        let (before, from) = rest.split_at(open);
        out.push_str(before);
        match from.find("](").and_then(|mid| {
            from[mid..]
                .find(')')
                .map(|close| (mid, mid + close))
                .filter(|(mid, _)| !from[1..*mid].contains(['[', ']']))
        }) {
            Some((mid, close)) => {
                out.push_str(&from[1..mid]);
                rest = &from[close + 1..];
            }
            None => {
                out.push('[');
                rest = &from[1..];
            }
        }
    }
    out.push_str(rest);
    out.replace(['`', '*'], "")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A line that is not prose: a heading (markdown `#`, the web page's "Copy Anchor Link"
/// headings, a title line with no closing punctuation) or a line of a code example.
fn not_prose(line: &str) -> bool {
    let t = line.trim();
    let code = line.starts_with(' ')
        || ["import ", "await ", "//", ");", "}"]
            .iter()
            .any(|p| t.starts_with(p));
    let closed = t
        .trim_end_matches(['`', '*', ')', '"', '\u{201d}'])
        .ends_with(['.', ':', '!', '?']);
    code || t.starts_with('#') || t.ends_with("Copy Anchor Link") || !closed && !t.starts_with('|')
}

/// The sentences of one paragraph of prose, verbatim. A sentence ends at `.`, `!` or `?`
/// (closing marks may follow: `)` only after a period, so `store?)` inside a signature does not
/// end one) followed by whitespace; `!` and `?` end one only after a word and not before a
/// closing bracket, so the `! delivery:` of a quoted line, `??` and `{ preflight? })` do not.
fn split(prose: &str) -> Vec<String> {
    let chars: Vec<char> = prose.chars().collect();
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let ends = match c {
            '.' => true,
            '!' | '?' => {
                i > 0
                    && chars[i - 1].is_alphanumeric()
                    && chars[i + 1..]
                        .iter()
                        .find(|ch| !ch.is_whitespace())
                        .is_none_or(|ch| !matches!(ch, '}' | ')'))
            }
            _ => false,
        };
        if ends {
            let mut j = i + 1;
            while j < chars.len()
                && (matches!(chars[j], '"' | '\u{201d}' | '*' | '`' | '\'')
                    || chars[j] == ')' && c == '.')
            {
                j += 1;
            }
            if j == chars.len() || chars[j].is_whitespace() {
                let s: String = chars[start..j].iter().collect();
                if !s.trim().is_empty() {
                    out.push(s.trim().to_string());
                }
                start = j;
                i = j;
                continue;
            }
        }
        i += 1;
    }
    let s: String = chars[start..].iter().collect();
    if !s.trim().is_empty() {
        out.push(s.trim().to_string());
    }
    out
}

/// The requirements of one seed document, in order: its sentences, and each row of a table (its
/// cells joined by ` | `). Not requirements, and left out: the front matter, headings, code
/// examples, a table's header and separator rows, and the label that opens a bullet
/// (`**Fan-out writer.**`, `• Trusted reader.`).
pub fn sentences(doc: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = doc.lines().peekable();
    if lines.peek() == Some(&"---") {
        lines.next();
        for l in lines.by_ref() {
            if l == "---" {
                break;
            }
        }
    }
    // The number of cells of the table being read: a row's cells past it are prose.
    let mut columns: Option<usize> = None;
    for line in lines {
        if line.trim().is_empty() {
            columns = None;
            continue;
        }
        let mut prose = line.trim();
        if let Some(row) = prose.strip_prefix('|') {
            let cells: Vec<&str> = row.split('|').collect();
            if cells.iter().all(|c| c.trim().chars().all(|ch| ch == '-')) {
                continue;
            }
            let Some(n) = columns else {
                // The header row names the columns.
                columns = Some(cells.iter().filter(|c| !c.trim().is_empty()).count());
                continue;
            };
            let row_cells: Vec<&str> = cells.iter().take(n).map(|c| c.trim()).collect();
            out.push(row_cells.join(" | "));
            match cells.get(n..) {
                Some(rest) if rest.iter().any(|c| !c.trim().is_empty()) => {
                    prose = line.trim();
                    // The prose after the row's last cell.
                    let mut at = 0;
                    for _ in 0..=n {
                        at += prose[at..].find('|').map(|p| p + 1).unwrap_or(0);
                    }
                    prose = prose[at..].trim();
                }
                _ => continue,
            }
        } else if not_prose(line) {
            continue;
        }
        let mut bullet = false;
        for marker in ["- ", "\u{2022} "] {
            if let Some(r) = prose.strip_prefix(marker) {
                prose = r;
                bullet = true;
            }
        }
        let mut parts = split(prose);
        if bullet
            && parts
                .first()
                .is_some_and(|s| s.split_whitespace().count() <= 3)
        {
            parts.remove(0);
        }
        out.extend(parts);
    }
    out
}

/// What the map says proves a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proof {
    /// Cases of the catalogue that quote the sentence (`case \`<id>\``); further tests may be
    /// named after `; also`.
    Cases(Vec<String>),
    /// Rust tests (`\`module::test\``) and the reason the sentence cannot be a case.
    Tests { tests: Vec<String>, reason: String },
    /// The seeds say it again: the beginning of the sentence whose item proves it.
    Same(String),
    /// Out of scope, by one of the reasons listed under "Out of scope".
    Out(String),
    /// A black-box sentence no case proves yet: what is missing, and what proves it today.
    Owed(String),
}

impl Proof {
    /// The kind as the counts line names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Proof::Cases(_) => "case",
            Proof::Tests { .. } => "test",
            Proof::Same(_) => "same",
            Proof::Out(_) => "out",
            Proof::Owed(_) => "owed",
        }
    }
}

/// One item of the map: the sentence as quoted, the seed section it is listed under, its
/// proof (and the text of its proof line, for the names it gives), and its line in the map.
#[derive(Debug, Clone)]
pub struct MapItem {
    pub seed: String,
    pub sentence: String,
    pub proof: Proof,
    pub proof_text: String,
    pub line: usize,
}

/// The map as docs/conformance.md writes it.
#[derive(Debug, Default)]
pub struct Map {
    pub items: Vec<MapItem>,
    /// The out-of-scope reasons by key.
    pub reasons: BTreeMap<String, String>,
    /// The counts line: `Counts: …`.
    pub counts: Option<String>,
}

/// The backquoted names of `text`.
pub fn quoted_names(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Reads the map: `### \`<seed file>\`` opens a seed's section; an item is a line
/// `- «sentence»` followed by its proof on the next line, `  → ` and one of `case \`<id>\`, …`,
/// `test \`<name>\`, … — not a case: <reason>`, `same as «<beginning>»`, `out: \`<key>\`` or
/// `owed: <what>`; an out-of-scope reason is a line `- \`<key>\`: <why>` under
/// `## Out of scope`; the counts are the line that begins `Counts: `.
pub fn parse_map(md: &str) -> Result<Map, Vec<String>> {
    let mut map = Map::default();
    let mut errors = Vec::new();
    let mut seed: Option<String> = None;
    let mut in_reasons = false;
    let lines: Vec<&str> = md.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let n = i + 1;
        i += 1;
        if line.starts_with("Counts: ") {
            map.counts = Some(line.to_string());
            continue;
        }
        if let Some(h) = line.strip_prefix("## ") {
            in_reasons = h.trim() == "Out of scope";
            seed = None;
            continue;
        }
        if let Some(h) = line.strip_prefix("### ") {
            let h = h.trim().trim_matches('`');
            seed = SEED_FILES.contains(&h).then(|| h.to_string());
            continue;
        }
        if in_reasons {
            if let Some(r) = line.strip_prefix("- `") {
                match r.split_once("`: ") {
                    Some((key, why)) if !why.trim().is_empty() => {
                        map.reasons.insert(key.to_string(), why.trim().to_string());
                    }
                    _ => errors.push(format!("line {n}: a reason is \"- `key`: why\"")),
                }
            }
            continue;
        }
        let Some(rest) = line.strip_prefix("- \u{ab}") else {
            continue;
        };
        let Some(seed) = seed.clone() else {
            errors.push(format!("line {n}: an item outside a seed's section"));
            continue;
        };
        let Some(sentence) = rest.strip_suffix('\u{bb}') else {
            errors.push(format!(
                "line {n}: the sentence does not end the line with \u{bb}"
            ));
            continue;
        };
        let Some(proof_text) = lines.get(i).and_then(|l| l.strip_prefix("  \u{2192} ")) else {
            errors.push(format!(
                "line {}: no proof (\"  \u{2192} …\") after the sentence",
                n + 1
            ));
            continue;
        };
        i += 1;
        let proof_text = proof_text.trim();
        let proof = if proof_text.starts_with("case `") {
            // The ids up to `; also`: `case `a/b`, case `c/d`; also …`.
            let head = proof_text.split("; also").next().unwrap_or_default();
            Proof::Cases(quoted_names(head))
        } else if let Some(t) = proof_text.strip_prefix("test ") {
            match t.split_once(" \u{2014} not a case: ") {
                Some((tests, reason)) if !reason.trim().is_empty() => Proof::Tests {
                    tests: quoted_names(tests),
                    reason: reason.trim().to_string(),
                },
                _ => {
                    errors.push(format!(
                        "line {}: a test proof ends with \" \u{2014} not a case: <reason>\"",
                        n + 1
                    ));
                    continue;
                }
            }
        } else if let Some(s) = proof_text.strip_prefix("same as \u{ab}") {
            match s.strip_suffix('\u{bb}') {
                Some(s) if !s.trim().is_empty() => Proof::Same(s.to_string()),
                _ => {
                    errors.push(format!("line {}: `same as «<beginning>»`", n + 1));
                    continue;
                }
            }
        } else if let Some(key) = proof_text.strip_prefix("out: ") {
            Proof::Out(key.trim().trim_matches('`').to_string())
        } else if let Some(what) = proof_text.strip_prefix("owed: ") {
            Proof::Owed(what.trim().to_string())
        } else {
            errors.push(format!(
                "line {}: a proof is `case`, `test`, `same as`, `out:` or `owed:`",
                n + 1
            ));
            continue;
        };
        map.items.push(MapItem {
            seed,
            sentence: sentence.to_string(),
            proof,
            proof_text: proof_text.to_string(),
            line: n,
        });
    }
    if errors.is_empty() {
        Ok(map)
    } else {
        Err(errors)
    }
}

/// The counts line the map must carry: how many items of each kind.
pub fn counts_line(items: &[MapItem]) -> String {
    let n = |k: &str| items.iter().filter(|i| i.proof.kind() == k).count();
    format!(
        "Counts: {} sentences; {} proved by cases, {} by Rust tests, {} restated, {} out of scope, {} owed.",
        items.len(),
        n("case"),
        n("test"),
        n("same"),
        n("out"),
        n("owed")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::catalogue::{shipped_root, Catalogue};
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// Every `fn <name>` of the workspace's Rust sources (daemon, harness, smoke).
    fn functions() -> BTreeSet<String> {
        fn walk(dir: &Path, out: &mut BTreeSet<String>, re: &regex::Regex) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() && p.file_name().is_some_and(|n| n != "target") {
                    walk(&p, out, re);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap_or_default();
                    out.extend(re.captures_iter(&text).map(|c| c[1].to_string()));
                }
            }
        }
        let re = regex::Regex::new(r"\bfn\s+([a-z_0-9]+)").expect("pattern");
        let mut out = BTreeSet::new();
        for d in ["daemon", "harness", "smoke"] {
            walk(&repo().join(d), &mut out, &re);
        }
        out
    }

    /// Sentences end at their stop, not at the `!` of a quoted line, a signature's `?)` or a
    /// `??`; a bullet's label, headings and code are left out; a table row is one sentence, and
    /// prose after a row's last cell is read as prose.
    /// Mutation seen failing: `!` and `?` ending a sentence after any character.
    #[test]
    fn sentences_end_at_their_stop_and_not_inside_a_quoted_line_or_a_signature() {
        let doc = "Title line\n\n- **Label.** The daemon logs ! delivery: x at once. Then it exits.\n\nf(a, b?) reads c ?? d. Is it? Yes.\n\nimport { x } from \"y\";\n\n| A | B |\n| --- | --- |\n| one | two | After the row. Done.\n";
        assert_eq!(
            sentences(doc),
            vec![
                "The daemon logs ! delivery: x at once.",
                "Then it exits.",
                "f(a, b?) reads c ?? d.",
                "Is it?",
                "Yes.",
                "one | two",
                "After the row.",
                "Done.",
            ]
        );
        assert_eq!(
            plain("A *`live`* [SPEC §4](../SPEC.md#4) \u{201c}x\u{201d}"),
            "A live SPEC §4 \"x\""
        );
    }

    /// docs/conformance.md maps every sentence of the three seed documents, once, under the first
    /// document that says it; every case it names exists and quotes the sentence, and every
    /// sentence a case quotes names that case; every Rust test it names exists; every `same as`
    /// names one other sentence, which is not itself a restatement; every out-of-scope reason is listed
    /// and used; its counts line is the map's.
    /// Mutations seen failing: an item removed (the sentence is unmapped); a case named at a
    /// sentence it does not quote; a test name misspelt; a counts line left stale.
    #[test]
    fn the_conformance_map_names_a_proof_for_every_seed_sentence() {
        let seeds = repo().join("docs/seeds");
        // The plain form of each sentence, and the first seed that says it.
        let mut first: BTreeMap<String, &str> = BTreeMap::new();
        for f in SEED_FILES {
            let doc = std::fs::read_to_string(seeds.join(f)).expect("seed");
            for s in sentences(&doc) {
                first.entry(plain(&s)).or_insert(f);
            }
        }
        let md = std::fs::read_to_string(repo().join("docs/conformance.md")).expect("the map");
        let map =
            parse_map(&md).unwrap_or_else(|e| panic!("docs/conformance.md:\n{}", e.join("\n")));
        let cat = Catalogue::load(&shipped_root()).expect("the catalogue loads");
        let fns = functions();
        let case_id = regex::Regex::new(r"^[a-z-]+/[a-z0-9-]+$").expect("pattern");
        let mut errors = Vec::new();
        let mut by_plain: BTreeMap<String, &MapItem> = BTreeMap::new();
        for item in &map.items {
            let p = plain(&item.sentence);
            let at = format!("docs/conformance.md:{}", item.line);
            match first.get(&p) {
                None => errors.push(format!("{at}: no seed says \u{ab}{}\u{bb}", item.sentence)),
                Some(f) if **f != item.seed => errors.push(format!(
                    "{at}: \u{ab}{}\u{bb} belongs under {f}, the first document that says it",
                    item.sentence
                )),
                _ => {}
            }
            if by_plain.insert(p, item).is_some() {
                errors.push(format!(
                    "{at}: \u{ab}{}\u{bb} is mapped twice",
                    item.sentence
                ));
            }
            for name in quoted_names(&item.proof_text) {
                if name.contains("::") {
                    let last = name.rsplit("::").next().unwrap_or_default();
                    if !fns.contains(last) {
                        errors.push(format!("{at}: no Rust test `{name}`"));
                    }
                } else if case_id.is_match(&name) && !cat.cases.iter().any(|c| c.id == name) {
                    errors.push(format!("{at}: no case `{name}`"));
                }
            }
            match &item.proof {
                Proof::Cases(ids) => {
                    for id in ids {
                        if let Some(c) = cat.cases.iter().find(|c| &c.id == id) {
                            if !plain(&c.sentence).contains(&plain(&item.sentence)) {
                                errors.push(format!(
                                    "{at}: case `{id}` does not quote \u{ab}{}\u{bb}",
                                    item.sentence
                                ));
                            }
                        }
                    }
                }
                Proof::Tests { tests, .. } if tests.is_empty() => {
                    errors.push(format!("{at}: a test proof names no test"))
                }
                Proof::Out(key) if !map.reasons.contains_key(key) => {
                    errors.push(format!("{at}: out-of-scope reason `{key}` is not listed"))
                }
                _ => {}
            }
        }
        for (p, f) in &first {
            if !by_plain.contains_key(p) {
                errors.push(format!("{f}: \u{ab}{p}\u{bb} is not in the map"));
            }
        }
        for item in &map.items {
            if let Proof::Same(start) = &item.proof {
                let start = plain(start);
                let targets: Vec<&&MapItem> = by_plain
                    .iter()
                    .filter(|(p, i)| p.starts_with(&start) && i.line != item.line)
                    .map(|(_, i)| i)
                    .collect();
                match targets.as_slice() {
                    [t] if matches!(t.proof, Proof::Same(_)) => errors.push(format!(
                        "docs/conformance.md:{}: `same as` names a restatement (line {})",
                        item.line, t.line
                    )),
                    [_] => {}
                    _ => errors.push(format!(
                        "docs/conformance.md:{}: `same as \u{ab}{start}\u{bb}` names {} sentences, not one",
                        item.line,
                        targets.len()
                    )),
                }
            }
        }
        for c in &cat.cases {
            let quoted = plain(&c.sentence);
            for (p, item) in &by_plain {
                if quoted.contains(p.as_str())
                    && !matches!(&item.proof, Proof::Cases(ids) if ids.contains(&c.id))
                {
                    errors.push(format!(
                        "docs/conformance.md:{}: case `{}` quotes \u{ab}{}\u{bb}, whose item does not name it",
                        item.line, c.id, item.sentence
                    ));
                }
            }
        }
        for key in map.reasons.keys() {
            if !map.items.iter().any(|i| i.proof == Proof::Out(key.clone())) {
                errors.push(format!(
                    "out-of-scope reason `{key}` is listed but not used"
                ));
            }
        }
        let counts = counts_line(&map.items);
        if map.counts.as_deref() != Some(counts.as_str()) {
            errors.push(format!("the counts line should read:\n{counts}"));
        }
        eprintln!("{counts}");
        assert!(errors.is_empty(), "{}", errors.join("\n"));
    }
}
