//! Mention resolution against the presence roster (`cotal_presence_<s>`, key `<o>.<a>`).
//!
//! A mentioned name resolves to a peer only when exactly one *live* presence record carries
//! that `card.name` (compared lowercased) at the time the post is fanned out. Ambiguous or
//! unresolvable names yield no copy. A record counts as live when its `card.id` equals its key,
//! its status is not `offline` and its `ts` is within the liveness window (6000 ms).

use std::time::Duration;

use serde_json::Value;

use crate::base::{Read, RowError, Rows};
use crate::plane::cache::View;
use crate::plane::PlaneCtx;
use crate::wire::Principal;

/// Presence liveness window: a heartbeat older than this means offline.
pub const LIVENESS_WINDOW: Duration = Duration::from_millis(6000);

/// How one mentioned name resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    Unique(Principal),
    Ambiguous(usize),
    Unknown,
}

/// The live roster, read fresh from the leader: `(principal, lowercased card.name)`.
pub async fn live_roster(
    ctx: &PlaneCtx,
    now_ms: u64,
) -> Result<Vec<(Principal, String)>, RowError> {
    let bucket = ctx.names.presence_bucket();
    let rows = Rows::open(&ctx.js, &bucket, ctx.config.request_bound).await?;
    let keys = crate::base::keys(&ctx.js, &bucket, ">", ctx.config.request_bound).await?;
    let reads = futures::future::join_all(keys.iter().map(|k| rows.read(k))).await;
    let mut out = Vec::new();
    for (key, read) in keys.iter().zip(reads) {
        let Read::Present(row) = read? else { continue };
        let Ok(p) = serde_json::from_slice::<Value>(&row.value) else {
            continue;
        };
        if let Some(entry) = live_entry(key, &p, now_ms) {
            out.push(entry);
        }
    }
    Ok(out)
}

/// [`live_roster`] through `view` (a proved cache holds the whole bucket).
pub async fn live_roster_in(
    ctx: &PlaneCtx,
    view: &View<'_>,
    now_ms: u64,
) -> Result<Vec<(Principal, String)>, RowError> {
    let View::Proved(cache) = view else {
        return live_roster(ctx, now_ms).await;
    };
    Ok(cache
        .scan("")
        .into_iter()
        .filter_map(|(key, row)| {
            let p = serde_json::from_slice::<Value>(&row.value).ok()?;
            live_entry(&key, &p, now_ms)
        })
        .collect())
}

/// The roster entry of a presence record when it is live now (`inspect members` reads it too).
pub fn live_entry(key: &str, presence: &Value, now_ms: u64) -> Option<(Principal, String)> {
    let card = presence.get("card")?;
    if card.get("id")?.as_str()? != key {
        return None;
    }
    if presence.get("status").and_then(Value::as_str) == Some("offline") {
        return None;
    }
    let ts = presence.get("ts")?.as_u64()?;
    if now_ms.saturating_sub(ts) > LIVENESS_WINDOW.as_millis() as u64 {
        return None;
    }
    let name = card.get("name")?.as_str()?.trim().to_lowercase();
    Some((Principal::parse(key).ok()?, name))
}

/// Resolves one lowercased name over a roster.
pub fn resolve(roster: &[(Principal, String)], name: &str) -> Resolved {
    let hits: Vec<&Principal> = roster
        .iter()
        .filter(|(_, n)| n == name)
        .map(|(p, _)| p)
        .collect();
    match hits.len() {
        0 => Resolved::Unknown,
        1 => Resolved::Unique(hits[0].clone()),
        n => Resolved::Ambiguous(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_fresh_consistent_online_records_count() {
        let now = 100_000;
        let ok = json!({"card":{"id":"local.bob","name":"Bob"},"status":"idle","ts":now - 10});
        assert_eq!(
            live_entry("local.bob", &ok, now).unwrap().1,
            "bob".to_string()
        );
        assert!(live_entry("local.eve", &ok, now).is_none());
        let stale = json!({"card":{"id":"local.bob","name":"Bob"},"status":"idle","ts":now - 7000});
        assert!(live_entry("local.bob", &stale, now).is_none());
        let off = json!({"card":{"id":"local.bob","name":"Bob"},"status":"offline","ts":now});
        assert!(live_entry("local.bob", &off, now).is_none());
    }

    #[test]
    fn a_name_resolves_only_when_unique() {
        let a = Principal::parse("local.a").unwrap();
        let b = Principal::parse("local.b").unwrap();
        let roster = vec![
            (a.clone(), "x".to_string()),
            (b, "x".to_string()),
            (a.clone(), "y".to_string()),
        ];
        assert_eq!(resolve(&roster, "x"), Resolved::Ambiguous(2));
        assert_eq!(resolve(&roster, "y"), Resolved::Unique(a));
        assert_eq!(resolve(&roster, "z"), Resolved::Unknown);
    }
}
