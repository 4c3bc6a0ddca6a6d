//! The lease row and the records beside it, as an operator meets them: the row as the broker
//! holds it (absent, ready, whose), an operator's writes to it, the space's pid record, a broker
//! store filled to its cap, and the `$SYS` pair next to the daemon's credentials.

use std::time::Duration;

use cotal_delivery::base::{self, write_creds_file_atomic};
use cotal_delivery::provision::{encode_user, UserClaimsSpec};
use cotal_delivery::provision::{MeshAuthority, MintOptions, SystemProfile};
use cotal_delivery::wire::LeaseInfo;
use serde::Deserialize;

use super::verb::{poll, Ctx, Kind, Profiled, Refs};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;
use crate::rig::error::HarnessError;
use crate::rig::mesh::{Inspector, LeaseRow};

pub const VERBS: &[&str] = &[
    "expect_lease",
    "expect_lease_unwritten",
    "remember_lease",
    "delete_lease",
    "rewrite_lease_identical",
    "rewrite_lease_foreign_incarnation",
    "expect_pid_record",
    "plant_reused_pid",
    "fill_store",
    "sys_material",
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LeaseStep {
    ExpectLease {
        #[serde(default)]
        absent: bool,
        #[serde(default)]
        ready: Option<bool>,
        /// The same holder run (holder, incarnation, since) as a remembered row.
        #[serde(default)]
        same_as: Option<String>,
        /// Held by the delivery credential this daemon or host was started with.
        #[serde(default)]
        holder: Option<String>,
        /// The lease row of this other space of the mesh (`[mesh] spaces`): a host's lane of
        /// it, held by the host's credential of that space.
        #[serde(default)]
        space: Option<String>,
    },
    /// The lease bucket never stored a write: its stream's last sequence is 0.
    ExpectLeaseUnwritten {},
    RememberLease {
        name: String,
        /// The row of this other space of the mesh (`[mesh] spaces`).
        #[serde(default)]
        space: Option<String>,
    },
    DeleteLease {},
    RewriteLeaseIdentical {},
    RewriteLeaseForeignIncarnation {},
    ExpectPidRecord {
        #[serde(default)]
        pid_of: Option<String>,
        #[serde(default)]
        absent: bool,
        /// The record under this standby host's root instead of the workspace's.
        #[serde(default)]
        host: Option<String>,
    },
    PlantReusedPid {},
    FillStore {},
    SysMaterial {
        /// `missing`, `other-account`, or `several-accounts`.
        #[serde(default)]
        observer: Option<String>,
        /// `missing`, or `other-signer`.
        #[serde(default)]
        evictor: Option<String>,
        /// Tamper with the injected store's copies (`injected_store`) instead of the
        /// workspace's.
        #[serde(default)]
        store: bool,
    },
}

impl Profiled for LeaseStep {}

impl LeaseStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            // Checked once, unless the case gives a bound to wait for it.
            LeaseStep::ExpectLease { .. } => Some(Duration::ZERO),
            _ => None,
        }
    }

    /// The pid record and the `$SYS` pair live where the reference's workspace layout puts
    /// them (`.cotal/delivery.<key>.pid`, the space's store keys), so any implementation is
    /// judged by them.
    pub fn unsupported(&self, daemon: &DaemonUnderTest) -> Option<String> {
        match self {
            LeaseStep::SysMaterial { store: true, .. } => super::verb::only_here(
                daemon,
                "the injected store is this distribution's `--store` (`injected_store`)",
            ),
            _ => None,
        }
    }

    pub fn refs(&self) -> Refs {
        match self {
            LeaseStep::ExpectLease {
                same_as, holder, ..
            } => Refs::default()
                .uses_opt(Kind::Lease, same_as.as_ref())
                .uses_opt(Kind::Daemon, holder.as_ref()),
            LeaseStep::RememberLease { name, .. } => Refs::default().creates(Kind::Lease, name),
            LeaseStep::ExpectPidRecord { pid_of, host, .. } => Refs::default()
                .uses_opt(Kind::Daemon, pid_of.as_ref())
                .uses_opt(Kind::Host, host.as_ref()),
            _ => Refs::default(),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            LeaseStep::ExpectLease {
                absent,
                ready,
                same_as,
                holder,
                space,
            } => {
                let other = other_space(w, space)?;
                let want = same_as
                    .as_ref()
                    .map(|n| {
                        w.leases.get(n).cloned().ok_or_else(|| {
                            Failure::could_not(format!("no lease remembered as {n:?}"))
                        })
                    })
                    .transpose()?;
                let want_holder = holder
                    .as_ref()
                    .map(|h| {
                        let path = match &other {
                            // The credential of that space under the root it was started on.
                            Some(s) => {
                                let root = w.daemon_roots.get(h).ok_or_else(|| {
                                    Failure::could_not(format!("no daemon {h:?} was started"))
                                })?;
                                cotal_delivery::provision::Workspace::new(root)
                                    .delivery_creds_path(s)
                            }
                            None => w
                                .daemon_creds
                                .get(h)
                                .ok_or_else(|| {
                                    Failure::could_not(format!("no daemon {h:?} was started"))
                                })?
                                .clone(),
                        };
                        World::holder_of_creds(&path)
                    })
                    .transpose()?;
                let check = |row: &Option<LeaseRow>| -> Result<(), String> {
                    match row {
                        None if *absent => Ok(()),
                        None => Err("no lease row".into()),
                        Some(r) if *absent => Err(format!("a lease row held by {}", r.info.holder)),
                        Some(r) => {
                            if let Some(want_ready) = ready {
                                if r.info.ready != *want_ready {
                                    return Err(format!("ready is {}", r.info.ready));
                                }
                            }
                            if let Some(want) = &want {
                                if !same_holder_run(&want.info, &r.info) {
                                    return Err(format!(
                                        "the row of {} (incarnation {}), not the remembered one",
                                        r.info.holder, r.info.incarnation
                                    ));
                                }
                            }
                            if let Some(h) = &want_holder {
                                if r.info.holder != *h {
                                    return Err(format!("held by {}", r.info.holder));
                                }
                            }
                            Ok(())
                        }
                    }
                };
                let own;
                let insp = match &other {
                    Some(s) => {
                        own = w.mesh.inspector(s).await?;
                        &own
                    }
                    None => &w.insp,
                };
                poll(ctx, "the lease row to match", || async {
                    check(&insp.lease().await.map_err(|e| e.to_string())?)
                })
                .await?;
                let mut what = Vec::new();
                if let Some(s) = space {
                    what.push(format!("of space {s}"));
                }
                if *absent {
                    what.push("absent".to_string());
                }
                if let Some(r) = ready {
                    what.push(format!("ready={r}"));
                }
                if let Some(n) = same_as {
                    what.push(format!("same holder run as {n}"));
                }
                if let Some(h) = holder {
                    what.push(format!("held by {h}"));
                }
                Ok(format!("lease row: {}", what.join(", ")))
            }
            LeaseStep::RememberLease { name, space } => {
                let row = match other_space(w, space)? {
                    Some(s) => w.mesh.inspector(&s).await?.lease().await?,
                    None => w.insp.lease().await?,
                }
                .ok_or_else(|| Failure::new("a lease row to remember", "no lease row"))?;
                w.leases.insert(name.clone(), row);
                match space {
                    Some(s) => Ok(format!("remember the lease row of space {s} as {name}")),
                    None => Ok(format!("remember the lease row as {name}")),
                }
            }
            LeaseStep::DeleteLease {} => {
                w.insp.delete_lease().await?;
                Ok("operator deletes the lease row".into())
            }
            LeaseStep::RewriteLeaseIdentical {} => {
                let row = w
                    .insp
                    .lease()
                    .await?
                    .ok_or_else(|| Failure::new("a lease row to rewrite", "no lease row"))?;
                let rev = w.insp.put_lease(&row.info).await?;
                if rev <= row.revision {
                    return Err(Failure::new("the revision to move", format!("{rev}")));
                }
                Ok("operator re-writes the lease row with identical bytes".into())
            }
            LeaseStep::RewriteLeaseForeignIncarnation {} => {
                let row = w
                    .insp
                    .lease()
                    .await?
                    .ok_or_else(|| Failure::new("a lease row to rewrite", "no lease row"))?;
                let mut info = row.info.clone();
                info.incarnation = "another-run".into();
                w.insp.put_lease(&info).await?;
                Ok("operator re-writes the lease row with another incarnation".into())
            }
            LeaseStep::ExpectPidRecord {
                pid_of,
                absent,
                host,
            } => {
                let root = match host {
                    Some(h) => w
                        .hosts
                        .get(h)
                        .ok_or_else(|| Failure::could_not(format!("no host {h}")))?
                        .path()
                        .to_path_buf(),
                    None => w.mesh.root().to_path_buf(),
                };
                let path = base::pid_path(&root, w.mesh.space());
                let recorded = base::read_pid(&path);
                if *absent {
                    if path.exists() {
                        return Err(Failure::new(
                            "no pid record",
                            format!("a record naming {recorded:?}"),
                        ));
                    }
                    return Ok(match host {
                        Some(h) => format!("pid record under host {h}'s root: absent"),
                        None => "pid record: absent".into(),
                    });
                }
                let name = pid_of.as_ref().ok_or_else(|| {
                    Failure::could_not("expect_pid_record needs pid_of or absent")
                })?;
                let pid = w.daemon(name)?.pid();
                if recorded != Some(pid) {
                    return Err(Failure::new(
                        format!("a pid record naming daemon {name} (pid {pid})"),
                        format!("{recorded:?}"),
                    ));
                }
                Ok(format!("pid record names daemon {name}"))
            }
            LeaseStep::PlantReusedPid {} => {
                let child = std::process::Command::new("sleep")
                    .arg("600")
                    .spawn()
                    .map_err(|e| Failure::could_not(format!("spawn sleep: {e}")))?;
                let path = base::pid_path(w.mesh.root(), w.mesh.space());
                base::write_atomic(&path, format!("{}\n", child.id()).as_bytes())
                    .map_err(|e| Failure::could_not(e.to_string()))?;
                w.sleeper = Some(child);
                Ok("a pid record names a live process that is not a delivery daemon".into())
            }
            LeaseStep::FillStore {} => {
                let n = fill_store(&w.insp).await?;
                Ok(format!(
                    "broker file store filled (refused after {} writes)",
                    if n == 0 { "0" } else { "some" }
                ))
            }
            LeaseStep::SysMaterial {
                observer,
                evictor,
                store,
            } => sys_material(w, observer, evictor, *store),
            LeaseStep::ExpectLeaseUnwritten {} => {
                let state = w
                    .insp
                    .lease_bucket_state()
                    .await
                    .map_err(|e| Failure::could_not(e.to_string()))?;
                never_written(&state)
                    .map_err(|got| Failure::new("the lease bucket never written", got))?;
                Ok("the lease bucket never stored a write (no row, no marker, ever)".into())
            }
        }
    }
}

/// Whether the lease bucket's stream never stored a write. Its last sequence, not what it holds
/// now: a claim and its release leave no row (the release's marker may be gone too, purged or
/// expired), but the sequence they took stays counted.
fn never_written(state: &async_nats::jetstream::stream::State) -> Result<(), String> {
    match state.last_sequence {
        0 => Ok(()),
        n => Err(format!(
            "{n} writes stored (last sequence {n}), {} held now",
            state.messages
        )),
    }
}

/// Same holder, incarnation and `since`: the same daemon run, whatever its revision and
/// readiness.
fn same_holder_run(a: &LeaseInfo, b: &LeaseInfo) -> bool {
    a.holder == b.holder && a.incarnation == b.incarnation && a.since == b.since
}

fn sys_material(
    w: &World,
    observer: &Option<String>,
    evictor: &Option<String>,
    store: bool,
) -> StepResult {
    let space = w.mesh.space().clone();
    let ws = w.mesh.workspace();
    let usage = |e: &dyn std::fmt::Display| Failure::could_not(e.to_string());
    // The workspace's file, or its copy in the injected store (the same name under the space's
    // segment there).
    let at = |path: std::path::PathBuf| -> Result<std::path::PathBuf, Failure> {
        if !store {
            return Ok(path);
        }
        let name = path
            .file_name()
            .ok_or_else(|| Failure::could_not(format!("{} has no file name", path.display())))?;
        let copy = w.injected_store_dir().join(space.segment()).join(name);
        if !copy.exists() {
            return Err(Failure::could_not(format!(
                "no injected store holds {} (injected_store first)",
                copy.display()
            )));
        }
        Ok(copy)
    };
    // Another mesh's signer: same space name, another account and system key.
    let mut other = MeshAuthority::new();
    other.add_space(&space);
    let mut done = Vec::new();
    match observer.as_deref() {
        None => {}
        Some("missing") => {
            std::fs::remove_file(at(ws.membership_observer_creds_path(&space))?)
                .map_err(|e| usage(&e))?;
            done.push("the $SYS observer credential is removed");
        }
        Some("other-account") => {
            let cred = other
                .mint_system(
                    &space,
                    SystemProfile::MembershipObserver,
                    MintOptions::new(),
                )
                .map_err(|e| usage(&e))?;
            write_creds_file_atomic(&at(ws.membership_observer_creds_path(&space))?, &cred)
                .map_err(|e| usage(&e))?;
            done.push("the $SYS observer is replaced by one scanning another account");
        }
        Some("several-accounts") => {
            let cred = observer_of_several_accounts(&w.mesh.authority, &other, &space)?;
            write_creds_file_atomic(&at(ws.membership_observer_creds_path(&space))?, &cred)
                .map_err(|e| usage(&e))?;
            done.push("the $SYS observer is replaced by one scanning this account and another");
        }
        Some(o) => return Err(Failure::could_not(format!("observer = {o:?}?"))),
    }
    match evictor.as_deref() {
        None => {}
        Some("missing") => {
            std::fs::remove_file(at(ws.connection_evictor_creds_path(&space))?)
                .map_err(|e| usage(&e))?;
            done.push("the $SYS evictor credential is removed");
        }
        Some("other-signer") => {
            let cred = other
                .mint_system(&space, SystemProfile::ConnectionEvictor, MintOptions::new())
                .map_err(|e| usage(&e))?;
            write_creds_file_atomic(&at(ws.connection_evictor_creds_path(&space))?, &cred)
                .map_err(|e| usage(&e))?;
            done.push("the $SYS evictor is replaced by one signed by another system key");
        }
        Some(o) => return Err(Failure::could_not(format!("evictor = {o:?}?"))),
    }
    let done = done.join("; ");
    Ok(if store {
        format!("in the injected store: {done}")
    } else {
        done
    })
}

/// A `$SYS` observer of `ours`' system account whose grants scan `space`'s account in `ours`
/// and in `other` as well: what a wider provisioning tool could mint, signed by the right key.
fn observer_of_several_accounts(
    ours: &MeshAuthority,
    other: &MeshAuthority,
    space: &cotal_delivery::wire::Space,
) -> Result<cotal_delivery::base::Credential, Failure> {
    let usage = |e: &dyn std::fmt::Display| Failure::could_not(e.to_string());
    let ours_account = ours.account_public_key(space).map_err(|e| usage(&e))?;
    let other_account = other.account_public_key(space).map_err(|e| usage(&e))?;
    let mut permissions = SystemProfile::MembershipObserver.permissions(&ours_account);
    permissions.pub_allow.extend(
        SystemProfile::MembershipObserver
            .permissions(&other_account)
            .pub_allow,
    );
    let system = nkeys::KeyPair::from_seed(&ours.system_account_seed().map_err(|e| usage(&e))?)
        .map_err(|e| usage(&e))?;
    let user = nkeys::KeyPair::new_user();
    let spec = UserClaimsSpec::new(SystemProfile::MembershipObserver.name())
        .permissions(permissions)
        .expires_in(Some(Duration::from_secs(3600)));
    let jwt = encode_user(&system, &user.public_key(), &spec).map_err(|e| usage(&e))?;
    let seed = user.seed().map_err(|e| usage(&e))?;
    cotal_delivery::base::Credential::new(jwt, seed).map_err(|e| usage(&e))
}

/// Publishes 64 KiB messages into a scratch stream until the broker refuses for lack of
/// resources; returns how many were stored. Bounded by 4096 writes.
async fn fill_store(insp: &Inspector) -> Result<usize, HarnessError> {
    use async_nats::jetstream::stream::Config;
    const MAX_WRITES: usize = 4096;
    insp.js
        .get_or_create_stream(Config {
            name: "FILLER".into(),
            subjects: vec!["filler.>".into()],
            ..Default::default()
        })
        .await
        .map_err(|e| HarnessError::Usage(format!("create filler stream: {e}")))?;
    let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
    for i in 0..MAX_WRITES {
        let ack = insp
            .js
            .publish(format!("filler.{i}"), chunk.clone())
            .await
            .map_err(|e| HarnessError::Usage(format!("filler publish: {e}")))?;
        if let Err(e) = ack.await {
            let text = e.to_string();
            if text.contains("insufficient resources") {
                return Ok(i);
            }
            return Err(HarnessError::Usage(format!(
                "filler refused otherwise: {text}"
            )));
        }
    }
    Err(HarnessError::Usage(format!(
        "the store took {MAX_WRITES} writes without refusing"
    )))
}

/// The space a lease step names instead of the case's: one of `[mesh] spaces`.
fn other_space(
    w: &World,
    space: &Option<String>,
) -> Result<Option<cotal_delivery::wire::Space>, Failure> {
    space
        .as_ref()
        .map(|s| {
            w.mesh
                .spaces()
                .iter()
                .find(|m| m.as_str() == s)
                .cloned()
                .ok_or_else(|| Failure::could_not(format!("space {s:?} is not in [mesh] spaces")))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(messages: u64, last_sequence: u64) -> async_nats::jetstream::stream::State {
        serde_json::from_value(serde_json::json!({
            "messages": messages,
            "bytes": 0,
            "first_seq": last_sequence.min(1),
            "first_ts": "1970-01-01T00:00:00Z",
            "last_seq": last_sequence,
            "last_ts": "1970-01-01T00:00:00Z",
            "consumer_count": 0,
        }))
        .expect("a stream state")
    }

    /// A bucket whose row was claimed and released again holds nothing, yet was written: only
    /// a stream that never stored a message passes.
    /// Mutation seen failing: judging `state.messages == 0` instead of the last sequence (the
    /// claimed-and-released bucket passes).
    #[test]
    fn a_claim_and_its_release_count_as_written() {
        assert_eq!(never_written(&state(0, 0)), Ok(()));
        assert!(never_written(&state(0, 2)).is_err());
        assert!(never_written(&state(1, 1)).is_err());
    }
}
