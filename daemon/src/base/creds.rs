//! User credentials: the standard NATS `.creds` text, the JWT claims inside it, and the files
//! that hold them.
//!
//! A credential is what every Cotal process dials the broker with, and a credential file is
//! replaced underneath a running daemon on renewal. So parsing is strict (a file whose seed does
//! not belong to its JWT is refused, naming the path), fingerprints are stable (lowercase sha256
//! hex of the JWT text, as the reference `credsFingerprint`), and writes are atomic: a temporary
//! file in the same directory, fsynced, then renamed over the target, so a crash never leaves a
//! half-written credential behind.

use std::fmt;
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use data_encoding::BASE64URL_NOPAD;
use nkeys::{KeyPair, KeyPairType};
use serde::Deserialize;
use sha2::{Digest, Sha256};

const JWT_BEGIN: &str = "-----BEGIN NATS USER JWT-----";
const JWT_END: &str = "------END NATS USER JWT------";
const SEED_BEGIN: &str = "-----BEGIN USER NKEY SEED-----";
const SEED_END: &str = "------END USER NKEY SEED------";

/// What went wrong with a credential, for callers that branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredsErrorKind {
    /// The file could not be read, written, synced or renamed.
    Io,
    /// The text is not a `.creds` document (missing or broken JWT/seed block).
    Format,
    /// The JWT is not three base64url parts with JSON claims.
    Jwt,
    /// The seed is not a valid user nkey seed.
    Seed,
    /// The seed does not belong to the JWT's subject.
    Mismatch,
    /// The JWT signature does not verify against its issuer.
    Signature,
}

/// A refused or failed credential operation. `Display` names the path (when there is one) and
/// what was wrong with it.
#[derive(Debug)]
pub struct CredsError {
    kind: CredsErrorKind,
    path: Option<PathBuf>,
    detail: String,
    source: Option<io::Error>,
}

impl CredsError {
    fn new(kind: CredsErrorKind, detail: impl Into<String>) -> CredsError {
        CredsError {
            kind,
            path: None,
            detail: detail.into(),
            source: None,
        }
    }
    fn io(path: &Path, what: &str, err: io::Error) -> CredsError {
        CredsError {
            kind: CredsErrorKind::Io,
            path: Some(path.to_path_buf()),
            detail: format!("{what}: {err}"),
            source: Some(err),
        }
    }
    fn at(mut self, path: &Path) -> CredsError {
        self.path = Some(path.to_path_buf());
        self
    }
    pub fn kind(&self) -> CredsErrorKind {
        self.kind
    }
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for CredsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "credential file {}: {}", path.display(), self.detail),
            None => write!(f, "credential: {}", self.detail),
        }
    }
}

impl std::error::Error for CredsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The registered claims of a NATS JWT plus the `nats` object, decoded without verification.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct JwtClaims {
    #[serde(default)]
    pub jti: String,
    #[serde(default)]
    pub iat: i64,
    #[serde(default)]
    pub exp: Option<i64>,
    #[serde(default)]
    pub iss: String,
    #[serde(default)]
    pub sub: String,
    #[serde(default)]
    pub name: String,
    /// Present on user JWTs signed by an account signing key: the account the user belongs to
    /// (read from `nats.issuer_account`, where jwt v2 puts it).
    #[serde(default)]
    pub issuer_account: Option<String>,
    /// The `nats` object: `type`, `version`, permissions, limits...
    #[serde(default)]
    pub nats: serde_json::Value,
}

impl JwtClaims {
    /// `nats.type` (`operator`, `account`, `user`), or `""`.
    pub fn claim_type(&self) -> &str {
        self.nats.get("type").and_then(|v| v.as_str()).unwrap_or("")
    }
    /// The account the user belongs to: `issuer_account` when a signing key signed, else `iss`.
    pub fn account(&self) -> &str {
        self.issuer_account.as_deref().unwrap_or(&self.iss)
    }
    /// Lifetime in seconds (`exp - iat`), `None` for a credential that never expires or whose
    /// claimed times are too far apart for an `i64` (they come from the JWT, never trusted).
    pub fn lifetime_secs(&self) -> Option<i64> {
        self.exp.and_then(|exp| exp.checked_sub(self.iat))
    }
}

/// Splits a JWT into its three parts, refusing anything that is not `a.b.c`.
fn split_jwt(jwt: &str) -> Result<(&str, &str, &str), CredsError> {
    let mut parts = jwt.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(h), Some(b), Some(s), None) if !h.is_empty() && !b.is_empty() && !s.is_empty() => {
            Ok((h, b, s))
        }
        _ => Err(CredsError::new(
            CredsErrorKind::Jwt,
            "the JWT is not three non-empty dot-separated parts",
        )),
    }
}

/// Decodes a JWT's claims without checking the signature.
pub fn decode_claims(jwt: &str) -> Result<JwtClaims, CredsError> {
    let (_, body, _) = split_jwt(jwt)?;
    let bytes = BASE64URL_NOPAD.decode(body.as_bytes()).map_err(|e| {
        CredsError::new(
            CredsErrorKind::Jwt,
            format!("the JWT claims are not base64url: {e}"),
        )
    })?;
    let mut claims: JwtClaims = serde_json::from_slice(&bytes).map_err(|e| {
        CredsError::new(
            CredsErrorKind::Jwt,
            format!("the JWT claims are not the expected JSON: {e}"),
        )
    })?;
    // jwt v2 keeps `issuer_account` inside the `nats` object; v1 had it at the top level.
    if claims.issuer_account.is_none() {
        claims.issuer_account = claims
            .nats
            .get("issuer_account")
            .and_then(|v| v.as_str())
            .map(str::to_string);
    }
    Ok(claims)
}

/// Verifies a JWT's ed25519 signature against its `iss` public key and returns its claims.
/// This proves the token is self-consistent, not that a broker trusts its issuer.
pub fn verify_signature(jwt: &str) -> Result<JwtClaims, CredsError> {
    let (header, body, sig) = split_jwt(jwt)?;
    let header_bytes = BASE64URL_NOPAD.decode(header.as_bytes()).map_err(|e| {
        CredsError::new(
            CredsErrorKind::Jwt,
            format!("the JWT header is not base64url: {e}"),
        )
    })?;
    let header_json: serde_json::Value = serde_json::from_slice(&header_bytes).map_err(|e| {
        CredsError::new(
            CredsErrorKind::Jwt,
            format!("the JWT header is not JSON: {e}"),
        )
    })?;
    let alg = header_json
        .get("alg")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    if alg != "ed25519-nkey" {
        return Err(CredsError::new(
            CredsErrorKind::Jwt,
            format!("the JWT algorithm is {alg:?}, expected \"ed25519-nkey\""),
        ));
    }
    let claims = decode_claims(jwt)?;
    let issuer = KeyPair::from_public_key(&claims.iss).map_err(|e| {
        CredsError::new(
            CredsErrorKind::Signature,
            format!("the JWT issuer {:?} is not a public nkey: {e}", claims.iss),
        )
    })?;
    let sig_bytes = BASE64URL_NOPAD.decode(sig.as_bytes()).map_err(|e| {
        CredsError::new(
            CredsErrorKind::Signature,
            format!("the JWT signature is not base64url: {e}"),
        )
    })?;
    let signed = &jwt[..header.len() + 1 + body.len()];
    issuer.verify(signed.as_bytes(), &sig_bytes).map_err(|e| {
        CredsError::new(
            CredsErrorKind::Signature,
            format!(
                "the JWT signature does not verify against issuer {}: {e}",
                claims.iss
            ),
        )
    })?;
    Ok(claims)
}

/// A user credential: the user JWT and the user nkey seed that proves it.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub jwt: String,
    pub seed: String,
}

impl fmt::Debug for Credential {
    // The seed is a secret: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("jwt", &self.jwt)
            .field("seed", &"<redacted>")
            .finish()
    }
}

impl Credential {
    /// Builds a credential and checks that the seed is a user seed belonging to the JWT subject.
    pub fn new(jwt: impl Into<String>, seed: impl Into<String>) -> Result<Credential, CredsError> {
        let cred = Credential {
            jwt: jwt.into(),
            seed: seed.into(),
        };
        cred.check()?;
        Ok(cred)
    }

    fn check(&self) -> Result<(), CredsError> {
        let kp = self.key_pair()?;
        let claims = decode_claims(&self.jwt)?;
        if claims.sub != kp.public_key() {
            return Err(CredsError::new(
                CredsErrorKind::Mismatch,
                format!(
                    "the seed belongs to {} but the JWT subject is {:?}",
                    kp.public_key(),
                    claims.sub
                ),
            ));
        }
        Ok(())
    }

    /// The user key pair from the seed.
    pub fn key_pair(&self) -> Result<KeyPair, CredsError> {
        let kp = KeyPair::from_seed(&self.seed).map_err(|e| {
            CredsError::new(
                CredsErrorKind::Seed,
                format!("the nkey seed is not valid: {e}"),
            )
        })?;
        if kp.key_pair_type() != KeyPairType::User {
            return Err(CredsError::new(
                CredsErrorKind::Seed,
                format!(
                    "the nkey seed is a {:?} seed, expected a user seed (SU…)",
                    kp.key_pair_type()
                ),
            ));
        }
        Ok(kp)
    }

    /// The user public nkey (`U…`), which is also the JWT subject.
    pub fn public_key(&self) -> Result<String, CredsError> {
        Ok(self.key_pair()?.public_key())
    }

    /// Lowercase sha256 hex of the JWT text (the reference `credsFingerprint`).
    pub fn fingerprint(&self) -> String {
        fingerprint_jwt(&self.jwt)
    }

    /// The JWT claims, decoded without verification.
    pub fn claims(&self) -> Result<JwtClaims, CredsError> {
        decode_claims(&self.jwt)
    }

    /// Parses the standard `.creds` text and validates it (see [`Credential::new`]).
    pub fn parse(text: &str) -> Result<Credential, CredsError> {
        let jwt = decorated_block(text, "JWT")?;
        let seed = decorated_block(text, "SEED")?;
        Credential::new(jwt, seed)
    }

    /// The standard `.creds` text, byte for byte what `nsc`/jwt.go's `FormatUserConfig` writes.
    pub fn to_creds_text(&self) -> String {
        format!(
            "{JWT_BEGIN}\n{jwt}\n{JWT_END}\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\
             NKEYs are sensitive and should be treated as secrets.\n\n\
             {SEED_BEGIN}\n{seed}\n{SEED_END}\n\n\
             *************************************************************\n",
            jwt = self.jwt,
            seed = self.seed
        )
    }
}

/// Lowercase sha256 hex of a JWT's text.
pub fn fingerprint_jwt(jwt: &str) -> String {
    Sha256::digest(jwt.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn is_marker(line: &str) -> bool {
    line.len() >= 6 && line.starts_with("---") && line.ends_with("---")
}

/// The single line between a `---…BEGIN … <what>…---` marker and its `---…END…---` marker.
/// Lenient on dash counts, like the Go and async-nats parsers.
fn decorated_block(text: &str, what: &str) -> Result<String, CredsError> {
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if is_marker(line) && line.contains("BEGIN") && line.contains(what) {
            let value = lines.next().unwrap_or("");
            let end = lines.next().unwrap_or("");
            if value.is_empty() || is_marker(value) {
                return Err(CredsError::new(
                    CredsErrorKind::Format,
                    format!("the {what} block is empty"),
                ));
            }
            if !(is_marker(end) && end.contains("END")) {
                return Err(CredsError::new(
                    CredsErrorKind::Format,
                    format!("the {what} block is not closed by an END marker on the next line"),
                ));
            }
            if !value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '='))
            {
                return Err(CredsError::new(
                    CredsErrorKind::Format,
                    format!("the {what} block holds characters outside [A-Za-z0-9._=-]"),
                ));
            }
            return Ok(value.to_string());
        }
    }
    Err(CredsError::new(
        CredsErrorKind::Format,
        format!("no BEGIN … {what} block found (is this a NATS .creds file?)"),
    ))
}

/// Reads and validates a `.creds` file. Errors name the path.
pub fn read_creds_file(path: &Path) -> Result<Credential, CredsError> {
    let text = fs::read_to_string(path).map_err(|e| CredsError::io(path, "cannot read", e))?;
    Credential::parse(&text).map_err(|e| e.at(path))
}

/// Writes a credential to `path` atomically with mode 0600.
pub fn write_creds_file_atomic(path: &Path, cred: &Credential) -> Result<(), CredsError> {
    write_file_atomic(path, cred.to_creds_text().as_bytes(), 0o600)
}

/// Writes `bytes` to `path` so that readers see either the old file or the whole new one:
/// a temporary file in the same directory (created with `mode`), fsync, rename, then fsync of
/// the directory. The temporary file is removed on every failure path.
pub fn write_file_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CredsError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Some(file_name) = path.file_name() else {
        return Err(CredsError::new(CredsErrorKind::Io, "the path has no file name").at(path));
    };
    let tmp = dir.join(format!(
        ".{}.tmp.{}.{}",
        file_name.to_string_lossy(),
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let result = (|| -> Result<(), CredsError> {
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(mode);
        }
        let mut file = options
            .open(&tmp)
            .map_err(|e| CredsError::io(path, "cannot create the temporary file", e))?;
        file.write_all(bytes)
            .map_err(|e| CredsError::io(path, "cannot write the temporary file", e))?;
        file.sync_all()
            .map_err(|e| CredsError::io(path, "cannot fsync the temporary file", e))?;
        drop(file);
        fs::rename(&tmp, path)
            .map_err(|e| CredsError::io(path, "cannot rename the temporary file into place", e))?;
        // Make the rename itself durable. A directory that cannot be opened for sync (rare
        // filesystems) does not undo a rename that already happened, so this is best effort.
        if let Ok(d) = fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::{encode_user, UserClaimsSpec};

    fn sample() -> (KeyPair, Credential) {
        let account = KeyPair::new_account();
        let user = KeyPair::new_user();
        let jwt = encode_user(&account, &user.public_key(), &UserClaimsSpec::new("t")).unwrap();
        let cred = Credential::new(jwt, user.seed().unwrap()).unwrap();
        (account, cred)
    }

    #[test]
    fn creds_text_round_trips() {
        let (_, cred) = sample();
        let text = cred.to_creds_text();
        assert!(text.starts_with("-----BEGIN NATS USER JWT-----\n"));
        assert!(text.contains("\n------END USER NKEY SEED------\n"));
        let back = Credential::parse(&text).unwrap();
        assert_eq!(back, cred);
        assert_eq!(back.public_key().unwrap(), cred.claims().unwrap().sub);
    }

    #[test]
    fn fingerprint_is_lowercase_sha256_hex_of_the_jwt() {
        assert_eq!(
            fingerprint_jwt("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let (_, cred) = sample();
        assert_eq!(cred.fingerprint().len(), 64);
    }

    #[test]
    fn mismatched_seed_is_refused() {
        let (_, cred) = sample();
        let other = KeyPair::new_user().seed().unwrap();
        let err = Credential::new(cred.jwt.clone(), other).unwrap_err();
        assert_eq!(err.kind(), CredsErrorKind::Mismatch);
        let err = Credential::new(cred.jwt, KeyPair::new_account().seed().unwrap()).unwrap_err();
        assert_eq!(err.kind(), CredsErrorKind::Seed);
    }

    #[test]
    fn garbage_is_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.creds");
        fs::write(&path, "hello").unwrap();
        let err = read_creds_file(&path).unwrap_err();
        assert_eq!(err.kind(), CredsErrorKind::Format);
        let msg = err.to_string();
        assert!(msg.contains("bad.creds"), "{msg}");
        assert!(msg.contains("JWT"), "{msg}");
        let missing = read_creds_file(&dir.path().join("none.creds")).unwrap_err();
        assert_eq!(missing.kind(), CredsErrorKind::Io);
        assert!(missing.to_string().contains("none.creds"));
    }

    #[test]
    fn signature_verifies_and_tampering_is_caught() {
        let (account, cred) = sample();
        let claims = verify_signature(&cred.jwt).unwrap();
        assert_eq!(claims.iss, account.public_key());
        assert_eq!(claims.claim_type(), "user");
        let (h, _, s) = split_jwt(&cred.jwt).unwrap();
        let forged_body = BASE64URL_NOPAD.encode(br#"{"iss":"x"}"#);
        let forged = format!("{h}.{forged_body}.{s}");
        assert!(verify_signature(&forged).is_err());
        let mut claims = cred.claims().unwrap();
        claims.name = "changed".into();
        let other_body = BASE64URL_NOPAD.encode(
            serde_json::json!({"iss": claims.iss, "sub": claims.sub, "name": "changed"})
                .to_string()
                .as_bytes(),
        );
        let err = verify_signature(&format!("{h}.{other_body}.{s}")).unwrap_err();
        assert_eq!(err.kind(), CredsErrorKind::Signature);
    }

    #[test]
    fn atomic_write_is_0600_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("delivery.creds");
        let (_, cred) = sample();
        write_creds_file_atomic(&path, &cred).unwrap();
        let (_, cred2) = sample();
        write_creds_file_atomic(&path, &cred2).unwrap();
        assert_eq!(read_creds_file(&path).unwrap(), cred2);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["delivery.creds".to_string()]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        // A failed write (missing directory) leaves nothing behind and names the path.
        let err = write_creds_file_atomic(&dir.path().join("nope/x.creds"), &cred).unwrap_err();
        assert_eq!(err.kind(), CredsErrorKind::Io);
        assert!(err.to_string().contains("nope/x.creds"));
    }

    #[test]
    fn debug_never_prints_the_seed() {
        let (_, cred) = sample();
        assert!(!format!("{cred:?}").contains(&cred.seed));
    }
}
