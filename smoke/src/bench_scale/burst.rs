//! A burst of `--burst` durable joins at once (issue 32, item 5): each by an agent of its own
//! (its ACL row written straight into the registry, reading the burst's channel), all sent to
//! a daemon settled in front of the largest point's registry within one flush, over
//! `ctl.delivery` as the agents' own subjects (the benchmark's connection may publish on any).
//!
//! Judged on the broker: every request answered (a join, or a refusal naming why) within
//! [`BURST_BOUND`]; the registry then holds a `durable-active` row for every lifecycle whose
//! join was answered durable and none for a refused one (nothing half-written, nothing lost);
//! the daemon's RSS during the burst against its RSS before it; the lines it logged meanwhile.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use cotal_delivery::wire::{CtlService, LifecycleUid, Principal};
use futures::StreamExt;
use serde_json::{json, Value};

use super::space::{self, Pipe, BULK_OWNER};
use super::{err, progress, r2, rss_kb, Bench, START_BOUND};
use crate::bench_fanout::measure::{loadavg, CpuMark};

/// Bound on every join of the burst being answered.
const BURST_BOUND: Duration = Duration::from_secs(600);
/// How often the daemon's RSS is read during the burst.
const RSS_POLL: Duration = Duration::from_millis(50);
/// Bound on reading the registry's rows back.
const READ_BACK_BOUND: Duration = Duration::from_secs(120);
const CHANNEL: &str = "bulk.burst";
/// Refusal texts quoted in the report, most frequent first.
const QUOTED_REFUSALS: usize = 3;

pub struct Burst {
    pub joins: usize,
    /// Answered `{ok:true, durable:true}`.
    pub durable: usize,
    /// Answered `{ok:true}` without an established backstop.
    pub unestablished: usize,
    /// Refusal texts and how many of each.
    pub refused: BTreeMap<String, usize>,
    /// Never answered within [`BURST_BOUND`].
    pub unanswered: usize,
    /// Spawned requests → last answer.
    pub answered_s: f64,
    pub daemon_cpu_s: f64,
    pub broker_cpu_s: f64,
    pub rss_before_mb: f64,
    pub rss_max_mb: f64,
    /// Rows the registry holds for the channel, `durable-active`, after the burst.
    pub rows_active: usize,
    /// Durable answers without their row, and rows without a durable answer.
    pub missing_rows: usize,
    pub extra_rows: usize,
    /// The daemon's `!`/`✗` lines during the burst (count, first).
    pub warnings: usize,
    pub first_warning: Option<String>,
    pub loadavg: String,
}

impl Burst {
    /// Nothing lost: every join answered, and the registry holds exactly the durable ones.
    pub fn nothing_lost(&self) -> bool {
        self.unanswered == 0 && self.missing_rows == 0 && self.extra_rows == 0
    }
}

pub async fn run(b: &Bench) -> Result<Burst, String> {
    let (mesh, insp) = (&b.mesh, &b.insp);
    let n = b.args.burst;
    let now = cotal_delivery::base::epoch_ms();
    let mut pipe = Pipe::new(insp);
    let mut agents: Vec<(Principal, LifecycleUid)> = Vec::with_capacity(n);
    for i in 0..n {
        let who = space::bulk_principal(&format!("j{i}"))?;
        let uid = LifecycleUid::generate();
        space::write_lifecycle(&mut pipe, &who, &uid, &[CHANNEL.to_string()], false, now).await?;
        agents.push((who, uid));
    }
    pipe.settle().await?;
    // Only the ACL rows: the joins write the member rows.
    let members_bucket = insp.names.members_bucket();
    insp.js
        .get_stream_no_info(cotal_delivery::wire::SpaceNames::kv_stream(&members_bucket))
        .await
        .map_err(err)?
        .purge()
        .filter(space::kv(&members_bucket, &format!("{CHANNEL}/>")))
        .await
        .map_err(|e| format!("purge the burst's member rows: {e}"))?;

    let t0 = Instant::now();
    let mut daemon = mesh.deliver(mesh.space()).spawn().map_err(err)?;
    let started = async {
        daemon
            .wait_for_line("delivery daemon up", START_BOUND)
            .await
            .map_err(err)?;
        super::point::settle(daemon.pid(), t0).await
    }
    .await;
    if let Err(e) = started {
        let _ = daemon.terminate();
        let _ = daemon.wait_exit(Duration::from_secs(15)).await;
        return Err(e);
    }
    let pid = daemon.pid();
    let lines_before = daemon.lines().len();
    let rss_before_mb = rss_kb(pid, "VmRSS:") as f64 / 1024.0;
    progress(&format!(
        "burst: daemon pid {pid} settled, RSS {rss_before_mb:.1} MB; {n} durable joins at once"
    ));

    let prefix = insp.names.space().prefix();
    let mut replies = insp
        .client
        .subscribe(format!("{prefix}.ctl.delivery.{BULK_OWNER}.*.reply.burst"))
        .await
        .map_err(err)?;
    insp.client.flush().await.map_err(err)?;
    let mark = CpuMark::take(pid, &b.brokers)?;
    let sent = Instant::now();
    for (who, uid) in &agents {
        let subject = insp.names.ctl_subject(CtlService::Delivery, who);
        let body = json!({
            "op": "durableJoin",
            "args": {"channel": CHANNEL, "lifecycleUid": uid.as_str()},
            "from": {"id": who.dot_form(), "name": who.actor(), "kind": "agent"},
        });
        insp.client
            .publish_with_reply(
                subject.clone(),
                format!("{subject}.reply.burst"),
                body.to_string().into(),
            )
            .await
            .map_err(err)?;
    }
    insp.client.flush().await.map_err(err)?;

    let mut answered: HashSet<String> = HashSet::with_capacity(n);
    let mut durable: HashSet<String> = HashSet::with_capacity(n);
    let (mut unestablished, mut refused) = (0usize, BTreeMap::<String, usize>::new());
    let mut rss_max = 0u64;
    let mut last_answer = sent.elapsed();
    let deadline = tokio::time::Instant::now() + BURST_BOUND;
    let mut poll = tokio::time::interval(RSS_POLL);
    while answered.len() < n {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => break,
            _ = poll.tick() => rss_max = rss_max.max(rss_kb(pid, "VmRSS:")),
            m = replies.next() => {
                let Some(m) = m else { break };
                // `cotal.<s>.ctl.delivery.<o>.<a>.reply.burst` → `<o>.<a>`
                let who = m
                    .subject
                    .strip_prefix(&format!("{prefix}.ctl.delivery."))
                    .and_then(|r| r.strip_suffix(".reply.burst"))
                    .unwrap_or_default()
                    .to_string();
                if !answered.insert(who.clone()) {
                    continue;
                }
                last_answer = sent.elapsed();
                let v: Value = serde_json::from_slice(&m.payload).unwrap_or_default();
                if v["ok"] == true && v["data"]["durable"] == true {
                    durable.insert(who);
                } else if v["ok"] == true {
                    unestablished += 1;
                } else {
                    let why = v["error"].as_str().unwrap_or("unreadable reply").to_string();
                    *refused.entry(why).or_default() += 1;
                }
            }
        }
    }
    let spent = mark.spent_until(&CpuMark::take(pid, &b.brokers)?);
    rss_max = rss_max.max(rss_kb(pid, "VmRSS:"));
    let _ = replies.unsubscribe().await;
    let warnings: Vec<String> = daemon.lines()[lines_before..]
        .iter()
        .filter(|l| l.starts_with('!') || l.starts_with('✗'))
        .cloned()
        .collect();
    let _ = daemon.terminate();
    let _ = daemon.wait_exit(Duration::from_secs(15)).await;

    let active = rows_active(b).await?;
    let missing_rows = durable.iter().filter(|w| !active.contains(*w)).count();
    let extra_rows = active.iter().filter(|w| !durable.contains(*w)).count();
    let r = Burst {
        joins: n,
        durable: durable.len(),
        unestablished,
        refused,
        unanswered: n - answered.len(),
        answered_s: last_answer.as_secs_f64(),
        daemon_cpu_s: spent.side.as_secs_f64(),
        broker_cpu_s: spent.brokers.as_secs_f64(),
        rss_before_mb,
        rss_max_mb: rss_max as f64 / 1024.0,
        rows_active: active.len(),
        missing_rows,
        extra_rows,
        warnings: warnings.len(),
        first_warning: warnings.first().cloned(),
        loadavg: loadavg(),
    };
    progress(&format!(
        "burst: {} of {n} answered within {:.1} s ({} durable, {} refused), the registry holds {} rows; RSS {:.1} -> max {:.1} MB",
        answered.len(),
        r.answered_s,
        r.durable,
        r.refused.values().sum::<usize>(),
        r.rows_active,
        r.rss_before_mb,
        r.rss_max_mb
    ));
    Ok(r)
}

/// The principals (`<o>.<a>`) whose member row of the burst's channel is `durable-active`, read
/// from the registry (the last message of each key).
async fn rows_active(b: &Bench) -> Result<HashSet<String>, String> {
    let insp = &b.insp;
    let bucket = insp.names.members_bucket();
    let stream = insp
        .js
        .get_stream_no_info(cotal_delivery::wire::SpaceNames::kv_stream(&bucket))
        .await
        .map_err(err)?;
    // `$KV.<bucket>.bulk.burst/<owner>.<actor>.<uid>`: the channel's last segment and the owner
    // share a token, so the filter names both.
    let filter = space::kv(&bucket, &format!("{CHANNEL}/{BULK_OWNER}.*.*"));
    let expected = stream
        .info_with_subjects(filter.clone())
        .await
        .map_err(err)?
        .count()
        .await;
    let mut out = HashSet::new();
    if expected == 0 {
        return Ok(out);
    }
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: filter.clone(),
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("read back {filter}: {e}"))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| format!("read back {filter}: {e}"))?;
    let read = async {
        let mut seen = 0;
        while seen < expected {
            let Some(m) = messages.next().await else {
                break;
            };
            let m = m.map_err(err)?;
            seen += 1;
            let v: Value = serde_json::from_slice(&m.payload).unwrap_or_default();
            if v["state"] == "durable-active" {
                if let Some(owner) = v["owner"].as_str() {
                    out.insert(owner.to_string());
                }
            }
        }
        Ok::<_, String>(())
    };
    tokio::time::timeout(READ_BACK_BOUND, read)
        .await
        .map_err(|_| format!("read back {filter}: not within the bound"))??;
    Ok(out)
}

pub fn print(r: &Burst, args: &super::Args) {
    let mut refusals: Vec<(&String, &usize)> = r.refused.iter().collect();
    refusals.sort_by(|a, b| b.1.cmp(a.1));
    let quoted: Vec<String> = refusals
        .iter()
        .take(QUOTED_REFUSALS)
        .map(|(t, n)| format!("{n} x {t:?}"))
        .collect();
    if args.json {
        println!(
            "{}",
            json!({
                "burst": r.joins, "durable": r.durable, "unestablished": r.unestablished,
                "refused": r.refused.values().sum::<usize>(), "refusals": quoted,
                "unanswered": r.unanswered, "answered_s": r2(r.answered_s),
                "joins_per_s": r2(r.joins as f64 / r.answered_s.max(1e-9)),
                "daemon_cpu_s": r2(r.daemon_cpu_s), "broker_cpu_s": r2(r.broker_cpu_s),
                "rss_before_mb": r2(r.rss_before_mb), "rss_max_mb": r2(r.rss_max_mb),
                "rows_active": r.rows_active, "missing_rows": r.missing_rows,
                "extra_rows": r.extra_rows, "nothing_lost": r.nothing_lost(),
                "daemon_warnings": r.warnings, "first_warning": r.first_warning,
                "loadavg": r.loadavg,
            })
        );
        return;
    }
    println!(
        "burst of {} joins: {} durable, {} unestablished, {} refused{}, {} unanswered, the last answer {:.1} s after the send ({:.0} joins/s; daemon {:.1} s and broker {:.1} s of CPU); registry: {} active rows ({} durable answers without a row, {} rows without one): nothing lost {}; daemon RSS {:.1} -> max {:.1} MB; {} warning lines{}",
        r.joins, r.durable, r.unestablished, r.refused.values().sum::<usize>(),
        if quoted.is_empty() { String::new() } else { format!(" ({})", quoted.join("; ")) },
        r.unanswered, r.answered_s, r.joins as f64 / r.answered_s.max(1e-9), r.daemon_cpu_s,
        r.broker_cpu_s, r.rows_active, r.missing_rows, r.extra_rows,
        if r.nothing_lost() { "yes" } else { "NO" }, r.rss_before_mb, r.rss_max_mb, r.warnings,
        r.first_warning.as_deref().map(|w| format!(" (first: {w})")).unwrap_or_default()
    );
}
