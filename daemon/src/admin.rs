//! Verbs of the `ctl.delivery-admin` rail (supervisor-callable). Answered one at a time, in
//! arrival order (the rail module serialises them).

use serde_json::Value;

use crate::plane::PlaneCtx;
use crate::wire::Principal;

/// Dispatches one admin verb; returns the reply `data` or the refusal text.
pub async fn dispatch(
    _ctx: &PlaneCtx,
    _caller: &Principal,
    op: &str,
    _args: &Value,
) -> Result<Value, String> {
    Err(format!("unsupported delivery-admin op \"{op}\""))
}
