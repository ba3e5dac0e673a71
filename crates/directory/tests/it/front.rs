//! The per-thread front of the key cache answers only what the cache would: a key revoked,
//! replaced or flushed is not answered from any thread's front.

use std::sync::{Arc, Barrier};

use spillway_config::CacheConfig;
use spillway_directory::{Directory, Outcome};

use crate::support::{digest, directory, key_match, FakeStore};

/// The tenant `dir.cached` names for key 0 on this thread, when it answers fresh.
fn fresh_tenant(dir: &Directory) -> Option<String> {
    let looked = dir.cached(&digest(0), tokio::time::Instant::now())?;
    assert_eq!(looked.outcome, Outcome::Fresh);
    Some(looked.found?.tenant.spec.name.clone())
}

/// Asks for key 0 until this thread's front holds it (the first answer comes from the cache and
/// puts it there, the next from the front).
fn held_in_front(dir: &Directory) {
    for _ in 0..3 {
        assert_eq!(fresh_tenant(dir).as_deref(), Some("acme"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_is_not_answered_from_any_threads_front() {
    let store = FakeStore::with_keys(1, "acme");
    let dir = directory(&store, CacheConfig::default()).await;
    dir.lookup(&digest(0)).await.unwrap();
    let threads = 4;
    let held = Arc::new(Barrier::new(threads + 1));
    let revoked = Arc::new(Barrier::new(threads + 1));
    let askers: Vec<_> = (0..threads)
        .map(|_| {
            let (dir, held, revoked) = (dir.clone(), held.clone(), revoked.clone());
            std::thread::spawn(move || {
                held_in_front(&dir);
                held.wait();
                revoked.wait();
                fresh_tenant(&dir)
            })
        })
        .collect();
    held.wait();
    store.add(digest(0), key_match(0, "moved"));
    dir.invalidate(&digest(0));
    revoked.wait();
    for asker in askers {
        assert_eq!(
            asker.join().unwrap(),
            None,
            "a revoked key is the store's to answer"
        );
    }
    assert_eq!(
        dir.lookup(&digest(0))
            .await
            .unwrap()
            .found
            .unwrap()
            .tenant
            .spec
            .name,
        "moved"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_replaced_in_the_cache_replaces_the_one_in_a_front() {
    let store = FakeStore::with_keys(1, "acme");
    let dir = directory(&store, CacheConfig::default()).await;
    dir.lookup(&digest(0)).await.unwrap();
    held_in_front(&dir);
    // A warm-up puts the store's answers over the cache's, fresh ones included.
    store.add(digest(0), key_match(0, "renamed"));
    assert_eq!(dir.warm_from_store(100, 1_000).await.unwrap(), 1);
    assert_eq!(fresh_tenant(&dir).as_deref(), Some("renamed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_flush_a_front_asks_the_store_as_the_cache_does() {
    let store = FakeStore::with_keys(1, "acme");
    let config = CacheConfig {
        flush_spread: std::time::Duration::ZERO,
        ..CacheConfig::default()
    };
    let dir = directory(&store, config).await;
    dir.lookup(&digest(0)).await.unwrap();
    held_in_front(&dir);
    dir.invalidate_all();
    assert!(
        dir.cached(&digest(0), tokio::time::Instant::now())
            .is_none(),
        "a flushed answer is re-read"
    );
    assert_eq!(dir.lookup(&digest(0)).await.unwrap().outcome, Outcome::Miss);
    assert_eq!(store.lookups(), 2);
}
