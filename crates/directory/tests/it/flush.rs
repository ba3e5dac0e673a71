//! IL-0136: a cache flushed at peak, against a slow or failing store. The store's load must
//! stay at one query per key and at most `max_concurrent_loads` at once.

use std::sync::Arc;
use std::time::Duration;

use spillway_config::CacheConfig;
use spillway_directory::{Directory, DirectoryError, Outcome};

use spillway_testkit::eventually;

use crate::support::{digest, directory, ms, FakeStore};

/// A flush that re-reads every answer at its next lookup: the hardest case for the store.
fn capped() -> CacheConfig {
    CacheConfig {
        max_concurrent_loads: 8,
        load_wait: ms(100),
        flush_spread: Duration::ZERO,
        ..CacheConfig::default()
    }
}

/// A store of `n` keys and a directory that has looked each of them up once.
async fn warmed(n: u64) -> (Arc<FakeStore>, Arc<Directory>) {
    let store = FakeStore::with_keys(n, "acme");
    let dir = directory(&store, capped()).await;
    for i in 0..n {
        dir.lookup(&digest(i)).await.unwrap();
    }
    (store, dir)
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
    let (store, dir) = warmed(100).await;
    assert_eq!(store.lookups(), 100);
    store.set_latency(ms(20));
    dir.invalidate_all();
    let results = stampede(&dir).await;
    // Answers from before the flush stand in while the store is busy: no lookup fails. A
    // lookup that runs after its key was re-read gets the new answer (on a slow machine the
    // first re-reads end while the last lookups are still being spawned).
    for r in &results {
        let outcome = r.clone().unwrap().expect("every key is known");
        assert!(
            matches!(outcome, Outcome::Miss | Outcome::Stale | Outcome::Fresh),
            "{outcome:?}"
        );
    }
    let stood_in = results
        .iter()
        .filter(|r| matches!(r, Ok(Some(Outcome::Stale))))
        .count();
    assert!(stood_in > 0, "no stale answer stood in for the busy store");
    // Every key gets re-read: at once, or by a background refresh of its stale answer.
    eventually(Duration::from_secs(10), "every key fresh again", || async {
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
    let (store, dir) = warmed(10).await;
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

// The worst case of the one above: the flush comes at peak, with the store down and slow to
// say so. Every lookup is still answered by the old answer, and the store is asked at most
// once per key (a lookup that looked just before another's failed re-read landed takes the
// answer that one left, rather than asking again), never more than eight at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_at_peak_with_the_store_down_costs_at_most_one_failed_query_per_key() {
    let (store, dir) = warmed(100).await;
    store.set_latency(ms(20));
    store.set_failing(true);
    dir.invalidate_all();
    let results = stampede(&dir).await;
    for r in &results {
        let outcome = r.clone().unwrap().expect("every key is known");
        assert_eq!(outcome, Outcome::Stale);
    }
    let failed = store.lookups() - 100;
    assert!(failed <= 100, "{failed} queries for 100 keys");
    assert!(store.high_water() <= 8, "high water {}", store.high_water());
    // The old answers stay in place with their re-reads backing off: a second round of
    // lookups is answered by them too, and costs at most one more query a key (a re-read
    // whose back-off ran out while a slow machine was still on the first round).
    let before = store.lookups();
    let again = stampede(&dir).await;
    assert!(again.iter().all(|r| matches!(r, Ok(Some(Outcome::Stale)))));
    let more = store.lookups() - before;
    assert!(more <= 100, "{more} more queries for 100 keys");
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

#[tokio::test(start_paused = true)]
async fn a_spread_flush_re_reads_each_key_once_over_the_spread_not_at_once() {
    let store = FakeStore::with_keys(100, "acme");
    let spread = ms(1_500);
    let dir = directory(
        &store,
        CacheConfig {
            flush_spread: spread,
            ..capped()
        },
    )
    .await;
    for i in 0..100 {
        dir.lookup(&digest(i)).await.unwrap();
    }
    dir.invalidate_all();
    let flushed = tokio::time::Instant::now();
    for i in 0..100 {
        dir.lookup(&digest(i)).await.unwrap();
    }
    // Only the keys whose share of the spread has passed were re-read: a few, not all 100.
    let early = store.lookups() - 100;
    let share = flushed.elapsed().as_secs_f64() / spread.as_secs_f64();
    assert!(
        (early as f64) <= 100.0 * share + 15.0,
        "{early} re-reads after {:.0}% of the spread",
        share * 100.0
    );
    // Once the spread has passed, every key has been re-read exactly once.
    eventually(Duration::from_secs(10), "all keys re-read", || async {
        for i in 0..100 {
            dir.lookup(&digest(i)).await.unwrap();
        }
        store.lookups() - 100 == 100 && flushed.elapsed() > spread
    })
    .await;
    for i in 0..100 {
        assert_eq!(
            dir.lookup(&digest(i)).await.unwrap().outcome,
            Outcome::Fresh
        );
    }
    assert_eq!(store.lookups() - 100, 100, "one re-read per key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naive_mode_has_no_single_flight_and_no_stale_answers() {
    let store = FakeStore::with_keys(10, "acme");
    let naive = CacheConfig {
        naive: true,
        ..capped()
    };
    let dir = directory(&store, naive).await;
    for i in 0..10 {
        dir.lookup(&digest(i)).await.unwrap();
    }
    // Every naive lookup goes through `lookup`: nothing is answered on the side.
    assert!(dir
        .cached(&digest(0), tokio::time::Instant::now())
        .is_none());
    store.set_latency(ms(20));
    dir.invalidate_all();
    let results = stampede(&dir).await;
    assert!(results.iter().all(|r| r.is_ok()));
    // Ten concurrent lookups of a key after the flush are (up to) ten queries, uncapped.
    assert!(store.lookups() - 10 > 100, "{} queries", store.lookups());
    assert!(store.high_water() > 8, "high water {}", store.high_water());
    // With the store down, an answer from before the flush does not stand in.
    store.set_failing(true);
    dir.invalidate_all();
    assert!(dir.lookup(&digest(0)).await.is_err());
}
