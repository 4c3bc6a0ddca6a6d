//! Reads of what the broker holds that several verb groups judge from: a stream's count on one
//! subject, a consumer's state, a row (leader-served), and the consumers a case names
//! (`fanout`, `reader`, `dlv:<agent>`).

use async_nats::jetstream::consumer::pull;
use cotal_delivery::wire::SpaceNames;
use futures::TryStreamExt;

use std::time::Duration;

use cotal_delivery::base::{Read, Rows};

use super::verb::{Kind, Refs};
use crate::kit::failure::Failure;
use crate::kit::world::World;
use crate::rig::mesh::Inspector;

/// Bound of one row read or write.
pub const ROW_BOUND: Duration = Duration::from_secs(5);

/// How many messages `stream` holds on exactly `subject` (leader-served stream info).
pub async fn count_on(insp: &Inspector, stream: &str, subject: &str) -> Result<u64, String> {
    let s = insp
        .js
        .get_stream_no_info(stream)
        .await
        .map_err(|e| format!("stream {stream}: {e}"))?;
    let mut info = s
        .info_with_subjects(subject)
        .await
        .map_err(|e| format!("stream {stream} info: {e}"))?;
    let mut n = 0;
    while let Some((subj, count)) = info
        .try_next()
        .await
        .map_err(|e| format!("stream {stream} subjects: {e}"))?
    {
        if subj == subject {
            n += count as u64;
        }
    }
    Ok(n)
}

/// A consumer's state from the broker.
pub async fn consumer_info(
    insp: &Inspector,
    stream: &str,
    name: &str,
) -> Result<async_nats::jetstream::consumer::Info, String> {
    let s = insp
        .js
        .get_stream_no_info(stream)
        .await
        .map_err(|e| format!("stream {stream}: {e}"))?;
    let mut c: async_nats::jetstream::consumer::Consumer<pull::Config> = s
        .get_consumer(name)
        .await
        .map_err(|e| format!("consumer {name}: {e}"))?;
    c.info()
        .await
        .cloned()
        .map_err(|e| format!("consumer {name} info: {e}"))
}

/// A row as the broker holds it (leader-served), as JSON.
pub async fn read_row(
    js: &async_nats::jetstream::Context,
    bucket: &str,
    key: &str,
) -> Result<Option<serde_json::Value>, String> {
    let rows = Rows::open(js, bucket, ROW_BOUND)
        .await
        .map_err(|e| format!("bucket {bucket}: {e}"))?;
    match rows
        .read(key)
        .await
        .map_err(|e| format!("read {key}: {e}"))?
    {
        Read::Present(r) => Ok(serde_json::from_slice(&r.value).ok()),
        Read::Absent { .. } => Ok(None),
    }
}

pub fn consumer_refs(consumer: &str) -> Refs {
    match consumer.strip_prefix("dlv:") {
        Some(agent) => Refs::default().uses(Kind::Agent, agent),
        None => Refs::default(),
    }
}

/// (stream, durable) of `fanout`, `reader` or `dlv:<agent>`.
pub fn resolve(w: &mut World, consumer: &str) -> Result<(String, String), Failure> {
    let names = w.insp.names.clone();
    match consumer {
        "fanout" => Ok((names.chat_stream(), "fanout".into())),
        "reader" => Ok((names.inbox_stream(), "reader".into())),
        other => match other.strip_prefix("dlv:") {
            Some(agent) => {
                let a = w.agent(agent)?;
                Ok((
                    names.dlv_stream(),
                    SpaceNames::dlv_durable(&a.material.principal, &a.material.lifecycle_uid),
                ))
            }
            None => Err(Failure::could_not(format!(
                "consumer {other:?} (fanout, reader or dlv:<agent>)"
            ))),
        },
    }
}

/// The connections every node of the mesh lists, open and closed, that `keep` accepts: how
/// many of a kind the broker ever saw.
pub async fn count_connections(
    mesh: &crate::rig::mesh::Mesh,
    keep: impl Fn(&crate::rig::connz::BrokerConn) -> bool,
) -> Result<usize, String> {
    use crate::rig::connz::ConnState;
    let mut n = 0;
    for i in 0..mesh.node_count() {
        if let Some(node) = mesh.node(i) {
            for state in [ConnState::Open, ConnState::Closed] {
                n += node
                    .connz(state)
                    .await
                    .map_err(|e| format!("/connz: {e}"))?
                    .iter()
                    .filter(|c| keep(c))
                    .count();
            }
        }
    }
    Ok(n)
}
