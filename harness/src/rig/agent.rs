//! Agents for tests: provision a lifecycle the way the manager would (credential, ACL row,
//! `dlv_` durable) and connect the library's [`Agent`] client as it, against a [`Mesh`].

use std::time::Duration;

use cotal_delivery::agent::{Agent, AgentSpec, Delivery, Frame};
use cotal_delivery::provision::{provision_agent, AgentMaterial};
use cotal_delivery::provision::{MintOptions, ReadChannels, Roles};
use cotal_delivery::wire::{Principal, Space};

use crate::rig::error::HarnessError;
use crate::rig::mesh::{Inspector, Mesh};

/// Provisions a fresh lifecycle of `local.<actor>` reading `read` in `space`.
pub async fn provision(
    mesh: &Mesh,
    inspector: &Inspector,
    space: &Space,
    actor: &str,
    read: &[&str],
) -> Result<AgentMaterial, HarnessError> {
    provision_holder(mesh, inspector, space, actor, read, &[]).await
}

/// Provisions a fresh lifecycle of `local.<actor>` reading `read` and serving the anycast
/// `roles` in `space` (their `svc_<role>` durables are ensured, the ACL row lists them).
pub async fn provision_holder(
    mesh: &Mesh,
    inspector: &Inspector,
    space: &Space,
    actor: &str,
    read: &[&str],
    roles: &[&str],
) -> Result<AgentMaterial, HarnessError> {
    let principal =
        Principal::new("local", actor).map_err(|e| HarnessError::Usage(e.to_string()))?;
    let read = ReadChannels::new(read).map_err(|e| HarnessError::Usage(e.to_string()))?;
    let roles = Roles::new(roles).map_err(|e| HarnessError::Usage(e.to_string()))?;
    provision_agent(
        &mesh.authority,
        &inspector.js,
        space,
        &principal,
        read,
        roles,
        MintOptions::new(),
    )
    .await
    .map_err(|e| HarnessError::Usage(e.to_string()))
}

/// Connects the agent client as `material`, with `card.name` = `name`.
pub async fn connect(
    mesh: &Mesh,
    material: &AgentMaterial,
    name: &str,
) -> Result<Agent, HarnessError> {
    Agent::connect(AgentSpec::of_material(
        mesh.url(),
        mesh.tls_ca(),
        material,
        name,
    ))
    .await
    .map_err(|e| HarnessError::Usage(e.to_string()))
}

/// Provisions and connects in one step.
pub async fn spawn(
    mesh: &Mesh,
    inspector: &Inspector,
    actor: &str,
    read: &[&str],
) -> Result<(Agent, AgentMaterial), HarnessError> {
    spawn_holder(mesh, inspector, actor, read, &[]).await
}

/// Provisions a holder of the anycast `roles` and connects it, in one step.
pub async fn spawn_holder(
    mesh: &Mesh,
    inspector: &Inspector,
    actor: &str,
    read: &[&str],
    roles: &[&str],
) -> Result<(Agent, AgentMaterial), HarnessError> {
    let material = provision_holder(mesh, inspector, mesh.space(), actor, read, roles).await?;
    let agent = connect(mesh, &material, actor).await?;
    Ok((agent, material))
}

/// Surfaces frames until `want` arrived or `bound` passed (each frame acked after surfacing).
pub async fn surface_until(
    delivery: &mut Delivery,
    bound: Duration,
    want: impl Fn(&[Frame]) -> bool,
) -> Vec<Frame> {
    let deadline = tokio::time::Instant::now() + bound;
    let mut out = Vec::new();
    while !want(&out) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        match delivery.surface(left, |_| {}).await {
            Ok(Some(f)) => out.push(f),
            Ok(None) | Err(_) => break,
        }
    }
    out
}

/// Surfaces for `quiet` and returns whatever arrived (to show that nothing does).
pub async fn surface_for(delivery: &mut Delivery, quiet: Duration) -> Vec<Frame> {
    surface_until(delivery, quiet, |_| false).await
}

/// The `text` of each frame's first part, in order.
pub fn texts(frames: &[Frame]) -> Vec<String> {
    frames
        .iter()
        .map(|f| {
            f.msg["parts"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}
