//! The broker's own view of its connections (`/connz` on the monitoring port), as tests read it.
//!
//! Why one reader: a test proves who is connected (or was, and why it closed) from the broker,
//! never from the daemon's word, and every such read wants the same page (every account, auth
//! details, up to [`CONNZ_PAGE_CONNECTIONS`]) and the same few fields.

use serde_json::Value;

use crate::rig::broker::Broker;
use crate::rig::error::HarnessError;

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
    /// The subjects it subscribes to (read by [`Broker::connz_subscribed`] only; empty
    /// otherwise).
    pub subs: Vec<String>,
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
            subs: raw["subscriptions_list"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            start: text("start").unwrap_or_default(),
            raw: raw.clone(),
        }
    }

    /// Whether one of its subscriptions (as [`Broker::connz_subscribed`] lists them) receives a
    /// message published on `subject`.
    pub fn subscribes_to(&self, subject: &str) -> bool {
        self.subs.iter().any(|s| subject_matches(s, subject))
    }

    /// Whether the connection's JWT carries the tag `principal:<principal>`.
    pub fn is_principal(&self, principal: &str) -> bool {
        let tag = format!("principal:{principal}");
        self.tags.contains(&tag)
    }
}

impl BrokerConn {
    /// When the broker accepted the connection, as unix microseconds.
    pub fn start_unix_us(&self) -> Option<i64> {
        rfc3339_unix_us(&self.start)
    }
}

/// Whether the subscription `pattern` (tokens, `*` one token, a last `>` one or more) receives a
/// message on the literal `subject`.
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut subject = subject.split('.');
    for p in pattern.split('.') {
        match (p, subject.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (p, Some(s)) if p == s => {}
            _ => return false,
        }
    }
    subject.next().is_none()
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` as unix microseconds: the broker's stamps
/// (`/connz` trims trailing zeros of the fraction and writes the host's offset; advisories keep
/// nine digits, in UTC).
pub fn rfc3339_unix_us(text: &str) -> Option<i64> {
    let (date, rest) = text.split_once('T')?;
    let (time, offset_s) = if let Some(t) = rest.strip_suffix('Z') {
        (t, 0)
    } else {
        let at = rest.rfind(['+', '-'])?;
        let (t, off) = rest.split_at(at);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let (oh, om) = off[1..].split_once(':')?;
        (
            t,
            sign * (oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60),
        )
    };
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let us: i64 = format!("{frac:0<6}").get(..6)?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let local = (((days * 24 + hh) * 60 + mm) * 60 + ss) * 1_000_000 + us;
    Some(local - offset_s * 1_000_000)
}

impl Broker {
    /// Every connection in `state`, in every account, with its auth details.
    pub async fn connz(&self, state: ConnState) -> Result<Vec<BrokerConn>, HarnessError> {
        self.connz_page(state, "").await
    }

    /// Every connection in `state`, as [`Broker::connz`] lists them, with its subscriptions.
    pub async fn connz_subscribed(
        &self,
        state: ConnState,
    ) -> Result<Vec<BrokerConn>, HarnessError> {
        self.connz_page(state, "&subs=1").await
    }

    async fn connz_page(
        &self,
        state: ConnState,
        extra: &str,
    ) -> Result<Vec<BrokerConn>, HarnessError> {
        let page = self
            .monitor(&format!(
                "/connz?auth=1{extra}&limit={CONNZ_PAGE_CONNECTIONS}&state={}",
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation seen failing: `>` matching no token (a reply leaf's `ctl.x.>` misses
    /// `ctl.x.a`), and a pattern shorter than the subject matching it (`a.*` takes `a.b.c`).
    #[test]
    fn subscriptions_match_as_the_broker_matches_them() {
        for (pattern, subject, want) in [
            (
                "cotal.demo.ctl.delivery-admin.*.*",
                "cotal.demo.ctl.delivery-admin.o.a",
                true,
            ),
            (
                "cotal.demo.ctl.delivery-admin.*.*",
                "cotal.demo.ctl.delivery.o.a",
                false,
            ),
            (
                "cotal.demo.ctl.delivery-admin.*.*",
                "cotal.demo.ctl.delivery-admin.o",
                false,
            ),
            ("a.*", "a.b.c", false),
            ("a.>", "a.b.c", true),
            ("a.>", "a", false),
            ("a.b", "a.b", true),
        ] {
            assert_eq!(
                subject_matches(pattern, subject),
                want,
                "{pattern} {subject}"
            );
        }
    }

    /// Mutation seen failing: the offset added instead of subtracted (`+01:00` read an hour late).
    #[test]
    fn broker_stamps_are_read_in_utc_whatever_their_offset() {
        assert_eq!(rfc3339_unix_us("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            rfc3339_unix_us("2026-11-30T15:40:01.123456789Z"),
            Some(1_796_053_201_123_456)
        );
        assert_eq!(
            rfc3339_unix_us("2026-11-30T16:40:01.5+01:00"),
            Some(1_796_053_201_500_000)
        );
        assert_eq!(
            rfc3339_unix_us("2026-11-30T10:10:01-05:30"),
            Some(1_796_053_201_000_000)
        );
        assert_eq!(rfc3339_unix_us("yesterday"), None);
    }
}
