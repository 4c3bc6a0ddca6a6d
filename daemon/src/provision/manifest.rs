//! The multi-space host's manifest: which spaces a host serves (`.cotal/delivery-host.json`).
//!
//! Why in provisioning: the provisioner writes it and the host (`host/`) reads it, and a ring
//! may only use the rings below it. The manifest names spaces only, never identities or
//! credentials: each lane finds its space's credentials under the same root. Version 1:
//!
//! ```json
//! {"version": 1, "spaces": ["alpha", "beta"]}
//! ```
//!
//! Anything else (bad JSON, another version, an unknown field, a space token that is not one,
//! the same space twice, no space at all) is refused whole, naming the file and the fault.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::base::write_file_atomic;
use crate::wire::Space;

/// The manifest's file name under `.cotal/`.
pub const MANIFEST_FILE: &str = "delivery-host.json";
/// The one version this implementation reads and writes.
pub const MANIFEST_VERSION: u64 = 1;

/// `<root>/.cotal/delivery-host.json`.
pub fn manifest_path(root: &Path) -> PathBuf {
    root.join(super::layout::COTAL_DIR).join(MANIFEST_FILE)
}

/// A host's version-1 manifest: the spaces it serves, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub spaces: Vec<Space>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestErrorKind {
    /// No file (or it could not be read).
    Unreadable,
    /// Not JSON, or not a JSON object.
    Syntax,
    /// `version` missing or not 1.
    Version,
    /// A field other than `version` and `spaces`.
    UnknownField,
    /// `spaces` missing, not a list of strings, or empty.
    Spaces,
    /// A listed space is not a valid space token.
    InvalidSpace,
    /// A space listed twice.
    Duplicate,
    /// Writing the manifest failed.
    Write,
}

/// Why a manifest was refused; `Display` names the file and the fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    kind: ManifestErrorKind,
    path: PathBuf,
    detail: String,
}

impl ManifestError {
    fn new(kind: ManifestErrorKind, path: &Path, detail: impl Into<String>) -> ManifestError {
        ManifestError {
            kind,
            path: path.to_path_buf(),
            detail: detail.into(),
        }
    }
    pub fn kind(&self) -> ManifestErrorKind {
        self.kind
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "manifest {}: {}", self.path.display(), self.detail)
    }
}

impl std::error::Error for ManifestError {}

impl Manifest {
    /// Reads and validates the manifest at `path`.
    pub fn read(path: &Path) -> Result<Manifest, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ManifestError::new(
                ManifestErrorKind::Unreadable,
                path,
                format!("cannot be read ({e})"),
            )
        })?;
        Manifest::parse(&text, path)
    }

    /// Validates manifest text; `path` is only named in the errors.
    pub fn parse(text: &str, path: &Path) -> Result<Manifest, ManifestError> {
        let err = |kind, detail: String| ManifestError::new(kind, path, detail);
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            err(
                ManifestErrorKind::Syntax,
                format!("is not valid JSON ({e})"),
            )
        })?;
        let Some(object) = value.as_object() else {
            return Err(err(
                ManifestErrorKind::Syntax,
                "is not a JSON object".into(),
            ));
        };
        if let Some(field) = object
            .keys()
            .find(|k| k.as_str() != "version" && k.as_str() != "spaces")
        {
            return Err(err(
                ManifestErrorKind::UnknownField,
                format!("unknown field {field:?} (a version-1 manifest has only \"version\" and \"spaces\")"),
            ));
        }
        match object.get("version") {
            Some(v) if v.as_u64() == Some(MANIFEST_VERSION) => {}
            Some(v) => {
                return Err(err(
                    ManifestErrorKind::Version,
                    format!("version {v} is not supported (only {MANIFEST_VERSION})"),
                ))
            }
            None => {
                return Err(err(
                    ManifestErrorKind::Version,
                    format!("has no \"version\" (expected {MANIFEST_VERSION})"),
                ))
            }
        }
        let Some(list) = object.get("spaces").and_then(|s| s.as_array()) else {
            return Err(err(
                ManifestErrorKind::Spaces,
                "\"spaces\" must be a list of space names".into(),
            ));
        };
        if list.is_empty() {
            return Err(err(
                ManifestErrorKind::Spaces,
                "\"spaces\" names no space".into(),
            ));
        }
        let mut seen = BTreeSet::new();
        let mut spaces = Vec::with_capacity(list.len());
        for item in list {
            let Some(raw) = item.as_str() else {
                return Err(err(
                    ManifestErrorKind::Spaces,
                    format!("\"spaces\" holds {item}, which is not a string"),
                ));
            };
            let space = Space::parse(raw).map_err(|e| {
                err(
                    ManifestErrorKind::InvalidSpace,
                    format!("space {raw:?}: {e}"),
                )
            })?;
            if !seen.insert(raw.to_string()) {
                return Err(err(
                    ManifestErrorKind::Duplicate,
                    format!("space {raw:?} is listed twice"),
                ));
            }
            spaces.push(space);
        }
        Ok(Manifest { spaces })
    }

    /// The version-1 text of this manifest.
    pub fn render(&self) -> String {
        let spaces: Vec<&str> = self.spaces.iter().map(Space::as_str).collect();
        format!(
            "{}\n",
            serde_json::json!({ "version": MANIFEST_VERSION, "spaces": spaces })
        )
    }

    /// Writes the manifest of `root` atomically (mode 0600).
    pub fn write(&self, root: &Path) -> Result<PathBuf, ManifestError> {
        let path = manifest_path(root);
        if let Some(dir) = path.parent() {
            super::authority::create_private_dir(dir)
                .map_err(|e| ManifestError::new(ManifestErrorKind::Write, &path, e.to_string()))?;
        }
        write_file_atomic(&path, self.render().as_bytes(), 0o600)
            .map_err(|e| ManifestError::new(ManifestErrorKind::Write, &path, e.to_string()))?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(text, Path::new("/r/.cotal/delivery-host.json"))
    }

    /// Mutations seen failing (each applied alone): dropping the unknown-field check, accepting
    /// any version, skipping the duplicate set, an invalid token reported under kind `Spaces`
    /// instead of `InvalidSpace`, accepting an empty list.
    #[test]
    fn every_fault_refuses_the_whole_manifest_and_names_the_file() {
        let cases = [
            ("{", ManifestErrorKind::Syntax),
            ("[1]", ManifestErrorKind::Syntax),
            (
                r#"{"version":2,"spaces":["a"]}"#,
                ManifestErrorKind::Version,
            ),
            (r#"{"spaces":["a"]}"#, ManifestErrorKind::Version),
            (
                r#"{"version":1,"spaces":["a"],"creds":"x"}"#,
                ManifestErrorKind::UnknownField,
            ),
            (
                r#"{"version":1,"spaces":["a","b","a"]}"#,
                ManifestErrorKind::Duplicate,
            ),
            (
                r#"{"version":1,"spaces":["a","b.c"]}"#,
                ManifestErrorKind::InvalidSpace,
            ),
            (r#"{"version":1,"spaces":[]}"#, ManifestErrorKind::Spaces),
            (r#"{"version":1,"spaces":[3]}"#, ManifestErrorKind::Spaces),
            (r#"{"version":1}"#, ManifestErrorKind::Spaces),
        ];
        for (text, kind) in cases {
            let e = parse(text).expect_err(text);
            assert_eq!(e.kind(), kind, "{text}: {e}");
            assert!(
                e.to_string()
                    .starts_with("manifest /r/.cotal/delivery-host.json: "),
                "{e}"
            );
        }
    }

    #[test]
    fn a_valid_manifest_round_trips_in_order() {
        let m = parse(r#"{"version":1,"spaces":["beta","alpha"]}"#).unwrap();
        let names: Vec<&str> = m.spaces.iter().map(Space::as_str).collect();
        assert_eq!(names, vec!["beta", "alpha"]);
        let dir = tempfile::tempdir().unwrap();
        let path = m.write(dir.path()).unwrap();
        assert_eq!(Manifest::read(&path).unwrap(), m);
    }
}
