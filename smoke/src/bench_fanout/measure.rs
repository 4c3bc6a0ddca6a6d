//! What the benchmark reads, none of it per frame while a run is measured: CPU time from
//! `/proc/<pid>/stat`, completion from the DLV stream's state (polled), start and end times
//! from the broker's own timestamps, and, after a latency run, the stored times of every post
//! and frame read back from the streams.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use async_nats::jetstream::stream::{State, Stream};
use cotal_delivery::wire::{message_id, Plane3DeliveryFrame, DELIVERY_FRAME_HEADER};
use futures::{StreamExt, TryStreamExt};

/// `/proc/<pid>/stat` counts CPU time in clock ticks of `USER_HZ`, fixed at 100 per second by
/// the kernel's ABI on Linux.
const USER_HZ: u64 = 100;
/// How often the DLV stream's state is read while a run completes (one `STREAM.INFO` request
/// each; the throughput itself is timed by the broker's timestamps, not by this cadence).
pub const POLL_EVERY: Duration = Duration::from_millis(20);

/// CPU time (user + system) a process has used, read two ways: `ticks` from
/// `/proc/<pid>/stat` (every thread, exited ones included, in 10 ms steps) and `ns` summed over
/// `/proc/<pid>/task/*/schedstat` (live threads only, to the nanosecond). A raw run at 10
/// members uses about 70 ms of CPU, which the ticks alone would give to ±14 %.
#[derive(Clone, Copy, Default)]
pub struct CpuTime {
    ticks: Duration,
    ns: Duration,
}

impl CpuTime {
    /// Of process `pid`, or of this process for `None`.
    pub fn of(pid: Option<u32>) -> Result<CpuTime, String> {
        let dir = match pid {
            Some(p) => format!("/proc/{p}"),
            None => "/proc/self".to_string(),
        };
        let path = format!("{dir}/stat");
        let stat = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        // Fields after the command name, which is in parentheses and may hold spaces: state
        // is field 3, utime 14 and stime 15 (proc(5)).
        let after = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest)
            .ok_or_else(|| format!("{path}: no command name"))?;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let tick = |i: usize| -> Result<u64, String> {
            fields
                .get(i)
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| format!("{path}: field {} unreadable", i + 3))
        };
        let ticks = tick(11)? + tick(12)?;
        let mut ns = 0u64;
        let tasks = format!("{dir}/task");
        for task in std::fs::read_dir(&tasks).map_err(|e| format!("{tasks}: {e}"))? {
            let Ok(task) = task else { continue };
            // A thread that exits meanwhile has no file any more: the ticks still count it.
            if let Ok(line) = std::fs::read_to_string(task.path().join("schedstat")) {
                ns += line
                    .split_whitespace()
                    .next()
                    .and_then(|f| f.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        Ok(CpuTime {
            ticks: Duration::from_micros(ticks * 1_000_000 / USER_HZ),
            ns: Duration::from_nanos(ns),
        })
    }

    fn add(self, other: CpuTime) -> CpuTime {
        CpuTime {
            ticks: self.ticks + other.ticks,
            ns: self.ns + other.ns,
        }
    }

    /// CPU used since `earlier`: the nanosecond sum, unless the ticks say more than two ticks
    /// beyond it (a thread that used CPU exited meanwhile and left the sum).
    fn since(&self, earlier: &CpuTime) -> Duration {
        let ns = self.ns.saturating_sub(earlier.ns);
        let ticks = self.ticks.saturating_sub(earlier.ticks);
        if ticks > ns + Duration::from_millis(20) {
            ticks
        } else {
            ns
        }
    }
}

/// CPU used so far by the process that runs the pipeline (the daemon or the raw client), by
/// the broker (every node of a cluster) and by this benchmark process.
#[derive(Clone, Copy)]
pub struct CpuMark {
    side: CpuTime,
    brokers: CpuTime,
    bench: CpuTime,
    at: Instant,
}

/// CPU used between two marks, and the wall time between them.
#[derive(Clone, Copy, Default)]
pub struct CpuSpent {
    pub side: Duration,
    pub brokers: Duration,
    pub bench: Duration,
    pub wall: Duration,
}

impl CpuMark {
    pub fn take(side: u32, brokers: &[u32]) -> Result<CpuMark, String> {
        let mut b = CpuTime::default();
        for pid in brokers {
            b = b.add(CpuTime::of(Some(*pid))?);
        }
        Ok(CpuMark {
            side: CpuTime::of(Some(side))?,
            brokers: b,
            bench: CpuTime::of(None)?,
            at: Instant::now(),
        })
    }

    pub fn spent_until(&self, later: &CpuMark) -> CpuSpent {
        CpuSpent {
            side: later.side.since(&self.side),
            brokers: later.brokers.since(&self.brokers),
            bench: later.bench.since(&self.bench),
            wall: later.at.saturating_duration_since(self.at),
        }
    }
}

/// A field of `/proc/<pid>/status` counted in kB (`VmRSS:`, `VmHWM:`), 0 if unreadable.
pub fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// The load average (1, 5, 15 min) as `/proc/loadavg` has it.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Waits (bounded) until `dlv` holds at least `frames` messages; its state then, or `None`
/// if the bound passed first.
pub async fn wait_frames(
    dlv: &Stream<()>,
    frames: u64,
    bound: Duration,
) -> Result<Option<State>, String> {
    let deadline = Instant::now() + bound;
    loop {
        let info = dlv.get_info().await.map_err(|e| format!("DLV info: {e}"))?;
        if info.state.messages >= frames {
            return Ok(Some(info.state));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// Broker timestamp of a stored message, in nanoseconds since the epoch.
pub async fn stored_at_ns(stream: &Stream<()>, seq: u64) -> Result<i128, String> {
    stream
        .get_raw_message(seq)
        .await
        .map(|m| m.time.unix_timestamp_nanos())
        .map_err(|e| format!("message {seq}: {e}"))
}

/// Messages per subject of `stream` under `filter`.
pub async fn per_subject(
    stream: &Stream<()>,
    filter: &str,
) -> Result<HashMap<String, usize>, String> {
    stream
        .info_with_subjects(filter)
        .await
        .map_err(|e| format!("subjects of {filter}: {e}"))?
        .try_collect()
        .await
        .map_err(|e| format!("subjects of {filter}: {e}"))
}

/// Checks that DLV message `seq` is a frame as the daemon writes it: `Cotal-Delivery-Frame: 1`,
/// a `Plane3DeliveryFrame` of version 1 on `channel` whose message is on `channel` and names no
/// direct target, and the dedup id `<msg.id><suffix>` for the member whose DLV subject it is
/// on (`suffix_of`).
pub async fn check_frame(
    dlv: &Stream<()>,
    seq: u64,
    channel: &str,
    suffix_of: impl Fn(&str) -> Option<String>,
) -> Result<(), String> {
    let m = dlv
        .get_raw_message(seq)
        .await
        .map_err(|e| format!("frame {seq}: {e}"))?;
    let header = |name: &str| m.headers.get(name).map(|v| v.as_str().to_string());
    let frame: Plane3DeliveryFrame = serde_json::from_slice(&m.payload)
        .map_err(|e| format!("frame {seq} is not a delivery frame: {e}"))?;
    let id = message_id(&frame.msg);
    let want_id = suffix_of(&m.subject).map(|s| format!("{id}{s}"));
    let fine = header(DELIVERY_FRAME_HEADER).as_deref() == Some("1")
        && frame.version == 1
        && frame.channel == channel
        && frame.msg["channel"].as_str() == Some(channel)
        && frame.msg.get("to").is_none()
        && !id.is_empty()
        && want_id.is_some()
        && header("Nats-Msg-Id") == want_id;
    if fine {
        Ok(())
    } else {
        Err(format!(
            "frame {seq} on {} is not the daemon's shape: headers {:?}, body {}",
            m.subject,
            m.headers,
            String::from_utf8_lossy(&m.payload)
        ))
    }
}

/// `Nats-Msg-Id` and broker timestamp (ns) of the first `count` messages of `stream` under
/// `filter`, read with an ordered consumer (after a run, never during one).
pub async fn stored_times(
    stream: &Stream<()>,
    filter: &str,
    count: usize,
    bound: Duration,
) -> Result<Vec<(String, i128)>, String> {
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: filter.to_string(),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("read back {filter}: {e}"))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| format!("read back {filter}: {e}"))?;
    let mut out = Vec::with_capacity(count);
    let work = async {
        while out.len() < count {
            match messages.next().await {
                Some(Ok(m)) => {
                    let id = m
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("Nats-Msg-Id"))
                        .map(|v| v.as_str().to_string())
                        .unwrap_or_default();
                    let at = m
                        .info()
                        .map(|i| i.published.unix_timestamp_nanos())
                        .map_err(|e| e.to_string())?;
                    out.push((id, at));
                }
                Some(Err(e)) => return Err(format!("read back {filter}: {e}")),
                None => return Err(format!("read back {filter}: the stream ended")),
            }
        }
        Ok(())
    };
    tokio::time::timeout(bound, work)
        .await
        .map_err(|_| format!("read back {filter}: not {count} messages within the bound"))??;
    Ok(out)
}

/// Percentile `p` (0..=1) of sorted `v`, 0 when empty.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    v.get(((v.len().max(1) - 1) as f64 * p).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bound on the spin below: far above the 20 ms of CPU it waits for, on a loaded machine.
    const SPIN_BOUND: Duration = Duration::from_secs(10);

    /// Both readings of this very process advance while it spins, agree within two ticks,
    /// and reading by pid agrees with reading `self`. Mutations seen failing: fields 13 and 14
    /// of `stat` (cutime, cstime: 0 here) instead of 11 and 12, and the second `schedstat`
    /// field (time waiting to run) instead of the first.
    #[test]
    fn own_cpu_time_advances_while_spinning() {
        let before = CpuTime::of(None).expect("own stat");
        let deadline = Instant::now() + SPIN_BOUND;
        let mut x = 0u64;
        let mut now = before;
        let enough = Duration::from_millis(60);
        while (now.ticks < before.ticks + enough || now.ns < before.ns + enough)
            && Instant::now() < deadline
        {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            }
            now = CpuTime::of(None).expect("own stat");
        }
        let (ticks, ns) = (now.ticks - before.ticks, now.ns.saturating_sub(before.ns));
        assert!(
            ticks >= enough && ns >= enough,
            "own CPU advanced {ticks:?} (stat) and {ns:?} (schedstat) after spinning up to {} s",
            SPIN_BOUND.as_secs()
        );
        let by_pid = CpuTime::of(Some(std::process::id())).expect("stat by pid");
        assert!(by_pid.ns >= now.ns && by_pid.ticks >= now.ticks);
        let (total_ticks, total_ns) = (by_pid.ticks, by_pid.ns);
        let gap = total_ticks.abs_diff(total_ns);
        assert!(
            gap <= Duration::from_millis(20),
            "stat {total_ticks:?} and schedstat {total_ns:?} of one process differ by {gap:?}"
        );
    }
}
