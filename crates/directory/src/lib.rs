//! The key -> tenant lookup path: an in-process cache, optionally a shared Redis layer, and the
//! store behind them, built so that a flushed cache or a failing database does not become an
//! outage (guarantee G6, incident IL-0136).
//!
//! In IL-0136 a deployment flushed a service's caches at peak, defects made lookups bypass the
//! cache, and the metadata database took about twenty times its normal load until connections
//! ran out. Every protection here answers one part of that:
//!
//! - **single flight** (`flight.rs`): concurrent lookups of one key cause one store query;
//! - **a cap on store queries in flight** (`max_concurrent_loads`, a semaphore): a flush of
//!   100 000 keys reaches the store as at most that many concurrent queries, and a lookup that
//!   cannot get a slot within `load_wait` serves what it has instead of queueing;
//! - **stale-while-revalidate and stale-if-error** ([`freshness`]): a stale answer is served at
//!   once while one background refresh runs, and stands in when the store fails or is slow;
//!   a flush marks answers for re-reading, spread over `flush_spread`, and keeps them as that
//!   fallback;
//! - **jittered TTLs** so answers loaded together do not fall due together;
//! - **negative caching** in a cache of its own, so unknown keys do not reach the store on every
//!   request and random keys cannot evict real ones;
//! - **a warm snapshot** ([`snapshot`]) and a bounded **warm-up** ([`warm`]) so a restart starts
//!   with a full cache rather than a stampede, its entries falling due spread over one TTL;
//! - **metrics** ([`metrics`]) for the hit ratio, every store query, and Redis errors.
//!
//! `CacheConfig::naive` (`[cache] naive`) turns all of this off, so a replay can show what it prevents.
//!
//! The cached value is the store's raw [`KeyMatch`]: revoked, expired and disabled are judged by
//! the caller at each use, so a cached answer is judged again as time passes.
//!
//! Architecture Invariant: the request path reaches the store only through a flight holding a
//! load slot; nothing here makes readiness depend on the store (`is_warm` is process-local).

// Tests may time real processes and sockets on the system clock (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod config;
pub mod error;
pub mod freshness;
pub mod metrics;
pub mod shared;
pub mod snapshot;
pub mod warm;

mod entry;
mod flight;
mod front;
mod load;
pub mod log_gate;
mod naive;
mod state;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use spillway_config::CacheConfig;
use spillway_store::{KeyDigest, KeyMatch, Store};

pub use error::DirectoryError;

use state::State;

/// How a lookup was answered, for metrics (`spillway_key_lookups_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// From the in-process cache, within its TTL.
    Fresh,
    /// From the in-process cache after its TTL: served at once while a refresh runs, or in
    /// place of an answer the store could not give.
    Stale,
    /// Loaded from the store (the lookup waited for it).
    Miss,
    /// Remembered as unknown.
    Negative,
    /// Loaded from the shared Redis layer.
    RedisHit,
    /// No usable answer and the store failed: only ever a metric label, the lookup is an `Err`.
    StoreError,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Fresh,
        Outcome::Stale,
        Outcome::Miss,
        Outcome::Negative,
        Outcome::RedisHit,
        Outcome::StoreError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Fresh => "fresh_hit",
            Outcome::Stale => "stale_hit",
            Outcome::Miss => "miss",
            Outcome::Negative => "negative_hit",
            Outcome::RedisHit => "redis_hit",
            Outcome::StoreError => "store_error",
        }
    }
}

/// A lookup's answer: the key and its tenant, or `None` for a key the store does not know.
#[derive(Debug, Clone)]
pub struct Lookup {
    pub found: Option<Arc<KeyMatch>>,
    pub outcome: Outcome,
}

impl Lookup {
    /// The lookup of a lent answer (`Directory::cached_as`), taken as its own.
    pub(crate) fn of(found: Option<&Arc<KeyMatch>>, outcome: Outcome) -> Lookup {
        Lookup {
            found: found.cloned(),
            outcome,
        }
    }
}

/// Figures for `/healthz/deps`, logs and the gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DirectoryStats {
    /// Known keys cached (including stale ones and ones awaiting revalidation after a flush).
    pub entries: u64,
    /// Unknown keys remembered.
    pub negative_entries: u64,
    /// Known keys evicted because the cache was full.
    pub evictions: u64,
    /// Unknown keys evicted because their cache was full.
    pub negative_evictions: u64,
    /// Store queries running now (never more than `max_concurrent_loads`).
    pub loads_in_flight: u64,
    /// Keys with a flight in the air (waiting for a slot, on Redis or on the store).
    pub keys_loading: u64,
    /// Store queries since start (lookups, refreshes, warm-up pages).
    pub store_queries: u64,
    /// Those that failed or timed out.
    pub store_errors: u64,
    /// Background refreshes not started because every load slot was taken.
    pub refreshes_skipped: u64,
    /// Redis errors and timeouts since start.
    pub redis_errors: u64,
    /// `invalidate_all` calls since start.
    pub flushes: u64,
    pub warm: bool,
}

/// The cached key directory. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Directory {
    state: Arc<State>,
    /// Chosen once, from `cache.naive`.
    lookup: Lookups,
    /// Registered at the first lookup, once the gateway has installed its recorder.
    lookups: metrics::LookupSeries,
}

/// Which lookup a directory serves with.
#[derive(Debug, Clone, Copy)]
enum Lookups {
    /// Single flight, the load cap, stale answers: every protection of this crate.
    Protected,
    /// None of them (`naive.rs`), for the replay only.
    Naive,
}

impl Directory {
    /// Checks the config and builds the caches. With `redis` set, connects to it for at most
    /// a second; a Redis that is down is not an error (lookups go without it until it is back).
    pub async fn new(store: Arc<dyn Store>, config: CacheConfig) -> Result<Self, DirectoryError> {
        config::check(&config)?;
        let shared = match &config.redis {
            Some(url) => Some(shared::SharedLayer::start(url, config.redis_timeout).await?),
            _ => None,
        };
        let lookup = if config.naive {
            Lookups::Naive
        } else {
            Lookups::Protected
        };
        Ok(Self {
            state: Arc::new(State::new(store, config, shared)),
            lookup,
            lookups: metrics::LookupSeries::default(),
        })
    }

    /// The key with this digest and its tenant, whatever their state, or `None` if the store
    /// does not know it. `Err` only when there is no usable answer and the store failed, timed
    /// out or had no free load slot within `load_wait`.
    pub async fn lookup(&self, digest: &KeyDigest) -> Result<Lookup, DirectoryError> {
        let started = tokio::time::Instant::now();
        let result = match self.lookup {
            Lookups::Protected => self.state.lookup(digest, started).await,
            Lookups::Naive => self.state.lookup_naive(digest).await,
        };
        let outcome = match &result {
            Ok(found) => found.outcome,
            Err(_) => Outcome::StoreError,
        };
        self.lookups.record(outcome, started.elapsed());
        result
    }

    /// The answer [`Directory::lookup`] would give at `now`, when the cache has it and no load is
    /// needed (the request path's usual case, answered without a future); `None` otherwise,
    /// and always in naive mode. `now` is a reading of tokio's clock the caller has at hand (the
    /// request path's poll reads it once). Counted in the lookup metrics like any other answer,
    /// as taking no time in `spillway_key_lookup_seconds`: it is given without waiting, in well
    /// under the first bucket's 50 µs, and timing it would read the clock twice a request. A
    /// caller that then calls `lookup` has the cache read again (two reads, beside the load it
    /// leads to).
    pub fn cached(&self, digest: &KeyDigest, now: tokio::time::Instant) -> Option<Lookup> {
        self.cached_as(digest, now, Lookup::of)
    }

    /// [`Directory::cached`], the caller's answer made by `answer` of the cached key's answer
    /// (`None` for a key known to be unknown) and its outcome, lent rather than handed over:
    /// from this thread's front of fresh answers, no reference count is taken for it.
    pub fn cached_as<R>(
        &self,
        digest: &KeyDigest,
        now: tokio::time::Instant,
        answer: impl Fn(Option<&Arc<KeyMatch>>, Outcome) -> R,
    ) -> Option<R> {
        let Lookups::Protected = self.lookup else {
            return None;
        };
        let answer = self.state.cached_as(digest, now, |found, outcome| {
            self.lookups.record(outcome, std::time::Duration::ZERO);
            answer(found, outcome)
        });
        answer.ok()
    }

    /// Forgets one key at once, known or unknown (after a revoke, or after creating a key that
    /// was remembered as unknown), and deletes it from Redis in the background. A load of it in
    /// the air does not put its answer back. Other instances see the change within their TTL.
    pub fn invalidate(&self, digest: &KeyDigest) {
        self.state.invalidate(digest);
    }

    /// Forgets every known key for which `matches` is true (a tenant changed, a key revoked by
    /// its id), like [`Directory::invalidate`]. Walks the cache: for admin actions, not requests.
    pub fn invalidate_if(&self, matches: impl Fn(&KeyMatch) -> bool) {
        self.state.invalidate_if(matches);
    }

    /// The flush of IL-0136: every cached answer must be re-read before it is served as fresh.
    /// Answers are kept as a fallback, so that a store that is slow or down after a flush means
    /// stale answers rather than failed requests; unknown keys are forgotten. The re-reads go
    /// through single flight and the load cap like any other.
    pub fn invalidate_all(&self) {
        self.state.invalidate_all();
    }

    /// Loads up to `max_keys` keys from the store, `batch` at a time through one load slot,
    /// pausing between pages (at least as long as the last page took). Returns how many.
    pub async fn warm_from_store(&self, batch: u32, max_keys: u64) -> Result<u64, DirectoryError> {
        warm::from_store(&self.state, batch, max_keys).await
    }

    /// Writes every usable known answer to the `snapshot` path, atomically (temporary file,
    /// then rename). Returns how many; `Ok(0)` without a snapshot path.
    pub async fn save_snapshot(&self) -> Result<u64, DirectoryError> {
        snapshot::save(&self.state).await
    }

    /// Loads the `snapshot`: its answers are usable at once, with their refreshes spread over
    /// the TTL; answers older than `ttl + stale_for` are dropped. Returns how many were loaded;
    /// `Ok(0)` without a snapshot path or file.
    pub async fn load_snapshot(&self) -> Result<u64, DirectoryError> {
        snapshot::load(&self.state).await
    }

    /// True once a snapshot or warm-up loaded entries, or the store or Redis answered since
    /// start. For `/readyz`; reads process-local state only.
    pub fn is_warm(&self) -> bool {
        self.state.warm.load(Ordering::Acquire)
    }

    /// Current figures; also sets the `spillway_key_cache_entries` gauges.
    pub fn stats(&self) -> DirectoryStats {
        let stats = self.state.stats();
        metrics::entries("known", stats.entries);
        metrics::entries("unknown", stats.negative_entries);
        stats
    }
}

/// Milliseconds since the Unix epoch: the one wall-clock read, for times that outlive the
/// process (snapshot) or cross it (Redis). Everything else reads tokio's monotonic clock
/// (`tokio::time::Instant`), so tests can pause it and move it on.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
