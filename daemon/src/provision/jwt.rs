//! Hand-encoded NATS JWTs (operator, account, user), signed with `nkeys`.
//!
//! The shape follows nats-io/jwt v2 (`claims.go`): header `{"typ":"JWT","alg":"ed25519-nkey"}`,
//! the registered claims, and a `nats` object with `type` and `version: 2`. The `jti` is computed
//! the Go way: base32 (std alphabet, no padding) of SHA-512/256 over the JSON of the registered
//! claims with an empty `jti`, with Go's HTML escaping. No JWT crate is used: the only one that
//! can emit operator JWTs and JetStream limits is young, and the claims are short enough to keep
//! explicit here.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use data_encoding::{BASE32_NOPAD, BASE64URL_NOPAD};
use nkeys::KeyPair;
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha512_256};

use super::profiles::Permissions;

/// Why a JWT could not be produced.
#[derive(Debug)]
pub struct JwtError {
    kind: JwtErrorKind,
    detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtErrorKind {
    /// The signing key could not sign (e.g. a public-only key pair).
    Sign,
    /// The claims could not be serialized.
    Encode,
    /// The system clock is before 1970 or an expiry overflows.
    Clock,
}

impl JwtError {
    fn new(kind: JwtErrorKind, detail: impl Into<String>) -> JwtError {
        JwtError {
            kind,
            detail: detail.into(),
        }
    }
    pub fn kind(&self) -> JwtErrorKind {
        self.kind
    }
}

impl fmt::Display for JwtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot encode JWT: {}", self.detail)
    }
}

impl std::error::Error for JwtError {}

/// The registered claims, in the field order of Go's `ClaimsData`.
#[derive(Debug, Clone, Serialize)]
struct ClaimsData {
    #[serde(skip_serializing_if = "Option::is_none")]
    exp: Option<i64>,
    #[serde(skip_serializing_if = "String::is_empty")]
    jti: String,
    iat: i64,
    iss: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    sub: String,
}

#[derive(Serialize)]
struct Token<'a> {
    #[serde(flatten)]
    data: &'a ClaimsData,
    nats: &'a Value,
}

/// Go's `json.Marshal` escapes `<`, `>`, `&`, U+2028 and U+2029 inside strings. Those characters
/// only ever occur inside JSON strings, so a textual replacement is exact.
fn go_json_escape(json: &str) -> String {
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

fn now_unix_secs() -> Result<i64, JwtError> {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| JwtError::new(JwtErrorKind::Clock, "the system clock is before 1970"))
        .and_then(|d| {
            i64::try_from(d.as_secs())
                .map_err(|_| JwtError::new(JwtErrorKind::Clock, "the system clock overflows"))
        })
}

/// Signs `nats` claims for `subject` with `signer`. `expires_in` of `None` means no `exp`.
fn encode(
    signer: &KeyPair,
    subject: &str,
    name: &str,
    expires_in: Option<Duration>,
    nats: &Value,
) -> Result<String, JwtError> {
    let iat = now_unix_secs()?;
    let exp = match expires_in {
        None => None,
        Some(d) => {
            let secs = i64::try_from(d.as_secs())
                .ok()
                .and_then(|s| iat.checked_add(s.max(1)))
                .ok_or_else(|| JwtError::new(JwtErrorKind::Clock, "the expiry overflows"))?;
            Some(secs)
        }
    };
    let mut data = ClaimsData {
        exp,
        jti: String::new(),
        iat,
        iss: signer.public_key(),
        name: name.to_string(),
        sub: subject.to_string(),
    };
    let hash_input = serde_json::to_string(&data)
        .map_err(|e| JwtError::new(JwtErrorKind::Encode, e.to_string()))?;
    let digest = Sha512_256::digest(go_json_escape(&hash_input).as_bytes());
    data.jti = BASE32_NOPAD.encode(&digest);

    let header = BASE64URL_NOPAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body_json = serde_json::to_string(&Token { data: &data, nats })
        .map_err(|e| JwtError::new(JwtErrorKind::Encode, e.to_string()))?;
    let body = BASE64URL_NOPAD.encode(body_json.as_bytes());
    let signing_input = format!("{header}.{body}");
    let sig = signer
        .sign(signing_input.as_bytes())
        .map_err(|e| JwtError::new(JwtErrorKind::Sign, e.to_string()))?;
    Ok(format!("{signing_input}.{}", BASE64URL_NOPAD.encode(&sig)))
}

/// Operator JWT, self-signed, naming the system account.
pub fn encode_operator(
    operator: &KeyPair,
    name: &str,
    system_account: &str,
) -> Result<String, JwtError> {
    let nats = json!({
        "system_account": system_account,
        "type": "operator",
        "version": 2,
    });
    encode(operator, &operator.public_key(), name, None, &nats)
}

/// The unlimited connection limits every account gets.
fn account_limits(jetstream: bool) -> Value {
    let mut limits = json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
    });
    if jetstream {
        // JetStream is enabled for an account only if mem_storage or disk_storage is not 0.
        // The key is `consumer`, singular.
        if let Some(map) = limits.as_object_mut() {
            map.insert("mem_storage".into(), json!(-1));
            map.insert("disk_storage".into(), json!(-1));
            map.insert("streams".into(), json!(-1));
            map.insert("consumer".into(), json!(-1));
        }
    }
    limits
}

/// Account JWT signed by the operator. Data accounts enable JetStream without limits; the
/// system account must not (the broker refuses JetStream in the system account).
pub fn encode_account(
    operator: &KeyPair,
    account_public_key: &str,
    name: &str,
    jetstream: bool,
) -> Result<String, JwtError> {
    encode_account_with_signing_keys(operator, account_public_key, name, jetstream, &[])
}

/// [`encode_account`] trusting `signing_keys` (account public keys) to sign the account's users,
/// as the reference's signer bundle has its account JWT do (none: no `signing_keys` claim).
pub fn encode_account_with_signing_keys(
    operator: &KeyPair,
    account_public_key: &str,
    name: &str,
    jetstream: bool,
    signing_keys: &[String],
) -> Result<String, JwtError> {
    let mut nats = json!({
        "limits": account_limits(jetstream),
        "default_permissions": {"pub": {}, "sub": {}},
        "type": "account",
        "version": 2,
    });
    if let (false, Some(map)) = (signing_keys.is_empty(), nats.as_object_mut()) {
        map.insert("signing_keys".into(), json!(signing_keys));
    }
    encode(operator, account_public_key, name, None, &nats)
}

/// What goes into a user JWT besides its subject.
#[derive(Debug, Clone, Default)]
pub struct UserClaimsSpec {
    pub name: String,
    pub permissions: Permissions,
    pub expires_in: Option<Duration>,
    /// Set when the signer is an account signing key rather than the account identity key.
    pub issuer_account: Option<String>,
    /// JWT `tags` (what `/connz` and `$SYS` CONNZ report per connection).
    pub tags: Vec<String>,
}

impl UserClaimsSpec {
    pub fn new(name: impl Into<String>) -> UserClaimsSpec {
        UserClaimsSpec {
            name: name.into(),
            ..UserClaimsSpec::default()
        }
    }
    pub fn permissions(mut self, permissions: Permissions) -> Self {
        self.permissions = permissions;
        self
    }
    pub fn expires_in(mut self, ttl: Option<Duration>) -> Self {
        self.expires_in = ttl;
        self
    }
    pub fn tags(mut self, tags: Vec<String>) -> Self {
        self.tags = tags;
        self
    }
    pub fn issuer_account(mut self, account_public_key: impl Into<String>) -> Self {
        self.issuer_account = Some(account_public_key.into());
        self
    }
}

fn allow_deny(allow: &[String], deny: &[String]) -> Value {
    let mut m = serde_json::Map::new();
    if !allow.is_empty() {
        m.insert("allow".into(), json!(allow));
    }
    if !deny.is_empty() {
        m.insert("deny".into(), json!(deny));
    }
    Value::Object(m)
}

/// User JWT signed by `signer` (the account key, or a signing key with `issuer_account`).
pub fn encode_user(
    signer: &KeyPair,
    user_public_key: &str,
    spec: &UserClaimsSpec,
) -> Result<String, JwtError> {
    let p = &spec.permissions;
    let mut nats = json!({
        "pub": allow_deny(&p.pub_allow, &p.pub_deny),
        "sub": allow_deny(&p.sub_allow, &p.sub_deny),
        "subs": -1,
        "data": -1,
        "payload": -1,
        "type": "user",
        "version": 2,
    });
    if let (Some(acc), Some(map)) = (&spec.issuer_account, nats.as_object_mut()) {
        map.insert("issuer_account".into(), json!(acc));
    }
    if let (false, Some(map)) = (spec.tags.is_empty(), nats.as_object_mut()) {
        map.insert("tags".into(), json!(spec.tags));
    }
    encode(signer, user_public_key, &spec.name, spec.expires_in, &nats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::{decode_claims, verify_signature};

    #[test]
    fn operator_and_account_jwts_verify() {
        let op = KeyPair::new_operator();
        let sys = KeyPair::new_account();
        let jwt = encode_operator(&op, "cotal", &sys.public_key()).unwrap();
        let c = verify_signature(&jwt).unwrap();
        assert_eq!(c.iss, op.public_key());
        assert_eq!(c.sub, op.public_key());
        assert_eq!(c.claim_type(), "operator");
        assert_eq!(c.nats["system_account"], sys.public_key());
        assert_eq!(c.exp, None);

        let acc = KeyPair::new_account();
        let jwt = encode_account(&op, &acc.public_key(), "demo", true).unwrap();
        let c = verify_signature(&jwt).unwrap();
        assert_eq!(c.iss, op.public_key());
        assert_eq!(c.nats["limits"]["disk_storage"], -1);
        assert_eq!(c.nats["limits"]["consumer"], -1);
        let jwt = encode_account(&op, &sys.public_key(), "SYS", false).unwrap();
        assert!(decode_claims(&jwt).unwrap().nats["limits"]
            .get("disk_storage")
            .is_none());
    }

    #[test]
    fn user_jwt_carries_permissions_expiry_and_go_jti() {
        let acc = KeyPair::new_account();
        let user = KeyPair::new_user();
        let perms = Permissions {
            pub_allow: vec!["a.>".into()],
            pub_deny: vec![],
            sub_allow: vec!["_INBOX_x.>".into()],
            sub_deny: vec!["b".into()],
        };
        let spec = UserClaimsSpec::new("d")
            .permissions(perms)
            .expires_in(Some(Duration::from_secs(60)))
            .issuer_account("AXYZ")
            .tags(vec!["principal:local.a".into()]);
        let jwt = encode_user(&acc, &user.public_key(), &spec).unwrap();
        let c = verify_signature(&jwt).unwrap();
        assert_eq!(c.sub, user.public_key());
        assert_eq!(c.lifetime_secs(), Some(60));
        assert_eq!(c.nats["pub"]["allow"][0], "a.>");
        assert!(c.nats["pub"].get("deny").is_none());
        assert_eq!(c.nats["sub"]["deny"][0], "b");
        assert_eq!(c.issuer_account.as_deref(), Some("AXYZ"));
        assert_eq!(c.nats["issuer_account"], "AXYZ");
        assert_eq!(c.nats["tags"], json!(["principal:local.a"]));
        let untagged = encode_user(&acc, &user.public_key(), &UserClaimsSpec::new("d")).unwrap();
        assert!(verify_signature(&untagged)
            .unwrap()
            .nats
            .get("tags")
            .is_none());

        // jti = base32(sha512/256(claims data without jti)), recomputed independently.
        let data = json!({"exp": c.exp, "iat": c.iat, "iss": c.iss, "name": c.name, "sub": c.sub});
        let digest = Sha512_256::digest(data.to_string().as_bytes());
        assert_eq!(c.jti, BASE32_NOPAD.encode(&digest));
    }

    #[test]
    fn go_escaping_matches_encoding_json() {
        assert_eq!(
            go_json_escape(r#"{"n":"a<b>&c"}"#),
            r#"{"n":"a\u003cb\u003e\u0026c"}"#
        );
    }
}
