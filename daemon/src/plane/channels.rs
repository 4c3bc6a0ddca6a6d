//! Delivery class of a channel, resolved fresh per post from `cotal_channels_<s>`:
//! `channel.deliveryClass ?? defaults.deliveryClass ?? "durable"` (defaults at key `=defaults`).
//! Read leader-served every time, never from a watch cache, so a class change applies to the
//! very next post.

use serde::Deserialize;

use crate::base::{Read, RowError, Rows};
use crate::plane::cache::{DecodedRead, View};
use crate::plane::PlaneCtx;

/// Key of the space defaults row.
pub const DEFAULTS_KEY: &str = "=defaults";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryClass {
    Live,
    Durable,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClassOnly {
    #[serde(default)]
    delivery_class: Option<String>,
}

/// The channels bucket.
#[derive(Clone)]
pub struct Channels {
    rows: Rows,
}

impl Channels {
    pub async fn open(ctx: &PlaneCtx) -> Result<Channels, RowError> {
        Ok(Channels {
            rows: Rows::open(
                &ctx.js,
                &ctx.names.channels_bucket(),
                ctx.config.request_bound,
            )
            .await?,
        })
    }

    /// The effective class of `channel`, fresh. A garbled row or an unknown class value counts
    /// as unset (falls through to the next level), never as a reason to drop a post.
    pub async fn class_of(&self, channel: &str) -> Result<DeliveryClass, RowError> {
        let (own, defaults) = tokio::join!(self.declared(channel), self.declared(DEFAULTS_KEY));
        Ok(resolve(own?, defaults?))
    }

    /// [`Channels::class_of`] through `view`.
    pub async fn class_of_in(
        &self,
        view: &View<'_>,
        channel: &str,
    ) -> Result<DeliveryClass, RowError> {
        match view {
            View::Proved(cache) => {
                // Each row's class decoded once per revision the cache holds.
                let class = |key: &str| match cache.read_decoded(key, |_, v| declared_by(v)) {
                    DecodedRead::Present(class, _) => *class,
                    DecodedRead::Absent { .. } => None,
                };
                Ok(resolve(class(channel), class(DEFAULTS_KEY)))
            }
            View::Leader => self.class_of(channel).await,
        }
    }

    async fn declared(&self, key: &str) -> Result<Option<DeliveryClass>, RowError> {
        Ok(declared_in(self.rows.read(key).await?))
    }
}

/// The class a read row declares (garbled or unknown = unset).
fn declared_in(read: Read) -> Option<DeliveryClass> {
    match read {
        Read::Absent { .. } => None,
        Read::Present(row) => declared_by(&row.value),
    }
}

/// The class a row's value declares (garbled or unknown = unset).
fn declared_by(value: &[u8]) -> Option<DeliveryClass> {
    serde_json::from_slice::<ClassOnly>(value)
        .ok()
        .and_then(|c| c.delivery_class)
        .and_then(|c| parse_class(&c))
}

pub fn parse_class(raw: &str) -> Option<DeliveryClass> {
    match raw {
        "live" => Some(DeliveryClass::Live),
        "durable" => Some(DeliveryClass::Durable),
        _ => None,
    }
}

/// `channel ?? defaults ?? durable`.
pub fn resolve(channel: Option<DeliveryClass>, defaults: Option<DeliveryClass>) -> DeliveryClass {
    channel.or(defaults).unwrap_or(DeliveryClass::Durable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_beats_defaults_beats_durable() {
        use DeliveryClass::*;
        assert_eq!(resolve(Some(Live), Some(Durable)), Live);
        assert_eq!(resolve(None, Some(Live)), Live);
        assert_eq!(resolve(None, None), Durable);
        assert_eq!(parse_class("bogus"), None);
    }
}
