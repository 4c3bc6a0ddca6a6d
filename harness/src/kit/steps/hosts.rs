//! Standby hosts: roots prepared for the case's space as an operator provisions two multi-space
//! hosts (a manifest naming the space, the host's own delivery credential with its own nkey, the
//! `$SYS` material), each started with `start = { daemon = …, host = … }`; and what an operator
//! can get wrong on such a root (a credential of another account or a malformed one, no `$SYS`
//! observer, the space not provisioned, a malformed manifest), and the credential put back.

use std::time::Duration;

use cotal_delivery::base::{read_creds_file, write_creds_file_atomic};
use cotal_delivery::provision::{
    manifest_path, prepare_standby_hosts, retain_system_seed, MintOptions, Profile, StandbyPlan,
    Workspace,
};
use serde::Deserialize;

use super::verb::{no_host_cmd, poll, Ctx, Kind, Profiled, Refs};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;

pub const VERBS: &[&str] = &["host", "host_material", "expect_evictor_connections"];

/// What becomes of a host's delivery credential of the case's space.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum HostCreds {
    /// Not a credential at all.
    Garbage,
    /// The host's own JWT with another user's seed: a credential that fails its own check.
    Mismatched,
    /// A well-formed delivery credential of another space's account (`[mesh] spaces`).
    OtherAccount,
    /// The credential the host was prepared with, put back.
    Restore,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum HostStep {
    Host {
        name: String,
        /// Prepared for every space of the mesh (`[mesh] spaces` too), one lane each, instead
        /// of the case's space alone.
        #[serde(default)]
        every_space: bool,
    },
    HostMaterial {
        host: String,
        #[serde(default)]
        creds: Option<HostCreds>,
        /// `missing`: the `$SYS` membership observer removed from the host's root.
        #[serde(default)]
        observer: Option<String>,
        /// `false`: the space's directory removed from the root (its manifest still names it).
        #[serde(default)]
        provisioned: Option<bool>,
        /// `malformed`: a manifest of another version.
        #[serde(default)]
        manifest: Option<String>,
        /// A space of the root (`[mesh] spaces`) that retains the system-account signing seed,
        /// as provisioning leaves it for a host that kicks (docs/host.md, "Kicks").
        #[serde(default)]
        system_seed: Option<String>,
    },
    /// The connections the broker lists, open or closed, on every node, that authenticated as
    /// the user of a `$SYS` evictor credential the host's root holds (any space's): exactly
    /// `count` (read once, or waited for with `within`). Judged by the credential, not a name.
    ExpectEvictorConnections { host: String, count: usize },
}

impl Profiled for HostStep {}

impl HostStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            HostStep::ExpectEvictorConnections { .. } => Some(Duration::from_secs(5)),
            _ => None,
        }
    }

    /// A host's root is what the seeds tell an operator to prepare (a `.cotal` root, a
    /// version-1 manifest, the host's own scoped credentials), so any host can be started on
    /// it; under `--daemon-cmd` only `--host-cmd` says how.
    pub fn unsupported(&self, daemon: &DaemonUnderTest) -> Option<String> {
        no_host_cmd(daemon)
    }

    pub fn refs(&self) -> Refs {
        match self {
            HostStep::Host { name, .. } => Refs::default().creates(Kind::Host, name),
            HostStep::HostMaterial { host, .. }
            | HostStep::ExpectEvictorConnections { host, .. } => {
                Refs::default().uses(Kind::Host, host)
            }
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            HostStep::Host { name, every_space } => {
                let root = tempfile::Builder::new()
                    .prefix("cotal-host-")
                    .tempdir()
                    .map_err(|e| Failure::could_not(format!("create the host root: {e}")))?;
                let spaces = if *every_space {
                    w.mesh.spaces().to_vec()
                } else {
                    vec![w.mesh.space().clone()]
                };
                // A host gets the `$SYS` evictor where the mesh's spaces have one (`[mesh]
                // evictor`): on a mesh without one, a kick can only come from the host.
                let mut plan = StandbyPlan::new(spaces.clone());
                plan.evictor = Workspace::new(w.mesh.root())
                    .connection_evictor_creds_path(w.mesh.space())
                    .exists();
                prepare_standby_hosts(&w.mesh.authority, &plan, &[root.path()])
                    .map_err(|e| Failure::could_not(format!("prepare host {name}: {e}")))?;
                w.hosts.insert(name.clone(), root);
                let names: Vec<&str> = spaces.iter().map(|s| s.as_str()).collect();
                Ok(format!(
                    "standby host {name} prepared for space {}",
                    names.join(" and ")
                ))
            }
            HostStep::HostMaterial {
                host,
                creds,
                observer,
                provisioned,
                manifest,
                system_seed,
            } => host_material(
                w,
                host,
                *creds,
                observer,
                *provisioned,
                manifest,
                system_seed,
            ),
            HostStep::ExpectEvictorConnections { host, count } => {
                evictor_connections(w, ctx, host, *count).await
            }
        }
    }
}

/// [`HostStep::ExpectEvictorConnections`]: the evictor users are read from the root's files.
async fn evictor_connections(w: &mut World, ctx: Ctx, host: &str, count: usize) -> StepResult {
    let root = host_root(w, host)?;
    let ws = Workspace::new(&root);
    let mut users = Vec::new();
    for space in w.mesh.spaces() {
        let path = ws.connection_evictor_creds_path(space);
        if path.exists() {
            let cred = read_creds_file(&path).map_err(|e| Failure::could_not(e.to_string()))?;
            users.push(
                cred.public_key()
                    .map_err(|e| Failure::could_not(e.to_string()))?,
            );
        }
    }
    if users.is_empty() {
        return Err(Failure::could_not(format!(
            "host {host}'s root holds no $SYS evictor credential"
        )));
    }
    let mesh = &w.mesh;
    let users = &users;
    let got = poll(
        ctx,
        &format!(
            "the broker to list {count} connection(s) under host {host}'s evictor credentials"
        ),
        || async {
            let n = super::read::count_connections(mesh, |c| {
                c.user.as_ref().is_some_and(|u| users.contains(u))
            })
            .await?;
            if n == count {
                Ok(n)
            } else {
                Err(format!("{n} connection(s)"))
            }
        },
    )
    .await?;
    Ok(format!(
        "the broker lists {got} connection(s) under host {host}'s $SYS evictor credentials, open or closed"
    ))
}

fn host_material(
    w: &mut World,
    host: &str,
    creds: Option<HostCreds>,
    observer: &Option<String>,
    provisioned: Option<bool>,
    manifest: &Option<String>,
    system_seed: &Option<String>,
) -> StepResult {
    let fail = |e: &dyn std::fmt::Display| Failure::could_not(e.to_string());
    let root = host_root(w, host)?;
    let space = w.mesh.space().clone();
    let ws = Workspace::new(&root);
    let path = ws.delivery_creds_path(&space);
    // The prepared credential is kept outside every root, for `restore`.
    let kept = w.outside.path().join(format!("host-{host}-delivery.creds"));
    let mut done = Vec::new();
    if let Some(c) = creds {
        if c != HostCreds::Restore && !kept.exists() {
            std::fs::copy(&path, &kept).map_err(|e| fail(&e))?;
        }
        match c {
            HostCreds::Garbage => {
                std::fs::write(&path, "not a credential\n").map_err(|e| fail(&e))?;
                done.push(format!(
                    "host {host}'s delivery credential is not a credential"
                ));
            }
            HostCreds::Mismatched => {
                let own = read_creds_file(&path).map_err(|e| fail(&e))?;
                let stranger = w
                    .mesh
                    .mint(&space, &Profile::Delivery, MintOptions::new())?;
                // Built field by field: `Credential::new` would refuse it, as the host must.
                let torn = cotal_delivery::base::Credential {
                    jwt: own.jwt,
                    seed: stranger.seed,
                };
                std::fs::write(&path, torn.to_creds_text()).map_err(|e| fail(&e))?;
                done.push(format!(
                    "host {host}'s delivery credential pairs its JWT with another user's seed"
                ));
            }
            HostCreds::OtherAccount => {
                let other = w.mesh.spaces().get(1).cloned().ok_or_else(|| {
                    Failure::could_not("`other-account` needs a second space in [mesh] spaces")
                })?;
                let cred = w
                    .mesh
                    .mint(&other, &Profile::Delivery, MintOptions::new())?;
                write_creds_file_atomic(&path, &cred).map_err(|e| fail(&e))?;
                done.push(format!(
                    "host {host}'s delivery credential is one of space {other}'s account"
                ));
            }
            HostCreds::Restore => {
                std::fs::copy(&kept, &path).map_err(|e| fail(&e))?;
                done.push(format!(
                    "host {host}'s delivery credential is put back as prepared"
                ));
            }
        }
    }
    match observer.as_deref() {
        None => {}
        Some("missing") => {
            std::fs::remove_file(ws.membership_observer_creds_path(&space))
                .map_err(|e| fail(&e))?;
            done.push(format!("host {host} has no $SYS observer credential"));
        }
        Some(o) => return Err(Failure::could_not(format!("observer = {o:?}?"))),
    }
    match provisioned {
        None | Some(true) => {}
        Some(false) => {
            std::fs::remove_dir_all(ws.space_dir(&space)).map_err(|e| fail(&e))?;
            done.push(format!(
                "host {host} is not provisioned for space {space} (its manifest still names it)"
            ));
        }
    }
    match manifest.as_deref() {
        None => {}
        Some("malformed") => {
            std::fs::write(
                manifest_path(&root),
                format!("{{\"version\": 2, \"spaces\": [\"{space}\"]}}"),
            )
            .map_err(|e| fail(&e))?;
            done.push(format!("host {host}'s manifest is of version 2"));
        }
        Some(m) => return Err(Failure::could_not(format!("manifest = {m:?}?"))),
    }
    if let Some(s) = system_seed {
        let seed_space = w
            .mesh
            .spaces()
            .iter()
            .find(|x| x.as_str() == s)
            .cloned()
            .ok_or_else(|| Failure::could_not(format!("system_seed = {s:?}: no such space")))?;
        retain_system_seed(&ws, &seed_space, &w.mesh.authority).map_err(|e| fail(&e))?;
        done.push(format!(
            "host {host}'s space {seed_space} retains the system-account signing seed"
        ));
    }
    if done.is_empty() {
        return Err(Failure::could_not("host_material changes nothing"));
    }
    Ok(done.join("; "))
}

/// The root a `host` step made for `host`.
fn host_root(w: &World, host: &str) -> Result<std::path::PathBuf, Failure> {
    w.hosts
        .get(host)
        .map(|d| d.path().to_path_buf())
        .ok_or_else(|| Failure::could_not(format!("no host {host:?}")))
}
