//! A mock server on 127.0.0.1:0 per test, and the requests the tests send it; real HTTP
//! clients and polling with a deadline come from `spillway-testkit`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use spillway_mock::{MockProfile, MockServer};
use spillway_testkit::http::{client, get_json};

/// A running mock server and its address.
pub struct Mock {
    pub addr: SocketAddr,
    pub server: MockServer,
}

impl Mock {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn stats(&self) -> Value {
        get_json(&self.url("/stats")).await
    }
}

/// A fast, healthy profile for model `m`, changed by `edit`.
pub fn profile(edit: impl FnOnce(&mut MockProfile)) -> MockProfile {
    let mut p = MockProfile {
        models: vec!["m".to_owned()],
        ttft: Duration::ZERO,
        tokens_per_sec: 0.0,
        ..MockProfile::default()
    };
    edit(&mut p);
    assert!(p.problems().is_empty(), "{:?}", p.problems());
    p
}

pub async fn start(profile: MockProfile) -> Mock {
    let (addr, server) = spillway_mock::spawn(profile, ([127, 0, 0, 1], 0).into())
        .await
        .expect("mock server binds");
    Mock { addr, server }
}

/// A mock that requires `key` of its clients, served until the runtime shuts down.
pub async fn start_with_key(profile: MockProfile, key: &str) -> Mock {
    let server = MockServer::new(profile).with_required_key(Some(key.to_owned()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server.clone().serve(listener, std::future::pending()));
    Mock { addr, server }
}

/// Posts `body` to `path` on the mock.
pub async fn post(mock: &Mock, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(mock.url(path))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// A streamed body read to its end: its text, and whether it ended in an error rather than
/// in order.
pub async fn read_stream(r: reqwest::Response) -> (String, bool) {
    let mut stream = r.bytes_stream();
    let mut bytes = Vec::new();
    let mut failed = false;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(b) => bytes.extend_from_slice(&b),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    (String::from_utf8(bytes).unwrap(), failed)
}

/// The events of a stream whose events are named (`event: NAME` then `data: JSON`), in order;
/// panics on any other line, so a stray `data: [DONE]` or an unnamed event fails the test.
pub fn named_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|block| !block.is_empty())
        .map(|block| {
            let mut lines = block.lines();
            let (Some(name), Some(data), None) = (
                lines.next().and_then(|l| l.strip_prefix("event: ")),
                lines.next().and_then(|l| l.strip_prefix("data: ")),
                lines.next(),
            ) else {
                panic!("not one named event: {block:?} in {text}");
            };
            let data: Value = serde_json::from_str(data)
                .unwrap_or_else(|e| panic!("data is not JSON ({e}): {block:?}"));
            (name.to_owned(), data)
        })
        .collect()
}

/// The names of `events`, in order.
pub fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(n, _)| n.as_str()).collect()
}

/// Posts `body` to the mock's chat completions endpoint.
pub async fn chat(mock: &Mock, body: &Value) -> reqwest::Response {
    client()
        .post(mock.url("/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap()
}

pub fn chat_body(stream: bool, max_tokens: u32) -> Value {
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": "Hello there, mock"}],
        "stream": stream,
        "max_tokens": max_tokens,
    })
}

/// Standard base64 with padding, as the OpenAI SDKs decode embeddings.
pub fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::new();
    for group in s.as_bytes().chunks(4) {
        let data: Vec<u8> = group
            .iter()
            .copied()
            .filter(|&c| c != b'=')
            .map(value)
            .collect();
        let n = data
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &v)| n | u32::from(v) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..data.len()]);
    }
    out
}
