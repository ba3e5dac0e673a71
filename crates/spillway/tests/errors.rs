//! Every error the gateway produces is an OpenAI-style JSON body with the right status.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use spillway_testkit::eventually;
use spillway_testkit::http::{client, expect_openai_error, get_json, sse_data};
use support::*;

#[tokio::test]
async fn client_errors_have_their_status_and_code() {
    let mock = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    // Keys before the first table land in the harness's [server] table.
    let gw = gateway(&format!(
        "max_body_bytes = 1024\n{}",
        model("m", &[("b", "r", mock.url("/v1"))])
    ));
    let c = client();
    let chat = gw.url("/v1/chat/completions");

    let r = c
        .post(&chat)
        .bearer_auth(KEY)
        .body("{not json")
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 400, "invalid_request").await;
    let r = c
        .post(&chat)
        .bearer_auth(KEY)
        .body(r#"{"messages":[]}"#)
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 400, "invalid_request").await;
    let big = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(4096)}]});
    let r = c
        .post(&chat)
        .bearer_auth(KEY)
        .json(&big)
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 413, "body_too_large").await;
    let r = c
        .post(&chat)
        .bearer_auth(KEY)
        .json(&chat_body("nope", false))
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 404, "model_not_found").await;
    let r = c
        .post(&chat)
        .json(&chat_body("m", false))
        .send()
        .await
        .unwrap();
    let h = expect_openai_error(r, 401, "missing_api_key").await;
    assert_eq!(h["x-should-retry"], "false");
    let r = c
        .post(&chat)
        .bearer_auth("sk-wrong")
        .json(&chat_body("m", false))
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 401, "invalid_api_key").await;
    let r = c
        .post(&chat)
        .bearer_auth(OTHER_KEY)
        .json(&chat_body("m", false))
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 403, "model_not_allowed").await;
    let r = c
        .get(gw.url("/v1/nothing"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 404, "unknown_url").await;
    // GET lists stored chat completions; PUT is no method of this endpoint.
    let r = c.put(&chat).bearer_auth(KEY).send().await.unwrap();
    expect_openai_error(r, 405, "method_not_allowed").await;
    // None of that reached the backend.
    assert_eq!(get_json(&mock.url("/stats")).await["received"], 0);
    // Arbitrary bytes are refused, never crash the gateway.
    for body in [
        &b"\xff\xfe\x00"[..],
        b"{\"model\":",
        b"[[[[[[[[[[",
        b"{\"model\":\"m\",\"stream\":1}",
    ] {
        let r = c
            .post(&chat)
            .bearer_auth(KEY)
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
    }
    assert_eq!(c.get(gw.url("/livez")).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn no_reachable_backend_is_503_with_retry_after() {
    let gw = gateway(&model(
        "m",
        &[
            ("a", "r1", closed_port_url()),
            ("b", "r2", closed_port_url()),
        ],
    ));
    let r = chat(&gw, &chat_body("m", false)).await;
    let h = expect_openai_error(r, 503, "capacity_exhausted").await;
    assert!(h["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    assert!(h.contains_key("retry-after-ms"));
}

#[tokio::test]
async fn backends_at_their_concurrency_limit_give_503() {
    let mock = mock(&[
        "--model",
        "m",
        "--ttft",
        "0ms",
        "--tokens-per-sec",
        "2",
        "--max-output-tokens",
        "100",
    ]);
    let cfg = format!(
        "[[models]]\nname = \"m\"\n[[models.backends]]\nname = \"b\"\nurl = \"{}\"\nmax_concurrency = 1\n",
        mock.url("/v1")
    );
    let gw = gateway(&cfg);
    let mut body = chat_body("m", true);
    body["max_tokens"] = 100.into();
    let held = chat(&gw, &body).await;
    assert_eq!(held.status(), 200);
    let r = chat(&gw, &chat_body("m", false)).await;
    expect_openai_error(r, 503, "capacity_exhausted").await;
    drop(held);
    // Once the held stream is gone, its slot is free again.
    let c = client();
    eventually(Duration::from_secs(10), "the slot is released", || async {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&chat_body("m", false))
            .send()
            .await
            .unwrap();
        r.status() == 200
    })
    .await;
}

#[tokio::test]
async fn upstream_that_does_not_answer_in_time_is_504() {
    let mock = mock(&["--model", "m", "--stall-rate", "1", "--stall", "20s"]);
    let gw = gateway(&format!(
        "[upstream]\nresponse_timeout = \"300ms\"\n{}",
        model("m", &[("b", "r", mock.url("/v1"))])
    ));
    let r = chat(&gw, &chat_body("m", false)).await;
    expect_openai_error(r, 504, "upstream_timeout").await;
}

/// An upstream connection keeps one deadline timer for its requests: a backend that answered on
/// it and then stops answering is still cut off at `response_timeout`, request after request.
#[tokio::test]
async fn a_kept_connections_backend_that_stops_answering_is_504_at_the_response_timeout() {
    let mock = mock(&["--model", "m", "--stall-rate", "0", "--stall", "20s"]);
    let gw = gateway(&format!(
        "[upstream]\nresponse_timeout = \"300ms\"\n[retry]\nmax_attempts = 1\nthrottle_k = 0\n\
         [outlier]\nenabled = false\n{}",
        model("m", &[("b", "r", mock.url("/v1"))])
    ));
    for _ in 0..3 {
        let r = chat(&gw, &chat_body("m", false)).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    control(&mock, serde_json::json!({"fault": {"stall_rate": 1.0}})).await;
    for _ in 0..2 {
        let r = chat(&gw, &chat_body("m", false)).await;
        expect_openai_error(r, 504, "upstream_timeout").await;
    }
    assert_eq!(chats_received(&mock).await, 5);
}

#[tokio::test]
async fn a_timeout_after_retries_reports_every_attempt_and_the_time_spent_in_all() {
    let mock = mock(&["--model", "m", "--stall-rate", "1", "--stall", "20s"]);
    let backends: Vec<_> = ["b1", "b2", "b3"]
        .iter()
        .map(|b| (*b, "r", mock.url("/v1")))
        .collect();
    let gw = gateway(&format!(
        "[upstream]\nresponse_timeout = \"300ms\"\n[retry]\nmax_attempts = 3\nbudget_ratio = 1.0\n\
         budget_min_per_sec = 10\nthrottle_k = 0\n[outlier]\nenabled = false\n{}",
        model("m", &backends)
    ));
    let r = chat(&gw, &chat_body("m", false)).await;
    assert_eq!(r.status(), 504);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_timeout", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert_eq!(chats_received(&mock).await, 3, "{message}");
    // What happened: three attempts and the time they took together, not one attempt's timeout
    // given as if it were the whole wait.
    assert!(message.contains("3 attempts in "), "{message}");
    let total = message
        .split("3 attempts in ")
        .nth(1)
        .and_then(|rest| rest.split('s').next())
        .and_then(|secs| secs.parse::<f64>().ok());
    assert!(total.is_some(), "no total time in: {message}");
    assert!(message.contains("each allowed at most 300ms"), "{message}");
}

#[tokio::test]
async fn broken_stream_ends_with_an_error_event_and_no_done() {
    let mock = mock(&[
        "--model",
        "m",
        "--ttft",
        "0ms",
        "--tokens-per-sec",
        "0",
        "--break-stream-after",
        "3",
    ]);
    let gw = gateway(&model("m", &[("b", "r", mock.url("/v1"))]));
    let r = chat(&gw, &chat_body("m", true)).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(!text.contains("[DONE]"), "{text}");
    assert!(text.contains("event: error"), "{text}");
    let error_line = *sse_data(&text).last().unwrap();
    let v: serde_json::Value = serde_json::from_str(error_line).unwrap();
    assert_eq!(v["error"]["code"], "upstream_unavailable");
    let metrics = metrics(&gw).await;
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("spillway_streams_broken_total{")
                && l.contains("reason=\"upstream_error\"")
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(line.ends_with(" 1"), "{line}");
}

#[tokio::test]
async fn a_made_up_model_name_is_not_echoed_whole() {
    let m = mock(&["--model", "m"]);
    let gw = gateway(&model("m", &[("a", "default", m.url("/v1"))]));
    let name = "é".repeat(200_000);
    let r = chat(&gw, &serde_json::json!({"model": name, "messages": []})).await;
    assert_eq!(r.status(), 404);
    let body = r.text().await.unwrap();
    assert!(body.len() < 1024, "{} bytes came back", body.len());
    assert!(body.contains("model_not_found"), "{body}");
}

#[tokio::test]
async fn a_key_with_non_ascii_characters_is_invalid_not_missing() {
    let mock = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let gw = gateway(&model("m", &[("b", "r", mock.url("/v1"))]));
    let c = client();
    // "sk-tést" as UTF-8 bytes: a header value HTTP allows but that is not text.
    let bearer = reqwest::header::HeaderValue::from_bytes(b"Bearer sk-t\xc3\xa9st").unwrap();
    let azure = reqwest::header::HeaderValue::from_bytes(b"sk-t\xc3\xa9st").unwrap();
    for (name, value) in [("authorization", bearer), ("api-key", azure)] {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .header(name, value)
            .json(&chat_body("m", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{name}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key", "{name}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(!message.contains("no API key"), "{name}: {message}");
    }
}
