//! The OpenAI-compatible surface: response shapes, errors, Azure paths, keys and `/stats`.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use serde_json::{json, Value};
use spillway_testkit::http::{client, expect_openai_error, get_json, sse_data};
use support::*;

#[tokio::test]
async fn chat_completion_has_the_openai_shape_and_usage() {
    let mock = start(profile(|_| {})).await;
    let r = chat(&mock, &chat_body(false, 5)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "m");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(
        choice["message"]["content"]
            .as_str()
            .unwrap()
            .split(' ')
            .count(),
        5
    );
    assert_eq!(choice["finish_reason"], "length");
    // "Hello there, mock" is 17 characters: 4 prompt tokens.
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9})
    );

    // Without a limit the profile's max_output_tokens applies and the model "stops".
    let mut body = chat_body(false, 0);
    body.as_object_mut().unwrap().remove("max_tokens");
    let v: Value = client()
        .post(mock.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 16);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn text_completions_plain_and_streamed() {
    let mock = start(profile(|_| {})).await;
    let c = client();
    let body = json!({"model": "m", "prompt": "Once upon a time", "max_tokens": 3});
    let v: Value = c
        .post(mock.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "the quick mock");
    assert_eq!(v["usage"]["total_tokens"], 7);

    let body = json!({"model": "m", "prompt": ["a", "b"], "max_tokens": 3, "stream": true,
                      "stream_options": {"include_usage": true}});
    let text = c
        .post(mock.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events = sse_data(&text);
    assert_eq!(events.len(), 3 + 1 + 1 + 1, "{text}");
    let first: Value = serde_json::from_str(events[0]).unwrap();
    assert_eq!(first["object"], "text_completion");
    assert_eq!(first["choices"][0]["text"], "the");
    let finish: Value = serde_json::from_str(events[3]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage: Value = serde_json::from_str(events[4]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert_eq!(events[5], "[DONE]");
}

#[tokio::test]
async fn embeddings_in_float_and_base64_agree() {
    let mock = start(profile(|p| p.embedding_dim = 32)).await;
    let c = client();
    let ask = |format: &'static str, input: Value| {
        let c = c.clone();
        let url = mock.url("/v1/embeddings");
        async move {
            let body = json!({"model": "m", "input": input, "encoding_format": format});
            let r = c.post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }
    };
    let floats = ask("float", json!(["alpha", "beta"])).await;
    assert_eq!(floats["object"], "list");
    assert_eq!(floats["data"].as_array().unwrap().len(), 2);
    assert_eq!(floats["data"][1]["index"], 1);
    let alpha: Vec<f32> = floats["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(alpha.len(), 32);

    let b64 = ask("base64", json!("alpha")).await;
    let bytes = base64_decode(b64["data"][0]["embedding"].as_str().unwrap());
    assert_eq!(bytes.len(), 32 * 4);
    let decoded: Vec<f32> = bytes
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(
        decoded, alpha,
        "the same input gives the same vector in either encoding"
    );
    assert_eq!(b64["usage"]["prompt_tokens"], 1);

    let tokens = ask("float", json!([[1, 2, 3], [4]])).await;
    assert_eq!(tokens["data"].as_array().unwrap().len(), 2);
    assert_eq!(tokens["usage"]["prompt_tokens"], 4);
}

#[tokio::test]
async fn models_lists_the_profile_models() {
    let mock = start(profile(|p| p.models = vec!["a".into(), "b".into()])).await;
    let v = get_json(&mock.url("/v1/models")).await;
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(get_json(&mock.url("/health")).await["status"], "ok");
}

#[tokio::test]
async fn refusals_are_openai_style_errors() {
    let mock = start(profile(|_| {})).await;
    let c = client();
    let chat = mock.url("/v1/chat/completions");
    let mut unknown = chat_body(false, 1);
    unknown["model"] = "nope".into();
    expect_openai_error(
        c.post(&chat).json(&unknown).send().await.unwrap(),
        404,
        "model_not_found",
    )
    .await;
    expect_openai_error(
        c.post(&chat).body("{not json").send().await.unwrap(),
        400,
        "invalid_json",
    )
    .await;
    expect_openai_error(
        c.post(&chat).body("[1]").send().await.unwrap(),
        400,
        "invalid_json",
    )
    .await;
    let no_model = json!({"messages": [{"role": "user", "content": "x"}]});
    expect_openai_error(
        c.post(&chat).json(&no_model).send().await.unwrap(),
        400,
        "invalid_value",
    )
    .await;
    let bad_stream =
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": 1});
    expect_openai_error(
        c.post(&chat).json(&bad_stream).send().await.unwrap(),
        400,
        "invalid_value",
    )
    .await;
    // Sent without a length, so the server finds out by reading: one byte over the 8 MiB cap.
    let chunk = bytes::Bytes::from(vec![b' '; 1024 * 1024]);
    let parts = (0..8)
        .map(move |_| Ok::<_, std::io::Error>(chunk.clone()))
        .chain([Ok(bytes::Bytes::from_static(b" "))]);
    let big = reqwest::Body::wrap_stream(futures_util::stream::iter(parts));
    expect_openai_error(
        c.post(&chat).body(big).send().await.unwrap(),
        413,
        "body_too_large",
    )
    .await;
    expect_openai_error(
        c.put(&chat).send().await.unwrap(),
        405,
        "method_not_allowed",
    )
    .await;
    expect_openai_error(
        c.get(mock.url("/v1/nothing")).send().await.unwrap(),
        404,
        "unknown_url",
    )
    .await;
    let s = mock.stats().await;
    assert_eq!(s["received"], 6, "{s}");
    assert_eq!(s["rejected_invalid"], 6, "{s}");
    assert_eq!(s["served"], 0, "{s}");
    // The oversized request is the last one remembered, without a body.
    assert_eq!(s["last_request"]["body"], Value::Null, "{s}");
}

#[tokio::test]
async fn azure_paths_need_api_version_and_take_the_model_from_the_deployment() {
    let mock = start(profile(|_| {})).await;
    let c = client();
    let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2});
    let r = c
        .post(mock.url("/openai/deployments/m/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 400, "missing_api_version").await;
    let r = c
        .post(mock.url("/openai/deployments/m/chat/completions?api-version=2024-10-21"))
        .header("api-key", "k")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["model"], "m");
    let last = &mock.stats().await["last_request"];
    assert_eq!(last["path"], "/openai/deployments/m/chat/completions");
    assert_eq!(last["query"], "api-version=2024-10-21");
    assert_eq!(last["model"], "m");
    assert_eq!(last["auth"], "api-key");
    let r = c
        .post(mock.url("/openai/deployments/other/embeddings?api-version=1"))
        .json(&json!({"input": "x"}))
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 404, "model_not_found").await;
    let r = c
        .post(mock.url("/openai/deployments/m/embeddings?api-version=1"))
        .json(&json!({"input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn stats_report_what_arrived_and_reset_to_zero() {
    let mock = start(profile(|_| {})).await;
    let c = client();
    let r = c
        .post(mock.url("/v1/chat/completions"))
        .bearer_auth("sk-upstream")
        .header("x-request-id", "req-42")
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "x_vendor": {"k": [1]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    c.post(mock.url("/v1/embeddings"))
        .json(&json!({"model": "m", "input": "x"}))
        .send()
        .await
        .unwrap();
    let s = mock.stats().await;
    assert_eq!(s["received"], 2);
    assert_eq!(s["served"], 2);
    assert_eq!(s["in_flight"], 0);
    assert_eq!(s["queued"], 0);
    assert_eq!(
        s["by_path"],
        json!({"/v1/chat/completions": 1, "/v1/embeddings": 1})
    );
    let last = &s["last_request"];
    assert_eq!(last["path"], "/v1/embeddings");
    assert_eq!(last["auth"], "none");
    assert_eq!(last["request_id"], Value::Null);
    // The handle reports the same counters as the endpoint.
    assert_eq!(serde_json::to_value(mock.server.stats()).unwrap(), s);

    c.post(mock.url("/v1/chat/completions"))
        .bearer_auth("sk-upstream")
        .header("x-request-id", "req-42")
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "x_vendor": {"k": [1]}}))
        .send()
        .await
        .unwrap();
    let last = mock.stats().await["last_request"].clone();
    assert_eq!(last["auth"], "bearer");
    assert_eq!(last["request_id"], "req-42");
    assert_eq!(last["body"]["x_vendor"]["k"], json!([1]));

    let zeroed: Value = c
        .post(mock.url("/stats/reset"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(zeroed["received"], 0);
    assert_eq!(zeroed["served"], 0);
    assert_eq!(zeroed["by_path"], json!({}));
    assert_eq!(zeroed["last_request"], Value::Null);
}

#[tokio::test]
async fn required_key_is_checked_in_either_header() {
    let server =
        spillway_mock::MockServer::new(profile(|_| {})).with_required_key(Some("sk-up".into()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.clone().serve(listener, async {
        let _ = stopped.await;
    }));
    let url = |p: &str| format!("http://{addr}{p}");
    let c = client();
    let chat = url("/v1/chat/completions");
    expect_openai_error(
        c.post(&chat)
            .json(&chat_body(false, 1))
            .send()
            .await
            .unwrap(),
        401,
        "missing_api_key",
    )
    .await;
    expect_openai_error(
        c.post(&chat)
            .bearer_auth("sk-no")
            .json(&chat_body(false, 1))
            .send()
            .await
            .unwrap(),
        401,
        "invalid_api_key",
    )
    .await;
    expect_openai_error(
        c.get(url("/v1/models")).send().await.unwrap(),
        401,
        "missing_api_key",
    )
    .await;
    assert_eq!(
        c.post(&chat)
            .bearer_auth("sk-up")
            .json(&chat_body(false, 1))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.post(&chat)
            .header("api-key", "sk-up")
            .json(&chat_body(false, 1))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.get(url("/v1/models"))
            .bearer_auth("sk-up")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(server.stats().served, 2);

    // Shutdown ends `serve` and the listener with it.
    stop.send(()).unwrap();
    serving.await.unwrap().unwrap();
    assert!(client().get(url("/health")).send().await.is_err());
}

#[tokio::test]
async fn x_api_key_carries_the_key_on_chat_too() {
    let mock = start_with_key(profile(|_| {}), "sk-up").await;
    let c = client();
    let chat = mock.url("/v1/chat/completions");
    let send = |key: &str| {
        c.post(&chat)
            .header("x-api-key", key)
            .json(&chat_body(false, 1))
            .send()
    };
    assert_eq!(send("sk-up").await.unwrap().status(), 200);
    assert_eq!(mock.stats().await["last_request"]["auth"], "x-api-key");
    // A wrong key is refused in OpenAI's shape on an OpenAI path, whichever header it came in.
    let r = send("sk-no").await.unwrap();
    let headers = expect_openai_error(r, 401, "invalid_api_key").await;
    assert!(!headers.contains_key("request-id"));
    let models = c
        .get(mock.url("/v1/models"))
        .header("x-api-key", "sk-up")
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
}
