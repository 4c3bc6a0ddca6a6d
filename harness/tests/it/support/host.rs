//! Shared test-side reads of the multi-space host tests (`host.rs`, `host_lanes.rs`): a lane's
//! lines, the lease key's history and rows read from the broker, and `ctl.delivery` probes.
#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv::Operation;
use cotal_delivery::agent::Agent;
use cotal_delivery::base::read_creds_file;
use cotal_delivery::provision::Workspace;
use cotal_delivery::wire::LeaseInfo;
use cotal_delivery::wire::{Principal, Space, LEASE_KEY};
use delivery_harness::rig::daemon::Daemon;
use delivery_harness::rig::mesh::Inspector;
use futures::StreamExt;

/// What one wait of the multi-space host tests may take, in s: a lane up or closed, a lease
/// row changing hands, a lane answering or falling silent, a host exiting. Above
/// [`super::BOUND`] because one host starts a daemon per lane at once.
pub const HOST_BOUND: Duration = Duration::from_secs(30);
/// The standby retry the tests run with (the default 5 s of docs/host.md, shrunk through its
/// override).
pub const RETRY_MS: &str = "500";

/// The lease holder (`local.<nkey>`) of `space`'s delivery credential on `root`.
pub fn holder_of(root: &Path, space: &Space) -> String {
    let cred = read_creds_file(&Workspace::new(root).delivery_creds_path(space)).expect("creds");
    Principal::for_nkey(&cred.public_key().expect("nkey"))
        .expect("principal")
        .dot_form()
}

/// The lines of one lane (its `lane <space>: ` prefix removed), in order, without its side
/// components' lines (timer writer, membership feed: their own tests judge them).
pub fn lane_lines(d: &Daemon, space: &str) -> Vec<String> {
    let prefix = format!("lane {space}: ");
    d.lines()
        .iter()
        .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        .filter(|l| !delivery_harness::rig::daemon::is_component_line(l))
        .collect()
}

/// [`lane_lines`] without a standby's wake line (`• delivery host: the lease row … claiming the
/// lease now`). With a short retry the row may go while the lane waits (its watch wakes it and
/// says so) or while an attempt is under way (that attempt's own claim takes it, and nothing
/// wakes): a test about something else snapshots only the lines that do not hang on that
/// timing. `host::standby` proves the wake line itself, its retry a minute away.
pub fn lane_lines_without_wakes(d: &Daemon, space: &str) -> Vec<String> {
    lane_lines(d, space)
        .into_iter()
        .filter(|l| {
            !(l.starts_with("• delivery host: the lease row ")
                && l.ends_with("claiming the lease now"))
        })
        .collect()
}

/// Takes out of a lane's `lines` its report of a row whose holder is not running (the
/// attempt's three lines: the sweeps bound, the daemon's refusal naming a holder that is not
/// running, the host's standing-by line; reported once). Between a holder's SIGKILL and its
/// row's expiry a retry may meet that row or not, by timing alone: a snapshot of the rest is the
/// same either way. Returns whether a report was taken out.
pub fn without_not_running_report(lines: &mut Vec<String>) -> bool {
    let Some(at) = lines
        .iter()
        .position(|l| l.contains("standing by — the lease row is held by"))
    else {
        return false;
    };
    assert!(
        at >= 2 && lines[at - 1].contains("belongs to a holder that is not running"),
        "{lines:?}"
    );
    lines.drain(at - 2..=at);
    true
}

/// How many of the lane's lines contain `needle`.
pub fn count_lines(d: &Daemon, space: &str, needle: &str) -> usize {
    lane_lines(d, space)
        .iter()
        .filter(|l| l.contains(needle))
        .count()
}

/// Waits until the lane wrote `n` lines containing `needle`.
pub async fn wait_count(d: &Daemon, space: &str, needle: &str, n: usize) {
    let deadline = tokio::time::Instant::now() + HOST_BOUND;
    while count_lines(d, space, needle) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "lane {space}: fewer than {n} lines with {needle:?}:\n{}",
            d.transcript()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every write to the lease key from now on, as (operation, holder, incarnation).
pub async fn lease_history(
    insp: &Inspector,
) -> impl futures::Stream<Item = (Operation, Option<LeaseInfo>)> {
    let kv = insp
        .js
        .get_key_value(insp.names().delivery_bucket())
        .await
        .expect("lease bucket");
    let watch = kv.watch(LEASE_KEY).await.expect("watch");
    watch.filter_map(|e| async move {
        let e = e.ok()?;
        let info = serde_json::from_slice::<LeaseInfo>(&e.value).ok();
        Some((e.operation, info))
    })
}

/// Drains what the history stream holds now (it stays quiet for 300 ms).
pub async fn drain<S>(history: &mut std::pin::Pin<Box<S>>) -> Vec<(Operation, Option<LeaseInfo>)>
where
    S: futures::Stream<Item = (Operation, Option<LeaseInfo>)>,
{
    let mut writes = Vec::new();
    while let Ok(Some(w)) = tokio::time::timeout(Duration::from_millis(300), history.next()).await {
        writes.push(w);
    }
    writes
}

/// Waits (bounded) until the lease row read from the broker satisfies `ok`; returns it.
pub async fn wait_row<F: Fn(&Option<LeaseInfo>) -> bool>(
    insp: &Inspector,
    what: &str,
    ok: F,
) -> Option<LeaseInfo> {
    let deadline = tokio::time::Instant::now() + HOST_BOUND;
    loop {
        let row = insp.lease().await.ok().flatten().map(|r| r.info);
        if ok(&row) {
            return row;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the lease row is {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the agent's `ctl.delivery` request is answered within 1 s.
pub async fn answers(p: &Agent) -> bool {
    let args = serde_json::json!({"lifecycleUid": p.lifecycle_uid().as_str()});
    p.request("listMemberships", args, Duration::from_secs(1))
        .await
        .is_ok()
}

/// Waits (bounded) until the agent's lane answers (`true`) or stops answering (`false`).
pub async fn wait_answers(p: &Agent, want: bool, what: &str) {
    let deadline = tokio::time::Instant::now() + HOST_BOUND;
    while answers(p).await != want {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Probes a lane's `ctl.delivery` every 200 ms from the test side until stopped; every probe
/// must be answered within 2 s. `stop()` returns (answered, misses).
pub struct Prober {
    on: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u32, Vec<String>)>,
}

impl Prober {
    pub fn start(agent: Agent) -> Prober {
        let on = Arc::new(AtomicBool::new(true));
        let running = on.clone();
        let task = tokio::spawn(async move {
            let (mut ok, mut missed) = (0u32, Vec::new());
            while running.load(Ordering::SeqCst) {
                let args = serde_json::json!({"lifecycleUid": agent.lifecycle_uid().as_str()});
                match agent
                    .request("listMemberships", args, Duration::from_secs(2))
                    .await
                {
                    Ok(_) => ok += 1,
                    Err(e) => missed.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (ok, missed)
        });
        Prober { on, task }
    }

    pub async fn stop(self) -> (u32, Vec<String>) {
        self.on.store(false, Ordering::SeqCst);
        self.task.await.expect("prober")
    }
}

/// A row no host of these tests writes: another holder's live lease.
pub fn foreign_row() -> LeaseInfo {
    LeaseInfo {
        holder: "local.UFOREIGNHOLDER".into(),
        since: 1,
        ready: true,
        incarnation: "f".repeat(32),
    }
}

/// The end of a two-lane run: the quiet lane answered every probe (at least `min_ok`) and
/// wrote no close or refusal line; SIGTERM exits 0 and both rows are released.
pub async fn quiet_lane_then_stop(
    prober: Prober,
    min_ok: u32,
    host: &mut Daemon,
    quiet: &str,
    inspectors: [&Inspector; 2],
) {
    let (ok, missed) = prober.stop().await;
    assert!(ok >= min_ok, "{quiet} probed {ok} times");
    assert!(missed.is_empty(), "{quiet} missed {missed:?}");
    assert!(
        !lane_lines(host, quiet)
            .iter()
            .any(|l| l.contains("closed") || l.contains("refused")),
        "{}",
        host.transcript()
    );
    host.terminate().expect("SIGTERM");
    assert_eq!(
        host.wait_exit(HOST_BOUND).await.expect("exit").code(),
        Some(0)
    );
    for ins in inspectors {
        assert!(ins.lease().await.expect("read").is_none(), "released");
    }
}

/// How many consumers named `<prefix>…` on the lease stream the broker knows a subscription of
/// (`push_bound`): a standby's lease watch is `standbywatch_<id>`, a daemon's `leasewatch_<inc>`.
pub async fn bound_watches(insp: &Inspector, prefix: &str) -> usize {
    let lease_stream = cotal_delivery::wire::SpaceNames::kv_stream(&insp.names.delivery_bucket());
    let Ok(stream) = insp.js.get_stream(&lease_stream).await else {
        return 0;
    };
    let mut infos = stream.consumers();
    let mut n = 0;
    while let Some(Ok(info)) = infos.next().await {
        if info.name.starts_with(prefix) && info.push_bound {
            n += 1;
        }
    }
    n
}

/// Waits (bounded) until exactly `n` standby watches are bound on the broker.
pub async fn wait_standby_watches(insp: &Inspector, n: usize) {
    let deadline = tokio::time::Instant::now() + HOST_BOUND;
    loop {
        let have = bound_watches(insp, "standbywatch_").await;
        if have == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{have} standby watches bound on the broker, wanted {n}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
