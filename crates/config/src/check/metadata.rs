//! The `[store]`, `[cache]` and `[admin]` sections: where tenants and keys live, how lookups are
//! cached in front of them, and how the admin API is protected.

use std::path::PathBuf;
use std::time::Duration;

use super::Problems;
use crate::raw::{RawAdmin, RawCache, RawStore};
use crate::{AdminConfig, CacheConfig, StoreConfig};

/// The store when the config names none: an SQLite file created on first run.
pub const DEFAULT_STORE_URL: &str = "sqlite://spillway-data/spillway.db";

fn nonzero(d: Option<Duration>, default: Duration, at: &str, p: &mut Problems) -> Duration {
    let d = d.unwrap_or(default);
    if d.is_zero() {
        p.add(at, "must be greater than zero");
        return default;
    }
    d
}

pub(super) fn check_store(raw: RawStore, p: &mut Problems) -> StoreConfig {
    let url = raw.url.unwrap_or_else(|| DEFAULT_STORE_URL.to_owned());
    let known = ["sqlite:", "postgres://", "postgresql://"];
    if !known.iter().any(|k| url.starts_with(k)) {
        p.add(
            "store.url",
            "must start with sqlite:, postgres:// or postgresql://",
        );
    }
    let max_connections = raw.max_connections.unwrap_or(16);
    if !(1..=1000).contains(&max_connections) {
        p.add(
            "store.max_connections",
            format!("must be between 1 and 1000, got {max_connections}"),
        );
    }
    StoreConfig {
        url,
        max_connections: max_connections.clamp(1, 1000),
        acquire_timeout: nonzero(
            raw.acquire_timeout,
            Duration::from_secs(2),
            "store.acquire_timeout",
            p,
        ),
    }
}

pub(super) fn check_cache(raw: RawCache, p: &mut Problems) -> CacheConfig {
    let s = Duration::from_secs;
    let jitter = raw.ttl_jitter.unwrap_or(0.2);
    if !(0.0..=0.9).contains(&jitter) {
        p.add(
            "cache.ttl_jitter",
            format!("must be between 0 and 0.9, got {jitter}"),
        );
    }
    let count = |v: Option<u64>, default: u64, at: &str, p: &mut Problems| {
        let v = v.unwrap_or(default);
        if v == 0 || v > 100_000_000 {
            p.add(at, format!("must be between 1 and 100000000, got {v}"));
            return default;
        }
        v
    };
    if let Some(url) = &raw.redis {
        if !url.starts_with("redis://") && !url.starts_with("rediss://") {
            p.add("cache.redis", "must start with redis:// or rediss://");
        }
    }
    let ttl = nonzero(raw.ttl, s(30), "cache.ttl", p);
    CacheConfig {
        ttl,
        ttl_jitter: jitter.clamp(0.0, 0.9),
        stale_for: raw.stale_for.unwrap_or(s(600)),
        negative_ttl: nonzero(raw.negative_ttl, s(30), "cache.negative_ttl", p),
        max_entries: count(raw.max_entries, 100_000, "cache.max_entries", p),
        max_negative_entries: count(
            raw.max_negative_entries,
            10_000,
            "cache.max_negative_entries",
            p,
        ),
        max_concurrent_loads: count(
            raw.max_concurrent_loads.map(|v| v as u64),
            8,
            "cache.max_concurrent_loads",
            p,
        )
        .min(1024) as usize,
        load_wait: nonzero(
            raw.load_wait,
            Duration::from_millis(100),
            "cache.load_wait",
            p,
        ),
        load_timeout: nonzero(raw.load_timeout, s(2), "cache.load_timeout", p),
        redis: raw.redis,
        redis_timeout: nonzero(
            raw.redis_timeout,
            Duration::from_millis(50),
            "cache.redis_timeout",
            p,
        ),
        snapshot: raw.snapshot.map(PathBuf::from),
        warm_batch: count(raw.warm_batch.map(u64::from), 1000, "cache.warm_batch", p).min(10_000)
            as u32,
        warm_max_keys: raw.warm_max_keys.unwrap_or(100_000),
        flush_spread: raw.flush_spread.unwrap_or(ttl),
        naive: raw.naive.unwrap_or(false),
    }
}

pub(super) fn check_admin(raw: RawAdmin, p: &mut Problems) -> AdminConfig {
    let token_env = raw
        .token_env
        .unwrap_or_else(|| "SPILLWAY_ADMIN_TOKEN".to_owned());
    super::check_env_name(&token_env, "admin.token_env", p);
    AdminConfig { token_env }
}
