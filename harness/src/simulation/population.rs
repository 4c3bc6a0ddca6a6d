//! The population: one actor per agent lifecycle, built on the agent client the kit's agents
//! use (`cotal_delivery::agent::Agent`, provisioned as a manager does). Each actor runs its
//! operations one at a time, in the order they were given, and records each as invoke then ok /
//! fail / unknown; while online it surfaces every frame of its `dlv_` durable (recording the
//! broker's stamp of the hand-off and whether the double-ack was confirmed) and refreshes its
//! presence every [`PRESENCE_EVERY`], so a mention resolves to it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cotal_delivery::agent::{Agent, AgentErrorKind, AgentSpec, Delivery, Frame};
use cotal_delivery::provision::AgentMaterial;
use cotal_delivery::wire::SpaceNames;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::record::{OpRef, Recorder};
use crate::simulation::check::{Call, Class, Done, Member, Process, Surfaced};

/// How often an online agent announces its presence (the writer takes presence younger than
/// 6 s as fresh).
pub const PRESENCE_EVERY: Duration = Duration::from_millis(2_000);
/// One surface call's wait; also how soon a surfacing loop sees that it must stop.
const SURFACE_POLL: Duration = Duration::from_millis(250);
/// Bound on a durable join's answer: the client's own (`JOIN_TIMEOUT`, 30 s), longer than a
/// long pause of the daemon, so a request a frozen daemon holds is still answered.
const JOIN_WAIT: Duration = cotal_delivery::agent::JOIN_TIMEOUT;
/// Bound on a durable leave's answer (the strict boundary waits up to 15 s for the reader).
const LEAVE_WAIT: Duration = Duration::from_secs(30);
/// Waits before a join or leave that got no answer, or found no daemon serving, is asked
/// again: a client asks again, and a later answer settles what the first left undecided (the
/// checker reads the generation a later join returns). After the last, it is left as it is.
const ASK_AGAIN_AFTER: [Duration; 3] = [
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];
/// How long a join or leave waits for the agent's connection to be up before it is asked:
/// asked on a connection that is down, it is refused by the client before it is sent.
const CONNECTED_WAIT: Duration = Duration::from_secs(10);
/// Bound on connecting as the agent.
const CONNECT_BOUND: Duration = Duration::from_secs(10);
/// Bound on the surfacing loop's end once asked to stop.
const STOP_BOUND: Duration = Duration::from_secs(10);
/// Wait between two attempts to bind the `dlv_` durable again after its pull stream ended.
const REBIND_GAP: Duration = Duration::from_millis(500);
/// Operations queued for one agent: a workload op finding the queue full is not issued.
pub const QUEUE_OPS: usize = 4;

/// What an agent is asked to do.
#[derive(Debug, Clone)]
pub enum Command {
    Post {
        channel: String,
        class: Class,
        id: Option<String>,
        tag: String,
        mentions: Vec<String>,
    },
    Join {
        channel: String,
    },
    Leave {
        channel: String,
    },
    Offline,
    Online,
    /// The lifecycle ends (retired): offline, and the actor stops.
    Stop,
    /// A race on purpose: this agent joins, leaves, or leaves and rejoins `channel`, and
    /// `posts` go to the queue of slot `partner` (another agent) at the moment that makes them
    /// race the membership change (see [`RaceKind`]).
    Race {
        channel: String,
        kind: RaceKind,
        partner: usize,
        posts: Vec<Command>,
    },
}

impl Command {
    /// A durable post with the message id the workload gives every tagged post (`m-<tag>`).
    pub fn durable_post(channel: &str, tag: String) -> Command {
        Command::Post {
            channel: channel.to_string(),
            class: Class::Durable,
            id: Some(format!("m-{tag}")),
            tag,
            mentions: Vec::new(),
        }
    }
}

/// Which membership change a race's posts race against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaceKind {
    /// The posts are sent the moment the join is answered: the first lands just past the join
    /// cursor (the join's frontier).
    JoinThenPost,
    /// The posts are sent, then the leave asked at once: one lands at or around the leave
    /// cursor, some past it while the writer may not have seen the leave yet.
    PostThenLeave,
    /// The leave is asked, the posts sent the moment it is answered, then the rejoin asked at
    /// once: posts between the two intervals and at the new frontier.
    LeaveRejoin,
    /// The leave is asked and the posts are handed to the partner one at a time, every
    /// [`AMID_SPACING`], while it runs: some land before its cursor is read, some after it and
    /// before its row is written (the fan-out writer copies those, not yet seeing the leave).
    /// The nemesis issues it while `DLV_<s>` refuses writes (`Workload::race_leave_now`).
    LeaveAmidPosts,
}

/// How far apart a `LeaveAmidPosts` race hands its posts over: a leave reads its cursor and
/// writes its row within tens of milliseconds (22 ms measured on a debug build, seed 4303), so
/// four posts this far apart straddle both.
pub const AMID_SPACING: std::time::Duration = std::time::Duration::from_millis(6);

/// Queues `posts` for slot `partner`'s current lifecycle (a full queue drops the rest: the
/// race still ran).
fn forward(ctx: &AgentCtx, partner: usize, posts: Vec<Command>) {
    let tx = lock(&ctx.population)
        .get(partner)
        .and_then(|s| s.tx.clone());
    if let Some(tx) = tx {
        for p in posts {
            if tx.try_send(p).is_err() {
                break;
            }
        }
    }
}

/// What the runner knows of one slot of the population (a principal and its current
/// lifecycle), as the workload chooses from it.
#[derive(Debug, Clone)]
pub struct Slot {
    /// The actor token of the principal `local.<actor>`, and its card name.
    pub actor: String,
    /// The current lifecycle; `None` between a retirement and the successor.
    pub member: Option<Member>,
    pub online: bool,
    /// Channel -> generation of each durable join answered and not left.
    pub joined: BTreeMap<String, u64>,
    /// The ACL row's `allowSubscribe` as the manager last wrote it.
    pub allow: Vec<String>,
    /// A manager write to this lifecycle's row is in flight.
    pub manager_busy: bool,
    /// Lifecycles of this slot so far (the successor's index).
    pub lifecycles: u32,
    pub tx: Option<mpsc::Sender<Command>>,
}

/// The population, shared by the workload, the actors and the summary.
pub type Population = Arc<Mutex<Vec<Slot>>>;

/// What every agent actor shares.
pub struct AgentCtx {
    pub recorder: Arc<Recorder>,
    pub population: Population,
    pub server_url: String,
    pub tls_ca: Option<PathBuf>,
    /// The manager's view of the broker (member rows read after a join or leave).
    pub js: async_nats::jetstream::Context,
    pub names: SpaceNames,
    /// Ask a join or leave again after no answer: a live run does; a replay does not (the
    /// asks the run made are in its schedule).
    pub ask_again: bool,
}

fn lock(p: &Population) -> std::sync::MutexGuard<'_, Vec<Slot>> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// Updates slot `slot`'s record, if the lifecycle is still the slot's current one.
fn update(ctx: &AgentCtx, slot: usize, member: &Member, f: impl FnOnce(&mut Slot)) {
    let mut pop = lock(&ctx.population);
    if let Some(s) = pop.get_mut(slot) {
        if s.member.as_ref() == Some(member) {
            f(s);
        }
    }
}

/// Starts the actor of `material` (provisioned, offline) in slot `slot`; returns its queue.
pub fn spawn(
    ctx: Arc<AgentCtx>,
    slot: usize,
    actor: String,
    member: Member,
    material: AgentMaterial,
) -> (mpsc::Sender<Command>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(QUEUE_OPS);
    let handle = tokio::spawn(run(ctx, slot, actor, member, material, rx));
    (tx, handle)
}

/// An agent while online: its connection, its surfacing loop and its presence refresh.
struct Session {
    agent: Arc<Agent>,
    stop: watch::Sender<bool>,
    surfacer: JoinHandle<()>,
    presence: JoinHandle<()>,
}

async fn run(
    ctx: Arc<AgentCtx>,
    slot: usize,
    actor: String,
    member: Member,
    material: AgentMaterial,
    mut rx: mpsc::Receiver<Command>,
) {
    let process = Process::Agent(member.clone());
    let mut session: Option<Session> = None;
    while let Some(cmd) = rx.recv().await {
        match cmd {
            Command::Online => {
                if session.is_some() {
                    continue;
                }
                let op = ctx.recorder.invoke(&process, Call::Online, None);
                match go_online(&ctx, &member, &material, &actor).await {
                    Ok(s) => {
                        session = Some(s);
                        ctx.recorder.ok(&op, Done::Online);
                        update(&ctx, slot, &member, |s| s.online = true);
                    }
                    Err(e) => ctx.recorder.fail(&op, e),
                }
            }
            Command::Offline => {
                let Some(s) = session.take() else { continue };
                let op = ctx.recorder.invoke(&process, Call::Offline, None);
                go_offline(s).await;
                ctx.recorder.ok(&op, Done::Offline);
                update(&ctx, slot, &member, |s| s.online = false);
            }
            Command::Stop => {
                if let Some(s) = session.take() {
                    let op = ctx.recorder.invoke(&process, Call::Offline, None);
                    go_offline(s).await;
                    ctx.recorder.ok(&op, Done::Offline);
                }
                return;
            }
            Command::Post {
                channel,
                class,
                id,
                tag,
                mentions,
            } => {
                let Some(s) = &session else { continue };
                post(&ctx, &process, &s.agent, channel, class, id, tag, mentions).await;
            }
            Command::Join { channel } => {
                let Some(s) = &session else { continue };
                do_join(&ctx, slot, &process, &member, &s.agent, &channel).await;
            }
            Command::Leave { channel } => {
                let Some(s) = &session else { continue };
                do_leave(&ctx, slot, &process, &member, &s.agent, &channel).await;
            }
            Command::Race {
                channel,
                kind,
                partner,
                posts,
            } => {
                let Some(s) = &session else { continue };
                match kind {
                    RaceKind::JoinThenPost => {
                        if do_join(&ctx, slot, &process, &member, &s.agent, &channel).await {
                            forward(&ctx, partner, posts);
                        }
                    }
                    RaceKind::PostThenLeave => {
                        forward(&ctx, partner, posts);
                        do_leave(&ctx, slot, &process, &member, &s.agent, &channel).await;
                    }
                    RaceKind::LeaveAmidPosts => {
                        let handing = {
                            let ctx = ctx.clone();
                            tokio::spawn(async move {
                                for p in posts {
                                    forward(&ctx, partner, vec![p]);
                                    tokio::time::sleep(AMID_SPACING).await;
                                }
                            })
                        };
                        do_leave(&ctx, slot, &process, &member, &s.agent, &channel).await;
                        let _ = handing.await;
                    }
                    RaceKind::LeaveRejoin => {
                        if do_leave(&ctx, slot, &process, &member, &s.agent, &channel).await {
                            forward(&ctx, partner, posts);
                            do_join(&ctx, slot, &process, &member, &s.agent, &channel).await;
                        }
                    }
                }
            }
        }
    }
    if let Some(s) = session.take() {
        go_offline(s).await;
    }
}

/// Joins `channel` (asked again while unanswered); whether it was answered joined.
async fn do_join(
    ctx: &AgentCtx,
    slot: usize,
    process: &Process,
    member: &Member,
    agent: &Agent,
    channel: &str,
) -> bool {
    let answer = asking(ctx, agent, || join(ctx, process, member, agent, channel)).await;
    if let Answer::Joined(g) = answer {
        update(ctx, slot, member, |s| {
            s.joined.insert(channel.to_string(), g);
        });
        return true;
    }
    false
}

/// Leaves the generation of `channel` the agent joined (asked again while unanswered);
/// whether it was answered left. Answered or not, the workload does not leave that
/// generation again.
async fn do_leave(
    ctx: &AgentCtx,
    slot: usize,
    process: &Process,
    member: &Member,
    agent: &Agent,
    channel: &str,
) -> bool {
    let generation = {
        let pop = lock(&ctx.population);
        pop.get(slot)
            .filter(|s| s.member.as_ref() == Some(member))
            .and_then(|s| s.joined.get(channel).copied())
    };
    let Some(generation) = generation else {
        return false;
    };
    let answer = asking(ctx, agent, || {
        leave(ctx, process, member, agent, channel, generation)
    })
    .await;
    update(ctx, slot, member, |s| {
        s.joined.remove(channel);
    });
    answer == Answer::Left
}

async fn go_online(
    ctx: &Arc<AgentCtx>,
    member: &Member,
    material: &AgentMaterial,
    name: &str,
) -> Result<Session, String> {
    let spec = AgentSpec::of_material(ctx.server_url.clone(), ctx.tls_ca.clone(), material, name);
    let agent = tokio::time::timeout(CONNECT_BOUND, Agent::connect(spec))
        .await
        .map_err(|_| format!("no connection within {} ms", CONNECT_BOUND.as_millis()))?
        .map_err(|e| format!("connect: {e}"))?;
    let agent = Arc::new(agent);
    // Presence first, so a mention posted once the online op is answered resolves to it.
    agent
        .announce("idle")
        .await
        .map_err(|e| format!("announce: {e}"))?;
    let delivery = agent
        .bind_delivery()
        .await
        .map_err(|e| format!("bind the dlv_ durable: {e}"))?;
    let (stop, stop_rx) = watch::channel(false);
    let surfacer = tokio::spawn(surface_loop(
        ctx.clone(),
        member.clone(),
        agent.clone(),
        delivery,
        stop_rx,
    ));
    let presence = {
        let agent = agent.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PRESENCE_EVERY);
            tick.tick().await;
            loop {
                tick.tick().await;
                let _ = agent.announce("idle").await;
            }
        })
    };
    Ok(Session {
        agent,
        stop,
        surfacer,
        presence,
    })
}

async fn go_offline(s: Session) {
    let _ = s.stop.send(true);
    s.presence.abort();
    let mut surfacer = s.surfacer;
    if tokio::time::timeout(STOP_BOUND, &mut surfacer)
        .await
        .is_err()
    {
        surfacer.abort();
    }
    let _ = tokio::time::timeout(STOP_BOUND, s.agent.client().drain()).await;
}

/// Surfaces every frame until asked to stop, recording each; binds the durable again when its
/// pull stream ends (a broker restart).
async fn surface_loop(
    ctx: Arc<AgentCtx>,
    member: Member,
    agent: Arc<Agent>,
    mut delivery: Delivery,
    stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let mut got: Option<Frame> = None;
        let result = delivery
            .surface(SURFACE_POLL, |f| got = Some(f.clone()))
            .await;
        if let Some(f) = got {
            ctx.recorder
                .frame(&member, surfaced(&ctx.recorder, &f, result.is_ok()));
        }
        if let Err(e) = result {
            if e.kind() == AgentErrorKind::ConnectionClosed {
                while !*stop.borrow() {
                    tokio::time::sleep(REBIND_GAP).await;
                    if let Ok(d) = agent.bind_delivery().await {
                        delivery = d;
                        break;
                    }
                }
            }
        }
    }
}

/// The text a post carries: the workload's tag behind a fixed prefix.
pub fn text_of(tag: &str) -> String {
    format!("sim:{tag}")
}

/// The workload tag a message's text carries, if it is one of the simulation's.
pub fn tag_of(msg: &Value) -> Option<String> {
    msg["parts"][0]["text"]
        .as_str()
        .and_then(|t| t.strip_prefix("sim:"))
        .map(str::to_string)
}

fn surfaced(recorder: &Recorder, f: &Frame, acked: bool) -> Surfaced {
    Surfaced {
        channel: f.channel.clone(),
        id: f.msg["id"]
            .as_str()
            .filter(|i| !i.is_empty())
            .map(str::to_string),
        tag: tag_of(&f.msg),
        chat_seq: None,
        dlv_seq: f.dlv_sequence,
        handed_off_ms: f.handed_off.and_then(|t| recorder.run_ms_of(t)),
        acked,
    }
}

#[allow(clippy::too_many_arguments)]
async fn post(
    ctx: &AgentCtx,
    process: &Process,
    agent: &Agent,
    channel: String,
    class: Class,
    id: Option<String>,
    tag: String,
    mentions: Vec<String>,
) {
    let mut msg = agent.message(&channel, &text_of(&tag), Some(id.as_deref().unwrap_or("")));
    if !mentions.is_empty() {
        msg["mentions"] = Value::from(mentions.clone());
    }
    let op = ctx.recorder.invoke(
        process,
        Call::Post {
            channel: channel.clone(),
            class,
            id,
            tag,
            mentions,
        },
        None,
    );
    match agent.post(&channel, &msg).await {
        Ok(seq) => ctx.recorder.ok(&op, Done::Post { seq }),
        // Not acknowledged: it may or may not be stored.
        Err(e) => ctx.recorder.unknown(&op, e.to_string()),
    }
}

/// How a join or leave was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Joined(u64),
    Left,
    /// Refused by the daemon.
    Failed,
    /// No daemon received it (the broker's no-responders answer).
    NoDaemon,
    Unknown,
}

/// Asks (a join or a leave) once the agent's connection is up, and again after each of
/// [`ASK_AGAIN_AFTER`] while it gets no answer or no daemon serves, when the run asks again;
/// the last answer.
async fn asking<F, Fut>(ctx: &AgentCtx, agent: &Agent, mut ask: F) -> Answer
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    let mut waits = vec![Duration::ZERO];
    if ctx.ask_again {
        waits.extend(ASK_AGAIN_AFTER);
    }
    let mut answer = Answer::Unknown;
    for again in waits {
        if !matches!(answer, Answer::Unknown | Answer::NoDaemon) {
            break;
        }
        tokio::time::sleep(again).await;
        if !connected(agent).await {
            break;
        }
        answer = ask().await;
    }
    answer
}

/// Waits, at most [`CONNECTED_WAIT`], for the agent's connection to be up.
async fn connected(agent: &Agent) -> bool {
    let deadline = tokio::time::Instant::now() + CONNECTED_WAIT;
    loop {
        if agent.client().connection_state() == async_nats::connection::State::Connected {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Records a refusal as fail (the daemon answered that it did not do it, or no daemon took
/// the request), anything else as unknown: "a lost reply does not prove that the operation did
/// not run".
fn settle_error(recorder: &Recorder, op: &OpRef, e: &cotal_delivery::agent::AgentError) -> Answer {
    match e.kind() {
        AgentErrorKind::Refused => {
            recorder.fail(op, e.to_string());
            Answer::Failed
        }
        AgentErrorKind::NoResponders => {
            recorder.fail(op, e.to_string());
            Answer::NoDaemon
        }
        _ => {
            recorder.unknown(op, e.to_string());
            Answer::Unknown
        }
    }
}

/// A member row's field, read leader-served after the op was answered.
async fn row_of(ctx: &AgentCtx, member: &Member, channel: &str) -> Option<Value> {
    let key = SpaceNames::member_key(channel, member.principal(), member.uid());
    crate::kit::steps::read::read_row(&ctx.js, &ctx.names.members_bucket(), &key)
        .await
        .ok()
        .flatten()
}

async fn join(
    ctx: &AgentCtx,
    process: &Process,
    member: &Member,
    agent: &Agent,
    channel: &str,
) -> Answer {
    let op = ctx.recorder.invoke(
        process,
        Call::Join {
            channel: channel.to_string(),
        },
        None,
    );
    let args = json!({"channel": channel, "lifecycleUid": member.uid().as_str()});
    match agent.request("durableJoin", args, JOIN_WAIT).await {
        Ok(data) if data["durable"].as_bool() == Some(true) => {
            let Some(generation) = data["generation"].as_u64() else {
                ctx.recorder
                    .unknown(&op, format!("durable:true without a generation: {data}"));
                return Answer::Unknown;
            };
            let row = row_of(ctx, member, channel).await;
            let join_cursor = row
                .filter(|r| r["generation"].as_u64() == Some(generation))
                .and_then(|r| r["joinCursor"].as_u64());
            ctx.recorder.ok(
                &op,
                Done::Join {
                    generation,
                    join_cursor,
                },
            );
            Answer::Joined(generation)
        }
        // "a failed catch-up answers durable:false with the reason (the row stands)".
        Ok(data) => {
            ctx.recorder.unknown(&op, format!("durable:false: {data}"));
            Answer::Unknown
        }
        Err(e) => settle_error(&ctx.recorder, &op, &e),
    }
}

async fn leave(
    ctx: &AgentCtx,
    process: &Process,
    member: &Member,
    agent: &Agent,
    channel: &str,
    generation: u64,
) -> Answer {
    let op = ctx.recorder.invoke(
        process,
        Call::Leave {
            channel: channel.to_string(),
            generation,
        },
        None,
    );
    let args = json!({"channel": channel, "generation": generation, "lifecycleUid": member.uid().as_str()});
    match agent.request("durableLeave", args, LEAVE_WAIT).await {
        Ok(data) => {
            let already_left = data["alreadyLeft"].as_bool() == Some(true);
            let row = row_of(ctx, member, channel).await;
            let leave_cursor = row
                .filter(|r| r["generation"].as_u64() == Some(generation))
                .and_then(|r| r["leaveCursor"].as_u64());
            ctx.recorder.ok(
                &op,
                Done::Leave {
                    leave_cursor,
                    already_left,
                },
            );
            Answer::Left
        }
        Err(e) => settle_error(&ctx.recorder, &op, &e),
    }
}
