//! Provisioning for standby hosts: several multi-space hosts ready to serve the same spaces of
//! one broker, each from its own root (docs/host.md).
//!
//! Why a helper: the harness, the smoke suite and an operator's provisioner must prepare the
//! roots the same way. Each host gets its own credentials (its own delivery nkey, distinct from
//! every other host's and kept across renewals), its own `$SYS` observer and evictor, the
//! space's `membership.json` and a version-1 manifest. No host root receives the account
//! signer: the provisioner keeps signing custody and renews each host through its own store.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::authority::{AuthorityError, MeshAuthority, MintOptions};
use super::layout::{SpaceMaterial, Workspace};
use super::manifest::Manifest;
use super::profiles::Profile;
use crate::base::{delivery_creds_key, read_creds_file, Credential, FsStore, SecretStore};
use crate::wire::Space;

/// One prepared host root.
#[derive(Debug, Clone)]
pub struct HostRoot {
    pub root: PathBuf,
    /// The manifest written under the root.
    pub manifest: PathBuf,
    /// Each space's delivery nkey on this host, in the manifest's order.
    pub delivery_nkeys: Vec<(Space, String)>,
}

/// What to prepare.
#[derive(Debug, Clone)]
pub struct StandbyPlan {
    pub spaces: Vec<Space>,
    /// Lifetime of each host's initial delivery credential (`None`: the profile's default).
    pub delivery_ttl: Option<Duration>,
    /// Whether each host gets a `$SYS` connection-evictor credential.
    pub evictor: bool,
}

impl StandbyPlan {
    pub fn new(spaces: Vec<Space>) -> StandbyPlan {
        StandbyPlan {
            spaces,
            delivery_ttl: None,
            evictor: true,
        }
    }
}

fn usage(detail: String) -> AuthorityError {
    AuthorityError::new(super::authority::AuthorityErrorKind::Format, detail)
}

/// Prepares each of `roots` (distinct directories) as a standby host of `plan.spaces`.
pub fn prepare_standby_hosts(
    authority: &MeshAuthority,
    plan: &StandbyPlan,
    roots: &[&Path],
) -> Result<Vec<HostRoot>, AuthorityError> {
    for (i, a) in roots.iter().enumerate() {
        if roots[..i].iter().any(|b| b == a) {
            return Err(usage(format!(
                "standby hosts need distinct roots; {} is named twice",
                a.display()
            )));
        }
    }
    let mut hosts = Vec::with_capacity(roots.len());
    for root in roots {
        let workspace = Workspace::new(*root);
        let mut nkeys = Vec::with_capacity(plan.spaces.len());
        for space in &plan.spaces {
            let mut material = SpaceMaterial::mint(authority, space)?;
            if let Some(ttl) = plan.delivery_ttl {
                material.delivery = authority.mint(
                    space,
                    &Profile::Delivery,
                    MintOptions::new().expires_in(ttl),
                )?;
            }
            if !plan.evictor {
                material.connection_evictor = None;
            }
            workspace.write_space_material(space, &material)?;
            nkeys.push((space.clone(), material.delivery.public_key()?));
        }
        let manifest = Manifest {
            spaces: plan.spaces.clone(),
        }
        .write(root)
        .map_err(|e| usage(e.to_string()))?;
        hosts.push(HostRoot {
            root: root.to_path_buf(),
            manifest,
            delivery_nkeys: nkeys,
        });
    }
    Ok(hosts)
}

/// Re-signs `root`'s delivery credential of `space` for the same nkey and writes it atomically
/// through that host's own store (the store its lane re-reads and proves against the broker).
pub fn renew_host_delivery(
    authority: &MeshAuthority,
    root: &Path,
    space: &Space,
    ttl: Duration,
) -> Result<Credential, AuthorityError> {
    let path = Workspace::new(root).delivery_creds_path(space);
    let current = read_creds_file(&path)?;
    let renewed = authority.mint(
        space,
        &Profile::Delivery,
        MintOptions::new().renewal_of(&current).expires_in(ttl),
    )?;
    // Through the host's own store: the key its lane re-reads and proves against the broker.
    FsStore::new(root)
        .put(&delivery_creds_key(space), &renewed.to_creds_text())
        .map_err(|e| usage(e.to_string()))?;
    Ok(renewed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutations seen failing: every host given the first host's delivery credential (the
    /// nkeys are then equal); renewing without `renewal_of` (the nkey changes).
    #[test]
    fn each_host_has_its_own_stable_delivery_nkey() {
        let s = Space::parse("demo").unwrap();
        let mut a = MeshAuthority::new();
        a.add_space(&s);
        let (r1, r2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let plan = StandbyPlan::new(vec![s.clone()]);
        let hosts = prepare_standby_hosts(&a, &plan, &[r1.path(), r2.path()]).unwrap();
        let (k1, k2) = (&hosts[0].delivery_nkeys[0].1, &hosts[1].delivery_nkeys[0].1);
        assert_ne!(k1, k2, "distinct between hosts");
        for h in &hosts {
            assert_eq!(Manifest::read(&h.manifest).unwrap().spaces, vec![s.clone()]);
            let ws = Workspace::new(&h.root);
            assert!(ws.membership_observer_creds_path(&s).exists());
            assert!(!ws.auth_dir().exists(), "no signer on a host root");
        }
        let renewed = renew_host_delivery(&a, r1.path(), &s, Duration::from_secs(60)).unwrap();
        assert_eq!(&renewed.public_key().unwrap(), k1, "stable across renewal");
        let on_disk = read_creds_file(&Workspace::new(r1.path()).delivery_creds_path(&s)).unwrap();
        assert_eq!(on_disk, renewed);
        assert!(prepare_standby_hosts(&a, &plan, &[r1.path(), r1.path()]).is_err());
    }
}
