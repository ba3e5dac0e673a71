//! The request path's one reading of the clock.
//!
//! Every decision on the path takes `now` as an argument (the policies are pure); this is where
//! that `now` comes from. It is tokio's clock, so that a test on paused time
//! (`#[tokio::test(start_paused = true)]`) drives the retry loop, the pools and their health
//! through minutes of backoffs, cooldowns and ejections without waiting through them. Outside
//! such a test it is the monotonic system clock.
//!
//! A task that serves requests reads it once per poll ([`OneReading`]), as nginx reads its time
//! once per turn of its event loop: a request's stages take it a score of times between two
//! waits, and each reading costs a system clock read, where the time cannot move far between
//! them (only as long as one poll runs, which is short, as every poll must be).

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

thread_local! {
    /// The reading of the poll under way on this thread, when it is a [`OneReading`]'s.
    static POLL_READING: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Now, on the clock the request path and its timers share.
pub(crate) fn now() -> Instant {
    POLL_READING.with(Cell::get).unwrap_or_else(read)
}

fn read() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// How long since `earlier`, on the same clock.
pub(crate) fn since(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}

pin_project_lite::pin_project! {
    /// `F`, whose every poll reads the clock once: within a poll, [`now`] is the time it began.
    pub(crate) struct OneReading<F> {
        #[pin]
        inner: F,
    }
}

impl<F> OneReading<F> {
    pub(crate) fn new(inner: F) -> Self {
        OneReading { inner }
    }
}

impl<F: Future> Future for OneReading<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _reading = Reading::begin();
        self.project().inner.poll(cx)
    }
}

/// The reading of one poll, given back when the poll ends, by a panic too (a reading left in
/// place would stop the clock for every later poll on the thread).
struct Reading(Option<Instant>);

impl Reading {
    fn begin() -> Reading {
        Reading(POLL_READING.with(|r| r.replace(Some(read()))))
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        POLL_READING.with(|r| r.set(self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_poll_reads_the_clock_once_and_the_next_poll_reads_it_again() {
        let (first, same, next) = OneReading::new(async {
            let first = now();
            // The clock moves on within the poll; its reading does not.
            let moved = read();
            while read() == moved {}
            let same = now();
            tokio::task::yield_now().await;
            (first, same, now())
        })
        .await;
        assert_eq!(first, same, "one poll, one reading");
        assert!(next > first, "the next poll reads the clock again");
        assert_eq!(
            POLL_READING.with(Cell::get),
            None,
            "given back after the poll"
        );
    }

    #[test]
    fn a_panicking_poll_gives_its_reading_back() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(OneReading::new(async { panic!("in a poll") }))
        }));
        assert!(panicked.is_err());
        assert_eq!(POLL_READING.with(Cell::get), None);
    }
}
