//! `[cache]`: the key lookup cache in front of the store, as the directory receives it.
//!
//! Every number here is a bound on something IL-0136 let grow: how long an answer may be reused
//! (`ttl`, `stale_for`), how many answers are kept (`max_entries`, `max_negative_entries`) and,
//! above all, how many queries may reach the store at once (`max_concurrent_loads`) and how long
//! one may take (`load_timeout`). One struct, with its defaults in one place: the check of the
//! `[cache]` table falls back on [`CacheConfig::default`], and `spillway-directory` takes this
//! struct as it is.

use std::path::PathBuf;
use std::time::Duration;

/// Settings of the key lookup cache. Build it with struct update syntax over
/// [`CacheConfig::default`] to keep the defaults of the fields you do not set.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    /// How long an answer is fresh; each entry gets `ttl * (1 - ttl_jitter * u)`, `u` uniform
    /// in `[0, 1)`, so entries loaded together do not fall due together. Default 30 s.
    pub ttl: Duration,
    /// In `[0, 1)` (the file allows at most 0.9). Default 0.2.
    pub ttl_jitter: f64,
    /// After `ttl`, how long an answer may still be served: at once while it is refreshed in
    /// the background, and in place of an answer when the store fails or is slow. Default 10 min.
    pub stale_for: Duration,
    /// How long "no such key" is remembered. Default 30 s.
    pub negative_ttl: Duration,
    /// Known keys kept in process. Default 100 000.
    pub max_entries: u64,
    /// Unknown keys kept, in a cache of their own so random keys cannot evict real ones.
    /// Default 10 000.
    pub max_negative_entries: u64,
    /// Store queries in flight at most, across all keys. Default 8.
    pub max_concurrent_loads: usize,
    /// How long a waiting lookup may wait for one of those slots before it serves what it has
    /// (a stale entry) or fails. Default 100 ms.
    pub load_wait: Duration,
    /// A store query slower than this counts as an error. Default 2 s.
    pub load_timeout: Duration,
    /// `redis://...`: an optional layer shared by gateway instances, between this cache and the
    /// store. Default none.
    pub redis: Option<String>,
    /// The environment variable holding `redis` (for a URL with a password in it); `redis` is
    /// `None` until the environment is read at start. Default none.
    pub redis_env: Option<String>,
    /// Redis slower than this is skipped for the lookup at hand. Default 50 ms.
    pub redis_timeout: Duration,
    /// Where the cache is saved for warm restarts. Default none.
    pub snapshot: Option<PathBuf>,
    /// Keys read per page when the cache is warmed from the store at start. Default 1000.
    pub warm_batch: u32,
    /// At most this many keys are warmed from the store. Default 100 000.
    pub warm_max_keys: u64,
    /// After a flush, each cached answer is re-read at a time spread uniformly over this
    /// window, so a flush at peak costs the store about one TTL's worth of refreshes rather
    /// than every key at once. Zero re-reads every answer at its next lookup. Default the TTL.
    pub flush_spread: Duration,
    /// Turns every protection off, to show what they prevent (`spillway replay cache-flush
    /// --naive`): no single flight, no cap on store queries, no stale answers (the directory's
    /// naive lookup), and, set by the config check, no Redis and a flush that re-reads every
    /// answer at its next lookup (`redis` none, `flush_spread` zero). Never for production.
    /// Default off.
    pub naive: bool,
}

impl Default for CacheConfig {
    fn default() -> Self {
        let ttl = Duration::from_secs(30);
        Self {
            ttl,
            ttl_jitter: 0.2,
            stale_for: Duration::from_secs(600),
            negative_ttl: Duration::from_secs(30),
            max_entries: 100_000,
            max_negative_entries: 10_000,
            max_concurrent_loads: 8,
            load_wait: Duration::from_millis(100),
            load_timeout: Duration::from_secs(2),
            redis: None,
            redis_env: None,
            redis_timeout: Duration::from_millis(50),
            snapshot: None,
            warm_batch: 1000,
            warm_max_keys: 100_000,
            flush_spread: ttl,
            naive: false,
        }
    }
}
