//! The series the gateway counts itself: every counter, and the histograms whose buckets are
//! known, each counted per thread (`per_thread.rs`); and the recorder that hands them out in
//! front of the Prometheus exporter's, which keeps the gauges.
//!
//! The exporter keeps every histogram sample in a lock-free queue until it is folded into buckets
//! (at a scrape, or by a thread that folds every second): a push through an epoch-based
//! collector per sample, eight per request, and memory held in proportion to the request rate.
//! A histogram whose buckets are known needs neither: a value is counted in its bucket at once,
//! and the page is written from the counts (the total is the buckets' sum). Its counters take two
//! locked additions an increment (the value and a generation, for expiring idle series, which
//! the gateway does not do); a worker thread here adds with none. Gauges and histograms without
//! buckets stay the exporter's, and the page is its page with these series after it, in the
//! exposition format the exporter writes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::formatting::{
    key_to_parts, write_help_line, write_metric_line, write_type_line,
};
use metrics_exporter_prometheus::{Matcher, PrometheusHandle, PrometheusRecorder};

use crate::counters::Tally;
use crate::per_thread::{writer, PerThread};

/// One histogram's counts: a bucket per bound and one past the last (`+Inf`), and the sum of
/// the values. The total is the buckets' sum, read with them: a page never shows a `+Inf` count
/// below a bucket's, as a total counted apart could while a value is being recorded.
///
/// The counts are kept per thread (`per_thread.rs`): each of the first eight threads to record
/// a histogram counts into a set of its own with plain loads and stores, later threads share one
/// set and count with atomic additions; a request records eight values, two additions each. The page adds the sets up. A series thus holds one set (about 170 bytes with the most
/// bounds, 17) per thread that records into it, at most nine.
pub(crate) struct Fixed {
    bounds: &'static [f64],
    sets: PerThread<Counts>,
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

impl Fixed {
    /// `bounds` rise, as Prometheus's buckets do.
    fn new(bounds: &'static [f64]) -> Fixed {
        debug_assert!(bounds.windows(2).all(|pair| pair[0] < pair[1]));
        Fixed {
            bounds,
            sets: PerThread::new(),
        }
    }

    /// Counts `value` into the set of writer `writer` (see [`writer`]).
    fn record_as(&self, writer: usize, value: f64) {
        // The first bound at or above the value is the number of bounds below it (the bounds
        // rise), counted over all of them: a few independent comparisons, done two at a time,
        // where a binary search waits on each load and comparison before the next (the bounds
        // are 17 at most). A NaN is above every bound.
        let at = match value.is_nan() {
            true => self.bounds.len(),
            false => self
                .bounds
                .iter()
                .map(|&bound| usize::from(bound < value))
                .sum(),
        };
        match self
            .sets
            .copy(writer, || Counts::new(self.bounds.len() + 1))
        {
            (counts, true) => counts.count_owned(at, value),
            (counts, false) => counts.count_shared(at, value),
        }
    }

    /// The cumulative count at each bound (`value <= bound`), the total and the sum.
    fn snapshot(&self) -> (Vec<(f64, u64)>, u64, f64) {
        let sets: Vec<&Counts> = self.sets.made().collect();
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

/// Series of one kind, by name and then by key, and their descriptions.
struct Family<T> {
    series: BTreeMap<String, BTreeMap<Key, Arc<T>>>,
    descriptions: BTreeMap<String, SharedString>,
}

impl<T> Default for Family<T> {
    fn default() -> Self {
        Family {
            series: BTreeMap::new(),
            descriptions: BTreeMap::new(),
        }
    }
}

/// The series of `key` in `family`, made by `make` on first use. Handles on the request path are
/// made once and kept, but a refusal's series is looked up at each refusal (`counter!` with its
/// reason), many at once when the gateway sheds: it is found under the read lock, which threads
/// share, and made under the write lock; a series is found without a copy of its key.
fn series_of<T>(family: &RwLock<Family<T>>, key: &Key, make: impl FnOnce() -> T) -> Arc<T> {
    let read = family.read().unwrap_or_else(PoisonError::into_inner);
    if let Some(found) = read
        .series
        .get(key.name())
        .and_then(|by_key| by_key.get(key))
    {
        return Arc::clone(found);
    }
    drop(read);
    let mut write = family.write().unwrap_or_else(PoisonError::into_inner);
    let by_key = write.series.entry(key.name().to_owned()).or_default();
    Arc::clone(
        by_key
            .entry(key.clone())
            .or_insert_with(|| Arc::new(make())),
    )
}

/// The first description of `name` in `family` is kept, as the exporter keeps it.
fn describe<T>(family: &RwLock<Family<T>>, name: &str, description: SharedString) {
    let mut write = family.write().unwrap_or_else(PoisonError::into_inner);
    write
        .descriptions
        .entry(name.to_owned())
        .or_insert(description);
}

/// Writes each series of `family` in Prometheus's text format, each name after its `# HELP`
/// and `# TYPE` lines, each series by `write` (given the page, the name and the label pairs).
/// The lock is held only to copy the list of series, not while they are written.
fn render_family<T>(
    family: &RwLock<Family<T>>,
    kind: &str,
    out: &mut String,
    write: impl Fn(&mut String, &str, &[String], &T),
) {
    type Series<T> = Vec<(String, Vec<(Key, Arc<T>)>)>;
    let (series, descriptions): (Series<T>, BTreeMap<String, SharedString>) = {
        let family = family.read().unwrap_or_else(PoisonError::into_inner);
        let series = family
            .series
            .iter()
            .map(|(name, by_key)| {
                let by_key = by_key.iter().map(|(k, s)| (k.clone(), Arc::clone(s)));
                (name.clone(), by_key.collect())
            })
            .collect();
        (series, family.descriptions.clone())
    };
    for (name, by_key) in &series {
        let (name, _) = key_to_parts(&Key::from_name(name.clone()), None);
        if let Some(description) = descriptions.get(&name) {
            write_help_line(out, &name, description);
        }
        write_type_line(out, &name, kind);
        for (key, one) in by_key {
            let (_, labels) = key_to_parts(key, None);
            write(out, &name, &labels, one);
        }
        out.push('\n');
    }
}

/// The series the gateway counts itself, shared by the recorder and the page: every counter,
/// and the histograms with buckets.
pub(crate) struct Kept {
    /// Which histograms get which buckets: the first whose matcher takes the name.
    buckets: Vec<(Matcher, &'static [f64])>,
    histograms: RwLock<Family<Fixed>>,
    counters: RwLock<Family<Tally>>,
}

impl Kept {
    pub(crate) fn new(buckets: Vec<(Matcher, &'static [f64])>) -> Kept {
        Kept {
            buckets,
            histograms: RwLock::default(),
            counters: RwLock::default(),
        }
    }

    fn bounds(&self, name: &str) -> Option<&'static [f64]> {
        let mut rules = self.buckets.iter();
        rules.find_map(|(matcher, bounds)| matcher.matches(name).then_some(*bounds))
    }

    /// The histogram series of `key`, made on first use; `None` when its name has no buckets.
    fn histogram(&self, key: &Key) -> Option<Arc<Fixed>> {
        let bounds = self.bounds(key.name())?;
        Some(series_of(&self.histograms, key, || Fixed::new(bounds)))
    }

    /// The counters, then the histograms, in Prometheus's text format.
    pub(crate) fn render(&self, out: &mut String) {
        render_family(
            &self.counters,
            "counter",
            out,
            |out, name, labels, tally| {
                write_metric_line::<&str, u64>(out, name, None, labels, None, tally.total(), None);
            },
        );
        render_family(
            &self.histograms,
            "histogram",
            out,
            |out, name, labels, fixed| {
                let (buckets, count, sum) = fixed.snapshot();
                for (le, below) in buckets {
                    write_metric_line(
                        out,
                        name,
                        Some("bucket"),
                        labels,
                        Some(("le", le)),
                        below,
                        None,
                    );
                }
                let le = Some(("le", "+Inf"));
                write_metric_line(out, name, Some("bucket"), labels, le, count, None);
                write_metric_line::<&str, f64>(out, name, Some("sum"), labels, None, sum, None);
                write_metric_line::<&str, u64>(out, name, Some("count"), labels, None, count, None);
            },
        );
    }
}

/// The process's recorder: counters and histograms with buckets kept here, gauges and
/// histograms without buckets the exporter's.
pub(crate) struct SplitRecorder {
    pub(crate) kept: Arc<Kept>,
    pub(crate) exporter: PrometheusRecorder,
    /// Set once a histogram without buckets is the exporter's ([`fold_samples`]).
    pub(crate) folding: std::sync::Once,
}

impl Recorder for SplitRecorder {
    fn describe_counter(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        describe(&self.kept.counters, key.as_str(), description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.exporter.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        if self.kept.bounds(key.as_str()).is_some() {
            describe(&self.kept.histograms, key.as_str(), description);
        } else {
            self.exporter.describe_histogram(key, unit, description);
        }
    }

    fn register_counter(&self, key: &Key, _metadata: &Metadata<'_>) -> Counter {
        Counter::from_arc(series_of(&self.kept.counters, key, Tally::new))
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.exporter.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        match self.kept.histogram(key) {
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
    pub(crate) kept: Arc<Kept>,
}

impl MetricsHandle {
    /// The whole page: the exporter's metrics (gauges), then the counters and histograms kept
    /// here.
    pub fn render(&self) -> String {
        let mut page = self.exporter.render();
        self.kept.render(&mut page);
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
    use crate::per_thread::OWNED;

    const BOUNDS: &[f64] = &[0.1, 1.0, 10.0];

    /// A recorder keeping its series in `kept`, in front of an exporter of its own.
    fn split(kept: &Arc<Kept>) -> SplitRecorder {
        SplitRecorder {
            kept: Arc::clone(kept),
            exporter: metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder(),
            folding: std::sync::Once::new(),
        }
    }

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

    proptest::proptest! {
        #[test]
        fn a_value_goes_to_the_first_bucket_whose_bound_is_at_or_above_it(
            value in proptest::num::f64::ANY,
        ) {
            let fixed = Fixed::new(crate::metrics::LATENCY_BUCKETS);
            fixed.record_as(0, value);
            let (buckets, _, _) = fixed.snapshot();
            let first = buckets.iter().position(|&(_, below)| below == 1);
            let at_or_above = fixed.bounds.iter().position(|&bound| value <= bound);
            proptest::prop_assert_eq!(first, at_or_above);
        }
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
        let made: Vec<usize> = (0..=OWNED).filter(|&w| fixed.sets.has(w)).collect();
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
        assert!(fixed.sets.has(OWNED));
    }

    #[test]
    fn the_page_holds_each_series_with_its_help_type_buckets_sum_and_count() {
        let kept = Arc::new(Kept::new(vec![
            (Matcher::Full("h_attempts".into()), BOUNDS),
            (Matcher::Suffix("_seconds".into()), &[0.5]),
        ]));
        let recorder = split(&kept);
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
        kept.render(&mut page);
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

    #[test]
    fn counters_are_written_as_the_exporter_writes_them() {
        let kept = Arc::new(Kept::new(vec![]));
        let ours = split(&kept);
        let exporter = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let metadata = Metadata::new("t", metrics::Level::INFO, None);
        let labels = vec![
            metrics::Label::new("tenant", "t\"1"),
            metrics::Label::new("status", "200"),
        ];
        let key = Key::from_parts("c_total", labels);
        for recorder in [&ours as &dyn Recorder, &exporter] {
            recorder.describe_counter("c_total".into(), None, "Things done.".into());
            // A later description does not replace the first.
            recorder.describe_counter("c_total".into(), None, "Other.".into());
            recorder.register_counter(&key, &metadata).increment(3);
            // The same key, registered again, is the same series.
            recorder.register_counter(&key, &metadata).increment(4);
            recorder
                .register_counter(&Key::from_name("c_set"), &metadata)
                .absolute(9);
            recorder
                .register_counter(&Key::from_name("c_set"), &metadata)
                .absolute(2);
        }
        let mut page = String::new();
        kept.render(&mut page);
        assert_eq!(
            page,
            "# TYPE c_set counter\n\
             c_set 9\n\
             \n\
             # HELP c_total Things done.\n\
             # TYPE c_total counter\n\
             c_total{tenant=\"t\\\"1\",status=\"200\"} 7\n\
             \n"
        );
        // The exporter's page holds the same lines (its names in any order).
        let theirs = exporter.handle().render();
        let mut lines: Vec<&str> = theirs.lines().collect();
        let mut mine: Vec<&str> = page.lines().collect();
        lines.sort_unstable();
        mine.sort_unstable();
        assert_eq!(mine, lines);
        // Counters are no longer the exporter's: its own page has none of them.
        assert!(!ours.exporter.handle().render().contains("c_total"));
    }

    /// A refusal's series is registered at each refusal, on every worker thread when the gateway
    /// sheds: threads registering one series at once get that one series and lose no count.
    #[test]
    fn threads_registering_one_series_at_once_share_it_and_lose_no_count() {
        let kept = Arc::new(Kept::new(vec![]));
        let recorder = split(&kept);
        let metadata = Metadata::new("t", metrics::Level::INFO, None);
        let key = Key::from_parts("refused_total", vec![metrics::Label::new("why", "full")]);
        let (threads, per_thread) = (12, 2000);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..per_thread {
                        recorder.register_counter(&key, &metadata).increment(1);
                    }
                });
            }
        });
        let mut page = String::new();
        kept.render(&mut page);
        let total = threads * per_thread;
        assert_eq!(
            page,
            format!("# TYPE refused_total counter\nrefused_total{{why=\"full\"}} {total}\n\n")
        );
    }
}
