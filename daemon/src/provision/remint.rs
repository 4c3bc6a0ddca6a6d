//! The renewal owner's re-sign (`remintDaemonCreds`): the daemon's standing credentials
//! (`delivery.creds`, `membership-rw.creds`) re-signed from the space's signer into the store they
//! are read from, and the broker preflight that proves a candidate before it replaces the last
//! good one.
//!
//! Why here, in provisioning: it signs, and the daemon never signs; the daemon only proves and
//! adopts what an owner wrote (`space::renew`). Without a preflight (the offline repair), an
//! overwrite is allowed only under authority continuity: the candidate's `iss` is the current
//! credential's. Never throws: every file gets an outcome the caller must inspect.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::creds::Credential;
use crate::provision::jwt::{encode_user, UserClaimsSpec};
use crate::provision::Profile;
use crate::store::{
    account_signer_key, delivery_creds_key, membership_rw_creds_key, FsStore, SecretStore,
};
use crate::wire::{Space, SpaceNames};

/// Bound on a disposable preflight connection.
pub const PREFLIGHT_BOUND: Duration = crate::tuning::BROKER_BOUND;

/// What the broker accepted: the user nkey and the JWT's expiry (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAccepted {
    pub identity: String,
    pub exp: Option<i64>,
}

impl BrokerAccepted {
    pub fn to_json(&self) -> Value {
        json!({"identity": self.identity, "exp": self.exp})
    }
    pub(crate) fn of(cred: &Credential) -> BrokerAccepted {
        BrokerAccepted {
            identity: cred.public_key().unwrap_or_default(),
            exp: cred.claims().ok().and_then(|c| c.exp),
        }
    }
}

/// Proves a candidate against the broker on a disposable connection (never the resident one).
#[derive(Debug, Clone)]
pub struct Preflight {
    pub server: String,
    pub tls_ca: Option<PathBuf>,
    pub bound: Duration,
}

impl Preflight {
    pub fn new(server: impl Into<String>, tls_ca: Option<PathBuf>) -> Preflight {
        Preflight {
            server: server.into(),
            tls_ca,
            bound: PREFLIGHT_BOUND,
        }
    }

    /// `Ok` once the broker answered the candidate's CONNECT with its PONG.
    pub async fn prove(&self, cred: &Credential) -> Result<BrokerAccepted, String> {
        let client = crate::client::connect_with_credential(
            &self.server,
            self.tls_ca.as_deref(),
            cred,
            "cotal-delivery-preflight",
            self.bound,
        )
        .await
        .map_err(|e| format!("the broker did not accept the candidate credential ({e})"))?;
        let _ = tokio::time::timeout(self.bound, client.drain()).await;
        Ok(BrokerAccepted::of(cred))
    }
}

/// One file's result of [`remint_daemon_creds`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemintOutcome {
    /// Written atomically; the broker accepted it (with a preflight) or its `iss` matched.
    Written { identity: String, exp: Option<i64> },
    /// Nothing to do (`"no-auth"`: no signer in the store).
    Skipped(String),
    /// Refused; the last good credential is untouched.
    Refused(String),
}

/// The per-file results (the caller must inspect them: a completed call is not a renewal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemintReport {
    pub files: Vec<(String, RemintOutcome)>,
}

impl RemintReport {
    pub fn all_written(&self) -> bool {
        self.files
            .iter()
            .all(|(_, o)| matches!(o, RemintOutcome::Written { .. }))
    }
    pub fn outcome(&self, key_suffix: &str) -> Option<&RemintOutcome> {
        self.files
            .iter()
            .find(|(k, _)| k.ends_with(key_suffix))
            .map(|(_, o)| o)
    }
}

/// The signer's data-account file (`auth/account.<key>.json`).
#[derive(serde::Deserialize)]
struct AccountSigner {
    space: String,
    account_seed: String,
}

/// Re-signs the daemon's standing credentials (`delivery`, `membership-rw`) for `space` with the
/// default standing lifetime. See [`remint_daemon_creds_for`].
pub async fn remint_daemon_creds(
    root: &Path,
    space: &Space,
    store: Option<&dyn SecretStore>,
    preflight: Option<&Preflight>,
) -> RemintReport {
    remint_daemon_creds_for(
        root,
        space,
        store,
        preflight,
        crate::provision::authority::STANDING_TTL,
    )
    .await
}

/// The renewal owner. Reads the signer through the same store it writes (`store`, else the
/// workspace store of `root`); refuses a signer of another space; re-signs each credential's
/// own nkey; with a `preflight` proves each candidate before overwriting the last good one,
/// without one permits the overwrite only when the candidate's `iss` matches the current
/// credential's. Never throws: every file gets an outcome.
pub async fn remint_daemon_creds_for(
    root: &Path,
    space: &Space,
    store: Option<&dyn SecretStore>,
    preflight: Option<&Preflight>,
    lifetime: Duration,
) -> RemintReport {
    let workspace = FsStore::new(root);
    let store: &dyn SecretStore = match store {
        Some(s) => s,
        None => &workspace,
    };
    let keys = [
        (delivery_creds_key(space), Profile::Delivery),
        (membership_rw_creds_key(space), Profile::MembershipRw),
    ];
    let all = |outcome: RemintOutcome| RemintReport {
        files: keys
            .iter()
            .map(|(k, _)| (k.clone(), outcome.clone()))
            .collect(),
    };
    let signer = match store.get(&account_signer_key(space)) {
        Ok(Some(raw)) => raw,
        Ok(None) => return all(RemintOutcome::Skipped("no-auth".into())),
        Err(e) => return all(RemintOutcome::Refused(format!("the signer: {e}"))),
    };
    let signer: AccountSigner = match serde_json::from_str(&signer) {
        Ok(s) => s,
        Err(e) => {
            return all(RemintOutcome::Refused(format!(
                "{} is not a signer account file ({e})",
                store.locate(&account_signer_key(space))
            )))
        }
    };
    if signer.space != space.as_str() {
        return all(RemintOutcome::Refused(format!(
            "the store's signer holds space {:?}, not {:?}; it cannot overwrite this space's credentials",
            signer.space,
            space.as_str()
        )));
    }
    let account = match nkeys::KeyPair::from_seed(&signer.account_seed) {
        Ok(kp) if kp.key_pair_type() == nkeys::KeyPairType::Account => kp,
        _ => {
            return all(RemintOutcome::Refused(
                "the signer's account seed is not an account seed".into(),
            ))
        }
    };
    let names = SpaceNames::new(space);
    let mut files = Vec::new();
    for (key, profile) in keys {
        let outcome =
            remint_one(store, &key, &profile, &account, &names, preflight, lifetime).await;
        files.push((key, outcome));
    }
    RemintReport { files }
}

async fn remint_one(
    store: &dyn SecretStore,
    key: &str,
    profile: &Profile,
    account: &nkeys::KeyPair,
    names: &SpaceNames,
    preflight: Option<&Preflight>,
    lifetime: Duration,
) -> RemintOutcome {
    let where_ = store.locate(key);
    let current = match store.get(key) {
        Ok(Some(raw)) => match Credential::parse(&raw) {
            Ok(c) => Some(c),
            Err(e) => {
                return RemintOutcome::Refused(format!(
                    "{where_} holds no usable credential to re-sign ({})",
                    e.detail()
                ))
            }
        },
        Ok(None) => None,
        Err(e) => return RemintOutcome::Refused(e.to_string()),
    };
    let user = match &current {
        Some(c) => match c.key_pair() {
            Ok(kp) => kp,
            Err(e) => return RemintOutcome::Refused(e.to_string()),
        },
        None => nkeys::KeyPair::new_user(),
    };
    let spec = UserClaimsSpec::new(profile.name())
        .permissions(profile.permissions(names, &user.public_key()))
        .expires_in(Some(lifetime));
    let candidate = match encode_user(account, &user.public_key(), &spec)
        .map_err(|e| e.to_string())
        .and_then(|jwt| {
            let seed = user.seed().map_err(|e| e.to_string())?;
            Credential::new(jwt, seed).map_err(|e| e.to_string())
        }) {
        Ok(c) => c,
        Err(e) => return RemintOutcome::Refused(format!("signing failed: {e}")),
    };
    match preflight {
        Some(p) => {
            if let Err(e) = p.prove(&candidate).await {
                return RemintOutcome::Refused(format!("{e}; {where_} keeps the last good one"));
            }
        }
        None => {
            if let Some(cur) = &current {
                let (Ok(a), Ok(b)) = (cur.claims(), candidate.claims()) else {
                    return RemintOutcome::Refused("unreadable JWT claims".into());
                };
                if a.iss != b.iss {
                    return RemintOutcome::Refused(format!(
                        "offline re-sign refused: the candidate's account signing key (iss {}) is not the current credential's ({}); without a broker preflight only a continuous re-sign may overwrite {where_}",
                        b.iss, a.iss
                    ));
                }
            }
        }
    }
    if let Err(e) = store.put(key, &candidate.to_creds_text()) {
        return RemintOutcome::Refused(format!("writing {where_}: {e}"));
    }
    let acc = BrokerAccepted::of(&candidate);
    RemintOutcome::Written {
        identity: acc.identity,
        exp: acc.exp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::{MeshAuthority, MintOptions};
    use crate::store::MemoryStore;

    fn demo() -> Space {
        Space::parse("demo").unwrap()
    }
    fn signer_store(a: &MeshAuthority, s: &Space) -> (tempfile::TempDir, MemoryStore) {
        let dir = tempfile::tempdir().unwrap();
        a.save(dir.path()).unwrap();
        let store = MemoryStore::new("mem:test");
        let name = format!("account.{}.json", s.key());
        let raw = std::fs::read_to_string(dir.path().join(&name)).unwrap();
        store.put(&format!("auth/{name}"), &raw).unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn no_signer_is_skipped_no_auth() {
        let store = MemoryStore::new("mem:x");
        let r = remint_daemon_creds(Path::new("/nonexistent"), &demo(), Some(&store), None).await;
        assert_eq!(r.files.len(), 2);
        assert!(r
            .files
            .iter()
            .all(|(_, o)| *o == RemintOutcome::Skipped("no-auth".into())));
    }

    #[tokio::test]
    async fn offline_resign_keeps_the_nkey_and_needs_the_same_iss() {
        let mut a = MeshAuthority::new();
        a.add_space(&demo());
        let (_dir, store) = signer_store(&a, &demo());
        let first = a
            .mint(&demo(), &Profile::Delivery, MintOptions::new())
            .unwrap();
        store
            .put(&delivery_creds_key(&demo()), &first.to_creds_text())
            .unwrap();
        let r = remint_daemon_creds_for(
            Path::new("/x"),
            &demo(),
            Some(&store),
            None,
            Duration::from_secs(60),
        )
        .await;
        assert!(r.all_written(), "{r:?}");
        let now =
            Credential::parse(&store.get(&delivery_creds_key(&demo())).unwrap().unwrap()).unwrap();
        assert_eq!(now.public_key().unwrap(), first.public_key().unwrap());
        assert_ne!(now, first);
        // A store whose current credential comes from another account chain: refused offline.
        let mut rogue = MeshAuthority::new();
        rogue.add_space(&demo());
        let foreign = rogue
            .mint(&demo(), &Profile::Delivery, MintOptions::new())
            .unwrap();
        store
            .put(&delivery_creds_key(&demo()), &foreign.to_creds_text())
            .unwrap();
        let r = remint_daemon_creds(Path::new("/x"), &demo(), Some(&store), None).await;
        match r.outcome("delivery.creds") {
            Some(RemintOutcome::Refused(e)) => assert!(e.contains("offline re-sign refused")),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            store.get(&delivery_creds_key(&demo())).unwrap().unwrap(),
            foreign.to_creds_text()
        );
    }

    #[tokio::test]
    async fn a_signer_of_another_space_is_refused() {
        let other = Space::parse("other").unwrap();
        let mut a = MeshAuthority::new();
        a.add_space(&other);
        let (dir, store) = signer_store(&a, &other);
        // The other space's signer file placed under this space's key.
        let raw = std::fs::read_to_string(dir.path().join(format!("account.{}.json", other.key())))
            .unwrap();
        store.put(&account_signer_key(&demo()), &raw).unwrap();
        let r = remint_daemon_creds(Path::new("/x"), &demo(), Some(&store), None).await;
        assert!(r.files.iter().all(|(_, o)| matches!(
            o,
            RemintOutcome::Refused(e) if e.contains("holds space \"other\"")
        )));
    }
}
