//! The connection pool, with the two figures that show exhaustion: who is waiting for a
//! connection now, and how many gave up.
//!
//! In IL-0136 a cache flush at peak sent ~20x the usual load to a metadata database; the
//! connections ran out and no metric showed it, so hours went to scaling things that did not
//! matter. The pool's size and idle count alone do not tell "busy" from "starved": a full pool is
//! normal. Tasks queued for a connection and acquisitions that timed out do tell, so every query
//! of this crate acquires its connection here and nowhere else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

use crate::{PoolStats, StoreError};

/// Histogram of the time a query waited for a pooled connection, in seconds.
pub const POOL_ACQUIRE_SECONDS: &str = "spillway_store_pool_acquire_seconds";

pub(crate) struct CountedPool<DB: Database> {
    pool: Pool<DB>,
    waiters: AtomicU64,
    acquire_timeouts: AtomicU64,
}

impl<DB: Database> CountedPool<DB> {
    pub fn new(pool: Pool<DB>) -> CountedPool<DB> {
        CountedPool {
            pool,
            waiters: AtomicU64::new(0),
            acquire_timeouts: AtomicU64::new(0),
        }
    }

    /// A connection, or `Unavailable` once the pool's acquire timeout has passed. `op` names the
    /// store method, for the log line.
    // sqlx times the pool's acquire timeout on the system clock: so is the wait recorded.
    #[allow(clippy::disallowed_methods)]
    pub async fn acquire(&self, op: &'static str) -> Result<PoolConnection<DB>, StoreError> {
        let started = Instant::now();
        let acquired = {
            // Counted down on drop, so a caller that gives up (a request timing out, a client
            // going away) while queued does not leave a phantom waiter behind.
            let _waiting = Waiting::enter(&self.waiters);
            self.pool.acquire().await
        };
        // Timeouts included (as their limit): the tail of this histogram is what exhaustion
        // looks like before the timeouts start.
        metrics::histogram!(POOL_ACQUIRE_SECONDS).record(started.elapsed().as_secs_f64());
        acquired.map_err(|err| self.acquire_error(err, op))
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            max_size: self.pool.options().get_max_connections(),
            size: self.pool.size(),
            idle: u32::try_from(self.pool.num_idle()).unwrap_or(u32::MAX),
            waiters: self.waiters.load(Ordering::Relaxed),
            acquire_timeouts: self.acquire_timeouts.load(Ordering::Relaxed),
        }
    }

    fn acquire_error(&self, err: sqlx::Error, op: &'static str) -> StoreError {
        if matches!(err, sqlx::Error::PoolTimedOut) {
            let total = self.acquire_timeouts.fetch_add(1, Ordering::Relaxed) + 1;
            // Under exhaustion every query times out; the counter carries the rate, and the log
            // gets the first few and then a line per doubling, so it stays readable.
            if total.is_power_of_two() {
                let stats = self.stats();
                tracing::warn!(
                    op,
                    acquire_timeouts = total,
                    waiters = stats.waiters,
                    max_size = stats.max_size,
                    "store pool exhausted: no connection within the acquire timeout"
                );
            }
            return StoreError::Unavailable(
                "no database connection free within the acquire timeout".to_owned(),
            );
        }
        crate::db_error::read(err, op)
    }
}

/// One task in [`CountedPool::acquire`], from entry until it has a connection or gives up.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn enter(waiters: &'a AtomicU64) -> Waiting<'a> {
        waiters.fetch_add(1, Ordering::Relaxed);
        Waiting(waiters)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_counts_down_when_dropped() {
        let waiters = AtomicU64::new(0);
        let first = Waiting::enter(&waiters);
        let second = Waiting::enter(&waiters);
        assert_eq!(waiters.load(Ordering::Relaxed), 2);
        drop(first);
        drop(second);
        assert_eq!(waiters.load(Ordering::Relaxed), 0);
    }
}
