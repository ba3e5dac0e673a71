//! The `[store]`, `[cache]`, `[admin]` and `[reload]` sections: where tenants and keys live, how
//! lookups are cached in front of them, how the admin API is protected, and how the running
//! configuration is changed.

use std::path::PathBuf;
use std::time::Duration;

use super::Problems;
use crate::raw::{RawAdmin, RawCache, RawReload, RawStore};
use crate::{AdminConfig, CacheConfig, ReloadConfig, StoreConfig};

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

/// What a store URL may start with.
pub const STORE_URL_SCHEMES: [&str; 3] = ["sqlite:", "postgres://", "postgresql://"];
/// What a Redis URL may start with.
pub const REDIS_URL_SCHEMES: [&str; 2] = ["redis://", "rediss://"];

/// A URL given in the file or by an environment variable (`{key}_env`), never both.
fn url_or_env(url: &Option<String>, env: &Option<String>, at: &str, p: &mut Problems) {
    if url.is_some() && env.is_some() {
        p.add(at, format!("give {at} or {at}_env, not both"));
    }
    if let Some(var) = env {
        super::check_env_name(var, &format!("{at}_env"), p);
    }
}

pub(super) fn check_store(raw: RawStore, p: &mut Problems) -> StoreConfig {
    url_or_env(&raw.url, &raw.url_env, "store.url", p);
    let url = match (&raw.url, &raw.url_env) {
        (_, Some(_)) => String::new(),
        (Some(url), None) => url.clone(),
        (None, None) => DEFAULT_STORE_URL.to_owned(),
    };
    if raw.url_env.is_none() && !STORE_URL_SCHEMES.iter().any(|k| url.starts_with(k)) {
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
        url_env: raw.url_env,
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
    let d = CacheConfig::default();
    let jitter = raw.ttl_jitter.unwrap_or(d.ttl_jitter);
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
        if !REDIS_URL_SCHEMES.iter().any(|k| url.starts_with(k)) {
            p.add("cache.redis", "must start with redis:// or rediss://");
        }
    }
    url_or_env(&raw.redis, &raw.redis_env, "cache.redis", p);
    let ttl = nonzero(raw.ttl, d.ttl, "cache.ttl", p);
    let naive = raw.naive.unwrap_or(d.naive);
    let c = CacheConfig {
        ttl,
        ttl_jitter: jitter.clamp(0.0, 0.9),
        stale_for: raw.stale_for.unwrap_or(d.stale_for),
        negative_ttl: nonzero(raw.negative_ttl, d.negative_ttl, "cache.negative_ttl", p),
        max_entries: count(raw.max_entries, d.max_entries, "cache.max_entries", p),
        max_negative_entries: count(
            raw.max_negative_entries,
            d.max_negative_entries,
            "cache.max_negative_entries",
            p,
        ),
        max_concurrent_loads: count(
            raw.max_concurrent_loads.map(|v| v as u64),
            d.max_concurrent_loads as u64,
            "cache.max_concurrent_loads",
            p,
        )
        .min(1024) as usize,
        load_wait: nonzero(raw.load_wait, d.load_wait, "cache.load_wait", p),
        load_timeout: nonzero(raw.load_timeout, d.load_timeout, "cache.load_timeout", p),
        redis: raw.redis,
        redis_env: raw.redis_env,
        redis_timeout: nonzero(raw.redis_timeout, d.redis_timeout, "cache.redis_timeout", p),
        snapshot: raw.snapshot.map(PathBuf::from),
        warm_batch: count(
            raw.warm_batch.map(u64::from),
            u64::from(d.warm_batch),
            "cache.warm_batch",
            p,
        )
        .min(10_000) as u32,
        warm_max_keys: raw.warm_max_keys.unwrap_or(d.warm_max_keys),
        // The spread follows the TTL the file chose, not the default one.
        flush_spread: raw.flush_spread.unwrap_or(ttl),
        naive,
    };
    if naive {
        without_protections(c)
    } else {
        c
    }
}

/// `cache.naive`: the cache of IL-0136, as settings: a flush re-reads every answer at its next
/// lookup and there is no Redis layer. What no setting can say (no single flight, no load cap,
/// no stale answer) is the lookup the directory picks once, when it is built.
fn without_protections(c: CacheConfig) -> CacheConfig {
    CacheConfig {
        flush_spread: Duration::ZERO,
        redis: None,
        redis_env: None,
        ..c
    }
}

pub(super) fn check_admin(raw: RawAdmin, p: &mut Problems) -> AdminConfig {
    let token_env = raw
        .token_env
        .unwrap_or_else(|| "SPILLWAY_ADMIN_TOKEN".to_owned());
    super::check_env_name(&token_env, "admin.token_env", p);
    AdminConfig { token_env }
}

/// Between these, a watched file is looked at (100 ms to an hour).
const WATCH_INTERVAL: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(3600));
/// Between these, a configuration serves before it is last-known-good (1 s to a week).
const LAST_KNOWN_GOOD_AFTER: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(7 * 24 * 3600));

pub(super) fn check_reload(raw: RawReload, p: &mut Problems) -> ReloadConfig {
    let within = |d: Duration, (lo, hi): (Duration, Duration), at: &str, p: &mut Problems| {
        if d < lo || d > hi {
            p.add(
                at,
                format!(
                    "must be between {} and {}, got {}",
                    humantime::format_duration(lo),
                    humantime::format_duration(hi),
                    humantime::format_duration(d)
                ),
            );
        }
        d.clamp(lo, hi)
    };
    ReloadConfig {
        watch: raw.watch.unwrap_or(false),
        watch_interval: within(
            raw.watch_interval.unwrap_or(Duration::from_secs(5)),
            WATCH_INTERVAL,
            "reload.watch_interval",
            p,
        ),
        last_known_good_after: within(
            raw.last_known_good_after
                .unwrap_or(Duration::from_secs(600)),
            LAST_KNOWN_GOOD_AFTER,
            "reload.last_known_good_after",
            p,
        ),
    }
}
