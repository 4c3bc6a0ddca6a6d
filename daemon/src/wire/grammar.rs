//! The token grammar: spaces, principals, lifecycles, roles and channels, and the refusals of a
//! malformed one (the value and the rule it broke, never silently sanitized into another name).

use std::fmt;

/// Longest channel name the spec admits (`MAX_CHANNEL_LENGTH`).
pub const MAX_CHANNEL_LENGTH: usize = 4096;
/// Longest space name we accept; it is embedded in stream, bucket and subject names.
pub const MAX_SPACE_LENGTH: usize = 64;
/// Longest actor token we accept (an nkey is 56 characters).
pub const MAX_ACTOR_LENGTH: usize = 128;
/// Longest role token we accept; it is embedded in the `svc_<role>` durable name.
pub const MAX_ROLE_LENGTH: usize = 64;

/// Why a wire token was refused. `kind()` lets a caller match; `Display` names the value and rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    kind: WireErrorKind,
    value: String,
    rule: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireErrorKind {
    Space,
    Owner,
    Actor,
    Principal,
    LifecycleUid,
    Channel,
    Role,
}

impl WireError {
    fn new(kind: WireErrorKind, value: &str, rule: &'static str) -> Self {
        WireError {
            kind,
            value: value.to_string(),
            rule,
        }
    }
    pub fn kind(&self) -> WireErrorKind {
        self.kind
    }
    pub fn value(&self) -> &str {
        &self.value
    }
    pub fn rule(&self) -> &'static str {
        self.rule
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            WireErrorKind::Space => "space name",
            WireErrorKind::Owner => "owner token",
            WireErrorKind::Actor => "actor token",
            WireErrorKind::Principal => "principal",
            WireErrorKind::LifecycleUid => "lifecycle uid",
            WireErrorKind::Channel => "channel",
            WireErrorKind::Role => "role",
        };
        write!(f, "invalid {what} {:?}: {}", self.value, self.rule)
    }
}

impl std::error::Error for WireError {}

/// The reference `token()`: every character outside `[A-Za-z0-9_-]` becomes `_`, empty becomes `_`.
/// Lossy by design and never decoded back.
pub fn token(raw: &str) -> String {
    if raw.is_empty() {
        return "_".to_string();
    }
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `spaceKey(space)`: the space name's UTF-8 bytes in lowercase hex. Injective and case-safe.
pub fn space_key(space: &str) -> String {
    space.bytes().map(|b| format!("{b:02x}")).collect()
}

/// `spaceSegment(space)`: the per-space material directory name under `.cotal/`.
pub fn space_segment(space: &str) -> String {
    format!("space.{}", space_key(space))
}

/// A validated space name. We accept only names that are already tokens, so that two spaces can
/// never sanitize onto the same streams and buckets.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Space(String);

impl Space {
    pub const RULE: &'static str =
        "a space name is 1 to 64 characters from [A-Za-z0-9_-]; it names streams, buckets and subjects verbatim";

    pub fn parse(raw: &str) -> Result<Space, WireError> {
        let ok = !raw.is_empty()
            && raw.len() <= MAX_SPACE_LENGTH
            && raw
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if ok {
            Ok(Space(raw.to_string()))
        } else {
            Err(WireError::new(WireErrorKind::Space, raw, Self::RULE))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The sanitized token used in stream and bucket names (equal to the name, by construction).
    pub fn token(&self) -> &str {
        &self.0
    }
    pub fn key(&self) -> String {
        space_key(&self.0)
    }
    pub fn segment(&self) -> String {
        space_segment(&self.0)
    }
    /// Subject prefix `cotal.<s>`.
    pub fn prefix(&self) -> String {
        format!("cotal.{}", self.0)
    }
}

impl fmt::Display for Space {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Owner token rule: `u_` + 26 base32 (derived user), `p_` + 26 base32 (platform), or `local`.
pub fn validate_owner(raw: &str) -> Result<(), WireError> {
    const RULE: &str =
        "an owner token is `local`, or `u_`/`p_` followed by 26 characters of [a-z2-7]";
    let derived = |prefix: &str| {
        raw.strip_prefix(prefix).is_some_and(|rest| {
            rest.len() == 26
                && rest
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || ('2'..='7').contains(&c))
        })
    };
    if raw == "local" || derived("u_") || derived("p_") {
        Ok(())
    } else {
        Err(WireError::new(WireErrorKind::Owner, raw, RULE))
    }
}

/// Actor token rule: `[A-Za-z0-9_]`, non-empty; `-` is reserved as the dash-form separator.
pub fn validate_actor(raw: &str) -> Result<(), WireError> {
    const RULE: &str =
        "an actor token is 1 to 128 characters from [A-Za-z0-9_] (`-` is reserved as the dash-form separator)";
    let ok = !raw.is_empty()
        && raw.len() <= MAX_ACTOR_LENGTH
        && raw.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(WireError::new(WireErrorKind::Actor, raw, RULE))
    }
}

/// A principal `<owner>.<actor>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Principal {
    owner: String,
    actor: String,
}

impl Principal {
    pub fn new(owner: &str, actor: &str) -> Result<Principal, WireError> {
        validate_owner(owner)?;
        validate_actor(actor)?;
        Ok(Principal {
            owner: owner.to_string(),
            actor: actor.to_string(),
        })
    }
    /// Parses the dot-form `<owner>.<actor>`.
    pub fn parse(dot_form: &str) -> Result<Principal, WireError> {
        match dot_form.split_once('.') {
            Some((owner, actor)) if !actor.contains('.') => Principal::new(owner, actor),
            _ => Err(WireError::new(
                WireErrorKind::Principal,
                dot_form,
                "a principal is `<owner>.<actor>` with exactly one dot",
            )),
        }
    }
    /// The principal a daemon or endpoint holding user nkey `U…` speaks as: `local.<nkey>`.
    pub fn for_nkey(user_public_key: &str) -> Result<Principal, WireError> {
        Principal::new("local", user_public_key)
    }
    pub fn owner(&self) -> &str {
        &self.owner
    }
    pub fn actor(&self) -> &str {
        &self.actor
    }
    pub fn dot_form(&self) -> String {
        format!("{}.{}", self.owner, self.actor)
    }
    pub fn dash_form(&self) -> String {
        format!("{}-{}", self.owner, self.actor)
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.owner, self.actor)
    }
}

/// A lifecycle UID `[a-z0-9]{26,32}`, never reused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LifecycleUid(String);

impl LifecycleUid {
    pub fn parse(raw: &str) -> Result<LifecycleUid, WireError> {
        let ok = (26..=32).contains(&raw.len())
            && raw
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if ok {
            Ok(LifecycleUid(raw.to_string()))
        } else {
            Err(WireError::new(
                WireErrorKind::LifecycleUid,
                raw,
                "a lifecycle uid is 26 to 32 characters from [a-z0-9]",
            ))
        }
    }
    /// A fresh 32-character uid from 128 random bits (lowercase hex).
    pub fn generate() -> LifecycleUid {
        LifecycleUid(uuid::Uuid::new_v4().simple().to_string())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LifecycleUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An anycast role: one `[A-Za-z0-9_-]` token (the reference's 0.71 role grammar; `*` and any
/// other wildcard are refused, never rewritten). It names the request subject's role token and
/// the role's shared durable `svc_<role>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Role(String);

impl Role {
    pub fn parse(raw: &str) -> Result<Role, WireError> {
        if raw.is_empty() || raw.len() > MAX_ROLE_LENGTH {
            return Err(WireError::new(
                WireErrorKind::Role,
                raw,
                "a role is 1 to 64 characters",
            ));
        }
        if !raw
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(WireError::new(
                WireErrorKind::Role,
                raw,
                "a role is one token of [A-Za-z0-9_-] (no `.`, `*` or `>`)",
            ));
        }
        Ok(Role(raw.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A channel name: dotted segments of `[A-Za-z0-9_-]`; `*` and `>` only as whole segments, `>`
/// only last. `concrete` additionally forbids wildcards (publish targets, membership rows).
pub fn validate_channel(raw: &str, concrete: bool) -> Result<(), WireError> {
    let fail = |rule: &'static str| Err(WireError::new(WireErrorKind::Channel, raw, rule));
    if raw.is_empty() || raw.len() > MAX_CHANNEL_LENGTH {
        return fail("a channel is 1 to 4096 characters");
    }
    let segments: Vec<&str> = raw.split('.').collect();
    for (i, seg) in segments.iter().enumerate() {
        if seg.is_empty() {
            return fail("a channel is dot-separated non-empty segments");
        }
        if *seg == "*" || *seg == ">" {
            if concrete {
                return fail("a concrete channel has no `*` or `>` segment");
            }
            if *seg == ">" && i + 1 != segments.len() {
                return fail("`>` is allowed only as the last segment");
            }
            continue;
        }
        if !seg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return fail("channel segments use [A-Za-z0-9_-]; `*` and `>` only as whole segments");
        }
    }
    Ok(())
}

/// NATS-style subject match of a channel against a grant pattern (`*` one segment, `>` the rest).
pub fn channel_matches(pattern: &str, channel: &str) -> bool {
    let mut p = pattern.split('.');
    let mut c = channel.split('.');
    loop {
        match (p.next(), c.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}
