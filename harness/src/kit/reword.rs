//! The neutral build's wording (docs/qualify.md, "Proved neutral"): every line and error text
//! the daemon writes, reworded except where a seed document quotes it, and every exit code
//! changed (zero stays zero, non-zero stays non-zero). `cases/neutral.toml` compiles this file
//! (and `seeds.rs`, which it uses as `super::seeds`) into a scratch copy of the daemon at its
//! choke points; `harness mutate --neutral` then proves that no contract-profile verdict turns on
//! this distribution's wording or exit codes. Only `std` and `super::seeds` are used here: the
//! daemon compiles this file as its own module.

use super::seeds::{plain, quoted_prefix, QUOTE_MIN_WORDS};

/// `text` reworded, line by line: each run of words no seed quotes written in capitals with
/// `_` between its words (`serving space demo` → `SERVING_SPACE_DEMO`), each quoted phrase of at
/// least [`QUOTE_MIN_WORDS`] words kept as it is. A line the seeds quote whole is unchanged.
pub fn line(text: &str) -> String {
    text.split('\n').map(one).collect::<Vec<_>>().join("\n")
}

/// One line (no `\n`), reworded.
fn one(text: &str) -> String {
    // The words and where each begins and ends in `text` (bytes).
    let words: Vec<(usize, usize)> = word_spans(text);
    if words.is_empty() {
        return text.to_string();
    }
    // The line as the seeds are read (`seeds::plain`): its words joined by one space; `at[k]`
    // is where word k begins in it (chars).
    let joined = words
        .iter()
        .map(|&(s, e)| &text[s..e])
        .collect::<Vec<_>>()
        .join(" ");
    let flat: Vec<char> = plain(&joined).chars().collect();
    let mut at = Vec::with_capacity(words.len());
    let mut offset = 0;
    for &(s, e) in &words {
        at.push(offset);
        offset += text[s..e].chars().count() + 1;
    }
    let mut out: Vec<String> = Vec::new();
    let mut run: Vec<String> = Vec::new();
    let mut k = 0;
    while k < words.len() {
        let mut quote = quoted_prefix(&flat[at[k]..]);
        // A quote that ends inside a word of the line (`serves a` of `serves account`) ends
        // at the word before, unless what it leaves of the word is punctuation (`exiting` of
        // `exiting.`).
        let end = at[k] + quote;
        if end < flat.len() && flat[end] != ' ' && end > at[k] && flat[end - 1] != ' ' {
            let rest_alnum = flat[end..]
                .iter()
                .take_while(|c| **c != ' ')
                .any(|c| c.is_alphanumeric());
            if rest_alnum {
                quote = flat[at[k]..end]
                    .iter()
                    .rposition(|c| *c == ' ')
                    .unwrap_or(0);
            }
        }
        let quoted_words = flat[at[k]..at[k] + quote]
            .iter()
            .collect::<String>()
            .split(' ')
            .filter(|w| !w.is_empty())
            .count();
        if quote > 0 && quoted_words >= QUOTE_MIN_WORDS {
            // Kept as written: from word k to the char the quote ends at.
            let end_char = at[k] + quote;
            let last = (k..words.len())
                .rev()
                .find(|&j| at[j] < end_char)
                .unwrap_or(k);
            let in_last = end_char - at[last];
            let (s, e) = words[last];
            let end_byte = text[s..e]
                .char_indices()
                .nth(in_last)
                .map(|(i, _)| s + i)
                .unwrap_or(e);
            if !run.is_empty() {
                out.push(reworded(&run));
                run.clear();
            }
            out.push(text[words[k].0..end_byte].to_string());
            if end_byte < e {
                // The rest of a word the quote ends inside is reworded on its own.
                run.push(text[end_byte..e].to_string());
            }
            k = last + 1;
        } else {
            run.push(text[words[k].0..words[k].1].to_string());
            k += 1;
        }
    }
    if !run.is_empty() {
        out.push(reworded(&run));
    }
    out.join(" ")
}

/// A run of words no seed quotes, reworded.
fn reworded(run: &[String]) -> String {
    run.join("_").to_uppercase()
}

/// The whitespace-separated words of `text`, as byte ranges.
fn word_spans(text: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                spans.push((s, i));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        spans.push((s, text.len()));
    }
    spans
}

/// The neutral build's exit code for this distribution's `code`: zero stays zero, every other
/// code becomes another non-zero one (200 and up), so only "exited non-zero" survives.
pub fn exit_code(code: i32) -> i32 {
    match code {
        0 => 0,
        n => 200 + n.rem_euclid(55),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line the seeds quote whole passes unchanged; a line they do not quote is reworded
    /// (none of its phrases of two words or more survives); in a line of both, the quoted
    /// phrase survives word for word and the rest is reworded.
    /// Mutation seen failing: `one` keeping every word (the unquoted line passes unchanged);
    /// `quoted_words >= QUOTE_MIN_WORDS` dropped (a single seed word such as `delivery` kept).
    #[test]
    fn the_seeds_quotes_survive_and_nothing_else() {
        for quoted in [
            "✗ delivery: broker connection unavailable (broker unreachable), exiting (coupled to the broker)",
            "! delivery: credential expired, awaiting proved renewal",
        ] {
            assert_eq!(line(quoted), quoted);
        }
        let own = "• delivery: serving space demo as holder h-1";
        let r = line(own);
        assert_ne!(r, own);
        assert!(!r.contains("serving space"), "{r}");
        assert!(!r.contains("delivery"), "{r}");
        let mixed = "• delivery[demo]: received SIGTERM, exiting (lease released)";
        let r = line(mixed);
        assert!(r.contains("received SIGTERM, exiting"), "{r}");
        assert!(!r.contains("lease released"), "{r}");
        assert!(!r.contains("delivery[demo]"), "{r}");
        // A quote ending inside a word of the line ends at the word before: `this daemon
        // serves a` is no quote of `this daemon serves account A`.
        let r = line("but this daemon serves account A1");
        assert_eq!(r, "BUT_THIS_DAEMON_SERVES_ACCOUNT_A1");
        // Each line of a text apart.
        assert_eq!(
            line("has not finished starting\nstale leave"),
            "has not finished starting\nSTALE_LEAVE"
        );
        assert_eq!(line(""), "");
    }

    /// Zero stays zero; every code of this distribution's table (docs/operations.md: 1-10, and
    /// clap's 2) becomes another non-zero code, each its own.
    /// Mutation seen failing: `exit_code` returning `code` unchanged.
    #[test]
    fn exit_codes_change_and_keep_their_sign() {
        assert_eq!(exit_code(0), 0);
        let mapped: std::collections::BTreeSet<i32> = (1..=10).map(exit_code).collect();
        assert_eq!(mapped.len(), 10);
        for code in 1..=255 {
            let n = exit_code(code);
            assert!(
                n != 0 && n != code && (1..=255).contains(&n),
                "{code} -> {n}"
            );
        }
    }
}
