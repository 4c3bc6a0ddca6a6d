//! The single-flight lease: release on every way out, renewal bounded by the row's TTL, signals,
//! the watch's consumer. The re-acquire of a key found gone (a create refused by a live lease,
//! or for another reason) is proved by the cases `lifecycle/re-create-refused-by-a-live-lease`
//! and `lifecycle/re-create-refused-exits` alone.

mod release;
mod renew;
mod signals;
mod watch;
