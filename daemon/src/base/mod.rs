//! The base ring: what every ring above stands on and nothing here knows a space's daemon.
//!
//! Credential clients and the resident connection, `.creds` files and claims, leader-served KV
//! rows, the `$SYS` client, secret stores, workspace files and pid records, the journal and its
//! repeat aggregator, metrics, and `Tuning` (every documented override, read once). The files
//! are private; this surface is flat (`crate::base::Journal`, `cotal_delivery::base::log_path`):
//! `pub use` for the other crates, `pub(crate) use` for the rings above. Imports only `wire`.

mod client;
mod conn;
mod creds;
mod files;
mod journal;
mod kv;
mod metrics;
mod repeats;
mod store;
mod sys;
mod tuning;

pub use client::standing_credential_options;
pub use client::{
    connect_options, connect_with_credential, connect_with_inbox, credential_options,
};
pub(crate) use client::{ClientError, ClientErrorKind};
pub(crate) use conn::{credential_expired, DialErrorKind, DrainError, Link, Resident, Violations};
pub use conn::{dial, ConnEvent, CredentialCell, DialSpec, DrainErrorKind};
pub use creds::{read_creds_file, write_creds_file_atomic, Credential};
pub(crate) use creds::{
    verify_signature, write_file_atomic, CredsError, CredsErrorKind, JwtClaims,
};
pub(crate) use files::{
    absolute, check_creds_root, cotal_home, down_marker_path, open_log, resolve_dial, resolve_root,
    stderr_is_path, Dial, FilesError, PidRecord, COTAL_DIR, DEFAULT_SERVER,
};
pub use files::{
    argv_names_delivery_daemon, argv_names_nats_server, argv_names_remint_watch,
    argv_names_renewal_owner, broker_pid_path, host_log_path, host_pid_path, is_zombie,
    launched_path, log_path, mesh_state_path, pid_liveness, pid_liveness_of, pid_path,
    process_alive, process_argv, process_liveness, read_pid, registry_path, remint_log_path,
    remint_pid_path, stop_reservation_path, write_atomic, MeshRecord, PidLiveness, HOST_LOG_FILE,
    HOST_PID_FILE,
};
pub use journal::{epoch_ms, Journal};
pub(crate) use journal::{reopen_stamped, stderr_is_stamped, utc_timestamp, StampedStderr};
pub(crate) use kv::{broker_words, Row, RowError, RowErrorKind};
pub use kv::{keys, row_op, Read, RowOp, Rows};
pub(crate) use metrics::{
    parse_addr, serve, CacheCounts, Endpoint, GiveUp, Metrics, MetricsRegistry, Sampler, Store,
};
pub(crate) use store::{
    account_signer_key, check_same_store, CredsFileStore, RemintTarget, BROKER_SIGNER_KEY,
};
pub use store::{
    delivery_creds_key, membership_rw_creds_key, FsStore, MemoryStore, SecretStore, StoreError,
    StoreIdentity, CONNECTION_EVICTOR_CREDS_FILE, DELIVERY_CREDS_FILE, INSPECT_CREDS_FILE,
    MEMBERSHIP_OBSERVER_CREDS_FILE, MEMBERSHIP_RW_CREDS_FILE,
};
pub(crate) use sys::{connz_accounts, pinned_to, sweep, Sweep, SweepLimits, SysAuthority};
pub use sys::{evictor_key, observer_key, ConnRow, SysPair};
pub use tuning::{
    HealthConfig, Tuning, ENV_ACK_WAIT_MS, ENV_FAULT_HOLD_AFTER_ANYCAST_ROW, ENV_STANDBY_RETRY_MS,
};
pub(crate) use tuning::{
    BACKSTOP_WINDOWS, BROKER_BOUND, DEFAULT_ACK_WAIT, DEFAULT_ANYCAST_ROW_AGE,
    DEFAULT_ANYCAST_SWEEP, DEFAULT_BROKER_GONE_WINDOW_MS, DEFAULT_MEMBERSHIP_INTERVAL,
    DEFAULT_NAK_DELAY, DEFAULT_TIMER_POLL, DEFAULT_TIMER_RETRY, LANE_BACKOFF_MIN,
};

// Read only by tests: the crate's docs checks and the command line's `--help` test.
#[cfg(test)]
pub(crate) use creds::decode_claims;
#[cfg(test)]
pub(crate) use tuning::{ENV_SERVING_BOUND_MS, ENV_STOP_GRACE_MS, VARIABLES};
