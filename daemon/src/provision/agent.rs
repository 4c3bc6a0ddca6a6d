//! Agent provisioning as the manager does it: mint the agent credential for a fresh lifecycle,
//! write its read-ACL row `<o>.<a>.<uid>` in `cotal_acl_<s>` (read channels and the anycast
//! roles it serves), and pre-create its bind-only `dlv_<o>-<a>-<uid>` durable and each of its
//! roles' shared `svc_<role>` durables. Also the manager's later ACL writes (narrowing, retirement,
//! removal), each one atomic compare-and-set of the whole row. Used by the harness, the smoke
//! suites and the demo; the daemon itself never writes ACL rows.
//!
//! `writer` must hold the manager's grants on the ACL bucket and consumer creation on
//! `DLV_<s>` and `TASK_<s>` (the `operator` profile does).

use async_nats::jetstream::Context;

use crate::base::{epoch_ms, Credential, Read, Rows};
use crate::provision::{
    create_agent_consumer, create_role_consumer, MeshAuthority, MintOptions, Profile,
    ProvisionError, ProvisionErrorKind, ReadChannels, Roles,
};
use crate::wire::AclRecord;
use crate::wire::{LifecycleUid, Principal, Space, SpaceNames};

/// Bound on each ACL write.
const ACL_WRITE_BOUND: std::time::Duration = crate::base::BROKER_BOUND;

/// What an agent needs to connect, and what identifies its lifecycle.
#[derive(Debug, Clone)]
pub struct AgentMaterial {
    pub space: Space,
    pub principal: Principal,
    pub lifecycle_uid: LifecycleUid,
    pub read: ReadChannels,
    pub roles: Roles,
    pub credential: Credential,
}

fn js_err(what: impl std::fmt::Display) -> ProvisionError {
    ProvisionError::new(ProvisionErrorKind::JetStream, what.to_string())
}

/// Mints, writes the ACL row and creates the `dlv_` durable for a fresh lifecycle of
/// `principal` reading `read` and serving `roles` (whose `svc_<role>` durables it also
/// ensures). The ACL row lists the roles: it is what the daemon checks a take against.
pub async fn provision_agent(
    authority: &MeshAuthority,
    writer: &Context,
    space: &Space,
    principal: &Principal,
    read: ReadChannels,
    roles: Roles,
    options: MintOptions,
) -> Result<AgentMaterial, ProvisionError> {
    let lifecycle_uid = LifecycleUid::generate();
    provision_lifecycle(
        authority,
        writer,
        space,
        principal,
        lifecycle_uid,
        read,
        roles,
        options,
    )
    .await
}

/// [`provision_agent`] for a lifecycle uid the caller chose (a manager that records the
/// lifecycle before it exists, a replay that provisions the same lifecycles again). The uid
/// must be fresh: a retired lifecycle never comes back.
#[allow(clippy::too_many_arguments)]
pub async fn provision_lifecycle(
    authority: &MeshAuthority,
    writer: &Context,
    space: &Space,
    principal: &Principal,
    lifecycle_uid: LifecycleUid,
    read: ReadChannels,
    roles: Roles,
    options: MintOptions,
) -> Result<AgentMaterial, ProvisionError> {
    let credential = authority
        .mint(
            space,
            &Profile::Agent {
                principal: principal.clone(),
                lifecycle_uid: lifecycle_uid.clone(),
                read: read.clone(),
                roles: roles.clone(),
            },
            options,
        )
        .map_err(|e| ProvisionError::new(ProvisionErrorKind::Credential, e.to_string()))?;
    let names = SpaceNames::new(space);
    for role in roles.as_slice() {
        create_role_consumer(writer, &names, role).await?;
    }
    let mut record = AclRecord::new(read.as_slice().to_vec(), 1, epoch_ms());
    record.roles = roles.names();
    put_acl(writer, &names, principal, &lifecycle_uid, &record).await?;
    create_agent_consumer(writer, &names, principal, &lifecycle_uid).await?;
    Ok(AgentMaterial {
        space: space.clone(),
        principal: principal.clone(),
        lifecycle_uid,
        read,
        roles,
        credential,
    })
}

async fn acl_rows(writer: &Context, names: &SpaceNames) -> Result<Rows, ProvisionError> {
    Rows::open(writer, &names.acl_bucket(), ACL_WRITE_BOUND)
        .await
        .map_err(js_err)
}

/// The current row, if any, and the revision a write must expect.
pub async fn read_acl(
    writer: &Context,
    names: &SpaceNames,
    principal: &Principal,
    uid: &LifecycleUid,
) -> Result<(Option<AclRecord>, u64), ProvisionError> {
    let rows = acl_rows(writer, names).await?;
    match rows
        .read(&SpaceNames::acl_key(principal, uid))
        .await
        .map_err(js_err)?
    {
        Read::Absent { marker_revision } => Ok((None, marker_revision.unwrap_or(0))),
        Read::Present(row) => Ok((serde_json::from_slice(&row.value).ok(), row.revision)),
    }
}

/// Writes `record` over whatever row is there (compare-and-set at the revision just read).
pub async fn put_acl(
    writer: &Context,
    names: &SpaceNames,
    principal: &Principal,
    uid: &LifecycleUid,
    record: &AclRecord,
) -> Result<u64, ProvisionError> {
    let rows = acl_rows(writer, names).await?;
    let (_, expected) = read_acl(writer, names, principal, uid).await?;
    let body = serde_json::to_vec(record).map_err(js_err)?;
    rows.put_expecting(&SpaceNames::acl_key(principal, uid), body.into(), expected)
        .await
        .map_err(js_err)
}

/// Replaces the lifecycle's `allowSubscribe` (a narrowing or widening), bumping `revision`.
pub async fn set_read_acl(
    writer: &Context,
    names: &SpaceNames,
    principal: &Principal,
    uid: &LifecycleUid,
    allow_subscribe: Vec<String>,
) -> Result<u64, ProvisionError> {
    let (current, _) = read_acl(writer, names, principal, uid).await?;
    let mut record = current.unwrap_or_else(|| AclRecord::new(Vec::new(), 0, 0));
    record.allow_subscribe = allow_subscribe;
    record.revision += 1;
    record.updated_at = epoch_ms();
    put_acl(writer, names, principal, uid, &record).await
}

/// Retires the lifecycle: the tombstone `retired: true, retiredAt: <now>` on its ACL row.
pub async fn retire(
    writer: &Context,
    names: &SpaceNames,
    principal: &Principal,
    uid: &LifecycleUid,
) -> Result<u64, ProvisionError> {
    let (current, _) = read_acl(writer, names, principal, uid).await?;
    let mut record = current.unwrap_or_else(|| AclRecord::new(Vec::new(), 0, 0));
    let now = epoch_ms();
    record.retired = true;
    record.retired_at = Some(now);
    record.revision += 1;
    record.updated_at = now;
    put_acl(writer, names, principal, uid, &record).await
}

/// Removes the lifecycle's ACL row entirely (its owner becomes unknown to the reader).
pub async fn remove_acl(
    writer: &Context,
    names: &SpaceNames,
    principal: &Principal,
    uid: &LifecycleUid,
) -> Result<(), ProvisionError> {
    let rows = acl_rows(writer, names).await?;
    let (current, revision) = read_acl(writer, names, principal, uid).await?;
    if current.is_none() {
        return Ok(());
    }
    rows.delete_expecting(&SpaceNames::acl_key(principal, uid), revision)
        .await
        .map(|_| ())
        .map_err(js_err)
}
