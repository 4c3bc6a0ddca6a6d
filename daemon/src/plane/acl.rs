//! Read-ACL rows (`cotal_acl_<s>`, key `<o>.<a>.<uid>`): what a member may read *now*.
//!
//! The manager writes these rows at mint and remint; the daemon only reads them, leader-served,
//! fresh for every decision (a re-check against a cached ACL would not be a re-check).
//!
//! Retirement tombstone (our definition; the reference names the concept but not the field):
//! a retired lifecycle's row keeps its key and gains `"retired": true` and `"retiredAt": <epoch
//! ms>`. Either field marks the row retired. A retired lifecycle never comes back, so entries
//! addressed to it are deleted from `INBOX_<s>` the first time the reader meets them.

use std::sync::Arc;

use crate::base::{Read, RowError, Rows};
use crate::plane::cache::{DecodedRead, View};
use crate::plane::PlaneCtx;
use crate::wire::{LifecycleNames, LifecycleUid, Principal, SpaceNames};

pub use crate::wire::AclRecord;

/// What a leader-served read of one ACL row found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AclRow {
    Present {
        record: AclRecord,
        revision: u64,
    },
    /// No live row: the owner is unknown (which does not prove it is gone).
    Absent,
    /// A row that does not parse: treated like an absent one (defer), with the parse error.
    Garbled(RowDecodeError),
}

/// A stored row that does not parse as its record (a garbled ACL or member row). `kind()` says
/// how; `Display` is the parser's own words (what the reader's and the rails' texts quote) and
/// `source()` the parser's error.
#[derive(Debug, Clone)]
pub struct RowDecodeError {
    kind: RowDecodeErrorKind,
    source: Arc<serde_json::Error>,
}

/// How a stored row failed to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowDecodeErrorKind {
    /// The value is not JSON.
    Syntax,
    /// JSON, but not the record's shape (a field missing or of another type).
    Shape,
    /// The value ends before the JSON does.
    Truncated,
}

impl RowDecodeError {
    pub fn kind(&self) -> RowDecodeErrorKind {
        self.kind
    }
}

impl From<serde_json::Error> for RowDecodeError {
    fn from(e: serde_json::Error) -> RowDecodeError {
        use serde_json::error::Category;
        let kind = match e.classify() {
            Category::Data => RowDecodeErrorKind::Shape,
            Category::Eof => RowDecodeErrorKind::Truncated,
            Category::Syntax | Category::Io => RowDecodeErrorKind::Syntax,
        };
        RowDecodeError {
            kind,
            source: Arc::new(e),
        }
    }
}

impl std::fmt::Display for RowDecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.source.fmt(f)
    }
}

impl std::error::Error for RowDecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

/// Two decode errors are the same when they say the same of the same kind (rows compare by value).
impl PartialEq for RowDecodeError {
    fn eq(&self, other: &RowDecodeError) -> bool {
        self.kind == other.kind && self.source.to_string() == other.source.to_string()
    }
}

impl Eq for RowDecodeError {}

/// Why resolving a principal's single live lifecycle failed.
#[derive(Debug, Clone)]
pub enum AliasError {
    /// No live (present, not retired) ACL row `<o>.<a>.*`.
    None,
    /// More than one live row: refuse loudly, never pick one.
    Ambiguous(Vec<String>),
    Read(RowError),
}

impl AliasError {
    /// The refusal text for `principal`.
    pub fn describe(&self, principal: &Principal, verb: &str) -> String {
        match self {
            AliasError::None => format!(
                "{verb}: no read ACL on record for {principal} (not provisioned for durable delivery)"
            ),
            AliasError::Ambiguous(uids) => format!(
                "{verb}: {principal} has {} live ACL rows ({}); name the lifecycle with lifecycleUid - refusing to guess",
                uids.len(),
                uids.join(", ")
            ),
            AliasError::Read(e) => format!("{verb}: could not read the ACL rows of {principal}: {e}"),
        }
    }
}

/// The ACL bucket, read leader-served.
#[derive(Clone)]
pub struct Acls {
    rows: Rows,
    ctx: PlaneCtx,
}

impl Acls {
    pub async fn open(ctx: &PlaneCtx) -> Result<Acls, RowError> {
        let rows = Rows::open(&ctx.js, &ctx.names.acl_bucket(), ctx.config.request_bound).await?;
        Ok(Acls {
            rows,
            ctx: ctx.clone(),
        })
    }

    /// The row of one lifecycle, fresh from the leader.
    pub async fn read(&self, member: &Principal, uid: &LifecycleUid) -> Result<AclRow, RowError> {
        Ok(acl_row(
            self.rows.read(&SpaceNames::acl_key(member, uid)).await?,
        ))
    }

    /// The row of one lifecycle through `view`: the proved cache, or fresh from the leader.
    pub async fn read_in(
        &self,
        view: &View<'_>,
        member: &Principal,
        uid: &LifecycleUid,
    ) -> Result<AclRow, RowError> {
        match view {
            View::Proved(cache) => Ok(acl_row(cache.read(&SpaceNames::acl_key(member, uid)))),
            View::Leader => self.read(member, uid).await,
        }
    }

    /// [`Acls::read_in`] for the hot path: the proved cache hands out the row as decoded once
    /// per revision (`None` when absent, the parse error when garbled), the leader's read is
    /// decoded here.
    pub async fn read_shared_in(
        &self,
        view: &View<'_>,
        names: &LifecycleNames,
    ) -> Result<Option<Arc<AclDecoded>>, RowError> {
        match view {
            View::Proved(cache) => Ok(
                match cache.read_decoded(&names.acl_key, |_, bytes| decode(bytes)) {
                    DecodedRead::Present(row, _) => Some(row),
                    DecodedRead::Absent { .. } => None,
                },
            ),
            View::Leader => Ok(match self.read(&names.member, &names.uid).await? {
                AclRow::Present { record, .. } => Some(Arc::new(Ok(record))),
                AclRow::Absent => None,
                AclRow::Garbled(e) => Some(Arc::new(Err(e))),
            }),
        }
    }

    /// [`Acls::single_live`] through `view`.
    pub async fn single_live_in(
        &self,
        view: &View<'_>,
        member: &Principal,
    ) -> Result<(LifecycleUid, AclRecord), AliasError> {
        let View::Proved(cache) = view else {
            return self.single_live(member).await;
        };
        let prefix = format!("{}.", member.dot_form());
        let live: Vec<(LifecycleUid, AclRecord)> = cache
            .scan(&prefix)
            .into_iter()
            .filter_map(|(key, row)| {
                let uid = LifecycleUid::parse(key.strip_prefix(&prefix)?).ok()?;
                match acl_row(Read::Present(row)) {
                    AclRow::Present { record, .. } if !record.is_retired() => Some((uid, record)),
                    _ => None,
                }
            })
            .collect();
        one_live(live)
    }

    /// The principal's single live lifecycle: the one present, non-retired row `<o>.<a>.*`.
    pub async fn single_live(
        &self,
        member: &Principal,
    ) -> Result<(LifecycleUid, AclRecord), AliasError> {
        let filter = format!("{}.*", member.dot_form());
        let keys = crate::base::keys(
            &self.ctx.js,
            self.rows.bucket(),
            &filter,
            self.ctx.config.request_bound,
        )
        .await
        .map_err(AliasError::Read)?;
        let mut live = Vec::new();
        for key in keys {
            let Some(uid) = key
                .rsplit_once('.')
                .and_then(|(_, u)| LifecycleUid::parse(u).ok())
            else {
                continue;
            };
            if let AclRow::Present { record, .. } =
                self.read(member, &uid).await.map_err(AliasError::Read)?
            {
                if !record.is_retired() {
                    live.push((uid, record));
                }
            }
        }
        one_live(live)
    }
}

/// The single live row, or why there is none.
fn one_live(
    mut live: Vec<(LifecycleUid, AclRecord)>,
) -> Result<(LifecycleUid, AclRecord), AliasError> {
    match live.len() {
        0 => Err(AliasError::None),
        1 => Ok(live.remove(0)),
        _ => Err(AliasError::Ambiguous(
            live.iter().map(|(u, _)| u.to_string()).collect(),
        )),
    }
}

/// An ACL row's value as decoded: the record, or why it does not parse (a garbled row).
pub type AclDecoded = Result<AclRecord, RowDecodeError>;

fn decode(value: &[u8]) -> AclDecoded {
    serde_json::from_slice::<AclRecord>(value).map_err(RowDecodeError::from)
}

/// What one read of an ACL key means.
fn acl_row(read: Read) -> AclRow {
    match read {
        Read::Absent { .. } => AclRow::Absent,
        Read::Present(row) => match decode(&row.value) {
            Ok(record) => AclRow::Present {
                record,
                revision: row.revision,
            },
            Err(e) => AclRow::Garbled(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_follows_patterns_ceiling_and_tombstone() {
        let mut r = AclRecord::new(vec!["eng.>".into(), "general".into()], 1, 0);
        assert!(r.covers("eng.alerts"));
        assert!(r.covers("general"));
        assert!(!r.covers("ops"));
        r.issued_allow_subscribe = Some(vec!["general".into()]);
        assert!(!r.covers("eng.alerts"));
        assert!(r.covers("general"));
        r.retired_at = Some(5);
        assert!(!r.covers("general"));
        assert!(r.is_retired());
    }

    /// Mutation seen failing: a JSON value of another shape classified as `Syntax`.
    #[test]
    fn a_garbled_row_says_how_it_failed_to_parse() {
        let kind = |v: &[u8]| decode(v).map(|_| ()).map_err(|e| e.kind());
        assert_eq!(kind(b"not json"), Err(RowDecodeErrorKind::Syntax));
        assert_eq!(
            kind(br#"{"allowSubscribe": 3}"#),
            Err(RowDecodeErrorKind::Shape)
        );
        assert_eq!(
            kind(br#"{"allowSubscribe": ["#),
            Err(RowDecodeErrorKind::Truncated)
        );
        let e = decode(b"not json").expect_err("garbled");
        assert_eq!(e.to_string(), "expected ident at line 1 column 2");
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn the_row_shape_is_camel_case_and_omits_the_absent_tombstone() {
        let r = AclRecord::new(vec!["general".into()], 2, 7);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"allowSubscribe":["general"],"revision":2,"updatedAt":7})
        );
        let back: AclRecord = serde_json::from_str(
            r#"{"allowSubscribe":[],"revision":1,"updatedAt":1,"retired":true}"#,
        )
        .unwrap();
        assert!(back.is_retired());
    }
}
