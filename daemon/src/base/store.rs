//! Where standing credentials live: the `SecretStore` seam and its identity.
//!
//! Why: renewal only works when the renewal owner writes into the very source the daemon
//! re-reads. The store is therefore one small trait with three sources (the workspace's
//! `.cotal/` on the filesystem, an in-memory store injected by an embedding host, a single
//! `--creds` file), and each source can say *which* store it is. A filesystem store records a
//! random lowercase UUID in its own `.cotal/store.id`, so equal paths on two hosts are still two
//! stores; a symlinked or malformed `store.id` is refused rather than trusted.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde_json::Value;

use super::creds::write_file_atomic;
use crate::wire::{Space, StoreChallenge, StoreIdentityReply};

/// The identity file of a filesystem store, under `.cotal/`.
pub const STORE_ID_FILE: &str = "store.id";
/// The coordinate an injected store declares when it declares no identity of its own.
pub const ENV_SECRET_STORE: &str = "COTAL_SECRET_STORE";

/// File names of a space's credentials, in its `.cotal/space.<key>/` directory and as the last
/// part of their store keys.
pub const DELIVERY_CREDS_FILE: &str = "delivery.creds";
pub const MEMBERSHIP_RW_CREDS_FILE: &str = "membership-rw.creds";
pub const MEMBERSHIP_OBSERVER_CREDS_FILE: &str = "membership-observer.creds";
pub const CONNECTION_EVICTOR_CREDS_FILE: &str = "connection-evictor.creds";
pub const INSPECT_CREDS_FILE: &str = "inspect.creds";

/// `space.<key>/delivery.creds`
pub fn delivery_creds_key(space: &Space) -> String {
    format!("{}/{DELIVERY_CREDS_FILE}", space.segment())
}
/// `space.<key>/membership-rw.creds`
pub fn membership_rw_creds_key(space: &Space) -> String {
    format!("{}/{MEMBERSHIP_RW_CREDS_FILE}", space.segment())
}
/// The signer's operator and system account: `auth/broker.json`.
pub const BROKER_SIGNER_KEY: &str = "auth/broker.json";
/// The signer's data account of `space`: `auth/account.<key>.json`.
pub fn account_signer_key(space: &Space) -> String {
    format!("auth/account.{}.json", space.key())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// Reading or writing the backing medium failed.
    Io,
    /// The key is not a store key (absolute, `..`, or the identity file).
    Key,
    /// The store's identity is missing, a symlink, or malformed.
    Identity,
    /// Two parties name different stores.
    Divergent,
}

/// A refused or failed store operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    kind: StoreErrorKind,
    detail: String,
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, detail: impl Into<String>) -> StoreError {
        StoreError {
            kind,
            detail: detail.into(),
        }
    }
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for StoreError {}

impl From<StoreChallenge> for StoreIdentity {
    fn from(c: StoreChallenge) -> StoreIdentity {
        match c {
            StoreChallenge::Fs { root, store_id } => StoreIdentity::Fs {
                root: PathBuf::from(root),
                store_id,
            },
            StoreChallenge::Injected { coordinate } => StoreIdentity::Injected { coordinate },
        }
    }
}

/// Which store a source is: a filesystem root (with its recorded `store.id`, when it has one)
/// or an injected store's coordinate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreIdentity {
    Fs {
        root: PathBuf,
        store_id: Option<String>,
    },
    Injected {
        coordinate: String,
    },
}

impl StoreIdentity {
    /// The wire shape of `reloadStoreIdentity`: `{kind:"fs", root, storeId?}` or
    /// `{kind:"injected", coordinate}`.
    pub fn reply(&self) -> StoreIdentityReply {
        match self {
            StoreIdentity::Fs { root, store_id } => StoreIdentityReply::Fs {
                root: root.display().to_string(),
                store_id: store_id.clone(),
            },
            StoreIdentity::Injected { coordinate } => StoreIdentityReply::Injected {
                coordinate: coordinate.clone(),
            },
        }
    }

    /// The same shape as a JSON value.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.reply()).unwrap_or(Value::Null)
    }

    /// An identity as a peer writes it (the grammar is the wire's, [`StoreChallenge::parse`]).
    pub fn from_json(v: &Value) -> Result<StoreIdentity, StoreError> {
        StoreChallenge::parse(v)
            .map(StoreIdentity::from)
            .map_err(|e| StoreError::new(StoreErrorKind::Identity, e.text()))
    }

    /// Whether two identities name the same store. Filesystem roots must be equal and so must
    /// their `store.id`s, which both sides must carry: two hosts may use the same root path, so
    /// a path alone (a challenge without `storeId`) never proves one store.
    pub fn same_store(&self, other: &StoreIdentity) -> bool {
        match (self, other) {
            (
                StoreIdentity::Fs {
                    root: a,
                    store_id: ia,
                },
                StoreIdentity::Fs {
                    root: b,
                    store_id: ib,
                },
            ) => a == b && ia.is_some() && ia == ib,
            (
                StoreIdentity::Injected { coordinate: a },
                StoreIdentity::Injected { coordinate: b },
            ) => a == b,
            _ => false,
        }
    }
}

impl fmt::Display for StoreIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreIdentity::Fs {
                root,
                store_id: Some(id),
            } => write!(f, "filesystem store {} (store.id {id})", root.display()),
            StoreIdentity::Fs {
                root,
                store_id: None,
            } => write!(f, "filesystem store {}", root.display()),
            StoreIdentity::Injected { coordinate } => write!(f, "injected store {coordinate}"),
        }
    }
}

/// Refuses a challenge from a store other than `ours`, naming both.
pub fn check_same_store(ours: &StoreIdentity, theirs: &StoreIdentity) -> Result<(), StoreError> {
    if ours.same_store(theirs) {
        return Ok(());
    }
    Err(StoreError::new(
        StoreErrorKind::Divergent,
        format!(
            "delivery: this daemon reloads its credentials from the {ours}, but the challenger writes to the {theirs}; a renewal written there never reaches this daemon. Use one store for both"
        ),
    ))
}

/// A source of secrets. `get` returns the raw value (a `.creds` text, a signer JSON); `put`
/// replaces it atomically, so a reader sees the old value or the whole new one.
pub trait SecretStore: Send + Sync {
    fn get(&self, key: &str) -> Result<Option<String>, StoreError>;
    fn put(&self, key: &str, value: &str) -> Result<(), StoreError>;
    /// The identity of the source this store reads from.
    fn identity(&self) -> Result<StoreIdentity, StoreError>;
    /// Where `key` lives, for messages (a path, or `<coordinate>:<key>`).
    fn locate(&self, key: &str) -> String;
    /// Where `cotal-delivery remint` re-signs into this store, for the lines that tell an
    /// operator what to run; `None` for a store no command writes (an embedder's own store).
    fn remint_target(&self) -> Option<RemintTarget> {
        None
    }
}

/// A store `cotal-delivery remint` writes: a workspace root's `.cotal/` (`--root`) or an injected
/// directory store (`--store`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemintTarget {
    Workspace(PathBuf),
    Dir(PathBuf),
}

impl RemintTarget {
    /// `cotal-delivery remint --space <s> --root <dir>` (or `--store <dir>`).
    pub fn command(&self, space: &Space) -> String {
        match self {
            RemintTarget::Workspace(root) => format!(
                "cotal-delivery remint --space {space} --root {}",
                root.display()
            ),
            RemintTarget::Dir(dir) => format!(
                "cotal-delivery remint --space {space} --store {}",
                dir.display()
            ),
        }
    }
}

fn check_key(key: &str) -> Result<(), StoreError> {
    let bad = key.is_empty()
        || key.starts_with('/')
        || key.split('/').any(|part| part.is_empty() || part == "..")
        || key.rsplit('/').next() == Some(STORE_ID_FILE);
    if bad {
        return Err(StoreError::new(
            StoreErrorKind::Key,
            format!("{key:?} is not a secret key (relative, no \"..\", never the {STORE_ID_FILE} identity file)"),
        ));
    }
    Ok(())
}

/// The workspace's `.cotal/` directory as a store, or (injected, [`FsStore::at_dir`]) any
/// directory holding the same keys directly.
#[derive(Debug, Clone)]
pub struct FsStore {
    root: PathBuf,
    /// Where the keys and `store.id` live: `<root>/.cotal`, or the injected directory itself.
    dir: PathBuf,
    /// A workspace's `.cotal/` ([`FsStore::new`]) rather than an injected directory.
    workspace: bool,
}

impl FsStore {
    pub fn new(root: impl Into<PathBuf>) -> FsStore {
        let root = root.into();
        let dir = root.join(super::files::COTAL_DIR);
        FsStore {
            root,
            dir,
            workspace: true,
        }
    }
    /// A directory store that is no workspace: keys live directly under `dir`, and its identity
    /// is `dir` with the `store.id` recorded there.
    pub fn at_dir(dir: impl Into<PathBuf>) -> FsStore {
        let dir = dir.into();
        FsStore {
            root: dir.clone(),
            dir,
            workspace: false,
        }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    fn cotal_dir(&self) -> PathBuf {
        self.dir.clone()
    }
    pub fn path_of(&self, key: &str) -> Result<PathBuf, StoreError> {
        check_key(key)?;
        Ok(self.cotal_dir().join(key))
    }
    /// The recorded `store.id`, created (atomically, first writer wins) when absent.
    pub fn store_id(&self) -> Result<String, StoreError> {
        read_or_create_store_id(&self.cotal_dir().join(STORE_ID_FILE))
    }
}

impl SecretStore for FsStore {
    fn get(&self, key: &str) -> Result<Option<String>, StoreError> {
        let path = self.path_of(key)?;
        match fs::read_to_string(&path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::new(
                StoreErrorKind::Io,
                format!("cannot read {}: {e}", path.display()),
            )),
        }
    }
    fn put(&self, key: &str, value: &str) -> Result<(), StoreError> {
        let path = self.path_of(key)?;
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| {
                StoreError::new(
                    StoreErrorKind::Io,
                    format!("cannot create {}: {e}", dir.display()),
                )
            })?;
        }
        write_file_atomic(&path, value.as_bytes(), 0o600)
            .map_err(|e| StoreError::new(StoreErrorKind::Io, e.to_string()))
    }
    fn identity(&self) -> Result<StoreIdentity, StoreError> {
        Ok(StoreIdentity::Fs {
            root: self.root.clone(),
            store_id: Some(self.store_id()?),
        })
    }
    fn locate(&self, key: &str) -> String {
        self.cotal_dir().join(key).display().to_string()
    }
    fn remint_target(&self) -> Option<RemintTarget> {
        Some(if self.workspace {
            RemintTarget::Workspace(self.root.clone())
        } else {
            RemintTarget::Dir(self.root.clone())
        })
    }
}

/// Whether `s` is a lowercase hyphenated UUID.
pub fn is_store_id(s: &str) -> bool {
    uuid::Uuid::parse_str(s)
        .map(|u| u.hyphenated().to_string() == s)
        .unwrap_or(false)
}

/// Reads `path` as a store id, refusing a symlink or a malformed value; creates it with a fresh
/// random id when absent (hard-link of a complete temporary file, so two creators never both
/// win and nobody reads a torn id).
pub fn read_or_create_store_id(path: &Path) -> Result<String, StoreError> {
    for _ in 0..2 {
        match fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(StoreError::new(
                    StoreErrorKind::Identity,
                    format!(
                        "{} is a symbolic link; a store identity must be the store's own file",
                        path.display()
                    ),
                ))
            }
            Ok(_) => {
                let text = fs::read_to_string(path).map_err(|e| {
                    StoreError::new(
                        StoreErrorKind::Io,
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                let id = text.trim_end_matches('\n');
                if !is_store_id(id) {
                    return Err(StoreError::new(
                        StoreErrorKind::Identity,
                        format!(
                            "{} does not hold a lowercase UUID; refusing a malformed store identity",
                            path.display()
                        ),
                    ));
                }
                return Ok(id.to_string());
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => create_store_id(path)?,
            Err(e) => {
                return Err(StoreError::new(
                    StoreErrorKind::Io,
                    format!("cannot inspect {}: {e}", path.display()),
                ))
            }
        }
    }
    Err(StoreError::new(
        StoreErrorKind::Identity,
        format!("{} could not be created", path.display()),
    ))
}

fn create_store_id(path: &Path) -> Result<(), StoreError> {
    let io_err = |what: &str, e: io::Error| {
        StoreError::new(
            StoreErrorKind::Io,
            format!("{what} {}: {e}", path.display()),
        )
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(|e| io_err("cannot create the directory of", e))?;
    let tmp = dir.join(format!(
        ".{STORE_ID_FILE}.tmp.{}.{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let id = uuid::Uuid::new_v4().hyphenated().to_string();
    write_file_atomic(&tmp, format!("{id}\n").as_bytes(), 0o600)
        .map_err(|e| StoreError::new(StoreErrorKind::Io, e.to_string()))?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(()),
        // Another creator won: its id is the store's.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_err("cannot create", e)),
    }
}

/// Whether `a` and `b` are one file (same device and inode, links followed); `false` when
/// either cannot be read.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// The first `max_bytes` of a file, as text (lossy).
fn read_head(path: &Path, max_bytes: u64) -> io::Result<String> {
    use std::io::Read;
    let mut head = Vec::new();
    fs::File::open(path)?
        .take(max_bytes)
        .read_to_end(&mut head)?;
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// An in-memory store an embedding host injects. Its identity is the coordinate it declares.
#[derive(Debug, Default)]
pub struct MemoryStore {
    coordinate: String,
    values: Mutex<BTreeMap<String, String>>,
    reads: AtomicU64,
    /// `get` calls per key.
    key_reads: Mutex<BTreeMap<String, u64>>,
}

impl MemoryStore {
    pub fn new(coordinate: impl Into<String>) -> MemoryStore {
        MemoryStore {
            coordinate: coordinate.into(),
            ..MemoryStore::default()
        }
    }
    /// A store whose coordinate is `$COTAL_SECRET_STORE`; refused when that is unset.
    pub fn from_env() -> Result<MemoryStore, StoreError> {
        match std::env::var(ENV_SECRET_STORE) {
            Ok(c) if !c.trim().is_empty() => Ok(MemoryStore::new(c)),
            _ => Err(StoreError::new(
                StoreErrorKind::Identity,
                format!("an injected store declares no identity and {ENV_SECRET_STORE} is unset"),
            )),
        }
    }
    /// How many `get` calls this store has answered (a renewal reads once per attempt).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }
    /// How many `get` calls asked for `key`.
    pub fn reads_of(&self, key: &str) -> u64 {
        self.key_reads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

impl SecretStore for MemoryStore {
    fn get(&self, key: &str) -> Result<Option<String>, StoreError> {
        check_key(key)?;
        self.reads.fetch_add(1, Ordering::SeqCst);
        *self
            .key_reads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(key.to_string())
            .or_insert(0) += 1;
        let values = self
            .values
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(values.get(key).cloned())
    }
    fn put(&self, key: &str, value: &str) -> Result<(), StoreError> {
        check_key(key)?;
        let mut values = self
            .values
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        values.insert(key.to_string(), value.to_string());
        Ok(())
    }
    fn identity(&self) -> Result<StoreIdentity, StoreError> {
        Ok(StoreIdentity::Injected {
            coordinate: self.coordinate.clone(),
        })
    }
    fn locate(&self, key: &str) -> String {
        format!("injected store {}:{key}", self.coordinate)
    }
}

/// A single `--creds` file as the delivery credential's source. It holds nothing else (no
/// signer, no membership credential).
#[derive(Debug, Clone)]
pub struct CredsFileStore {
    path: PathBuf,
    space: Space,
}

impl CredsFileStore {
    /// Refuses a path that names a store identity file under any name: by name, as the same
    /// file (device and inode, through links) as the identity file of the store it would
    /// belong to, or by content (a lone store id is an identity, never a credential).
    pub fn new(path: impl Into<PathBuf>, space: Space) -> Result<CredsFileStore, StoreError> {
        let path = path.into();
        let shown = path.display().to_string();
        let names_identity = |why: String| {
            StoreError::new(
                StoreErrorKind::Key,
                format!("--creds {shown} {why}, not a credential"),
            )
        };
        if path.file_name().and_then(|n| n.to_str()) == Some(STORE_ID_FILE) {
            return Err(names_identity("names the store identity file".into()));
        }
        let store = CredsFileStore { path, space };
        for id_file in store.identity_files() {
            if same_file(&store.path, &id_file) {
                return Err(names_identity(format!(
                    "is the store identity file {} under another name",
                    id_file.display()
                )));
            }
        }
        // Only the first bytes: a store id is 37, a credential far longer.
        if let Ok(text) = read_head(&store.path, 64) {
            if is_store_id(text.trim_end_matches('\n')) {
                return Err(names_identity(
                    "holds a store identity (a lone store id)".into(),
                ));
            }
        }
        Ok(store)
    }
    /// The identity files this file's store could have: its directory's own `store.id`, and
    /// the workspace's `.cotal/store.id` for the canonical path.
    fn identity_files(&self) -> Vec<PathBuf> {
        let mut files = Vec::new();
        if let Some(dir) = self.path.parent() {
            files.push(dir.join(STORE_ID_FILE));
        }
        if let Some(root) = self.canonical_root() {
            files.push(root.join(super::files::COTAL_DIR).join(STORE_ID_FILE));
        }
        files
    }
    /// `<root>` when the path is exactly `<root>/.cotal/space.<key>/delivery.creds`.
    pub fn canonical_root(&self) -> Option<PathBuf> {
        let space_dir = self.path.parent()?;
        let cotal = space_dir.parent()?;
        let canonical = self.path.file_name()?.to_str()? == "delivery.creds"
            && space_dir.file_name()?.to_str()? == self.space.segment()
            && cotal.file_name()?.to_str()? == super::files::COTAL_DIR;
        canonical.then(|| cotal.parent().map(Path::to_path_buf))?
    }
}

impl SecretStore for CredsFileStore {
    fn get(&self, key: &str) -> Result<Option<String>, StoreError> {
        check_key(key)?;
        if key != delivery_creds_key(&self.space) {
            return Ok(None);
        }
        match fs::read_to_string(&self.path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::new(
                StoreErrorKind::Io,
                format!("cannot read {}: {e}", self.path.display()),
            )),
        }
    }
    fn put(&self, key: &str, value: &str) -> Result<(), StoreError> {
        check_key(key)?;
        if key != delivery_creds_key(&self.space) {
            return Err(StoreError::new(
                StoreErrorKind::Key,
                format!(
                    "the --creds file {} holds only the delivery credential, not {key}",
                    self.path.display()
                ),
            ));
        }
        write_file_atomic(&self.path, value.as_bytes(), 0o600)
            .map_err(|e| StoreError::new(StoreErrorKind::Io, e.to_string()))
    }
    /// The workspace root's identity for the canonical path, the file's own directory
    /// otherwise (the source the daemon actually reloads from), with the `store.id` recorded
    /// in that directory: two hosts with the same `--creds` path are two stores.
    fn identity(&self) -> Result<StoreIdentity, StoreError> {
        match self.canonical_root() {
            Some(root) => FsStore::new(root).identity(),
            None => FsStore::at_dir(
                self.path
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from(".")),
            )
            .identity(),
        }
    }
    fn locate(&self, _key: &str) -> String {
        self.path.display().to_string()
    }
    /// Only the canonical path is a workspace's file that `remint` writes.
    fn remint_target(&self) -> Option<RemintTarget> {
        self.canonical_root().map(RemintTarget::Workspace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo() -> Space {
        Space::parse("demo").unwrap()
    }

    #[test]
    fn keys_follow_the_reference_layout() {
        assert_eq!(delivery_creds_key(&demo()), "space.64656d6f/delivery.creds");
        assert_eq!(
            membership_rw_creds_key(&demo()),
            "space.64656d6f/membership-rw.creds"
        );
        assert_eq!(account_signer_key(&demo()), "auth/account.64656d6f.json");
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "store.id",
            "x/store.id",
            "a//b",
        ] {
            assert_eq!(
                check_key(bad).unwrap_err().kind(),
                StoreErrorKind::Key,
                "{bad}"
            );
        }
    }

    #[test]
    fn fs_store_records_a_lowercase_uuid_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = FsStore::new(dir.path());
        let a = s.store_id().unwrap();
        assert!(is_store_id(&a));
        assert_eq!(a, a.to_lowercase());
        assert_eq!(s.store_id().unwrap(), a);
        let other = FsStore::new(tempfile::tempdir().unwrap().path());
        assert_ne!(other.store_id().unwrap(), a);
        s.put("space.64656d6f/delivery.creds", "x").unwrap();
        assert_eq!(
            s.get("space.64656d6f/delivery.creds").unwrap().as_deref(),
            Some("x")
        );
        assert_eq!(s.get("space.64656d6f/none").unwrap(), None);
        assert!(s.put("store.id", "x").is_err());
    }

    /// The same root path is one store only when both sides name the same `store.id`: a
    /// challenge that carries none is refused (another host may use that path). Mutation seen
    /// failing: `same_store` accepting a side without a `store.id` on the root alone (the lenient
    /// `ia.is_none() || ib.is_none() || ia == ib` it had).
    #[test]
    fn a_root_path_without_a_store_id_is_not_the_same_store() {
        let id = "0b1c2d3e-4f50-4617-8899-aabbccddeeff".to_string();
        let ours = StoreIdentity::Fs {
            root: PathBuf::from("/w"),
            store_id: Some(id.clone()),
        };
        let bare = StoreIdentity::Fs {
            root: PathBuf::from("/w"),
            store_id: None,
        };
        assert!(ours.same_store(&ours.clone()));
        assert!(!ours.same_store(&bare), "a bare path is not proof");
        assert!(!bare.same_store(&ours), "either way round");
        assert!(
            !bare.same_store(&bare.clone()),
            "two bare paths prove nothing"
        );
        let e = check_same_store(&ours, &bare).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Divergent);
        assert!(e.to_string().contains(&id), "{e}");
    }

    #[test]
    fn symlinked_or_malformed_store_ids_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cotal = dir.path().join(".cotal");
        fs::create_dir_all(&cotal).unwrap();
        fs::write(cotal.join("store.id"), "NOT-A-UUID\n").unwrap();
        let s = FsStore::new(dir.path());
        assert_eq!(s.identity().unwrap_err().kind(), StoreErrorKind::Identity);
        let upper = uuid::Uuid::new_v4().hyphenated().to_string().to_uppercase();
        fs::write(cotal.join("store.id"), upper).unwrap();
        assert_eq!(s.identity().unwrap_err().kind(), StoreErrorKind::Identity);
        fs::remove_file(cotal.join("store.id")).unwrap();
        let real = dir.path().join("elsewhere");
        fs::write(&real, format!("{}\n", uuid::Uuid::new_v4().hyphenated())).unwrap();
        std::os::unix::fs::symlink(&real, cotal.join("store.id")).unwrap();
        let e = s.identity().unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Identity);
        assert!(e.to_string().contains("symbolic link"));
    }

    #[test]
    fn creds_file_identity_is_the_root_or_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let canonical = dir.path().join(".cotal/space.64656d6f/delivery.creds");
        let s = CredsFileStore::new(&canonical, demo()).unwrap();
        assert_eq!(s.canonical_root().as_deref(), Some(dir.path()));
        match s.identity().unwrap() {
            StoreIdentity::Fs { root, store_id } => {
                assert_eq!(root, dir.path());
                assert!(store_id.is_some());
            }
            other => panic!("{other:?}"),
        }
        let loose = CredsFileStore::new(dir.path().join("keys/d.creds"), demo()).unwrap();
        match loose.identity().unwrap() {
            StoreIdentity::Fs { root, store_id } => {
                assert_eq!(root, dir.path().join("keys"));
                let recorded = fs::read_to_string(dir.path().join("keys/store.id")).unwrap();
                assert_eq!(store_id.as_deref(), Some(recorded.trim_end()));
            }
            other => panic!("{other:?}"),
        }
        assert!(CredsFileStore::new(dir.path().join(".cotal/store.id"), demo()).is_err());
        // Another space's canonical path is not canonical for this one.
        let other = dir.path().join(".cotal/space.6f74686572/delivery.creds");
        assert!(CredsFileStore::new(other, demo())
            .unwrap()
            .canonical_root()
            .is_none());
    }

    #[test]
    fn divergent_stores_are_refused_naming_both() {
        let a = StoreIdentity::Fs {
            root: "/srv/a".into(),
            store_id: Some("11111111-1111-4111-8111-111111111111".into()),
        };
        let b = StoreIdentity::Fs {
            root: "/srv/a".into(),
            store_id: Some("22222222-2222-4222-8222-222222222222".into()),
        };
        let e = check_same_store(&a, &b).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Divergent);
        assert!(e
            .to_string()
            .contains("11111111-1111-4111-8111-111111111111"));
        assert!(e
            .to_string()
            .contains("22222222-2222-4222-8222-222222222222"));
        assert!(check_same_store(&a, &a.clone()).is_ok());
        let inj = StoreIdentity::Injected {
            coordinate: "vault:x".into(),
        };
        assert!(check_same_store(&a, &inj).is_err());
        assert_eq!(StoreIdentity::from_json(&inj.to_json()).unwrap(), inj);
        assert_eq!(StoreIdentity::from_json(&a.to_json()).unwrap(), a);
        let m = MemoryStore::new("vault:x");
        assert_eq!(m.identity().unwrap(), inj);
        m.put("k", "v").unwrap();
        assert_eq!(m.get("k").unwrap().as_deref(), Some("v"));
        assert_eq!(m.reads(), 1);
    }

    /// The identity file is refused under any name: a symlink to it, a hard link to it, a copy
    /// of it, each named like a credential. Mutation seen failing: the `same_file` and content
    /// checks removed from `CredsFileStore::new` (only the name check left: the symlink is
    /// accepted).
    #[test]
    fn the_store_identity_file_is_refused_as_creds_under_any_name() {
        let dir = tempfile::tempdir().unwrap();
        let cotal = dir.path().join(".cotal");
        let id = FsStore::new(dir.path()).store_id().unwrap();
        let id_file = cotal.join(STORE_ID_FILE);
        let keys = dir.path().join("keys");
        fs::create_dir_all(&keys).unwrap();
        std::os::unix::fs::symlink(&id_file, keys.join("sym.creds")).unwrap();
        fs::hard_link(&id_file, keys.join("hard.creds")).unwrap();
        fs::copy(&id_file, keys.join("copy.creds")).unwrap();
        for name in ["sym.creds", "hard.creds", "copy.creds"] {
            let e = CredsFileStore::new(keys.join(name), demo()).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Key, "{name}: {e}");
            assert!(e.to_string().contains("not a credential"), "{name}: {e}");
        }
        // The directory's own identity file under another name, as the same inode.
        let own = FsStore::at_dir(&keys).store_id().unwrap();
        assert_ne!(own, id);
        fs::hard_link(keys.join(STORE_ID_FILE), keys.join("own.creds")).unwrap();
        let e = CredsFileStore::new(keys.join("own.creds"), demo()).unwrap_err();
        assert!(e.to_string().contains("under another name"), "{e}");
        // A real credential beside them is accepted.
        fs::write(keys.join("d.creds"), "-----BEGIN NATS USER JWT-----\nx\n").unwrap();
        assert!(CredsFileStore::new(keys.join("d.creds"), demo()).is_ok());
        assert!(CredsFileStore::new(keys.join("absent.creds"), demo()).is_ok());
    }

    /// Two `--creds` directories are two stores, also at the same path on two hosts (simulated:
    /// the directory's `store.id` replaced between the two reads). Mutation seen failing: a
    /// non-canonical `--creds` file's identity with `store_id: None` (the same path then compares
    /// as one store).
    #[test]
    fn a_creds_directory_has_its_own_store_identity() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let in_a = CredsFileStore::new(a.path().join("d.creds"), demo()).unwrap();
        let in_b = CredsFileStore::new(b.path().join("d.creds"), demo()).unwrap();
        let (ia, ib) = (in_a.identity().unwrap(), in_b.identity().unwrap());
        assert!(!ia.same_store(&ib), "{ia} vs {ib}");
        assert!(ia.same_store(&in_a.identity().unwrap()), "stable: {ia}");
        // Host two: the same path, its own store.id.
        assert!(
            a.path().join(STORE_ID_FILE).exists(),
            "recorded in the directory"
        );
        fs::remove_file(a.path().join(STORE_ID_FILE)).unwrap();
        let other_host = in_a.identity().unwrap();
        assert!(!ia.same_store(&other_host), "{ia} vs {other_host}");
        assert!(check_same_store(&ia, &other_host).is_err());
    }
}
