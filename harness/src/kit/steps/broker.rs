//! Brokers and the network between them and the daemon: signals to a node (a crash, a stop that
//! leaves its sockets open, a clean shutdown), a restart on the same port and store, a proxy in
//! front of a node that blackholes, cuts or holds what crosses it, the broker's own count of
//! connections it accepted, and an observation window.

use std::time::{Duration, Instant};

use serde::Deserialize;

use super::verb::{Ctx, Kind, Refs, DEFAULT_WITHIN};
use crate::kit::failure::{Failure, StepResult};
use crate::kit::under_test::DaemonUnderTest;
use crate::kit::world::World;
use crate::rig::proxy::TcpProxy;

pub const VERBS: &[&str] = &[
    "broker",
    "proxy",
    "proxy_fault",
    "expect_held",
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
    RememberConnections {
        name: String,
    },
    ExpectConnections {
        /// A name `remember_connections` gave.
        after: String,
        opened: u64,
    },
    Observe {
        /// ms, or an expression of the case's variables (`"3 * ping"`).
        ms: crate::kit::expr::Duration,
    },
}

/// Longest observation window a case may ask for.
const OBSERVE_MAX: Duration = Duration::from_secs(600);

impl BrokerStep {
    pub fn default_within(&self) -> Option<Duration> {
        match self {
            BrokerStep::Broker {
                fault: BrokerFault::Restart | BrokerFault::Kill,
                ..
            }
            | BrokerStep::ExpectHeld { .. } => Some(DEFAULT_WITHIN),
            _ => None,
        }
    }

    pub fn unsupported(&self, _daemon: &DaemonUnderTest) -> Option<String> {
        None
    }

    pub fn refs(&self) -> Refs {
        match self {
            BrokerStep::Proxy { name, .. } => Refs::default().creates(Kind::Proxy, name),
            BrokerStep::ProxyFault { proxy, .. } | BrokerStep::ExpectHeld { proxy, .. } => {
                Refs::default().uses(Kind::Proxy, proxy)
            }
            BrokerStep::RememberConnections { name } => {
                Refs::default().creates(Kind::Counter, name)
            }
            BrokerStep::ExpectConnections { after, .. } => {
                Refs::default().uses(Kind::Counter, after)
            }
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
            BrokerStep::RememberConnections { name } => {
                let n = total_connections(w).await?;
                w.counters.insert(name.clone(), n);
                Ok(format!(
                    "remember the broker's accepted connections as {name}"
                ))
            }
            BrokerStep::ExpectConnections { after, opened } => {
                let before = *w.counters.get(after).ok_or_else(|| {
                    Failure::could_not(format!("nothing remembered as {after:?}"))
                })?;
                let now = total_connections(w).await?;
                let got = now.saturating_sub(before);
                if got != *opened {
                    return Err(Failure::new(
                        format!("{opened} connections accepted by the broker since {after}"),
                        format!("{got}"),
                    ));
                }
                Ok(format!(
                    "the broker accepted {opened} connections since {after}"
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

/// Connections every running node accepted so far (`/varz` `total_connections`). A failed read
/// fails the step: it must never read as 0.
async fn total_connections(w: &mut World) -> Result<u64, Failure> {
    let mut total = 0;
    for i in 0..w.mesh.node_count() {
        let Some(node) = w.mesh.node_mut(i) else {
            continue;
        };
        if !node.is_running() {
            continue;
        }
        let varz = node.varz().await?;
        total += varz["total_connections"].as_u64().ok_or_else(|| {
            Failure::could_not(format!("/varz of node {i} has no total_connections"))
        })?;
    }
    Ok(total)
}
