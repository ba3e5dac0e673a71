//! Counts on a time axis: equal buckets from a run's start, filled by events at instants or by
//! amounts known only over an interval.
//!
//! The load client knows when each of its events happened; the gateway's counters are known
//! only at the instants they were read. Both end up in buckets of one width from one start, so
//! that every series of a picture shares its time axis. A bucket no reading covered is
//! unknown (`None`), not zero: a gateway that did not answer while it restarted leaves a gap,
//! never a dip to nothing.

use std::time::Duration;

use tokio::time::Instant;

/// The most buckets a series keeps; events past them are not counted. [`width_for`] keeps a
/// run's phases within a few hundred, so only a drain far longer than any phase reaches this.
pub(crate) const MAX_BUCKETS: usize = 4096;

/// The bucket widths offered, narrowest first.
const WIDTHS_MS: [u64; 9] = [
    250, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 300_000,
];
/// Buckets a run's phases fill at most, unless even the widest width is too narrow for that.
const TARGET_BUCKETS: u128 = 240;

/// The narrowest width from 250 ms to 5 min that divides a run of `length` into at most 240
/// buckets: a point every 250 ms for a short run, every second for a few minutes.
pub(crate) fn width_for(length: Duration) -> Duration {
    let ms = WIDTHS_MS
        .into_iter()
        .find(|w| length.as_millis().div_ceil(u128::from(*w)) <= TARGET_BUCKETS)
        .unwrap_or(WIDTHS_MS[WIDTHS_MS.len() - 1]);
    Duration::from_millis(ms)
}

/// One series of counts per bucket; `None` where nothing was recorded or covered.
#[derive(Debug, Clone)]
pub(crate) struct Buckets {
    start: Instant,
    width: Duration,
    counts: Vec<Option<f64>>,
}

impl Buckets {
    pub(crate) fn new(start: Instant, width: Duration) -> Buckets {
        Buckets {
            start,
            width: width.max(Duration::from_millis(1)),
            counts: Vec::new(),
        }
    }

    /// The bucket `at` falls in; instants before the start fall in the first.
    pub(crate) fn index(&self, at: Instant) -> usize {
        let since = at.saturating_duration_since(self.start).as_nanos();
        usize::try_from(since / self.width.as_nanos()).unwrap_or(usize::MAX)
    }

    /// Counts `n` in the bucket of `at`.
    pub(crate) fn add(&mut self, at: Instant, n: f64) {
        let i = self.index(at);
        if let Some(count) = self.slot(i) {
            *count = Some(count.unwrap_or(0.0) + n);
        }
    }

    /// Counts `n`, known only to have happened between `from` and `to`, in the buckets that
    /// interval overlaps, each its share by overlap (all of it in `to`'s bucket when the
    /// interval is empty). Every bucket the interval overlaps becomes known, zero if its share
    /// is nothing.
    pub(crate) fn spread(&mut self, from: Instant, to: Instant, n: f64) {
        if to <= from {
            self.add(to, n);
            return;
        }
        let total = (to - from).as_secs_f64();
        let (first, last) = (self.index(from), self.index(to));
        for i in first..=last.min(MAX_BUCKETS.saturating_sub(1)) {
            let lo = self.bucket_start(i).max(from);
            let hi = self.bucket_start(i + 1).min(to);
            if hi <= lo {
                continue;
            }
            let share = hi.saturating_duration_since(lo).as_secs_f64() / total;
            if let Some(count) = self.slot(i) {
                *count = Some(count.unwrap_or(0.0) + n * share);
            }
        }
    }

    /// Counts per bucket, for `len` buckets; with `known`, buckets nothing touched are zero
    /// (the client knows every event it made), else unknown.
    pub(crate) fn counts(&self, len: usize, known: bool) -> Vec<Option<f64>> {
        let empty = known.then_some(0.0);
        (0..len)
            .map(|i| self.counts.get(i).copied().flatten().or(empty))
            .collect()
    }

    /// [`Buckets::counts`] divided by the width: per second.
    pub(crate) fn rates(&self, len: usize, known: bool) -> Vec<Option<f64>> {
        let seconds = self.width.as_secs_f64();
        self.counts(len, known)
            .into_iter()
            .map(|c| c.map(|c| c / seconds))
            .collect()
    }

    /// The sum of two series of the same start and width, bucket by bucket.
    pub(crate) fn merged(mut self, other: &Buckets) -> Buckets {
        for (i, count) in other.counts.iter().enumerate() {
            if let (Some(n), Some(mine)) = (count, self.slot(i)) {
                *mine = Some(mine.unwrap_or(0.0) + n);
            }
        }
        self
    }

    fn bucket_start(&self, i: usize) -> Instant {
        self.start + self.width * u32::try_from(i).unwrap_or(u32::MAX)
    }

    /// Bucket `i`, grown into; `None` past [`MAX_BUCKETS`].
    fn slot(&mut self, i: usize) -> Option<&mut Option<f64>> {
        if i >= MAX_BUCKETS {
            return None;
        }
        if self.counts.len() <= i {
            self.counts.resize(i + 1, None);
        }
        self.counts.get_mut(i)
    }
}

/// Readings of one value (a gauge) per bucket: the last reading in each bucket.
#[derive(Debug, Clone)]
pub(crate) struct Readings {
    buckets: Buckets,
}

impl Readings {
    pub(crate) fn new(start: Instant, width: Duration) -> Readings {
        Readings {
            buckets: Buckets::new(start, width),
        }
    }

    pub(crate) fn set(&mut self, at: Instant, value: f64) {
        let i = self.buckets.index(at);
        if let Some(slot) = self.buckets.slot(i) {
            *slot = Some(value);
        }
    }

    pub(crate) fn values(&self, len: usize) -> Vec<Option<f64>> {
        self.buckets.counts(len, false)
    }
}

/// A cumulative counter read now and then (a gateway's `_total`): each rise between two
/// readings spread over the time between them.
///
/// A reading below the one before means the process was replaced (its counters start again
/// from zero): the new reading is all counted since the one before. A missing reading (the
/// page did not answer) changes nothing; the next one covers the gap.
#[derive(Debug, Clone)]
pub(crate) struct CounterTrack {
    buckets: Buckets,
    last: Option<(Instant, f64)>,
    /// Whether any reading had the counter at all.
    seen: bool,
}

impl CounterTrack {
    pub(crate) fn new(start: Instant, width: Duration) -> CounterTrack {
        CounterTrack {
            buckets: Buckets::new(start, width),
            last: None,
            seen: false,
        }
    }

    /// A reading taken at `at`: the counter's value, or `None` when the page had no such
    /// series (counted as zero, but not as a sign the counter exists).
    pub(crate) fn read(&mut self, at: Instant, value: Option<f64>) {
        self.seen |= value.is_some();
        let value = value.unwrap_or(0.0);
        if let Some((then, before)) = self.last {
            let rise = if value >= before {
                value - before
            } else {
                value
            };
            self.buckets.spread(then, at, rise);
        }
        self.last = Some((at, value));
    }

    pub(crate) fn seen(&self) -> bool {
        self.seen
    }

    /// Per second, for `len` buckets; buckets no two readings spanned are unknown.
    pub(crate) fn rates(&self, len: usize) -> Vec<Option<f64>> {
        self.buckets.rates(len, false)
    }
}

/// The load client's own events per bucket.
#[derive(Debug, Clone)]
pub(crate) struct ClientCounts {
    /// New requests offered: started or dropped.
    pub(crate) offered: Buckets,
    /// HTTP requests sent, resends included, when they were sent.
    pub(crate) sent: Buckets,
    /// 2xx answers, when they arrived.
    pub(crate) succeeded: Buckets,
}

impl ClientCounts {
    /// Counts for a run from `start` to `end`, in buckets of [`width_for`] its length.
    pub(crate) fn new(start: Instant, end: Instant) -> ClientCounts {
        let width = width_for(end - start);
        let buckets = || Buckets::new(start, width);
        ClientCounts {
            offered: buckets(),
            sent: buckets(),
            succeeded: buckets(),
        }
    }

    pub(super) fn merged(self, other: &ClientCounts) -> ClientCounts {
        ClientCounts {
            offered: self.offered.merged(&other.offered),
            sent: self.sent.merged(&other.sent),
            succeeded: self.succeeded.merged(&other.succeeded),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_width_is_the_narrowest_that_keeps_a_run_within_240_buckets() {
        assert_eq!(width_for(Duration::from_secs(11)), ms(250));
        assert_eq!(width_for(Duration::from_secs(60)), ms(250));
        assert_eq!(width_for(Duration::from_secs(61)), ms(500));
        assert_eq!(width_for(Duration::from_secs(110)), ms(500));
        assert_eq!(width_for(Duration::from_secs(200)), ms(1_000));
        assert_eq!(width_for(Duration::from_secs(8 * 3600)), ms(300_000));
        assert_eq!(width_for(Duration::ZERO), ms(250));
    }

    #[test]
    fn events_land_in_the_bucket_of_their_instant() {
        let start = Instant::now();
        let mut b = Buckets::new(start, ms(250));
        b.add(start, 1.0);
        b.add(start + ms(249), 1.0);
        b.add(start + ms(250), 1.0);
        b.add(start + ms(1_100), 2.0);
        assert_eq!(b.index(start + ms(999)), 3);
        assert_eq!(
            b.counts(6, true),
            [
                Some(2.0),
                Some(1.0),
                Some(0.0),
                Some(0.0),
                Some(2.0),
                Some(0.0)
            ]
        );
        assert_eq!(b.counts(3, false), [Some(2.0), Some(1.0), None]);
        assert_eq!(b.rates(2, true), [Some(8.0), Some(4.0)]);
    }

    #[test]
    fn an_amount_over_an_interval_is_shared_by_overlap() {
        let start = Instant::now();
        let mut b = Buckets::new(start, ms(1_000));
        // 40 over 0.5 s .. 2.5 s: a quarter, a half, a quarter.
        b.spread(start + ms(500), start + ms(2_500), 40.0);
        assert_eq!(
            b.counts(4, false),
            [Some(10.0), Some(20.0), Some(10.0), None]
        );
        // Nothing over 3 s .. 4 s still makes the bucket known.
        b.spread(start + ms(3_000), start + ms(4_000), 0.0);
        assert_eq!(b.counts(5, false)[3], Some(0.0));
        b.spread(start + ms(4_200), start + ms(4_200), 3.0);
        assert_eq!(b.counts(5, false)[4], Some(3.0));
    }

    #[test]
    fn a_counter_is_differenced_across_restarts_and_gaps() {
        let start = Instant::now();
        let mut c = CounterTrack::new(start, ms(1_000));
        c.read(start, Some(100.0)); // what was counted before the run is not the run's
        c.read(start + ms(1_000), Some(110.0));
        c.read(start + ms(2_000), None); // the page had no such series: zero, a reset
        c.read(start + ms(3_000), Some(5.0));
        c.read(start + ms(5_000), Some(9.0)); // a reading missed at 4 s: 4 over two buckets
        let rates = c.rates(6);
        assert_eq!(
            rates,
            [Some(10.0), Some(0.0), Some(5.0), Some(2.0), Some(2.0), None]
        );
        assert!(c.seen());
        let mut never = CounterTrack::new(start, ms(1_000));
        never.read(start, None);
        never.read(start + ms(1_000), None);
        assert!(!never.seen());
        assert_eq!(never.rates(1), [Some(0.0)]);
    }

    #[test]
    fn gauges_keep_the_last_reading_of_a_bucket_and_series_merge_by_bucket() {
        let start = Instant::now();
        let mut r = Readings::new(start, ms(500));
        r.set(start + ms(100), 1.0);
        r.set(start + ms(400), 2.0);
        r.set(start + ms(1_200), 3.0);
        assert_eq!(r.values(4), [Some(2.0), None, Some(3.0), None]);

        let (mut a, mut b) = (Buckets::new(start, ms(500)), Buckets::new(start, ms(500)));
        a.add(start, 1.0);
        b.add(start, 2.0);
        b.add(start + ms(600), 1.0);
        assert_eq!(a.merged(&b).counts(3, false), [Some(3.0), Some(1.0), None]);
    }

    #[test]
    fn nothing_is_kept_past_the_last_bucket() {
        let start = Instant::now();
        let mut b = Buckets::new(start, ms(1));
        b.add(start + ms(MAX_BUCKETS as u64 + 5), 1.0);
        b.spread(start, start + ms(MAX_BUCKETS as u64 * 2), 1.0);
        assert_eq!(b.counts.len(), MAX_BUCKETS);
    }
}
