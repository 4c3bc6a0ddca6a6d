//! Brokers and the network between them and the daemon: signals to a node (a crash, a stop that
//! leaves its sockets open, a clean shutdown), a restart on the same port and store, a proxy in
//! front of a node that blackholes, cuts or holds what crosses it, the broker's own count of
//! connections it accepted, and an observation window.

use std::time::{Duration, Instant};

use serde::Deserialize;

use std::collections::BTreeSet;

use super::verb::{poll, Ctx, Kind, Profiled, Refs, DEFAULT_WITHIN};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;
use crate::rig::broker::Broker;
use crate::rig::connz::{BrokerConn, ConnState};
use crate::rig::proxy::TcpProxy;

pub const VERBS: &[&str] = &[
    "broker",
    "proxy",
    "open_broker",
    "expect_open_broker",
    "proxy_fault",
    "expect_held",
    "expect_nothing_held",
    "remember_connections",
    "expect_connections",
    "observe",
];

/// A fault of a broker node.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum BrokerFault {
    Kill,
    Term,
    Stop,
    Cont,
    Restart,
}

/// A fault of a proxy.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ProxyFault {
    Blackhole,
    BlackholeNew,
    BlackholeEstablished,
    Cut,
    Heal,
    Hold,
    Release,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum BrokerStep {
    Broker {
        fault: BrokerFault,
        #[serde(default)]
        node: usize,
    },
    Proxy {
        name: String,
        #[serde(default)]
        node: usize,
    },
    /// A JetStream broker that requires no authentication (open dev mode), apart from the mesh,
    /// behind a proxy of this name: `start = { …, via = name }` dials it.
    OpenBroker {
        name: String,
    },
    /// What the open broker behind `name` holds: its JetStream streams and consumers (KV
    /// buckets are streams), counted by the broker.
    ExpectOpenBroker {
        name: String,
        streams: u64,
        consumers: u64,
    },
    ProxyFault {
        proxy: String,
        fault: ProxyFault,
        #[serde(default)]
        pattern: Option<String>,
    },
    ExpectHeld {
        proxy: String,
        contains: String,
    },
    /// The proxy's armed hold never triggered: no client chunk carried its pattern so far.
    ExpectNothingHeld {
        proxy: String,
    },
    RememberConnections {
        name: String,
        /// First wait until the broker lists this daemon's standing connections open.
        #[serde(default)]
        daemon: Option<String>,
    },
    ExpectConnections {
        /// A name `remember_connections` gave.
        after: String,
        /// The daemon (or standby host) the connections are counted for.
        daemon: String,
        opened: u64,
    },
    Observe {
        /// ms, or an expression of the case's variables (`"3 * ping"`).
        ms: crate::kit::expr::Duration,
    },
}

/// Longest observation window a case may ask for.
const OBSERVE_MAX: Duration = Duration::from_secs(600);

impl Profiled for BrokerStep {}

impl BrokerStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            BrokerStep::Broker {
                fault: BrokerFault::Restart | BrokerFault::Kill,
                ..
            }
            | BrokerStep::ExpectHeld { .. }
            | BrokerStep::RememberConnections {
                daemon: Some(_), ..
            } => Some(DEFAULT_WITHIN),
            _ => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            BrokerStep::Proxy { name, .. } | BrokerStep::OpenBroker { name } => {
                Refs::default().creates(Kind::Proxy, name)
            }
            BrokerStep::ExpectOpenBroker { name, .. } => Refs::default().uses(Kind::Proxy, name),
            BrokerStep::ProxyFault { proxy, .. }
            | BrokerStep::ExpectHeld { proxy, .. }
            | BrokerStep::ExpectNothingHeld { proxy } => Refs::default().uses(Kind::Proxy, proxy),
            BrokerStep::RememberConnections { name, daemon } => Refs::default()
                .uses_opt(Kind::Daemon, daemon.as_ref())
                .creates(Kind::Counter, name),
            BrokerStep::ExpectConnections { after, daemon, .. } => Refs::default()
                .uses(Kind::Counter, after)
                .uses(Kind::Daemon, daemon),
            BrokerStep::Broker { .. } | BrokerStep::Observe { .. } => Refs::default(),
        }
    }

    pub async fn run(&self, w: &mut World, ctx: Ctx) -> StepResult {
        match self {
            BrokerStep::Broker { fault, node } => {
                let n = w.mesh.node_count();
                let b = w
                    .mesh
                    .node_mut(*node)
                    .ok_or_else(|| Failure::could_not(format!("no broker node {node} (of {n})")))?;
                // A kill's event is the signal, not the reaping that follows it.
                let mut dealt = None;
                match fault {
                    BrokerFault::Kill => {
                        dealt = Some(Instant::now());
                        b.kill()?;
                        b.wait_exit(ctx.left()).await?;
                    }
                    BrokerFault::Term => b.terminate()?,
                    BrokerFault::Stop => b.freeze()?,
                    BrokerFault::Cont => b.thaw()?,
                    BrokerFault::Restart => {
                        b.restart().await?;
                    }
                }
                w.happened_at = dealt;
                let what = match fault {
                    BrokerFault::Kill => "SIGKILL to",
                    BrokerFault::Term => "SIGTERM to",
                    BrokerFault::Stop => "SIGSTOP to",
                    BrokerFault::Cont => "SIGCONT to",
                    BrokerFault::Restart => "restart (same port and store) of",
                };
                if n > 1 {
                    Ok(format!("{what} broker node {node}"))
                } else {
                    Ok(format!("{what} the broker"))
                }
            }
            BrokerStep::Proxy { name, node } => {
                let port = w
                    .mesh
                    .node(*node)
                    .ok_or_else(|| Failure::could_not(format!("no broker node {node}")))?
                    .port();
                let p = TcpProxy::start(port).await?;
                w.proxies.insert(name.clone(), p);
                Ok(format!("proxy {name} in front of broker node {node}"))
            }
            BrokerStep::OpenBroker { name } => {
                let b = Broker::builder().start().await?;
                let p = TcpProxy::start(b.port()).await?;
                w.proxies.insert(name.clone(), p);
                w.open_brokers.insert(name.clone(), b);
                Ok(format!(
                    "proxy {name} in front of a broker that requires no authentication"
                ))
            }
            BrokerStep::ExpectOpenBroker {
                name,
                streams,
                consumers,
            } => {
                let b = w.open_brokers.get(name).ok_or_else(|| {
                    Failure::could_not(format!("no open broker {name} (an `open_broker` step)"))
                })?;
                let jsz = b.jsz().await?;
                let held = (
                    jsz["streams"].as_u64().unwrap_or(0),
                    jsz["consumers"].as_u64().unwrap_or(0),
                );
                if held != (*streams, *consumers) {
                    return Err(Failure::new(
                        format!(
                            "the open broker {name} to hold {streams} stream(s) and {consumers} consumer(s)"
                        ),
                        format!("{} stream(s) and {} consumer(s)", held.0, held.1),
                    ));
                }
                Ok(format!(
                    "the open broker {name} holds {streams} stream(s) and {consumers} consumer(s)"
                ))
            }
            BrokerStep::ProxyFault {
                proxy,
                fault,
                pattern,
            } => {
                let p = w.proxy(proxy)?;
                if (*fault == ProxyFault::Hold) != pattern.is_some() {
                    return Err(Failure::could_not(
                        "`pattern` goes with `fault = \"hold\"` and only with it",
                    ));
                }
                let what = match fault {
                    ProxyFault::Blackhole => {
                        p.blackhole();
                        "blackholes every connection".to_string()
                    }
                    ProxyFault::BlackholeNew => {
                        p.blackhole_new();
                        "blackholes new connections".to_string()
                    }
                    ProxyFault::BlackholeEstablished => {
                        p.blackhole_established();
                        "blackholes established connections".to_string()
                    }
                    ProxyFault::Cut => {
                        p.cut_established();
                        "cuts every connection".to_string()
                    }
                    ProxyFault::Heal => {
                        p.heal();
                        "heals".to_string()
                    }
                    ProxyFault::Hold => {
                        let pat = pattern.as_deref().unwrap_or_default();
                        p.hold_from(pat.as_bytes());
                        format!("holds client bytes from {pat:?} on")
                    }
                    ProxyFault::Release => {
                        p.release();
                        "releases what it held".to_string()
                    }
                };
                Ok(format!("proxy {proxy} {what}"))
            }
            BrokerStep::ExpectHeld { proxy, contains } => {
                let p = w.proxy(proxy)?;
                p.wait_held(contains, ctx.left()).await.map_err(|_| {
                    Failure::new(
                        format!("proxy {proxy} to hold client bytes containing {contains:?}"),
                        format!("it holds {} bytes without it", p.held().len()),
                    )
                })?;
                Ok(format!("proxy {proxy} holds {contains:?}"))
            }
            BrokerStep::ExpectNothingHeld { proxy } => {
                let p = w.proxy(proxy)?;
                if !p.hold_armed() {
                    return Err(Failure::could_not(format!(
                        "proxy {proxy} has no hold armed (proxy_fault hold first)"
                    )));
                }
                let held = p.held();
                if !held.is_empty() {
                    return Err(Failure::new(
                        format!("proxy {proxy} to hold nothing"),
                        format!(
                            "it holds {} bytes: {:?}",
                            held.len(),
                            String::from_utf8_lossy(&held[..held.len().min(200)])
                        ),
                    ));
                }
                Ok(format!("proxy {proxy} holds nothing"))
            }
            BrokerStep::RememberConnections { name, daemon } => {
                let standing_users = match daemon {
                    Some(d) => Some(standing_users(w, d)?),
                    None => None,
                };
                let nodes = running(w);
                if let (Some(d), Some(users)) = (daemon, &standing_users) {
                    standing(&nodes, ctx, d, users).await?;
                }
                let seen = connections(&nodes).await?;
                w.connection_sets.insert(
                    name.clone(),
                    seen.iter().map(|(n, c)| (*n, c.cid)).collect(),
                );
                Ok(match daemon {
                    Some(d) => format!(
                        "daemon {d}'s standing connections are open; remember the broker's connections as {name}"
                    ),
                    None => format!("remember the broker's connections as {name}"),
                })
            }
            BrokerStep::ExpectConnections {
                after,
                daemon,
                opened,
            } => {
                let before = w.connection_sets.get(after).cloned().ok_or_else(|| {
                    Failure::could_not(format!("nothing remembered as {after:?}"))
                })?;
                let users = daemon_users(w, daemon)?;
                let nodes = running(w);
                let got: Vec<String> = connections(&nodes)
                    .await?
                    .into_iter()
                    .filter(|(n, c)| !before.contains(&(*n, c.cid)) && attributed(c, &users))
                    .map(|(n, c)| describe(n, &c))
                    .collect();
                if got.len() as u64 != *opened {
                    return Err(Failure::new(
                        format!(
                            "{opened} connections of daemon {daemon} accepted by the broker since {after}"
                        ),
                        format!("{}: {}", got.len(), got.join("; ")),
                    ));
                }
                Ok(format!(
                    "the broker accepted {opened} connections of daemon {daemon} since {after}"
                ))
            }
            BrokerStep::Observe { ms } => {
                let ms = ms.eval(&w.vars).map_err(Failure::could_not)?;
                let d = Duration::from_millis(ms);
                if d > OBSERVE_MAX {
                    return Err(Failure::could_not(format!(
                        "an observation window longer than {} s",
                        OBSERVE_MAX.as_secs()
                    )));
                }
                // From `since` when the step names one: "until 7 s after the expiry".
                let until = ctx.started + d;
                tokio::time::sleep_until(until.into()).await;
                Ok(format!("observe for {ms} ms"))
            }
        }
    }
}

/// The nodes running now.
fn running(w: &mut World) -> Vec<(usize, &Broker)> {
    let up: Vec<usize> = (0..w.mesh.node_count())
        .filter(|i| w.mesh.node_mut(*i).is_some_and(|n| n.is_running()))
        .collect();
    up.into_iter()
        .filter_map(|i| w.mesh.node(i).map(|b| (i, b)))
        .collect()
}

/// Every connection the nodes `nodes` list, open and closed, with its node. A failed read fails
/// the step: it must never read as none.
async fn connections(nodes: &[(usize, &Broker)]) -> Result<Vec<(usize, BrokerConn)>, Failure> {
    let mut out = Vec::new();
    for (i, node) in nodes {
        for c in node.connz(ConnState::All).await? {
            out.push((*i, c));
        }
    }
    Ok(out)
}

/// The user nkeys of `daemon`'s credentials as its root holds them now: the delivery credential
/// it was started with, and its root's membership-rw, `$SYS` observer and evictor credentials
/// (a file that is missing or no credential names nobody).
fn daemon_users(w: &World, daemon: &str) -> Result<BTreeSet<String>, Failure> {
    let creds = w
        .daemon_creds
        .get(daemon)
        .ok_or_else(|| Failure::could_not(format!("no daemon {daemon:?} was started")))?;
    let root = w
        .daemon_roots
        .get(daemon)
        .ok_or_else(|| Failure::could_not(format!("no daemon {daemon:?} was started")))?;
    let ws = cotal_delivery::provision::Workspace::new(root);
    let space = w.mesh.space();
    Ok([
        creds.clone(),
        ws.membership_rw_creds_path(space),
        ws.membership_observer_creds_path(space),
        ws.connection_evictor_creds_path(space),
    ]
    .iter()
    .filter_map(|p| cotal_delivery::base::read_creds_file(p).ok())
    .filter_map(|c| c.public_key().ok())
    .collect())
}

/// Whether the broker's connection `c` is the daemon's: it authenticated as one of `users`, or it
/// never authenticated as anyone (a bare check of the port or a refused credential: the kit's
/// own connections always authenticate, and are named `harness-…`). A connection named as the
/// kit's agents name theirs (`agent <principal>`, the agent library's) is never the daemon's: an
/// agent of an earlier case, still dialling a port its broker held, was refused by a later case's
/// broker given that port and counted for a standby host (docs/qualify.md, "Same verdict across
/// builds and launch paths").
fn attributed(c: &BrokerConn, users: &BTreeSet<String>) -> bool {
    if c.name.starts_with("harness-") || c.name.starts_with("agent ") {
        return false;
    }
    match c.user.as_deref() {
        Some(u) if !u.is_empty() => users.contains(u),
        _ => true,
    }
}

fn describe(node: usize, c: &BrokerConn) -> String {
    format!(
        "node {node} cid {} {}{}{}",
        c.cid,
        if c.name.is_empty() {
            "(no name)".to_string()
        } else {
            format!("{:?}", c.name)
        },
        c.user
            .as_deref()
            .filter(|u| !u.is_empty())
            .map(|u| format!(" as {u}"))
            .unwrap_or_else(|| " (never authenticated)".into()),
        c.reason
            .as_deref()
            .map(|r| format!(", closed: {r}"))
            .unwrap_or_default()
    )
}

/// The connections the seeds name as a serving daemon's own, beside its resident one: the
/// checkpoint timer writer's ("on its own connection under the same delivery credential") and the
/// membership feed's (its membership-rw credential). Until the broker lists them open, a count
/// taken would race the daemon's start-up.
async fn standing(
    nodes: &[(usize, &Broker)],
    ctx: Ctx,
    daemon: &str,
    (delivery, rw): &(String, String),
) -> Result<(), Failure> {
    poll(
        ctx,
        &format!("the broker to list daemon {daemon}'s standing connections open (two under its delivery credential, one under its membership-rw credential)"),
        || async {
            let open: Vec<BrokerConn> = connections(nodes)
                .await
                .map_err(|f| f.actual)?
                .into_iter()
                .map(|(_, c)| c)
                .filter(|c| c.reason.is_none() && c.raw["stop"].is_null())
                .collect();
            let count = |u: &str| open.iter().filter(|c| c.user.as_deref() == Some(u)).count();
            let (d, r) = (count(delivery), count(rw));
            if d >= 2 && r >= 1 {
                Ok(())
            } else {
                Err(format!(
                    "{d} open under its delivery credential, {r} under its membership-rw credential"
                ))
            }
        },
    )
    .await
}

/// The user nkeys of `daemon`'s delivery and membership-rw credentials.
fn standing_users(w: &World, daemon: &str) -> Result<(String, String), Failure> {
    let delivery = creds_user(w.daemon_creds.get(daemon), daemon)?;
    let root = w
        .daemon_roots
        .get(daemon)
        .ok_or_else(|| Failure::could_not(format!("no daemon {daemon:?} was started")))?;
    let rw = creds_user(
        Some(
            &cotal_delivery::provision::Workspace::new(root)
                .membership_rw_creds_path(w.mesh.space()),
        ),
        daemon,
    )?;
    Ok((delivery, rw))
}

fn creds_user(path: Option<&std::path::PathBuf>, daemon: &str) -> Result<String, Failure> {
    let path =
        path.ok_or_else(|| Failure::could_not(format!("no daemon {daemon:?} was started")))?;
    cotal_delivery::base::read_creds_file(path)
        .map_err(|e| Failure::could_not(format!("read {}: {e}", path.display())))?
        .public_key()
        .map_err(|e| Failure::could_not(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(name: &str, user: Option<&str>) -> BrokerConn {
        BrokerConn {
            cid: 1,
            name: name.into(),
            account: String::new(),
            user: user.map(str::to_string),
            jwt: None,
            tags: Vec::new(),
            reason: Some("Authentication Failure".into()),
            subs: Vec::new(),
            start: String::new(),
            raw: serde_json::Value::Null,
        }
    }

    /// A refused dial counts for the daemon unless it is named as the kit's own (an agent's or
    /// the harness's). Mutation: drop `|| c.name.starts_with("agent ")` from `attributed`, and
    /// the agent's refused dial counts (seen failing).
    #[test]
    fn a_refused_agent_dial_is_not_the_daemons() {
        let users: BTreeSet<String> = ["UDAEMON".to_string()].into();
        assert!(attributed(&conn("", None), &users));
        assert!(attributed(&conn("cotal:delivery", None), &users));
        assert!(attributed(&conn("cotal:delivery", Some("UDAEMON")), &users));
        assert!(!attributed(&conn("cotal:delivery", Some("UOTHER")), &users));
        assert!(!attributed(&conn("agent local.dave", None), &users));
        assert!(!attributed(&conn("harness-inspector", None), &users));
    }
}
