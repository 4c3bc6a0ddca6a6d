//! Rows several rings share: the read-ACL row and the lease row.

use serde::{Deserialize, Serialize};

use super::grammar::channel_matches;

/// The read-ACL row of one lifecycle (`cotal_acl_<s>`, key `<o>.<a>.<uid>`):
/// `AclRecord` of the reference, plus the retirement tombstone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AclRecord {
    pub allow_subscribe: Vec<String>,
    /// Ceiling from the last credential issue; absent means equal to `allow_subscribe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_allow_subscribe: Option<Vec<String>>,
    #[serde(default)]
    pub revision: u64,
    #[serde(default)]
    pub updated_at: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retired: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_at: Option<u64>,
    /// The anycast roles this lifecycle serves (docs/anycast.md), written with the credential
    /// that grants their `svc_<role>` durables; absent means none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
}

impl AclRecord {
    pub fn new(allow_subscribe: Vec<String>, revision: u64, updated_at: u64) -> AclRecord {
        AclRecord {
            allow_subscribe,
            issued_allow_subscribe: None,
            revision,
            updated_at,
            retired: false,
            retired_at: None,
            roles: Vec::new(),
        }
    }
    /// Whether this lifecycle serves `role`: the row lists it and is not retired.
    pub fn serves(&self, role: &str) -> bool {
        !self.is_retired() && self.roles.iter().any(|r| r == role)
    }
    /// Whether the row carries the retirement tombstone.
    pub fn is_retired(&self) -> bool {
        self.retired || self.retired_at.is_some()
    }
    /// Whether the current read ACL covers `channel`: some `allowSubscribe` pattern matches it,
    /// and so does some pattern of the issued ceiling when there is one.
    pub fn covers(&self, channel: &str) -> bool {
        let allowed = self
            .allow_subscribe
            .iter()
            .any(|p| channel_matches(p, channel));
        let under_ceiling = match &self.issued_allow_subscribe {
            None => true,
            Some(ceiling) => ceiling.iter().any(|p| channel_matches(p, channel)),
        };
        allowed && under_ceiling && !self.is_retired()
    }
}

/// The only shard (N=1).
pub const SHARD: u32 = 0;

/// The lease row, wire-compatible with the reference `DeliveryLeaseInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub holder: String,
    pub since: u64,
    pub ready: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub incarnation: String,
}
