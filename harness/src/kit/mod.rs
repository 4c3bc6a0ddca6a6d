//! The qualification kit: cases (one black-box proof of one seed sentence each, judged from what
//! the broker holds) written in the scenario language of docs/scenarios.md, run against the
//! daemon under test on real brokers of each shape, with a verdict per case that
//! `harness qualify` reports as a table, JSON and JUnit, and mutations kept as data that prove
//! each case fails without its behaviour (`harness mutate`).
//!
//! Rings, inside out: `expr` and `template` (pure), `case` (the file), `steps` (the verbs over
//! the `world` of actors), `run` (one case on one shape), `catalogue` and `report` (many cases),
//! `mutate` (cases against mutated builds).

pub mod case;
pub mod catalogue;
pub mod expr;
pub mod mutate;
pub mod report;
pub mod run;
pub mod steps;
pub mod template;
pub mod transcript;
pub mod world;

pub use case::{Case, LoadError, Shape, FAMILIES};
pub use catalogue::Catalogue;
pub use run::{run_case, CaseRun, StepFailure};
pub use template::DaemonCmd;
pub use world::{DaemonUnderTest, Failure, RunOptions};
