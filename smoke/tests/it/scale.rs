//! `smoke bench-scale` inside `ci/test`, at its smallest sizes (41 s here, 25 s before each
//! point's idle window began to wait for the point's presence rows to expire, up to the
//! bucket's 6 s; eight daemon starts, each settled for a second or two): every axis of
//! two points, the backlog, the large channel against the raw pipeline and the burst of joins,
//! so the command cannot rot. Asserted: exit 0 (nothing lost: every frame of the channels' runs
//! and every join of the burst accounted for on the broker), and every figure of every part
//! present in its `--json` output, a number where it is one. No target is asserted: targets are
//! judged by the benchmark on the release build, never in a timed test.
//!
//! Mutations seen failing: `pending_ms` left out of a point's JSON (the point's figure
//! missing); the idle window's wait for the bulk presence rows to expire removed (a row still
//! stored at the window's end: `idle_presence_left` true); the burst's joins sent without a reply subject (exit 2, every join unanswered);
//! the channel axis dropped from `Axis::shapes` (no point on the channels axis); every point
//! measured on the first point's broker (the broker's pid the same at every point).

use std::process::Command;

use serde_json::Value;

/// Figures of every point, each a number.
const POINT_FIGURES: &[&str] = &[
    "rows",
    "agents",
    "channels",
    "joins_per_agent",
    "provision_s",
    "start_to_serving_ms",
    "settle_ms",
    "idle_broker_msgs_in_per_min",
    "idle_broker_msgs_out_per_min",
    "idle_broker_cpu_pct_of_core",
    "idle_daemon_cpu_pct_of_core",
    "idle_wait_s",
    "rss_idle_mb",
    "feed_sweep_ms",
    "lifecycle_memberships_ms",
    "pending_ms",
    "members_ms",
    "members_of_channel",
    "workload_frames",
    "daemon_cpu_us_per_frame",
    "broker_cpu_us_per_frame",
    "rss_peak_mb",
];
/// Figures of each side of the backlog drain.
const DRAIN_FIGURES: &[&str] = &[
    "secs",
    "entries_per_s",
    "restart_secs",
    "first_frame_ms",
    "cpu_us_per_entry",
    "broker_cpu_us_per_entry",
    "rss_first_mb",
    "rss_max_mb",
    "rss_end_mb",
];
/// Figures of each channel against the raw pipeline.
const CHANNEL_FIGURES: &[&str] = &[
    "daemon_posts_per_s",
    "raw_posts_per_s",
    "throughput_ratio",
    "daemon_cpu_us_per_frame",
    "raw_cpu_us_per_frame",
    "cpu_per_frame_ratio",
    "daemon_broker_cpu_us_per_frame",
    "raw_broker_cpu_us_per_frame",
    "broker_cpu_per_frame_ratio",
    "daemon_rss_peak_mb",
];
/// Figures of the burst of joins.
const BURST_FIGURES: &[&str] = &[
    "durable",
    "refused",
    "unanswered",
    "answered_s",
    "joins_per_s",
    "daemon_cpu_s",
    "broker_cpu_s",
    "rss_before_mb",
    "rss_max_mb",
    "rows_active",
];
/// Every target the benchmark judges (met or not, a boolean).
const TARGETS: &[&str] = &[
    "rows_idle_broker_msgs_ratio_max_1_25",
    "rows_idle_broker_cpu_ratio_max_1_25",
    "rows_cpu_per_frame_ratio_max_1_25",
    "rss_per_row_max_1024_bytes",
    "agents_idle_broker_msgs_ratio_max_1_25",
    "agents_idle_broker_cpu_ratio_max_1_25",
    "agents_cpu_per_frame_ratio_max_1_25",
    "channels_idle_broker_msgs_ratio_max_1_25",
    "channels_idle_broker_cpu_ratio_max_1_25",
    "channels_cpu_per_frame_ratio_max_1_25",
    "peak_rss_max_128_mb",
    "serving_max_10_s",
    "answers_max_1_s",
];

fn numbers(v: &Value, keys: &[&str], what: &str, all: &str) {
    for k in keys {
        assert!(
            v[*k].is_number(),
            "{what}: {k} is not a number in {v}\n{all}"
        );
    }
}

#[test]
fn the_smallest_bench_scale_run_produces_every_figure() {
    let _machine = crate::one_suite();
    let out = Command::new(env!("CARGO_BIN_EXE_smoke"))
        .args([
            "bench-scale",
            "--rows",
            "200,400",
            "--agents",
            "20,40",
            "--channels",
            "10,20",
            "--axis-rows",
            "400",
            "--axis-agents",
            "40",
            "--axis-channels",
            "20",
            "--idle-secs",
            "1",
            "--workload-posts",
            "20",
            "--rate",
            "100",
            "--samples",
            "1",
            "--backlog",
            "1000",
            "--large-channel",
            "100",
            "--large-posts",
            "2",
            "--small-channel",
            "10",
            "--small-posts",
            "20",
            "--channel-runs",
            "1",
            "--burst",
            "100",
            "--json",
        ])
        .output()
        .expect("run smoke");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("{stdout}\n{stderr}");
    assert!(out.status.success(), "smoke bench-scale failed:\n{all}");
    let objects: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();

    let points: Vec<&Value> = objects
        .iter()
        .filter(|o| o["settled"].is_boolean())
        .collect();
    // 20 agents x 10 joins over 10 channels (rows), 40 x 10 over 10 (rows, channels), 20 x 20
    // over 20 (agents), 40 x 10 over 20 (agents, channels): every axis has its two points.
    assert_eq!(points.len(), 4, "{all}");
    for axis in ["rows", "agents", "channels"] {
        let on = points
            .iter()
            .filter(|p| {
                p["axes"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == axis))
            })
            .count();
        assert_eq!(on, 2, "the {axis} axis: {all}");
    }
    // Each point on a broker of its own: no point inherits an earlier one's purged rows.
    let mut pids: Vec<u64> = points
        .iter()
        .flat_map(|p| p["broker_pids"].as_array().cloned().unwrap_or_default())
        .filter_map(|pid| pid.as_u64())
        .collect();
    assert_eq!(pids.len(), 4, "one broker pid per point: {all}");
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 4, "a fresh broker per point: {all}");
    for p in &points {
        numbers(p, POINT_FIGURES, "a point", &all);
        assert!(p["workload_frames"].as_u64() > Some(0), "{p}");
        // The idle window starts once the broker has removed the point's presence rows: their
        // expiry is not the daemon's idle work.
        assert_eq!(p["idle_presence_left"], false, "{p}");
    }

    let backlog = objects
        .iter()
        .find(|o| o["backlog"].is_number())
        .unwrap_or_else(|| panic!("no backlog figures:\n{all}"));
    for side in ["daemon", "raw"] {
        numbers(&backlog[side], DRAIN_FIGURES, side, &all);
        assert_eq!(
            backlog[side]["tenths_s"].as_array().map(Vec::len),
            Some(10),
            "{backlog}"
        );
    }
    numbers(
        backlog,
        &["drain_ratio", "rss_max_over_idle"],
        "backlog",
        &all,
    );

    let channels = objects
        .iter()
        .find(|o| o["channels"].is_object())
        .unwrap_or_else(|| panic!("no channel figures:\n{all}"));
    for size in ["small", "large"] {
        let c = &channels["channels"][size];
        numbers(c, CHANNEL_FIGURES, size, &all);
        assert_eq!(c["complete"], true, "{c}");
    }
    numbers(channels, &["cpu_ratio_large_over_small"], "channels", &all);

    let burst = objects
        .iter()
        .find(|o| o["burst"].is_number())
        .unwrap_or_else(|| panic!("no burst figures:\n{all}"));
    numbers(burst, BURST_FIGURES, "burst", &all);
    assert_eq!(burst["nothing_lost"], true, "{burst}");
    assert_eq!(burst["unanswered"], 0, "{burst}");

    let targets = objects
        .iter()
        .find(|o| o["targets"].is_object())
        .unwrap_or_else(|| panic!("no targets:\n{all}"));
    for k in TARGETS {
        assert!(targets["targets"][*k].is_boolean(), "{k}: {targets}");
    }
}
