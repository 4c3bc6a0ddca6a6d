//! The qualification kit: cases (one black-box proof of one seed sentence each, judged from what
//! the broker holds) written in the case language of docs/cases.md, run against the daemon
//! under test on real brokers of each shape under one of two profiles (the contract any daemon
//! keeps, or this distribution's own promises too), with a verdict per case (pass, fail, blocked
//! by the case it stands on, skipped) that `harness qualify` reports as a table, JSON and JUnit,
//! and mutations kept as data that prove each case fails at the step they name without its
//! behaviour (`harness mutate`), and the neutral build that proves no contract verdict turns on
//! this distribution's wording, exit codes or knobs (`harness mutate --neutral`).
//!
//! ## Rings
//!
//! Top to bottom. A file uses only files of the rings below its own, never one of its own ring
//! or above; the harness's `rings` test holds every file to this table.
//!
//! | ring | files |
//! | --- | --- |
//! | surface | `mod.rs` |
//! | the neutral build | `neutral.rs` |
//! | mutations | `mutate.rs` |
//! | the catalogue | `catalogue.rs` |
//! | one case on one shape | `run.rs` |
//! | the case file | `case.rs` |
//! | the verbs' dispatch | `steps/mod.rs` |
//! | verb groups | `steps/admin.rs`, `steps/agents.rs`, `steps/anycast.rs`, `steps/broker.rs`, `steps/creds.rs`, `steps/delay.rs`, `steps/entries.rs`, `steps/feed.rs`, `steps/history.rs`, `steps/hosts.rs`, `steps/lease.rs`, `steps/process.rs`, `steps/rails.rs`, `steps/registry.rs`, `steps/rows.rs`, `steps/serving.rs`, `steps/streams.rs`, `steps/supervision.rs`, `steps/timed.rs`, `steps/timers.rs` |
//! | what verb groups share | `steps/call.rs`, `steps/read.rs` |
//! | the world | `world.rs` |
//! | what the world holds | `steps/verb.rs`, `watch.rs`, `holdings.rs`, `shape.rs` |
//! | the daemon under test | `under_test.rs` |
//! | command templates | `template.rs` |
//! | ground | `carried.rs`, `failure.rs`, `expr.rs`, `transcript.rs`, `results.rs`, `conformance.rs`, `reword.rs` |
//! | the profiles and the seeds | `profile.rs`, `seeds.rs` |

pub mod carried;
pub mod case;
pub mod catalogue;
pub mod conformance;
pub mod expr;
pub mod failure;
pub mod holdings;
pub mod mutate;
pub mod neutral;
pub mod profile;
pub mod results;
pub mod reword;
pub mod run;
pub mod seeds;
pub mod shape;
pub mod steps;
pub mod template;
pub mod transcript;
pub mod under_test;
pub mod watch;
pub mod world;

pub use case::{Case, LoadError};
pub use catalogue::Catalogue;
pub use failure::{Failure, StepResult};
pub use profile::KitProfile;
pub use run::{run_case, CaseRun, StepFailure};
pub use shape::Shape;
pub use template::DaemonCmd;
pub use under_test::{DaemonUnderTest, RunOptions};
