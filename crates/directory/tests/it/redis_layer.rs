//! The shared Redis layer against the tests' Redis (`spillway_testkit::redis_url`: 127.0.0.1:6379
//! unless `SPILLWAY_TEST_REDIS_URL` names another). Every test uses random digests and deletes
//! its own keys; nothing else in Redis is touched.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::AsyncCommands;
use spillway_config::CacheConfig;
use spillway_directory::shared::key;
use spillway_directory::Outcome;
use spillway_store::KeyDigest;

use spillway_testkit::{eventually, redis_url};

use crate::support::{directory, key_match, random_digest, FakeStore};

fn with_redis(url: &str) -> CacheConfig {
    CacheConfig {
        redis: Some(url.to_owned()),
        ..CacheConfig::default()
    }
}

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("a connection to the tests' Redis")
}

async fn exists(digest: &KeyDigest) -> bool {
    redis().await.exists(key(digest)).await.unwrap()
}

/// When the answer stored for `digest` was fetched from the store, in Unix milliseconds.
async fn fetched_at_ms(digest: &KeyDigest) -> u64 {
    let value: Vec<u8> = redis().await.get(key(digest)).await.unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&value).unwrap();
    answer["fetched_at_ms"].as_u64().unwrap()
}

fn unix_ms() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    now.as_millis() as u64
}

async fn forget(digests: &[KeyDigest]) {
    let keys: Vec<String> = digests.iter().map(key).collect();
    let _: () = redis().await.del(keys).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_finds_in_redis_what_the_first_loaded() {
    let d = random_digest();
    let first_store = FakeStore::new();
    first_store.add(d, key_match(1, "acme"));
    let first = directory(&first_store, with_redis(&redis_url())).await;
    assert_eq!(first.lookup(&d).await.unwrap().outcome, Outcome::Miss);
    eventually(Duration::from_secs(2), "the answer in Redis", || exists(&d)).await;

    // The second instance's store does not even know the key: the answer can only come from
    // Redis.
    let second_store = FakeStore::new();
    let second = directory(&second_store, with_redis(&redis_url())).await;
    let found = second.lookup(&d).await.unwrap();
    assert_eq!(found.outcome, Outcome::RedisHit);
    assert_eq!(*found.found.unwrap(), key_match(1, "acme"));
    assert_eq!(second.lookup(&d).await.unwrap().outcome, Outcome::Fresh);
    assert_eq!(second_store.lookups(), 0);
    assert!(second.is_warm());
    forget(&[d]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_key_is_shared_through_redis_too() {
    let d = random_digest();
    let first_store = FakeStore::new();
    let first = directory(&first_store, with_redis(&redis_url())).await;
    assert!(first.lookup(&d).await.unwrap().found.is_none());
    eventually(Duration::from_secs(2), "the marker in Redis", || exists(&d)).await;
    let second_store = FakeStore::new();
    let second = directory(&second_store, with_redis(&redis_url())).await;
    let found = second.lookup(&d).await.unwrap();
    assert_eq!(
        (found.found.is_none(), found.outcome),
        (true, Outcome::RedisHit)
    );
    assert_eq!(second_store.lookups(), 0);
    forget(&[d]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_deletes_the_answer_from_redis() {
    let d = random_digest();
    let store = FakeStore::new();
    store.add(d, key_match(2, "acme"));
    let dir = directory(&store, with_redis(&redis_url())).await;
    dir.lookup(&d).await.unwrap();
    eventually(Duration::from_secs(2), "the answer in Redis", || exists(&d)).await;
    dir.invalidate(&d);
    eventually(
        Duration::from_secs(2),
        "the answer gone from Redis",
        || async { !exists(&d).await },
    )
    .await;
    forget(&[d]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_does_not_take_answers_from_before_it_out_of_redis() {
    let d = random_digest();
    let store = FakeStore::new();
    store.add(d, key_match(3, "acme"));
    let config = CacheConfig {
        flush_spread: Duration::ZERO,
        ..with_redis(&redis_url())
    };
    let dir = directory(&store, config).await;
    dir.lookup(&d).await.unwrap();
    eventually(Duration::from_secs(2), "the answer in Redis", || exists(&d)).await;
    // Redis answers carry wall-clock times, to the millisecond: a flush in the millisecond of
    // the fetch would not be after it.
    let fetched = fetched_at_ms(&d).await;
    eventually(Duration::from_secs(1), "a later millisecond", || async {
        unix_ms() > fetched
    })
    .await;
    dir.invalidate_all();
    // The copy in Redis predates the flush: the store is asked again.
    assert_eq!(dir.lookup(&d).await.unwrap().outcome, Outcome::Miss);
    assert_eq!(store.lookups(), 2);
    forget(&[d]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_go_on_to_the_store_when_redis_is_a_closed_port() {
    let d = random_digest();
    let store = FakeStore::new();
    store.add(d, key_match(4, "acme"));
    let dir = directory(&store, with_redis("redis://127.0.0.1:1")).await;
    let found = dir.lookup(&d).await.unwrap();
    assert_eq!(found.outcome, Outcome::Miss);
    assert!(found.found.is_some());
    assert_eq!(dir.lookup(&d).await.unwrap().outcome, Outcome::Fresh);
    let unknown = dir.lookup(&random_digest()).await.unwrap();
    assert!(unknown.found.is_none());
    assert!(dir.stats().redis_errors >= 1);
}

/// A Redis that accepts connections and never answers (a hung server, a full backlog).
fn hung_redis() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            held.push(conn);
        }
    });
    url
}

/// On paused time: a Redis that never answers leaves only timers to wait for, which tokio
/// then runs at once, so what is measured is the directory's clock and not the machine's load.
#[tokio::test(start_paused = true)]
async fn a_redis_that_never_answers_delays_no_lookup_beyond_its_timeout() {
    let store = FakeStore::new();
    let digests: Vec<_> = (0..20).map(|_| random_digest()).collect();
    for (i, d) in digests.iter().enumerate() {
        store.add(*d, key_match(i as u64, "acme"));
    }
    let dir = directory(&store, with_redis(&hung_redis())).await;
    for d in &digests {
        let started = tokio::time::Instant::now();
        let found = dir.lookup(d).await.unwrap();
        assert_eq!(found.outcome, Outcome::Miss);
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
    }
    assert_eq!(store.lookups(), 20);
}
