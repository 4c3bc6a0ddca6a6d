//! The daemon crate's integration tests: the command line as the built binary, provisioning
//! against a real `nats-server`.

mod cli;
mod provision;
