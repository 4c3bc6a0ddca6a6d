//! The host's kicker: on a multi-space host the host is the only process that kicks.
//!
//! Why: the evictor's KICK permission is broker-wide, so on a broker that hosts several spaces
//! no space daemon (lane) may hold it (docs/host.md, "Kicks"). A lane's verified eviction
//! still scans its own account through its own observer, but hands the live matches to the
//! host through the rails' [`Kicker`] seam. Per call the host
//! 1. finds a space on its root that retained the system-account signing seed (in manifest
//!    order); none means no kick authority, and a seed of another system account than the one
//!    that issued the lane's `$SYS` observer is inconsistent authority: either refuses;
//! 2. takes its own census of the lane's account, through a census user it mints from that seed
//!    (CONNZ of that one account), paginated and complete, or it kicks nothing;
//! 3. kicks only the targets the census lists with the same server, cid and principal, through
//!    a kick-only user minted from the seed whose grants name exactly those servers.
//!
//! The lane opens no kick credential: its evictor file is never read for a kick.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::base::{sweep, ConnRow, Credential, SweepLimits};
use crate::provision::Workspace;
use crate::provision::{
    system_seed_path, RetainedSystemKey, HOST_KICK_INBOX_PREFIX, SYSTEM_SEED_FILE,
};
use crate::rails::{kick_all, KickOutcome, Kicker};
use crate::wire::{Refusal, RefusalKind, Space, MEMBERSHIP_OBSERVER_INBOX_PREFIX};

/// The census connection's name as the broker shows it.
pub const HOST_CENSUS_CONNECTION: &str = "cotal-delivery-host-census";
/// The kick-only connection's name as the broker shows it.
pub const HOST_KICKER_CONNECTION: &str = "cotal-delivery-host-kicker";
/// Bound on dialing the census or kick-only user.
const DIAL_BOUND: Duration = crate::base::BROKER_BOUND;

/// The host side of eviction, shared by every lane of one host.
pub struct HostKicker {
    root: PathBuf,
    /// The manifest's spaces: where a retained seed is looked for, in this order.
    spaces: Vec<Space>,
    server_url: String,
    tls_ca: Option<PathBuf>,
    limits: SweepLimits,
}

impl HostKicker {
    pub fn new(
        root: PathBuf,
        spaces: Vec<Space>,
        server_url: String,
        tls_ca: Option<PathBuf>,
    ) -> Arc<HostKicker> {
        HostKicker::with_limits(root, spaces, server_url, tls_ca, SweepLimits::default())
    }

    /// [`HostKicker::new`] whose census sweeps with `limits` (the host's tuning).
    pub fn with_limits(
        root: PathBuf,
        spaces: Vec<Space>,
        server_url: String,
        tls_ca: Option<PathBuf>,
        limits: SweepLimits,
    ) -> Arc<HostKicker> {
        Arc::new(HostKicker {
            root,
            spaces,
            server_url,
            tls_ca,
            limits,
        })
    }

    /// The kicker the lane of `space`, serving `account`, asks.
    pub fn for_lane(self: &Arc<Self>, space: &Space, account: &str) -> Arc<dyn Kicker> {
        Arc::new(LaneKicker {
            host: self.clone(),
            space: space.clone(),
            account: account.to_string(),
        })
    }

    /// [`HostKicker::retained_key`], checked against the system account that issued the lane's
    /// `$SYS` observer: a seed of another system account is inconsistent authority and refuses.
    async fn authority(&self, verb: &str, lane: &Space) -> Result<RetainedSystemKey, Refusal> {
        let key = self.retained_key(verb).await?;
        let path = Workspace::new(&self.root).membership_observer_creds_path(lane);
        let shown = path.display().to_string();
        let issuer = tokio::task::spawn_blocking(move || {
            crate::base::read_creds_file(&path)
                .map_err(|e| e.detail().to_string())
                .and_then(|c| c.claims().map_err(|e| e.detail().to_string()))
                .map(|c| c.iss)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
        .map_err(|e| {
            authority(format!("{verb}: the delivery host could not read lane {lane}'s $SYS observer at {shown} ({e})"))
        })?;
        if issuer != key.public_key() {
            return Err(authority(format!(
                "{verb}: the delivery host's kick authority is inconsistent: the retained system-account seed is of {}, but lane {lane}'s $SYS observer was issued by {issuer} - no kick",
                key.public_key()
            )));
        }
        Ok(key)
    }

    /// The first retained system-account seed of the host's spaces (read off the async
    /// workers), or the refusal saying the host has no kick authority.
    async fn retained_key(&self, verb: &str) -> Result<RetainedSystemKey, Refusal> {
        let ws = Workspace::new(&self.root);
        let paths: Vec<PathBuf> = self
            .spaces
            .iter()
            .map(|s| system_seed_path(&ws, s))
            .collect();
        let read = tokio::task::spawn_blocking(move || {
            for path in paths {
                match std::fs::read_to_string(&path) {
                    Ok(text) => return Ok(Some((path, text))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(format!("{}: {e}", path.display())),
                }
            }
            Ok(None)
        })
        .await
        .map_err(|e| {
            authority(format!(
                "{verb}: the delivery host could not read its kick authority ({e})"
            ))
        })?;
        match read {
            Ok(Some((path, text))) => RetainedSystemKey::parse(&text).map_err(|e| {
                authority(format!(
                    "{verb}: the delivery host has no usable kick authority ({}: {e})",
                    path.display()
                ))
            }),
            Ok(None) => Err(authority(format!(
                "{verb}: the delivery host has no kick authority: no space on {} retained the system-account signing seed ({SYSTEM_SEED_FILE}); a lane opens no kick credential of its own, so live connections are not evicted here",
                self.root.display()
            ))),
            Err(e) => Err(authority(format!(
                "{verb}: the delivery host could not read its kick authority ({e})"
            ))),
        }
    }

    async fn dial(
        &self,
        credential: &Credential,
        inbox_prefix: &str,
        name: &str,
    ) -> Result<async_nats::Client, crate::base::ClientError> {
        crate::base::connect_with_inbox(
            &self.server_url,
            self.tls_ca.as_deref(),
            credential,
            name,
            inbox_prefix,
            DIAL_BOUND,
        )
        .await
    }

    /// The census, then the kicks of what it lists (see the module doc).
    async fn kick(
        &self,
        verb: &str,
        lane: &Space,
        account: &str,
        targets: &[ConnRow],
    ) -> Result<Vec<KickOutcome>, Refusal> {
        let key = self.authority(verb, lane).await?;
        let census_cred = key.mint_census(account).map_err(|e| {
            authority(format!(
                "{verb}: the delivery host could not mint its census ({e})"
            ))
        })?;
        let census = self
            .dial(
                &census_cred,
                MEMBERSHIP_OBSERVER_INBOX_PREFIX,
                HOST_CENSUS_CONNECTION,
            )
            .await
            .map_err(|e| {
                Refusal::new(
                    RefusalKind::Unavailable,
                    format!("{verb}: the delivery host's census could not connect ({e})"),
                )
                .source(e)
            })?;
        let seen = sweep(&census, account, &self.limits).await;
        let _ = census.drain().await;
        if !seen.complete() {
            let why = format!(
                "the delivery host's census of account {account} under-reported - not kicked"
            );
            return Ok(targets.iter().map(|_| Err(why.clone())).collect());
        }
        let listed: BTreeMap<(&str, u64), &ConnRow> = seen
            .rows
            .iter()
            .map(|r| ((r.server_id.as_str(), r.cid), r))
            .collect();
        let mut results: Vec<KickOutcome> = Vec::with_capacity(targets.len());
        let mut kick: Vec<(usize, ConnRow)> = Vec::new();
        for (i, t) in targets.iter().enumerate() {
            match listed.get(&(t.server_id.as_str(), t.cid)) {
                Some(row) if row.principal == t.principal => {
                    results.push(Ok(()));
                    kick.push((i, t.clone()));
                }
                _ => results.push(Err(format!(
                    "KICK cid {} on {} refused by the delivery host: its own census of account {account} does not list that connection",
                    t.cid, t.server_id
                ))),
            }
        }
        if kick.is_empty() {
            return Ok(results);
        }
        let servers: BTreeSet<String> = kick.iter().map(|(_, t)| t.server_id.clone()).collect();
        let kicker_cred = key.mint_kick_only(&servers).map_err(|e| {
            authority(format!(
                "{verb}: the delivery host could not mint its kicker ({e})"
            ))
        })?;
        let kicker = self
            .dial(&kicker_cred, HOST_KICK_INBOX_PREFIX, HOST_KICKER_CONNECTION)
            .await
            .map_err(|e| {
                Refusal::new(
                    RefusalKind::Unavailable,
                    format!("{verb}: the delivery host's kicker could not connect ({e})"),
                )
                .source(e)
            })?;
        let rows: Vec<ConnRow> = kick.iter().map(|(_, t)| t.clone()).collect();
        let outcomes = kick_all(&kicker, &rows).await;
        let _ = kicker.drain().await;
        for ((i, _), outcome) in kick.iter().zip(outcomes) {
            results[*i] = outcome;
        }
        Ok(results)
    }
}

/// A missing, unreadable or inconsistent kick authority of the host.
fn authority(text: String) -> Refusal {
    Refusal::new(RefusalKind::Authority, text)
}

/// One lane's view of the host kicker: every kick is confined to the lane's account.
struct LaneKicker {
    host: Arc<HostKicker>,
    space: Space,
    account: String,
}

impl Kicker for LaneKicker {
    fn kick<'a>(
        &'a self,
        verb: &'a str,
        targets: &'a [ConnRow],
    ) -> BoxFuture<'a, Result<Vec<KickOutcome>, Refusal>> {
        Box::pin(self.host.kick(verb, &self.space, &self.account, targets))
    }
}
