//! Warming the cache from the store in bounded pages, at a pace the store sets.
//!
//! Without a snapshot, a new instance would learn its keys one miss at a time, at peak, from
//! its first requests. A warm-up reads them ahead, but reading 100 000 keys at once is itself a
//! load spike, so it reads one page at a time through one of the same load slots lookups use
//! (it never takes more than one), and after each page it pauses at least as long as that page
//! took: the warm-up uses at most about half of one database connection, less when the store
//! is slow, and requests keep their slots.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use crate::entry::Entry;
use crate::freshness;
use crate::state::State;
use crate::{metrics, unix_ms, DirectoryError};

/// The shortest pause between two pages.
pub const MIN_PAUSE: Duration = Duration::from_millis(10);

/// How long to pause after a page that took `took`.
pub fn pause_after(took: Duration) -> Duration {
    took.max(MIN_PAUSE)
}

pub(crate) async fn from_store(
    state: &State,
    batch: u32,
    max_keys: u64,
) -> Result<u64, DirectoryError> {
    let batch = batch.max(1);
    let c = &state.config;
    let mut after = None;
    let mut loaded = 0u64;
    while loaded < max_keys {
        let limit = u64::from(batch).min(max_keys - loaded) as u32;
        let permit = state
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| DirectoryError::Unavailable("load slots closed".to_owned()))?;
        let epoch = state.epoch.load(Ordering::SeqCst);
        let seq = state.invalidations.load(Ordering::SeqCst);
        let asked_at_ms = unix_ms();
        let started = Instant::now();
        let page = tokio::time::timeout(c.load_timeout, state.store.page_keys(after, limit)).await;
        let took = started.elapsed();
        drop(permit);
        state.counts.store_queries.fetch_add(1, Ordering::Relaxed);
        let page = match page {
            Ok(Ok(page)) => page,
            Ok(Err(e)) => return Err(page_failed(state, took, loaded, format!("store: {e}"))),
            Err(_) => {
                let why = format!("store gave no page within {:?}", c.load_timeout);
                return Err(page_failed(state, took, loaded, why));
            }
        };
        metrics::store_query("ok", took);
        state.warm.store(true, Ordering::Release);
        let count = page.len() as u64;
        let now = Instant::now();
        for (digest, found) in page {
            after = Some(digest);
            let u = rand::random::<f64>();
            // Spread like a restored snapshot: keys warmed together must not fall due together.
            let Some(window) = freshness::restored_window(now, took, c.ttl, c.stale_for, u) else {
                continue;
            };
            let entry = Entry::new(Arc::new(found), window, asked_at_ms, epoch);
            state.insert_known(&digest, Arc::new(entry), seq);
        }
        loaded += count;
        if count < u64::from(limit) {
            break;
        }
        tokio::time::sleep(pause_after(took)).await;
    }
    info!(keys = loaded, "key cache warmed from the store");
    Ok(loaded)
}

fn page_failed(state: &State, took: Duration, loaded: u64, why: String) -> DirectoryError {
    metrics::store_query("error", took);
    state.store_failed(&why);
    DirectoryError::Unavailable(format!("warm-up stopped after {loaded} keys: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_follows_the_store_with_a_floor() {
        assert_eq!(pause_after(Duration::ZERO), MIN_PAUSE);
        assert_eq!(
            pause_after(Duration::from_millis(250)),
            Duration::from_millis(250)
        );
    }
}
