//! Single flight, stale-while-revalidate, stale-if-error, negative caching, timeouts and
//! invalidation races.

use std::time::Duration;

use spillway_config::CacheConfig;
use spillway_directory::{DirectoryError, Outcome};
use tokio::time::Instant;

use spillway_testkit::eventually;

use crate::support::{digest, directory, key_match, ms, FakeStore};

fn short(ttl: Duration, stale_for: Duration) -> CacheConfig {
    CacheConfig {
        ttl,
        ttl_jitter: 0.0,
        stale_for,
        ..CacheConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_lookups_of_one_missing_key_make_one_store_query() {
    let store = FakeStore::with_keys(1, "acme");
    store.set_latency(ms(50));
    let dir = directory(&store, CacheConfig::default()).await;
    let lookups: Vec<_> = (0..100)
        .map(|_| {
            let dir = dir.clone();
            tokio::spawn(async move { dir.lookup(&digest(0)).await })
        })
        .collect();
    for l in lookups {
        let found = l.await.unwrap().unwrap();
        assert_eq!(found.outcome, Outcome::Miss);
        assert_eq!(found.found.unwrap().tenant.spec.name, "acme");
    }
    assert_eq!(store.lookups(), 1);
    assert_eq!(
        dir.lookup(&digest(0)).await.unwrap().outcome,
        Outcome::Fresh
    );
    assert_eq!(store.lookups(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stale_entry_is_served_at_once_and_refreshed_once_in_the_background() {
    let store = FakeStore::with_keys(1, "acme");
    // An answer's age counts from when it was asked for, so the TTL is longer than the
    // store's latency: the refreshed answer is fresh when it lands.
    let dir = directory(&store, short(ms(1_500), Duration::from_secs(60))).await;
    dir.lookup(&digest(0)).await.unwrap();
    assert_eq!(store.lookups(), 1);
    tokio::time::sleep(ms(1_600)).await; // let the TTL pass
    store.set_latency(ms(1_000));
    let started = Instant::now();
    let lookups: Vec<_> = (0..50)
        .map(|_| {
            let dir = dir.clone();
            tokio::spawn(async move { dir.lookup(&digest(0)).await })
        })
        .collect();
    for l in lookups {
        let found = l.await.unwrap().unwrap();
        assert_eq!(found.outcome, Outcome::Stale);
        assert!(found.found.is_some());
    }
    assert!(
        started.elapsed() < ms(700),
        "stale answers waited for the store: {:?}",
        started.elapsed()
    );
    eventually(Duration::from_secs(5), "the refresh to land", || async {
        store.lookups() == 2 && store.in_flight() == 0
    })
    .await;
    eventually(Duration::from_secs(1), "a fresh answer", || async {
        dir.lookup(&digest(0)).await.unwrap().outcome == Outcome::Fresh
    })
    .await;
    assert_eq!(store.lookups(), 2, "one refresh, not one per stale lookup");
}

#[tokio::test(start_paused = true)]
async fn a_stale_entry_is_served_while_the_store_fails() {
    let store = FakeStore::with_keys(1, "acme");
    let dir = directory(&store, short(ms(30), Duration::from_secs(60))).await;
    dir.lookup(&digest(0)).await.unwrap();
    tokio::time::sleep(ms(60)).await; // let the TTL pass
    store.set_failing(true);
    for _ in 0..20 {
        let found = dir.lookup(&digest(0)).await.unwrap();
        assert_eq!(found.outcome, Outcome::Stale);
        assert_eq!(found.found.unwrap().key.id, key_match(0, "acme").key.id);
    }
    eventually(Duration::from_secs(2), "the failed refresh", || async {
        dir.stats().store_errors >= 1
    })
    .await;
    // The request path asks `cached` first: with the store down it serves the stale entry too,
    // and its refreshes back off the same way.
    for _ in 0..20 {
        let found = dir
            .cached(&digest(0), Instant::now())
            .expect("the stale entry");
        assert_eq!(found.outcome, Outcome::Stale);
    }
    // Failed refreshes back off: forty stale answers did not make forty queries.
    assert!(store.lookups() <= 3, "{} queries", store.lookups());
    assert_eq!(
        dir.lookup(&digest(0)).await.unwrap().outcome,
        Outcome::Stale
    );
}

#[tokio::test(start_paused = true)]
async fn an_entry_past_its_stale_window_with_the_store_down_is_an_error() {
    let store = FakeStore::with_keys(1, "acme");
    let dir = directory(&store, short(ms(20), ms(20))).await;
    dir.lookup(&digest(0)).await.unwrap();
    tokio::time::sleep(ms(80)).await; // past ttl + stale_for
    store.set_failing(true);
    let err = dir.lookup(&digest(0)).await.unwrap_err();
    assert!(matches!(err, DirectoryError::Unavailable(_)), "{err}");
    assert!(err.is_retryable());
    store.set_failing(false);
    assert_eq!(dir.lookup(&digest(0)).await.unwrap().outcome, Outcome::Miss);
}

#[tokio::test(start_paused = true)]
async fn a_store_slower_than_load_timeout_counts_as_an_error() {
    let store = FakeStore::with_keys(1, "acme");
    store.set_latency(ms(1_000));
    let config = CacheConfig {
        load_timeout: ms(50),
        ..CacheConfig::default()
    };
    let dir = directory(&store, config).await;
    let started = Instant::now();
    assert!(dir.lookup(&digest(0)).await.is_err());
    assert!(started.elapsed() < ms(500), "{:?}", started.elapsed());
    assert_eq!(dir.stats().store_errors, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_key_is_remembered_and_asked_for_once() {
    let store = FakeStore::new();
    let dir = directory(&store, CacheConfig::default()).await;
    assert!(!dir.is_warm());
    let first = dir.lookup(&digest(7)).await.unwrap();
    assert_eq!(
        (first.found.is_none(), first.outcome),
        (true, Outcome::Miss)
    );
    assert!(
        dir.is_warm(),
        "a store answer, even 'unknown', makes the directory warm"
    );
    let second = dir.lookup(&digest(7)).await.unwrap();
    assert_eq!(
        (second.found.is_none(), second.outcome),
        (true, Outcome::Negative)
    );
    assert_eq!(store.lookups(), 1);
    // A key created since is found once it is invalidated (the admin API does that).
    store.add(digest(7), key_match(7, "acme"));
    dir.invalidate(&digest(7));
    assert!(dir.lookup(&digest(7)).await.unwrap().found.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_keys_cannot_evict_known_ones_and_the_negative_cache_stays_bounded() {
    let store = FakeStore::with_keys(20, "acme");
    let config = CacheConfig {
        max_entries: 1_000,
        max_negative_entries: 50,
        ..CacheConfig::default()
    };
    let dir = directory(&store, config).await;
    for i in 0..20 {
        dir.lookup(&digest(i)).await.unwrap();
    }
    for i in 0..500 {
        let unknown = dir.lookup(&digest(1_000_000 + i)).await.unwrap();
        assert!(unknown.found.is_none());
    }
    let stats = dir.stats();
    assert!(stats.negative_entries <= 50, "{stats:?}");
    assert_eq!(stats.entries, 20, "{stats:?}");
    let before = store.lookups();
    for i in 0..20 {
        assert_eq!(
            dir.lookup(&digest(i)).await.unwrap().outcome,
            Outcome::Fresh
        );
    }
    assert_eq!(store.lookups(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_during_a_load_does_not_put_the_old_answer_back() {
    let store = FakeStore::with_keys(1, "acme");
    store.set_latency(ms(200));
    let dir = directory(&store, CacheConfig::default()).await;
    let loading = {
        let dir = dir.clone();
        tokio::spawn(async move { dir.lookup(&digest(0)).await })
    };
    eventually(
        Duration::from_secs(1),
        "the load to reach the store",
        || async { store.in_flight() == 1 },
    )
    .await;
    dir.invalidate(&digest(0));
    // The lookup that asked before the revoke still gets its answer ...
    assert!(loading.await.unwrap().unwrap().found.is_some());
    // ... but the answer was not kept: the next lookup asks the store again.
    store.set_latency(Duration::ZERO);
    assert_eq!(dir.lookup(&digest(0)).await.unwrap().outcome, Outcome::Miss);
    assert_eq!(store.lookups(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_if_forgets_one_tenants_keys_only() {
    let store = FakeStore::new();
    for i in 0..10 {
        store.add(digest(i), key_match(i, if i < 5 { "a" } else { "b" }));
    }
    let dir = directory(&store, CacheConfig::default()).await;
    for i in 0..10 {
        dir.lookup(&digest(i)).await.unwrap();
    }
    dir.invalidate_if(|m| m.tenant.spec.name == "a");
    for i in 0..10 {
        let expected = if i < 5 { Outcome::Miss } else { Outcome::Fresh };
        assert_eq!(
            dir.lookup(&digest(i)).await.unwrap().outcome,
            expected,
            "key {i}"
        );
    }
    assert_eq!(store.lookups(), 15);
}

/// `cached` is `lookup` without the wait: the same answer for what the cache holds (fresh,
/// stale with its refresh started, unknown), nothing for what needs the store, never a query.
#[tokio::test(start_paused = true)]
async fn cached_answers_what_the_cache_holds_and_never_queries() {
    let store = FakeStore::with_keys(1, "acme");
    let dir = directory(&store, short(ms(100), Duration::from_secs(60))).await;
    assert!(
        dir.cached(&digest(0), Instant::now()).is_none(),
        "a miss needs the store"
    );
    assert!(
        dir.cached(&digest(9), Instant::now()).is_none(),
        "so does a key never seen"
    );
    assert_eq!(store.lookups(), 0, "cached never asks the store");

    dir.lookup(&digest(0)).await.unwrap();
    dir.lookup(&digest(9)).await.unwrap();
    assert_eq!(store.lookups(), 2);
    let fresh = dir
        .cached(&digest(0), Instant::now())
        .expect("a fresh entry");
    assert_eq!(fresh.outcome, Outcome::Fresh);
    assert_eq!(fresh.found.unwrap().tenant.spec.name, "acme");
    let unknown = dir
        .cached(&digest(9), Instant::now())
        .expect("a remembered unknown key");
    assert_eq!(unknown.outcome, Outcome::Negative);
    assert!(unknown.found.is_none());
    assert_eq!(store.lookups(), 2);

    tokio::time::sleep(ms(150)).await; // let the TTL pass
    let stale = dir
        .cached(&digest(0), Instant::now())
        .expect("a stale entry is served at once");
    assert_eq!(stale.outcome, Outcome::Stale);
    eventually(Duration::from_secs(5), "the refresh it started", || async {
        store.lookups() == 3 && store.in_flight() == 0
    })
    .await;
    eventually(Duration::from_secs(1), "a fresh answer again", || async {
        dir.cached(&digest(0), Instant::now()).map(|l| l.outcome) == Some(Outcome::Fresh)
    })
    .await;

    dir.invalidate(&digest(0));
    assert!(
        dir.cached(&digest(0), Instant::now()).is_none(),
        "a revoked key is the store's to answer"
    );
}

/// A hit answered at once is counted in `spillway_key_lookup_seconds` as taking no time: the
/// histogram's sum does not grow with hits, only its count (each hit timed itself with two
/// clock reads before, a few hundred nanoseconds each time).
#[test]
fn a_hit_answered_at_once_counts_as_taking_no_time() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let figures = |page: &str| {
        let figure = |name: &str| -> f64 {
            let line = page.lines().find(|l| l.starts_with(name)).expect(name);
            line[name.len()..].trim().parse().unwrap()
        };
        (
            figure("spillway_key_lookup_seconds_sum "),
            figure("spillway_key_lookup_seconds_count "),
        )
    };
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let store = FakeStore::with_keys(1, "acme");
            let dir = directory(&store, short(Duration::from_secs(60), ms(1000))).await;
            dir.lookup(&digest(0)).await.unwrap();
            let (sum, count) = figures(&handle.render());
            assert!(sum > 0.0, "the store's answer took time");
            for _ in 0..100 {
                let hit = dir
                    .cached(&digest(0), Instant::now())
                    .expect("a fresh entry");
                assert_eq!(hit.outcome, Outcome::Fresh);
            }
            assert_eq!(figures(&handle.render()), (sum, count + 100.0));
        });
    });
}
