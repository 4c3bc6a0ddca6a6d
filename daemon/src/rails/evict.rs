//! Verified eviction: `evictPrincipal` and `evictPrincipals` (up to 256 principals, one shared
//! sweep).
//!
//! A retirement must prove the retired principal's connections are gone, not merely ask. So the
//! daemon scans its account's connections through the `$SYS` observer, kicks each match, and
//! re-scans to verify, failing closed whenever a scan under-reports. Targets come only from the
//! scan. The kick itself goes through a [`Kicker`]: a single-space daemon opens its evictor
//! credential per call ([`EvictorKicker`]); on a multi-space host the lane instead asks the host
//! (`host::kicker`), which kicks only after its own census lists the connection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use serde_json::Value;

use crate::base::{ConnRow, SysAuthority};
use crate::wire::{EvictionResult, Principal, Refusal, RefusalKind};
/// KICK requests kept in flight together.
pub const KICKS_IN_FLIGHT: usize = 16;
/// Bound on one KICK request.
pub const KICK_BOUND: Duration = Duration::from_millis(2000);
/// Verify re-scans after the kicks.
pub const MAX_VERIFY_ROUNDS: usize = 3;

/// One target's kick: `Err` is the note its result carries (a `String` because the text is the
/// value: the eviction result's `note`, composed by the single-space and the host kickers alike).
pub type KickOutcome = Result<(), String>;

/// Kicks connections a sweep found. One outcome per target, in order; `Err` refuses the whole
/// eviction (no kick authority here).
pub trait Kicker: Send + Sync {
    fn kick<'a>(
        &'a self,
        verb: &'a str,
        targets: &'a [ConnRow],
    ) -> BoxFuture<'a, Result<Vec<KickOutcome>, Refusal>>;
}

/// The single-space kicker: the evictor credential, opened per call, re-checked against the
/// observer, up to [`KICKS_IN_FLIGHT`] KICKs at a time.
pub struct EvictorKicker {
    pub authority: Arc<SysAuthority>,
}

impl Kicker for EvictorKicker {
    fn kick<'a>(
        &'a self,
        verb: &'a str,
        targets: &'a [ConnRow],
    ) -> BoxFuture<'a, Result<Vec<KickOutcome>, Refusal>> {
        Box::pin(async move {
            let checked = self.authority.pair(verb).await?;
            let evictor = self.authority.evictor(verb, checked)?;
            let client = self
                .authority
                .dial(&evictor, "_INBOX", "cotal-delivery-evictor")
                .await
                .map_err(|e| {
                    Refusal::new(
                        RefusalKind::Unavailable,
                        format!("{verb}: the $SYS evictor could not connect ({e})"),
                    )
                    .source(e)
                })?;
            let results = kick_all(&client, targets).await;
            let _ = client.drain().await;
            Ok(results)
        })
    }
}

/// KICKs every target through `client`, up to [`KICKS_IN_FLIGHT`] at a time; one result per
/// target, in order.
pub async fn kick_all(client: &async_nats::Client, targets: &[ConnRow]) -> Vec<KickOutcome> {
    let work: Vec<_> = targets
        .iter()
        .cloned()
        .map(|t| {
            let client = client.clone();
            async move { kick_one(&client, &t).await }
        })
        .collect();
    futures::stream::iter(work)
        .buffered(KICKS_IN_FLIGHT)
        .collect()
        .await
}

async fn kick_one(client: &async_nats::Client, target: &ConnRow) -> KickOutcome {
    let subject = format!("$SYS.REQ.SERVER.{}.KICK", target.server_id);
    let body = serde_json::json!({"cid": target.cid}).to_string();
    let refused = |why: String| {
        format!(
            "KICK cid {} on {} refused: {why}",
            target.cid, target.server_id
        )
    };
    let answer = tokio::time::timeout(KICK_BOUND, client.request(subject, body.into()))
        .await
        .map_err(|_| refused(format!("no answer within {} ms", KICK_BOUND.as_millis())))?
        .map_err(|e| refused(e.to_string()))?;
    let v: Value = serde_json::from_slice(&answer.payload).unwrap_or(Value::Null);
    if !v["error"].is_null() {
        return Err(refused(
            v["error"]["description"]
                .as_str()
                .unwrap_or("unknown")
                .to_string(),
        ));
    }
    Ok(())
}

/// Evicts `principals` with one shared sweep: scan, kick every match, re-scan to verify. One
/// result per principal, in order. `Err` is a refusal of the whole request.
pub async fn evict(
    verb: &str,
    authority: &SysAuthority,
    kicker: &dyn Kicker,
    principals: &[Principal],
) -> Result<Vec<EvictionResult>, Refusal> {
    let observer = authority.observer(verb).await?;
    let out = evict_with(verb, authority, kicker, &observer, principals).await;
    let _ = observer.drain().await;
    out
}

async fn evict_with(
    verb: &str,
    authority: &SysAuthority,
    kicker: &dyn Kicker,
    observer: &async_nats::Client,
    principals: &[Principal],
) -> Result<Vec<EvictionResult>, Refusal> {
    let mut results: Vec<EvictionResult> = principals
        .iter()
        .map(|p| EvictionResult {
            principal: p.dot_form(),
            kicked: 0,
            remaining: 0,
            verified_gone: false,
            scan_complete: false,
            note: None,
        })
        .collect();
    let index: BTreeMap<&Principal, usize> =
        principals.iter().enumerate().map(|(i, p)| (p, i)).collect();
    let matches = |rows: &[ConnRow]| -> Vec<(usize, ConnRow)> {
        rows.iter()
            .filter_map(|r| {
                r.principal
                    .as_ref()
                    .and_then(|p| index.get(p))
                    .map(|i| (*i, r.clone()))
            })
            .collect()
    };

    let first = authority.sweep(observer).await;
    if !first.complete() {
        for r in &mut results {
            r.note = Some(
                "CONNZ scan under-reported (no responder or truncated) - eviction UNKNOWN, not attempted"
                    .into(),
            );
        }
        return Ok(results);
    }
    let mut targets = matches(&first.rows);
    let mut open: BTreeSet<usize> = targets.iter().map(|(i, _)| *i).collect();
    for (i, r) in results.iter_mut().enumerate() {
        if !open.contains(&i) {
            r.verified_gone = true;
            r.scan_complete = true;
            r.note = Some("principal not currently live - nothing to evict".into());
        }
    }
    if targets.is_empty() {
        // Nothing live: verified gone without touching the kick authority.
        return Ok(results);
    }
    for round in 1..=MAX_VERIFY_ROUNDS {
        let rows: Vec<ConnRow> = targets.iter().map(|(_, r)| r.clone()).collect();
        let kicked = kicker.kick(verb, &rows).await?;
        for ((i, _), outcome) in targets.iter().zip(kicked) {
            match outcome {
                Ok(()) => results[*i].kicked += 1,
                Err(e) => results[*i].note = Some(e),
            }
        }
        let verify = authority.sweep(observer).await;
        if !verify.complete() {
            for i in &open {
                let r = &mut results[*i];
                r.scan_complete = false;
                r.note.get_or_insert_with(|| {
                    "verify re-scan under-reported - eviction UNKNOWN".into()
                });
            }
            return Ok(results);
        }
        targets = matches(&verify.rows);
        let still: BTreeMap<usize, u64> = targets.iter().fold(BTreeMap::new(), |mut m, (i, _)| {
            *m.entry(*i).or_insert(0) += 1;
            m
        });
        for i in open.clone() {
            if !still.contains_key(&i) {
                let r = &mut results[i];
                r.verified_gone = true;
                r.scan_complete = true;
                r.remaining = 0;
                open.remove(&i);
            }
        }
        if open.is_empty() {
            return Ok(results);
        }
        if round == MAX_VERIFY_ROUNDS {
            for (i, n) in still {
                let r = &mut results[i];
                r.remaining = n;
                r.scan_complete = true;
                r.note.get_or_insert_with(|| {
                    format!("{n} connection(s) still live after {MAX_VERIFY_ROUNDS} verify rounds - is deny-new committed?")
                });
            }
        }
    }
    Ok(results)
}
