//! The directory's shared state: the two bounded caches, the flights, the load slots, and the
//! counters; and the ways answers enter and leave the caches.
//!
//! Known and unknown keys live in separate moka caches, each with its own bound, so a flood of
//! random keys (a scanner, a misconfigured client) can only evict other unknown keys. Entries
//! leave moka when their stale window ends ([`UntilUnusable`]).
//!
//! Two counters order answers against invalidations without locks. `epoch` counts flushes: an
//! entry from an older epoch is re-read before it is served (but kept as a fallback).
//! `invalidations` counts targeted invalidations: a load that started before one may carry an
//! answer from before a revoke, so after putting its answer in the cache it checks the counter
//! and takes the answer out again if it moved. Because the load inserts *then* checks, and the
//! invalidation counts *then* removes, one of the two always removes the answer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moka::notification::RemovalCause;
use moka::ops::compute::Op;
use moka::sync::Cache;
use spillway_config::CacheConfig;
use spillway_store::{KeyDigest, KeyMatch, Store};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::entry::{Entry, Unknown, UntilUnusable};
use crate::flight::Flights;
use crate::freshness::State as Freshness;
use crate::front;
use crate::log_gate::LogGate;
use crate::shared::{self, SharedLayer};
use crate::{metrics, unix_ms, DirectoryStats};

pub(crate) struct State {
    pub store: Arc<dyn Store>,
    pub config: CacheConfig,
    pub known: Cache<KeyDigest, Arc<Entry>>,
    pub unknown: Cache<KeyDigest, Unknown>,
    pub flights: Arc<Flights>,
    /// One permit per store query in flight.
    pub permits: Arc<Semaphore>,
    pub shared: Option<Arc<SharedLayer>>,
    pub epoch: AtomicU64,
    /// Unix ms of the last flush: Redis answers fetched before it are only a fallback.
    pub flushed_at_ms: AtomicU64,
    /// When the last flush happened, in nanoseconds after `created` (0: never), for spreading
    /// the re-reads it asks for. An atomic, not a lock: after a flush every lookup reads it.
    flushed_after_ns: AtomicU64,
    created: Instant,
    pub invalidations: AtomicU64,
    pub warm: AtomicBool,
    pub counts: Counts,
    /// Store errors are logged at most once per interval.
    pub store_log: LogGate,
    /// Its number in the threads' fronts (`front.rs`).
    pub front_owner: u64,
}

#[derive(Default)]
pub(crate) struct Counts {
    pub store_queries: AtomicU64,
    pub store_errors: AtomicU64,
    pub refreshes_skipped: AtomicU64,
    pub flushes: AtomicU64,
    pub evictions: Arc<AtomicU64>,
    pub negative_evictions: Arc<AtomicU64>,
}

impl State {
    pub fn new(
        store: Arc<dyn Store>,
        config: CacheConfig,
        shared: Option<Arc<SharedLayer>>,
    ) -> Self {
        let counts = Counts::default();
        let evictions = counts.evictions.clone();
        let known = Cache::builder()
            .max_capacity(config.max_entries)
            .expire_after(UntilUnusable)
            .eviction_listener(move |_, entry: Arc<Entry>, cause| {
                // Whatever the cause: moka calls this at once for a revoke or a replacement,
                // so a thread's front stops answering with it before either returns.
                entry.retire();
                if cause == RemovalCause::Size {
                    evictions.fetch_add(1, Ordering::Relaxed);
                    metrics::eviction("known");
                }
            })
            .build();
        let negative_evictions = counts.negative_evictions.clone();
        let unknown = Cache::builder()
            .max_capacity(config.max_negative_entries)
            .expire_after(UntilUnusable)
            .eviction_listener(move |_, _, cause| {
                if cause == RemovalCause::Size {
                    negative_evictions.fetch_add(1, Ordering::Relaxed);
                    metrics::eviction("unknown");
                }
            })
            .build();
        Self {
            store,
            permits: Arc::new(Semaphore::new(config.max_concurrent_loads)),
            config,
            known,
            unknown,
            flights: Arc::new(Flights::default()),
            shared,
            epoch: AtomicU64::new(0),
            flushed_at_ms: AtomicU64::new(0),
            flushed_after_ns: AtomicU64::new(0),
            created: Instant::now(),
            invalidations: AtomicU64::new(0),
            warm: AtomicBool::new(false),
            counts,
            store_log: LogGate::new(shared::LOG_EVERY),
            front_owner: front::next_owner(),
        }
    }

    /// Whether the threads' fronts may answer: only while the known keys' cache is below seven
    /// eighths of its bound, where moka evicts nothing; nearer, moka sees every read, so its
    /// eviction still takes the keys read least.
    pub fn front_allowed(&self) -> bool {
        let bound = self.config.max_entries;
        self.known.entry_count() < bound - bound / 8
    }

    /// Puts a known answer in the cache, unless an invalidation happened since `seq` was read
    /// (then it is taken out again). Returns whether it stayed. A known key is no longer unknown.
    pub fn insert_known(&self, digest: &KeyDigest, entry: Arc<Entry>, seq: u64) -> bool {
        self.known.insert(*digest, entry.clone());
        self.unknown.invalidate(digest);
        if self.invalidations.load(Ordering::SeqCst) == seq {
            return true;
        }
        self.known
            .entry(*digest)
            .and_compute_with(|current| match current {
                Some(c) if Arc::ptr_eq(c.value(), &entry) => Op::Remove,
                _ => Op::Nop,
            });
        false
    }

    /// Remembers an unknown key, on the same terms as [`State::insert_known`]. An unknown key
    /// is no longer known (it was deleted).
    pub fn insert_unknown(&self, digest: &KeyDigest, unknown: Unknown, seq: u64) -> bool {
        self.known.invalidate(digest);
        self.unknown.insert(*digest, unknown);
        if self.invalidations.load(Ordering::SeqCst) == seq {
            return true;
        }
        self.unknown.invalidate(digest);
        false
    }

    pub fn invalidate(&self, digest: &KeyDigest) {
        self.invalidations.fetch_add(1, Ordering::SeqCst);
        self.flights.detach(digest);
        self.known.invalidate(digest);
        self.unknown.invalidate(digest);
        if let Some(shared) = &self.shared {
            shared.delete(&[*digest]);
        }
    }

    pub fn invalidate_if(&self, matches: impl Fn(&KeyMatch) -> bool) {
        self.invalidations.fetch_add(1, Ordering::SeqCst);
        self.flights.detach_all();
        let doomed: Vec<KeyDigest> = self
            .known
            .iter()
            .filter(|(_, entry)| matches(&entry.found))
            .map(|(digest, _)| *digest)
            .collect();
        for digest in &doomed {
            self.known.invalidate(digest);
        }
        if let Some(shared) = &self.shared {
            for chunk in doomed.chunks(500) {
                shared.delete(chunk);
            }
        }
    }

    pub fn invalidate_all(&self) {
        let since = self
            .created
            .elapsed()
            .as_nanos()
            .clamp(1, u128::from(u64::MAX)) as u64;
        self.flushed_after_ns.store(since, Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.flushed_at_ms.store(unix_ms(), Ordering::SeqCst);
        self.unknown.invalidate_all();
        self.counts.flushes.fetch_add(1, Ordering::Relaxed);
    }

    /// What a lookup at `now` does with `entry`, in the current flush epoch.
    pub fn judge(&self, entry: &Entry, now: Instant, epoch: u64) -> Freshness {
        if entry.epoch == epoch {
            return entry.state(now, epoch, None);
        }
        let spread = self.config.flush_spread;
        let since = self.flushed_after_ns.load(Ordering::SeqCst);
        let flushed_at = (since > 0).then(|| self.created + Duration::from_nanos(since));
        entry.state(now, epoch, flushed_at.map(|at| (at, spread)))
    }

    pub fn stats(&self) -> DirectoryStats {
        self.known.run_pending_tasks();
        self.unknown.run_pending_tasks();
        let c = &self.counts;
        let free = self.permits.available_permits();
        DirectoryStats {
            entries: self.known.entry_count(),
            negative_entries: self.unknown.entry_count(),
            evictions: c.evictions.load(Ordering::Relaxed),
            negative_evictions: c.negative_evictions.load(Ordering::Relaxed),
            loads_in_flight: self.config.max_concurrent_loads.saturating_sub(free) as u64,
            keys_loading: self.flights.len() as u64,
            store_queries: c.store_queries.load(Ordering::Relaxed),
            store_errors: c.store_errors.load(Ordering::Relaxed),
            refreshes_skipped: c.refreshes_skipped.load(Ordering::Relaxed),
            redis_errors: self.shared.as_ref().map_or(0, |s| s.errors()),
            flushes: c.flushes.load(Ordering::Relaxed),
            warm: self.warm.load(Ordering::Acquire),
        }
    }
}

#[cfg(test)]
mod tests {
    use spillway_store::{DeferredStore, KeyDigest};

    use super::*;
    use crate::freshness::Window;

    fn answer() -> Arc<KeyMatch> {
        Arc::new(spillway_testkit::key_match(0, "acme"))
    }

    #[test]
    fn the_fronts_answer_only_below_seven_eighths_of_the_cache_bound() {
        let config = CacheConfig {
            max_entries: 16,
            ..CacheConfig::default()
        };
        let state = Arc::new(State::new(Arc::new(DeferredStore::new(1)), config, None));
        let now = Instant::now();
        let window = Window {
            fresh_until: now + Duration::from_secs(60),
            stale_until: now + Duration::from_secs(120),
        };
        let in_front =
            |digest: &KeyDigest| front::answer(state.front_owner, digest, |_| Some(())).is_some();
        for i in 0..16u8 {
            let digest = [i; 32];
            let entry = Arc::new(Entry::new(answer(), window, 0, 0));
            assert!(state.insert_known(&digest, entry, 0));
            state.known.run_pending_tasks();
            let below = i + 1 < 14;
            assert_eq!(state.front_allowed(), below, "with {} entries", i + 1);
            // A fresh answer found in moka is kept in this thread's front only below the bound.
            let found = state.cached(&digest, now).expect("a fresh entry");
            assert_eq!(found.outcome, crate::Outcome::Fresh);
            assert_eq!(in_front(&digest), below, "with {} entries", i + 1);
        }
    }

    #[test]
    fn an_entry_the_cache_lets_go_is_retired() {
        let state = State::new(
            Arc::new(DeferredStore::new(1)),
            CacheConfig::default(),
            None,
        );
        let now = Instant::now();
        let window = Window {
            fresh_until: now + Duration::from_secs(60),
            stale_until: now + Duration::from_secs(120),
        };
        let first = Arc::new(Entry::new(answer(), window, 0, 0));
        state.insert_known(&[1; 32], first.clone(), 0);
        assert!(!first.retired());
        let second = Arc::new(Entry::new(answer(), window, 0, 0));
        state.insert_known(&[1; 32], second.clone(), 0);
        assert!(first.retired(), "replaced");
        assert!(!second.retired());
        state.invalidate(&[1; 32]);
        assert!(second.retired(), "revoked");
        let third = Arc::new(Entry::new(answer(), window, 0, 0));
        state.insert_known(&[2; 32], third.clone(), 0);
        state.invalidate_if(|_| true);
        assert!(third.retired(), "revoked with its tenant");
        // A load that began before a revoke takes its answer out again.
        let late = Arc::new(Entry::new(answer(), window, 0, 0));
        assert!(!state.insert_known(&[3; 32], late.clone(), 0));
        assert!(late.retired(), "taken out after a revoke");
    }
}
