//! The command line's subcommands, one file each; `main.rs` only parses and dispatches. Only this
//! wing makes an exit status: 0 passed (valid), 1 failed (invalid), 2 could not run (unknown).

pub mod common;
pub mod mutate;
pub mod qualify;
pub mod run;
pub mod simulate;
