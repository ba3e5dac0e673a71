//! Histograms counted into their buckets as each value is recorded, and the recorder that hands
//! them out in front of the Prometheus exporter's.
//!
//! The exporter keeps every histogram sample in a lock-free queue until it is folded into buckets
//! (at a scrape, or by a thread that folds every second): a push through an epoch-based
//! collector per sample, eight per request, and memory held in proportion to the request rate.
//! A histogram whose buckets are known needs neither: a value is counted in its bucket at once,
//! by a worker thread with no atomic read-modify-write at all (each has counts of its own), and
//! the page is written from the counts (the total is the buckets' sum). Counters, gauges and
//! histograms without buckets stay the exporter's, and the page is its page with these
//! histograms after it, in the exposition format the exporter writes.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::formatting::{
    key_to_parts, write_help_line, write_metric_line, write_type_line,
};
use metrics_exporter_prometheus::{Matcher, PrometheusHandle, PrometheusRecorder};

/// Threads that get counts of their own in each histogram (the first to record one); every later
/// thread shares one set.
const OWNED: usize = 8;

/// One histogram's counts: a bucket per bound and one past the last (`+Inf`), and the sum of
/// the values. The total is the buckets' sum, read with them: a page never shows a `+Inf` count
/// below a bucket's, as a total counted apart could while a value is being recorded.
///
/// Each of the first [`OWNED`] threads to record a histogram counts into a set of its own, made
/// when it first records into this one, with a plain load and store (one writer, so no update is
/// lost); later threads share one set and count with atomic additions. A locked addition costs
/// some 20 cycles here (8 ns back to back) and a request records eight values, two additions
/// each; a worker thread counts with none. A set is allocated by its own thread, apart from the
/// others, so two threads counting never write to one cache line. The page adds the sets up. A
/// series thus holds one set (about 170 bytes with the most bounds, 17) per thread that records
/// into it, at most nine.
pub(crate) struct Fixed {
    bounds: &'static [f64],
    /// The owning threads' counts by their number, then the shared ones.
    sets: [OnceLock<Box<Counts>>; OWNED + 1],
}

struct Counts {
    /// Values up to each bound and above the last, not cumulative.
    counts: Box<[AtomicU64]>,
    /// The sum, as `f64` bits.
    sum: AtomicU64,
}

impl Counts {
    fn new(buckets: usize) -> Counts {
        Counts {
            counts: (0..buckets).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Counts `value` in bucket `at`, written by this thread alone.
    fn count_owned(&self, at: usize, value: f64) {
        let count = &self.counts[at];
        count.store(count.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let sum = f64::from_bits(self.sum.load(Ordering::Relaxed)) + value;
        self.sum.store(sum.to_bits(), Ordering::Relaxed);
    }

    /// Counts `value` in bucket `at`, beside other writers.
    fn count_shared(&self, at: usize, value: f64) {
        self.counts[at].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }
}

/// The set of counts this thread writes: its own number below [`OWNED`], or `OWNED` (shared).
fn writer() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static WRITER: Cell<Option<usize>> = const { Cell::new(None) };
    }
    WRITER.with(|writer| {
        writer.get().unwrap_or_else(|| {
            let n = NEXT.fetch_add(1, Ordering::Relaxed).min(OWNED);
            writer.set(Some(n));
            n
        })
    })
}

impl Fixed {
    fn new(bounds: &'static [f64]) -> Fixed {
        Fixed {
            bounds,
            sets: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Counts `value` into the set of writer `writer` (see [`writer`]).
    fn record_as(&self, writer: usize, value: f64) {
        // The first bound at or above the value; a NaN is above every bound.
        let at = match value.is_nan() {
            true => self.bounds.len(),
            false => self.bounds.partition_point(|&bound| bound < value),
        };
        let counts = self.sets[writer].get_or_init(|| Box::new(Counts::new(self.bounds.len() + 1)));
        match writer < OWNED {
            true => counts.count_owned(at, value),
            false => counts.count_shared(at, value),
        }
    }

    /// The cumulative count at each bound (`value <= bound`), the total and the sum.
    fn snapshot(&self) -> (Vec<(f64, u64)>, u64, f64) {
        let sets: Vec<&Counts> = self
            .sets
            .iter()
            .filter_map(|set| set.get().map(|b| &**b))
            .collect();
        let in_bucket = |i: usize| -> u64 {
            let counts = sets.iter().map(|set| set.counts[i].load(Ordering::Relaxed));
            counts.sum()
        };
        let mut below = 0;
        let buckets = (0..self.bounds.len())
            .map(|i| {
                below += in_bucket(i);
                (self.bounds[i], below)
            })
            .collect();
        // The last count is the values above every bound (`+Inf`).
        let count = below + in_bucket(self.bounds.len());
        let sums = sets.iter().map(|set| set.sum.load(Ordering::Relaxed));
        // From +0: a histogram nothing was recorded in has the sum 0, not -0.
        let sum = sums.fold(0.0, |sum, bits| sum + f64::from_bits(bits));
        (buckets, count, sum)
    }
}

impl HistogramFn for Fixed {
    fn record(&self, value: f64) {
        self.record_as(writer(), value);
    }
}

#[derive(Default)]
struct Held {
    /// Each series by name, then by its key.
    series: BTreeMap<String, BTreeMap<Key, Arc<Fixed>>>,
    descriptions: BTreeMap<String, SharedString>,
}

/// The histograms with buckets, shared by the recorder and the page.
pub(crate) struct Histograms {
    /// Which histograms get which buckets: the first whose matcher takes the name.
    buckets: Vec<(Matcher, &'static [f64])>,
    held: Mutex<Held>,
}

impl Histograms {
    pub(crate) fn new(buckets: Vec<(Matcher, &'static [f64])>) -> Histograms {
        Histograms {
            buckets,
            held: Mutex::new(Held::default()),
        }
    }

    fn bounds(&self, name: &str) -> Option<&'static [f64]> {
        let mut rules = self.buckets.iter();
        rules.find_map(|(matcher, bounds)| matcher.matches(name).then_some(*bounds))
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The series of `key`, made on first use; `None` when its name has no buckets. Handles on
    /// the request path are made once and kept; a series looked up per call (a failure's, by
    /// its error type) is found without a copy of its key.
    fn series(&self, key: &Key) -> Option<Arc<Fixed>> {
        let bounds = self.bounds(key.name())?;
        let mut held = self.held();
        if let Some(found) = held
            .series
            .get(key.name())
            .and_then(|by_key| by_key.get(key))
        {
            return Some(Arc::clone(found));
        }
        let fixed = Arc::new(Fixed::new(bounds));
        held.series
            .entry(key.name().to_owned())
            .or_default()
            .insert(key.clone(), Arc::clone(&fixed));
        Some(fixed)
    }

    /// The histograms in Prometheus's text format, each after its `# HELP` and `# TYPE` lines.
    /// The lock is held only to copy the list of series, not while they are written.
    pub(crate) fn render(&self, out: &mut String) {
        type Series = Vec<(String, Vec<(Key, Arc<Fixed>)>)>;
        let (series, descriptions): (Series, BTreeMap<String, SharedString>) = {
            let held = self.held();
            let series = held
                .series
                .iter()
                .map(|(name, by_key)| {
                    let by_key = by_key.iter().map(|(k, f)| (k.clone(), Arc::clone(f)));
                    (name.clone(), by_key.collect())
                })
                .collect();
            (series, held.descriptions.clone())
        };
        for (name, by_key) in &series {
            let (name, _) = key_to_parts(&Key::from_name(name.clone()), None);
            if let Some(description) = descriptions.get(&name) {
                write_help_line(out, &name, description);
            }
            write_type_line(out, &name, "histogram");
            for (key, fixed) in by_key {
                let (_, labels) = key_to_parts(key, None);
                let (buckets, count, sum) = fixed.snapshot();
                for (le, below) in buckets {
                    write_metric_line(
                        out,
                        &name,
                        Some("bucket"),
                        &labels,
                        Some(("le", le)),
                        below,
                        None,
                    );
                }
                write_metric_line(
                    out,
                    &name,
                    Some("bucket"),
                    &labels,
                    Some(("le", "+Inf")),
                    count,
                    None,
                );
                write_metric_line::<&str, f64>(out, &name, Some("sum"), &labels, None, sum, None);
                write_metric_line::<&str, u64>(
                    out,
                    &name,
                    Some("count"),
                    &labels,
                    None,
                    count,
                    None,
                );
            }
            out.push('\n');
        }
    }
}

/// The process's recorder: these histograms, and the exporter's recorder for everything else.
pub(crate) struct SplitRecorder {
    pub(crate) histograms: Arc<Histograms>,
    pub(crate) exporter: PrometheusRecorder,
    /// Set once a histogram without buckets is the exporter's ([`fold_samples`]).
    pub(crate) folding: std::sync::Once,
}

impl Recorder for SplitRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.exporter.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.exporter.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        if self.histograms.bounds(key.as_str()).is_some() {
            let mut held = self.histograms.held();
            held.descriptions
                .entry(key.as_str().to_owned())
                .or_insert(description);
        } else {
            self.exporter.describe_histogram(key, unit, description);
        }
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.exporter.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.exporter.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        match self.histograms.series(key) {
            Some(fixed) => Histogram::from_arc(fixed),
            None => {
                self.folding
                    .call_once(|| fold_samples(self.exporter.handle()));
                self.exporter.register_histogram(key, metadata)
            }
        }
    }
}

/// How often the exporter's histogram samples are folded into their buckets.
const FOLD_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Folds the exporter's histogram samples every [`FOLD_EVERY`], on a thread of its own, for as
/// long as the process runs: started by the first histogram without buckets, which the exporter
/// keeps as samples until they are folded (without this its memory would grow with the request
/// rate until the next scrape). Every histogram the gateway records has buckets, so it never
/// starts today.
fn fold_samples(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new()
        .name("spillway-fold".into())
        .spawn(move || loop {
            std::thread::sleep(FOLD_EVERY);
            handle.run_upkeep();
        });
    if let Err(e) = spawned {
        // Every scrape still folds what was recorded since the one before.
        tracing::warn!("histogram samples are folded at each scrape only: no thread for it: {e}");
    }
}

/// What `/metrics` is rendered from.
#[derive(Clone)]
pub struct MetricsHandle {
    pub(crate) exporter: PrometheusHandle,
    pub(crate) histograms: Arc<Histograms>,
}

impl MetricsHandle {
    /// The whole page: the exporter's metrics, then these histograms.
    pub fn render(&self) -> String {
        let mut page = self.exporter.render();
        self.histograms.render(&mut page);
        page
    }

    /// Folds the exporter's own histogram samples (those without buckets) into its page.
    pub fn run_upkeep(&self) {
        self.exporter.run_upkeep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: &[f64] = &[0.1, 1.0, 10.0];

    #[test]
    fn each_value_counts_at_every_bound_at_or_above_it_as_the_exporter_counts() {
        let fixed = Fixed::new(BOUNDS);
        for value in [0.05, 0.1, 0.5, 1.0, 3.0, 10.0, 11.0, f64::NAN] {
            fixed.record(value);
        }
        let (buckets, count, sum) = fixed.snapshot();
        assert_eq!(buckets, [(0.1, 2), (1.0, 4), (10.0, 6)]);
        assert_eq!(count, 8);
        assert!(sum.is_nan());
        let fixed = Fixed::new(BOUNDS);
        fixed.record(0.25);
        fixed.record(0.5);
        assert_eq!(fixed.snapshot().2, 0.75);
    }

    #[test]
    fn the_counts_of_every_writer_add_up_owned_and_shared_alike() {
        let fixed = Fixed::new(BOUNDS);
        assert_eq!(
            fixed.snapshot(),
            (vec![(0.1, 0), (1.0, 0), (10.0, 0)], 0, 0.0)
        );
        // Two owning writers and the shared set, in any order.
        for (writer, value) in [(0, 0.5), (OWNED, 0.5), (3, 20.0), (0, 0.05), (OWNED, 2.0)] {
            fixed.record_as(writer, value);
        }
        let (buckets, count, sum) = fixed.snapshot();
        assert_eq!(buckets, [(0.1, 1), (1.0, 3), (10.0, 4)]);
        assert_eq!((count, sum), (5, 23.05));
        // Only the writers that recorded have counts.
        let made: Vec<usize> = (0..=OWNED)
            .filter(|&w| fixed.sets[w].get().is_some())
            .collect();
        assert_eq!(made, [0, 3, OWNED]);
    }

    #[test]
    fn threads_past_the_owning_ones_lose_no_value() {
        let fixed = Arc::new(Fixed::new(BOUNDS));
        let threads = 2 * OWNED + 3;
        let per_thread = 2000;
        let spawned: Vec<_> = (0..threads)
            .map(|_| {
                let fixed = Arc::clone(&fixed);
                std::thread::spawn(move || {
                    for _ in 0..per_thread {
                        fixed.record(1.0);
                    }
                })
            })
            .collect();
        for thread in spawned {
            thread.join().expect("a recording thread panicked");
        }
        let total = (threads * per_thread) as u64;
        let (buckets, count, sum) = fixed.snapshot();
        assert_eq!(buckets, [(0.1, 0), (1.0, total), (10.0, total)]);
        assert_eq!((count, sum), (total, total as f64));
        // More threads recorded than own counts: the shared set took the rest.
        assert!(fixed.sets[OWNED].get().is_some());
    }

    #[test]
    fn the_page_holds_each_series_with_its_help_type_buckets_sum_and_count() {
        let histograms = Arc::new(Histograms::new(vec![
            (Matcher::Full("h_attempts".into()), BOUNDS),
            (Matcher::Suffix("_seconds".into()), &[0.5]),
        ]));
        let recorder = SplitRecorder {
            histograms: Arc::clone(&histograms),
            exporter: metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder(),
            folding: std::sync::Once::new(),
        };
        let metadata = Metadata::new("t", metrics::Level::INFO, None);
        recorder.describe_histogram("h_seconds".into(), Some(Unit::Seconds), "How long.".into());
        let key = Key::from_parts("h_seconds", vec![metrics::Label::new("model", "m\"1")]);
        recorder.register_histogram(&key, &metadata).record(0.25);
        // The same key, registered again, is the same series.
        recorder.register_histogram(&key, &metadata).record(2.0);
        recorder
            .register_histogram(&Key::from_name("h_attempts"), &metadata)
            .record(1.0);
        // Only a histogram without buckets is the exporter's, and only it starts the folding.
        assert!(!recorder.folding.is_completed());
        recorder
            .register_histogram(&Key::from_name("h_plain"), &metadata)
            .record(1.0);
        assert!(recorder.folding.is_completed());
        let mut page = String::new();
        histograms.render(&mut page);
        assert_eq!(
            page,
            "# TYPE h_attempts histogram\n\
             h_attempts_bucket{le=\"0.1\"} 0\n\
             h_attempts_bucket{le=\"1\"} 1\n\
             h_attempts_bucket{le=\"10\"} 1\n\
             h_attempts_bucket{le=\"+Inf\"} 1\n\
             h_attempts_sum 1\n\
             h_attempts_count 1\n\
             \n\
             # HELP h_seconds How long.\n\
             # TYPE h_seconds histogram\n\
             h_seconds_bucket{model=\"m\\\"1\",le=\"0.5\"} 1\n\
             h_seconds_bucket{model=\"m\\\"1\",le=\"+Inf\"} 2\n\
             h_seconds_sum{model=\"m\\\"1\"} 2.25\n\
             h_seconds_count{model=\"m\\\"1\"} 2\n\
             \n"
        );
    }
}
