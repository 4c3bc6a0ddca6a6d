//! Verbs of the `ctl.delivery` rail (agent-callable). Each returns the reply `data` or the refusal text; the rail
//! module owns envelopes, caller identity and reply binding.

use serde_json::Value;

use crate::plane::PlaneCtx;
use crate::wire::Principal;

/// `ctl.delivery` verbs (agent-callable).
pub async fn delivery(
    _ctx: &PlaneCtx,
    _caller: &Principal,
    op: &str,
    _args: &Value,
) -> Result<Value, String> {
    Err(format!(
        "op \"{op}\" not supported on the delivery control service"
    ))
}
