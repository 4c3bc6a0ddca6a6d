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

use crate::base::{check_same_store, StoreIdentity, SysAuthority};
use crate::plane::PlaneCtx;
use crate::rails::evict::{self, Kicker};
use crate::rails::{inventory, liveness, AdminParts};
use crate::wire::{
    AdminRequest, BrokerAccepted, ControlRequest, CredentialOutcome, Failed, Refusal, RefusalKind,
    ReloadCreds, ReloadStoreIdentity, ReloadedCredentials, ReplyData, StoreIdentityReply,
};

/// Bound on waiting for a reconnect onto an adopted credential before an admin request is
/// answered ("once that reconnect completes, or after 5s", docs/operations.md). A wait for a
/// reconnect, counted from the request, not one broker answer ([`crate::base::BROKER_BOUND`]).
pub const RECONNECT_WAIT_BOUND: Duration = Duration::from_secs(5);
/// Refusal of `reloadCreds` before start-up is complete (docs/operations.md's wording).
pub const NOT_STARTED: &str = "delivery: this daemon has not finished starting (its lease watch is not bound yet); nothing adopted - the next renewal pass or the daemon's own 75% re-read adopts the re-signed credential";

/// The credential verbs the admin rail serves, implemented by the space daemon's renewal (a ring
/// above this one): the rail only dispatches and shapes replies. A component's `Err` is the
/// text its `{ok: false, error}` result carries.
pub trait CredentialAdmin: Send + Sync {
    /// Waits, at most `bound`, until a reconnect onto an adopted credential has completed.
    fn settled(&self, bound: Duration) -> BoxFuture<'_, ()>;
    /// The reply to the request just answered has been published (or could not be): a reconnect
    /// onto a credential that request adopted may start its 250 ms count now.
    fn replied(&self);
    /// Proves and adopts a renewed delivery credential; what the broker accepted. The `Err` is
    /// a `String` because the text is the value: the component's `error` in the reply.
    fn reload_delivery<'a>(
        &'a self,
        expected: Option<&'a str>,
    ) -> BoxFuture<'a, Result<BrokerAccepted, String>>;
    /// Proves and adopts a renewed membership credential; the component's result (its `Err`,
    /// as the delivery one's, is the text of the component's `error`).
    fn reload_membership<'a>(
        &'a self,
        expected: Option<&'a str>,
    ) -> BoxFuture<'a, Result<CredentialOutcome, String>>;
    /// The identity of the store the daemon reloads its credential from, or the refusal that
    /// answers `reloadStoreIdentity` when it is unusable.
    fn store_identity(&self) -> Result<StoreIdentity, Refusal>;
}

/// Answers one admin request: waits for a reconnect in flight (a reply sent while the
/// connection is down would be lost), parses the verb, runs it.
pub async fn dispatch(
    ctx: &PlaneCtx,
    parts: &AdminParts,
    request: &ControlRequest,
) -> Result<ReplyData, Refusal> {
    let credentials = parts.credentials.as_deref();
    if let Some(renewal) = credentials {
        renewal.settled(RECONNECT_WAIT_BOUND).await;
    }
    match AdminRequest::parse(request)? {
        AdminRequest::ReloadCreds(args) => reload_creds(ctx, credentials, &args)
            .await
            .map(ReplyData::Credentials),
        AdminRequest::ReloadStoreIdentity(args) => {
            reload_store_identity(credentials, &args).map(ReplyData::StoreIdentity)
        }
        AdminRequest::LifecycleMemberships(args) => {
            inventory::lifecycle_memberships(ctx, &parts.fences, &parts.inventories, &args)
                .await
                .map(ReplyData::Inventory)
        }
        AdminRequest::EvictPrincipal(args) => {
            const VERB: &str = "evictPrincipal";
            let (sys, kicker) = eviction(parts, VERB)?;
            let mut results = evict::evict(VERB, sys, kicker, &[args.principal]).await?;
            results
                .pop()
                .map(ReplyData::Eviction)
                .ok_or_else(|| Refusal::new(RefusalKind::Unavailable, "evictPrincipal: no result"))
        }
        AdminRequest::EvictPrincipals(args) => {
            const VERB: &str = "evictPrincipals";
            let (sys, kicker) = eviction(parts, VERB)?;
            evict::evict(VERB, sys, kicker, &args.principals)
                .await
                .map(ReplyData::Evictions)
        }
        AdminRequest::PrincipalLiveness(args) => match parts.sys.as_deref() {
            Some(sys) => liveness::principal_liveness(sys, &args)
                .await
                .map(ReplyData::PrincipalLiveness),
            None => Err(Refusal::new(
                RefusalKind::Unwired,
                "principalLiveness: no liveness oracle wired on this daemon",
            )),
        },
        AdminRequest::PlaneConnLiveness(args) => match parts.sys.as_deref() {
            Some(sys) => liveness::plane_conn_liveness(sys, &args)
                .await
                .map(ReplyData::PlaneLiveness),
            None => Err(Refusal::new(
                RefusalKind::Unwired,
                "planeConnLiveness: no plane-liveness oracle wired on this daemon",
            )),
        },
    }
}

/// The eviction executor, or the reference refusal when none is wired.
fn eviction<'a>(
    parts: &'a AdminParts,
    verb: &str,
) -> Result<(&'a SysAuthority, &'a dyn Kicker), Refusal> {
    match (parts.sys.as_deref(), parts.kicker.as_deref()) {
        (Some(sys), Some(kicker)) => Ok((sys, kicker)),
        _ => Err(Refusal::new(
            RefusalKind::Unwired,
            format!("{verb}: no eviction executor wired on this daemon"),
        )),
    }
}

async fn reload_creds(
    ctx: &PlaneCtx,
    credentials: Option<&dyn CredentialAdmin>,
    args: &ReloadCreds,
) -> Result<ReloadedCredentials, Refusal> {
    if !ctx.startup_complete.load(Ordering::SeqCst) {
        return Err(Refusal::new(RefusalKind::NotStarted, NOT_STARTED));
    }
    let Some(renewal) = credentials else {
        return Err(Refusal::new(
            RefusalKind::Unwired,
            "delivery: this daemon has no renewal source; nothing adopted",
        ));
    };
    // Membership first: the delivery adoption schedules the reconnect relative to the reply.
    let membership = renewal
        .reload_membership(args.expected_membership.as_deref())
        .await;
    let delivery = renewal
        .reload_delivery(args.expected_delivery.as_deref())
        .await;
    let mut errors = Vec::new();
    let failed = |e: String| {
        CredentialOutcome::Failed(Failed {
            ok: false,
            error: e,
        })
    };
    let delivery = match delivery {
        Ok(accepted) => CredentialOutcome::Accepted(crate::wire::Accepted {
            ok: true,
            broker_accepted: accepted,
            resident_swap: None,
        }),
        Err(e) => {
            errors.push(format!("delivery: {e}"));
            failed(e)
        }
    };
    let membership = match membership {
        Ok(v) => v,
        Err(e) => {
            errors.push(format!("membership: {e}"));
            failed(e)
        }
    };
    // Both components are always reported; a failure of either makes the reply `ok:false`
    // and keeps that shape.
    let data = ReloadedCredentials {
        delivery,
        membership,
    };
    if errors.is_empty() {
        Ok(data)
    } else {
        Err(Refusal::new(
            RefusalKind::Credential,
            format!("reloadCreds: {}", errors.join("; ")),
        )
        .with_data(ReplyData::Credentials(data)))
    }
}

fn reload_store_identity(
    credentials: Option<&dyn CredentialAdmin>,
    args: &ReloadStoreIdentity,
) -> Result<StoreIdentityReply, Refusal> {
    let Some(renewal) = credentials else {
        return Err(Refusal::new(
            RefusalKind::Unwired,
            "delivery: this daemon has no renewal source",
        ));
    };
    let ours = renewal.store_identity()?;
    if let Some(challenge) = &args.expected {
        let theirs = StoreIdentity::from(challenge.clone());
        check_same_store(&ours, &theirs)
            .map_err(|e| Refusal::new(RefusalKind::Conflict, e.to_string()).source(e))?;
    }
    Ok(ours.reply())
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

/// [`scrub`] over an encoded reply: a JSON escape (`\n`, `\u001f`, …) stands for one
/// character that is never a hex digit, so it breaks a run as that character would, and the
/// result is the encoding of the reply with every string scrubbed.
pub fn scrub_json(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut plain = String::new();
    let mut chars = encoded.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            out.push_str(&scrub(&plain));
            plain.clear();
            out.push(c);
            match chars.next() {
                Some('u') => {
                    out.push('u');
                    out.extend(chars.by_ref().take(4));
                }
                Some(e) => out.push(e),
                None => {}
            }
        } else {
            plain.push(c);
        }
    }
    out.push_str(&scrub(&plain));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation seen failing: `scrub_json` without its escape handling (`\b` is a hex digit
    /// once written, and the 63-digit run after a backspace became a digest).
    #[test]
    fn digests_never_reach_a_reply() {
        let d = "a".repeat(64);
        assert_eq!(scrub(&format!("x {d} y")), "x [digest] y");
        assert_eq!(scrub("cafe 1234 ✓"), "cafe 1234 ✓");
        let encoded = serde_json::to_string(&serde_json::json!({"e": [format!("fp {d}")]}))
            .unwrap_or_default();
        assert_eq!(scrub_json(&encoded), r#"{"e":["fp [digest]"]}"#);
        let short = "b".repeat(63);
        let backspace = serde_json::to_string(&format!("\u{8}{short}")).unwrap_or_default();
        assert_eq!(
            scrub_json(&backspace),
            backspace,
            "63 digits after a control char"
        );
        let quoted = serde_json::to_string(&format!("\"{d}\"")).unwrap_or_default();
        assert_eq!(scrub_json(&quoted), r#""\"[digest]\"""#);
    }
}
