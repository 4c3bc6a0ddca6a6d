//! The single-flight lease: release on every way out, renewal bounded by the row's TTL, the
//! re-acquire of a key found gone, signals, the watch's consumer.

mod reacquire;
mod release;
mod renew;
mod signals;
mod watch;
