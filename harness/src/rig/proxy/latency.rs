//! The proxy's *latency* (see the module doc of `proxy.rs`): every chunk a connection carries,
//! either way, is handed on a drawn time after the proxy read it (`base` plus up to `jitter`),
//! in order (a TCP stream does not reorder, so a chunk never overtakes the one before it), while
//! the proxy keeps reading: the delay is a path's, not a bandwidth cap.

use std::collections::VecDeque;

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::time::{Duration, Instant};

/// A path's delay: each chunk waits `base_ms` plus a draw in `0..=jitter_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    pub base_ms: u64,
    pub jitter_ms: u64,
}

/// Most bytes one direction of one connection keeps waiting; past it the proxy stops reading
/// that side until the oldest are handed on (back-pressure, not an unbounded buffer).
pub const LATENCY_MAX_BYTES: usize = 4 * 1024 * 1024;

/// One direction's writer: bytes go out at once when no latency is set and nothing waits, else
/// queued with the time they are due.
pub(super) struct Line {
    to: OwnedWriteHalf,
    queue: VecDeque<(Instant, Vec<u8>)>,
    queued_bytes: usize,
    last_due: Instant,
    rng: u64,
}

impl Line {
    pub(super) fn new(to: OwnedWriteHalf, seed: u64) -> Line {
        Line {
            to,
            queue: VecDeque::new(),
            queued_bytes: 0,
            last_due: Instant::now(),
            // xorshift must not start at 0.
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    fn draw(&mut self, l: Latency) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let jitter = if l.jitter_ms == 0 {
            0
        } else {
            self.rng % (l.jitter_ms + 1)
        };
        Duration::from_millis(l.base_ms + jitter)
    }

    /// Hands `bytes` on now, or queues them under `latency` (or behind bytes still waiting);
    /// false when the socket is gone.
    pub(super) async fn send(&mut self, bytes: &[u8], latency: Option<Latency>) -> bool {
        if bytes.is_empty() {
            return true;
        }
        match latency {
            None if self.queue.is_empty() => self.to.write_all(bytes).await.is_ok(),
            _ => {
                let delay = latency.map_or(Duration::ZERO, |l| self.draw(l));
                let due = (Instant::now() + delay).max(self.last_due);
                self.last_due = due;
                self.queued_bytes += bytes.len();
                self.queue.push_back((due, bytes.to_vec()));
                true
            }
        }
    }

    /// When the oldest queued bytes are due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.queue.front().map(|(t, _)| *t)
    }

    /// Whether the queue is at its bound (stop reading this side).
    pub(super) fn full(&self) -> bool {
        self.queued_bytes >= LATENCY_MAX_BYTES
    }

    /// Hands on every queued chunk, each when it is due (the other side closed).
    pub(super) async fn drain(&mut self) {
        while let Some(due) = self.next_due() {
            tokio::time::sleep_until(due).await;
            if !self.flush_due().await {
                return;
            }
        }
    }

    /// Hands on every queued chunk that is due; false when the socket is gone.
    pub(super) async fn flush_due(&mut self) -> bool {
        let now = Instant::now();
        while let Some((due, _)) = self.queue.front() {
            if *due > now {
                break;
            }
            let Some((_, bytes)) = self.queue.pop_front() else {
                break;
            };
            self.queued_bytes -= bytes.len();
            if self.to.write_all(&bytes).await.is_err() {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The draws stay within `base..=base + jitter`, vary, and never put a chunk before the one
    /// queued ahead of it.
    /// Mutation seen failing: `due` without `.max(self.last_due)` (a short draw after a long one
    /// comes due first: the queue's times not in order).
    #[tokio::test]
    async fn draws_stay_in_range_and_chunks_keep_their_order() {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let (_r, w) = client.into_split();
        let mut line = Line::new(w, 7);
        let l = Latency {
            base_ms: 100,
            jitter_ms: 300,
        };
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let d = line.draw(l).as_millis() as u64;
            assert!((100..=400).contains(&d), "{d}");
            seen.insert(d);
        }
        assert!(seen.len() > 10, "{seen:?}");
        for i in 0..20u8 {
            assert!(line.send(&[i], Some(l)).await);
        }
        let dues: Vec<Instant> = line.queue.iter().map(|(t, _)| *t).collect();
        assert!(dues.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(line.queued_bytes, 20);
    }
}
