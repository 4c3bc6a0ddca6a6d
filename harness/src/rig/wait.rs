//! Bounded polling. Tests and the harness never sleep for readiness: they poll a condition with
//! an explicit bound and fail with an error naming what they were waiting for. Each attempt is
//! itself cut off at the deadline, so a hung check cannot stretch the bound.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio::time::{timeout_at, Instant};

use crate::rig::error::HarnessError;

/// The result of one attempt: done, try again (with a note for the timeout message), or give
/// up at once.
#[derive(Debug)]
pub enum Outcome<T> {
    Ready(T),
    Retry(Option<String>),
    Abort(HarnessError),
}

/// Anything a polled check may return: `bool`, `Option<T>`, `Result<T, E>` (the last error is
/// reported on timeout) or an explicit [`Outcome`].
pub trait Attempt {
    type Output;
    fn outcome(self) -> Outcome<Self::Output>;
}

impl Attempt for bool {
    type Output = ();
    fn outcome(self) -> Outcome<()> {
        if self {
            Outcome::Ready(())
        } else {
            Outcome::Retry(None)
        }
    }
}

impl<T> Attempt for Option<T> {
    type Output = T;
    fn outcome(self) -> Outcome<T> {
        match self {
            Some(v) => Outcome::Ready(v),
            None => Outcome::Retry(None),
        }
    }
}

impl<T, E: Display> Attempt for Result<T, E> {
    type Output = T;
    fn outcome(self) -> Outcome<T> {
        match self {
            Ok(v) => Outcome::Ready(v),
            Err(e) => Outcome::Retry(Some(e.to_string())),
        }
    }
}

impl<T> Attempt for Outcome<T> {
    type Output = T;
    fn outcome(self) -> Outcome<T> {
        self
    }
}

/// Polls `f` every `poll` until it is ready, for at most `bound`. On timeout the error names
/// `what` and carries the last attempt's note.
pub async fn wait_until<F, Fut, A>(
    bound: Duration,
    poll: Duration,
    what: &str,
    mut f: F,
) -> Result<A::Output, HarnessError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
    A: Attempt,
{
    let deadline = Instant::now() + bound;
    let mut last: Option<String> = None;
    loop {
        match timeout_at(deadline, f()).await {
            Ok(attempt) => match attempt.outcome() {
                Outcome::Ready(v) => return Ok(v),
                Outcome::Abort(e) => return Err(e),
                Outcome::Retry(note) => {
                    if note.is_some() {
                        last = note;
                    }
                }
            },
            Err(_) => {
                last = Some(last.map_or_else(
                    || "the attempt itself did not finish".to_string(),
                    |l| format!("{l}; then an attempt did not finish"),
                ));
                break;
            }
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        tokio::time::sleep_until((now + poll).min(deadline)).await;
    }
    Err(HarnessError::Timeout {
        what: what.to_string(),
        bound_ms: bound.as_millis(),
        last,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rig::error::ErrorKind;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn returns_once_ready() {
        let n = AtomicU32::new(0);
        let v = wait_until(
            Duration::from_secs(2),
            Duration::from_millis(1),
            "three tries",
            || {
                let k = n.fetch_add(1, Ordering::SeqCst);
                async move { (k >= 2).then_some(k) }
            },
        )
        .await;
        assert_eq!(v.ok(), Some(2));
    }

    #[tokio::test]
    async fn timeout_names_what_and_last_error() {
        let err = wait_until(
            Duration::from_millis(30),
            Duration::from_millis(5),
            "the moon",
            || async { Err::<(), _>("still dark") },
        )
        .await
        .err();
        let err = err.map(|e| (e.kind(), e.to_string()));
        let (kind, text) = err.unwrap_or((ErrorKind::Usage, String::new()));
        assert_eq!(kind, ErrorKind::Timeout);
        assert!(text.contains("the moon"), "{text}");
        assert!(text.contains("still dark"), "{text}");
    }

    #[tokio::test]
    async fn hung_attempt_is_cut_at_the_bound() {
        let started = std::time::Instant::now();
        let r = wait_until(
            Duration::from_millis(50),
            Duration::from_millis(5),
            "a hang",
            std::future::pending::<bool>,
        )
        .await;
        assert!(r.is_err());
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn abort_stops_early() {
        let r = wait_until(
            Duration::from_secs(10),
            Duration::from_millis(5),
            "x",
            || async { Outcome::<()>::Abort(HarnessError::Usage("no".into())) },
        )
        .await;
        assert_eq!(r.err().map(|e| e.kind()), Some(ErrorKind::Usage));
    }
}
