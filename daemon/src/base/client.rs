//! Credential clients: the one-shot and standing connections a `.creds` holder opens (the
//! `$SYS` observer and evictor, preflights, `status`, the agent, `up`'s lease watch).
//!
//! Why one place: every such client must present its JWT with the inbox prefix its grants allow
//! (`_INBOX_<user nkey>`, or the `$SYS` profiles' own), demand TLS when given a CA, and bound its
//! connect; a one-shot client must never redial (a kicked one stays gone). The resident
//! connection of the daemon is `conn.rs`'s, not this.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use super::creds::Credential;
use crate::wire::inbox_prefix;

/// Why a credential client could not connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientErrorKind {
    /// The credential has no usable nkey or seed.
    Credential,
    /// The broker refused or did not answer within the bound.
    Connect,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientError {
    kind: ClientErrorKind,
    detail: String,
}

impl ClientError {
    pub fn new(kind: ClientErrorKind, detail: impl Into<String>) -> ClientError {
        ClientError {
            kind,
            detail: detail.into(),
        }
    }
    pub fn kind(&self) -> ClientErrorKind {
        self.kind
    }
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for ClientError {
    /// Operators' lines have always quoted this as `provisioning: …` (`status`, `inspect`), and
    /// log lines are an interface, so the prefix stays.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "provisioning: {}", self.detail)
    }
}

impl std::error::Error for ClientError {}

/// Connects with `credential`, using the inbox prefix its grants allow (`_INBOX_<user nkey>`). With `tls_ca` the connection requires TLS and trusts that CA. The connect is
/// bounded by `connect_timeout`, and fails at once instead of retrying in the background.
pub async fn connect_with_credential(
    server_url: &str,
    tls_ca: Option<&Path>,
    credential: &Credential,
    client_name: &str,
    connect_timeout: std::time::Duration,
) -> Result<async_nats::Client, ClientError> {
    let nkey = credential
        .public_key()
        .map_err(|e| ClientError::new(ClientErrorKind::Credential, e.to_string()))?;
    connect_with_inbox(
        server_url,
        tls_ca,
        credential,
        client_name,
        &inbox_prefix(&nkey),
        connect_timeout,
    )
    .await
}

/// [`connect_with_credential`] with an explicit inbox prefix, for the `$SYS` profiles whose
/// reply grants are not `_INBOX_<nkey>` (the observer uses
/// [`crate::wire::MEMBERSHIP_OBSERVER_INBOX_PREFIX`], the evictor `_INBOX`).
pub async fn connect_with_inbox(
    server_url: &str,
    tls_ca: Option<&Path>,
    credential: &Credential,
    client_name: &str,
    inbox_prefix: &str,
    connect_timeout: std::time::Duration,
) -> Result<async_nats::Client, ClientError> {
    let options = credential_options(
        credential,
        tls_ca,
        client_name,
        inbox_prefix,
        connect_timeout,
    )?;
    connect_options(options, server_url, client_name, connect_timeout).await
}

/// Connect options presenting `credential`: JWT + nonce signature, the given inbox prefix, TLS
/// required with `tls_ca` trusted when one is given, and no reconnect (one-shot clients: a kicked
/// or dropped one stays gone, like the reference's `maxReconnectAttempts: 0`).
///
/// async-nats 0.51 reads `max_reconnects(Some(0))` as "unlimited" and allows one attempt at
/// `Some(1)`, so "no reconnect" is built from two parts: the limit of one attempt, and a nonce
/// signer that signs exactly one handshake. The one reconnect attempt then fails its handshake
/// and the client gives up (`MaxReconnects`) without ever presenting the credential again.
pub fn credential_options(
    credential: &Credential,
    tls_ca: Option<&Path>,
    client_name: &str,
    inbox_prefix: &str,
    connect_timeout: std::time::Duration,
) -> Result<async_nats::ConnectOptions, ClientError> {
    presenting(
        credential,
        tls_ca,
        client_name,
        inbox_prefix,
        connect_timeout,
        Redial::Never,
    )
}

/// [`credential_options`] for a standing client that reconnects without limit (the agent, `up`'s
/// lease watch, the membership feed's observer).
pub fn standing_credential_options(
    credential: &Credential,
    tls_ca: Option<&Path>,
    client_name: &str,
    inbox_prefix: &str,
    connect_timeout: std::time::Duration,
) -> Result<async_nats::ConnectOptions, ClientError> {
    presenting(
        credential,
        tls_ca,
        client_name,
        inbox_prefix,
        connect_timeout,
        Redial::Always,
    )
}

/// Whether a credential client reconnects after losing its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Redial {
    Never,
    Always,
}

/// The text a one-shot client's refused second handshake carries.
pub const ONE_SHOT_REFUSAL: &str = "one-shot client: its connection is not redialed";

fn presenting(
    credential: &Credential,
    tls_ca: Option<&Path>,
    client_name: &str,
    inbox_prefix: &str,
    connect_timeout: std::time::Duration,
    redial: Redial,
) -> Result<async_nats::ConnectOptions, ClientError> {
    let key_pair = credential
        .key_pair()
        .map_err(|e| ClientError::new(ClientErrorKind::Credential, e.to_string()))?;
    let key_pair = Arc::new(key_pair);
    let signed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut options = async_nats::ConnectOptions::new()
        .jwt(credential.jwt.clone(), move |nonce| {
            let key_pair = key_pair.clone();
            let spent = signed.swap(true, std::sync::atomic::Ordering::SeqCst);
            async move {
                if spent && redial == Redial::Never {
                    return Err(async_nats::AuthError::new(ONE_SHOT_REFUSAL));
                }
                key_pair.sign(&nonce).map_err(async_nats::AuthError::new)
            }
        })
        .custom_inbox_prefix(inbox_prefix.to_string())
        .name(client_name)
        .connection_timeout(connect_timeout)
        .max_reconnects(match redial {
            Redial::Never => Some(1),
            Redial::Always => None,
        });
    if let Some(ca) = tls_ca {
        options = options
            .add_root_certificates(ca.to_path_buf())
            .require_tls(true);
    }
    Ok(options)
}

/// Connects with prepared options, bounded by `connect_timeout`.
pub async fn connect_options(
    options: async_nats::ConnectOptions,
    server_url: &str,
    client_name: &str,
    connect_timeout: std::time::Duration,
) -> Result<async_nats::Client, ClientError> {
    let connect = options.connect(server_url);
    match tokio::time::timeout(connect_timeout, connect).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(ClientError::new(
            ClientErrorKind::Connect,
            format!("cannot connect to {server_url} as {client_name}: {e}"),
        )),
        Err(_) => Err(ClientError::new(
            ClientErrorKind::Connect,
            format!(
                "cannot connect to {server_url} as {client_name}: no answer within {} ms",
                connect_timeout.as_millis()
            ),
        )),
    }
}
