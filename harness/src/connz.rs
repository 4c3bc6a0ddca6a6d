//! The broker's own view of its connections (`/connz` on the monitoring port), as tests read it.
//!
//! Why one reader: a test proves who is connected (or was, and why it closed) from the broker,
//! never from the daemon's word, and every such read wants the same page (every account, auth
//! details, up to [`CONNZ_PAGE_CONNECTIONS`]) and the same few fields.

use serde_json::Value;

use crate::broker::Broker;
use crate::error::HarnessError;

/// Connections asked for in one `/connz` page: far above what any test opens, so one page is
/// the whole list.
pub const CONNZ_PAGE_CONNECTIONS: usize = 4096;

/// Which connections a `/connz` read lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    Open,
    /// Closed connections the broker still remembers (with the reason they closed).
    Closed,
    All,
}

impl ConnState {
    fn query(self) -> &'static str {
        match self {
            ConnState::Open => "open",
            ConnState::Closed => "closed",
            ConnState::All => "all",
        }
    }
}

/// One connection as `/connz?auth=1` lists it.
#[derive(Debug, Clone)]
pub struct BrokerConn {
    pub cid: u64,
    /// The client's connection name (`""` when it gave none).
    pub name: String,
    /// The account it is bound to (its public key; `""` when the broker names none).
    pub account: String,
    /// The user it authenticated as (the user nkey under operator mode).
    pub user: Option<String>,
    /// The user JWT it presented.
    pub jwt: Option<String>,
    /// The JWT's tags (`principal:<o>.<a>`, …).
    pub tags: Vec<String>,
    /// Why it closed (closed connections only).
    pub reason: Option<String>,
    /// When it connected, as the broker reports it (RFC 3339, UTC).
    pub start: String,
    /// The whole row, for the fields a single test needs.
    pub raw: Value,
}

impl BrokerConn {
    fn of(raw: &Value) -> BrokerConn {
        let text = |k: &str| raw[k].as_str().map(str::to_string);
        BrokerConn {
            cid: raw["cid"].as_u64().unwrap_or(0),
            name: text("name").unwrap_or_default(),
            account: text("account").unwrap_or_default(),
            user: text("authorized_user"),
            jwt: text("jwt"),
            tags: raw["tags"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            reason: text("reason"),
            start: text("start").unwrap_or_default(),
            raw: raw.clone(),
        }
    }

    /// Whether the connection's JWT carries the tag `principal:<principal>`.
    pub fn is_principal(&self, principal: &str) -> bool {
        let tag = format!("principal:{principal}");
        self.tags.contains(&tag)
    }
}

impl Broker {
    /// Every connection in `state`, in every account, with its auth details.
    pub async fn connz(&self, state: ConnState) -> Result<Vec<BrokerConn>, HarnessError> {
        let page = self
            .monitor(&format!(
                "/connz?auth=1&limit={CONNZ_PAGE_CONNECTIONS}&state={}",
                state.query()
            ))
            .await?;
        Ok(page["connections"]
            .as_array()
            .map(|rows| rows.iter().map(BrokerConn::of).collect())
            .unwrap_or_default())
    }

    /// The connections in `state` whose client name is `name`.
    pub async fn connz_named(
        &self,
        state: ConnState,
        name: &str,
    ) -> Result<Vec<BrokerConn>, HarnessError> {
        let mut rows = self.connz(state).await?;
        rows.retain(|c| c.name == name);
        Ok(rows)
    }
}
