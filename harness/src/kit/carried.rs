//! The catalogue this binary carries: every file of the checkout's `cases/` as it was when the
//! harness was built (`harness/build.rs` lists them), so a harness copied out of its checkout
//! (the kit `ci/package-kit` packs, a CI artifact) still qualifies. Its digest names it in
//! `harness --version` and in a run's versions: a SHA-256 over each file's path and bytes, in
//! path order, computed the same way for a catalogue read from a directory, so the carried one
//! and the `cases/` it came from have the same digest.

use std::path::Path;

use sha2::{Digest, Sha256};

mod list {
    include!(concat!(env!("OUT_DIR"), "/carried.rs"));
}

/// The carried files: (path under `cases/`, bytes), in path order.
pub fn files() -> &'static [(&'static str, &'static [u8])] {
    list::CARRIED
}

/// Whether a file name is a leftover rather than a part of the catalogue (an editor's backup,
/// a half-written report, a pending snapshot): `harness/build.rs` skips the same names.
pub fn is_leftover(name: &str) -> bool {
    name.starts_with('.')
        || name.ends_with('~')
        || name.ends_with(".pending-snap")
        || name.ends_with(".snap.new")
}

/// `sha256:<hex>` over `(path, bytes)` pairs taken in path order.
pub fn digest_of<'a>(files: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut sorted: Vec<(&str, &[u8])> = files.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut h = Sha256::new();
    for (path, bytes) in sorted {
        h.update(path.as_bytes());
        h.update([0]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The digest of the carried catalogue.
pub fn digest() -> String {
    digest_of(files().iter().copied())
}

/// The digest of the catalogue in `root`, computed as the carried one's.
pub fn digest_of_dir(root: &Path) -> std::io::Result<String> {
    let mut found = Vec::new();
    read_tree(root, "", &mut found)?;
    Ok(digest_of(
        found.iter().map(|(p, b)| (p.as_str(), b.as_slice())),
    ))
}

fn read_tree(dir: &Path, rel: &str, out: &mut Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_leftover(&name) {
            continue;
        }
        let rel = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        if entry.file_type()?.is_dir() {
            read_tree(&entry.path(), &rel, out)?;
        } else {
            out.push((rel, std::fs::read(entry.path())?));
        }
    }
    Ok(())
}

/// How many cases the carried catalogue holds (`<family>/<name>.toml`, not a family's
/// `mutations.toml`), as `Catalogue::load` counts them.
pub fn case_count() -> usize {
    files()
        .iter()
        .filter(|(p, _)| {
            let mut parts = p.split('/');
            let (Some(_), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
                return false;
            };
            name.ends_with(".toml") && name != "mutations.toml"
        })
        .count()
}

/// `<n> cases, sha256:<first 12 hex digits>`: the carried catalogue in one phrase.
pub fn named() -> String {
    let d = digest();
    format!(
        "{} cases, {}",
        case_count(),
        &d[..d.len().min("sha256:".len() + 12)]
    )
}

/// Writes the carried files under `to` (which must be empty or absent).
pub fn unpack(to: &Path) -> std::io::Result<()> {
    for (rel, bytes) in files() {
        let path = to.join(rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, bytes)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The binary carries the checkout's `cases/` as it is (cargo rebuilds on any change
    /// there): the same digest from the carried bytes and from the directory, and unpacked it is
    /// that directory again.
    /// Mutation seen failing: `build.rs` skipping the snapshots (the digests differ).
    #[test]
    fn the_carried_catalogue_is_the_checkouts_cases() {
        let root = crate::rig::checkout::root()
            .expect("inside the checkout")
            .join("cases");
        assert!(files().len() > 20, "{} files", files().len());
        assert_eq!(digest(), digest_of_dir(&root).expect("read cases/"));
        let out = tempfile::tempdir().expect("tempdir");
        unpack(out.path()).expect("unpack");
        assert_eq!(digest_of_dir(out.path()).expect("read"), digest());
        let cat = crate::kit::Catalogue::load(out.path()).expect("the unpacked catalogue loads");
        assert_eq!(cat.cases.len(), case_count());
    }

    /// One byte or one name changed changes the digest.
    /// Mutation seen failing: the path left out of the hash (a renamed file keeps the digest).
    #[test]
    fn the_digest_covers_names_and_bytes() {
        let base = digest_of([("a/x.toml", &b"1"[..]), ("a/y.toml", &b"2"[..])]);
        assert_eq!(
            base,
            digest_of([("a/y.toml", &b"2"[..]), ("a/x.toml", &b"1"[..])])
        );
        assert_ne!(
            base,
            digest_of([("a/x.toml", &b"1"[..]), ("a/z.toml", &b"2"[..])])
        );
        assert_ne!(
            base,
            digest_of([("a/x.toml", &b"1"[..]), ("a/y.toml", &b"3"[..])])
        );
        // A byte moved from one file's end to the next file's start is another catalogue.
        assert_ne!(
            digest_of([("a", &b"xy"[..]), ("b", &b"z"[..])]),
            digest_of([("a", &b"x"[..]), ("b", &b"yz"[..])])
        );
    }
}
