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

use super::bundle::{migrate, read_bundle, BundleError, SIGNER_BUNDLE_KEY};
use crate::base::{
    account_signer_key, delivery_creds_key, membership_rw_creds_key, ClientError, ClientErrorKind,
    Credential, FsStore, SecretStore,
};
use crate::provision::jwt::{encode_user, UserClaimsSpec};
use crate::provision::Profile;
use crate::wire::{Space, SpaceNames};

/// Bound on a disposable preflight connection.
pub const PREFLIGHT_BOUND: Duration = crate::base::BROKER_BOUND;

/// What the broker accepted: the user nkey and the JWT's expiry (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAccepted {
    pub identity: String,
    pub exp: Option<i64>,
}

impl BrokerAccepted {
    /// The reply shape: `{identity, exp}`.
    pub fn reply(&self) -> crate::wire::BrokerAccepted {
        crate::wire::BrokerAccepted {
            identity: self.identity.clone(),
            exp: self.exp,
        }
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
    pub async fn prove(&self, cred: &Credential) -> Result<BrokerAccepted, PreflightError> {
        let client = crate::base::connect_with_credential(
            &self.server,
            self.tls_ca.as_deref(),
            cred,
            "cotal-delivery-preflight",
            self.bound,
        )
        .await
        .map_err(|source| PreflightError { source })?;
        let _ = tokio::time::timeout(self.bound, client.drain()).await;
        Ok(BrokerAccepted::of(cred))
    }
}

/// Why a preflight did not prove a candidate: `kind()` is the client's (the candidate has no
/// usable nkey, or the broker refused the connect or did not answer it within the bound);
/// `Display` the text the re-read's and the remint's refusals quote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreflightError {
    source: ClientError,
}

impl PreflightError {
    pub fn kind(&self) -> ClientErrorKind {
        self.source.kind()
    }
}

impl std::fmt::Display for PreflightError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the broker did not accept the candidate credential ({})",
            self.source
        )
    }
}

impl std::error::Error for PreflightError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Why the store's signer could not be read: its kind, the text a refused remint quotes
/// (`Display`), and the store's, the parser's or the bundle's error behind it (`source()`).
#[derive(Debug)]
pub struct SignerError {
    kind: SignerErrorKind,
    text: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// What is wrong with the store's signer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignerErrorKind {
    /// The store could not be read at the signer's key.
    Store,
    /// The account file is not a signer account file, or a seed in it is not an account seed.
    Malformed,
    /// The signer is another space's.
    OtherSpace,
    /// The pre-split bundle was refused (its own kind is the source's).
    Bundle,
}

impl SignerError {
    fn new(kind: SignerErrorKind, text: impl Into<String>) -> SignerError {
        SignerError {
            kind,
            text: text.into(),
            source: None,
        }
    }
    /// The same error, keeping `source` as its cause.
    fn source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> SignerError {
        self.source = Some(Box::new(source));
        self
    }
    pub fn kind(&self) -> SignerErrorKind {
        self.kind
    }
}

impl std::fmt::Display for SignerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for SignerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<BundleError> for SignerError {
    fn from(e: BundleError) -> SignerError {
        SignerError::new(SignerErrorKind::Bundle, e.to_string()).source(e)
    }
}

/// Why a signer could not sign a credential (one cause, so no kind: the JWT encoder's, the
/// user key's or the credential's own error, which `Display` says as it reads).
#[derive(Debug)]
pub struct SignError {
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl SignError {
    fn of(source: impl std::error::Error + Send + Sync + 'static) -> SignError {
        SignError {
            source: Box::new(source),
        }
    }
}

impl std::fmt::Display for SignError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.source.fmt(f)
    }
}

impl std::error::Error for SignError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
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
    /// Where the signer was read (`auth/account.<key>.json`, or the bundle `auth/auth.json`).
    pub signer: Option<String>,
    /// What the migration of a pre-split signer bundle did, one line per file.
    pub notes: Vec<String>,
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
    #[serde(default)]
    signing_seed: Option<String>,
}

/// A space's data-account signer as the renewal owner reads it from its store: the account key
/// and, when the account JWT trusts one, its signing key.
pub struct SpaceSigner {
    account: nkeys::KeyPair,
    signing: Option<nkeys::KeyPair>,
    /// Where it was read.
    pub source: String,
    /// What a migration of the pre-split bundle did.
    pub notes: Vec<String>,
}

impl SpaceSigner {
    /// Reads the signer of `space` from `store`: the split account file, else the pre-split
    /// bundle (checked, then migrated into the split files). `Ok(None)`: the store holds no
    /// signer. A signer of another space is refused.
    pub fn read(
        store: &dyn SecretStore,
        space: &Space,
    ) -> Result<Option<SpaceSigner>, SignerError> {
        use SignerErrorKind as K;
        let key = account_signer_key(space);
        let raw = match store.get(&key) {
            Ok(Some(raw)) => raw,
            Ok(None) => return SpaceSigner::from_bundle(store, space),
            Err(e) => return Err(SignerError::new(K::Store, format!("the signer: {e}")).source(e)),
        };
        let file: AccountSigner = serde_json::from_str(&raw).map_err(|e| {
            let text = format!("{} is not a signer account file ({e})", store.locate(&key));
            SignerError::new(K::Malformed, text).source(e)
        })?;
        if file.space != space.as_str() {
            return Err(SignerError::new(
                K::OtherSpace,
                format!(
                    "the store's signer holds space {:?}, not {:?}; it cannot overwrite this space's credentials",
                    file.space,
                    space.as_str()
                ),
            ));
        }
        let account_seed = |seed: &str, which: &str| match nkeys::KeyPair::from_seed(seed) {
            Ok(kp) if kp.key_pair_type() == nkeys::KeyPairType::Account => Ok(kp),
            _ => Err(SignerError::new(
                K::Malformed,
                format!("the signer's {which} seed is not an account seed"),
            )),
        };
        let account = account_seed(&file.account_seed, "account")?;
        let signing = match &file.signing_seed {
            Some(seed) => Some(account_seed(seed, "signing")?),
            None => None,
        };
        Ok(Some(SpaceSigner {
            account,
            signing,
            source: store.locate(&key),
            notes: Vec::new(),
        }))
    }

    fn from_bundle(
        store: &dyn SecretStore,
        space: &Space,
    ) -> Result<Option<SpaceSigner>, SignerError> {
        let Some(bundle) = read_bundle(store, space)? else {
            return Ok(None);
        };
        let notes = migrate(store, space, &bundle);
        Ok(Some(SpaceSigner {
            account: bundle.account,
            signing: Some(bundle.signing),
            source: store.locate(SIGNER_BUNDLE_KEY),
            notes,
        }))
    }

    /// The key that signs a re-sign of `current`: the one that issued it (a continuous
    /// re-sign), else the account's signing key, else the account key itself; with the
    /// `issuer_account` a signing key needs.
    fn key_for(&self, current: Option<&Credential>) -> (&nkeys::KeyPair, Option<String>) {
        let iss = current.and_then(|c| c.claims().ok()).map(|c| c.iss);
        if iss == Some(self.account.public_key()) {
            return (&self.account, None);
        }
        match &self.signing {
            Some(key) => (key, Some(self.account.public_key())),
            None => (&self.account, None),
        }
    }

    /// Mints a credential of `profile` (a fresh nkey) with this signer, e.g. the supervisor a
    /// renewal owner asks the daemon to adopt with.
    pub fn mint(
        &self,
        space: &Space,
        profile: &Profile,
        lifetime: Duration,
    ) -> Result<Credential, SignError> {
        let user = nkeys::KeyPair::new_user();
        self.sign(space, profile, &user, None, lifetime)
    }

    fn sign(
        &self,
        space: &Space,
        profile: &Profile,
        user: &nkeys::KeyPair,
        current: Option<&Credential>,
        lifetime: Duration,
    ) -> Result<Credential, SignError> {
        let (key, issuer_account) = self.key_for(current);
        let mut spec = UserClaimsSpec::new(profile.name())
            .permissions(profile.permissions(&SpaceNames::new(space), &user.public_key()))
            .expires_in(Some(lifetime))
            .tags(profile.tags());
        if let Some(acc) = issuer_account {
            spec = spec.issuer_account(acc);
        }
        let jwt = encode_user(key, &user.public_key(), &spec).map_err(SignError::of)?;
        let seed = user.seed().map_err(SignError::of)?;
        Credential::new(jwt, seed).map_err(SignError::of)
    }
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
/// workspace store of `root`): the split account file, else the pre-split bundle, migrated;
/// refuses a signer of another space; re-signs each credential's own nkey; with a `preflight`
/// proves each candidate before overwriting the last good one, without one permits the
/// overwrite only when the candidate's `iss` matches the current credential's. Never throws:
/// every file gets an outcome.
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
        signer: None,
        notes: Vec::new(),
    };
    let signer = match SpaceSigner::read(store, space) {
        Ok(Some(signer)) => signer,
        Ok(None) => return all(RemintOutcome::Skipped("no-auth".into())),
        Err(e) => return all(RemintOutcome::Refused(e.to_string())),
    };
    let mut files = Vec::new();
    for (key, profile) in keys {
        let outcome = remint_one(store, &key, &profile, &signer, space, preflight, lifetime).await;
        files.push((key, outcome));
    }
    RemintReport {
        files,
        signer: Some(signer.source.clone()),
        notes: signer.notes,
    }
}

async fn remint_one(
    store: &dyn SecretStore,
    key: &str,
    profile: &Profile,
    signer: &SpaceSigner,
    space: &Space,
    preflight: Option<&Preflight>,
    lifetime: Duration,
) -> RemintOutcome {
    let where_ = store.locate(key);
    let current = match store.get(key) {
        Ok(Some(raw)) => match Credential::parse(&raw) {
            Ok(c) => c,
            Err(e) => {
                return RemintOutcome::Refused(format!(
                    "{where_} holds no usable credential to re-sign ({})",
                    e.detail()
                ))
            }
        },
        // A renewal keeps an existing nkey (the daemon's inbox grant and lease holder); with
        // nothing there, nothing (not even a broker) proves whose credential a new one would be.
        Ok(None) => {
            return RemintOutcome::Refused(format!(
                "{where_} holds no credential to re-sign (a renewal keeps an existing nkey; `cotal-delivery up` mints the space's credentials)"
            ))
        }
        Err(e) => return RemintOutcome::Refused(e.to_string()),
    };
    let user = match current.key_pair() {
        Ok(kp) => kp,
        Err(e) => return RemintOutcome::Refused(e.to_string()),
    };
    let candidate = match signer.sign(space, profile, &user, Some(&current), lifetime) {
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
            let (Ok(a), Ok(b)) = (current.claims(), candidate.claims()) else {
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
    use crate::base::MemoryStore;
    use crate::provision::{MeshAuthority, MintOptions};

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
        let rw = a
            .mint(&demo(), &Profile::MembershipRw, MintOptions::new())
            .unwrap();
        store
            .put(&membership_rw_creds_key(&demo()), &rw.to_creds_text())
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

    /// A store holding only the pre-split bundle: signer, both current credentials, nothing else.
    fn bundle_store(bundle: &str, current_from: &str) -> MemoryStore {
        let store = MemoryStore::new("mem:bundle");
        // The current credentials, as the bundle's owner minted them (by its signing key).
        let scratch = MemoryStore::new("mem:scratch");
        scratch.put(SIGNER_BUNDLE_KEY, current_from).unwrap();
        let minter = SpaceSigner::read(&scratch, &demo()).unwrap().unwrap();
        for (key, profile) in [
            (delivery_creds_key(&demo()), Profile::Delivery),
            (membership_rw_creds_key(&demo()), Profile::MembershipRw),
        ] {
            let cred = minter
                .mint(&demo(), &profile, Duration::from_secs(600))
                .unwrap();
            store.put(&key, &cred.to_creds_text()).unwrap();
        }
        store.put(SIGNER_BUNDLE_KEY, bundle).unwrap();
        store
    }

    /// The offline repair from a pre-split bundle: read when the split files are absent, signed
    /// by the bundle's account signing key (the current credential's `iss`), so it is
    /// continuous; the split account file is written and the bundle kept. Mutation seen
    /// failing: `SpaceSigner::key_for` always signing with the account identity key (the
    /// candidate's `iss` is the account, not the signing key: refused offline).
    #[tokio::test]
    async fn the_offline_repair_from_a_bundle_is_continuous_and_migrates_it() {
        let (bundle, signing) = crate::provision::bundle::tests::reference_bundle(&demo(), false);
        let store = bundle_store(&bundle, &bundle);
        let before = store.get(&delivery_creds_key(&demo())).unwrap().unwrap();
        let r = remint_daemon_creds_for(
            Path::new("/x"),
            &demo(),
            Some(&store),
            None,
            Duration::from_secs(900),
        )
        .await;
        assert!(r.all_written(), "{r:?}");
        assert!(
            r.signer.as_deref().unwrap().ends_with("auth/auth.json"),
            "{r:?}"
        );
        assert!(r.notes[0].contains("migrated the signer bundle"), "{r:?}");
        let now =
            Credential::parse(&store.get(&delivery_creds_key(&demo())).unwrap().unwrap()).unwrap();
        assert!(now.to_creds_text() != before, "re-signed");
        let claims = now.claims().unwrap();
        assert_eq!(claims.iss, signing.public_key());
        assert!(claims.issuer_account.is_some());
        assert!(store.get(&account_signer_key(&demo())).unwrap().is_some());
        assert_eq!(store.get(SIGNER_BUNDLE_KEY).unwrap().unwrap(), bundle);
        // The next pass reads the split file, and is still continuous.
        let r = remint_daemon_creds_for(
            Path::new("/x"),
            &demo(),
            Some(&store),
            None,
            Duration::from_secs(900),
        )
        .await;
        assert!(r.all_written(), "{r:?}");
        assert!(r.notes.is_empty(), "{r:?}");
    }

    /// A same-label alternate account breaks continuity and is refused offline, whether the
    /// store's signer is a full bundle or a stripped projection (the split account file alone);
    /// the last good credentials are untouched. Mutation seen failing: the `iss` comparison of
    /// the offline branch removed (the alternate re-signs over both).
    #[tokio::test]
    async fn the_offline_repair_refuses_a_same_label_alternate_full_or_stripped() {
        let (good, _) = crate::provision::bundle::tests::reference_bundle(&demo(), true);
        let (alternate, _) = crate::provision::bundle::tests::reference_bundle(&demo(), true);
        // Full: the alternate bundle.
        let full = bundle_store(&alternate, &good);
        // Stripped: the alternate's split account file only.
        let stripped = bundle_store(&alternate, &good);
        let scratch = MemoryStore::new("mem:scratch");
        scratch.put(SIGNER_BUNDLE_KEY, &alternate).unwrap();
        SpaceSigner::read(&scratch, &demo()).unwrap();
        let split = scratch.get(&account_signer_key(&demo())).unwrap().unwrap();
        stripped.put(&account_signer_key(&demo()), &split).unwrap();
        stripped.put(SIGNER_BUNDLE_KEY, "{}").unwrap();
        for store in [&full, &stripped] {
            let before = [
                store.get(&delivery_creds_key(&demo())).unwrap(),
                store.get(&membership_rw_creds_key(&demo())).unwrap(),
            ];
            let r = remint_daemon_creds(Path::new("/x"), &demo(), Some(store), None).await;
            assert!(
                r.files.iter().all(|(_, o)| matches!(
                    o,
                    RemintOutcome::Refused(e) if e.contains("offline re-sign refused")
                )),
                "{r:?}"
            );
            let after = [
                store.get(&delivery_creds_key(&demo())).unwrap(),
                store.get(&membership_rw_creds_key(&demo())).unwrap(),
            ];
            assert_eq!(before, after);
        }
    }

    /// Without a current credential there is nothing to re-sign: nothing is written, with a
    /// preflight or without (a renewal keeps an existing nkey). Mutation seen failing: a fresh
    /// nkey minted for an absent credential (written without any proof offline).
    #[tokio::test]
    async fn without_a_current_credential_nothing_is_written() {
        let mut a = MeshAuthority::new();
        a.add_space(&demo());
        let (_dir, store) = signer_store(&a, &demo());
        let r = remint_daemon_creds(Path::new("/x"), &demo(), Some(&store), None).await;
        assert!(
            r.files.iter().all(|(_, o)| matches!(
                o,
                RemintOutcome::Refused(e) if e.contains("holds no credential to re-sign")
            )),
            "{r:?}"
        );
        assert!(store.get(&delivery_creds_key(&demo())).unwrap().is_none());
    }
}
