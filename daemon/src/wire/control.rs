//! The control rails' envelope: `{op,args,from}` requests and `{ok,data?,error?}` replies, as
//! the reference writes them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `ControlRequest` of the reference.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ControlRequest {
    pub op: String,
    #[serde(default)]
    pub args: Value,
    #[serde(default)]
    pub from: Value,
}

/// `ControlReply` of the reference.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct ControlReply {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ControlReply {
    pub fn ok(data: Value) -> ControlReply {
        ControlReply {
            ok: true,
            data: Some(data),
            error: None,
        }
    }
    pub fn refuse(error: impl Into<String>) -> ControlReply {
        ControlReply {
            ok: false,
            data: None,
            error: Some(error.into()),
        }
    }
}
