//! What `harness qualify` reports: per (case, shape) a behaviour verdict (pass, fail, blocked
//! by a precondition the case stands on, skipped with its reason) and, beside it, a transcript
//! verdict (the case's normalised lines against its snapshot, in the distribution profile only),
//! its duration and figures (p50 and max over `--repeat` rounds), and for a failure the step with
//! what it expected and what happened. Rendered as a table for people, JSON and JUnit XML for a
//! CI that gates on it; each names the profile it judged.

use serde::Serialize;

use super::profile::KitProfile;

/// The behaviour's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CaseVerdict {
    Pass,
    Fail,
    /// A step the case stands on another case's sentence for failed: that sentence, not this
    /// case's, is what did not hold (`blocked_by` names the case).
    Blocked,
    Skipped,
}

/// The transcript's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TranscriptVerdict {
    /// The normalised lines are the snapshot's.
    Match,
    /// The steps passed but the lines changed.
    Drift,
    /// The case has no snapshot.
    Missing,
    /// Not compared: `--behaviour-only`, a failed or skipped case.
    NotCompared,
}

/// The form a case runs in: its `[scaled]` table applied, or as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Form {
    Scaled,
    AsWritten,
}

/// A figure over the rounds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Figure {
    pub name: String,
    pub p50_ms: u128,
    pub max_ms: u128,
    pub values_ms: Vec<u128>,
}

/// Where and how a case failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailureReport {
    /// 0: before the first step (the mesh did not start); the transcript drift has its own.
    pub step: usize,
    pub line: usize,
    pub verb: String,
    pub expected: String,
    pub actual: String,
    pub round: usize,
    /// The failed step's label, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The failed step's profile.
    pub profile: KitProfile,
}

/// One (case, shape).
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    pub id: String,
    pub family: String,
    pub seed: String,
    pub sentence: String,
    pub shape: String,
    /// The case's own profile: a distribution case is skipped by a contract run.
    pub case_profile: KitProfile,
    /// The cases this one stands on (its steps' `stands_on`).
    pub preconditions: Vec<String>,
    pub verdict: CaseVerdict,
    /// The case whose sentence blocked this one (verdict `blocked`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    pub transcript: TranscriptVerdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transcript_difference: Option<String>,
    /// `scaled` when the case ran its `[scaled]` table, else `as-written`.
    pub form: Form,
    /// Why a run asked to scale ran this case as written: under the contract profile, its
    /// scaled form shortens a knob no seed names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shipped_because: Option<String>,
    pub duration_ms: u128,
    pub rounds: usize,
    pub figures: Vec<Figure>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureReport>,
    /// Where this case's logs were kept, if they were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<String>,
}

impl CaseReport {
    /// Whether this case fails the run: its behaviour, or (unless `--behaviour-only`) its
    /// transcript.
    pub fn fails(&self, behaviour_only: bool) -> bool {
        self.verdict == CaseVerdict::Fail
            || (!behaviour_only
                && matches!(
                    self.transcript,
                    TranscriptVerdict::Drift | TranscriptVerdict::Missing
                ))
    }

    /// The cell the table shows.
    fn cell(&self) -> String {
        match (&self.verdict, &self.transcript) {
            (CaseVerdict::Pass, TranscriptVerdict::Drift) => "pass, drift".into(),
            (CaseVerdict::Pass, TranscriptVerdict::Missing) => "pass, no snapshot".into(),
            (CaseVerdict::Pass, _) => "pass".into(),
            (CaseVerdict::Fail, _) => "FAIL".into(),
            (CaseVerdict::Blocked, _) => format!(
                "blocked by {}",
                self.blocked_by.as_deref().unwrap_or("a precondition")
            ),
            (CaseVerdict::Skipped, _) => "skipped".into(),
        }
    }
}

/// What was qualified, with what.
#[derive(Debug, Clone, Serialize)]
pub struct Subject {
    pub daemon: String,
    pub daemon_version: String,
    pub nats_server: String,
    pub nats_server_version: String,
    /// The catalogue's digest (`sha256:…`, `kit::carried`) and where it was found.
    pub catalogue: String,
    pub catalogue_origin: String,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct QualifyReport {
    pub harness_version: String,
    #[serde(flatten)]
    pub subject: Subject,
    /// The profile every case was judged under.
    pub profile: KitProfile,
    pub scaled: bool,
    pub behaviour_only: bool,
    /// `pass`, or `fail` when a case failed or was blocked.
    pub verdict: CaseVerdict,
    pub passed: usize,
    pub failed: usize,
    pub blocked: usize,
    pub skipped: usize,
    pub duration_ms: u128,
    pub cases: Vec<CaseReport>,
}

impl QualifyReport {
    pub fn new(
        subject: Subject,
        profile: KitProfile,
        scaled: bool,
        behaviour_only: bool,
        cases: Vec<CaseReport>,
        duration_ms: u128,
    ) -> QualifyReport {
        let failed = cases.iter().filter(|c| c.fails(behaviour_only)).count();
        let blocked = cases
            .iter()
            .filter(|c| c.verdict == CaseVerdict::Blocked)
            .count();
        let skipped = cases
            .iter()
            .filter(|c| c.verdict == CaseVerdict::Skipped)
            .count();
        let passed = cases.len() - failed - blocked - skipped;
        QualifyReport {
            harness_version: env!("CARGO_PKG_VERSION").to_string(),
            subject,
            profile,
            scaled,
            behaviour_only,
            verdict: if failed + blocked == 0 {
                CaseVerdict::Pass
            } else {
                CaseVerdict::Fail
            },
            passed,
            failed,
            blocked,
            skipped,
            duration_ms,
            cases,
        }
    }

    /// Exit status: 0 every selected case passed (skips included), 1 one failed or was blocked.
    pub fn exit_code(&self) -> i32 {
        if self.failed + self.blocked == 0 {
            0
        } else {
            1
        }
    }

    /// The verdict table and, below it, each failing case with its sentence and what it
    /// expected against what happened.
    pub fn table(&self) -> String {
        let id_w = self
            .cases
            .iter()
            .map(|c| c.id.len() + c.shape.len() + 3)
            .max()
            .unwrap_or(10)
            .max(10);
        let verdict_w = self
            .cases
            .iter()
            .map(|c| c.cell().chars().count())
            .max()
            .unwrap_or(0)
            .max(18);
        let mut out = format!("profile: {}\n\n", self.profile);
        out.push_str(&format!(
            "{:<id_w$}  {:<12}  {:<verdict_w$}  {:>9}  figures\n",
            "case [shape]", "family", "verdict", "duration"
        ));
        for c in &self.cases {
            let figures: Vec<String> = c
                .figures
                .iter()
                .map(|f| {
                    if f.values_ms.len() > 1 {
                        format!("{} p50 {} ms max {} ms", f.name, f.p50_ms, f.max_ms)
                    } else {
                        format!("{} {} ms", f.name, f.max_ms)
                    }
                })
                .collect();
            let verdict = match &c.skip_reason {
                Some(_) => "skipped".to_string(),
                None => c.cell(),
            };
            out.push_str(&format!(
                "{:<id_w$}  {:<12}  {:<verdict_w$}  {:>7.1} s  {}\n",
                format!("{} [{}]", c.id, c.shape),
                c.family,
                verdict,
                c.duration_ms as f64 / 1000.0,
                figures.join("; ")
            ));
        }
        out.push_str(&format!(
            "\n{} passed, {} failed, {} blocked, {} skipped ({:.1} s, {} profile)\n",
            self.passed,
            self.failed,
            self.blocked,
            self.skipped,
            self.duration_ms as f64 / 1000.0,
            self.profile
        ));
        for c in self
            .cases
            .iter()
            .filter(|c| c.verdict == CaseVerdict::Skipped)
        {
            out.push_str(&format!(
                "skipped {} [{}]: {}\n",
                c.id,
                c.shape,
                c.skip_reason.as_deref().unwrap_or_default()
            ));
        }
        for c in self
            .cases
            .iter()
            .filter(|c| c.fails(self.behaviour_only) || c.verdict == CaseVerdict::Blocked)
        {
            match &c.blocked_by {
                Some(by) => out.push_str(&format!(
                    "\nBLOCKED {} [{}] by {by}: a step it stands on that case for failed\n",
                    c.id, c.shape
                )),
                None => out.push_str(&format!("\nFAILED {} [{}]\n", c.id, c.shape)),
            }
            out.push_str(&format!(
                "  proves ({}): {}\n",
                c.seed,
                one_line(&c.sentence)
            ));
            if let Some(f) = &c.failure {
                if f.step == 0 {
                    out.push_str("  the mesh did not start\n");
                } else {
                    out.push_str(&format!(
                        "  step {} (line {}, `{}`{}{}){}\n",
                        f.step,
                        f.line,
                        f.verb,
                        f.label
                            .as_ref()
                            .map(|l| format!(", label {l:?}"))
                            .unwrap_or_default(),
                        match f.profile {
                            KitProfile::Distribution => ", a distribution step",
                            KitProfile::Contract => "",
                        },
                        if c.rounds > 1 {
                            format!(", round {}", f.round)
                        } else {
                            String::new()
                        }
                    ));
                }
                out.push_str(&format!("  expected: {}\n", f.expected));
                out.push_str(&format!("  happened: {}\n", f.actual));
            } else if let Some(d) = &c.transcript_difference {
                out.push_str(&format!(
                    "  its steps passed, its transcript changed: {d}\n"
                ));
            } else if c.transcript == TranscriptVerdict::Missing {
                out.push_str("  its steps passed; it has no snapshot to compare with\n");
            }
            if let Some(l) = &c.logs {
                out.push_str(&format!("  logs: {l}\n"));
            }
        }
        out
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// JUnit XML: a suite per family, a test case per (case, shape); a behaviour failure and a
    /// transcript drift are failures of their own `type`; a blocked case is an
    /// `<error type="blocked">` (it was not judged, and it fails the run); a skip is
    /// `<skipped>`. The profile is the suites' `name` and a property.
    pub fn junit(&self) -> String {
        let mut families: Vec<&str> = self.cases.iter().map(|c| c.family.as_str()).collect();
        families.dedup();
        let mut seen = std::collections::BTreeSet::new();
        families.retain(|f| seen.insert(*f));
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        out.push_str(&format!(
            "<testsuites name=\"harness qualify ({} profile)\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3}\">\n",
            self.profile,
            self.cases.len(),
            self.failed,
            self.blocked,
            self.skipped,
            self.duration_ms as f64 / 1000.0
        ));
        for fam in families {
            let cases: Vec<&CaseReport> = self.cases.iter().filter(|c| c.family == fam).collect();
            let failures = cases
                .iter()
                .filter(|c| c.fails(self.behaviour_only))
                .count();
            let skipped = cases
                .iter()
                .filter(|c| c.verdict == CaseVerdict::Skipped)
                .count();
            let errors = cases
                .iter()
                .filter(|c| c.verdict == CaseVerdict::Blocked)
                .count();
            let time: u128 = cases.iter().map(|c| c.duration_ms).sum();
            out.push_str(&format!(
                "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" time=\"{:.3}\">\n",
                xml(fam),
                cases.len(),
                time as f64 / 1000.0
            ));
            out.push_str(&format!(
                "    <properties><property name=\"profile\" value=\"{}\"/></properties>\n",
                self.profile
            ));
            for c in cases {
                out.push_str(&format!(
                    "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\">\n",
                    xml(&c.family),
                    xml(&format!("{} [{}]", c.id, c.shape)),
                    c.duration_ms as f64 / 1000.0
                ));
                match (&c.verdict, &c.failure) {
                    (CaseVerdict::Skipped, _) => out.push_str(&format!(
                        "      <skipped message=\"{}\"/>\n",
                        xml(c.skip_reason.as_deref().unwrap_or_default())
                    )),
                    (CaseVerdict::Blocked, f) => out.push_str(&format!(
                        "      <error type=\"blocked\" message=\"{}\">{}</error>\n",
                        xml(&format!(
                            "blocked by {}",
                            c.blocked_by.as_deref().unwrap_or("a precondition")
                        )),
                        xml(&f
                            .as_ref()
                            .map(|f| format!(
                                "step {} (line {}, {}) stands on {}: expected {}; happened {}",
                                f.step,
                                f.line,
                                f.verb,
                                c.blocked_by.as_deref().unwrap_or("a precondition"),
                                f.expected,
                                f.actual
                            ))
                            .unwrap_or_default())
                    )),
                    (CaseVerdict::Fail, Some(f)) => out.push_str(&format!(
                        "      <failure type=\"behaviour\" message=\"{}\">step {} (line {}, {}): proves: {}\nexpected: {}\nhappened: {}</failure>\n",
                        xml(&format!("expected {}", f.expected)),
                        f.step,
                        f.line,
                        xml(&f.verb),
                        xml(&one_line(&c.sentence)),
                        xml(&f.expected),
                        xml(&f.actual)
                    )),
                    _ if c.fails(self.behaviour_only) => out.push_str(&format!(
                        "      <failure type=\"transcript\" message=\"the transcript changed\">{}</failure>\n",
                        xml(c.transcript_difference.as_deref().unwrap_or("no snapshot"))
                    )),
                    _ => {}
                }
                if let Some(l) = &c.logs {
                    out.push_str(&format!(
                        "      <system-out>logs: {}</system-out>\n",
                        xml(l)
                    ));
                }
                out.push_str("    </testcase>\n");
            }
            out.push_str("  </testsuite>\n");
        }
        out.push_str("</testsuites>\n");
        out
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Text escaped for an XML attribute or element.
pub fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => {
                out.push_str(&format!("&#{};", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

/// The p50 (lower median) and max of `values`.
pub fn figure(name: &str, mut values: Vec<u128>) -> Figure {
    values.sort_unstable();
    let p50 = values
        .get((values.len().saturating_sub(1)) / 2)
        .copied()
        .unwrap_or(0);
    let max = values.last().copied().unwrap_or(0);
    Figure {
        name: name.to_string(),
        p50_ms: p50,
        max_ms: max,
        values_ms: values,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(id: &str, verdict: CaseVerdict, transcript: TranscriptVerdict) -> CaseReport {
        CaseReport {
            id: id.into(),
            family: id.split('/').next().unwrap_or_default().into(),
            seed: "s.txt".into(),
            sentence: "A <sentence> & more".into(),
            shape: "operator".into(),
            case_profile: KitProfile::Contract,
            preconditions: vec!["lifecycle/serves".into()],
            verdict: verdict.clone(),
            blocked_by: (verdict == CaseVerdict::Blocked).then(|| "lifecycle/serves".into()),
            transcript,
            skip_reason: (verdict == CaseVerdict::Skipped).then(|| "no {creds}".into()),
            transcript_difference: None,
            duration_ms: 1500,
            rounds: 1,
            figures: vec![figure("exit", vec![15_200])],
            failure: matches!(verdict, CaseVerdict::Fail | CaseVerdict::Blocked).then(|| {
                FailureReport {
                    step: 3,
                    line: 12,
                    verb: "expect_exit".into(),
                    expected: "exit 9".into(),
                    actual: "still running".into(),
                    round: 1,
                    label: None,
                    profile: KitProfile::Contract,
                }
            }),
            form: Form::AsWritten,
            shipped_because: None,
            logs: None,
        }
    }

    fn subject() -> Subject {
        Subject {
            daemon: "d".into(),
            daemon_version: "1".into(),
            nats_server: "n".into(),
            nats_server_version: "2.15.1".into(),
            catalogue: "sha256:0".into(),
            catalogue_origin: "given with --cases".into(),
        }
    }

    /// Mutation seen failing: `fails` ignoring the transcript (a drift passes the run).
    #[test]
    fn a_drift_fails_the_run_unless_behaviour_only() {
        let cases = vec![
            case("a/x", CaseVerdict::Pass, TranscriptVerdict::Match),
            case("a/y", CaseVerdict::Pass, TranscriptVerdict::Drift),
            case("b/z", CaseVerdict::Skipped, TranscriptVerdict::NotCompared),
        ];
        let strict = QualifyReport::new(
            subject(),
            KitProfile::Distribution,
            false,
            false,
            cases.clone(),
            10,
        );
        assert_eq!((strict.passed, strict.failed, strict.skipped), (1, 1, 1));
        assert_eq!(strict.exit_code(), 1);
        let lenient =
            QualifyReport::new(subject(), KitProfile::Distribution, false, true, cases, 10);
        assert_eq!(lenient.exit_code(), 0);
        assert!(strict.table().contains("pass, drift"));
    }

    /// Mutation seen failing: `xml` leaving `<` unescaped (the failure body breaks the XML).
    #[test]
    fn junit_has_a_suite_per_family_and_escapes_text() {
        let cases = vec![
            case("a/x", CaseVerdict::Fail, TranscriptVerdict::NotCompared),
            case("b/z", CaseVerdict::Skipped, TranscriptVerdict::NotCompared),
        ];
        let r = QualifyReport::new(subject(), KitProfile::Distribution, false, false, cases, 10);
        let x = r.junit();
        assert_eq!(x.matches("<testsuite ").count(), 2);
        assert!(x.contains("<failure type=\"behaviour\""));
        assert!(x.contains("A &lt;sentence&gt; &amp; more"));
        assert!(x.contains("<skipped message=\"no {creds}\"/>"));
        assert!(!x.contains("<sentence>"));
        let json: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(json["cases"][0]["verdict"], "fail");
        assert_eq!(json["cases"][0]["transcript"], "not-compared");
        assert_eq!(json["cases"][0]["failure"]["expected"], "exit 9");
    }

    /// A blocked case is counted apart from the failed and the skipped, fails the run, is never
    /// a JUnit `<failure>` (an `<error type="blocked">` naming the case it stands on), and the
    /// JSON says so and names the profile.
    /// Mutation seen failing: `QualifyReport::new` leaving blocked cases out of `exit_code`
    /// (a run whose every case was blocked exits 0).
    #[test]
    fn a_blocked_case_is_reported_apart_and_fails_the_run() {
        let cases = vec![
            case("a/x", CaseVerdict::Pass, TranscriptVerdict::NotCompared),
            case("a/y", CaseVerdict::Blocked, TranscriptVerdict::NotCompared),
            case("b/z", CaseVerdict::Skipped, TranscriptVerdict::NotCompared),
        ];
        let r = QualifyReport::new(subject(), KitProfile::Contract, false, false, cases, 10);
        assert_eq!(
            (r.passed, r.failed, r.blocked, r.skipped),
            (1, 0, 1, 1),
            "passed, failed, blocked, skipped"
        );
        assert_eq!(r.exit_code(), 1);
        let table = r.table();
        assert!(table.contains("blocked by lifecycle/serves"), "{table}");
        assert!(
            table.contains("1 passed, 0 failed, 1 blocked, 1 skipped"),
            "{table}"
        );
        assert!(
            table.contains("BLOCKED a/y [operator] by lifecycle/serves"),
            "{table}"
        );
        let x = r.junit();
        assert!(
            x.contains("<error type=\"blocked\" message=\"blocked by lifecycle/serves\">"),
            "{x}"
        );
        assert!(!x.contains("<failure"), "{x}");
        assert!(x.contains("harness qualify (contract profile)"), "{x}");
        let json: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(json["profile"], "contract");
        assert_eq!(json["blocked"], 1);
        assert_eq!(json["verdict"], "fail");
        assert_eq!(json["cases"][1]["verdict"], "blocked");
        assert_eq!(json["cases"][1]["blocked_by"], "lifecycle/serves");
        assert_eq!(json["cases"][1]["preconditions"][0], "lifecycle/serves");
    }

    #[test]
    fn figures_report_the_lower_median_and_the_max() {
        let f = figure("t", vec![30, 10, 20, 40]);
        assert_eq!((f.p50_ms, f.max_ms), (20, 40));
        let f = figure("t", vec![5]);
        assert_eq!((f.p50_ms, f.max_ms), (5, 5));
    }
}
