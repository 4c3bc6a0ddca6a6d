//! The single-flight lease: release on every way out, renewal bounded by the row's TTL, signals.

mod release;
mod renew;
mod signals;
