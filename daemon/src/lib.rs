//! cotal-delivery: the Cotal delivery daemon (Plane-3) as a library; `main.rs` only parses
//! arguments and calls in here.

pub mod acl;
pub mod admin;
pub mod admission;
pub mod agent;
pub mod catchup;
pub mod channels;
pub mod cli;
pub mod conn;
pub mod creds;
pub mod deliver;
pub mod demo;
pub mod entry;
pub mod fanout;
pub mod files;
pub mod health;
pub mod journal;
pub mod kv;
pub mod lease;
pub mod membership;
pub mod ops;
pub mod plane;
pub mod presence;
pub mod provision;
pub mod pump;
pub mod rails;
pub mod reader;
pub mod renew;
pub mod scan;
pub mod store;
pub mod supervise;
pub mod wire;
