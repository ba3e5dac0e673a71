//! IL-0136: a cache flushed at peak, against a slow or failing store. The store's load must
//! stay at one query per key and at most `max_concurrent_loads` at once.

use std::sync::Arc;
use std::time::Duration;

use spillway_directory::{Directory, DirectoryConfig, DirectoryError, Outcome};

use crate::support::{digest, directory, eventually_async, ms, FakeStore};

fn capped() -> DirectoryConfig {
    DirectoryConfig {
        max_concurrent_loads: 8,
        load_wait: ms(100),
        ..DirectoryConfig::default()
    }
}

/// 1,000 concurrent lookups, ten of each of 100 keys, interleaved.
async fn stampede(dir: &Arc<Directory>) -> Vec<Result<Option<Outcome>, DirectoryError>> {
    let lookups: Vec<_> = (0..1_000u64)
        .map(|i| {
            let dir = dir.clone();
            tokio::spawn(async move {
                let found = dir.lookup(&digest(i % 100)).await?;
                Ok(found.found.map(|_| found.outcome))
            })
        })
        .collect();
    let mut results = Vec::new();
    for l in lookups {
        results.push(l.await.unwrap());
    }
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_at_peak_costs_at_most_one_query_per_key_and_eight_at_once() {
    let store = FakeStore::with_keys(100, "acme");
    let dir = directory(&store, capped()).await;
    for i in 0..100 {
        dir.lookup(&digest(i)).await.unwrap();
    }
    assert_eq!(store.lookups(), 100);
    store.set_latency(ms(20));
    dir.invalidate_all();
    let results = stampede(&dir).await;
    // Answers from before the flush stand in while the store is busy: no lookup fails.
    for r in &results {
        let outcome = r.clone().unwrap().expect("every key is known");
        assert!(
            matches!(outcome, Outcome::Miss | Outcome::Stale),
            "{outcome:?}"
        );
    }
    // Every key gets re-read: at once, or by a background refresh of its stale answer.
    eventually_async(Duration::from_secs(10), "every key fresh again", || async {
        let mut fresh = 0;
        for i in 0..100 {
            if dir.lookup(&digest(i)).await.unwrap().outcome == Outcome::Fresh {
                fresh += 1;
            }
        }
        fresh == 100
    })
    .await;
    assert_eq!(
        store.lookups() - 100,
        100,
        "one query per key after the flush"
    );
    assert!(store.high_water() <= 8, "high water {}", store.high_water());
    assert!(dir.stats().loads_in_flight == 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_stampede_reaches_the_store_at_most_once_per_key_and_eight_at_once() {
    let store = FakeStore::with_keys(100, "acme");
    store.set_latency(ms(20));
    let dir = directory(&store, capped()).await;
    let results = stampede(&dir).await;
    // With nothing to fall back on, lookups that wait longer than load_wait for a slot fail
    // (fast, as Unavailable) rather than queue behind the store.
    let ok = results.iter().filter(|r| r.is_ok()).count();
    for r in &results {
        if let Err(e) = r {
            assert!(matches!(e, DirectoryError::Unavailable(_)), "{e}");
        }
    }
    assert!(ok >= 80, "only {ok} lookups were answered");
    assert!(store.lookups() <= 100, "{} queries", store.lookups());
    assert!(store.high_water() <= 8, "high water {}", store.high_water());
    assert!(store.high_water() >= 2, "the loads did run concurrently");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_flush_with_the_store_down_old_answers_stand_in() {
    let store = FakeStore::with_keys(10, "acme");
    let dir = directory(&store, capped()).await;
    for i in 0..10 {
        dir.lookup(&digest(i)).await.unwrap();
    }
    store.set_failing(true);
    dir.invalidate_all();
    for _ in 0..5 {
        for i in 0..10 {
            let found = dir.lookup(&digest(i)).await.unwrap();
            assert_eq!(found.outcome, Outcome::Stale);
            assert!(found.found.is_some());
        }
    }
    // One failed re-read per key; after that the old answers are served at once and their
    // refreshes back off.
    assert_eq!(store.lookups(), 20, "{} queries", store.lookups());
    assert_eq!(dir.stats().flushes, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_forgets_unknown_keys() {
    let store = FakeStore::new();
    let dir = directory(&store, capped()).await;
    dir.lookup(&digest(1)).await.unwrap();
    assert_eq!(
        dir.lookup(&digest(1)).await.unwrap().outcome,
        Outcome::Negative
    );
    dir.invalidate_all();
    assert_eq!(dir.lookup(&digest(1)).await.unwrap().outcome, Outcome::Miss);
    assert_eq!(store.lookups(), 2);
}
