//! Provisioning: the one code path that mints credentials, renders `server.conf` and creates a
//! space's streams, buckets and consumers. `up`, the harness and the smoke suites all call it.

mod agent;
mod authority;
mod bundle;
mod jwt;
mod layout;
mod manifest;
mod profiles;
mod remint;
mod retained;
mod server_conf;
mod standby;
mod streams;

pub use agent::{
    provision_agent, provision_lifecycle, read_acl, remove_acl, retire, set_read_acl, AgentMaterial,
};
pub use bundle::{BundleError, BundleErrorKind, SIGNER_BUNDLE_KEY};
pub use jwt::{encode_account_with_signing_keys, encode_operator, encode_user, UserClaimsSpec};
pub(crate) use manifest::ManifestError;
pub use manifest::{manifest_path, Manifest};
pub use remint::{
    remint_daemon_creds, remint_daemon_creds_for, BrokerAccepted, Preflight, PreflightError,
    RemintOutcome, RemintReport, SignError, SignerError, SignerErrorKind, SpaceSigner,
    PREFLIGHT_BOUND,
};
pub use retained::{retain_system_seed, system_seed_path};
pub(crate) use retained::{RetainedSystemKey, HOST_KICK_INBOX_PREFIX, SYSTEM_SEED_FILE};
pub use standby::{prepare_standby_hosts, renew_host_delivery, StandbyPlan};
pub use streams::{
    agent_consumer_config, space_stream_configs, DEFAULT_BACKSTOP_MAX_MSGS_PER_SUBJECT,
    DEFAULT_LEASE_TTL,
};

use std::path::Path;

pub use authority::{
    AuthorityError, AuthorityErrorKind, Expiry, MeshAuthority, MintOptions, STANDING_TTL,
};
pub use layout::{SpaceMaterial, Workspace};
pub(crate) use profiles::js;
pub use profiles::{Permissions, Profile, ReadChannels, Roles, SystemProfile};
pub use server_conf::{ClusterConf, OperatorAuth, ServerConf, TlsFiles};
pub use streams::{
    create_agent_consumer, create_role_consumer, ensure_space, ensure_stream, Ensured,
    ProvisionError, ProvisionErrorKind, ProvisionOptions, ProvisionReport,
};

use crate::base::connect_with_credential;
use crate::wire::{Space, SpaceNames};

/// Mints a fresh one-shot `provisioner` credential for `space` and connects with it. Returns the
/// client (keep it alive while using the context) and a JetStream context whose requests are
/// bounded by the options' request timeout.
pub async fn connect_provisioner(
    authority: &MeshAuthority,
    server_url: &str,
    tls_ca: Option<&Path>,
    space: &Space,
    options: &ProvisionOptions,
) -> Result<(async_nats::Client, async_nats::jetstream::Context), ProvisionError> {
    let credential = authority
        .mint(space, &Profile::Provisioner, MintOptions::new())
        .map_err(|e| ProvisionError::new(ProvisionErrorKind::Credential, e.to_string()))?;
    let client = connect_with_credential(
        server_url,
        tls_ca,
        &credential,
        "cotal-provisioner",
        options.connect_timeout_value(),
    )
    .await?;
    let mut js = async_nats::jetstream::new(client.clone());
    js.set_timeout(options.request_timeout_value());
    Ok((client, js))
}

/// Creates (idempotently) every stream and bucket of `space` as a fresh `provisioner`.
pub async fn provision_space(
    authority: &MeshAuthority,
    server_url: &str,
    tls_ca: Option<&Path>,
    space: &Space,
    options: &ProvisionOptions,
) -> Result<ProvisionReport, ProvisionError> {
    let (client, js) = connect_provisioner(authority, server_url, tls_ca, space, options).await?;
    let report = ensure_space(&js, &SpaceNames::new(space), options).await;
    // Best effort: the work is already acknowledged by the broker.
    let _ = tokio::time::timeout(options.request_timeout_value(), client.drain()).await;
    report
}
