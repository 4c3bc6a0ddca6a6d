//! The command line's subcommands, one file each; `main.rs` only parses and dispatches. Only this
//! wing makes an exit status: 0 passed (valid), 1 failed (invalid), 2 could not run (unknown).
//!
//! ## Rings
//!
//! Top to bottom. A file uses only files of the rings below its own, never one of its own ring
//! or above; the harness's `rings` test holds every file to this table.
//!
//! | ring | files |
//! | --- | --- |
//! | surface | `mod.rs` |
//! | subcommands | `qualify.rs`, `run.rs`, `mutate.rs`, `simulate.rs` |
//! | what they share | `common.rs` |

pub mod common;
pub mod mutate;
pub mod qualify;
pub mod run;
pub mod simulate;
