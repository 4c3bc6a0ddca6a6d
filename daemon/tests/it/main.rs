//! The daemon crate's integration tests: provisioning against a real `nats-server`.

mod provision;
