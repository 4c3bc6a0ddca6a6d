//! The daemon's standing connections as the broker attributes them, and the membership feed's
//! own credential as its owner renews it: the connections the broker holds open for one of the
//! daemon's credentials (its `delivery` credential, counted by the user nkey the daemon was
//! started with; the workspace's `membership-rw` credential, by its nkey), how many, which JWT
//! each presents, and how many the broker closed because their credential expired; and the
//! owner's remint of `membership-rw.creds` (same nkey) into the store the daemon reads.

use std::time::Duration;

use cotal_delivery::base::{read_creds_file, write_creds_file_atomic};
use cotal_delivery::provision::{MintOptions, Profile};
use serde::Deserialize;

use super::verb::{Ctx, Kind, Profiled, Refs, Which};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;
use crate::rig::connz::ConnState;

pub const VERBS: &[&str] = &["remint_membership", "expect_credential_connections"];

/// Which of the daemon's standing credentials.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum StandingCreds {
    /// The `delivery` credential the daemon was started with (its nkey; the JWT it presents
    /// moves with each remint).
    Delivery,
    /// The membership feed's `membership-rw.creds` in the workspace.
    MembershipRw,
}

impl StandingCreds {
    fn name(self) -> &'static str {
        match self {
            StandingCreds::Delivery => "delivery",
            StandingCreds::MembershipRw => "membership-rw",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum FeedStep {
    RemintMembership {
        /// ms from now.
        lifetime: u64,
        /// Replaces the provisioned credential before anything starts and counts as the
        /// original (what the daemon is started with).
        #[serde(default)]
        original: bool,
    },
    ExpectCredentialConnections {
        /// The daemon whose credential is counted.
        daemon: String,
        creds: StandingCreds,
        /// Exactly this many open.
        #[serde(default)]
        open: Option<usize>,
        /// Each open one presents this JWT.
        #[serde(default)]
        jwt: Option<Which>,
        /// Exactly this many the broker closed because their credential expired.
        #[serde(default)]
        closed_expired: Option<usize>,
    },
}

/// The reason `/connz` gives a connection the broker closed at its JWT's expiry.
const EXPIRED: &str = "Authentication Expired";

impl Profiled for FeedStep {}

impl FeedStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            // Read once, unless the case gives a bound to wait for the counts.
            FeedStep::ExpectCredentialConnections { .. } => Some(Duration::ZERO),
            FeedStep::RemintMembership { .. } => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            FeedStep::RemintMembership { .. } => Refs::default(),
            FeedStep::ExpectCredentialConnections { daemon, .. } => {
                Refs::default().uses(Kind::Daemon, daemon)
            }
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            FeedStep::RemintMembership { lifetime, original } => {
                let space = w.mesh.space().clone();
                let path = w.mesh.workspace().membership_rw_creds_path(&space);
                let live = read_creds_file(&path)
                    .map_err(|e| Failure::could_not(format!("read {}: {e}", path.display())))?;
                if w.holdings.rw.original.is_none() {
                    w.holdings.rw.original = Some(live.clone());
                }
                let next = w.mesh.mint(
                    &space,
                    &Profile::MembershipRw,
                    MintOptions::new()
                        .renewal_of(&live)
                        .expires_in(Duration::from_millis(*lifetime)),
                )?;
                write_creds_file_atomic(&path, &next)
                    .map_err(|e| Failure::could_not(format!("write {}: {e}", path.display())))?;
                if *original {
                    w.holdings.rw.original = Some(next);
                    Ok("the owner replaces the membership-rw credential before the start (same nkey)".to_string())
                } else {
                    w.holdings.rw.written.push(next);
                    Ok(
                        "the owner remints the membership-rw credential (same nkey) into the store"
                            .to_string(),
                    )
                }
            }
            FeedStep::ExpectCredentialConnections {
                daemon,
                creds,
                open,
                jwt,
                closed_expired,
            } => {
                let (nkey, want_jwt) = attributed(w, daemon, *creds, *jwt)?;
                let mut expected = Vec::new();
                if let Some(n) = open {
                    expected.push(format!("{n} open"));
                }
                if let Some(j) = jwt {
                    expected.push(format!(
                        "each presenting the {} JWT",
                        match j {
                            Which::Original => "original",
                            Which::Latest => "latest reminted",
                        }
                    ));
                }
                if let Some(n) = closed_expired {
                    expected.push(format!("{n} closed by the broker at an expiry"));
                }
                let what = format!(
                    "connections of daemon {daemon}'s {} credential: {}",
                    creds.name(),
                    expected.join(", ")
                );
                let newest = loop {
                    let seen = census(w, &nkey, want_jwt.as_deref()).await?;
                    let met = open.is_none_or(|n| n == seen.open)
                        && seen.wrong_jwt == 0
                        && closed_expired.is_none_or(|n| n == seen.expired);
                    if met {
                        break seen.newest_ms;
                    }
                    if std::time::Instant::now() >= ctx.deadline {
                        return Err(Failure::new(
                            format!(
                                "{what} within {} ms",
                                ctx.deadline
                                    .saturating_duration_since(ctx.started)
                                    .as_millis()
                            ),
                            seen.to_string(),
                        ));
                    }
                    tokio::time::sleep(CENSUS_POLL.min(ctx.left())).await;
                };
                // Timed at the broker's stamp of the newest open one's start.
                if let Some(ms) = newest {
                    w.happened_at = Some(super::verb::instant_at_unix_ms(ms)?);
                }
                Ok(format!("the broker holds {what}"))
            }
        }
    }
}

/// How often the broker's connections are read again.
const CENSUS_POLL: Duration = Duration::from_millis(50);

/// What the broker holds for one user nkey, on every node.
struct Census {
    open: usize,
    /// Open ones presenting another JWT than the one wanted.
    wrong_jwt: usize,
    /// Closed by the broker at their credential's expiry.
    expired: usize,
    /// The newest open one's start, by the broker's stamp (unix ms).
    newest_ms: Option<i64>,
}

impl std::fmt::Display for Census {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} open", self.open)?;
        if self.wrong_jwt > 0 {
            write!(f, " ({} presenting another JWT)", self.wrong_jwt)?;
        }
        write!(f, ", {} closed at an expiry", self.expired)
    }
}

async fn census(w: &mut World, nkey: &str, jwt: Option<&str>) -> Result<Census, Failure> {
    let mut c = Census {
        open: 0,
        wrong_jwt: 0,
        expired: 0,
        newest_ms: None,
    };
    for i in 0..w.mesh.node_count() {
        let Some(node) = w.mesh.node_mut(i) else {
            continue;
        };
        if !node.is_running() {
            continue;
        }
        for conn in node.connz(ConnState::All).await? {
            if conn.user.as_deref() != Some(nkey) {
                continue;
            }
            match &conn.reason {
                None => {
                    c.open += 1;
                    if jwt.is_some_and(|j| conn.jwt.as_deref() != Some(j)) {
                        c.wrong_jwt += 1;
                    }
                    if let Some(us) = conn.start_unix_us() {
                        c.newest_ms = c.newest_ms.max(Some(us / 1000));
                    }
                }
                Some(r) if r == EXPIRED => c.expired += 1,
                Some(_) => {}
            }
        }
    }
    Ok(c)
}

/// The user nkey the broker attributes `creds` of `daemon` to, and the JWT wanted.
fn attributed(
    w: &World,
    daemon: &str,
    creds: StandingCreds,
    jwt: Option<Which>,
) -> Result<(String, Option<String>), Failure> {
    let (cred, original, latest) =
        match creds {
            StandingCreds::Delivery => {
                let path = w.daemon_creds.get(daemon).ok_or_else(|| {
                    Failure::could_not(format!("no daemon {daemon:?} was started"))
                })?;
                (
                    read_creds_file(path)
                        .map_err(|e| Failure::could_not(format!("read {}: {e}", path.display())))?,
                    w.remints.original.clone(),
                    w.remints.written.last().cloned(),
                )
            }
            StandingCreds::MembershipRw => {
                // Beside the delivery credential the daemon was started with: the workspace's, or
                // a standby host's own (a lane reads its space's credentials from its host's root).
                let delivery = w.daemon_creds.get(daemon).ok_or_else(|| {
                    Failure::could_not(format!("no daemon {daemon:?} was started"))
                })?;
                let workspace = w.mesh.workspace().membership_rw_creds_path(w.mesh.space());
                let path = delivery
                    .parent()
                    .map(|d| d.join(workspace.file_name().unwrap_or_default()))
                    .unwrap_or(workspace.clone());
                let cred = read_creds_file(&path)
                    .map_err(|e| Failure::could_not(format!("read {}: {e}", path.display())))?;
                let (original, latest) = if path == workspace {
                    (
                        w.holdings.rw.original.clone().or(Some(cred.clone())),
                        w.holdings.rw.written.last().cloned(),
                    )
                } else {
                    (Some(cred.clone()), None)
                };
                (cred, original, latest)
            }
        };
    let nkey = cred
        .public_key()
        .map_err(|e| Failure::could_not(e.to_string()))?;
    let want = match jwt {
        None => None,
        Some(Which::Original) => Some(
            original
                .ok_or_else(|| Failure::could_not("no original credential"))?
                .jwt,
        ),
        Some(Which::Latest) => Some(
            latest
                .ok_or_else(|| Failure::could_not("no remint was written"))?
                .jwt,
        ),
    };
    Ok((nkey, want))
}
