//! A case file: its header (id, family, the seed sentence it proves, the shapes it runs on, the
//! mesh, the daemons' environment, its variables and scaled form) and its steps, each parsed into
//! a typed step before anything runs. Every refusal names the file and the line, so an
//! integrator editing a case sees where it went wrong.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::expr::{self, Duration, Vars};
use super::profile::KitProfile;
use super::results::Form;
use super::seeds;
use super::shape::{MeshSpec, Shape};
use super::steps::{self, Step};

/// Verbs that act and judge nothing: a contract case needs at least one contract step that is
/// none of these (else every judging step is a distribution step, and the case is one).
const ACTING: &[&str] = &[
    "start",
    "signal",
    "agent",
    "offline",
    "online",
    "announce",
    "post",
    "plant_entry",
    "proxy",
    "proxy_fault",
    "broker",
    "observe",
    "remember_connections",
    "remember_lease",
    "watch_lease",
    "watch_advisory",
    "watch_sweeps",
    "delete_lease",
    "rewrite_lease_identical",
    "rewrite_lease_foreign_incarnation",
    "plant_reused_pid",
    "fill_store",
    "sys_material",
    "host",
    "host_material",
    "channel",
    "acl",
    "retire",
    "delete_acl",
    "delete_member",
    "delete_entries",
    "delete_consumer",
    "credential_time",
    "delay_frames",
    "release_delayed",
    "drop_frames",
    "send",
    "remint",
    "pause_consumer",
    "resume_consumer",
    "stream_config",
    "connect_once",
];

/// The keys a step's `distribution = { … }` may add to its verb's arguments: expectations only,
/// so the step acts the same under both profiles and judges more under `distribution`.
const SHARPER: &[&str] = &["error", "code", "answer", "includes"];

/// Why a case file was refused: the file, the line (0 when the whole file is at fault) and
/// what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    pub file: PathBuf,
    pub line: usize,
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(f, "{}:{}: {}", self.file.display(), self.line, self.message)
        }
    }
}

impl std::error::Error for LoadError {}

/// `[scaled]`: what replaces `[vars]` and extends `[env]` in the scaled form.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scaled {
    #[serde(default)]
    pub vars: Vars,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// `[transcript]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranscriptSpec {
    /// Daemon lines left out of the transcript (regular expressions).
    #[serde(default)]
    pub omit: Vec<String>,
}

/// The file as TOML gives it, before the steps are typed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    id: String,
    family: String,
    seed: String,
    sentence: String,
    #[serde(default)]
    shapes: Vec<String>,
    description: String,
    #[serde(default)]
    profile: Option<String>,
    #[serde(default)]
    why: Option<String>,
    /// Earlier releases' reason text, refused with the way to write it now.
    #[serde(default)]
    distribution: Option<toml::Value>,
    #[serde(default)]
    mesh: MeshSpec,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    vars: Vars,
    #[serde(default)]
    scaled: Option<Scaled>,
    #[serde(default)]
    transcript: TranscriptSpec,
    #[serde(rename = "step")]
    steps: Vec<toml::Spanned<toml::Table>>,
}

/// How a step is timed (its modifiers).
#[derive(Debug, Clone, Default)]
pub struct Timing {
    pub mark: Option<String>,
    pub since: Option<String>,
    pub within: Option<Duration>,
    pub at_least: Option<Duration>,
    pub figure: Option<String>,
}

/// One typed step and where it stands in its file.
#[derive(Debug)]
pub struct StepAt {
    /// 1-based line of its `[[step]]` table.
    pub line: usize,
    pub verb: String,
    /// The step as the contract profile runs it (and the distribution profile, unless
    /// `sharper` is given).
    pub step: Step,
    /// The step with its `distribution = { … }` expectations added: what the distribution
    /// profile runs.
    pub sharper: Option<Step>,
    pub timing: Timing,
    /// The profile the step belongs to (`profile = "distribution"`; unmarked: contract).
    pub profile: KitProfile,
    /// The case whose sentence this step stands on: its failure blocks the case.
    pub stands_on: Option<String>,
    /// The name a mutation gives this step as its evidence.
    pub label: Option<String>,
}

impl StepAt {
    /// The step a run of `profile` runs here, or `None` when that run skips it.
    pub fn for_profile(&self, profile: KitProfile) -> Option<&Step> {
        if !profile.runs(self.profile) {
            return None;
        }
        match (&self.sharper, profile) {
            (Some(s), KitProfile::Distribution) => Some(s),
            _ => Some(&self.step),
        }
    }

    /// How a report names the step: its label, else its number and verb.
    pub fn name(&self, number: usize) -> String {
        match &self.label {
            Some(l) => format!("{l:?}"),
            None => format!("step {number} (`{}`)", self.verb),
        }
    }
}

/// A loaded case.
#[derive(Debug)]
pub struct Case {
    pub path: PathBuf,
    pub id: String,
    pub family: String,
    pub seed: String,
    pub sentence: String,
    pub shapes: Vec<Shape>,
    pub description: String,
    /// `contract` unless every judging step is this distribution's (header `profile`).
    pub profile: KitProfile,
    /// Why a distribution case is one.
    pub why: Option<String>,
    pub mesh: MeshSpec,
    pub env: BTreeMap<String, String>,
    pub vars: Vars,
    pub scaled: Option<Scaled>,
    pub transcript: TranscriptSpec,
    pub steps: Vec<StepAt>,
}

/// Keys of a `[[step]]` table that are modifiers, not verbs.
const MODIFIERS: &[&str] = &[
    "mark",
    "since",
    "within",
    "at_least",
    "figure",
    "profile",
    "stands_on",
    "label",
    "distribution",
];

/// The 1-based line of the first line of `text` starting with `key` (0 when none does).
fn field_line(text: &str, key: &str) -> usize {
    text.lines()
        .position(|l| l.trim_start().starts_with(key))
        .map(|i| i + 1)
        .unwrap_or(0)
}

/// The name of the folder `path` is in (empty when it has none).
pub fn folder_of(path: &Path) -> String {
    path.parent()
        .and_then(|d| d.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string()
}

/// Whether `name` can be a family: a folder of `cases/` and the first half of a case id.
pub fn is_family_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|b| *b == b'\n')
        .count()
        + 1
}

impl Case {
    /// Reads and checks `path`: a family is a folder, so the case's `family` must be the name
    /// of the folder it is in (`cases/<family>/<name>.toml`).
    pub fn load(path: &Path) -> Result<Case, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|e| LoadError {
            file: path.to_path_buf(),
            line: 0,
            message: format!("cannot read it: {e}"),
        })?;
        let case = Case::parse(&text, path)?;
        let folder = folder_of(path);
        if case.family != folder {
            return Err(LoadError {
                file: path.to_path_buf(),
                line: field_line(&text, "family"),
                message: format!(
                    "family {:?} is not its folder {folder:?} (a family is a folder: cases/<family>/<name>.toml)",
                    case.family
                ),
            });
        }
        Ok(case)
    }

    /// Parses `text` as the case file at `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Case, LoadError> {
        let err = |line: usize, message: String| LoadError {
            file: path.to_path_buf(),
            line,
            message,
        };
        let raw: RawCase = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(0);
            err(line, e.message().trim().to_string())
        })?;
        let field_line = |key: &str| field_line(text, key);
        if !is_family_name(&raw.family) {
            return Err(err(
                field_line("family"),
                format!(
                    "family {:?} is not a folder name (lower-case letters, digits and '-')",
                    raw.family
                ),
            ));
        }
        if !seeds::SEEDS.iter().any(|(name, _)| *name == raw.seed) {
            let names: Vec<&str> = seeds::SEEDS.iter().map(|(n, _)| *n).collect();
            return Err(err(
                field_line("seed"),
                format!("seed {:?} is not one of {}", raw.seed, names.join(", ")),
            ));
        }
        if raw.distribution.is_some() {
            return Err(err(
                field_line("distribution"),
                "`distribution = \"<reason>\"` is now `profile = \"distribution\"` with the reason as `why = \"<reason>\"` (docs/cases.md)".into(),
            ));
        }
        let case_profile = match raw.profile.as_deref() {
            None => KitProfile::Contract,
            Some("distribution") => KitProfile::Distribution,
            Some(other) => {
                return Err(err(
                    field_line("profile"),
                    format!("profile {other:?}: a case is a contract case unless marked `profile = \"distribution\"`"),
                ))
            }
        };
        match (case_profile, &raw.why) {
            (KitProfile::Distribution, None) => {
                return Err(err(
                    field_line("profile"),
                    "a distribution case says `why` (what only this distribution promises)".into(),
                ))
            }
            (KitProfile::Contract, Some(_)) => {
                return Err(err(
                    field_line("why"),
                    "`why` goes with `profile = \"distribution\"`".into(),
                ))
            }
            _ => {}
        }
        let want_prefix = format!("{}/", raw.family);
        if !raw.id.starts_with(&want_prefix) || raw.id.len() == want_prefix.len() {
            return Err(err(
                field_line("id"),
                format!("id {:?} must be \"{}<name>\"", raw.id, want_prefix),
            ));
        }
        if raw.sentence.trim().is_empty() {
            return Err(err(field_line("sentence"), "the sentence is empty".into()));
        }
        let shapes = if raw.shapes.is_empty() {
            vec![Shape::parse("operator").map_err(|m| err(0, m))?]
        } else {
            raw.shapes
                .iter()
                .map(|s| Shape::parse(s))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|m| err(field_line("shapes"), m))?
        };
        for re in &raw.transcript.omit {
            regex::Regex::new(re)
                .map_err(|e| err(field_line("omit"), format!("omit {re:?}: {e}")))?;
        }
        // Variables: both forms must give every name the steps use.
        let mut scaled_vars = raw.vars.clone();
        if let Some(s) = &raw.scaled {
            for (k, v) in &s.vars {
                if !raw.vars.contains_key(k) {
                    return Err(err(
                        field_line("[scaled]"),
                        format!("[scaled] vars names {k:?}, which [vars] does not"),
                    ));
                }
                scaled_vars.insert(k.clone(), *v);
            }
        }
        for (k, v) in &raw.env {
            expr::substitute(v, &raw.vars).map_err(|m| err(field_line(k), m))?;
        }
        // Both forms give the TTL and the credential's lifetime a value (a name [vars] lacks
        // is refused here, with its line).
        let ttl = &raw.mesh.lease_ttl_ms;
        for vars in [&raw.vars, &scaled_vars] {
            ttl.eval(vars)
                .map_err(|m| err(field_line("lease_ttl_ms"), format!("`lease_ttl_ms`: {m}")))?;
            if let Some(life) = &raw.mesh.delivery_lifetime_ms {
                life.eval(vars).map_err(|m| {
                    err(
                        field_line("delivery_lifetime_ms"),
                        format!("`delivery_lifetime_ms`: {m}"),
                    )
                })?;
            }
        }

        let mut steps: Vec<StepAt> = Vec::with_capacity(raw.steps.len());
        let mut names = steps::Names::default();
        let mut labels = std::collections::BTreeSet::new();
        for (i, spanned) in raw.steps.iter().enumerate() {
            let line = line_of(text, spanned.span().start);
            let at = |m: String| err(line, format!("step {}: {m}", i + 1));
            let table = spanned.get_ref();
            let mut timing = Timing::default();
            let mut verb: Option<(&String, &toml::Value)> = None;
            let mut profile = case_profile;
            let mut stands_on = None;
            let mut label = None;
            let mut sharper_args: Option<&toml::Table> = None;
            for (key, value) in table {
                let string = || {
                    value
                        .as_str()
                        .map(str::to_string)
                        .ok_or_else(|| at(format!("`{key}` must be a string")))
                };
                match key.as_str() {
                    "mark" => timing.mark = Some(string()?),
                    "since" => timing.since = Some(string()?),
                    "figure" => timing.figure = Some(string()?),
                    "profile" => {
                        if case_profile == KitProfile::Distribution {
                            return Err(at("the case is a distribution case: every step of it is a distribution step, none is marked".into()));
                        }
                        if string()? != "distribution" {
                            return Err(at(
                                "`profile` marks a distribution step (`profile = \"distribution\"`); an unmarked step is a contract step".into(),
                            ));
                        }
                        profile = KitProfile::Distribution;
                    }
                    "stands_on" => {
                        let id = string()?;
                        if id == raw.id {
                            return Err(at("a case cannot stand on itself".into()));
                        }
                        if !id.contains('/') {
                            return Err(at(format!(
                                "`stands_on = {id:?}` names a case id (\"<family>/<name>\")"
                            )));
                        }
                        stands_on = Some(id);
                    }
                    "label" => {
                        let l = string()?;
                        if !labels.insert(l.clone()) {
                            return Err(at(format!("the label {l:?} is given twice")));
                        }
                        label = Some(l);
                    }
                    "distribution" => {
                        if case_profile == KitProfile::Distribution {
                            return Err(at("the case is a distribution case: write the expectation in the step itself".into()));
                        }
                        sharper_args = Some(value.as_table().ok_or_else(|| {
                            at("`distribution` is a table of the expectations only the distribution profile judges".into())
                        })?);
                    }
                    "within" | "at_least" => {
                        let d: Duration = value.clone().try_into().map_err(|_| {
                            at(format!(
                                "`{key}` must be ms or an expression like \"window + 500\""
                            ))
                        })?;
                        for n in d.names() {
                            if !raw.vars.contains_key(&n) {
                                return Err(at(format!(
                                    "`{key}` names {n:?}, which [vars] does not"
                                )));
                            }
                        }
                        for vars in [&raw.vars, &scaled_vars] {
                            d.eval(vars).map_err(|m| at(format!("`{key}`: {m}")))?;
                        }
                        if key == "within" {
                            timing.within = Some(d);
                        } else {
                            timing.at_least = Some(d);
                        }
                    }
                    _ => {
                        if let Some((first, _)) = verb {
                            return Err(at(format!(
                                "two verbs, `{first}` and `{key}`: a step has exactly one (modifiers: {})",
                                MODIFIERS.join(", ")
                            )));
                        }
                        verb = Some((key, value));
                    }
                }
            }
            let (verb, args) = verb.ok_or_else(|| {
                at(format!(
                    "no verb (only modifiers: {}); the verbs are in docs/cases.md",
                    MODIFIERS.join(", ")
                ))
            })?;
            let step = steps::parse(verb, args).map_err(at)?;
            let distribution = profile == KitProfile::Distribution;
            let sharper = match sharper_args {
                None => None,
                Some(extra) => {
                    if distribution {
                        return Err(at("a distribution step judges everything it says: `distribution = { … }` goes on a contract step".into()));
                    }
                    let mut merged = args
                        .as_table()
                        .cloned()
                        .ok_or_else(|| at(format!("`{verb}` takes a table of arguments")))?;
                    for (k, v) in extra {
                        if !SHARPER.contains(&k.as_str()) {
                            return Err(at(format!(
                                "`distribution = {{ {k} = … }}`: only expectations go there ({})",
                                SHARPER.join(", ")
                            )));
                        }
                        if merged.insert(k.clone(), v.clone()).is_some() {
                            return Err(at(format!(
                                "`{k}` is in the step and in its `distribution`: the distribution profile adds expectations, it does not replace them"
                            )));
                        }
                    }
                    Some(
                        steps::parse(verb, &toml::Value::Table(merged))
                            .map_err(|m| at(format!("with its `distribution`: {m}")))?,
                    )
                }
            };
            if !distribution {
                if let Some(why) = step.distribution_only() {
                    return Err(at(format!(
                        "a contract step cannot judge this: {why} (mark the step `profile = \"distribution\"`, or give the contract's form and add the rest under `distribution = {{ … }}`)"
                    )));
                }
                for text in step.wording() {
                    if !seeds::quoted(text) {
                        return Err(at(format!(
                            "{text:?} is not quoted by a seed document, and a contract step judges only the wording the seeds quote (mark the step `profile = \"distribution\"`, or judge the text under `distribution = {{ … }}`)"
                        )));
                    }
                }
            }
            if timing.within.is_some() && step.default_within().is_none() {
                return Err(at(format!(
                    "`within` has no meaning for `{verb}`, which does not wait"
                )));
            }
            if let Some(s) = &timing.since {
                names
                    .uses(steps::verb::Kind::Event, s, distribution)
                    .map_err(|m| at(format!("`since = {s:?}`: {m} (a `mark`)")))?;
            }
            names.check(&step, distribution).map_err(at)?;
            if let Some(s) = &sharper {
                // The sharper form names nothing the step does not: checked as a distribution step.
                steps::Names::default().check(s, true).ok();
            }
            if let Some(m) = &timing.mark {
                names.create(steps::verb::Kind::Event, m, distribution);
            }
            steps.push(StepAt {
                line,
                verb: verb.clone(),
                step,
                sharper,
                timing,
                profile,
                stands_on,
                label,
            });
        }
        if case_profile == KitProfile::Contract
            && !steps
                .iter()
                .any(|s| s.profile == KitProfile::Contract && !ACTING.contains(&s.verb.as_str()))
        {
            return Err(err(
                field_line("id"),
                "every step that judges is a distribution step: the case is a distribution case (`profile = \"distribution\"` with its `why`)".into(),
            ));
        }
        if steps.is_empty() {
            return Err(err(0, "a case has at least one [[step]]".into()));
        }
        Ok(Case {
            path: path.to_path_buf(),
            id: raw.id,
            family: raw.family,
            seed: raw.seed,
            sentence: raw.sentence,
            shapes,
            description: raw.description,
            profile: case_profile,
            why: raw.why,
            mesh: raw.mesh,
            env: raw.env,
            vars: raw.vars,
            scaled: raw.scaled,
            transcript: raw.transcript,
            steps,
        })
    }

    /// The cases this case stands on: the union of its steps' `stands_on`.
    pub fn preconditions(&self) -> std::collections::BTreeSet<&str> {
        self.steps
            .iter()
            .filter_map(|s| s.stands_on.as_deref())
            .collect()
    }

    /// The step a mutation names by its label, with its number.
    pub fn labelled(&self, label: &str) -> Option<(usize, &StepAt)> {
        self.steps
            .iter()
            .enumerate()
            .find(|(_, s)| s.label.as_deref() == Some(label))
            .map(|(i, s)| (i + 1, s))
    }

    /// The name part of the id (`data-path/x` → `x`).
    pub fn name(&self) -> &str {
        self.id.split_once('/').map(|(_, n)| n).unwrap_or(&self.id)
    }

    /// The knobs of this distribution (environment variables no seed names) the scaled form
    /// sets, in order.
    pub fn scaled_distribution_knobs(&self) -> Vec<&str> {
        self.scaled
            .iter()
            .flat_map(|s| s.env.keys())
            .map(String::as_str)
            .filter(|k| !super::seeds::names_variable(k))
            .collect()
    }

    /// Whether the case runs its scaled form in a run asked to scale (`scaled`) under
    /// `profile`. Under the contract profile a scaled form that shortens a knob of this
    /// distribution's (one no seed names) is not run: another implementation need not honour
    /// that knob, so its windows would judge this distribution's timing, not the seeds'. The
    /// case runs its shipped form there.
    pub fn runs_scaled(&self, scaled: bool, profile: super::profile::KitProfile) -> bool {
        scaled
            && self.scaled.is_some()
            && (profile == super::profile::KitProfile::Distribution
                || self.scaled_distribution_knobs().is_empty())
    }

    /// The form the case runs in (see [`Case::runs_scaled`]).
    pub fn form(&self, scaled: bool, profile: super::profile::KitProfile) -> Form {
        if self.runs_scaled(scaled, profile) {
            Form::Scaled
        } else {
            Form::AsWritten
        }
    }

    /// Why a run asked to scale runs this case as written, when it does although the case has
    /// a scaled form: that form shortens a knob no seed names, under the contract profile.
    pub fn shipped_because(
        &self,
        scaled: bool,
        profile: super::profile::KitProfile,
    ) -> Option<String> {
        (scaled && self.scaled.is_some() && !self.runs_scaled(scaled, profile)).then(|| {
            format!(
                "its shipped form: the scaled one shortens {}, which no seed names",
                self.scaled_distribution_knobs().join(", ")
            )
        })
    }

    /// The variables of the form the case runs in.
    pub fn vars_for(&self, scaled: bool) -> Vars {
        let mut vars = self.vars.clone();
        if scaled {
            if let Some(s) = &self.scaled {
                vars.extend(s.vars.clone());
            }
        }
        vars
    }

    /// The daemons' environment of the form the case runs in, variables substituted.
    pub fn env_for(&self, scaled: bool) -> Result<Vec<(String, String)>, String> {
        let vars = self.vars_for(scaled);
        let mut env = self.env.clone();
        if scaled {
            if let Some(s) = &self.scaled {
                env.extend(s.env.clone());
            }
        }
        env.into_iter()
            .map(|(k, v)| Ok((k, expr::substitute(&v, &vars)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "id = \"standby/x\"\nfamily = \"standby\"\nseed = \"delivery-service-contracts.txt\"\nsentence = \"s\"\ndescription = \"d\"\n";
    const STEP: &str = "\n[[step]]\nexpect_lease = { absent = true }\n";

    /// A lease TTL written as a variable takes each form's value; one naming no variable is
    /// refused with its line.
    /// Mutation seen failing: the `lease_ttl_ms` evaluation at load removed (the unknown name
    /// loads, and fails only when the mesh starts).
    fn refused(steps: &str) -> LoadError {
        let text = format!("{HEAD}{steps}");
        Case::parse(&text, Path::new("x.toml")).expect_err("refused")
    }

    fn loads(steps: &str) -> Case {
        let text = format!("{HEAD}{steps}");
        Case::parse(&text, Path::new("x.toml")).unwrap_or_else(|e| panic!("loads: {e}"))
    }

    const STARTED: &str = "\n[[step]]\nstart = { daemon = \"a\" }\n";

    /// A contract step judges a daemon's line only by what a seed document quotes: this
    /// distribution's own wording is refused there, with the way out, and accepted in a
    /// distribution step.
    /// Mutation seen failing: the wording check of `Case::parse` removed (the unquoted
    /// `delivery daemon up` loads as a contract step).
    #[test]
    fn a_contract_line_step_quotes_a_seed() {
        let quoted =
            "[[step]]\nwait_line = { daemon = \"a\", contains = \"received SIGTERM, exiting\" }\n";
        loads(&format!("{STARTED}{quoted}"));
        let own = "[[step]]\nwait_line = { daemon = \"a\", contains = \"delivery daemon up\" }\n";
        let e = refused(&format!("{STARTED}{own}"));
        assert_eq!(e.line, 9, "{e}");
        assert!(e.message.contains("not quoted by a seed document"), "{e}");
        loads(&format!(
            "{STARTED}{own}profile = \"distribution\"\n[[step]]\nexpect_exit = {{ daemon = \"a\" }}\n"
        ));
        // A reply's error text is held to the same rule, and may go under `distribution`.
        let agent = "[[step]]\nagent = { name = \"eve\", read = [\"g\"] }\n";
        let req = "[[step]]\nrequest = { rail = \"delivery\", as = \"eve\", op = \"x\", error = \"stale leave\" }\n";
        assert!(refused(&format!("{STARTED}{agent}{req}"))
            .message
            .contains("\"stale leave\""));
        let req = "[[step]]\nrequest = { rail = \"delivery\", as = \"eve\", op = \"x\", ok = false }\ndistribution = { error = \"stale leave\" }\n";
        let case = loads(&format!("{STARTED}{agent}{req}"));
        assert!(case.steps[2].sharper.is_some());
    }

    /// An exact exit code and this distribution's commands are distribution steps; a contract
    /// step says `nonzero`, and the code goes under `distribution`.
    /// Mutation seen failing: the `distribution_only` check of `Case::parse` removed.
    #[test]
    fn exact_exit_codes_and_commands_are_the_distributions() {
        let e = refused(&format!(
            "{STARTED}[[step]]\nexpect_exit = {{ daemon = \"a\", code = 6 }}\n"
        ));
        assert!(e.message.contains("an exact exit code"), "{e}");
        let e = refused(&format!(
            "{STARTED}[[step]]\nstatus = {{ contains = \"running\", code = 0 }}\n[[step]]\nexpect_exit = {{ daemon = \"a\" }}\n"
        ));
        assert!(e.message.contains("cotal-delivery status"), "{e}");
        let case = loads(&format!(
            "{STARTED}[[step]]\nexpect_exit = {{ daemon = \"a\", nonzero = true }}\ndistribution = {{ code = 6 }}\n"
        ));
        let at = &case.steps[1];
        assert!(at.for_profile(KitProfile::Contract).is_some());
        assert!(std::ptr::eq(
            at.for_profile(KitProfile::Distribution).expect("runs"),
            at.sharper.as_ref().expect("sharper")
        ));
        // Only expectations go under `distribution`, and only new ones.
        let e = refused(&format!(
            "{STARTED}[[step]]\nexpect_exit = {{ daemon = \"a\", nonzero = true }}\ndistribution = {{ daemon = \"b\" }}\n"
        ));
        assert!(e.message.contains("only expectations"), "{e}");
        let e = refused(&format!(
            "{STARTED}[[step]]\nexpect_exit = {{ daemon = \"a\", code = 1 }}\nprofile = \"distribution\"\ndistribution = {{ code = 1 }}\n[[step]]\nexpect_lease = {{ absent = true }}\n"
        ));
        assert!(e.message.contains("goes on a contract step"), "{e}");
    }

    /// The contract profile skips distribution steps, so a contract step may not use a name
    /// (an actor, a `mark`) that only a distribution step created.
    /// Mutation seen failing: `Names::uses` ignoring who created the name.
    #[test]
    fn a_contract_step_uses_no_name_a_distribution_step_made() {
        let e = refused(&format!(
            "{STARTED}[[step]]\nwait_line = {{ daemon = \"a\", contains = \"delivery daemon up\" }}\nprofile = \"distribution\"\nmark = \"up\"\n[[step]]\nexpect_exit = {{ daemon = \"a\" }}\nsince = \"up\"\n"
        ));
        assert!(
            e.message.contains("created only by a distribution step"),
            "{e}"
        );
        let e = refused(
            "\n[[step]]\nstart = { daemon = \"a\" }\nprofile = \"distribution\"\n[[step]]\nexpect_exit = { daemon = \"a\" }\n",
        );
        assert!(e.message.contains("daemon \"a\""), "{e}");
    }

    /// A contract case has a contract step that judges; one whose every judging step is the
    /// distribution's is a distribution case, which says why.
    /// Mutation seen failing: the closing check of `Case::parse` removed.
    #[test]
    fn a_case_with_only_distribution_judgements_is_a_distribution_case() {
        let steps = format!(
            "{STARTED}[[step]]\nexpect_exit = {{ daemon = \"a\", code = 3 }}\nprofile = \"distribution\"\n"
        );
        assert!(refused(&steps).message.contains("is a distribution case"));
        let text = HEAD.replace(
            "description",
            "profile = \"distribution\"\nwhy = \"its own knob\"\ndescription",
        );
        let case = Case::parse(
            &format!("{text}{STARTED}[[step]]\nexpect_exit = {{ daemon = \"a\", code = 3 }}\n"),
            Path::new("x.toml"),
        )
        .expect("a distribution case loads");
        assert_eq!(case.profile, KitProfile::Distribution);
        assert_eq!(case.steps[1].profile, KitProfile::Distribution);
        let old = HEAD.replace(
            "description",
            "distribution = \"its own knob\"\ndescription",
        );
        let e = Case::parse(&format!("{old}{STEP}"), Path::new("x.toml")).expect_err("refused");
        assert!(e.message.contains("`why"), "{e}");
    }

    /// Preconditions and labels: a case stands on other cases, never on itself; a label names
    /// one step.
    /// Mutation seen failing: the duplicate check of `label` removed.
    #[test]
    fn preconditions_and_labels() {
        let case = loads(&format!(
            "{STARTED}[[step]]\nexpect_serving = {{ daemon = \"a\" }}\nstands_on = \"lifecycle/x\"\n[[step]]\nexpect_exit = {{ daemon = \"a\" }}\nlabel = \"exits\"\n"
        ));
        assert_eq!(
            case.preconditions().into_iter().collect::<Vec<_>>(),
            vec!["lifecycle/x"]
        );
        assert_eq!(case.labelled("exits").map(|(n, _)| n), Some(3));
        let e = refused(&format!(
            "{STARTED}[[step]]\nexpect_serving = {{ daemon = \"a\" }}\nstands_on = \"standby/x\"\n"
        ));
        assert!(e.message.contains("stand on itself"), "{e}");
        let e = refused(&format!(
            "{STARTED}[[step]]\nexpect_serving = {{ daemon = \"a\" }}\nlabel = \"l\"\n[[step]]\nexpect_exit = {{ daemon = \"a\" }}\nlabel = \"l\"\n"
        ));
        assert!(e.message.contains("given twice"), "{e}");
    }

    #[test]
    fn a_lease_ttl_names_a_variable_of_each_form() {
        let text = format!(
            "{HEAD}[mesh]\nlease_ttl_ms = \"ttl\"\n[vars]\nttl = 30000\n[scaled]\nvars = {{ ttl = 3000 }}\n{STEP}"
        );
        let case = Case::parse(&text, Path::new("x.toml")).expect("loads");
        assert_eq!(
            case.mesh.lease_ttl_ms.eval(&case.vars_for(false)),
            Ok(30_000)
        );
        assert_eq!(case.mesh.lease_ttl_ms.eval(&case.vars_for(true)), Ok(3_000));
        let text = format!("{HEAD}[mesh]\nlease_ttl_ms = \"tll\"\n[vars]\nttl = 30000\n{STEP}");
        let e = Case::parse(&text, Path::new("x.toml")).expect_err("refused");
        assert_eq!(e.line, 7, "{e}");
        assert!(e.message.contains("\"tll\""), "{e}");
    }

    /// A scaled form that shortens only knobs the seeds name runs under both profiles; one that
    /// shortens a knob of this distribution's runs under the distribution profile only, the
    /// contract profile running the case as written (its shipped timing); a run not asked to
    /// scale runs every case as written.
    /// Mutations seen failing: `runs_scaled` ignoring the profile (the contract run scales the
    /// standby retry another implementation need not let it shorten); `shipped_because` not
    /// asking `runs_scaled` (a distribution run, which scales, says it ran as written).
    #[test]
    fn a_scaled_form_with_a_knob_of_this_distribution_runs_under_its_profile_only() {
        use crate::kit::profile::KitProfile::{Contract, Distribution};
        let seeds = format!(
            "{HEAD}[vars]\nwindow = 15000\n[scaled]\nvars = {{ window = 1500 }}\nenv = {{ COTAL_DELIVERY_BROKER_GONE_MS = \"1500\" }}\n{STEP}"
        );
        let case = Case::parse(&seeds, Path::new("x.toml")).expect("loads");
        assert!(case.scaled_distribution_knobs().is_empty());
        assert!(case.runs_scaled(true, Contract));
        assert!(case.runs_scaled(true, Distribution));
        assert!(!case.runs_scaled(false, Distribution));
        let ours = format!(
            "{HEAD}[vars]\nretry = 5000\n[scaled]\nvars = {{ retry = 2000 }}\nenv = {{ COTAL_DELIVERY_STANDBY_RETRY_MS = \"2000\", COTAL_DELIVERY_BROKER_GONE_MS = \"1500\" }}\n{STEP}"
        );
        let case = Case::parse(&ours, Path::new("x.toml")).expect("loads");
        assert_eq!(
            case.scaled_distribution_knobs(),
            vec!["COTAL_DELIVERY_STANDBY_RETRY_MS"]
        );
        assert!(!case.runs_scaled(true, Contract));
        assert!(case.runs_scaled(true, Distribution));
        assert_eq!(
            case.vars_for(case.runs_scaled(true, Contract))["retry"],
            5_000
        );
        assert_eq!(case.form(true, Contract), Form::AsWritten);
        assert!(case
            .shipped_because(true, Contract)
            .is_some_and(|why| why.contains("COTAL_DELIVERY_STANDBY_RETRY_MS")
                && !why.contains("BROKER_GONE")));
        assert_eq!(case.shipped_because(true, Distribution), None);
        assert_eq!(case.shipped_because(false, Contract), None);
        let unscaled = format!("{HEAD}{STEP}");
        let case = Case::parse(&unscaled, Path::new("x.toml")).expect("loads");
        assert!(!case.runs_scaled(true, Distribution));
    }

    /// A delivery credential's lifetime written as a variable takes each form's value (the
    /// shipped-timing form and the scaled one); one naming no variable is refused with its line.
    /// Mutation seen failing: the `delivery_lifetime_ms` evaluation at load removed (the unknown
    /// name loads, and fails only when the mesh starts).
    #[test]
    fn a_credential_lifetime_names_a_variable_of_each_form() {
        let text = format!(
            "{HEAD}[mesh]\ndelivery_lifetime_ms = \"life\"\n[vars]\nlife = 300000\n[scaled]\nvars = {{ life = 16000 }}\n{STEP}"
        );
        let case = Case::parse(&text, Path::new("x.toml")).expect("loads");
        let life = case.mesh.delivery_lifetime_ms.as_ref().expect("a lifetime");
        assert_eq!(life.eval(&case.vars_for(false)), Ok(300_000));
        assert_eq!(life.eval(&case.vars_for(true)), Ok(16_000));
        let text =
            format!("{HEAD}[mesh]\ndelivery_lifetime_ms = \"lfe\"\n[vars]\nlife = 300000\n{STEP}");
        let e = Case::parse(&text, Path::new("x.toml")).expect_err("refused");
        assert_eq!(e.line, 7, "{e}");
        assert!(e.message.contains("\"lfe\""), "{e}");
    }
}
