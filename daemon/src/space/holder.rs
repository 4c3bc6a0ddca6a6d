//! Whose lease row refuses a claim, judged from the broker: whether its holder still has a
//! connection there, and when the row expires.
//!
//! Why: a row the claim lost to is either a live daemon's or one a crashed holder left behind
//! until the bucket TTL expires it. Saying "another delivery daemon is running" for the second
//! sends an operator looking for a process that does not exist; saying when the row expires
//! tells them when a start will serve. The proof is the broker's: a complete `$SYS` CONNZ sweep
//! of the space's account, from one server, with no connection authenticated by the holder's
//! credential (the daemon's own connection, which presents the same credential, excepted).

use std::time::Duration;

use async_nats::jetstream;

use crate::base::{Rows, SysAuthority};
use crate::wire::{LeaseInfo, SpaceNames, LEASE_KEY};

/// The words of the refusal whose row belongs to a holder that is not running (`up` tells that
/// refusal from a live holder's by them).
pub const NOT_RUNNING_HOLDER: &str = "belongs to a holder that is not running";

/// What proved a holder not running, as every line that says so names it: the broker's CONNZ
/// sweep, not the holder's pid record (a pid record says nothing of a holder on another host,
/// nor of a `--spaces` lane, which writes none).
pub const NOT_RUNNING_PROOF: &str = "no connection of its credential is on the broker";

/// The connection name of a standby lane's lease watch (`host/standby_watch.rs`). It presents
/// the lane's own credential but serves nothing, so it never proves a holder running: a host
/// standing by for the row its own closed lane left behind would otherwise read that row's
/// holder as live on every retry.
pub const STANDBY_WATCH_CONNECTION: &str = "cotal:delivery-standby-watch";

/// The live lease row and how long until the bucket's TTL expires it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRow {
    pub info: LeaseInfo,
    /// From now until the row expires unless its holder renews it (zero once due).
    pub expires_in: Duration,
}

impl HeldRow {
    /// The seconds until expiry, rounded up (a row due in 0.2 s is said to expire in 1 s).
    pub fn expires_in_secs(&self) -> u64 {
        self.expires_in.as_millis().div_ceil(1000) as u64
    }
}

/// Reads the lease row from the leader, dated by the broker; `None` when there is none (or it
/// cannot be read: the caller then says nothing about it).
pub async fn held_row(rows: &Rows, ttl: Duration) -> Option<HeldRow> {
    let (row, written_ms) = rows.read_dated(LEASE_KEY).await.ok()??;
    let info = serde_json::from_slice::<LeaseInfo>(&row.value).ok()?;
    let due_ms = written_ms.saturating_add(ttl.as_millis() as u64);
    let now_ms = crate::base::epoch_ms();
    Some(HeldRow {
        info,
        expires_in: Duration::from_millis(due_ms.saturating_sub(now_ms)),
    })
}

/// What the broker shows of a row's holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderState {
    /// Connections authenticated with the holder's credential are on the broker.
    Connected,
    /// A complete single-server sweep of the account shows none: the holder is not running.
    NotRunning { account: String },
    /// Not proved either way (an incomplete sweep, a cluster, no observer).
    Unproved { why: String },
}

/// Judges `holder` (`local.<user nkey>`) by one CONNZ sweep of the account through the `$SYS`
/// observer. `except` is a connection not to count (`(server id, cid)`): the caller's own,
/// which presents the same credential. A standby's lease watch is never counted either
/// ([`STANDBY_WATCH_CONNECTION`]).
pub async fn holder_state(
    authority: &SysAuthority,
    holder: &str,
    except: Option<(&str, u64)>,
) -> HolderState {
    let nkey = holder.strip_prefix("local.").unwrap_or(holder);
    let sweep = match crate::rails::observed_sweep("lease holder", authority).await {
        Ok(s) => s,
        Err(why) => {
            return HolderState::Unproved {
                why: why.to_string(),
            }
        }
    };
    let connected = sweep.rows.iter().any(|r| {
        let its = r.user_nkey.as_deref() == Some(nkey)
            || r.principal.as_ref().map(|p| p.dot_form()).as_deref() == Some(holder);
        its && except != Some((r.server_id.as_str(), r.cid))
            && r.name.as_deref() != Some(STANDBY_WATCH_CONNECTION)
    });
    if connected {
        return HolderState::Connected;
    }
    match crate::rails::shortfall(&sweep, "whether the lease holder runs") {
        None => HolderState::NotRunning {
            account: authority.account.clone(),
        },
        Some(why) => HolderState::Unproved { why },
    }
}

/// The lease TTL: the bucket's `max_age` (set at provisioning), or the provisioning default
/// when the bucket declares none (the reference `LEASE_TTL_MS`).
pub async fn lease_ttl(js: &jetstream::Context, names: &SpaceNames) -> Duration {
    let stream = SpaceNames::kv_stream(&names.delivery_bucket());
    match js.get_stream(stream).await {
        Ok(mut s) => match s.info().await {
            Ok(info) if info.config.max_age > Duration::ZERO => info.config.max_age,
            _ => crate::provision::DEFAULT_LEASE_TTL,
        },
        Err(_) => crate::provision::DEFAULT_LEASE_TTL,
    }
}
