//! cotal-delivery: the Cotal delivery daemon (Plane-3) as a library; `main.rs` only parses
//! arguments and calls in here.
//!
//! # Layout
//!
//! Folders by ring, top to bottom; each uses only the rings listed below it.
//!
//! - [`cli`]: the command line, the only place a way out becomes an exit code.
//! - [`host`]: processes serving several spaces (lanes, standby).
//! - [`supervise`] (`up`, the main-job demo) and [`agent`] (the agent client).
//! - [`inspect`]: `pending` and `members`, read-only over the broker (above `plane`).
//! - [`space`]: one space's daemon: start-up, lease and keeper, lease watch, health, renewal,
//!   admission, arming the plane and the rails under the lease.
//! - [`rails`]: `ctl.delivery` and `ctl.delivery-admin` (serving, verbs).
//! - [`plane`]: the data plane: fan-out writer, trusted reader, membership registry, row reads.
//! - [`provision`]: credentials, `server.conf`, streams and buckets (one code path for all).
//! - base files: [`wire`] (names and shapes), [`creds`], [`conn`], [`kv`], [`store`],
//!   [`files`], [`journal`], [`repeats`], [`metrics`], [`env`].

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

pub mod conn;
pub mod creds;
pub mod env;
pub mod files;
pub mod journal;
pub mod kv;
pub mod metrics;
pub mod repeats;
pub mod store;
pub mod wire;

pub use space::{start_delivery_service, DeliveryService, HostedContextInputs};
