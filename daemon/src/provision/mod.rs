//! Provisioning: the one code path that mints credentials, renders `server.conf` and creates a
//! space's streams, buckets and consumers. `up`, the harness and the smoke suites all call it.

pub mod server_conf;

pub use server_conf::{ClusterConf, OperatorAuth, ServerConf, TlsFiles};
