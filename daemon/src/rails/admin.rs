//! Verbs of the `ctl.delivery-admin` rail (supervisor-callable). Answered one at a time, in
//! arrival order (the rail module serialises them), except the `lifecycleMemberships`
//! inventory, answered beside them ([`crate::rails::inventory`]).
//!
//! Eviction (`evictPrincipal`, `evictPrincipals`) and liveness (`principalLiveness`,
//! `planeConnLiveness`) sweep through the `$SYS` pair ([`crate::rails::evict`],
//! [`crate::rails::liveness`]).
//!
//! `reloadCreds` adopts a renewed credential only once start-up is complete and only after the
//! broker accepted it on a disposable connection; `reloadStoreIdentity` says which store the
//! daemon reloads from and refuses a challenger that writes somewhere else. A request read while
//! the resident connection is moving onto an adopted credential waits for that reconnect
//! (bounded), because a reply sent while the connection is down would be lost.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{json, Value};

use crate::plane::PlaneCtx;
use crate::rails::evict::{self, Kicker};
use crate::rails::{inventory, liveness, AdminParts};
use crate::store::{check_same_store, StoreIdentity};
use crate::sys::SysAuthority;
use crate::wire::Principal;

/// Bound on waiting for a reconnect onto an adopted credential before an admin request is
/// answered ("once that reconnect completes, or after 5s", docs/operations.md). A wait for a
/// reconnect, counted from the request, not one broker answer ([`crate::tuning::BROKER_BOUND`]).
pub const RECONNECT_WAIT_BOUND: Duration = Duration::from_secs(5);
/// Refusal of `reloadCreds` before start-up is complete (the seeds' wording).
pub const NOT_STARTED: &str = "delivery: this daemon has not finished starting (its lease watch is not bound yet); nothing adopted - the next renewal pass or the daemon's own 75% re-read adopts the re-signed credential";

/// A refused admin verb: its text, and the reply `data` a verb keeps even when it fails
/// (`reloadCreds` answers `ok:false` with its per-component `delivery` / `membership` results).
#[derive(Debug, Clone, PartialEq)]
pub struct AdminRefusal {
    pub error: String,
    pub data: Option<Value>,
}

impl From<String> for AdminRefusal {
    fn from(error: String) -> AdminRefusal {
        AdminRefusal { error, data: None }
    }
}

/// The credential verbs the admin rail serves, implemented by the space daemon's renewal (a ring
/// above this one): the rail only dispatches and shapes replies.
pub trait CredentialAdmin: Send + Sync {
    /// Waits, at most `bound`, until a reconnect onto an adopted credential has completed.
    fn settled(&self, bound: Duration) -> BoxFuture<'_, ()>;
    /// The reply to the request just answered has been published (or could not be): a reconnect
    /// onto a credential that request adopted may start its 250 ms count now.
    fn replied(&self);
    /// Proves and adopts a renewed delivery credential; the reply's `brokerAccepted` object.
    fn reload_delivery<'a>(
        &'a self,
        expected: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Value, String>>;
    /// Proves and adopts a renewed membership credential; the component's result object.
    fn reload_membership<'a>(
        &'a self,
        expected: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Value, String>>;
    /// The identity of the store the daemon reloads its credential from.
    fn store_identity(&self) -> Result<StoreIdentity, String>;
}

/// Dispatches one admin verb; returns the reply `data` or the refusal text.
pub async fn dispatch(
    ctx: &PlaneCtx,
    parts: &AdminParts,
    _caller: &Principal,
    op: &str,
    args: &Value,
) -> Result<Value, AdminRefusal> {
    let credentials = parts.credentials.as_deref();
    if let Some(renewal) = credentials {
        renewal.settled(RECONNECT_WAIT_BOUND).await;
    }
    let args = &args_object(args);
    let result = match op {
        "reloadCreds" => reload_creds(ctx, credentials, args).await,
        "reloadStoreIdentity" => reload_store_identity(credentials, args).map_err(Into::into),
        _ => retirement_verb(ctx, parts, op, args)
            .await
            .map_err(Into::into),
    };
    match result {
        Ok(v) => Ok(scrub_value(v)),
        Err(r) => Err(AdminRefusal {
            error: scrub(&r.error),
            data: r.data.map(scrub_value),
        }),
    }
}

/// The retirement verbs: inventories, verified eviction and the liveness oracles.
async fn retirement_verb(
    ctx: &PlaneCtx,
    parts: &AdminParts,
    op: &str,
    args: &Value,
) -> Result<Value, String> {
    match op {
        "lifecycleMemberships" => {
            inventory::lifecycle_memberships(ctx, &parts.fences, &parts.inventories, args).await
        }
        "evictPrincipal" => {
            let (sys, kicker) = eviction(parts, "evictPrincipal")?;
            let principal = evict::principal_arg("evictPrincipal", args.get("principal"))?;
            evict::evict("evictPrincipal", sys, kicker, &[principal])
                .await
                .and_then(|mut r| r.pop().ok_or_else(|| "evictPrincipal: no result".into()))
                .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
        }
        "evictPrincipals" => {
            let (sys, kicker) = eviction(parts, "evictPrincipals")?;
            let principals = evict::principals_arg(args)?;
            evict::evict("evictPrincipals", sys, kicker, &principals)
                .await
                .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
        }
        "principalLiveness" => match parts.sys.as_deref() {
            Some(sys) => liveness::principal_liveness(sys, args).await,
            None => Err("principalLiveness: no liveness oracle wired on this daemon".into()),
        },
        "planeConnLiveness" => match parts.sys.as_deref() {
            Some(sys) => liveness::plane_conn_liveness(sys, args).await,
            None => Err("planeConnLiveness: no plane-liveness oracle wired on this daemon".into()),
        },
        _ => Err(format!(
            "op \"{op}\" not supported on the delivery admin service"
        )),
    }
}

/// `args` as sent, or an empty object when absent.
fn args_object(args: &Value) -> Value {
    match args {
        Value::Null => Value::Object(Default::default()),
        other => other.clone(),
    }
}

/// The eviction executor, or the reference refusal when none is wired.
fn eviction<'a>(
    parts: &'a AdminParts,
    verb: &str,
) -> Result<(&'a SysAuthority, &'a dyn Kicker), String> {
    match (parts.sys.as_deref(), parts.kicker.as_deref()) {
        (Some(sys), Some(kicker)) => Ok((sys, kicker)),
        _ => Err(format!("{verb}: no eviction executor wired on this daemon")),
    }
}

fn expected<'a>(args: &'a Value, component: &str) -> Option<&'a str> {
    args.get("expected")
        .and_then(|e| e.get(component))
        .and_then(Value::as_str)
}

async fn reload_creds(
    ctx: &PlaneCtx,
    credentials: Option<&dyn CredentialAdmin>,
    args: &Value,
) -> Result<Value, AdminRefusal> {
    if !ctx.startup_complete.load(Ordering::SeqCst) {
        return Err(NOT_STARTED.to_string().into());
    }
    let Some(renewal) = credentials else {
        return Err(
            "delivery: this daemon has no renewal source; nothing adopted"
                .to_string()
                .into(),
        );
    };
    // Membership first: the delivery adoption schedules the reconnect relative to the reply.
    let membership = renewal
        .reload_membership(expected(args, "membership"))
        .await;
    let delivery = renewal.reload_delivery(expected(args, "delivery")).await;
    let mut errors = Vec::new();
    let delivery_json = match delivery {
        Ok(accepted) => json!({"ok": true, "brokerAccepted": accepted}),
        Err(e) => {
            errors.push(format!("delivery: {e}"));
            json!({"ok": false, "error": e})
        }
    };
    let membership_json = match membership {
        Ok(v) => v,
        Err(e) => {
            errors.push(format!("membership: {e}"));
            json!({"ok": false, "error": e})
        }
    };
    // Both components are always reported; a failure of either makes the reply `ok:false`
    // and keeps that shape (reference §C.3).
    let data = json!({"delivery": delivery_json, "membership": membership_json});
    if errors.is_empty() {
        Ok(data)
    } else {
        Err(AdminRefusal {
            error: format!("reloadCreds: {}", errors.join("; ")),
            data: Some(data),
        })
    }
}

fn reload_store_identity(
    credentials: Option<&dyn CredentialAdmin>,
    args: &Value,
) -> Result<Value, String> {
    let Some(renewal) = credentials else {
        return Err("delivery: this daemon has no renewal source".into());
    };
    let ours = renewal.store_identity()?;
    if let Some(challenge) = args.get("expected").filter(|v| !v.is_null()) {
        let theirs = StoreIdentity::from_json(challenge)
            .map_err(|e| format!("delivery: reloadStoreIdentity: {e}"))?;
        check_same_store(&ours, &theirs).map_err(|e| e.to_string())?;
    }
    Ok(ours.to_json())
}

/// Replaces any run of exactly 64 hex characters (a fingerprint) so none reaches a reply.
pub fn scrub(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let run = bytes[i..]
            .iter()
            .take_while(|b| b.is_ascii_hexdigit())
            .count();
        if run == 0 {
            let ch = text[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
            continue;
        }
        if run >= 64 {
            out.push_str("[digest]");
        } else {
            out.push_str(&text[i..i + run]);
        }
        i += run;
    }
    out
}

fn scrub_value(v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(scrub(&s)),
        Value::Array(a) => Value::Array(a.into_iter().map(scrub_value).collect()),
        Value::Object(o) => {
            Value::Object(o.into_iter().map(|(k, v)| (k, scrub_value(v))).collect())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_never_reach_a_reply() {
        let d = "a".repeat(64);
        assert_eq!(scrub(&format!("x {d} y")), "x [digest] y");
        assert_eq!(scrub("cafe 1234 ✓"), "cafe 1234 ✓");
        let v = scrub_value(json!({"e": [format!("fp {d}")]}));
        assert_eq!(v, json!({"e": ["fp [digest]"]}));
    }
}
