//! `GET /metrics`: vLLM's load metrics, from the mock's real state, in Prometheus text.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use spillway_testkit::eventually;
use spillway_testkit::http::client;
use support::*;

const DEADLINE: Duration = Duration::from_secs(10);

/// The metrics vLLM exposes that a gateway routes on, all of which the mock must serve.
const NAMES: [&str; 6] = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:request_success_total",
];

/// One sample: its labels as written, and its value.
type Samples = BTreeMap<String, (String, f64)>;

/// Parses the text exposition format strictly enough to catch a malformed scrape: every line
/// is `# HELP name text`, `# TYPE name gauge|counter`, or `name{labels} value`, and every sample
/// follows its own HELP and TYPE lines.
fn parse(text: &str) -> Samples {
    assert!(text.ends_with('\n'), "{text:?}");
    let valid_name = |n: &str| {
        let mut chars = n.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let (mut helped, mut typed) = (Vec::new(), Vec::new());
    let mut samples = Samples::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP has a name and a text");
            assert!(valid_name(name) && !help.is_empty(), "{line}");
            helped.push(name.to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE has a name and a type");
            assert!(valid_name(name), "{line}");
            assert!(["gauge", "counter"].contains(&kind), "{line}");
            assert!(helped.iter().any(|h| h == name), "TYPE before HELP: {line}");
            typed.push(name.to_owned());
        } else {
            let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("value: {line}"));
            let (name, labels) = series.split_at(series.find('{').unwrap_or(series.len()));
            assert!(valid_name(name), "{line}");
            assert!(
                labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                "{line}"
            );
            assert!(
                typed.iter().any(|t| t == name),
                "sample before TYPE: {line}"
            );
            let earlier = samples.insert(name.to_owned(), (labels.to_owned(), value));
            assert!(earlier.is_none(), "one series per metric: {line}");
        }
    }
    samples
}

async fn scrape(mock: &Mock) -> Samples {
    let r = client().get(mock.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let content_type = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    parse(&r.text().await.unwrap())
}

fn value(samples: &Samples, name: &str) -> f64 {
    samples
        .get(name)
        .unwrap_or_else(|| panic!("no {name}: {samples:?}"))
        .1
}

#[tokio::test]
async fn idle_metrics_parse_as_prometheus_text_with_vllm_names_and_the_first_model() {
    let mock = start(profile(|p| p.models = vec!["m".into(), "n".into()])).await;
    let samples = scrape(&mock).await;
    assert_eq!(samples.len(), NAMES.len(), "{samples:?}");
    for name in NAMES {
        assert_eq!(
            samples[name],
            (r#"{model_name="m"}"#.to_owned(), 0.0),
            "{name}"
        );
    }
    // A scrape is not an inference request.
    assert_eq!(mock.stats().await["received"], 0);
}

#[tokio::test]
async fn running_waiting_and_kv_usage_follow_the_requests_held() {
    // Two slots; 1000 KV tokens; each request holds 4 prompt tokens plus 100 it will generate.
    let mock = start(profile(|p| {
        p.capacity = 2;
        p.queue = 4;
        p.tokens_per_sec = 2.0;
        p.max_output_tokens = 100;
        p.kv_cache_tokens = 1000;
    }))
    .await;
    let load = |running: f64, waiting: f64, kv: f64| {
        let mock = &mock;
        move || async move {
            let s = scrape(mock).await;
            value(&s, "vllm:num_requests_running") == running
                && value(&s, "vllm:num_requests_waiting") == waiting
                && (value(&s, "vllm:kv_cache_usage_perc") - kv).abs() < 1e-9
        }
    };
    let first = chat(&mock, &chat_body(true, 100)).await;
    assert_eq!(first.status(), 200);
    eventually(DEADLINE, "one running", load(1.0, 0.0, 0.104)).await;
    let second = chat(&mock, &chat_body(true, 100)).await;
    eventually(DEADLINE, "two running", load(2.0, 0.0, 0.208)).await;

    let chat_url = mock.url("/v1/chat/completions");
    let queued = tokio::spawn(async move {
        let r = client()
            .post(chat_url)
            .json(&chat_body(false, 1))
            .send()
            .await
            .unwrap();
        r.status()
    });
    // Waiting requests hold no KV cache.
    eventually(DEADLINE, "one waiting", load(2.0, 1.0, 0.208)).await;

    drop((first, second));
    assert_eq!(queued.await.unwrap(), 200);
    eventually(DEADLINE, "idle again", load(0.0, 0.0, 0.0)).await;
    let s = scrape(&mock).await;
    assert_eq!(value(&s, "vllm:request_success_total"), 1.0, "{s:?}");
}

#[tokio::test]
async fn prefix_cache_counters_count_tokens_as_stats_do() {
    let mock = start(profile(|_| {})).await;
    let body = json!({"model": "m", "prompt": "p".repeat(2048), "max_tokens": 1});
    for _ in 0..2 {
        let r = client()
            .post(mock.url("/v1/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let samples = scrape(&mock).await;
    assert_eq!(value(&samples, "vllm:prefix_cache_queries_total"), 1024.0);
    assert_eq!(value(&samples, "vllm:prefix_cache_hits_total"), 512.0);
    assert_eq!(value(&samples, "vllm:request_success_total"), 2.0);
    let s = mock.stats().await;
    assert_eq!(s["prefix_cache_query_tokens"], 1024, "{s}");
    assert_eq!(s["prefix_cache_hit_tokens"], 512, "{s}");
}

#[tokio::test]
async fn metrics_faults_answer_their_status_or_hang_and_leave_inference_alone() {
    let mock = start(profile(|_| {})).await;
    let c = client();
    let patch = |body: serde_json::Value| {
        let c = c.clone();
        let url = mock.url("/control");
        async move {
            let r = c.patch(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200, "{body}");
        }
    };
    patch(json!({"fault": {"metrics_error_status": 503}})).await;
    let r = c.get(mock.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(chat(&mock, &chat_body(false, 1)).await.status(), 200);

    patch(json!({"fault": {"metrics_error_status": null, "metrics_stall": "600ms"}})).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let err = impatient
        .get(mock.url("/metrics"))
        .send()
        .await
        .expect_err("a stalled scrape outlasts a short timeout");
    assert!(err.is_timeout(), "{err:?}");
    let started = Instant::now();
    let samples = scrape(&mock).await;
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(value(&samples, "vllm:request_success_total"), 1.0);

    // Out-of-range statuses are refused like any invalid profile.
    let r = c
        .patch(mock.url("/control"))
        .json(&json!({"fault": {"metrics_error_status": 200}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}
