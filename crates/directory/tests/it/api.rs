//! The shapes other crates rely on: the config as a full struct literal (as the proxy builds
//! it), `Unavailable(String)`, `invalidate_if` with an owning closure, and serialisable stats.

use std::time::Duration;

use spillway_config::CacheConfig;
use spillway_directory::{DirectoryError, DirectoryStats, Outcome};

use crate::support::{digest, directory, key_match, FakeStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_interface_the_proxy_uses_holds() {
    let config = CacheConfig {
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
        redis_env: None,
        redis_timeout: Duration::from_millis(50),
        snapshot: None,
        warm_batch: 1000,
        warm_max_keys: 100_000,
        flush_spread: Duration::from_secs(30),
        naive: false,
    };
    assert_eq!(config, CacheConfig::default());
    let store = FakeStore::with_keys(2, "acme");
    let dir = directory(&store, config).await;
    dir.lookup(&digest(0)).await.unwrap();
    let id = key_match(0, "acme").key.id;
    dir.invalidate_if(move |m| m.key.id == id);
    assert_eq!(dir.lookup(&digest(0)).await.unwrap().outcome, Outcome::Miss);

    let stats: DirectoryStats = dir.stats();
    let json = serde_json::to_value(stats).unwrap();
    assert_eq!(json["entries"], 1);
    assert_eq!(json["store_queries"], 2);

    let why = match DirectoryError::Unavailable("store down".into()) {
        DirectoryError::Unavailable(why) => why,
        other => other.to_string(),
    };
    assert_eq!(why, "store down");
}

#[test]
fn outcome_labels_are_the_metric_values() {
    let labels: Vec<_> = [
        Outcome::Fresh,
        Outcome::Stale,
        Outcome::Miss,
        Outcome::Negative,
        Outcome::RedisHit,
        Outcome::StoreError,
    ]
    .into_iter()
    .map(Outcome::as_str)
    .collect();
    assert_eq!(
        labels,
        [
            "fresh_hit",
            "stale_hit",
            "miss",
            "negative_hit",
            "redis_hit",
            "store_error"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_is_refused_at_construction() {
    let store = FakeStore::new();
    let store: std::sync::Arc<dyn spillway_store::Store> = store;
    let config = CacheConfig {
        max_concurrent_loads: 0,
        ..CacheConfig::default()
    };
    let err = spillway_directory::Directory::new(store, config)
        .await
        .err()
        .unwrap();
    assert!(matches!(err, DirectoryError::InvalidConfig(_)), "{err}");
    assert!(!err.is_retryable());
}
