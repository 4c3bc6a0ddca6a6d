//! One error type for the harness, so a failing test says what went wrong (which broker, which
//! wait, which file) and a caller can branch on [`ErrorKind`] instead of matching message text.

use std::path::PathBuf;

/// What class of failure a [`HarnessError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The nats-server binary is missing, unrunnable or too old.
    ServerBinary,
    /// A file or socket operation failed.
    Io,
    /// Generating the test PKI failed.
    Tls,
    /// The broker process could not be started, or exited before it was ready.
    Spawn,
    /// A broker was started but did not become ready within its bound.
    NotReady,
    /// A bounded wait ran out.
    Timeout,
    /// A monitoring endpoint answered with something unusable.
    Monitoring,
    /// A signal could not be delivered (for example the broker is no longer running).
    Signal,
    /// A cluster could not be formed.
    Cluster,
    /// The caller asked for something that cannot work (bad index, bad option combination).
    Usage,
}

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("nats-server binary: {0}")]
    ServerBinary(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("test PKI: {0}")]
    Tls(String),
    #[error("broker {name}: {message}\n--- broker log tail ({log}) ---\n{log_tail}")]
    Spawn {
        name: String,
        message: String,
        log: PathBuf,
        log_tail: String,
    },
    #[error("broker {name} not ready: {message}\n--- broker log tail ({log}) ---\n{log_tail}")]
    NotReady {
        name: String,
        message: String,
        log: PathBuf,
        log_tail: String,
    },
    #[error("timed out after {bound_ms} ms waiting for {what}{}", last.as_deref().map(|l| format!(" (last attempt: {l})")).unwrap_or_default())]
    Timeout {
        what: String,
        bound_ms: u128,
        last: Option<String>,
    },
    #[error("monitoring {url}: {message}")]
    Monitoring { url: String, message: String },
    #[error("signal {signal} to broker {name}: {message}")]
    Signal {
        name: String,
        signal: String,
        message: String,
    },
    #[error("cluster: {0}")]
    Cluster(String),
    #[error("{0}")]
    Usage(String),
}

impl HarnessError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            HarnessError::ServerBinary(_) => ErrorKind::ServerBinary,
            HarnessError::Io { .. } => ErrorKind::Io,
            HarnessError::Tls(_) => ErrorKind::Tls,
            HarnessError::Spawn { .. } => ErrorKind::Spawn,
            HarnessError::NotReady { .. } => ErrorKind::NotReady,
            HarnessError::Timeout { .. } => ErrorKind::Timeout,
            HarnessError::Monitoring { .. } => ErrorKind::Monitoring,
            HarnessError::Signal { .. } => ErrorKind::Signal,
            HarnessError::Cluster(_) => ErrorKind::Cluster,
            HarnessError::Usage(_) => ErrorKind::Usage,
        }
    }

    /// An I/O error with the operation it interrupted.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> HarnessError {
        HarnessError::Io {
            what: what.into(),
            source,
        }
    }
}
