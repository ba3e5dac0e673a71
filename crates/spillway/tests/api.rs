//! The OpenAI-compatible API through the gateway against real mock-backend processes.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use futures_util::StreamExt;
use spillway_testkit::eventually;
use spillway_testkit::http::{client, get_json, sse_data};
use support::*;

fn one_backend(mock: &Proc) -> String {
    model("m", &[("b1", "region-a", mock.url("/v1"))])
}

#[tokio::test]
async fn chat_completion_non_streaming() {
    let mock = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let gw = gateway(&one_backend(&mock));
    let r = chat(&gw, &chat_body("m", false)).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-request-id"));
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "m");
    assert!(!v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .is_empty());
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    let stats = get_json(&mock.url("/stats")).await;
    assert_eq!(stats["served"], 1);
    // The caller's key never travels upstream.
    assert_eq!(stats["last_request"]["auth"], "none");
}

#[tokio::test]
async fn chat_completion_streaming_ends_with_done() {
    let mock = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let gw = gateway(&one_backend(&mock));
    let r = chat(&gw, &chat_body("m", true)).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    let events = sse_data(&text);
    assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
    let chunk: serde_json::Value = serde_json::from_str(events[0]).unwrap();
    assert_eq!(chunk["object"], "chat.completion.chunk");
    assert!(events.len() >= 4, "{text}");
}

#[tokio::test]
async fn completions_embeddings_and_models() {
    let mock = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let gw = gateway(&one_backend(&mock));
    let c = client();
    let r = c
        .post(gw.url("/v1/completions"))
        .bearer_auth(KEY)
        .json(&serde_json::json!({"model": "m", "prompt": "Once upon", "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["object"], "text_completion");

    // The SDKs ask for base64 embeddings by default: the field must reach the backend untouched.
    let r = c
        .post(gw.url("/v1/embeddings"))
        .header("api-key", KEY)
        .json(&serde_json::json!({"model": "m", "input": ["a", "b"], "encoding_format": "base64", "x_extra": {"k": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert!(
        v["data"][0]["embedding"].is_string(),
        "base64 embedding expected: {v}"
    );
    let last = &get_json(&mock.url("/stats")).await["last_request"];
    assert_eq!(last["body"]["encoding_format"], "base64");
    assert_eq!(last["body"]["x_extra"]["k"], 1);

    let v: serde_json::Value = c
        .get(gw.url("/v1/models"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "m");
}

#[tokio::test]
async fn first_streamed_chunk_arrives_before_the_backend_finishes() {
    // 20 tokens at 10 tokens/s: the backend needs about two seconds for the whole stream.
    let mock = mock(&[
        "--model",
        "m",
        "--ttft",
        "0ms",
        "--tokens-per-sec",
        "10",
        "--max-output-tokens",
        "20",
    ]);
    let gw = gateway(&one_backend(&mock));
    let mut body = chat_body("m", true);
    body["max_tokens"] = 20.into();
    let r = chat(&gw, &body).await;
    let mut stream = r.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("data: "));
    // The first chunk is here while the backend is still generating this very request.
    let stats = get_json(&mock.url("/stats")).await;
    assert_eq!(stats["in_flight"], 1, "backend already finished: {stats}");
    assert_eq!(stats["served"], 0);
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_request() {
    let mock = mock(&[
        "--model",
        "m",
        "--ttft",
        "0ms",
        "--tokens-per-sec",
        "5",
        "--max-output-tokens",
        "100",
    ]);
    let gw = gateway(&one_backend(&mock));
    let mut body = chat_body("m", true);
    body["max_tokens"] = 100.into();
    let r = chat(&gw, &body).await;
    let mut stream = r.bytes_stream();
    stream.next().await.unwrap().unwrap();
    drop(stream);
    eventually(
        std::time::Duration::from_secs(10),
        "the backend sees the cancellation",
        || async {
            let s = get_json(&mock.url("/stats")).await;
            s["cancelled"] == 1 && s["in_flight"] == 0
        },
    )
    .await;
    // Non-streaming too: the client gives up while the backend is still generating.
    let c = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(300))
        .build()
        .unwrap();
    let err = c
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&chat_body("m", false))
        .send()
        .await;
    assert!(err.is_err());
    eventually(
        std::time::Duration::from_secs(10),
        "the backend sees the second cancellation",
        || async { get_json(&mock.url("/stats")).await["cancelled"] == 2 },
    )
    .await;
}

#[tokio::test]
async fn request_id_is_passed_upstream_and_returned() {
    let mock = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let gw = gateway(&one_backend(&mock));
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-request-id", "req-123")
        .json(&chat_body("m", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "req-123");
    assert_eq!(
        get_json(&mock.url("/stats")).await["last_request"]["request_id"],
        "req-123"
    );
    // Without one, the gateway makes one and the backend sees the same.
    let r = chat(&gw, &chat_body("m", false)).await;
    let id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(id.len(), 32);
    assert_eq!(
        get_json(&mock.url("/stats")).await["last_request"]["request_id"],
        id.as_str()
    );
}

#[tokio::test]
async fn model_name_is_mapped_and_upstream_key_injected() {
    let mock = mock_with_env(
        &[
            "--model",
            "served-name",
            "--ttft",
            "0ms",
            "--tokens-per-sec",
            "0",
            "--require-api-key-env",
            "MOCK_KEY",
        ],
        &[("MOCK_KEY", "upstream-secret")],
    );
    let cfg = format!(
        "[[models]]\nname = \"public-name\"\n[[models.backends]]\nname = \"b\"\nurl = \"{}\"\nupstream_model = \"served-name\"\napi_key_env = \"UPSTREAM_KEY\"\n",
        mock.url("/v1")
    );
    let gw = gateway_with_env(&cfg, &[("UPSTREAM_KEY", "upstream-secret")]);
    let mut body = chat_body("public-name", false);
    body["x_unknown_field"] = serde_json::json!([1, 2]);
    let r = chat(&gw, &body).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let last = &get_json(&mock.url("/stats")).await["last_request"];
    assert_eq!(last["model"], "served-name");
    assert_eq!(last["auth"], "bearer");
    // The backend's own authority, not the gateway's the client named.
    assert_eq!(last["host"], mock.url("").trim_start_matches("http://"));
    assert_eq!(last["body"]["x_unknown_field"], serde_json::json!([1, 2]));
}

#[tokio::test]
async fn azure_backend_gets_deployment_path_api_version_and_api_key() {
    let mock = mock_with_env(
        &[
            "--model",
            "gpt-4o",
            "--ttft",
            "0ms",
            "--tokens-per-sec",
            "0",
            "--require-api-key-env",
            "MOCK_KEY",
        ],
        &[("MOCK_KEY", "azure-secret")],
    );
    let cfg = format!(
        "[[models]]\nname = \"gpt-4o\"\n[[models.backends]]\nname = \"az\"\nkind = \"azure\"\nurl = \"{}\"\napi_version = \"2024-10-21\"\napi_key_env = \"AZ_KEY\"\n",
        mock.url("")
    );
    let gw = gateway_with_env(&cfg, &[("AZ_KEY", "azure-secret")]);
    for (path, body) in [
        ("/v1/chat/completions", chat_body("gpt-4o", false)),
        (
            "/v1/embeddings",
            serde_json::json!({"model": "gpt-4o", "input": "x"}),
        ),
    ] {
        let r = client()
            .post(gw.url(path))
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}: {}", r.text().await.unwrap());
    }
    let last = &get_json(&mock.url("/stats")).await["last_request"];
    assert_eq!(last["path"], "/openai/deployments/gpt-4o/embeddings");
    assert_eq!(last["query"], "api-version=2024-10-21");
    assert_eq!(last["auth"], "api-key");
    assert_eq!(last["host"], mock.url("").trim_start_matches("http://"));
}
