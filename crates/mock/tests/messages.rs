//! The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`): the
//! message and its usage, the event stream, the prefix cache in `cache_read_input_tokens`, and
//! every refusal in Anthropic's error shape with a `request-id`, and the Anthropic headers
//! `/stats` remembers.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use spillway_testkit::http::client;
use support::*;

const PATH: &str = "/v1/messages";
const COUNT: &str = "/v1/messages/count_tokens";

/// A messages request: "Be brief" and "Hello there, mock" are 8 + 17 characters, 6 tokens.
fn ask(stream: bool, max_tokens: u32) -> Value {
    json!({
        "model": "m",
        "system": "Be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello there, mock"}]}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

fn assert_request_id(headers: &reqwest::header::HeaderMap) {
    let id = headers
        .get("request-id")
        .expect("a request-id header")
        .to_str()
        .unwrap();
    let hex = id.strip_prefix("req_").unwrap_or_else(|| panic!("{id}"));
    assert!(
        !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
}

/// Asserts an Anthropic-shaped error of `status` and `kind`, with a `request-id`; returns the
/// headers.
async fn expect_anthropic_error(
    r: reqwest::Response,
    status: u16,
    kind: &str,
) -> reqwest::header::HeaderMap {
    let headers = r.headers().clone();
    assert_eq!(r.status().as_u16(), status);
    assert_request_id(&headers);
    let v: Value = r.json().await.expect("error body is JSON");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    assert_eq!(
        v.as_object().unwrap().len(),
        2,
        "nothing but type and error: {v}"
    );
    headers
}

#[tokio::test]
async fn plain_message_has_the_anthropic_shape_and_usage() {
    let mock = start(profile(|p| p.prefix_cache_entries = 0)).await;
    let r = post(&mock, PATH, &ask(false, 3)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_request_id(r.headers());
    let v: Value = r.json().await.unwrap();
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    assert_eq!(
        (&v["type"], &v["role"], &v["model"]),
        (&json!("message"), &json!("assistant"), &json!("m"))
    );
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": "the quick mock"}])
    );
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["stop_sequence"], Value::Null);
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 6, "output_tokens": 3, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0})
    );

    // A limit above the profile's 16 tokens: the model ends its turn.
    let v: Value = post(&mock, PATH, &ask(false, 100))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"]["output_tokens"], 16);
    let s = mock.stats().await;
    assert_eq!(
        (&s["served"], &s["by_path"][PATH]),
        (&json!(2), &json!(2)),
        "{s}"
    );
    let metrics = client()
        .get(mock.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("vllm:request_success_total{model_name=\"m\"} 2\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn stream_is_the_message_events_in_order_with_usage() {
    let mock = start(profile(|p| p.prefix_cache_entries = 0)).await;
    let r = post(&mock, PATH, &ask(true, 4)).await;
    assert_eq!(r.status(), 200);
    assert_request_id(r.headers());
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let (text, failed) = read_stream(r).await;
    assert!(!failed, "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    let events = named_events(&text);
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(["content_block_delta"; 4]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names(&events), expected, "{text}");
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "{data}");
    }

    let start = &events[0].1["message"];
    assert!(start["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Value::Null);
    assert_eq!(
        start["usage"],
        json!({"input_tokens": 6, "output_tokens": 1, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0})
    );
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let text_out: String = events[3..7]
        .iter()
        .map(|(_, d)| {
            assert_eq!(d["index"], 0);
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text_out, "the quick mock model");
    assert_eq!(events[7].1["index"], 0);
    assert_eq!(
        events[8].1,
        json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
               "usage": {"output_tokens": 4}})
    );
    let s = mock.stats().await;
    assert_eq!(
        (&s["served"], &s["in_flight"]),
        (&json!(1), &json!(0)),
        "{s}"
    );
}

#[tokio::test]
async fn broken_stream_ends_in_a_body_error_without_message_stop() {
    let mock = start(profile(|p| p.fault.break_stream_after = Some(1))).await;
    let r = post(&mock, PATH, &ask(true, 10)).await;
    assert_eq!(r.status(), 200);
    let (text, failed) = read_stream(r).await;
    assert!(failed, "the body must end in an error: {text}");
    let events = named_events(&text);
    assert_eq!(
        names(&events),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta"
        ],
        "{text}"
    );
    let s = mock.stats().await;
    assert_eq!(
        (&s["streams_broken"], &s["served"]),
        (&json!(1), &json!(0)),
        "{s}"
    );
}

#[tokio::test]
async fn repeated_prompt_is_read_from_the_prefix_cache() {
    let mock = start(profile(|_| {})).await;
    let first: Value = post(&mock, PATH, &ask(false, 1))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(first["usage"]["input_tokens"], 6, "{first}");
    assert_eq!(first["usage"]["cache_read_input_tokens"], 0, "{first}");
    let again: Value = post(&mock, PATH, &ask(false, 1))
        .await
        .json()
        .await
        .unwrap();
    // An exact repeat is cached whole: nothing left to prefill.
    assert_eq!(
        (
            &again["usage"]["input_tokens"],
            &again["usage"]["cache_read_input_tokens"]
        ),
        (&json!(0), &json!(6)),
        "{again}"
    );
    let (text, _) = read_stream(post(&mock, PATH, &ask(true, 1)).await).await;
    let start = &named_events(&text)[0].1;
    assert_eq!(
        start["message"]["usage"]["cache_read_input_tokens"], 6,
        "{start}"
    );
    let s = mock.stats().await;
    assert_eq!(
        (&s["prefix_cache_hits"], &s["prefix_cache_misses"]),
        (&json!(2), &json!(1)),
        "{s}"
    );
    assert_eq!(s["prefix_cache_hit_tokens"], 12, "{s}");
}

#[tokio::test]
async fn missing_max_tokens_is_an_anthropic_invalid_request() {
    let mock = start(profile(|_| {})).await;
    let mut body = ask(false, 1);
    body.as_object_mut().unwrap().remove("max_tokens");
    let r = post(&mock, PATH, &body).await;
    expect_anthropic_error(r, 400, "invalid_request_error").await;
    let c = client();
    let r = c
        .post(mock.url(PATH))
        .body("{not json")
        .send()
        .await
        .unwrap();
    expect_anthropic_error(r, 400, "invalid_request_error").await;
    let system_role = json!({"model": "m", "max_tokens": 1,
                             "messages": [{"role": "system", "content": "x"}]});
    expect_anthropic_error(
        post(&mock, PATH, &system_role).await,
        400,
        "invalid_request_error",
    )
    .await;
    let s = mock.stats().await;
    assert_eq!(
        (&s["rejected_invalid"], &s["served"]),
        (&json!(3), &json!(0)),
        "{s}"
    );
}

#[tokio::test]
async fn refusals_are_anthropic_errors_with_a_request_id() {
    let mock = start_with_key(profile(|_| {}), "sk-ant").await;
    let c = client();
    let url = mock.url(PATH);
    let send = |key: &'static str, body: Value| {
        let request = c.post(&url).header("x-api-key", key).json(&body);
        async move { request.send().await.unwrap() }
    };
    expect_anthropic_error(
        send("sk-no", ask(false, 1)).await,
        401,
        "authentication_error",
    )
    .await;
    let r = c.post(&url).json(&ask(false, 1)).send().await.unwrap();
    expect_anthropic_error(r, 401, "authentication_error").await;
    let mut unknown = ask(false, 1);
    unknown["model"] = "claude-nope".into();
    expect_anthropic_error(send("sk-ant", unknown).await, 404, "not_found_error").await;
    let r = send("sk-ant", ask(false, 1)).await;
    assert_eq!(r.status(), 200);
    assert_request_id(r.headers());
    assert_eq!(mock.stats().await["last_request"]["auth"], "x-api-key");
    // Wrong methods and unknown paths under /v1/messages answer in the same dialect.
    let r = c.get(&url).send().await.unwrap();
    expect_anthropic_error(r, 405, "invalid_request_error").await;
    let r = c
        .post(mock.url("/v1/messages/batches/x"))
        .send()
        .await
        .unwrap();
    expect_anthropic_error(r, 404, "not_found_error").await;

    // An injected 529 is Anthropic's overload, with the profile's Retry-After.
    mock.server.set_profile(profile(|p| {
        p.fault.error_rate = 1.0;
        p.fault.error_status = 529;
        p.fault.retry_after = Some(Duration::from_secs(3));
    }));
    let headers =
        expect_anthropic_error(send("sk-ant", ask(false, 1)).await, 529, "overloaded_error").await;
    assert_eq!(headers["retry-after"], "3");
    let r = send("sk-ant", json!({"model": "m", "messages": []})).await;
    expect_anthropic_error(r, 529, "overloaded_error").await;
    let r = c
        .post(mock.url(COUNT))
        .header("x-api-key", "sk-ant")
        .json(&ask(false, 1))
        .send()
        .await
        .unwrap();
    expect_anthropic_error(r, 529, "overloaded_error").await;
    let s = mock.stats().await;
    assert_eq!(s["errors_injected"], 3, "{s}");
    assert_eq!(s["rejected_invalid"], 3, "{s}");
}

#[tokio::test]
async fn a_full_slot_queue_is_an_anthropic_rate_limit() {
    // One slot, no queue; a slow stream holds the slot.
    let mock = start(profile(|p| {
        p.capacity = 1;
        p.queue = 0;
        p.tokens_per_sec = 2.0;
    }))
    .await;
    let held = post(&mock, PATH, &ask(true, 100)).await;
    assert_eq!(held.status(), 200);
    expect_anthropic_error(
        post(&mock, PATH, &ask(false, 1)).await,
        429,
        "rate_limit_error",
    )
    .await;
    // Counting tokens needs no slot.
    let r = post(&mock, COUNT, &ask(false, 1)).await;
    assert_eq!(r.status(), 200);
    drop(held);
    let s = mock.stats().await;
    assert_eq!(s["rejected_queue_full"], 1, "{s}");
}

#[tokio::test]
async fn count_tokens_answers_the_prompt_estimate_and_grows_with_it() {
    let mock = start(profile(|_| {})).await;
    let count = |system: String, question: &'static str| {
        let body = json!({"model": "m", "system": system,
                          "messages": [{"role": "user", "content": question}]});
        let url = mock.url(COUNT);
        async move {
            let r = client().post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            assert_request_id(r.headers());
            let v: Value = r.json().await.unwrap();
            assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
            v["input_tokens"].as_u64().unwrap()
        }
    };
    let short = count(String::new(), "Hi").await;
    assert!(short > 0);
    let long = count("Be brief. ".repeat(40), "Hello there, mock").await;
    assert!(long > short, "{long} <= {short}");
    // The same estimate as a message's usage.
    let v: Value = post(&mock, PATH, &ask(false, 1))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(count("Be brief".to_owned(), "Hello there, mock").await, 6);
    assert_eq!(v["usage"]["input_tokens"], 6);

    let mut unknown = ask(false, 1);
    unknown["model"] = "nope".into();
    expect_anthropic_error(post(&mock, COUNT, &unknown).await, 404, "not_found_error").await;
    let s = mock.stats().await;
    assert_eq!(s["by_path"][COUNT], 4, "{s}");
    assert_eq!(
        (&s["served"], &s["rejected_invalid"]),
        (&json!(4), &json!(1)),
        "{s}"
    );
    // Counting holds no slot and prefills nothing, so it never touches the prefix cache.
    assert_eq!(s["prefix_cache_query_tokens"], 6, "{s}");
}

#[tokio::test]
async fn anthropic_version_and_beta_headers_are_remembered() {
    let mock = start(profile(|_| {})).await;
    let body = json!({"model": "m", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "hi"}]});
    let r = client()
        .post(mock.url(PATH))
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "prompt-caching-2024-07-31")
        .header("anthropic-beta", "token-counting-2024-11-01")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let last = &mock.stats().await["last_request"];
    assert_eq!(last["anthropic_version"], "2023-06-01");
    // Several beta headers read as one comma-separated list, as the API reads them.
    assert_eq!(
        last["anthropic_beta"],
        "prompt-caching-2024-07-31,token-counting-2024-11-01"
    );

    let r = post(&mock, PATH, &body).await;
    assert_eq!(r.status(), 200);
    let last = &mock.stats().await["last_request"];
    assert_eq!(last["anthropic_version"], Value::Null);
    assert_eq!(last["anthropic_beta"], Value::Null);
}
