//! The `ctl.delivery-admin` rail: eviction, the host as kicker, inventories, liveness, the
//! manager's waits.

mod evict;
mod host_kick;
mod inventory;
mod liveness;
mod manager;
