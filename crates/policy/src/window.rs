//! Two counts over a sliding window, in constant memory: the shape the retry budget (requests,
//! retries) and adaptive throttling (sent, accepted) both need.
//!
//! The window is ten buckets of a tenth of its length each, so an event leaves the counts between
//! 0.9 and 1 window after it was recorded. Time comes from the caller.

use std::time::{Duration, Instant};

/// Steps the window slides in.
const BUCKETS: usize = 10;

/// How many whole `step`s (not zero) `elapsed` holds: with a 64-bit division where both fit in
/// nanoseconds (any span under 584 years), not the 128-bit one that `as_nanos()` leads to, which
/// is a call into a library routine. The policies' time windows take their bucket of a moment
/// by this, some on every request.
pub(crate) fn whole_steps(elapsed: Duration, step: Duration) -> u64 {
    match (
        u64::try_from(elapsed.as_nanos()),
        u64::try_from(step.as_nanos()),
    ) {
        (Ok(elapsed), Ok(step)) => elapsed / step,
        _ => u64::try_from(elapsed.as_nanos() / step.as_nanos()).unwrap_or(u64::MAX),
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Which step of time this bucket holds (its start divided by the step length).
    step: u64,
    counts: [u64; 2],
}

/// Two counters over a sliding window.
#[derive(Debug, Clone)]
pub(crate) struct PairWindow {
    epoch: Instant,
    step: Duration,
    buckets: [Bucket; BUCKETS],
}

impl PairWindow {
    /// A window of `length` (at least 10 ms) starting at `now`.
    pub(crate) fn new(length: Duration, now: Instant) -> Self {
        PairWindow {
            epoch: now,
            step: (length / BUCKETS as u32).max(Duration::from_millis(1)),
            buckets: [Bucket::default(); BUCKETS],
        }
    }

    fn step_of(&self, now: Instant) -> u64 {
        whole_steps(now.saturating_duration_since(self.epoch), self.step)
    }

    /// Counts one event in the counter `which` (0 or 1) at `now`.
    pub(crate) fn add(&mut self, now: Instant, which: usize) {
        let step = self.step_of(now);
        let b = &mut self.buckets[(step % BUCKETS as u64) as usize];
        if b.step != step {
            *b = Bucket {
                step,
                ..Bucket::default()
            };
        }
        b.counts[which] += 1;
    }

    /// Both counts over the window ending at `now`.
    pub(crate) fn totals(&self, now: Instant) -> (u64, u64) {
        let step = self.step_of(now);
        self.buckets
            .iter()
            .filter(|b| b.step + (BUCKETS as u64) > step && b.step <= step)
            .fold((0, 0), |(a, b), x| (a + x.counts[0], b + x.counts[1]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn whole_steps_are_the_128_bit_quotient(
            // Spans of seconds, of centuries and past what 64 bits of nanoseconds hold.
            secs in prop_oneof![0..100_000u64, 18_000_000_000..19_000_000_000u64, any::<u64>()],
            nanos in 0..1_000_000_000u32,
            step_secs in prop_oneof![Just(0u64), 0..10u64, any::<u64>()],
            step_nanos in prop_oneof![1..10u32, 0..1_000_000_000u32],
        ) {
            let elapsed = Duration::new(secs, nanos);
            let step = Duration::new(step_secs, step_nanos);
            prop_assume!(!step.is_zero());
            let quotient = elapsed.as_nanos() / step.as_nanos();
            prop_assert_eq!(
                whole_steps(elapsed, step),
                u64::try_from(quotient).unwrap_or(u64::MAX)
            );
        }
    }

    #[test]
    fn counts_leave_the_window_after_it_has_passed() {
        let t0 = Instant::now();
        let mut w = PairWindow::new(Duration::from_secs(10), t0);
        w.add(t0, 0);
        w.add(t0, 0);
        w.add(t0 + Duration::from_secs(5), 1);
        assert_eq!(w.totals(t0 + Duration::from_secs(5)), (2, 1));
        assert_eq!(w.totals(t0 + Duration::from_millis(10_500)), (0, 1));
        assert_eq!(w.totals(t0 + Duration::from_secs(16)), (0, 0));
    }

    #[test]
    fn a_reused_bucket_starts_from_zero() {
        let t0 = Instant::now();
        let mut w = PairWindow::new(Duration::from_secs(1), t0);
        w.add(t0, 1);
        w.add(t0 + Duration::from_secs(1), 0);
        assert_eq!(w.totals(t0 + Duration::from_secs(1)), (1, 0));
    }
}
