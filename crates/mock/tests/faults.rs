//! Injected failures, and switching them on and off at run time through `/control`.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use spillway_testkit::http::{client, get_json, sse_data};
use support::*;

#[tokio::test]
async fn patch_control_switches_a_healthy_backend_to_503_with_retry_after() {
    let mock = start(profile(|_| {})).await;
    let c = client();
    let chat = mock.url("/v1/chat/completions");
    assert_eq!(
        c.post(&chat)
            .json(&chat_body(false, 1))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    let patch = json!({"fault": {"error_rate": 1.0, "error_status": 503, "retry_after": "1500ms"}});
    let r = c
        .patch(mock.url("/control"))
        .json(&patch)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let now: Value = r.json().await.unwrap();
    assert_eq!(now["fault"]["error_status"], 503);
    assert_eq!(
        now["models"],
        json!(["m"]),
        "untouched fields keep their values"
    );

    let r = c
        .post(&chat)
        .json(&chat_body(false, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "2");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "server_error");
    assert!(v["error"]["message"].is_string());
    // Streams fail the same way, before any event.
    assert_eq!(
        c.post(&chat)
            .json(&chat_body(true, 1))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
    assert_eq!(mock.stats().await["errors_injected"], 2);

    // `null` puts a knob back to its default.
    let r = c
        .patch(mock.url("/control"))
        .json(&json!({"fault": {"error_rate": null}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        c.post(&chat)
            .json(&chat_body(false, 1))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(mock.server.profile().fault.error_status, 503);
}

#[tokio::test]
async fn invalid_control_changes_are_refused_and_change_nothing() {
    let mock = start(profile(|_| {})).await;
    let before = get_json(&mock.url("/control")).await;
    let c = client();
    for (method, body) in [
        (
            reqwest::Method::PATCH,
            json!({"fault": {"error_rate": 2.0}}),
        ),
        (reqwest::Method::PATCH, json!({"capacity": 0})),
        (reqwest::Method::PATCH, json!({"unknown_knob": true})),
        (reqwest::Method::PUT, json!({"models": []})),
    ] {
        let r = c
            .request(method, mock.url("/control"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_profile", "{v}");
    }
    let r = c.put(mock.url("/control")).body("{").send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(get_json(&mock.url("/control")).await, before);

    // PUT replaces the whole profile; missing fields take their defaults.
    let r = c
        .put(mock.url("/control"))
        .json(&json!({"models": ["n"], "ttft": "0ms"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let now = get_json(&mock.url("/control")).await;
    assert_eq!(now["models"], json!(["n"]));
    assert_eq!(now["max_output_tokens"], 16);
    let mut old_model = chat_body(false, 1);
    old_model["model"] = "m".into();
    assert_eq!(
        c.post(mock.url("/v1/chat/completions"))
            .json(&old_model)
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

#[tokio::test]
async fn reset_fault_gives_the_client_a_connection_error_and_no_response() {
    let mock = start(profile(|p| p.fault.reset_rate = 1.0)).await;
    let err = client()
        .post(mock.url("/v1/chat/completions"))
        .json(&chat_body(false, 1))
        .send()
        .await
        .expect_err("a reset connection has no response");
    assert!(err.status().is_none(), "{err:?}");
    // A TCP reset (RST), not an orderly close: the io error at the bottom says so.
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    let mut kinds = Vec::new();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            kinds.push(io.kind());
        }
        source = e.source();
    }
    assert_eq!(kinds, [std::io::ErrorKind::ConnectionReset], "{err:?}");
    let s = mock.stats().await;
    assert_eq!(s["resets_injected"], 1);
    assert_eq!(s["served"], 0);
    assert_eq!(s["cancelled"], 0);
}

#[tokio::test]
async fn broken_stream_ends_in_a_body_error_without_done() {
    let mock = start(profile(|p| p.fault.break_stream_after = Some(3))).await;
    let r = chat(&mock, &chat_body(true, 10)).await;
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let mut text = Vec::new();
    let mut failed = false;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(b) => text.extend_from_slice(&b),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    let text = String::from_utf8(text).unwrap();
    assert!(failed, "the body must end in an error: {text}");
    assert!(!text.contains("[DONE]"), "{text}");
    assert_eq!(sse_data(&text).len(), 3, "{text}");
    let s = mock.stats().await;
    assert_eq!(s["streams_broken"], 1);
    assert_eq!(s["served"], 0);
    assert_eq!(s["cancelled"], 0);
    assert_eq!(s["in_flight"], 0);
}

#[tokio::test]
async fn break_after_more_events_than_the_stream_has_still_withholds_done() {
    let mock = start(profile(|p| p.fault.break_stream_after = Some(100))).await;
    let r = chat(&mock, &chat_body(true, 2)).await;
    let err = r.text().await;
    assert!(err.is_err(), "{err:?}");
    assert_eq!(mock.stats().await["streams_broken"], 1);
}

#[tokio::test]
async fn stall_delays_the_first_byte_then_serves() {
    let mock = start(profile(|p| {
        p.fault.stall_rate = 1.0;
        p.fault.stall = Duration::from_millis(300);
    }))
    .await;
    let started = Instant::now();
    let r = chat(&mock, &chat_body(false, 1)).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(r.status(), 200);
    let s = mock.stats().await;
    assert_eq!(s["stalls_injected"], 1);
    assert_eq!(s["served"], 1);
}

/// Asserts the 400 a `reject_field` profile answers on an OpenAI endpoint, naming `field`.
async fn expect_unsupported(r: reqwest::Response, field: &str) {
    assert_eq!(r.status(), 400);
    let kind = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(kind.starts_with("application/json"), "{kind}");
    let v: Value = serde_json::from_str(&r.text().await.unwrap()).expect("a JSON body");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(v["error"]["code"], "unsupported_parameter", "{v}");
    assert_eq!(v["error"]["param"], field, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("'{field}'")) && !message.contains('\n'),
        "{message}"
    );
}

#[tokio::test]
async fn reject_field_answers_400_to_requests_using_the_field_and_serves_the_rest() {
    let mock = start(profile(|p| p.fault.reject_field = Some("tools".to_owned()))).await;
    let with_tools = |stream: bool| {
        let mut body = chat_body(stream, 2);
        body["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
        body
    };
    expect_unsupported(chat(&mock, &with_tools(false)).await, "tools").await;
    // A stream that uses the field gets the same plain JSON error, not an event stream.
    expect_unsupported(chat(&mock, &with_tools(true)).await, "tools").await;

    let r = chat(&mock, &chat_body(false, 2)).await;
    assert_eq!(r.status(), 200);
    let mut unset = chat_body(false, 2);
    unset["tools"] = Value::Null;
    assert_eq!(chat(&mock, &unset).await.status(), 200, "null is unset");
    let r = chat(&mock, &chat_body(true, 2)).await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("[DONE]"));

    let s = mock.stats().await;
    assert_eq!(
        (&s["rejected_field"], &s["served"], &s["rejected_invalid"]),
        (&json!(2), &json!(3), &json!(0)),
        "{s}"
    );
    assert_eq!(s["errors_injected"], 0, "{s}");
}

#[tokio::test]
async fn reject_field_applies_to_every_inference_endpoint_in_its_dialect() {
    let mock = start(profile(|p| p.fault.reject_field = Some("seed".to_owned()))).await;
    let user = json!([{"role": "user", "content": "Hello there, mock"}]);
    let openai = [
        ("/v1/chat/completions", chat_body(false, 2)),
        ("/v1/completions", json!({"model": "m", "prompt": "hi"})),
        ("/v1/embeddings", json!({"model": "m", "input": "hi"})),
        ("/v1/responses", json!({"model": "m", "input": "hi"})),
        (
            "/v1/responses/compact",
            json!({"model": "m", "input": "hi"}),
        ),
        (
            "/openai/deployments/m/chat/completions?api-version=2024-10-21",
            json!({"messages": user}),
        ),
    ];
    let anthropic = [
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 2, "messages": user}),
        ),
        (
            "/v1/messages/count_tokens",
            json!({"model": "m", "messages": user}),
        ),
    ];
    for (path, body) in openai.iter().chain(&anthropic) {
        assert_eq!(post(&mock, path, body).await.status(), 200, "{path}");
    }
    let seeded = |body: &Value| {
        let mut body = body.clone();
        body["seed"] = json!(7);
        body
    };
    for (path, body) in &openai {
        expect_unsupported(post(&mock, path, &seeded(body)).await, "seed").await;
    }
    for (path, body) in &anthropic {
        let r = post(&mock, path, &seeded(body)).await;
        assert_eq!(r.status(), 400, "{path}");
        assert!(r.headers().contains_key("request-id"), "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["type"], "error", "{path}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{path}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("'seed'"),
            "{path}: {v}"
        );
    }
    let rejected = openai.len() + anthropic.len();
    assert_eq!(mock.stats().await["rejected_field"], json!(rejected));
}

#[tokio::test]
async fn reject_field_refuses_before_taking_a_generation_slot() {
    let mock = start(profile(|p| {
        p.capacity = 1;
        p.queue = 0;
        p.tokens_per_sec = 5.0;
        p.max_output_tokens = 100;
        p.fault.reject_field = Some("logprobs".to_owned());
    }))
    .await;
    // This stream holds the only slot for about 20 s while the other requests arrive.
    let holding = chat(&mock, &chat_body(true, 100)).await;
    assert_eq!(holding.status(), 200);
    let mut uses_field = chat_body(false, 1);
    uses_field["logprobs"] = json!(true);
    expect_unsupported(chat(&mock, &uses_field).await, "logprobs").await;
    assert_eq!(chat(&mock, &chat_body(false, 1)).await.status(), 429);
    let s = mock.stats().await;
    assert_eq!(
        (&s["rejected_field"], &s["rejected_queue_full"]),
        (&json!(1), &json!(1)),
        "{s}"
    );
    drop(holding);
}

#[tokio::test]
async fn control_sets_and_clears_reject_field() {
    let mock = start(profile(|_| {})).await;
    let c = client();
    let mut body = chat_body(false, 1);
    body["response_format"] = json!({"type": "json_object"});
    assert_eq!(chat(&mock, &body).await.status(), 200);

    let set = json!({"fault": {"reject_field": "response_format"}});
    let r = c
        .patch(mock.url("/control"))
        .json(&set)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let now: Value = r.json().await.unwrap();
    assert_eq!(now["fault"]["reject_field"], "response_format");
    expect_unsupported(chat(&mock, &body).await, "response_format").await;

    let clear = json!({"fault": {"reject_field": null}});
    let r = c
        .patch(mock.url("/control"))
        .json(&clear)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        get_json(&mock.url("/control")).await["fault"]["reject_field"],
        Value::Null
    );
    assert_eq!(chat(&mock, &body).await.status(), 200);

    // PUT sets it too, and an empty name is refused without changing anything.
    let r = c
        .put(mock.url("/control"))
        .json(&json!({"models": ["m"], "fault": {"reject_field": "response_format"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    expect_unsupported(chat(&mock, &body).await, "response_format").await;
    let empty = json!({"fault": {"reject_field": ""}});
    let r = c
        .patch(mock.url("/control"))
        .json(&empty)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("fault.reject_field"),
        "{v}"
    );
    assert_eq!(
        mock.server.profile().fault.reject_field.as_deref(),
        Some("response_format")
    );
    assert_eq!(mock.stats().await["rejected_field"], 2);
}
