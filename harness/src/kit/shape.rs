//! What a case runs on: the broker shape (presets joined by `+`: operator, tls, max-payload,
//! cluster) and the mesh provisioned on it (`[mesh]`: spaces, lease TTL, evictor, signer,
//! limits). Below the world, which starts one, and the case file, which names them.

use std::collections::BTreeSet;
use std::fmt;

use serde::Deserialize;

use super::expr::Duration;

/// One broker preset; a shape is a `+`-joined set of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Preset {
    Operator,
    Tls,
    MaxPayload,
    Cluster,
}

/// The broker shape a case runs on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape {
    presets: BTreeSet<Preset>,
    text: String,
}

impl Shape {
    pub fn parse(text: &str) -> Result<Shape, String> {
        let mut presets = BTreeSet::new();
        for part in text.split('+') {
            let p = match part.trim() {
                "operator" => Preset::Operator,
                "tls" => Preset::Tls,
                "max-payload" => Preset::MaxPayload,
                "cluster" => Preset::Cluster,
                other => {
                    return Err(format!(
                    "unknown shape {other:?} (shapes: operator, tls, max-payload, cluster, joined by +)"
                ))
                }
            };
            presets.insert(p);
        }
        Ok(Shape {
            presets,
            text: text.to_string(),
        })
    }
    pub fn has(&self, p: Preset) -> bool {
        self.presets.contains(&p)
    }
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// `[mesh]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeshSpec {
    #[serde(default = "default_space")]
    pub space: String,
    /// Spaces provisioned beside `space` (a multi-space host serves them all).
    #[serde(default)]
    pub spaces: Vec<String>,
    /// The lease bucket's `max_age`, ms (the shipped TTL is 30 s): a number, or an expression
    /// of the case's variables (`"ttl"`), so a shipped-default case scales its TTL in `[scaled]`.
    #[serde(default = "default_lease_ttl_ms")]
    pub lease_ttl_ms: Duration,
    #[serde(default = "yes")]
    pub evictor: bool,
    /// Save the signer under `.cotal/auth/` (what `up` and the credential's owner keep).
    #[serde(default)]
    pub signer: bool,
    /// `max_payload` of the `max-payload` shape, bytes.
    #[serde(default = "default_max_payload")]
    pub max_payload: u64,
    #[serde(default)]
    pub max_file_store_bytes: Option<u64>,
    /// The delivery credential reminted to this lifetime before anything starts, ms: a number,
    /// or an expression of the case's variables, so a case at the shipped timing scales it.
    #[serde(default)]
    pub delivery_lifetime_ms: Option<Duration>,
}

impl Default for MeshSpec {
    fn default() -> Self {
        MeshSpec {
            space: default_space(),
            spaces: Vec::new(),
            lease_ttl_ms: default_lease_ttl_ms(),
            evictor: true,
            signer: false,
            max_payload: default_max_payload(),
            max_file_store_bytes: None,
            delivery_lifetime_ms: None,
        }
    }
}

fn default_space() -> String {
    "demo".into()
}
fn default_lease_ttl_ms() -> Duration {
    Duration::Ms(30_000)
}
fn default_max_payload() -> u64 {
    4096
}
fn yes() -> bool {
    true
}
