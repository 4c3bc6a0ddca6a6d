//! Stamps the crate with a build id: a hash of its own sources (`src/`, this file, the manifest).
//!
//! Why: the harness and the smoke suite run `target/<profile>/cotal-delivery`, a binary cargo
//! rebuilds only for this package's own targets. A test of another package can therefore run a
//! daemon built from older sources without anything saying so. The binary prints this id
//! (`cotal-delivery build-id`), the library exports it (`cotal_delivery::BUILD_ID`), and the
//! harness refuses a binary whose id is not the one it was compiled against.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=Cargo.toml");
    let mut files = vec![PathBuf::from("build.rs"), PathBuf::from("Cargo.toml")];
    collect(Path::new("src"), &mut files);
    files.sort();
    // FNV-1a over each path and its contents: stable across runs, no dependency.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for f in &files {
        feed(f.to_string_lossy().as_bytes());
        feed(&[0]);
        feed(&std::fs::read(f).unwrap_or_default());
        feed(&[0]);
    }
    println!("cargo:rustc-env=COTAL_DELIVERY_BUILD_ID={h:016x}");
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else {
            out.push(p);
        }
    }
}
