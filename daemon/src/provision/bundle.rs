//! The pre-split signer bundle `auth/auth.json`: migration input for the renewal owner.
//!
//! Why: a root the reference set up before its signer was split keeps one bundle (its
//! `SpaceAuth`: `space`, `operator {seed, jwt}`, `account {pub, seed, jwt, signingSeed,
//! signingPub}`, `sys {pub, jwt, signingSeed?}`, the system seed usually stripped at rest), and a
//! container may mount only that bundle. The renewal owner reads it when the split files are
//! absent, checks that its chain is self-consistent and names the space, and writes the split
//! files from it (each atomically through the store; the bundle is kept, never rewritten). The
//! bundle's users are signed by its account signing key, so that key travels into the split
//! account file: a re-sign stays under the same `iss`.
//!
//! Refusals name the store key and the expected space only, never a value read from the bundle
//! (a misconfigured store's bytes are not echoed into a log).

use nkeys::{KeyPair, KeyPairType};
use serde::Deserialize;

use super::authority::{account_file_text, broker_file_text};
use crate::base::{
    account_signer_key, verify_signature, SecretStore, StoreError, BROKER_SIGNER_KEY,
};
use crate::wire::Space;

/// The store key of the pre-split bundle.
pub const SIGNER_BUNDLE_KEY: &str = "auth/auth.json";

#[derive(Deserialize)]
struct Bundle {
    space: String,
    operator: OperatorPart,
    account: AccountPart,
    sys: SysPart,
}

#[derive(Deserialize)]
struct OperatorPart {
    seed: String,
    jwt: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AccountPart {
    #[serde(rename = "pub")]
    public: String,
    seed: String,
    jwt: String,
    signing_seed: String,
    signing_pub: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SysPart {
    #[serde(rename = "pub")]
    public: String,
    jwt: String,
    #[serde(default)]
    signing_seed: Option<String>,
}

/// A bundle that passed its checks, as the renewal owner signs with it.
pub(crate) struct BundleSigner {
    /// The account identity key (`account.seed`).
    pub account: KeyPair,
    /// The account signing key the account JWT trusts (`account.signingSeed`).
    pub signing: KeyPair,
    account_seed: String,
    signing_seed: String,
    operator_name: String,
    operator_seed: String,
    system_seed: Option<String>,
}

/// Why the bundle cannot be used: its kind and the refusal's text (`Display`), which names the
/// store key, the expected space and the check, never a value read from the bundle. So the only
/// cause kept (`source()`) is the store's; a parser's or a key's error could quote the bundle.
#[derive(Debug)]
pub struct BundleError {
    kind: BundleErrorKind,
    text: String,
    source: Option<StoreError>,
}

/// Which check the bundle failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BundleErrorKind {
    /// The store could not be read at the bundle's key.
    Store,
    /// The text is not the bundle's JSON shape.
    Shape,
    /// It names another space.
    Space,
    /// A seed is not a valid seed of its type.
    Seed,
    /// A seed does not match its public key, or the two accounts share an nkey.
    Mismatch,
    /// A JWT is not signed, or its subject, issuer, type, name or signing keys are not the
    /// bundle's.
    Jwt,
}

impl BundleError {
    fn new(kind: BundleErrorKind, text: impl Into<String>) -> BundleError {
        BundleError {
            kind,
            text: text.into(),
            source: None,
        }
    }
    pub fn kind(&self) -> BundleErrorKind {
        self.kind
    }
}

impl std::fmt::Display for BundleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for BundleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

fn seed_of(seed: &str, want: KeyPairType, field: &str) -> Result<KeyPair, BundleError> {
    match KeyPair::from_seed(seed) {
        Ok(kp) if kp.key_pair_type() == want => Ok(kp),
        _ => Err(BundleError::new(
            BundleErrorKind::Seed,
            format!("{field} is not a valid {want:?} seed"),
        )),
    }
}

/// Reads `auth/auth.json` from `store` for `space`: `Ok(None)` when there is none; `Err` names
/// the check it failed.
pub(crate) fn read_bundle(
    store: &dyn SecretStore,
    space: &Space,
) -> Result<Option<BundleSigner>, BundleError> {
    let where_ = store.locate(SIGNER_BUNDLE_KEY);
    let raw = match store.get(SIGNER_BUNDLE_KEY) {
        Ok(Some(raw)) => raw,
        Ok(None) => return Ok(None),
        Err(e) => {
            return Err(BundleError {
                kind: BundleErrorKind::Store,
                text: format!("the signer bundle: {e}"),
                source: Some(e),
            })
        }
    };
    let failed = |e: BundleError| BundleError {
        text: format!(
            "the signer bundle {where_} failed its checks for space {space:?}: {}",
            e.text
        ),
        ..e
    };
    let bundle: Bundle = serde_json::from_str(&raw).map_err(|e| {
        failed(BundleError::new(
            BundleErrorKind::Shape,
            format!(
                "it is not the bundle's JSON shape (line {}, column {})",
                e.line(),
                e.column()
            ),
        ))
    })?;
    check(&bundle, space).map(Some).map_err(failed)
}

fn check(b: &Bundle, space: &Space) -> Result<BundleSigner, BundleError> {
    use BundleErrorKind as K;
    let refuse = |kind, text: &str| Err(BundleError::new(kind, text));
    if b.space != space.as_str() {
        return refuse(
            K::Space,
            "its space is another one; it cannot sign this space's credentials",
        );
    }
    let operator = seed_of(&b.operator.seed, KeyPairType::Operator, "operator.seed")?;
    let account = seed_of(&b.account.seed, KeyPairType::Account, "account.seed")?;
    let signing = seed_of(
        &b.account.signing_seed,
        KeyPairType::Account,
        "account.signingSeed",
    )?;
    if account.public_key() != b.account.public {
        return refuse(K::Mismatch, "account.seed does not match account.pub");
    }
    if signing.public_key() != b.account.signing_pub {
        return refuse(
            K::Mismatch,
            "account.signingSeed does not match account.signingPub",
        );
    }
    if b.sys.public == b.account.public || b.sys.public == b.account.signing_pub {
        return refuse(
            K::Mismatch,
            "the data account and the system account share an nkey",
        );
    }
    let system = match &b.sys.signing_seed {
        Some(seed) => {
            let kp = seed_of(seed, KeyPairType::Account, "sys.signingSeed")?;
            if kp.public_key() != b.sys.public {
                return refuse(K::Mismatch, "sys.signingSeed does not match sys.pub");
            }
            Some(seed.clone())
        }
        None => None,
    };
    let op = verify_signature(&b.operator.jwt)
        .map_err(|_| BundleError::new(K::Jwt, "operator.jwt is not a signed NATS JWT"))?;
    if op.claim_type() != "operator"
        || op.sub != operator.public_key()
        || op.iss != operator.public_key()
    {
        return refuse(
            K::Jwt,
            "operator.jwt's subject, issuer or type is not operator.seed's",
        );
    }
    if op.nats["system_account"].as_str() != Some(b.sys.public.as_str()) {
        return refuse(
            K::Jwt,
            "operator.jwt names another system account than sys.pub",
        );
    }
    let acc = verify_signature(&b.account.jwt)
        .map_err(|_| BundleError::new(K::Jwt, "account.jwt is not a signed NATS JWT"))?;
    if acc.claim_type() != "account"
        || acc.sub != b.account.public
        || acc.iss != operator.public_key()
    {
        return refuse(
            K::Jwt,
            "account.jwt's subject, issuer or type is not the bundle's operator and account",
        );
    }
    if acc.name != space.as_str() {
        return refuse(K::Jwt, "account.jwt names another space");
    }
    let trusted = acc.nats["signing_keys"].as_array().is_some_and(|keys| {
        keys.iter()
            .any(|k| k.as_str() == Some(b.account.signing_pub.as_str()))
    });
    if !trusted {
        return refuse(
            K::Jwt,
            "account.jwt does not trust account.signingPub as a signing key",
        );
    }
    let sys = verify_signature(&b.sys.jwt)
        .map_err(|_| BundleError::new(K::Jwt, "sys.jwt is not a signed NATS JWT"))?;
    if sys.claim_type() != "account" || sys.sub != b.sys.public || sys.iss != operator.public_key()
    {
        return refuse(
            K::Jwt,
            "sys.jwt's subject, issuer or type is not the bundle's system account",
        );
    }
    Ok(BundleSigner {
        account,
        signing,
        account_seed: b.account.seed.clone(),
        signing_seed: b.account.signing_seed.clone(),
        operator_name: op.name,
        operator_seed: b.operator.seed.clone(),
        system_seed: system,
    })
}

/// Writes the split files from a checked bundle into `store` (each atomically, only where it is
/// absent; the bundle is left as it is) and says what it did, one note per file. A store that
/// cannot be written (a read-only signer mount) is noted, and the caller signs from the bundle.
pub(crate) fn migrate(store: &dyn SecretStore, space: &Space, b: &BundleSigner) -> Vec<String> {
    let bundle = store.locate(SIGNER_BUNDLE_KEY);
    let mut notes = Vec::new();
    let account_key = account_signer_key(space);
    let account = account_file_text(space, &b.account_seed, Some(&b.signing_seed))
        .map_err(|e| e.to_string())
        .and_then(|text| store.put(&account_key, &text).map_err(|e| e.to_string()));
    notes.push(match account {
        Ok(()) => format!(
            "migrated the signer bundle {bundle} into {} (the bundle is kept)",
            store.locate(&account_key)
        ),
        Err(e) => format!(
            "could not write {} from the signer bundle ({e}); re-signing from the bundle itself",
            store.locate(&account_key)
        ),
    });
    let broker_present = matches!(store.get(BROKER_SIGNER_KEY), Ok(Some(_)));
    match (&b.system_seed, broker_present) {
        (_, true) => {}
        (None, false) => notes.push(format!(
            "{} not written: the bundle holds no system account seed (stripped at rest)",
            store.locate(BROKER_SIGNER_KEY)
        )),
        (Some(system), false) => {
            let broker = broker_file_text(&b.operator_name, &b.operator_seed, system)
                .map_err(|e| e.to_string())
                .and_then(|text| {
                    store
                        .put(BROKER_SIGNER_KEY, &text)
                        .map_err(|e| e.to_string())
                });
            notes.push(match broker {
                Ok(()) => format!(
                    "migrated the bundle's operator and system account into {}",
                    store.locate(BROKER_SIGNER_KEY)
                ),
                Err(e) => format!("could not write {} ({e})", store.locate(BROKER_SIGNER_KEY)),
            });
        }
    }
    notes
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::base::MemoryStore;
    use crate::provision::jwt::{encode_account_with_signing_keys, encode_operator};
    use serde_json::json;

    /// A bundle in the reference's shape for `space`, its system seed stripped unless `full`.
    pub(crate) fn reference_bundle(space: &Space, full: bool) -> (String, KeyPair) {
        let operator = KeyPair::new_operator();
        let account = KeyPair::new_account();
        let signing = KeyPair::new_account();
        let sys = KeyPair::new_account();
        let op_jwt = encode_operator(
            &operator,
            &format!("cotal-{}", space.as_str()),
            &sys.public_key(),
        )
        .unwrap();
        let acc_jwt = encode_account_with_signing_keys(
            &operator,
            &account.public_key(),
            space.as_str(),
            true,
            &[signing.public_key()],
        )
        .unwrap();
        let sys_jwt =
            encode_account_with_signing_keys(&operator, &sys.public_key(), "SYS", false, &[])
                .unwrap();
        let mut sys_part = json!({"pub": sys.public_key(), "jwt": sys_jwt});
        if full {
            sys_part["signingSeed"] = json!(sys.seed().unwrap());
        }
        let bundle = json!({
            "space": space.as_str(),
            "operator": {"seed": operator.seed().unwrap(), "jwt": op_jwt},
            "account": {
                "pub": account.public_key(),
                "seed": account.seed().unwrap(),
                "jwt": acc_jwt,
                "signingSeed": signing.seed().unwrap(),
                "signingPub": signing.public_key(),
            },
            "sys": sys_part,
        });
        (serde_json::to_string_pretty(&bundle).unwrap(), signing)
    }

    fn demo() -> Space {
        Space::parse("demo").unwrap()
    }

    /// Mutation seen failing: the `signing_keys` check removed (a bundle whose account JWT does
    /// not trust its signing key is accepted).
    #[test]
    fn a_bundle_is_checked_before_it_is_trusted() {
        let store = MemoryStore::new("mem:b");
        assert!(read_bundle(&store, &demo()).unwrap().is_none());
        let (text, signing) = reference_bundle(&demo(), false);
        store.put(SIGNER_BUNDLE_KEY, &text).unwrap();
        let signer = read_bundle(&store, &demo()).unwrap().unwrap();
        assert_eq!(signer.signing.public_key(), signing.public_key());
        // Another space's bundle, relabelled or not, is refused without echoing its bytes.
        let other = Space::parse("other").unwrap();
        let e = read_bundle(&store, &other).err().unwrap();
        assert_eq!(e.kind(), BundleErrorKind::Space, "{e}");
        assert!(e.to_string().contains("its space is another one"), "{e}");
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["space"] = json!("other");
        store.put(SIGNER_BUNDLE_KEY, &v.to_string()).unwrap();
        let e = read_bundle(&store, &other).err().unwrap();
        assert_eq!(e.kind(), BundleErrorKind::Jwt, "{e}");
        assert!(
            e.to_string().contains("account.jwt names another space"),
            "{e}"
        );
        // An account JWT that does not trust the signing key.
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let (foreign, _) = reference_bundle(&demo(), false);
        let foreign: serde_json::Value = serde_json::from_str(&foreign).unwrap();
        v["account"]["signingSeed"] = foreign["account"]["signingSeed"].clone();
        v["account"]["signingPub"] = foreign["account"]["signingPub"].clone();
        store.put(SIGNER_BUNDLE_KEY, &v.to_string()).unwrap();
        let e = read_bundle(&store, &demo()).err().unwrap();
        assert_eq!(e.kind(), BundleErrorKind::Jwt, "{e}");
        assert!(
            e.to_string().contains("does not trust account.signingPub"),
            "{e}"
        );
        // A seed is never echoed.
        store.put(SIGNER_BUNDLE_KEY, "{\"space\": 1}").unwrap();
        let e = read_bundle(&store, &demo()).err().unwrap();
        assert_eq!(e.kind(), BundleErrorKind::Shape, "{e}");
        assert!(e.to_string().contains("not the bundle's JSON shape"), "{e}");
        assert!(
            std::error::Error::source(&e).is_none(),
            "no parser's words: {e:?}"
        );
    }

    /// Mutation seen failing: `migrate` overwriting an existing `broker.json`.
    #[test]
    fn migration_writes_the_split_files_once_and_keeps_the_bundle() {
        let store = MemoryStore::new("mem:m");
        let (text, _) = reference_bundle(&demo(), true);
        store.put(SIGNER_BUNDLE_KEY, &text).unwrap();
        let signer = read_bundle(&store, &demo()).unwrap().unwrap();
        let notes = migrate(&store, &demo(), &signer);
        assert_eq!(notes.len(), 2, "{notes:?}");
        let account: serde_json::Value =
            serde_json::from_str(&store.get(&account_signer_key(&demo())).unwrap().unwrap())
                .unwrap();
        assert_eq!(account["space"], "demo");
        assert_eq!(
            account["signing_seed"],
            json!(signer.signing.seed().unwrap())
        );
        let broker: serde_json::Value =
            serde_json::from_str(&store.get(BROKER_SIGNER_KEY).unwrap().unwrap()).unwrap();
        assert_eq!(broker["operator_name"], "cotal-demo");
        assert_eq!(store.get(SIGNER_BUNDLE_KEY).unwrap().unwrap(), text);
        // A broker.json already there is left alone; a stripped bundle cannot write one.
        store.put(BROKER_SIGNER_KEY, "kept").unwrap();
        migrate(&store, &demo(), &signer);
        assert_eq!(store.get(BROKER_SIGNER_KEY).unwrap().unwrap(), "kept");
        let stripped = MemoryStore::new("mem:s");
        let (text, _) = reference_bundle(&demo(), false);
        stripped.put(SIGNER_BUNDLE_KEY, &text).unwrap();
        let signer = read_bundle(&stripped, &demo()).unwrap().unwrap();
        let notes = migrate(&stripped, &demo(), &signer);
        assert!(notes[1].contains("stripped at rest"), "{notes:?}");
        assert!(stripped.get(BROKER_SIGNER_KEY).unwrap().is_none());
    }
}
