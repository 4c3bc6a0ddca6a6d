//! The workload: the population provisioned as a manager does (credential, ACL row, `dlv_`
//! durable), then operations drawn by weight from the seed at a drawn pace: durable posts (some
//! without an id), live posts with @mentions, joins, leaves and rejoins, agents going offline
//! and coming back, ACL rows narrowed and widened by the manager, lifecycles retired and
//! succeeded. Each operation goes to its agent's queue (or runs as the manager); a full queue
//! means the agent is still busy, and the draw is not issued (counted as skipped).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cotal_delivery::provision::{
    provision_lifecycle, read_acl, retire, set_read_acl, MintOptions, ReadChannels, Roles,
};
use cotal_delivery::wire::{LifecycleUid, Principal, SpaceNames};
use tokio::sync::Mutex;

use super::config::{self, WorkKind};
use super::population::{self, AgentCtx, Command, Population, RaceKind, Slot};
use super::prng::Prng;
use super::record::Recorder;
use super::stage::Stage;
use crate::simulation::check::{Call, Class, Done, Member, Ms, Process};

/// The workload's shared handles.
pub struct Workload {
    pub recorder: Arc<Recorder>,
    pub population: Population,
    pub stage: Arc<Mutex<Stage>>,
    pub agents: Arc<AgentCtx>,
    /// Every channel an agent is provisioned to read (its full ACL).
    pub read: Vec<String>,
    tags: AtomicU64,
    /// Every lifecycle provisioned (what the snapshot reads pending work for).
    pub provisioned: std::sync::Mutex<BTreeSet<Member>>,
    /// The run is over: nothing more is provisioned.
    closed: AtomicBool,
}

impl Workload {
    pub fn new(
        recorder: Arc<Recorder>,
        population: Population,
        stage: Arc<Mutex<Stage>>,
        agents: Arc<AgentCtx>,
    ) -> Arc<Workload> {
        let mut read: Vec<String> = config::DURABLE_CHANNELS
            .iter()
            .map(|c| c.to_string())
            .collect();
        read.push(config::LIVE_CHANNEL.to_string());
        Arc::new(Workload {
            recorder,
            population,
            stage,
            agents,
            read,
            tags: AtomicU64::new(0),
            provisioned: Default::default(),
            closed: AtomicBool::new(false),
        })
    }

    /// Ends the workload: no lifecycle is provisioned any more, and every actor's queue is
    /// dropped (each goes offline once its queue is empty, without recording it: the run has
    /// ended).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        for s in self.slots().iter_mut() {
            s.tx = None;
        }
    }

    /// Every lifecycle provisioned so far.
    pub fn members(&self) -> BTreeSet<Member> {
        self.provisioned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn js(&self) -> &async_nats::jetstream::Context {
        &self.agents.js
    }
    fn names(&self) -> &SpaceNames {
        &self.agents.names
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.population.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Provisions lifecycle `uid` of slot `slot`'s principal and starts its actor (offline).
    /// Recorded as the runner's `provision`; false when it failed.
    pub async fn provision(&self, slot: usize, uid: LifecycleUid) -> bool {
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        let Some(actor) = self.slots().get(slot).map(|s| s.actor.clone()) else {
            return false;
        };
        let Ok(principal) = Principal::new("local", &actor) else {
            return false;
        };
        let member = Member::new(principal.clone(), uid.clone());
        let op = self.recorder.invoke(
            &Process::Runner,
            Call::Provision {
                member: member.clone(),
                name: actor.clone(),
                allow: self.read.clone(),
            },
            None,
        );
        let material = {
            let stage = self.stage.lock().await;
            let space = stage.world.mesh.space().clone();
            let read = ReadChannels::new(&self.read);
            let roles = Roles::new(Vec::<String>::new());
            match (read, roles) {
                (Ok(read), Ok(roles)) => provision_lifecycle(
                    &stage.world.mesh.authority,
                    self.js(),
                    &space,
                    &principal,
                    uid.clone(),
                    read,
                    roles,
                    MintOptions::new()
                        .expires_in(Duration::from_millis(config::LONG_CREDENTIAL_MS)),
                )
                .await
                .map_err(|e| e.to_string()),
                (Err(e), _) | (_, Err(e)) => Err(e.to_string()),
            }
        };
        let material = match material {
            Ok(m) => m,
            Err(e) => {
                self.recorder.unknown(&op, e);
                return false;
            }
        };
        self.provisioned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(member.clone());
        match read_acl(self.js(), self.names(), &principal, &uid).await {
            Ok((Some(_), revision)) => self.recorder.ok(&op, Done::Provision { revision }),
            Ok((None, _)) => {
                self.recorder
                    .unknown(&op, "the ACL row is not there after provisioning");
                return false;
            }
            Err(e) => {
                self.recorder.unknown(&op, e.to_string());
                return false;
            }
        }
        let (tx, _) = population::spawn(self.agents.clone(), slot, actor, member.clone(), material);
        let mut slots = self.slots();
        if let Some(s) = slots.get_mut(slot) {
            s.member = Some(member);
            s.online = false;
            s.joined.clear();
            s.allow = self.read.clone();
            s.manager_busy = false;
            s.lifecycles += 1;
            s.tx = Some(tx);
        }
        true
    }

    /// Queues `cmd` for slot `slot`'s current lifecycle; false when none or its queue is full.
    pub fn send(&self, slot: usize, cmd: Command) -> bool {
        let tx = self.slots().get(slot).and_then(|s| s.tx.clone());
        match tx {
            Some(tx) => tx.try_send(cmd).is_ok(),
            None => false,
        }
    }

    /// A leave raced by another member's posts, issued now (`RaceKind::LeaveAmidPosts`): the
    /// nemesis times it on a store-full of `DLV_<s>`, so the trusted reader's hand-offs of the
    /// posts the fan-out writer copied before it saw the leave are refused until after the
    /// leave was answered. Only the reader's re-check of the current leave cursor then keeps
    /// the posts past it back (a reader that ignores it hands them off after the answer: a
    /// leak the checker sees). Idle agents only (an empty queue), so the race runs at once.
    /// Answers the partner's slot and the channel when the race was issued.
    pub fn race_leave_now(&self, rng: &mut Prng) -> Option<(usize, String)> {
        let slots = self.slots().clone();
        let idle = |s: &Slot| {
            s.online
                && s.member.is_some()
                && s.tx
                    .as_ref()
                    .is_some_and(|tx| tx.capacity() == tx.max_capacity())
        };
        // A channel the leaver may still read, with no ACL write in flight: on one narrowed
        // away the reader drops the posts whatever the leave cursor says, and nothing shows
        // (seed 4303's `harness mutate` run: the leaver's `design` narrowed, the build valid).
        let readable = |s: &Slot| -> Vec<String> {
            s.joined
                .keys()
                .filter(|c| !s.manager_busy && s.allow.iter().any(|a| a == *c))
                .cloned()
                .collect()
        };
        let leavers: Vec<usize> = (0..slots.len())
            .filter(|&i| idle(&slots[i]) && !readable(&slots[i]).is_empty())
            .collect();
        let &who = rng.pick(&leavers)?;
        let readable = readable(&slots[who]);
        let joined: Vec<&String> = readable.iter().collect();
        let &channel = rng.pick(&joined)?;
        let partners: Vec<usize> = (0..slots.len())
            .filter(|&i| i != who && idle(&slots[i]))
            .collect();
        let &partner = rng.pick(&partners)?;
        // A full queue's worth (the partner is idle), spread over the leave's run: the more
        // posts around its cursor read, the likelier one lands past it before the fan-out
        // writer sees the leave.
        let posts = (0..population::QUEUE_OPS)
            .map(|_| {
                let tag = self.next_tag();
                Command::durable_post(channel, tag)
            })
            .collect();
        self.send(
            who,
            Command::Race {
                channel: channel.clone(),
                kind: RaceKind::LeaveAmidPosts,
                partner,
                posts,
            },
        )
        .then(|| (partner, channel.clone()))
    }

    /// Queues up to `n` durable posts on `channel` for slot `slot` now (as many as its queue
    /// takes); how many were queued. The held leave's posts past its cursor
    /// (`nemesis::hold_member_writes`).
    pub fn posts_now(&self, slot: usize, channel: &str, n: usize) -> usize {
        (0..n)
            .take_while(|_| {
                let tag = self.next_tag();
                self.send(slot, Command::durable_post(channel, tag))
            })
            .count()
    }

    /// A fresh lifecycle for slot `slot`, online, joined to some durable channels.
    pub async fn bring_up(&self, slot: usize, rng: &mut Prng) {
        if !self.provision(slot, LifecycleUid::generate()).await {
            return;
        }
        self.send(slot, Command::Online);
        let mut channels: Vec<&str> = config::DURABLE_CHANNELS.to_vec();
        // Two of the durable channels, drawn.
        let skip = rng.below(channels.len() as u64) as usize;
        channels.remove(skip);
        for c in channels {
            self.send(
                slot,
                Command::Join {
                    channel: c.to_string(),
                },
            );
        }
    }

    /// The next workload tag (unique in the run).
    pub fn next_tag(&self) -> String {
        format!("t{}", self.tags.fetch_add(1, Ordering::SeqCst))
    }

    /// A manager write to `member`'s ACL row (`None`: its retirement), recorded; the slot is
    /// busy for manager writes until it is answered.
    /// Whether the broker acknowledged the write.
    pub async fn manager_write(
        &self,
        slot: usize,
        member: Member,
        allow: Option<Vec<String>>,
    ) -> bool {
        let call = match &allow {
            Some(a) if a.len() < self.read.len() => Call::AclNarrow {
                member: member.clone(),
                allow: a.clone(),
            },
            Some(a) => Call::AclWiden {
                member: member.clone(),
                allow: a.clone(),
            },
            None => Call::Retire {
                member: member.clone(),
            },
        };
        let op = self.recorder.invoke(&Process::Manager, call, None);
        let (p, u) = (member.principal(), member.uid());
        let result = match &allow {
            Some(a) => set_read_acl(self.js(), self.names(), p, u, a.clone()).await,
            None => retire(self.js(), self.names(), p, u).await,
        };
        let acknowledged = result.is_ok();
        match (result, &allow) {
            (Ok(revision), Some(a)) if a.len() < self.read.len() => {
                self.recorder.ok(&op, Done::AclNarrow { revision })
            }
            (Ok(revision), Some(_)) => self.recorder.ok(&op, Done::AclWiden { revision }),
            (Ok(revision), None) => self.recorder.ok(&op, Done::Retire { revision }),
            (Err(e), _) => self.recorder.unknown(&op, e.to_string()),
        }
        let mut slots = self.slots();
        if let Some(s) = slots.get_mut(slot) {
            if s.member.as_ref() == Some(&member) {
                s.manager_busy = false;
                if let Some(a) = allow {
                    s.allow = a;
                }
            }
        }
        acknowledged
    }

    /// Retires slot `slot`'s lifecycle: the manager's tombstone (in a live run asked again after
    /// 2, 4 and 8 s until the broker acknowledges it), then the actor stopped; the slot waits for its
    /// successor. Whether it was retired: a tombstone never acknowledged may not have landed,
    /// so the lifecycle lives on (it may still be owed posts).
    pub async fn retire_slot(&self, slot: usize, member: Member) -> bool {
        let mut retired = false;
        let mut waits = vec![Duration::ZERO];
        if self.agents.ask_again {
            waits.extend(RETIRE_AGAIN_AFTER);
        }
        for again in waits {
            tokio::time::sleep(again).await;
            if let Some(s) = self.slots().get_mut(slot) {
                s.manager_busy = true;
            }
            if self.manager_write(slot, member.clone(), None).await {
                retired = true;
                break;
            }
        }
        if !retired {
            return false;
        }
        let tx = {
            let mut slots = self.slots();
            match slots.get_mut(slot) {
                Some(s) if s.member.as_ref() == Some(&member) => {
                    s.member = None;
                    s.online = false;
                    s.joined.clear();
                    s.tx.take()
                }
                _ => None,
            }
        };
        if let Some(tx) = tx {
            let _ = tx.send(Command::Stop).await;
        }
        true
    }
}

/// Waits before an unacknowledged retirement is written again.
const RETIRE_AGAIN_AFTER: [Duration; 3] = [
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

/// Swarm testing (as the VOPR does): each seed scales the workload's weights and the faults'
/// by its own draw, so runs differ in what they stress, not only in when. A workload weight
/// other than the durable posts' is halved, kept or doubled; a fault's weight is dropped (a
/// quarter of the time), kept, doubled or tripled, with at least [`SWARM_MIN_FAULT_KINDS`]
/// kinds left.
pub fn work_mix(rng: &mut Prng) -> Vec<(WorkKind, u64)> {
    config::WORK_MIX
        .iter()
        .map(|&(k, w)| match k {
            WorkKind::DurablePost => (k, w),
            _ => (k, (w * [1, 2, 4][rng.below(3) as usize] / 2).max(1)),
        })
        .collect()
}

/// Draws and issues operations from `from_ms` until `until_ms`, by the run's `mix`.
pub async fn live(
    w: Arc<Workload>,
    mut rng: Prng,
    mix: Vec<(WorkKind, u64)>,
    from_ms: Ms,
    until_ms: Ms,
) {
    loop {
        let gap = rng.range(config::WORK_GAP_MS.0, config::WORK_GAP_MS.1);
        tokio::time::sleep(Duration::from_millis(gap)).await;
        let now = w.recorder.now_ms();
        if now >= until_ms {
            return;
        }
        if now < from_ms {
            continue;
        }
        let Some(kind) = rng.weighted(&mix) else {
            return;
        };
        if !issue(&w, &mut rng, kind).await {
            w.recorder.skipped();
        }
    }
}

/// What the draw can act on now.
struct View {
    online: Vec<usize>,
    offline: Vec<usize>,
    with_member: Vec<usize>,
    n: usize,
}

fn view(slots: &[Slot]) -> View {
    let mut v = View {
        online: Vec::new(),
        offline: Vec::new(),
        with_member: Vec::new(),
        n: slots.len(),
    };
    for (i, s) in slots.iter().enumerate() {
        if s.member.is_none() {
            continue;
        }
        v.with_member.push(i);
        if s.online {
            v.online.push(i);
        } else {
            v.offline.push(i);
        }
    }
    v
}

/// Issues one operation of `kind` on a slot drawn among those it applies to; false when none
/// applies or the agent is busy.
async fn issue(w: &Arc<Workload>, rng: &mut Prng, kind: WorkKind) -> bool {
    let (v, slots) = {
        let slots = w.slots();
        (view(&slots), slots.clone())
    };
    match kind {
        WorkKind::DurablePost | WorkKind::MentionPost => {
            let Some(&from) = rng.pick(&v.online) else {
                return false;
            };
            let tag = w.next_tag();
            let id = (!rng.chance(config::IDLESS_PER_MILLE)).then(|| format!("m-{tag}"));
            let (channel, class, mentions) = if kind == WorkKind::DurablePost {
                let c = rng.pick(config::DURABLE_CHANNELS).copied().unwrap_or("ops");
                (c.to_string(), Class::Durable, Vec::new())
            } else {
                let mut m = Vec::new();
                for _ in 0..rng.range(1, 2) {
                    let Some(&to) = rng.pick(&v.with_member) else {
                        break;
                    };
                    if let (true, Some(s)) = (to != from, slots.get(to)) {
                        m.push(s.actor.clone());
                    }
                }
                if rng.chance(100) {
                    m.push(config::NOBODY.to_string());
                }
                if m.is_empty() {
                    return false;
                }
                (config::LIVE_CHANNEL.to_string(), Class::Live, m)
            };
            w.send(
                from,
                Command::Post {
                    channel,
                    class,
                    id,
                    tag,
                    mentions,
                },
            )
        }
        WorkKind::Join => {
            let Some((who, s)) = rng
                .pick(&v.online)
                .and_then(|&who| slots.get(who).map(|s| (who, s)))
            else {
                return false;
            };
            // Mostly a channel it may read; now and then one narrowed away (refused).
            let candidates: Vec<&str> = config::DURABLE_CHANNELS
                .iter()
                .copied()
                .filter(|c| !s.joined.contains_key(*c))
                .filter(|c| rng.chance(200) || s.allow.iter().any(|a| a == c))
                .collect();
            let Some(c) = rng.pick(&candidates) else {
                return false;
            };
            w.send(
                who,
                Command::Join {
                    channel: c.to_string(),
                },
            )
        }
        WorkKind::Leave => {
            let who: Vec<(usize, &Slot)> = v
                .online
                .iter()
                .filter_map(|&i| slots.get(i).map(|s| (i, s)))
                .filter(|(_, s)| !s.joined.is_empty())
                .collect();
            let Some(&(who, s)) = rng.pick(&who) else {
                return false;
            };
            let joined: Vec<&String> = s.joined.keys().collect();
            let Some(c) = rng.pick(&joined) else {
                return false;
            };
            w.send(
                who,
                Command::Leave {
                    channel: c.to_string(),
                },
            )
        }
        WorkKind::Offline => {
            // At least half the population stays online.
            if v.online.len() * 2 <= v.n {
                return false;
            }
            let Some(&who) = rng.pick(&v.online) else {
                return false;
            };
            w.send(who, Command::Offline)
        }
        WorkKind::Online => {
            let Some(&who) = rng.pick(&v.offline) else {
                return false;
            };
            w.send(who, Command::Online)
        }
        WorkKind::Narrow => {
            // A member of the channel it loses: its posts must stop surfacing there.
            let who: Vec<(usize, &Slot)> = v
                .with_member
                .iter()
                .filter_map(|&i| slots.get(i).map(|s| (i, s)))
                .filter(|(_, s)| !s.manager_busy && s.allow.len() == w.read.len())
                .collect();
            let Some(&(who, s)) = rng.pick(&who) else {
                return false;
            };
            let joined: Vec<&String> = s.joined.keys().collect();
            let lose = match rng.pick(&joined) {
                Some(c) => c.to_string(),
                None => rng
                    .pick(config::DURABLE_CHANNELS)
                    .copied()
                    .unwrap_or("ops")
                    .to_string(),
            };
            let allow: Vec<String> = w.read.iter().filter(|c| **c != lose).cloned().collect();
            spawn_manager(w, who, s.member.clone(), Some(allow))
        }
        WorkKind::Widen => {
            let who: Vec<(usize, &Slot)> = v
                .with_member
                .iter()
                .filter_map(|&i| slots.get(i).map(|s| (i, s)))
                .filter(|(_, s)| !s.manager_busy && s.allow.len() < w.read.len())
                .collect();
            let Some(&(who, s)) = rng.pick(&who) else {
                return false;
            };
            spawn_manager(w, who, s.member.clone(), Some(w.read.clone()))
        }
        WorkKind::Race => {
            // Another online agent posts on the channel, timed against this one's join, leave,
            // or leave and rejoin.
            let Some((who, s)) = rng
                .pick(&v.online)
                .and_then(|&who| slots.get(who).map(|s| (who, s)))
            else {
                return false;
            };
            let partners: Vec<usize> = v.online.iter().copied().filter(|p| *p != who).collect();
            let Some(&partner) = rng.pick(&partners) else {
                return false;
            };
            let readable: Vec<&str> = config::DURABLE_CHANNELS
                .iter()
                .copied()
                .filter(|c| s.allow.iter().any(|a| a == c))
                .collect();
            let Some(&channel) = rng.pick(&readable) else {
                return false;
            };
            let kind = if !s.joined.contains_key(channel) {
                RaceKind::JoinThenPost
            } else if rng.chance(500) {
                RaceKind::PostThenLeave
            } else {
                RaceKind::LeaveRejoin
            };
            let posts = (0..config::RACE_POSTS)
                .map(|_| {
                    let tag = w.next_tag();
                    Command::durable_post(channel, tag)
                })
                .collect();
            w.send(
                who,
                Command::Race {
                    channel: channel.to_string(),
                    kind,
                    partner,
                    posts,
                },
            )
        }
        WorkKind::Retire => {
            // Each slot goes through at most three lifecycles.
            let who: Vec<(usize, &Slot)> = v
                .online
                .iter()
                .filter_map(|&i| slots.get(i).map(|s| (i, s)))
                .filter(|(_, s)| !s.manager_busy && s.lifecycles < 3)
                .collect();
            let Some((who, member)) = rng
                .pick(&who)
                .and_then(|(i, s)| s.member.clone().map(|m| (*i, m)))
            else {
                return false;
            };
            if let Some(s) = w.slots().get_mut(who) {
                s.manager_busy = true;
            }
            let after = rng.range(config::SUCCESSOR_AFTER_MS.0, config::SUCCESSOR_AFTER_MS.1);
            let mut successor_rng = Prng::new(rng.next_u64());
            let w = w.clone();
            tokio::spawn(async move {
                if w.retire_slot(who, member).await {
                    tokio::time::sleep(Duration::from_millis(after)).await;
                    w.bring_up(who, &mut successor_rng).await;
                }
            });
            true
        }
    }
}

fn spawn_manager(
    w: &Arc<Workload>,
    slot: usize,
    member: Option<Member>,
    allow: Option<Vec<String>>,
) -> bool {
    let Some(member) = member else {
        return false;
    };
    if let Some(s) = w.slots().get_mut(slot) {
        s.manager_busy = true;
    }
    let w = w.clone();
    tokio::spawn(async move {
        w.manager_write(slot, member, allow).await;
    });
    true
}

/// Slots of a fresh population: `local.ag00` … in order.
pub fn population(n: usize) -> Vec<Slot> {
    (0..n)
        .map(|i| Slot {
            actor: format!("ag{i:02}"),
            member: None,
            online: false,
            joined: Default::default(),
            allow: Vec::new(),
            manager_busy: false,
            lifecycles: 0,
            tx: None,
        })
        .collect()
}
