//! cotal-delivery: the Cotal delivery daemon (Plane-3) as a library; `main.rs` only parses
//! arguments and calls in here.
//!
//! # Layout
//!
//! Folders by ring, top to bottom; each uses only the rings listed below it (a unit test holds
//! every file to the order of `docs/architecture.md`). Inside a ring folder the files are
//! private; its `mod.rs` lists the surface other rings and crates may use.
//!
//! - [`cli`]: the command line, the only place a way out becomes an exit code.
//! - [`host`]: the processes a space daemon runs in: `deliver --space`, the embeddable
//!   `start_delivery_service`, `deliver --spaces` (lanes, standby), and their signals.
//! - [`supervise`]: `up`, `down`, `status` and the main-job demo.
//! - [`agent`]: the agent client.
//! - [`inspect`]: `pending` and `members`, read-only over the broker.
//! - [`space`]: one space's daemon as a value: start-up, lease and keeper, lease watch, health,
//!   renewal, admission, the membership feed, the timer writer, arming the plane and the rails
//!   under the lease.
//! - [`rails`]: `ctl.delivery` and `ctl.delivery-admin` (serving, verbs).
//! - [`plane`]: the data plane: fan-out writer, trusted reader, membership registry, row reads.
//! - [`provision`]: credentials, `server.conf`, streams and buckets (one code path for all), and
//!   the renewal owner's re-sign.
//! - [`base`]: credential clients, the resident connection, credentials, KV rows, the `$SYS`
//!   client, stores, files, the journal, metrics, `Tuning`.
//! - [`wire`]: names, token grammar, rows, entries and frames, the control rails' envelope.

// Library paths never panic on a value they were handed: a refusal or a fault is a typed error.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

/// A hash of this crate's sources at build time (`build.rs`): the binary prints it with
/// `cotal-delivery build-id`, so a test can tell a daemon binary built from other sources.
pub const BUILD_ID: &str = env!("COTAL_DELIVERY_BUILD_ID");

pub mod agent;
pub mod cli;
pub mod host;
pub mod inspect;
pub mod plane;
pub mod provision;
pub mod rails;
pub mod space;
pub mod supervise;

pub mod base;

pub mod wire;

pub use host::{start_delivery_service, DeliveryService, HostedContextInputs};

#[cfg(test)]
mod rings;
