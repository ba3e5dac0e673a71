//! The directory's settings: what each knob bounds, its default, and the one check of them.
//!
//! Every number here is a bound on something IL-0136 let grow: how long an answer may be reused
//! (`ttl`, `stale_for`), how many answers are kept (`max_entries`, `max_negative_entries`) and,
//! above all, how many queries may reach the store at once (`max_concurrent_loads`) and how long
//! one may take (`load_timeout`). The config crate builds this struct from the `[cache]` table;
//! [`DirectoryConfig::check`] is applied once, by `Directory::new`.

use std::path::PathBuf;
use std::time::Duration;

use crate::DirectoryError;

/// Settings of the key lookup cache. Build it with struct update syntax over
/// [`DirectoryConfig::default`] to keep the defaults of the fields you do not set.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectoryConfig {
    /// How long an answer is fresh; each entry gets `ttl * (1 - ttl_jitter * u)`, `u` uniform
    /// in `[0, 1)`, so entries loaded together do not fall due together. Default 30 s.
    pub ttl: Duration,
    /// In `[0, 1)`. Default 0.2.
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
    /// Redis slower than this is skipped for the lookup at hand. Default 50 ms.
    pub redis_timeout: Duration,
    /// Where the cache is saved for warm restarts. Default none.
    pub snapshot: Option<PathBuf>,
    /// After a flush, each cached answer is re-read at a time spread uniformly over this
    /// window, so a flush at peak costs the store about one TTL's worth of refreshes rather
    /// than every key at once. Zero re-reads every answer at its next lookup. Default 30 s.
    pub flush_spread: Duration,
    /// Turns every protection off, to show what they prevent (`spillway replay cache-flush
    /// --naive`): no single flight, no cap on store queries, no stale answers, no Redis, and a
    /// flush that re-reads every answer at its next lookup. Never for production. Default off.
    pub naive: bool,
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            ttl_jitter: 0.2,
            stale_for: Duration::from_secs(600),
            negative_ttl: Duration::from_secs(30),
            max_entries: 100_000,
            max_negative_entries: 10_000,
            max_concurrent_loads: 8,
            load_wait: Duration::from_millis(100),
            load_timeout: Duration::from_secs(2),
            redis: None,
            redis_timeout: Duration::from_millis(50),
            snapshot: None,
            flush_spread: Duration::from_secs(30),
            naive: false,
        }
    }
}

impl DirectoryConfig {
    /// Every problem at once, so a bad config is fixed in one go. The config crate validates
    /// the same table; this check keeps the directory safe when it is built another way.
    pub fn check(&self) -> Result<(), DirectoryError> {
        let mut problems = Vec::new();
        if self.ttl.is_zero() {
            problems.push("ttl must be more than zero".to_owned());
        }
        if !(self.ttl_jitter.is_finite() && (0.0..1.0).contains(&self.ttl_jitter)) {
            problems.push(format!(
                "ttl_jitter must be in [0, 1), not {}",
                self.ttl_jitter
            ));
        }
        if self.negative_ttl.is_zero() {
            problems.push("negative_ttl must be more than zero".to_owned());
        }
        if self.max_entries == 0 {
            problems.push("max_entries must be at least 1".to_owned());
        }
        if self.max_concurrent_loads == 0
            || self.max_concurrent_loads > tokio::sync::Semaphore::MAX_PERMITS
        {
            problems.push(format!(
                "max_concurrent_loads must be at least 1 (and sane), not {}",
                self.max_concurrent_loads
            ));
        }
        if self.load_timeout.is_zero() {
            problems.push("load_timeout must be more than zero".to_owned());
        }
        if self.redis_timeout.is_zero() {
            problems.push("redis_timeout must be more than zero".to_owned());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(DirectoryError::InvalidConfig(problems.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        DirectoryConfig::default().check().unwrap();
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let config = DirectoryConfig {
            ttl: Duration::ZERO,
            ttl_jitter: 1.0,
            max_concurrent_loads: 0,
            ..DirectoryConfig::default()
        };
        let DirectoryError::InvalidConfig(why) = config.check().unwrap_err() else {
            panic!("expected InvalidConfig");
        };
        assert!(why.contains("ttl must"), "{why}");
        assert!(why.contains("ttl_jitter"), "{why}");
        assert!(why.contains("max_concurrent_loads"), "{why}");
    }

    #[test]
    fn nan_jitter_is_rejected() {
        let config = DirectoryConfig {
            ttl_jitter: f64::NAN,
            ..DirectoryConfig::default()
        };
        assert!(config.check().is_err());
    }
}
