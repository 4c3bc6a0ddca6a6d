//! Shared fixture of the admin-rail tests: a mesh, the real daemon with the documented short
//! windows (and a short `$SYS` page settle), a manager, and test-side reads.
#![allow(dead_code)]

use std::time::Duration;

use cotal_delivery::wire::{LifecycleUid, Principal, SpaceNames};
use delivery_harness::rig::daemon::{Daemon, DaemonSpec};
use delivery_harness::rig::manager::{AdminAnswer, Manager};
use delivery_harness::rig::mesh::{Inspector, Mesh};
use serde_json::Value;

use crate::support::data_path as s;

/// `COTAL_DELIVERY_SWEEP_SETTLE_MS` the tests run the daemon with.
pub const SWEEP_SETTLE_MS: &str = "50";

/// The data-path tests' daemon with the short `$SYS` page settle; started by
/// [`crate::support::start`].
pub fn admin_spec(mesh: &Mesh) -> DaemonSpec {
    s::daemon_spec(mesh).env("COTAL_DELIVERY_SWEEP_SETTLE_MS", SWEEP_SETTLE_MS)
}

/// The admin tests' usual start: the data-path mesh, the daemon started with [`admin_spec`], a
/// manager, and alice provisioned reading `general` (not connected).
pub async fn served_with_alice() -> (
    Mesh,
    Daemon,
    Manager,
    cotal_delivery::provision::AgentMaterial,
) {
    let mesh = s::mesh().await;
    let insp = mesh.inspector(mesh.space()).await.expect("inspector");
    let d = crate::support::start(admin_spec(&mesh)).await;
    let m = manager(&mesh).await;
    let alice =
        delivery_harness::rig::agent::provision(&mesh, &insp, mesh.space(), "alice", &["general"])
            .await
            .expect("alice");
    (mesh, d, m, alice)
}

pub async fn manager(mesh: &Mesh) -> Manager {
    Manager::connect(
        mesh,
        mesh.space(),
        &Principal::parse("local.manager").expect("principal"),
    )
    .await
    .expect("manager")
}

/// The data of an answered request; panics on anything else.
pub fn answered(o: AdminAnswer) -> Value {
    match o {
        AdminAnswer::Answered(v) => v,
        other => panic!("expected an answer, got {other:?}"),
    }
}

/// The refusal text; panics on anything else.
pub fn refused(o: AdminAnswer) -> String {
    match o {
        AdminAnswer::Refused(e) => e,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// `op` with `args` sent once by `m` on the admin rail (bounded by [`crate::support::BOUND`]):
/// the data of its answer; panics on anything else.
pub async fn ask(m: &Manager, op: &str, args: Value) -> Value {
    answered(m.request_once(op, &args, crate::support::BOUND).await)
}

/// [`ask`] that must be refused: the refusal text.
pub async fn ask_refused(m: &Manager, op: &str, args: Value) -> String {
    refused(m.request_once(op, &args, crate::support::BOUND).await)
}

/// Every live member row of one lifecycle, as the broker holds it: `(channel, generation)`.
pub async fn rows_of(insp: &Inspector, p: &Principal, uid: &LifecycleUid) -> Vec<(String, u64)> {
    let keys = cotal_delivery::base::keys(
        &insp.js,
        &insp.names.members_bucket(),
        ">",
        Duration::from_secs(5),
    )
    .await
    .expect("keys");
    let suffix = format!("/{}.{uid}", p.dot_form());
    let mut out = Vec::new();
    for k in keys.iter().filter(|k| k.ends_with(&suffix)) {
        if let Some(v) = s::row(insp, &insp.names.members_bucket(), k).await {
            out.push((
                v["channel"].as_str().unwrap_or_default().to_string(),
                v["generation"].as_u64().unwrap_or(0),
            ));
        }
    }
    out
}

/// `(channel, generation)` of an inventory's memberships.
pub fn listed(inventory: &Value) -> Vec<(String, u64)> {
    inventory["memberships"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    (
                        m["channel"].as_str().unwrap_or_default().to_string(),
                        m["generation"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn names(mesh: &Mesh) -> SpaceNames {
    SpaceNames::new(mesh.space())
}

/// A one-shot connection presenting `material`'s agent credential (tagged `principal:<o>.<a>`):
/// once kicked it stays gone (`cotal_delivery::base::credential_options` never redials), like a retired
/// agent whose credential the manager's deny-new has revoked.
pub async fn victim(
    mesh: &Mesh,
    material: &cotal_delivery::provision::AgentMaterial,
) -> async_nats::Client {
    mesh.connect(&material.credential, "victim")
        .await
        .expect("victim connects")
}
