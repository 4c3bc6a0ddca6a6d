//! The verbs of the case language (docs/cases.md), one module per kind of actor:
//! processes, the lease and records, brokers and the network, agents, rows, streams and
//! consumers, credentials, the rails, standby hosts. Each module's `Step` is parsed from its
//! verb's arguments (unknown keys refused) and run against the [`World`].

pub mod admin;
pub mod agents;
pub mod anycast;
pub mod broker;
pub mod call;
pub mod creds;
pub mod delay;
pub mod entries;
pub mod feed;
pub mod history;
pub mod hosts;
pub mod lease;
pub mod process;
pub mod rails;
pub mod read;
pub mod registry;
pub mod rows;
pub mod serving;
pub mod streams;
pub mod supervision;
pub mod timed;
pub mod timers;
pub mod verb;

use std::collections::BTreeMap;
use std::time::Duration;

use super::world::World;
use crate::kit::failure::StepResult;
use crate::kit::under_test::DaemonUnderTest;
use verb::{Ctx, Kind, Profiled, Refs};

/// The names created so far while a case loads: a step that names one nobody created is
/// refused with its line before anything runs, and so is a contract step that names one only a
/// distribution step created (the contract profile does not run that step).
#[derive(Debug, Default)]
pub struct Names {
    /// Each name, and whether only a distribution step has created it so far.
    known: BTreeMap<(Kind, String), bool>,
}

impl Names {
    /// Checks the names `step` uses and records those it creates; `distribution` says whether
    /// `step` is a distribution step.
    pub fn check(&mut self, step: &Step, distribution: bool) -> Result<(), String> {
        let refs = step.refs();
        for (kind, name) in &refs.uses {
            self.uses(*kind, name, distribution)?;
        }
        for (kind, name) in refs.creates {
            self.create(kind, &name, distribution);
        }
        Ok(())
    }

    /// Whether `name` of `kind` may be used by a step (a distribution one when `distribution`).
    pub fn uses(&self, kind: Kind, name: &str, distribution: bool) -> Result<(), String> {
        match self.known.get(&(kind, name.to_string())) {
            None => Err(format!("{kind} {name:?} is not created by an earlier step")),
            Some(true) if !distribution => Err(format!(
                "{kind} {name:?} is created only by a distribution step, which the contract profile does not run: a contract step cannot use it"
            )),
            Some(_) => Ok(()),
        }
    }

    /// Records `name` of `kind` as created (by a distribution step when `distribution`).
    pub fn create(&mut self, kind: Kind, name: &str, distribution: bool) {
        let by_distribution = self.known.entry((kind, name.to_string())).or_insert(true);
        *by_distribution &= distribution;
    }
}

macro_rules! groups {
    ($($variant:ident => $module:ident :: $ty:ident),* $(,)?) => {
        /// One typed step.
        #[derive(Debug)]
        pub enum Step {
            $($variant($module::$ty),)*
        }

        /// Every verb, for the refusal of an unknown one.
        pub fn verbs() -> Vec<&'static str> {
            let mut all = Vec::new();
            $(all.extend_from_slice($module::VERBS);)*
            all
        }

        /// Parses the verb `verb` with its arguments.
        pub fn parse(verb: &str, args: &toml::Value) -> Result<Step, String> {
            let mut table = toml::Table::new();
            table.insert(verb.to_string(), args.clone());
            let value = toml::Value::Table(table);
            $(
                if $module::VERBS.contains(&verb) {
                    return value
                        .try_into::<$module::$ty>()
                        .map(Step::$variant)
                        .map_err(|e| format!("`{verb}`: {}", e.message().trim()));
                }
            )*
            Err(unknown_verb(verb))
        }

        impl Step {
            /// The bound of a waiting step when the case gives no `within`; `None` for a step
            /// that does not wait.
            pub fn default_within(&self) -> Option<Duration> {
                match self { $(Step::$variant(s) => s.default_within(),)* }
            }
            /// Why this step cannot run against `daemon`, if it cannot.
            pub fn unsupported(&self, daemon: &DaemonUnderTest) -> Option<String> {
                match self { $(Step::$variant(s) => s.unsupported(daemon),)* }
            }
            pub fn refs(&self) -> Refs {
                match self { $(Step::$variant(s) => s.refs(),)* }
            }
            /// The texts this step judges the daemon's output by ([`Profiled::wording`]).
            pub fn wording(&self) -> Vec<&str> {
                match self { $(Step::$variant(s) => s.wording(),)* }
            }
            /// Why this step can only be a distribution step ([`Profiled::distribution_only`]).
            pub fn distribution_only(&self) -> Option<&'static str> {
                match self { $(Step::$variant(s) => s.distribution_only(),)* }
            }
            pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
                match self { $(Step::$variant(s) => s.run(w, ctx).await,)* }
            }
        }
    };
}

groups! {
    Process => process::ProcessStep,
    Lease => lease::LeaseStep,
    Broker => broker::BrokerStep,
    Agents => agents::AgentStep,
    Rows => rows::RowStep,
    Streams => streams::StreamStep,
    Creds => creds::CredStep,
    Rails => rails::RailStep,
    Hosts => hosts::HostStep,
    Admin => admin::AdminStep,
    History => history::HistoryStep,
    Entries => entries::EntryStep,
    Timed => timed::TimedStep,
    Delay => delay::DelayStep,
    Registry => registry::RegistryStep,
    Serving => serving::ServingStep,
    Anycast => anycast::AnycastStep,
    Feed => feed::FeedStep,
    Timers => timers::TimerStep,
    Supervision => supervision::SupervisionStep,
}

/// The refusal of an unknown verb, naming the closest ones.
fn unknown_verb(verb: &str) -> String {
    let mut all = verbs();
    all.sort_by_key(|v| distance(v, verb));
    let near: Vec<String> = all
        .iter()
        .take(3)
        .filter(|v| distance(v, verb) <= 3)
        .map(|v| format!("`{v}`"))
        .collect();
    if near.is_empty() {
        format!("unknown step `{verb}` (the verbs are in docs/cases.md)")
    } else {
        format!(
            "unknown step `{verb}` (did you mean {}? the verbs are in docs/cases.md)",
            near.join(" or ")
        )
    }
}

/// Edit distance, for suggestions.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every listed verb parses into its own group (a verb listed but not a variant would be
    /// refused as "unknown variant" at load time).
    /// Mutation seen failing: a verb added to `process::VERBS` with no variant behind it.
    #[test]
    fn every_listed_verb_is_a_variant_of_its_group() {
        for verb in verbs() {
            if let Err(e) = parse(verb, &toml::Value::Table(toml::Table::new())) {
                assert!(!e.contains("unknown variant"), "{verb}: {e}");
            }
        }
    }

    #[test]
    fn an_unknown_verb_names_the_closest_ones() {
        let e = parse("wait_lien", &toml::Value::Table(toml::Table::new())).unwrap_err();
        assert!(e.contains("`wait_line`"), "{e}");
        let e = parse("frobnicate", &toml::Value::Table(toml::Table::new())).unwrap_err();
        assert!(e.starts_with("unknown step `frobnicate`"), "{e}");
    }

    /// The reference of the language lists every verb, and every verb it lists exists.
    /// Mutation seen failing: a verb removed from docs/cases.md.
    #[test]
    fn docs_cases_md_lists_every_verb() {
        let doc = include_str!("../../../../docs/cases.md");
        let mut documented = BTreeSet::new();
        for line in doc.lines() {
            if let Some(rest) = line.strip_prefix("| `") {
                if let Some(cell) = rest.split(" |").next() {
                    for name in cell.split(" / ") {
                        documented.insert(name.trim_matches(|c| c == '`' || c == ' ').to_string());
                    }
                }
            }
        }
        for verb in verbs() {
            assert!(
                documented.contains(verb),
                "docs/cases.md does not document `{verb}`"
            );
        }
    }
}
