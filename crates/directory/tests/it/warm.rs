//! Warm-up from the store in bounded pages.

use spillway_config::CacheConfig;
use spillway_directory::Outcome;

use crate::support::{digest, directory, FakeStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_from_store_loads_every_key_in_batches() {
    let store = FakeStore::with_keys(250, "acme");
    let dir = directory(&store, CacheConfig::default()).await;
    assert_eq!(dir.warm_from_store(100, 10_000).await.unwrap(), 250);
    assert_eq!(store.pages(), 3);
    assert!(store.high_water() <= 1, "one page at a time");
    assert!(dir.is_warm());
    // Warmed entries fall due at times spread over one TTL (so they are not refreshed in one
    // wave): a few may already be stale, and are served at once while one refresh runs.
    let mut stale = 0;
    for i in 0..250 {
        match dir.lookup(&digest(i)).await.unwrap().outcome {
            Outcome::Fresh => {}
            Outcome::Stale => stale += 1,
            other => panic!("key {i} was not served from the warm cache: {other:?}"),
        }
    }
    assert!(
        store.lookups() <= stale,
        "only stale entries were refreshed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_from_store_stops_at_max_keys() {
    let store = FakeStore::with_keys(250, "acme");
    let dir = directory(&store, CacheConfig::default()).await;
    assert_eq!(dir.warm_from_store(100, 150).await.unwrap(), 150);
    assert_eq!(store.pages(), 2);
    assert_eq!(dir.stats().entries, 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_stops_the_warm_up_with_an_error() {
    let store = FakeStore::with_keys(10, "acme");
    store.set_failing(true);
    let dir = directory(&store, CacheConfig::default()).await;
    assert!(dir.warm_from_store(100, 1_000).await.is_err());
    assert!(!dir.is_warm());
    assert_eq!(dir.stats().store_errors, 1);
}
