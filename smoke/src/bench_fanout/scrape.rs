//! The daemon's own Prometheus endpoint, scraped through every daemon run of the benchmark: the
//! fan-out lag gauge must rise under the burst and fall back to 0, and the copy counters must
//! equal the copies the run asked for (docs/performance.md).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the daemon's metrics endpoint showed over one daemon phase: the fan-out lag gauge
/// sampled every `SCRAPE_EVERY` (it must rise under the burst and fall back to 0) and the copy
/// counters at the end (they must equal posts x members: every copy counted once).
pub struct Scraper {
    port: u16,
    peak_lag: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

const SCRAPE_EVERY: Duration = Duration::from_millis(100);
const SCRAPE_BOUND: Duration = Duration::from_secs(5);
/// How long the lag may take to fall back to 0 after the phase saw every copy stored.
const LAG_SETTLE_BOUND: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Default)]
pub struct Scraped {
    pub peak_lag: u64,
    pub end_lag: u64,
    pub copied: u64,
    pub handed_off: u64,
    pub expected: u64,
}

impl Scraped {
    pub fn ok(&self) -> bool {
        self.peak_lag > 0
            && self.end_lag == 0
            && self.copied == self.expected
            && self.handed_off == self.expected
    }
}

fn metric(text: &str, name: &str, space: &str) -> Option<u64> {
    let series = format!("{name}{{space=\"{space}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

async fn scrape(port: u16) -> Option<String> {
    let r = delivery_harness::rig::http::get(port, "/metrics", SCRAPE_BOUND)
        .await
        .ok()?;
    (r.status == 200).then(|| String::from_utf8_lossy(&r.body).into_owned())
}

impl Scraper {
    pub fn start(port: u16, space: String) -> Scraper {
        let peak_lag = Arc::new(AtomicU64::new(0));
        let peak = peak_lag.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Some(lag) = scrape(port)
                    .await
                    .and_then(|t| metric(&t, "cotal_delivery_fanout_lag", &space))
                {
                    peak.fetch_max(lag, Ordering::Relaxed);
                }
                tokio::time::sleep(SCRAPE_EVERY).await;
            }
        });
        Scraper {
            port,
            peak_lag,
            task,
        }
    }

    /// Stops sampling and reads the end state once the lag settled (or its bound ran out).
    pub async fn finish(self, space: &str, expected: u64) -> Scraped {
        self.task.abort();
        let deadline = Instant::now() + LAG_SETTLE_BOUND;
        let mut out = Scraped {
            peak_lag: self.peak_lag.load(Ordering::Relaxed),
            end_lag: u64::MAX,
            expected,
            ..Scraped::default()
        };
        loop {
            if let Some(t) = scrape(self.port).await {
                out.end_lag = metric(&t, "cotal_delivery_fanout_lag", space).unwrap_or(u64::MAX);
                out.copied = metric(&t, "cotal_delivery_posts_copied_total", space).unwrap_or(0);
                out.handed_off = metric(&t, "cotal_delivery_handed_off_total", space).unwrap_or(0);
            }
            if out.ok() || Instant::now() >= deadline {
                return out;
            }
            tokio::time::sleep(SCRAPE_EVERY).await;
        }
    }
}
