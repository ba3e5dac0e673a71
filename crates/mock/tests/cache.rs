//! Prefill and the prefix cache: a prompt that starts like one served recently on the same
//! server reaches its first token sooner, as with vLLM's automatic prefix caching.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use spillway_testkit::http::client;
use support::*;

/// A chat request with this system prompt and question, one output token.
fn ask(system: &str, question: &str) -> Value {
    json!({
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 1,
    })
}

/// Sends `body` and returns how long the answer took; with one output token and no token
/// delay, that is the time to first token plus the round trip.
async fn timed(mock: &Mock, body: &Value) -> Duration {
    let started = Instant::now();
    let r = chat(mock, body).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    started.elapsed()
}

fn counter(stats: &Value, name: &str) -> u64 {
    stats[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name}: {stats}"))
}

#[tokio::test]
async fn repeated_long_prompt_hits_the_prefix_cache_and_skips_its_prefill() {
    // 12,000 characters are 3,000 tokens: 1.2 s of prefill at 2,500 tokens/s when uncached.
    let mock = start(profile(|p| p.prefill_tokens_per_sec = 2500.0)).await;
    let body = ask(&"s".repeat(11_996), "why?");
    let first = timed(&mock, &body).await;
    assert!(first >= Duration::from_millis(1200), "{first:?}");
    let second = timed(&mock, &body).await;
    // Cached whole, the repeat waits for no prefill; the margin leaves a loaded machine 400 ms.
    assert!(
        second + Duration::from_millis(800) < first,
        "cached {second:?}, uncached {first:?}"
    );
    let s = mock.stats().await;
    assert_eq!(counter(&s, "prefix_cache_misses"), 1, "{s}");
    assert_eq!(counter(&s, "prefix_cache_hits"), 1, "{s}");
    assert_eq!(counter(&s, "prefix_cache_query_tokens"), 6000, "{s}");
    assert_eq!(counter(&s, "prefix_cache_hit_tokens"), 3000, "{s}");
}

#[tokio::test]
async fn shared_system_prompt_is_cached_up_to_the_last_whole_block_on_that_server_only() {
    let mock = start(profile(|_| {})).await;
    let other = start(profile(|_| {})).await;
    // Eight blocks of the default 1024 characters, then the question.
    let system = "You are a careful assistant. ".repeat(283)[..8192].to_owned();
    timed(&mock, &ask(&system, "What is a mock?")).await;
    timed(&mock, &ask(&system, "Which backend served this?")).await;
    let s = mock.stats().await;
    assert_eq!(counter(&s, "prefix_cache_hits"), 1, "{s}");
    assert_eq!(counter(&s, "prefix_cache_hit_tokens"), 8192 / 4, "{s}");

    timed(&other, &ask(&system, "What is a mock?")).await;
    let s = other.stats().await;
    assert_eq!(
        (
            counter(&s, "prefix_cache_hits"),
            counter(&s, "prefix_cache_misses")
        ),
        (0, 1),
        "another server has its own cache: {s}"
    );
}

#[tokio::test]
async fn prefix_cache_off_never_hits_and_every_request_prefills_whole() {
    // 4,000 characters are 1,000 tokens: 400 ms of prefill at 2,500 tokens/s.
    let mock = start(profile(|p| {
        p.prefill_tokens_per_sec = 2500.0;
        p.prefix_cache_entries = 0;
    }))
    .await;
    let body = ask(&"s".repeat(3_996), "why?");
    for _ in 0..2 {
        let took = timed(&mock, &body).await;
        assert!(took >= Duration::from_millis(400), "{took:?}");
    }
    let s = mock.stats().await;
    for name in [
        "prefix_cache_hits",
        "prefix_cache_misses",
        "prefix_cache_query_tokens",
        "prefix_cache_hit_tokens",
    ] {
        assert_eq!(counter(&s, name), 0, "{name}: {s}");
    }
}

#[tokio::test]
async fn switching_the_prefix_cache_off_forgets_it() {
    let mock = start(profile(|_| {})).await;
    let body = ask(&"s".repeat(4096), "why?");
    timed(&mock, &body).await;
    let c = client();
    for entries in [0, 256] {
        let r = c
            .patch(mock.url("/control"))
            .json(&json!({"prefix_cache_entries": entries}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    timed(&mock, &body).await;
    let s = mock.stats().await;
    assert_eq!(
        (
            counter(&s, "prefix_cache_hits"),
            counter(&s, "prefix_cache_misses")
        ),
        (0, 2),
        "{s}"
    );
}
