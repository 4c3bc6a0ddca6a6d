//! The system-account signing seed a space may retain for its multi-space host, and the two
//! short-lived `$SYS` users the host mints from it.
//!
//! Why: on a broker that hosts several spaces no space daemon may hold the broker-wide
//! evictor (docs/host.md, "Kicks"). The multi-space host is the one process that kicks,
//! and only when a space on its root retained the system-account seed
//! (`space.<key>/system-account.seed`). From it the host mints, per kick, a census user pinned
//! to the lane's account (CONNZ of that account only) and a kick-only user whose grants name
//! exactly the servers of the connections its census listed. Both live [`HOST_MINT_TTL`].

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use nkeys::{KeyPair, KeyPairType};

use super::authority::{AuthorityError, AuthorityErrorKind, MeshAuthority};
use super::jwt::{self, UserClaimsSpec};
use super::layout::Workspace;
use super::profiles::{js, Permissions, SystemProfile};
use crate::base::{write_file_atomic, Credential};
use crate::wire::Space;

/// `space.<key>/system-account.seed`: the retained system-account signing seed (optional).
pub const SYSTEM_SEED_FILE: &str = "system-account.seed";
/// Lifetime of a census or kick-only user the host mints (one kick call uses it once).
pub const HOST_MINT_TTL: Duration = Duration::from_secs(60);
/// The reply prefix the host's kick-only user may subscribe under.
pub const HOST_KICK_INBOX_PREFIX: &str = "_INBOX.cotal-host-kick";
/// JWT names of the two minted users (visible in the broker's `/connz` of `$SYS`).
pub const HOST_CENSUS_NAME: &str = "host-census";
pub const HOST_KICKER_NAME: &str = "host-kicker";

/// Where `space` keeps its retained seed under `ws`.
pub fn system_seed_path(ws: &Workspace, space: &Space) -> PathBuf {
    ws.space_dir(space).join(SYSTEM_SEED_FILE)
}

/// Provisioning: `space` on `ws` retains the system-account signing seed (mode 0600, atomic),
/// which makes a multi-space host on that root able to kick.
pub fn retain_system_seed(
    ws: &Workspace,
    space: &Space,
    authority: &MeshAuthority,
) -> Result<PathBuf, AuthorityError> {
    let seed = authority.system_account_seed()?;
    let path = system_seed_path(ws, space);
    write_file_atomic(&path, format!("{seed}\n").as_bytes(), 0o600)?;
    Ok(path)
}

/// A retained system-account key, checked to be an account seed.
pub struct RetainedSystemKey {
    key: KeyPair,
}

impl std::fmt::Debug for RetainedSystemKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RetainedSystemKey({})", self.key.public_key())
    }
}

impl RetainedSystemKey {
    /// Parses the file's text (one account seed, surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<RetainedSystemKey, AuthorityError> {
        let key = KeyPair::from_seed(text.trim()).map_err(|e| {
            AuthorityError::new(
                AuthorityErrorKind::Format,
                format!("the retained system-account seed is not a valid nkey seed: {e}"),
            )
        })?;
        if key.key_pair_type() != KeyPairType::Account {
            return Err(AuthorityError::new(
                AuthorityErrorKind::Format,
                format!(
                    "the retained system-account seed is a {:?} seed, not an account seed",
                    key.key_pair_type()
                ),
            ));
        }
        Ok(RetainedSystemKey { key })
    }

    pub fn public_key(&self) -> String {
        self.key.public_key()
    }

    /// A census user: CONNZ of `account` only (the observer profile), [`HOST_MINT_TTL`].
    pub fn mint_census(&self, account: &str) -> Result<Credential, AuthorityError> {
        self.sign(
            HOST_CENSUS_NAME,
            SystemProfile::MembershipObserver.permissions(account),
        )
    }

    /// A kick-only user: `$SYS.REQ.SERVER.<id>.KICK` for exactly `server_ids`, replies under
    /// [`HOST_KICK_INBOX_PREFIX`], nothing else, [`HOST_MINT_TTL`].
    pub fn mint_kick_only(
        &self,
        server_ids: &BTreeSet<String>,
    ) -> Result<Credential, AuthorityError> {
        let permissions = Permissions {
            pub_allow: server_ids
                .iter()
                .map(|id| js::sys_server_kick(id))
                .collect(),
            sub_allow: vec![format!("{HOST_KICK_INBOX_PREFIX}.>")],
            ..Permissions::default()
        };
        self.sign(HOST_KICKER_NAME, permissions)
    }

    fn sign(&self, name: &str, permissions: Permissions) -> Result<Credential, AuthorityError> {
        let user = KeyPair::new_user();
        let spec = UserClaimsSpec::new(name)
            .permissions(permissions)
            .expires_in(Some(HOST_MINT_TTL));
        let jwt = jwt::encode_user(&self.key, &user.public_key(), &spec)?;
        let seed = user.seed().map_err(|e| {
            AuthorityError::new(AuthorityErrorKind::UserKey, format!("no user seed: {e}"))
        })?;
        Ok(Credential::new(jwt, seed)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation seen failing: `mint_kick_only` granting `js::SYS_SERVER_KICK_ANY` (the grant
    /// names every server, not the listed ones).
    #[test]
    fn the_minted_users_are_census_of_one_account_and_kick_only_for_listed_servers() {
        let mut authority = MeshAuthority::new();
        let space = Space::parse("demo").unwrap();
        authority.add_space(&space);
        let key = RetainedSystemKey::parse(&authority.system_account_seed().unwrap()).unwrap();
        assert_eq!(key.public_key(), authority.system_account_public_key());
        let census = key.mint_census("AACC").unwrap().claims().unwrap();
        assert_eq!(census.iss, authority.system_account_public_key());
        assert_eq!(
            census.nats["pub"]["allow"],
            serde_json::json!(["$SYS.REQ.ACCOUNT.AACC.CONNZ"])
        );
        let servers: BTreeSet<String> = ["NS1".to_string()].into();
        let kick = key.mint_kick_only(&servers).unwrap().claims().unwrap();
        assert_eq!(
            kick.nats["pub"]["allow"],
            serde_json::json!(["$SYS.REQ.SERVER.NS1.KICK"])
        );
        assert_eq!(
            kick.nats["sub"]["allow"],
            serde_json::json!(["_INBOX.cotal-host-kick.>"])
        );
        assert!(kick.exp.is_some());
        // A user or operator seed is refused.
        assert!(RetainedSystemKey::parse(&KeyPair::new_user().seed().unwrap()).is_err());
        assert!(RetainedSystemKey::parse("garbage").is_err());
    }
}
