//! Where each event of a run is counted: the phase schedule and one tally per phase.
//!
//! A figure per phase is only meaningful if every event lands in exactly one phase by one rule.
//! The rule here: an HTTP attempt belongs to the phase in which it was sent; a request chain
//! (the first request and all its resends) belongs to the phase in which it started, so its
//! success and latency are judged against the conditions it met first, even if it ends later.
//! Attempts sent after the last phase, while chains in flight finish, go to a separate drain
//! slot so they neither inflate the last phase's rates nor vanish.
//!
//! The same records are also counted on the run's time axis ([`ClientCounts`]), by the instant
//! each happened, for the pictures of `--out`.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use http::StatusCode;
use tokio::time::Instant;

use crate::http::Failure;
use crate::timeline::buckets::ClientCounts;

/// The most phases a schedule has.
pub(crate) const MAX_PHASES: usize = 8;
/// Latencies are kept in microseconds up to an hour, to three significant figures.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// When each phase ends: one to [`MAX_PHASES`] phases, then the drain slot.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    start: Instant,
    ends: [Instant; MAX_PHASES],
    count: usize,
}

impl Schedule {
    /// Phases of these lengths from `start`; lengths past [`MAX_PHASES`] are ignored (the
    /// flags' checks never build more), and no lengths at all make one empty phase.
    pub(crate) fn new(start: Instant, lengths: &[Duration]) -> Schedule {
        let count = lengths.len().clamp(1, MAX_PHASES);
        let mut ends = [start; MAX_PHASES];
        let mut at = start;
        for (end, length) in ends.iter_mut().zip(lengths) {
            at += *length;
            *end = at;
        }
        Schedule { start, ends, count }
    }

    pub(crate) fn start(&self) -> Instant {
        self.start
    }

    pub(crate) fn end_of(&self, phase: usize) -> Instant {
        self.ends[phase.min(self.count - 1)]
    }

    /// The end of the last phase.
    pub(crate) fn end(&self) -> Instant {
        self.ends[self.count - 1]
    }

    /// The index of the drain slot: the number of phases.
    pub(crate) fn drain(&self) -> usize {
        self.count
    }

    /// The phase (or the drain slot) that `at` falls in; instants before the start count as
    /// the first phase.
    pub(crate) fn slot(&self, at: Instant) -> usize {
        self.ends[..self.count]
            .iter()
            .position(|end| at < *end)
            .unwrap_or(self.count)
    }
}

/// How one HTTP attempt ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Attempt {
    Status(StatusCode),
    Failed(Failure),
}

/// How a request chain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChainEnd {
    /// A 2xx answer.
    Succeeded,
    /// An answer not worth resending (4xx, or anything neither 2xx nor 5xx).
    Failed,
    /// Every resend was used up on 5xx answers or connection errors.
    Exhausted,
}

/// What did not succeed, as the caller saw it: a status or a kind of connection failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ErrorKey {
    Status(u16),
    Failure(Failure),
}

impl ErrorKey {
    pub(crate) fn label(self) -> String {
        match self {
            ErrorKey::Status(code) => code.to_string(),
            ErrorKey::Failure(f) => f.label().to_owned(),
        }
    }
}

/// The counts of one phase (or of the drain slot).
#[derive(Debug, Clone)]
pub(crate) struct SlotTally {
    /// Chains started.
    pub(crate) started: u64,
    /// New requests refused because every chain slot was taken.
    pub(crate) dropped: u64,
    /// HTTP requests sent, resends included.
    pub(crate) attempts: u64,
    /// Attempts that did not get a 2xx, by status or failure.
    pub(crate) errors: BTreeMap<ErrorKey, u64>,
    pub(crate) succeeded: u64,
    pub(crate) failed: u64,
    pub(crate) exhausted: u64,
    /// Start to end of every finished chain, in microseconds.
    pub(crate) latency_us: Histogram<u64>,
}

impl SlotTally {
    fn new() -> SlotTally {
        SlotTally {
            started: 0,
            dropped: 0,
            attempts: 0,
            errors: BTreeMap::new(),
            succeeded: 0,
            failed: 0,
            exhausted: 0,
            latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                .expect("static histogram bounds are valid"),
        }
    }

    /// Chains started here that had not ended when the run stopped.
    pub(crate) fn unfinished(&self) -> u64 {
        self.started
            .saturating_sub(self.succeeded + self.failed + self.exhausted)
    }
}

/// The tallies of a run, shared by every chain. Each record is a few additions under one
/// short lock, small next to the HTTP exchange it describes.
#[derive(Debug)]
pub(crate) struct Tally {
    counts: Mutex<Counts>,
}

#[derive(Debug)]
struct Counts {
    slots: Vec<SlotTally>,
    client: ClientCounts,
}

impl Tally {
    /// Tallies for every phase of `schedule` and its drain slot.
    pub(crate) fn new(schedule: &Schedule) -> Tally {
        Tally {
            counts: Mutex::new(Counts {
                slots: (0..=schedule.drain()).map(|_| SlotTally::new()).collect(),
                client: ClientCounts::new(schedule.start(), schedule.end()),
            }),
        }
    }

    /// A chain started in `slot`, offered at `at`.
    pub(crate) fn started(&self, slot: usize, at: Instant) {
        self.with(slot, |t, client| {
            t.started += 1;
            client.offered.add(at, 1.0);
        });
    }

    /// A new request offered at `at`, in `slot`, and dropped.
    pub(crate) fn dropped(&self, slot: usize, at: Instant) {
        self.with(slot, |t, client| {
            t.dropped += 1;
            client.offered.add(at, 1.0);
        });
    }

    /// An attempt sent in `slot` at `sent`, whose outcome was known at `ended`.
    pub(crate) fn attempt(&self, slot: usize, attempt: Attempt, sent: Instant, ended: Instant) {
        let error = match attempt {
            Attempt::Status(s) if s.is_success() => None,
            Attempt::Status(s) => Some(ErrorKey::Status(s.as_u16())),
            Attempt::Failed(f) => Some(ErrorKey::Failure(f)),
        };
        self.with(slot, |t, client| {
            t.attempts += 1;
            client.sent.add(sent, 1.0);
            match error {
                Some(key) => *t.errors.entry(key).or_default() += 1,
                None => client.succeeded.add(ended, 1.0),
            }
        });
    }

    /// Records the end of a chain that started in `slot` and took `latency`.
    pub(crate) fn ended(&self, slot: usize, end: ChainEnd, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.with(slot, |t, _| {
            match end {
                ChainEnd::Succeeded => t.succeeded += 1,
                ChainEnd::Failed => t.failed += 1,
                ChainEnd::Exhausted => t.exhausted += 1,
            }
            t.latency_us.saturating_record(micros.max(1));
        });
    }

    /// A copy of every slot: the phases in order, then the drain slot.
    pub(crate) fn snapshot(&self) -> Vec<SlotTally> {
        self.lock().slots.clone()
    }

    /// A copy of the counts on the time axis.
    pub(crate) fn client_counts(&self) -> ClientCounts {
        self.lock().client.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with(&self, slot: usize, record: impl FnOnce(&mut SlotTally, &mut ClientCounts)) {
        let mut counts = self.lock();
        let Counts { slots, client } = &mut *counts;
        if let Some(tally) = slots.get_mut(slot) {
            record(tally, client);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_fall_in_the_phase_they_are_in_and_then_in_the_drain() {
        let start = Instant::now();
        let s = Schedule::new(start, &[1, 2, 3].map(Duration::from_secs));
        assert_eq!(s.slot(start), 0);
        assert_eq!(s.slot(start + Duration::from_millis(999)), 0);
        assert_eq!(s.slot(start + Duration::from_secs(1)), 1);
        assert_eq!(s.slot(start + Duration::from_secs(5)), 2);
        assert_eq!(s.slot(start + Duration::from_secs(6)), s.drain());
        assert_eq!(s.drain(), 3);
        assert_eq!(s.end(), start + Duration::from_secs(6));
        assert_eq!(s.end_of(0), start + Duration::from_secs(1));
    }

    #[test]
    fn chains_count_where_they_started_and_unfinished_ones_are_the_rest() {
        let now = Instant::now();
        let t = Tally::new(&Schedule::new(now, &[Duration::from_secs(1); 3]));
        for _ in 0..3 {
            t.started(1, now);
        }
        t.attempt(
            1,
            Attempt::Status(StatusCode::INTERNAL_SERVER_ERROR),
            now,
            now,
        );
        t.attempt(2, Attempt::Status(StatusCode::OK), now, now);
        t.attempt(2, Attempt::Failed(Failure::Connect), now, now);
        t.ended(1, ChainEnd::Succeeded, Duration::from_millis(30));
        t.ended(1, ChainEnd::Exhausted, Duration::from_millis(90));
        let s = t.snapshot();
        assert_eq!((s[1].started, s[1].succeeded, s[1].exhausted), (3, 1, 1));
        assert_eq!(s[1].unfinished(), 1);
        assert_eq!((s[1].attempts, s[2].attempts), (1, 2));
        assert_eq!(s[1].errors[&ErrorKey::Status(500)], 1);
        assert_eq!(s[2].errors.len(), 1, "2xx is not an error");
        assert_eq!(s[1].latency_us.len(), 2);
        assert!(s[1].latency_us.max() >= 89_000);
    }

    #[test]
    fn records_are_also_counted_by_when_they_happened() {
        let start = Instant::now();
        let s = Schedule::new(start, &[Duration::from_secs(2)]);
        let t = Tally::new(&s);
        let at = |ms: u64| start + Duration::from_millis(ms);
        t.started(0, at(0));
        t.dropped(0, at(300));
        let ok = Attempt::Status(StatusCode::OK);
        t.attempt(0, ok, at(10), at(600));
        t.attempt(
            0,
            Attempt::Status(StatusCode::BAD_GATEWAY),
            at(260),
            at(270),
        );
        let c = t.client_counts();
        // Two seconds make 250 ms buckets: offers at 0 and 300 ms, sends at 10 and 260 ms,
        // the one success when it arrived, at 600 ms.
        assert_eq!(c.offered.counts(3, true), [Some(1.0), Some(1.0), Some(0.0)]);
        assert_eq!(c.sent.counts(3, true), [Some(1.0), Some(1.0), Some(0.0)]);
        assert_eq!(
            c.succeeded.counts(3, true),
            [Some(0.0), Some(0.0), Some(1.0)]
        );
    }
}
