//! The space a point measures: bulk rows written straight into the buckets in the daemon's own
//! shapes, pipelined, and wiped again before the next point.
//!
//! Bulk agents have an owner of their own ([`BULK_OWNER`]) and bulk channels a first segment of
//! their own ([`BULK_SEGMENT`]), so one filtered purge per bucket removes a point's rows and
//! nothing else: the workload channel's members, joined through the daemon, stay.

use std::future::IntoFuture;
use std::time::Instant;

use async_nats::jetstream::context::PublishAckFuture;
use async_nats::HeaderMap;
use bytes::Bytes;
use cotal_delivery::wire::{AclRecord, LifecycleUid, Principal, SpaceNames};
use delivery_harness::rig::mesh::Inspector;
use serde_json::json;

use super::err;

/// Owner of every bulk agent: a derived owner token (`u_` and 26 of `[a-z2-7]`), so no agent
/// the benchmark connects shares it.
pub const BULK_OWNER: &str = "u_bulkbulkbulkbulkbulkbulkbu";
/// First segment of every bulk channel (`bulk.ch<N>`, `bulk.big`, …).
pub const BULK_SEGMENT: &str = "bulk";
/// Publishes of the provisioning kept unacknowledged at once.
pub const PROVISION_WINDOW_MESSAGES: usize = 2_000;

/// One point's space: `agents` bulk agents, each with its ACL row and a presence row, joined
/// durably to `joins` of `channels` bulk channels (spread evenly: agent i joins channels
/// i × joins, i × joins + 1, … modulo `channels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shape {
    pub agents: usize,
    pub channels: usize,
    pub joins: usize,
}

impl Shape {
    /// Members-registry rows.
    pub fn rows(&self) -> usize {
        self.agents * self.joins
    }

    /// Members of each channel.
    pub fn members_per_channel(&self) -> usize {
        self.rows() / self.channels.max(1)
    }

    /// Checks the shape can be written (each agent joins distinct channels).
    pub fn check(&self) -> Result<(), String> {
        if self.agents == 0 || self.joins == 0 || self.channels < self.joins {
            return Err(format!(
                "a point of {} agents, {} channels and {} joins each: an agent joins 1 to `channels` distinct channels",
                self.agents, self.channels, self.joins
            ));
        }
        Ok(())
    }

    pub fn words(&self) -> String {
        format!(
            "{} agents x {} joins over {} channels = {} rows",
            self.agents,
            self.joins,
            self.channels,
            self.rows()
        )
    }
}

/// The bulk channel `n`.
pub fn channel(n: usize) -> String {
    format!("{BULK_SEGMENT}.ch{n}")
}

/// A bulk agent of actor `actor`.
pub fn bulk_principal(actor: &str) -> Result<Principal, String> {
    Principal::new(BULK_OWNER, actor).map_err(err)
}

/// `$KV.<bucket>.<key>`.
pub fn kv(bucket: &str, key: &str) -> String {
    format!("$KV.{bucket}.{key}")
}

/// A window of pipelined publishes: at most [`PROVISION_WINDOW_MESSAGES`] unacknowledged.
pub struct Pipe<'a> {
    insp: &'a Inspector,
    acks: Vec<PublishAckFuture>,
    pub written: usize,
}

impl<'a> Pipe<'a> {
    pub fn new(insp: &'a Inspector) -> Pipe<'a> {
        Pipe {
            insp,
            acks: Vec::with_capacity(PROVISION_WINDOW_MESSAGES),
            written: 0,
        }
    }

    pub async fn put(
        &mut self,
        subject: String,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<(), String> {
        self.acks.push(
            self.insp
                .js
                .publish_with_headers(subject, headers, body)
                .await
                .map_err(err)?,
        );
        self.written += 1;
        if self.acks.len() >= PROVISION_WINDOW_MESSAGES {
            self.settle().await?;
        }
        Ok(())
    }

    /// Waits for every publish sent so far to be stored.
    pub async fn settle(&mut self) -> Result<(), String> {
        settle_acks(&mut self.acks).await
    }
}

async fn settle_acks(acks: &mut Vec<PublishAckFuture>) -> Result<(), String> {
    for r in futures::future::join_all(acks.drain(..).map(|a| a.into_future())).await {
        r.map_err(|e| format!("provisioning write: {e}"))?;
    }
    Ok(())
}

/// A durable member row as a join writes it (generation 1, join cursor 0: every post is in
/// its interval).
pub fn member_row(channel: &str, who: &Principal, uid: &LifecycleUid, now: u64) -> Vec<u8> {
    json!({
        "channel": channel, "owner": who.dot_form(), "lifecycleUid": uid.as_str(),
        "state": "durable-active", "joinCursor": 0, "activated": true, "generation": 1,
        "writerIdentity": "local.bench-scale", "updatedAt": now,
    })
    .to_string()
    .into_bytes()
}

/// Writes one lifecycle's ACL row (reading `channels`), its presence row when `presence`, and
/// a durable member row on each channel.
pub async fn write_lifecycle(
    pipe: &mut Pipe<'_>,
    who: &Principal,
    uid: &LifecycleUid,
    channels: &[String],
    presence: bool,
    now: u64,
) -> Result<(), String> {
    let insp = pipe.insp;
    let n = &insp.names;
    let acl = AclRecord::new(channels.to_vec(), 1, now);
    pipe.put(
        kv(&n.acl_bucket(), &SpaceNames::acl_key(who, uid)),
        HeaderMap::new(),
        serde_json::to_vec(&acl).map_err(err)?.into(),
    )
    .await?;
    if presence {
        let row = json!({"card": {"id": who.dot_form(), "name": who.actor()}, "status": "offline", "ts": now});
        pipe.put(
            kv(&n.presence_bucket(), &SpaceNames::presence_key(who)),
            HeaderMap::new(),
            row.to_string().into_bytes().into(),
        )
        .await?;
    }
    for ch in channels {
        pipe.put(
            kv(&n.members_bucket(), &SpaceNames::member_key(ch, who, uid)),
            HeaderMap::new(),
            member_row(ch, who, uid, now).into(),
        )
        .await?;
    }
    Ok(())
}

/// Writes `shape`'s bulk agents (actors `a<i>`): their lifecycles, and how long it took.
pub async fn provision(
    insp: &Inspector,
    shape: Shape,
) -> Result<(Vec<(Principal, LifecycleUid)>, f64), String> {
    shape.check()?;
    let t0 = Instant::now();
    let now = cotal_delivery::base::epoch_ms();
    let mut pipe = Pipe::new(insp);
    let mut out = Vec::with_capacity(shape.agents);
    for i in 0..shape.agents {
        let who = bulk_principal(&format!("a{i}"))?;
        let uid = LifecycleUid::generate();
        let joined: Vec<String> = (0..shape.joins)
            .map(|k| channel((i * shape.joins + k) % shape.channels))
            .collect();
        write_lifecycle(&mut pipe, &who, &uid, &joined, true, now).await?;
        out.push((who, uid));
    }
    pipe.settle().await?;
    Ok((out, t0.elapsed().as_secs_f64()))
}

/// Removes every bulk row: the members rows of bulk channels, the ACL and presence rows of the
/// bulk owner (one filtered purge per bucket; the daemon is stopped meanwhile).
pub async fn wipe(insp: &Inspector) -> Result<(), String> {
    let n = &insp.names;
    for (bucket, filter) in [
        (n.members_bucket(), format!("{BULK_SEGMENT}.>")),
        (n.acl_bucket(), format!("{BULK_OWNER}.>")),
        (n.presence_bucket(), format!("{BULK_OWNER}.>")),
    ] {
        let stream = SpaceNames::kv_stream(&bucket);
        insp.js
            .get_stream_no_info(&stream)
            .await
            .map_err(err)?
            .purge()
            .filter(kv(&bucket, &filter))
            .await
            .map_err(|e| format!("purge {filter} of {stream}: {e}"))?;
    }
    Ok(())
}
