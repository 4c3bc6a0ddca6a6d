//! The raw pipeline: the durable path's messages with no checks, in a process of its own
//! (`smoke bench-fanout-raw`, started by the benchmark), so its CPU is read from its own
//! `/proc/<pid>/stat` like the daemon's.
//!
//! Two stages, one connection each, at full speed:
//!
//! - **copy**: a durable pull consumer on CHAT; per post, the M INBOX copies published with
//!   their `Nats-Msg-Id` without waiting (beyond the daemon's `MAX_COPIES_IN_FLIGHT` of one
//!   post's copies unacknowledged, the oldest copy's ack awaited first, as the daemon does),
//!   then the post acked once every copy's ack arrived;
//! - **frame**: a durable pull consumer on INBOX; per entry, the DLV frame published with its
//!   `Nats-Msg-Id` (and `Cotal-Delivery-Frame: 1`), then the entry acked once the frame's ack
//!   arrived.
//!
//! Both durables have the daemon's `max_ack_pending` (1000), and a stage's publishes are
//! bounded only by its JetStream context's pending acks (async-nats's 5000, with backpressure).
//! The raw client parses no JSON: it takes a post's id from the post's `Nats-Msg-Id` and
//! splices the post's bytes into the entry, and the entry's message into the frame, so it
//! writes exactly the bytes the daemon writes for the benchmark's posts (they are already on
//! their channel and name no direct target; [`tests`] and the benchmark's frame check hold it
//! to that). What it leaves out is what the daemon adds: parsing, routing, authorization,
//! fences, keep-alives, metrics.

use std::fmt::Write as _;
use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::{self, Message};
use async_nats::{HeaderMap, Subject};
use cotal_delivery::provision::{AgentMaterial, MintOptions, Profile};
use cotal_delivery::wire::{LifecycleUid, Principal, DELIVERY_FRAME_HEADER};
use delivery_harness::rig::daemon::{Daemon, DaemonSpec};
use delivery_harness::rig::mesh::{Inspector, Mesh};
use futures::StreamExt;
use serde_json::{json, Value};

/// The raw durables (deleted after each raw run, so the next one starts at the next post).
pub const RAW_FANOUT: &str = "bench_fanout";
pub const RAW_READER: &str = "bench_reader";
/// What the raw client prints once both durables exist and both pull streams are open.
pub const READY_LINE: &str = "raw pipeline ready";
/// `max_ack_pending` of both raw durables: the daemon's `fanout` (`FANOUT_MAX_ACK_PENDING`)
/// and `reader` (`reader_max_ack_pending`) values.
pub const RAW_MAX_ACK_PENDING: i64 = 1000;
/// Posts (copy stage) or entries (frame stage) published and waiting for their acks, per stage.
/// Not the bound that matters: the context's 5000 pending acks are reached first at 10 and
/// 100 members.
const SETTLE_QUEUE: usize = 4096;
/// Generation of every member row the benchmark writes (one durable join each); the daemon's
/// dedup ids carry it, and the benchmark's frame check of the daemon run proves it.
pub const GENERATION: u64 = 1;
/// Bound on connecting and on the raw client becoming ready.
const START_BOUND: Duration = Duration::from_secs(30);
const NATS_MSG_ID: &str = "Nats-Msg-Id";

/// `smoke bench-fanout-raw`: hidden, started by `smoke bench-fanout`.
#[derive(clap::Args)]
pub struct Args {
    /// The plan the benchmark wrote (JSON): broker, credential, streams, members.
    #[arg(long)]
    plan: PathBuf,
}

/// One member's copy target.
struct Member {
    inbox: Subject,
    /// `:<o>.<a>:<uid>:<generation>`, appended to the post's id (the daemon's dedup id).
    dedup_suffix: String,
}

/// Everything the raw client needs, written by the benchmark.
struct Plan {
    server: String,
    tls_ca: Option<PathBuf>,
    creds: PathBuf,
    chat_stream: String,
    chat_filter: String,
    inbox_stream: String,
    inbox_filter: String,
    /// The channel as a JSON string (with its quotes).
    channel_json: String,
    /// `cotal.<s>.dinbox.` and `cotal.<s>.dlv.`: a frame's subject is its entry's with the
    /// one replaced by the other.
    inbox_prefix: String,
    dlv_prefix: String,
    members: Vec<Member>,
    /// The frame stage's durable starts at the INBOX's first entry (a backlog already stored,
    /// `smoke bench-scale`) instead of at the next one.
    inbox_from_first: bool,
}

impl Plan {
    fn read(path: &Path) -> Result<Plan, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("plan: {e}"))?;
        let s = |k: &str| {
            v[k].as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("plan: no {k}"))
        };
        let members = v["members"]
            .as_array()
            .ok_or("plan: no members")?
            .iter()
            .map(|m| {
                Some(Member {
                    inbox: Subject::from(m["inbox"].as_str()?),
                    dedup_suffix: m["dedup_suffix"].as_str()?.to_string(),
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or("plan: a malformed member")?;
        Ok(Plan {
            server: s("server")?,
            tls_ca: v["tls_ca"].as_str().map(PathBuf::from),
            creds: PathBuf::from(s("creds")?),
            chat_stream: s("chat_stream")?,
            chat_filter: s("chat_filter")?,
            inbox_stream: s("inbox_stream")?,
            inbox_filter: s("inbox_filter")?,
            channel_json: s("channel_json")?,
            inbox_from_first: v["inbox_from_first"].as_bool().unwrap_or(false),
            inbox_prefix: s("inbox_prefix")?,
            dlv_prefix: s("dlv_prefix")?,
            members,
        })
    }
}

/// The entry the daemon's writer stores for `post` (CHAT sequence `seq`) for a durable member
/// of generation [`GENERATION`]: `Plane3Entry` with the post's bytes as its `msg`.
pub fn entry_bytes(post: &[u8], channel_json: &str, seq: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(post.len() + channel_json.len() + 80);
    b.extend_from_slice(b"{\"msg\":");
    b.extend_from_slice(post);
    let mut tail = String::with_capacity(channel_json.len() + 72);
    // Writing to a String cannot fail.
    let _ = write!(
        tail,
        ",\"channel\":{channel_json},\"seq\":{seq},\"reason\":\"durable-channel\",\"generation\":{GENERATION}}}"
    );
    b.extend_from_slice(tail.as_bytes());
    b
}

/// The `msg` of an entry [`entry_bytes`] wrote: between the leading `{"msg":` and the entry's
/// own `channel` key, the last one (a message may hold the same characters inside).
pub fn entry_message(entry: &[u8]) -> Option<&[u8]> {
    const KEY: &[u8] = b",\"channel\":";
    let rest = entry.strip_prefix(b"{\"msg\":")?;
    let at = rest.windows(KEY.len()).rposition(|w| w == KEY)?;
    Some(&rest[..at])
}

/// The frame the daemon's reader writes for an entry whose message is `msg`
/// (`Plane3DeliveryFrame`: version, channel, msg, in that order).
pub fn frame_bytes(channel_json: &str, msg: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(msg.len() + channel_json.len() + 32);
    b.extend_from_slice(b"{\"version\":1,\"channel\":");
    b.extend_from_slice(channel_json.as_bytes());
    b.extend_from_slice(b",\"msg\":");
    b.extend_from_slice(msg);
    b.push(b'}');
    b
}

/// Runs the raw client until it is killed (exit 1 if a stage could not start).
pub async fn run(args: Args) -> i32 {
    match serve(args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("bench-fanout-raw: {e}");
            1
        }
    }
}

/// The first failure of a stage is printed; later ones only make the run incomplete (the
/// benchmark sees that in DLV).
#[derive(Default)]
struct Faults(AtomicBool);

impl Faults {
    fn report(&self, stage: &str, what: impl std::fmt::Display) {
        if !self.0.swap(true, Ordering::Relaxed) {
            eprintln!("bench-fanout-raw: {stage}: {what} (further failures not printed)");
        }
    }
}

async fn serve(args: Args) -> Result<(), String> {
    let plan = Arc::new(Plan::read(&args.plan)?);
    let cred = cotal_delivery::base::read_creds_file(&plan.creds).map_err(|e| e.to_string())?;
    let connect = |name: &'static str| {
        cotal_delivery::base::connect_with_credential(
            &plan.server,
            plan.tls_ca.as_deref(),
            &cred,
            name,
            START_BOUND,
        )
    };
    let copy_js = jetstream::new(connect("bench-raw-copy").await.map_err(|e| e.to_string())?);
    let frame_js = jetstream::new(
        connect("bench-raw-frame")
            .await
            .map_err(|e| e.to_string())?,
    );
    let posts = durable(
        &copy_js,
        &plan.chat_stream,
        RAW_FANOUT,
        &plan.chat_filter,
        DeliverPolicy::New,
    )
    .await?;
    let from = if plan.inbox_from_first {
        DeliverPolicy::All
    } else {
        DeliverPolicy::New
    };
    let entries = durable(
        &frame_js,
        &plan.inbox_stream,
        RAW_READER,
        &plan.inbox_filter,
        from,
    )
    .await?;
    println!("{READY_LINE}");
    let faults = Arc::new(Faults::default());
    let copies = {
        let (plan, faults) = (plan.clone(), faults.clone());
        tokio::spawn(async move {
            stage("copy", posts, faults.clone(), |m| {
                copy(&copy_js, &plan, &faults, m)
            })
            .await
        })
    };
    let frames = tokio::spawn(async move {
        stage("frame", entries, faults.clone(), |m| {
            frame(&frame_js, &plan, &faults, m)
        })
        .await
    });
    let _ = tokio::join!(copies, frames);
    Err("a pull stream ended".into())
}

/// Creates the durable and opens its pull stream.
async fn durable(
    js: &jetstream::Context,
    stream: &str,
    name: &str,
    filter: &str,
    deliver_policy: DeliverPolicy,
) -> Result<pull::Stream, String> {
    let consumer = js
        .get_stream_no_info(stream)
        .await
        .map_err(|e| format!("{stream}: {e}"))?
        .get_or_create_consumer(
            name,
            pull::Config {
                durable_name: Some(name.to_string()),
                filter_subject: filter.to_string(),
                ack_policy: AckPolicy::Explicit,
                deliver_policy,
                max_ack_pending: RAW_MAX_ACK_PENDING,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("durable {name} on {stream}: {e}"))?;
    consumer
        .messages()
        .await
        .map_err(|e| format!("pull stream of {name}: {e}"))
}

fn header<'a>(m: &'a Message, name: &str) -> Option<&'a str> {
    m.headers.as_ref()?.get(name).map(|v| v.as_str())
}

/// A pulled message and the acks of the publishes it was turned into.
type Sent = (Message, Vec<PublishAckFuture>);

/// Acks each message once all its publishes are acknowledged (a failed one leaves it to
/// redeliver after `ack_wait`, and the run is incomplete).
fn settler(
    stage: &'static str,
    faults: Arc<Faults>,
) -> (tokio::sync::mpsc::Sender<Sent>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Sent>(SETTLE_QUEUE);
    let task = tokio::spawn(async move {
        while let Some((m, acks)) = rx.recv().await {
            let mut stored = true;
            for a in acks {
                if let Err(e) = a.await {
                    faults.report(stage, format!("a publish was not stored: {e}"));
                    stored = false;
                }
            }
            if stored {
                if let Err(e) = m.ack().await {
                    faults.report(stage, format!("ack: {e}"));
                }
            }
        }
    });
    (tx, task)
}

/// A stage: pulls until its pull stream ends, hands each message to `publish` (which sends its
/// publishes without waiting) and queues it to be acked once they are stored.
async fn stage<F, Fut>(
    name: &'static str,
    mut pulled: pull::Stream,
    faults: Arc<Faults>,
    publish: F,
) where
    F: Fn(Message) -> Fut,
    Fut: std::future::Future<Output = Option<Sent>>,
{
    let (settle, settling) = settler(name, faults.clone());
    while let Some(next) = pulled.next().await {
        let m = match next {
            Ok(m) => m,
            Err(e) => {
                faults.report(name, format!("pull: {e}"));
                continue;
            }
        };
        let Some(sent) = publish(m).await else {
            continue;
        };
        if settle.send(sent).await.is_err() {
            break;
        }
    }
    drop(settle);
    let _ = settling.await;
}

/// A post's M copies, sent.
async fn copy(
    js: &jetstream::Context,
    plan: &Plan,
    faults: &Faults,
    post: Message,
) -> Option<Sent> {
    let Some(id) = header(&post, NATS_MSG_ID).map(str::to_string) else {
        faults.report("copy", "a post without Nats-Msg-Id");
        return None;
    };
    let seq = post.info().map(|i| i.stream_sequence).unwrap_or(0);
    // One body for every copy (the members share reason and generation), converted once: its
    // type (`bytes::Bytes`, which this crate does not name) is the publish's payload's.
    let body = Into::into(entry_bytes(&post.payload, &plan.channel_json, seq));
    // The daemon's window: without it, a post to more members than the context keeps acks
    // pending for (5,000) waits forever on its own acks.
    let window = cotal_delivery::plane::MAX_COPIES_IN_FLIGHT;
    let mut acks = std::collections::VecDeque::with_capacity(plan.members.len().min(window));
    for m in &plan.members {
        if acks.len() >= window {
            if let Some(a) = acks.pop_front() {
                if let Err(e) = IntoFuture::into_future(a).await {
                    faults.report("copy", format!("a publish was not stored: {e}"));
                    return None;
                }
            }
        }
        let mut h = HeaderMap::new();
        h.insert(NATS_MSG_ID, format!("{id}{}", m.dedup_suffix));
        match js
            .publish_with_headers(m.inbox.clone(), h, Clone::clone(&body))
            .await
        {
            Ok(a) => acks.push_back(a),
            Err(e) => faults.report("copy", format!("publish: {e}")),
        }
    }
    Some((post, acks.into()))
}

/// An entry's frame, sent.
async fn frame(
    js: &jetstream::Context,
    plan: &Plan,
    faults: &Faults,
    entry: Message,
) -> Option<Sent> {
    // The copy's dedup id is the frame's: same message, member, lifecycle and generation.
    let (Some(id), Some(member), Some(msg)) = (
        header(&entry, NATS_MSG_ID),
        entry.subject.strip_prefix(plan.inbox_prefix.as_str()),
        entry_message(&entry.payload),
    ) else {
        faults.report(
            "frame",
            format!(
                "an entry not of the raw copy stage's shape on {}",
                entry.subject
            ),
        );
        return None;
    };
    let mut h = HeaderMap::new();
    h.insert(DELIVERY_FRAME_HEADER, "1");
    h.insert(NATS_MSG_ID, id);
    let subject = format!("{}{member}", plan.dlv_prefix);
    let body = frame_bytes(&plan.channel_json, msg);
    match js.publish_with_headers(subject, h, body.into()).await {
        Ok(a) => Some((entry, vec![a])),
        Err(e) => {
            faults.report("frame", format!("publish: {e}"));
            None
        }
    }
}

/// The raw client as the benchmark runs it: its own credential (so its API requests are not
/// taken for the benchmark's own), its plan, its process.
pub struct RawClient {
    proc: Daemon,
    _dir: tempfile::TempDir,
}

impl RawClient {
    /// Writes the plan, starts `smoke bench-fanout-raw` and waits for its ready line.
    pub async fn start(
        mesh: &Mesh,
        insp: &Inspector,
        channel: &str,
        targets: &[AgentMaterial],
    ) -> Result<RawClient, String> {
        let members: Vec<(Principal, LifecycleUid)> = targets
            .iter()
            .map(|t| (t.principal.clone(), t.lifecycle_uid.clone()))
            .collect();
        RawClient::launch(mesh, insp, channel, &members, false).await
    }

    /// [`RawClient::start`] for member lifecycles written straight into the registry
    /// (`smoke bench-scale`'s large channel), which have no credential of their own.
    pub async fn start_for(
        mesh: &Mesh,
        insp: &Inspector,
        channel: &str,
        members: &[(Principal, LifecycleUid)],
    ) -> Result<RawClient, String> {
        RawClient::launch(mesh, insp, channel, members, false).await
    }

    /// The raw client draining the INBOX entries already stored on `channel` (its frame stage
    /// from the stream's first entry; its copy stage idle).
    pub async fn start_draining(
        mesh: &Mesh,
        insp: &Inspector,
        channel: &str,
    ) -> Result<RawClient, String> {
        RawClient::launch(mesh, insp, channel, &[], true).await
    }

    async fn launch(
        mesh: &Mesh,
        insp: &Inspector,
        channel: &str,
        targets: &[(Principal, LifecycleUid)],
        inbox_from_first: bool,
    ) -> Result<RawClient, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let cred = mesh
            .mint(
                mesh.space(),
                &Profile::Operator,
                MintOptions::new().expires_in(super::BENCH_CREDENTIAL_TTL),
            )
            .map_err(|e| e.to_string())?;
        let creds = dir.path().join("raw.creds");
        cotal_delivery::base::write_creds_file_atomic(&creds, &cred).map_err(|e| e.to_string())?;
        let names = &insp.names;
        let prefix = names.space().prefix();
        let members: Vec<Value> = targets
            .iter()
            .map(|(who, uid)| {
                json!({
                    "inbox": names.dinbox_subject(who, uid),
                    "dedup_suffix": format!(":{}:{uid}:{GENERATION}", who.dot_form()),
                })
            })
            .collect();
        let plan = json!({
            "server": mesh.url(),
            "tls_ca": mesh.tls_ca(),
            "creds": creds,
            "chat_stream": names.chat_stream(),
            "chat_filter": names.chat_read_subject(channel),
            "inbox_stream": names.inbox_stream(),
            "inbox_filter": names.dinbox_all(),
            "channel_json": Value::String(channel.to_string()).to_string(),
            "inbox_prefix": format!("{prefix}.dinbox."),
            "dlv_prefix": format!("{prefix}.dlv."),
            "members": members,
            "inbox_from_first": inbox_from_first,
        });
        let plan_path = dir.path().join("plan.json");
        std::fs::write(&plan_path, plan.to_string()).map_err(|e| e.to_string())?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let plan_arg = plan_path.display().to_string();
        let mut proc = DaemonSpec::command(&["bench-fanout-raw", "--plan", &plan_arg], dir.path())
            .bin(exe)
            .spawn()
            .map_err(|e| e.to_string())?;
        if let Err(e) = proc.wait_for_line(READY_LINE, START_BOUND).await {
            return Err(format!(
                "the raw client did not start: {e}\n{}",
                proc.transcript()
            ));
        }
        Ok(RawClient { proc, _dir: dir })
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// What the raw client printed (its first failure, if any).
    pub fn transcript(&self) -> String {
        self.proc.transcript()
    }

    /// Stops the process and deletes its durables.
    pub async fn stop(mut self, insp: &Inspector) {
        let _ = self.proc.terminate();
        let _ = self.proc.wait_exit(START_BOUND).await;
        for (stream, name) in [
            (insp.names.chat_stream(), RAW_FANOUT),
            (insp.names.inbox_stream(), RAW_READER),
        ] {
            if let Ok(s) = insp.js.get_stream_no_info(stream).await {
                let _ = s.delete_consumer(name).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cotal_delivery::wire::{Plane3DeliveryFrame, Plane3Entry, Reason};

    /// The raw client writes the daemon's bytes: its entry is the `Plane3Entry` the writer
    /// stores (the same JSON value) and its frame is byte for byte the reader's, for a post
    /// already on its channel with no direct target, holding the entry's own `,"channel":` key
    /// in a nested object (inside a string it would be escaped). Mutation seen failing: `rposition` → `position` in
    /// `entry_message` (the frame's message is cut at the text).
    #[test]
    fn the_raw_client_writes_the_daemons_entry_and_frame() {
        let post = json!({
            "id": "b0r0-7",
            "ts": 1,
            "space": "bench",
            "from": {"id": "local.sender", "name": "sender"},
            "channel": "bench0",
            "parts": [{"kind": "text", "text": "bench"}],
            "meta": {"a": 1, "channel": "nested"},
        });
        let post_bytes = post.to_string();
        let channel_json = Value::String("bench0".into()).to_string();
        let entry = entry_bytes(post_bytes.as_bytes(), &channel_json, 42);
        let theirs = Plane3Entry {
            msg: post.clone(),
            channel: "bench0".into(),
            seq: 42,
            reason: Reason::DurableChannel,
            generation: GENERATION,
        };
        let ours: Plane3Entry = serde_json::from_slice(&entry).expect("an entry");
        assert_eq!(ours, theirs);
        let msg = entry_message(&entry).expect("the entry's message");
        assert_eq!(msg, post_bytes.as_bytes());
        let frame = frame_bytes(&channel_json, msg);
        let daemons = serde_json::to_vec(&Plane3DeliveryFrame::for_entry(&theirs)).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&frame),
            String::from_utf8_lossy(&daemons)
        );
    }
}
