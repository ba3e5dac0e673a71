//! The Responses and Messages APIs through the gateway against real mock-backend processes: routed
//! only to backends that serve them, under the same limits, in each API's own dialect.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use serde_json::{json, Value};
use spillway_testkit::http::{client, get_json};
use support::*;

const FAST: [&str; 6] = ["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"];

fn one_backend(mock: &Proc) -> String {
    model("m", &[("b1", "region-a", mock.url("/v1"))])
}

fn responses_body(stream: bool) -> Value {
    json!({"model": "m", "input": "Say hello", "max_output_tokens": 6, "stream": stream})
}

fn messages_body(stream: bool) -> Value {
    json!({
        "model": "m", "max_tokens": 6, "stream": stream,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "Say hello"}],
    })
}

async fn post(gw: &Proc, path: &str, key_header: (&str, &str), body: &Value) -> reqwest::Response {
    client()
        .post(gw.url(path))
        .header(key_header.0, key_header.1)
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap()
}

fn bearer() -> (&'static str, String) {
    ("authorization", format!("Bearer {KEY}"))
}

/// The `event:` names of an SSE body, in order.
fn event_names(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("event:"))
        .map(str::trim)
        .collect()
}

/// The JSON of each `data:` line of an SSE body.
fn event_data(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .collect()
}

#[tokio::test]
async fn responses_plain_and_streamed_pass_through() {
    let mock = mock(&FAST);
    let gw = gateway(&one_backend(&mock));
    let (name, value) = bearer();
    let r = post(&gw, "/v1/responses", (name, &value), &responses_body(false)).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-request-id"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "response");
    assert!(v["usage"]["output_tokens"].as_u64().unwrap() > 0, "{v}");

    let r = post(&gw, "/v1/responses", (name, &value), &responses_body(true)).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let names = event_names(&text);
    assert_eq!(names.first(), Some(&"response.created"), "{text}");
    assert_eq!(names.last(), Some(&"response.completed"), "{text}");
    assert!(names.contains(&"response.output_text.delta"), "{text}");
    let stats = get_json(&mock.url("/stats")).await;
    assert_eq!(stats["last_request"]["path"], "/v1/responses");
    // The caller's key never travels upstream.
    assert_eq!(stats["last_request"]["auth"], "none");
}

#[tokio::test]
async fn messages_plain_streamed_and_count_tokens_with_the_anthropic_key_header() {
    let mock = mock(&FAST);
    let gw = gateway(&one_backend(&mock));
    let key = ("x-api-key", KEY);
    let r = post(&gw, "/v1/messages", key, &messages_body(false)).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("request-id"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message", "{v}");
    assert!(v["usage"]["output_tokens"].as_u64().unwrap() > 0, "{v}");

    let r = post(&gw, "/v1/messages", key, &messages_body(true)).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let names = event_names(&text);
    assert_eq!(names.first(), Some(&"message_start"), "{text}");
    assert_eq!(names.last(), Some(&"message_stop"), "{text}");

    let r = post(
        &gw,
        "/v1/messages/count_tokens",
        key,
        &json!({"model": "m", "messages": [{"role": "user", "content": "Say hello"}]}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert!(v["input_tokens"].as_u64().unwrap() > 0, "{v}");
    let stats = get_json(&mock.url("/stats")).await;
    assert_eq!(stats["last_request"]["path"], "/v1/messages/count_tokens");
    assert_eq!(stats["last_request"]["auth"], "none");
}

#[tokio::test]
async fn the_gateways_own_errors_on_messages_are_anthropic_shaped() {
    let mock = mock(&FAST);
    let gw = gateway(&one_backend(&mock));
    let check = |v: &Value, kind: &str| {
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
    };
    // No key, a wrong key, an unknown model, a malformed body, an unknown method.
    let r = client()
        .post(gw.url("/v1/messages"))
        .json(&messages_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().contains_key("request-id"));
    check(&r.json().await.unwrap(), "authentication_error");
    let r = post(
        &gw,
        "/v1/messages",
        ("x-api-key", "sk-wrong"),
        &messages_body(false),
    )
    .await;
    assert_eq!(r.status(), 401);
    check(&r.json().await.unwrap(), "authentication_error");
    let mut unknown = messages_body(false);
    unknown["model"] = json!("no-such-model");
    let r = post(&gw, "/v1/messages", ("x-api-key", KEY), &unknown).await;
    assert_eq!(r.status(), 404);
    check(&r.json().await.unwrap(), "not_found_error");
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", KEY)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    check(&r.json().await.unwrap(), "invalid_request_error");
    let r = client()
        .get(gw.url("/v1/messages"))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    check(&r.json().await.unwrap(), "invalid_request_error");
    // The same refusal on the Responses API keeps OpenAI's shape.
    let r = post(
        &gw,
        "/v1/responses",
        ("x-api-key", "sk-wrong"),
        &responses_body(false),
    )
    .await;
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
}

#[tokio::test]
async fn a_surface_no_backend_serves_is_a_404_in_its_dialect_and_reaches_no_backend() {
    let mock = mock(&FAST);
    let gw = gateway(&format!(
        "{}surfaces = [\"chat\", \"embeddings\"]\n",
        one_backend(&mock)
    ));
    let r = post(
        &gw,
        "/v1/messages",
        ("x-api-key", KEY),
        &messages_body(false),
    )
    .await;
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/messages"),
        "{v}"
    );
    let (name, value) = bearer();
    let r = post(&gw, "/v1/responses", (name, &value), &responses_body(false)).await;
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "surface_not_served", "{v}");
    let stats = get_json(&mock.url("/stats")).await;
    assert_eq!(stats["received"], 0, "{stats}");
    // The model list says what the model serves.
    let models = client()
        .get(gw.url("/v1/models/m"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
    let v: Value = models.json().await.unwrap();
    assert_eq!(v["surfaces"], json!(["chat", "embeddings"]), "{v}");
}

#[tokio::test]
async fn requests_go_only_to_backends_that_serve_their_surface() {
    let chat_only = mock(&FAST);
    let everything = mock(&FAST);
    let gw = gateway(&format!(
        "[[models]]\nname = \"m\"\n\
         [[models.backends]]\nname = \"chat-only\"\nregion = \"region-a\"\nurl = \"{}\"\nsurfaces = [\"chat\"]\n\
         [[models.backends]]\nname = \"all\"\nregion = \"region-a\"\nurl = \"{}\"\n",
        chat_only.url("/v1"),
        everything.url("/v1")
    ));
    for _ in 0..8 {
        let r = post(
            &gw,
            "/v1/messages",
            ("x-api-key", KEY),
            &messages_body(false),
        )
        .await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(get_json(&chat_only.url("/stats")).await["received"], 0);
    assert_eq!(get_json(&everything.url("/stats")).await["served"], 8);
}

#[tokio::test]
async fn a_529_overloaded_backend_is_a_capacity_answer_retried_elsewhere() {
    let overloaded = mock(&[
        "--model",
        "m",
        "--ttft",
        "0ms",
        "--tokens-per-sec",
        "0",
        "--error-rate",
        "1",
        "--error-status",
        "529",
    ]);
    let healthy = mock(&FAST);
    let gw = gateway(&model(
        "m",
        &[
            ("over", "region-a", overloaded.url("/v1")),
            ("ok", "region-a", healthy.url("/v1")),
        ],
    ));
    for _ in 0..6 {
        let r = post(
            &gw,
            "/v1/messages",
            ("x-api-key", KEY),
            &messages_body(false),
        )
        .await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    let m = metrics(&gw).await;
    // Each 529 was counted as capacity, and never retried on the backend that sent it.
    let capacity =
        sample(&m, r#"spillway_retries_total{model="m",reason="capacity"}"#).unwrap_or(0.0);
    let reached = get_json(&overloaded.url("/stats")).await["received"]
        .as_u64()
        .unwrap();
    assert!(reached >= 1, "the overloaded backend was never tried");
    assert_eq!(capacity, reached as f64, "{m}");
}

#[tokio::test]
async fn a_broken_stream_ends_with_each_surfaces_error_event_never_its_clean_end() {
    let mock = mock(&[
        "--model",
        "m",
        "--ttft",
        "0ms",
        "--tokens-per-sec",
        "0",
        "--break-stream-after",
        "2",
    ]);
    let gw = gateway(&one_backend(&mock));
    let r = post(
        &gw,
        "/v1/messages",
        ("x-api-key", KEY),
        &messages_body(true),
    )
    .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let names = event_names(&text);
    assert_eq!(names.last(), Some(&"error"), "{text}");
    assert!(!names.contains(&"message_stop"), "{text}");
    let last = event_data(&text).pop().unwrap();
    assert_eq!(
        (last["type"].as_str(), last["error"]["type"].as_str()),
        (Some("error"), Some("api_error")),
        "{text}"
    );

    let (name, value) = bearer();
    let r = post(&gw, "/v1/responses", (name, &value), &responses_body(true)).await;
    let text = r.text().await.unwrap();
    let names = event_names(&text);
    assert_eq!(names.last(), Some(&"error"), "{text}");
    assert!(!names.contains(&"response.completed"), "{text}");
    let last = event_data(&text).pop().unwrap();
    assert_eq!(last["type"], "error", "{text}");
    assert_eq!(last["code"], "upstream_unavailable", "{text}");
}

#[tokio::test]
async fn one_tokens_per_minute_limit_holds_across_chat_responses_and_messages() {
    let mock = mock(&FAST);
    let gw = gateway(&format!(
        "{}\n[[tenants]]\nname = \"tight\"\nkeys = [{{ sha256 = \"{}\" }}]\ntokens_per_min = 200\n",
        one_backend(&mock),
        sha256_hex("sk-tight")
    ));
    let tight = ("x-api-key", "sk-tight");
    // Messages calls alone spend the tenant's tokens...
    let mut passed = 0;
    loop {
        let r = post(&gw, "/v1/messages", tight, &messages_body(false)).await;
        if r.status() == 429 {
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
            break;
        }
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        passed += 1;
        assert!(
            passed < 50,
            "the tokens-per-minute limit never refused a Messages call"
        );
    }
    assert!(passed >= 1);
    // ...and then the same tenant's chat and Responses calls that need at least as many tokens
    // are refused as well.
    let mut chat = chat_body("m", false);
    chat["max_tokens"] = json!(40);
    let r = post(&gw, "/v1/chat/completions", tight, &chat).await;
    assert_eq!(r.status(), 429, "{}", r.text().await.unwrap());
    let mut responses = responses_body(false);
    responses["max_output_tokens"] = json!(40);
    let r = post(&gw, "/v1/responses", tight, &responses).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "tokens", "{v}");
}

#[tokio::test]
async fn each_surfaces_reported_usage_is_what_the_tenant_is_charged() {
    let mock = mock(&FAST);
    // Usage is read for tenants with a tokens-per-minute limit.
    let gw = gateway(&format!(
        "{}\n[[tenants]]\nname = \"metered\"\nkeys = [{{ sha256 = \"{}\" }}]\ntokens_per_min = 1000000\n",
        one_backend(&mock),
        sha256_hex("sk-metered")
    ));
    let reported = || async {
        let m = metrics(&gw).await;
        sample(&m, r#"spillway_tokens_reported_total{tenant="metered"}"#).unwrap_or(0.0)
    };
    let key = ("x-api-key", "sk-metered");
    for (path, body) in [
        ("/v1/messages", messages_body(false)),
        ("/v1/messages", messages_body(true)),
        ("/v1/responses", responses_body(false)),
        ("/v1/responses", responses_body(true)),
    ] {
        let before = reported().await;
        let r = post(&gw, path, key, &body).await;
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        // The usage the backend reported, read here the way the caller's SDK reads it.
        let usage = if body["stream"] == true {
            let events = event_data(&text);
            let last_usage =
                |f: &dyn Fn(&Value) -> Option<u64>| events.iter().filter_map(f).last().unwrap_or(0);
            let input = last_usage(&|e| {
                e["message"]["usage"]["input_tokens"]
                    .as_u64()
                    .map(|n| {
                        n + e["message"]["usage"]["cache_read_input_tokens"]
                            .as_u64()
                            .unwrap_or(0)
                    })
                    .or_else(|| e["response"]["usage"]["input_tokens"].as_u64())
            });
            let output = last_usage(&|e| {
                e["usage"]["output_tokens"]
                    .as_u64()
                    .or_else(|| e["response"]["usage"]["output_tokens"].as_u64())
            });
            input + output
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            let u = &v["usage"];
            [
                "input_tokens",
                "output_tokens",
                "cache_read_input_tokens",
                "cache_creation_input_tokens",
            ]
            .iter()
            .filter_map(|f| u[f].as_u64())
            .sum()
        };
        assert!(usage > 0, "{path}: {text}");
        let expected = before + usage as f64;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while reported().await != expected && std::time::Instant::now() < deadline {
            tokio::time::sleep(spillway_testkit::POLL_EVERY).await;
        }
        let charged = reported().await - before;
        assert_eq!(charged, usage as f64, "{path}: {text}");
    }
}

#[tokio::test]
async fn an_oversized_or_slow_messages_body_is_refused_in_the_anthropic_shape() {
    let mock = mock(&FAST);
    // The first lines land in the [server] table.
    let gw = gateway(&format!(
        "max_body_bytes = 4096\nbody_read_timeout = \"300ms\"\n{}",
        one_backend(&mock)
    ));
    let mut huge = messages_body(false);
    huge["messages"][0]["content"] = json!("x".repeat(10_000));
    let r = post(&gw, "/v1/messages", ("x-api-key", KEY), &huge).await;
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "request_too_large", "{v}");
    // A body that never finishes arriving.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    tx.send(Ok(b"{\"model\":\"m\",".to_vec())).await.unwrap();
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", KEY)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    drop(tx);
    assert_eq!(r.status(), 408);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(get_json(&mock.url("/stats")).await["received"], 0);
}
