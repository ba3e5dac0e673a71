//! The counter series a request adds to at its end (`spillway_requests_total`,
//! `spillway_upstream_attempts_total`, ...), labelled by its tenant, model and backend, found
//! without building a label set for each request.
//!
//! A series is registered once and kept in a map by its name and label strings; looking it up
//! there hashed the strings and took a lock: about 350 instructions and eight atomic operations a
//! request for each of two series. Each thread keeps the series it has counted in at hand by
//! where the strings lie (their addresses, hashed as numbers): a label is the same `Arc<str>` from
//! one request to the next (the tenant's, the pool's, the backend's name), so the common case is
//! one hash of six numbers and no lock.

use std::cell::RefCell;
use std::sync::{Arc, LazyLock, RwLock};

use foldhash::HashMap;
use metrics::Counter;

use crate::per_thread::{address, at_hand};

/// A counter series by metric name, (tenant, model, backend) and status (0 where unused).
pub(super) type SeriesKey = (&'static str, Arc<str>, Arc<str>, Arc<str>, u16);

/// The counter series seen so far. Every part of the key comes from configuration or is a
/// status code, so the map is bounded.
static COUNTERS: LazyLock<RwLock<HashMap<SeriesKey, Counter>>> = LazyLock::new(Default::default);

/// Where a series' name and label strings lie, and its status.
type Place = (usize, usize, usize, usize, usize, u16);

/// A series at hand, and the label strings that keep its place.
type Held = (Counter, [Arc<str>; 3]);

thread_local! {
    /// The series this thread has counted in, by [`Place`]. An entry holds its label strings,
    /// so while it is here no other string can come to lie where one of them does: one place
    /// is always one series. A string of the same text elsewhere (a reloaded config's) is
    /// another place of the same series.
    static NEAR: RefCell<HashMap<Place, Held>> = RefCell::default();
}

/// Adds `by` to the series `name` of `labels` (tenant, model, backend) and `status`, which
/// `make` registers when it is new.
pub(super) fn count(
    name: &'static str,
    labels: [&Arc<str>; 3],
    status: u16,
    by: u64,
    make: impl FnOnce(&SeriesKey) -> Counter,
) {
    let place = (
        name.as_ptr() as usize,
        name.len(),
        address(labels[0]),
        address(labels[1]),
        address(labels[2]),
        status,
    );
    NEAR.with_borrow_mut(|near| {
        let (counter, _) = at_hand(near, place, || {
            let [tenant, model, backend] = labels.map(Arc::clone);
            let counter = registered((name, tenant, model, backend, status), make);
            (counter, labels.map(Arc::clone))
        });
        counter.increment(by);
    });
}

/// The series of `key`, registered by `make` the first time.
fn registered(key: SeriesKey, make: impl FnOnce(&SeriesKey) -> Counter) -> Counter {
    let known = COUNTERS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .cloned();
    known.unwrap_or_else(|| {
        let counter = make(&key);
        COUNTERS
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, counter.clone());
        counter
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    use metrics::{Key, KeyName, Metadata, Recorder, SharedString, Unit};

    use super::*;
    use crate::per_thread::AT_HAND_MAX;

    /// Counters by name and labels, as registered.
    #[derive(Default)]
    struct Counts(Mutex<std::collections::HashMap<String, Arc<AtomicU64>>>);

    impl Counts {
        fn of(&self, key: &str) -> u64 {
            let counts = self.0.lock().unwrap();
            counts.get(key).map_or(0, |c| c.load(Ordering::Relaxed))
        }
    }

    impl Recorder for Counts {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            let labels: Vec<String> = key.labels().map(|l| l.value().to_owned()).collect();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            let mut counts = self.0.lock().unwrap();
            Counter::from_arc(counts.entry(name).or_default().clone())
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> metrics::Histogram {
            metrics::Histogram::noop()
        }
    }

    fn make(k: &SeriesKey) -> Counter {
        metrics::counter!(k.0, "tenant" => k.1.clone(), "model" => k.2.clone(),
            "backend" => k.3.clone(), "status" => k.4.to_string())
    }

    /// Counted through labels of one text in different strings (a reloaded config's), and past
    /// the most series a thread keeps at hand, each series gets every count, and no other.
    #[test]
    fn a_series_gets_every_count_whatever_strings_its_labels_lie_in() {
        const NAME: &str = "spillway_test_near_total";
        let counts = Counts::default();
        metrics::with_local_recorder(&counts, || {
            let (model, backend) = (Arc::from("m"), Arc::from("b"));
            let first: Arc<str> = Arc::from("t");
            let again: Arc<str> = Arc::from("t");
            assert_ne!(address(&first), address(&again));
            for _ in 0..3 {
                count(NAME, [&first, &model, &backend], 200, 1, make);
            }
            count(NAME, [&again, &model, &backend], 200, 2, make);
            count(NAME, [&first, &model, &backend], 503, 1, make);
            // More series than a thread keeps: the first ones are let go and found again.
            let others: Vec<Arc<str>> = (0..AT_HAND_MAX + 10)
                .map(|i| Arc::from(format!("o{i}")))
                .collect();
            for other in &others {
                count(NAME, [other, &model, &backend], 200, 1, make);
            }
            count(NAME, [&first, &model, &backend], 200, 1, make);
            count(NAME, [&others[0], &model, &backend], 200, 1, make);
        });
        let of = |labels: &str| counts.of(&format!("{NAME}{{{labels}}}"));
        assert_eq!(of("t,m,b,200"), 6);
        assert_eq!(of("t,m,b,503"), 1);
        assert_eq!(of("o0,m,b,200"), 2);
        assert_eq!(of("o7,m,b,200"), 1);
    }
}
