//! What the in-process caches hold, and how long moka keeps it.
//!
//! A known key's entry is the store's raw answer (`KeyMatch`, whatever its state: revoked,
//! expired and disabled are judged by the caller at each use, so a cached answer is re-judged as
//! time passes), its [`Window`], the wall-clock time it was fetched (what the snapshot and the
//! shared Redis layer carry, so an answer never looks younger than it is), the flush epoch it
//! was loaded in, and the back-off of its failed refreshes. moka drops an entry once its stale
//! window is over; until then the freshness rules decide what a lookup does with it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spillway_store::{KeyDigest, KeyMatch};
use tokio::time::Instant;

use crate::freshness::{self, State, Window};

/// A known key.
#[derive(Debug)]
pub(crate) struct Entry {
    pub found: Arc<KeyMatch>,
    pub window: Window,
    /// Unix milliseconds at which the store query that produced it started.
    pub fetched_at_ms: u64,
    /// The flush epoch the query started in; after a flush, an answer of an older epoch is
    /// re-read once this share of `flush_spread` has passed.
    pub epoch: u64,
    flush_share: f64,
    refresh: Mutex<RefreshFailures>,
    /// Set once the cache has let it go (revoked, replaced, evicted, expired): the per-thread
    /// fronts (`front.rs`) stop answering with it.
    retired: AtomicBool,
}

#[derive(Debug, Default)]
struct RefreshFailures {
    in_a_row: u32,
    not_before: Option<Instant>,
}

impl Entry {
    pub fn new(found: Arc<KeyMatch>, window: Window, fetched_at_ms: u64, epoch: u64) -> Self {
        Self {
            found,
            window,
            fetched_at_ms,
            epoch,
            flush_share: rand::random::<f64>(),
            refresh: Mutex::new(RefreshFailures::default()),
            retired: AtomicBool::new(false),
        }
    }

    /// The cache has let it go.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
    }

    pub fn retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }

    /// What a lookup does with it at `now`; `flush` is the current epoch and, when it moved
    /// past this entry's, the last flush's time and spread.
    pub fn state(&self, now: Instant, epoch: u64, flush: Option<(Instant, Duration)>) -> State {
        let current = self.epoch == epoch
            || flush.is_some_and(|(at, spread)| {
                now < freshness::flush_due(at, spread, self.flush_share)
            });
        freshness::judge(self.window, now, current)
    }

    /// Whether it may still stand in for an answer the store could not give.
    pub fn usable(&self, now: Instant) -> bool {
        now < self.window.stale_until
    }

    /// Whether a background refresh may start now (none failed recently).
    pub fn refresh_due(&self, now: Instant) -> bool {
        let failures = self.refresh.lock().unwrap_or_else(|e| e.into_inner());
        failures.not_before.is_none_or(|at| now >= at)
    }

    /// A background refresh failed: the entry is kept, and the next refresh waits.
    pub fn refresh_failed(&self, now: Instant) {
        let mut failures = self.refresh.lock().unwrap_or_else(|e| e.into_inner());
        failures.in_a_row = failures.in_a_row.saturating_add(1);
        failures.not_before = Some(now + freshness::refresh_retry_delay(failures.in_a_row));
    }
}

/// An unknown key: believed unknown until `until`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unknown {
    pub until: Instant,
}

/// moka drops a known entry when its stale window ends, an unknown one when it ends. moka
/// hands over the insert's time by its own clock; the time left is counted by the directory's
/// clock instead (tokio's, which tests pause and advance), the one its windows are in.
pub(crate) struct UntilUnusable;

fn left_until(until: Instant) -> Option<Duration> {
    Some(until.saturating_duration_since(Instant::now()))
}

impl moka::Expiry<KeyDigest, Arc<Entry>> for UntilUnusable {
    fn expire_after_create(
        &self,
        _: &KeyDigest,
        entry: &Arc<Entry>,
        _: std::time::Instant,
    ) -> Option<Duration> {
        left_until(entry.window.stale_until)
    }

    fn expire_after_update(
        &self,
        _: &KeyDigest,
        entry: &Arc<Entry>,
        _: std::time::Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        left_until(entry.window.stale_until)
    }
}

impl moka::Expiry<KeyDigest, Unknown> for UntilUnusable {
    fn expire_after_create(
        &self,
        _: &KeyDigest,
        u: &Unknown,
        _: std::time::Instant,
    ) -> Option<Duration> {
        left_until(u.until)
    }

    fn expire_after_update(
        &self,
        _: &KeyDigest,
        u: &Unknown,
        _: std::time::Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        left_until(u.until)
    }
}
