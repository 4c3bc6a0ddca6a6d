//! The `--cluster` shape the suites share: a 3-node loopback JetStream cluster (the harness's
//! `MeshBuilder::cluster`) with every stream and bucket of the space at R3, checked on the broker
//! before a suite measures anything on it.

use async_nats::jetstream::stream::Info;
use delivery_harness::rig::mesh::Inspector;
use futures::TryStreamExt;

/// Nodes of the `--cluster` mesh (and replicas of its streams and buckets).
pub const CLUSTER_NODES: usize = 3;

/// Nodes of the mesh a suite starts: [`CLUSTER_NODES`] on `--cluster`, else one broker.
pub fn nodes(cluster: bool) -> usize {
    if cluster {
        CLUSTER_NODES
    } else {
        1
    }
}

/// Checks on the broker that every stream of the space (buckets included) has `want`
/// replicas, and says so.
pub async fn replicas(insp: &Inspector, want: usize) -> Result<String, String> {
    let streams: Vec<Info> = insp
        .js
        .streams()
        .try_collect()
        .await
        .map_err(|e| e.to_string())?;
    let wrong: Vec<String> = streams
        .iter()
        .filter(|i| i.config.num_replicas.max(1) != want)
        .map(|i| format!("{} R{}", i.config.name, i.config.num_replicas))
        .collect();
    if streams.is_empty() || !wrong.is_empty() {
        return Err(format!(
            "the space's streams are not all at R{want}: {} of {} differ ({})",
            wrong.len(),
            streams.len(),
            wrong.join(", ")
        ));
    }
    Ok(format!(
        "every stream and bucket of the space at R{want} ({} streams, read from the broker)",
        streams.len()
    ))
}
