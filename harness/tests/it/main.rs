//! The harness's integration tests: one binary, a module per area, each test against real
//! `nats-server` brokers and the real daemon binary. Shared fixtures are in [`support`] and in
//! the harness library; snapshots are in `harness/tests/snapshots/`. The catalogue's cases are
//! the other test binary, `harness/tests/cases/` (their transcripts in
//! `cases/<family>/snapshots/`).

#[macro_use]
mod support;

mod admin;
mod anycast;
mod brokers;
mod credentials;
mod data_path;
mod feed;
mod host;
mod inspect;
mod lease;
mod metrics;
mod package;
mod provisioning;
mod qualify;
mod simulation;
mod supervisor;
mod timer;
mod wire;
