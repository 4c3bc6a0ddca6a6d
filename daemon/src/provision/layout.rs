//! The reference `.cotal/` project layout (docs/operations.md, "Files"): where a workspace root keeps
//! the signer, `server.conf`, and each space's daemon material.
//!
//! ```text
//! <root>/.cotal/auth/                       signer (broker.json, account.<key>.json), server.conf
//! <root>/.cotal/space.<key>/delivery.creds
//! <root>/.cotal/space.<key>/membership-rw.creds
//! <root>/.cotal/space.<key>/membership-observer.creds
//! <root>/.cotal/space.<key>/connection-evictor.creds   (optional)
//! <root>/.cotal/space.<key>/inspect.creds              (pending, members: read-only)
//! <root>/.cotal/space.<key>/membership.json            {"accountId": "<data account>"}
//! <root>/.cotal/delivery.<key>.pid
//! <root>/.cotal/delivery.<key>.log
//! ```
//!
//! `<key>` is the space name's UTF-8 bytes in lowercase hex. Every write here is atomic (temp
//! file in the same directory, fsync, rename) with mode 0600, so a crash never leaves a torn
//! credential for the daemon to read.

use std::path::{Path, PathBuf};

use super::authority::{create_private_dir, AuthorityError, MeshAuthority, MintOptions};
use super::profiles::{Profile, SystemProfile};
use super::server_conf::ServerConf;
use crate::base::{write_creds_file_atomic, write_file_atomic, Credential};
pub use crate::base::{
    CONNECTION_EVICTOR_CREDS_FILE, DELIVERY_CREDS_FILE, INSPECT_CREDS_FILE,
    MEMBERSHIP_OBSERVER_CREDS_FILE, MEMBERSHIP_RW_CREDS_FILE,
};
use crate::wire::Space;

pub const COTAL_DIR: &str = ".cotal";
pub const AUTH_DIR: &str = "auth";
pub const SERVER_CONF_FILE: &str = "server.conf";
pub const MEMBERSHIP_JSON_FILE: &str = "membership.json";

/// A workspace root and the paths under its `.cotal/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    pub fn new(root: impl Into<PathBuf>) -> Workspace {
        Workspace { root: root.into() }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn cotal_dir(&self) -> PathBuf {
        self.root.join(COTAL_DIR)
    }
    /// Signer files and `server.conf`.
    pub fn auth_dir(&self) -> PathBuf {
        self.cotal_dir().join(AUTH_DIR)
    }
    pub fn server_conf_path(&self) -> PathBuf {
        self.auth_dir().join(SERVER_CONF_FILE)
    }
    /// `.cotal/space.<key>/`
    pub fn space_dir(&self, space: &Space) -> PathBuf {
        self.cotal_dir().join(space.segment())
    }
    pub fn delivery_creds_path(&self, space: &Space) -> PathBuf {
        self.space_dir(space).join(DELIVERY_CREDS_FILE)
    }
    pub fn membership_rw_creds_path(&self, space: &Space) -> PathBuf {
        self.space_dir(space).join(MEMBERSHIP_RW_CREDS_FILE)
    }
    pub fn membership_observer_creds_path(&self, space: &Space) -> PathBuf {
        self.space_dir(space).join(MEMBERSHIP_OBSERVER_CREDS_FILE)
    }
    pub fn connection_evictor_creds_path(&self, space: &Space) -> PathBuf {
        self.space_dir(space).join(CONNECTION_EVICTOR_CREDS_FILE)
    }
    /// The read-only `inspector` credential of `pending` and `members`.
    pub fn inspect_creds_path(&self, space: &Space) -> PathBuf {
        self.space_dir(space).join(INSPECT_CREDS_FILE)
    }
    pub fn membership_json_path(&self, space: &Space) -> PathBuf {
        self.space_dir(space).join(MEMBERSHIP_JSON_FILE)
    }
    /// `.cotal/delivery.<key>.pid`
    pub fn pid_path(&self, space: &Space) -> PathBuf {
        self.cotal_dir()
            .join(format!("delivery.{}.pid", space.key()))
    }
    /// `.cotal/delivery.<key>.log`
    pub fn log_path(&self, space: &Space) -> PathBuf {
        self.cotal_dir()
            .join(format!("delivery.{}.log", space.key()))
    }

    /// Writes `server.conf` under `.cotal/auth/` atomically.
    pub fn write_server_conf(&self, conf: &ServerConf) -> Result<PathBuf, AuthorityError> {
        create_private_dir(&self.auth_dir())?;
        let path = self.server_conf_path();
        write_file_atomic(&path, conf.render().as_bytes(), 0o600)?;
        Ok(path)
    }

    /// Writes a space's daemon material into `.cotal/space.<key>/`, each file atomically.
    /// Credentials go first and `membership.json` last, so a reader that finds the account
    /// record also finds the credentials it describes.
    pub fn write_space_material(
        &self,
        space: &Space,
        material: &SpaceMaterial,
    ) -> Result<(), AuthorityError> {
        create_private_dir(&self.space_dir(space))?;
        write_creds_file_atomic(&self.delivery_creds_path(space), &material.delivery)?;
        write_creds_file_atomic(
            &self.membership_rw_creds_path(space),
            &material.membership_rw,
        )?;
        write_creds_file_atomic(
            &self.membership_observer_creds_path(space),
            &material.membership_observer,
        )?;
        if let Some(evictor) = &material.connection_evictor {
            write_creds_file_atomic(&self.connection_evictor_creds_path(space), evictor)?;
        }
        write_creds_file_atomic(&self.inspect_creds_path(space), &material.inspect)?;
        let json = format!(
            "{}\n",
            serde_json::json!({ "accountId": material.account_id })
        );
        write_file_atomic(&self.membership_json_path(space), json.as_bytes(), 0o600)?;
        Ok(())
    }
}

/// What a space's delivery daemon needs on disk.
#[derive(Debug, Clone)]
pub struct SpaceMaterial {
    pub delivery: Credential,
    pub membership_rw: Credential,
    pub membership_observer: Credential,
    /// Optional: without it eviction is refused (docs/admin.md).
    pub connection_evictor: Option<Credential>,
    /// The operator's read-only inspection credential (`pending`, `members`).
    pub inspect: Credential,
    /// The space's data account public key.
    pub account_id: String,
}

impl SpaceMaterial {
    /// Mints every daemon credential of `space` with the profiles' default lifetimes.
    pub fn mint(authority: &MeshAuthority, space: &Space) -> Result<SpaceMaterial, AuthorityError> {
        SpaceMaterial::mint_standing(authority, space, None)
    }

    /// [`SpaceMaterial::mint`] with another lifetime for the two standing credentials
    /// (`delivery`, `membership-rw`) when `standing` is given: `up --creds-lifetime-secs`, so a
    /// renewal owner can be shown to outlive it.
    pub fn mint_standing(
        authority: &MeshAuthority,
        space: &Space,
        standing: Option<std::time::Duration>,
    ) -> Result<SpaceMaterial, AuthorityError> {
        let options = || match standing {
            Some(ttl) => MintOptions::new().expires_in(ttl),
            None => MintOptions::new(),
        };
        Ok(SpaceMaterial {
            delivery: authority.mint(space, &Profile::Delivery, options())?,
            membership_rw: authority.mint(space, &Profile::MembershipRw, options())?,
            membership_observer: authority.mint_system(
                space,
                SystemProfile::MembershipObserver,
                MintOptions::new(),
            )?,
            connection_evictor: Some(authority.mint_system(
                space,
                SystemProfile::ConnectionEvictor,
                MintOptions::new(),
            )?),
            inspect: authority.mint(space, &Profile::Inspector, MintOptions::new())?,
            account_id: authority.account_public_key(space)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::read_creds_file;

    #[test]
    fn paths_follow_the_reference_layout() {
        let ws = Workspace::new("/r");
        let s = Space::parse("demo").unwrap();
        assert_eq!(ws.space_dir(&s), PathBuf::from("/r/.cotal/space.64656d6f"));
        assert_eq!(
            ws.delivery_creds_path(&s),
            PathBuf::from("/r/.cotal/space.64656d6f/delivery.creds")
        );
        assert_eq!(
            ws.pid_path(&s),
            PathBuf::from("/r/.cotal/delivery.64656d6f.pid")
        );
        assert_eq!(
            ws.log_path(&s),
            PathBuf::from("/r/.cotal/delivery.64656d6f.log")
        );
        assert_eq!(
            ws.server_conf_path(),
            PathBuf::from("/r/.cotal/auth/server.conf")
        );
        assert_eq!(
            ws.membership_json_path(&s),
            PathBuf::from("/r/.cotal/space.64656d6f/membership.json")
        );
    }

    #[test]
    fn space_material_is_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path());
        let s = Space::parse("demo").unwrap();
        let mut a = MeshAuthority::new();
        let acc = a.add_space(&s);
        let m = SpaceMaterial::mint(&a, &s).unwrap();
        ws.write_space_material(&s, &m).unwrap();
        assert_eq!(
            read_creds_file(&ws.delivery_creds_path(&s)).unwrap(),
            m.delivery
        );
        assert!(read_creds_file(&ws.connection_evictor_creds_path(&s)).is_ok());
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(ws.membership_json_path(&s)).unwrap())
                .unwrap();
        assert_eq!(json["accountId"], acc);
        let mut names: Vec<String> = std::fs::read_dir(ws.space_dir(&s))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![
                "connection-evictor.creds",
                "delivery.creds",
                "inspect.creds",
                "membership-observer.creds",
                "membership-rw.creds",
                "membership.json"
            ]
        );
        a.save(&ws.auth_dir()).unwrap();
        let conf = ServerConf::new().operator(a.operator_auth().unwrap());
        let path = ws.write_server_conf(&conf).unwrap();
        assert!(std::fs::read_to_string(path)
            .unwrap()
            .contains("resolver: MEMORY"));
    }
}
