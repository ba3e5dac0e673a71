//! The directory's metric names and the few places they are recorded.
//!
//! IL-0136's connection exhaustion was hard to see because nothing measured it. These series
//! show the cache's hit ratio by outcome, every query that reached the store with its result and
//! latency, the cache's size and evictions, and the shared layer's errors. Names are public
//! constants so dashboards, alert rules and tests refer to one spelling. Label values come from
//! fixed sets only: never a key, a digest or a tenant name.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Histogram};

use crate::Outcome;

/// Counter, label `outcome`: `fresh_hit`, `stale_hit`, `miss`, `negative_hit`, `redis_hit`,
/// `store_error`.
pub const KEY_LOOKUPS_TOTAL: &str = "spillway_key_lookups_total";
/// Histogram of lookups' durations, in seconds, however they were answered; an answer the
/// cache gives at once, without waiting, counts as 0 (it takes well under the first bucket).
pub const KEY_LOOKUP_SECONDS: &str = "spillway_key_lookup_seconds";
/// Buckets for [`KEY_LOOKUP_SECONDS`]: a cache hit takes microseconds, a store query
/// milliseconds, a lookup that waited for a failing store up to `load_timeout`.
pub const KEY_LOOKUP_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
];
/// Counter, label `result`: `ok`, `not_found`, `error`. Counts queries that reached the store
/// (lookups, refreshes and warm-up pages), not lookups.
pub const STORE_QUERIES_TOTAL: &str = "spillway_store_queries_total";
/// Histogram of the store queries' durations, in seconds (timeouts count as their limit).
pub const STORE_QUERY_SECONDS: &str = "spillway_store_query_seconds";
/// Gauge, label `cache`: `known` or `unknown`; set by `Directory::stats`.
pub const KEY_CACHE_ENTRIES: &str = "spillway_key_cache_entries";
/// Counter, label `cache`: `known` or `unknown`; entries dropped because a cache was full.
pub const KEY_CACHE_EVICTIONS_TOTAL: &str = "spillway_key_cache_evictions_total";
/// Counter, label `op`: `connect`, `get`, `set`, `del`. Errors and timeouts of the Redis layer.
pub const REDIS_ERRORS_TOTAL: &str = "spillway_redis_errors_total";

/// Registers the descriptions with the installed recorder (call once, after installing it).
pub fn describe() {
    metrics::describe_counter!(KEY_LOOKUPS_TOTAL, "Key lookups by how they were answered.");
    metrics::describe_histogram!(
        KEY_LOOKUP_SECONDS,
        metrics::Unit::Seconds,
        "Duration of key lookups, cache hits included."
    );
    metrics::describe_counter!(
        STORE_QUERIES_TOTAL,
        "Queries that reached the metadata store, by result."
    );
    metrics::describe_histogram!(
        STORE_QUERY_SECONDS,
        metrics::Unit::Seconds,
        "Duration of the metadata store's queries."
    );
    metrics::describe_gauge!(KEY_CACHE_ENTRIES, "Entries in the key lookup cache.");
    metrics::describe_counter!(
        KEY_CACHE_EVICTIONS_TOTAL,
        "Key cache entries evicted because the cache was full."
    );
    metrics::describe_counter!(
        REDIS_ERRORS_TOTAL,
        "Errors and timeouts of the Redis layer."
    );
}

/// The series every lookup records, each registered with the recorder the first time it is
/// recorded (an outcome appears on the page once it has happened) and kept, so that a lookup
/// costs two atomic updates rather than a label set built, hashed and found in the registry.
#[derive(Default)]
pub(crate) struct LookupSeries {
    outcomes: [OnceLock<Counter>; Outcome::ALL.len()],
    seconds: OnceLock<Histogram>,
}

impl LookupSeries {
    pub(crate) fn record(&self, outcome: Outcome, took: Duration) {
        self.outcomes[outcome as usize]
            .get_or_init(|| metrics::counter!(KEY_LOOKUPS_TOTAL, "outcome" => outcome.as_str()))
            .increment(1);
        self.seconds
            .get_or_init(|| metrics::histogram!(KEY_LOOKUP_SECONDS))
            .record(took.as_secs_f64());
    }
}

/// One store query's result: `ok`, `not_found` or `error`.
pub(crate) fn store_query(result: &'static str, took: Duration) {
    metrics::counter!(STORE_QUERIES_TOTAL, "result" => result).increment(1);
    metrics::histogram!(STORE_QUERY_SECONDS).record(took.as_secs_f64());
}

pub(crate) fn entries(cache: &'static str, count: u64) {
    metrics::gauge!(KEY_CACHE_ENTRIES, "cache" => cache).set(count as f64);
}

pub(crate) fn eviction(cache: &'static str) {
    metrics::counter!(KEY_CACHE_EVICTIONS_TOTAL, "cache" => cache).increment(1);
}

pub(crate) fn redis_error(op: &'static str) {
    metrics::counter!(REDIS_ERRORS_TOTAL, "op" => op).increment(1);
}
