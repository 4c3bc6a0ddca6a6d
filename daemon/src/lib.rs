//! cotal-delivery: the Cotal delivery daemon (Plane-3) as a library; `main.rs` only parses
//! arguments and calls in here.

pub mod admin;
pub mod admission;
pub mod cli;
pub mod conn;
pub mod creds;
pub mod deliver;
pub mod demo;
pub mod fanout;
pub mod files;
pub mod health;
pub mod journal;
pub mod kv;
pub mod lease;
pub mod ops;
pub mod plane;
pub mod provision;
pub mod rails;
pub mod reader;
pub mod supervise;
pub mod wire;
