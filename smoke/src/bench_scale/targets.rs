//! Where each target of issue 32 stands: on each axis measured, its largest point against its
//! smallest (the "independent of the size" targets), and at the largest rows point (the
//! absolute ones). Judged here, in the benchmark, never in a timed test.

use serde_json::{json, Value};

use super::point::Point;
use super::Axis;

/// Idle broker messages and CPU per minute: "independent of the rows", read as at most this
/// ratio (the broker's own background work is noisy at a few percent).
const TARGET_IDLE_RATIO_MAX: f64 = 1.25;
/// Daemon CPU per frame of the fixed workload.
const TARGET_CPU_PER_FRAME_RATIO_MAX: f64 = 1.25;
/// RSS growth per members row, bytes.
const TARGET_RSS_PER_ROW_MAX_BYTES: f64 = 1024.0;
/// Peak RSS at the largest point, MB.
const TARGET_PEAK_RSS_MAX_MB: f64 = 128.0;
/// Start to serving, ms.
const TARGET_SERVING_MAX_MS: f64 = 10_000.0;
/// Inventories and inspection answered within, ms.
const TARGET_ANSWER_MAX_MS: f64 = 1_000.0;

/// One verdict: its key (`--json`), what was measured, and whether it is met.
pub struct Verdict {
    pub key: String,
    pub what: String,
    pub met: bool,
}

fn ratio(a: f64, b: f64) -> f64 {
    a / b.max(f64::MIN_POSITIVE)
}

/// Every verdict of the run.
pub fn judge(points: &[Point], axes: &[Axis]) -> Vec<Verdict> {
    let mut out = Vec::new();
    for &axis in axes {
        let mut on: Vec<&Point> = points.iter().filter(|p| p.axes.contains(&axis)).collect();
        on.sort_by_key(|p| axis.size(&p.shape()));
        let (Some(s), Some(l)) = (on.first(), on.last()) else {
            continue;
        };
        if on.len() < 2 {
            continue;
        }
        let (a, n) = (axis.name(), |p: &Point| axis.size(&p.shape()));
        let span = format!("{a} axis, {} against {}", n(l), n(s));
        let idle_msgs = ratio(
            l.idle_in_per_min + l.idle_out_per_min,
            s.idle_in_per_min + s.idle_out_per_min,
        );
        let idle_cpu = ratio(l.idle_broker_cpu_pct, s.idle_broker_cpu_pct);
        let cpu = ratio(l.daemon_us_per_frame, s.daemon_us_per_frame);
        out.push(Verdict {
            key: format!("{a}_idle_broker_msgs_ratio_max_1_25"),
            what: format!("{span}: idle broker messages {idle_msgs:.2} x"),
            met: idle_msgs <= TARGET_IDLE_RATIO_MAX,
        });
        out.push(Verdict {
            key: format!("{a}_idle_broker_cpu_ratio_max_1_25"),
            what: format!(
                "{span}: idle broker CPU {idle_cpu:.2} x ({:.2} -> {:.2} % of a core)",
                s.idle_broker_cpu_pct, l.idle_broker_cpu_pct
            ),
            met: idle_cpu <= TARGET_IDLE_RATIO_MAX,
        });
        out.push(Verdict {
            key: format!("{a}_cpu_per_frame_ratio_max_1_25"),
            what: format!(
                "{span}: daemon CPU per frame {cpu:.2} x ({:.1} -> {:.1} µs)",
                s.daemon_us_per_frame, l.daemon_us_per_frame
            ),
            met: cpu <= TARGET_CPU_PER_FRAME_RATIO_MAX,
        });
        if axis == Axis::Rows {
            let rows = l.shape().rows().saturating_sub(s.shape().rows()).max(1) as f64;
            let per_row = (l.rss_idle_mb - s.rss_idle_mb) * 1024.0 * 1024.0 / rows;
            out.push(Verdict {
                key: "rss_per_row_max_1024_bytes".into(),
                what: format!("{span}: RSS growth {per_row:.0} bytes per row"),
                met: per_row <= TARGET_RSS_PER_ROW_MAX_BYTES,
            });
        }
    }
    // The absolute targets, at the point with the most rows.
    if let Some(l) = points.iter().max_by_key(|p| p.shape().rows()) {
        let rows = l.shape().rows();
        let answer = l.inventory_ms.max(l.pending_ms).max(l.members_ms);
        out.push(Verdict {
            key: "peak_rss_max_128_mb".into(),
            what: format!("{rows} rows: peak RSS {:.1} MB", l.rss_peak_mb),
            met: l.rss_peak_mb <= TARGET_PEAK_RSS_MAX_MB,
        });
        out.push(Verdict {
            key: "serving_max_10_s".into(),
            what: format!(
                "{rows} rows: serving {:.0} ms after the spawn",
                l.serving_ms
            ),
            met: l.serving_ms <= TARGET_SERVING_MAX_MS,
        });
        out.push(Verdict {
            key: "answers_max_1_s".into(),
            what: format!(
                "{rows} rows: slowest answer {answer:.0} ms (lifecycleMemberships {:.1}, pending {:.1}, members {:.1})",
                l.inventory_ms, l.pending_ms, l.members_ms
            ),
            met: answer <= TARGET_ANSWER_MAX_MS,
        });
    }
    out
}

pub fn json(verdicts: &[Verdict]) -> Value {
    let mut m = serde_json::Map::new();
    for v in verdicts {
        m.insert(v.key.clone(), json!(v.met));
    }
    Value::Object(m)
}

pub fn lines(verdicts: &[Verdict]) -> Vec<String> {
    verdicts
        .iter()
        .map(|v| {
            format!(
                "target: {}: {}",
                v.what,
                if v.met { "met" } else { "NOT met" }
            )
        })
        .collect()
}
