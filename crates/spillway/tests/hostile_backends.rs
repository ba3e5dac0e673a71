//! Backends that answer outside HTTP/1.1's framing, by fault or on purpose: what they send never
//! reaches another caller, never leaves a connection in an unknown state for the next request,
//! and never passes for a complete answer when it was cut short.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spillway_testkit::eventually;
use support::*;

/// What the backend writes for request number `n` (counted from 0 over all connections), and
/// what it writes afterwards on the same connection while it is idle (nothing: it closes it).
type Script = fn(u64) -> (Vec<u8>, Option<Vec<u8>>);

/// A backend that answers each request as its script says.
struct Scripted {
    url: String,
    connections: Arc<AtomicU64>,
    /// Set once an "afterwards" write has been made.
    wrote_after: Arc<AtomicBool>,
}

impl Scripted {
    fn start(script: Script) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicU64::new(0));
        let wrote_after = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicU64::new(0));
        let (count, after) = (connections.clone(), wrote_after.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                count.fetch_add(1, Ordering::Relaxed);
                let (requests, after) = (requests.clone(), after.clone());
                std::thread::spawn(move || serve(stream, script, &requests, &after));
            }
        });
        Scripted {
            url,
            connections,
            wrote_after,
        }
    }

    fn gateway(&self) -> Proc {
        gateway(&format!(
            "[health_check]\nenabled = false\n[retry]\nmax_attempts = 1\n{}engine = \"none\"\n",
            model("m", &[("b", "r", self.url.clone())])
        ))
    }
}

fn serve(stream: TcpStream, script: Script, requests: &AtomicU64, after: &AtomicBool) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    while read_request(&mut reader).is_some() {
        let (answer, later) = script(requests.fetch_add(1, Ordering::Relaxed));
        if writer.write_all(&answer).is_err() {
            return;
        }
        match later {
            // Nothing more: the connection closes.
            Some(later) if later.is_empty() => return,
            Some(later) => {
                std::thread::sleep(Duration::from_millis(20));
                let _ = writer.write_all(&later);
                after.store(true, Ordering::Relaxed);
            }
            None => {}
        }
    }
}

/// A complete chat completion saying `content`.
fn completion(content: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"{content}"}},"finish_reason":"stop"}}]}}"#
    );
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn content_of(gw: &Proc) -> String {
    let r = chat(gw, &chat_body("m", false)).await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Response splitting: the first answer carries a second one after its end. Read as the answer
/// to the next request on that connection, it would hand one caller's answer to another.
#[tokio::test]
async fn bytes_after_an_answers_end_never_become_the_next_callers_answer() {
    let backend = Scripted::start(|n| match n {
        0 => ([completion("first"), completion("smuggled")].concat(), None),
        _ => (completion("honest"), None),
    });
    let gw = backend.gateway();
    assert_eq!(content_of(&gw).await, "first");
    for _ in 0..3 {
        assert_eq!(content_of(&gw).await, "honest");
    }
    assert_eq!(
        backend.connections.load(Ordering::Relaxed),
        2,
        "the first connection was not reused"
    );
}

/// The same, with the unasked answer sent while the connection is idle.
#[tokio::test]
async fn bytes_sent_on_an_idle_connection_close_it() {
    let backend = Scripted::start(|n| match n {
        0 => (completion("first"), Some(completion("smuggled"))),
        _ => (completion("honest"), None),
    });
    let gw = backend.gateway();
    assert_eq!(content_of(&gw).await, "first");
    let after = backend.wrote_after.clone();
    eventually(Duration::from_secs(5), "the unasked answer written", || {
        let after = after.clone();
        async move { after.load(Ordering::Relaxed) }
    })
    .await;
    assert_eq!(content_of(&gw).await, "honest");
    assert_eq!(backend.connections.load(Ordering::Relaxed), 2);
}

/// A stream the backend breaks off mid-body is not passed on as a complete one.
#[tokio::test]
async fn a_stream_cut_short_by_the_backend_ends_with_an_error_not_done() {
    let backend = Scripted::start(|_| {
        let event = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"par\"},\"finish_reason\":null}]}\n\n";
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
            event.len()
        );
        // Then the connection closes, before the last chunk.
        (answer.into_bytes(), Some(Vec::new()))
    });
    let gw = backend.gateway();
    let r = chat(&gw, &chat_body("m", true)).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap_or_default();
    assert!(text.contains("par"), "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    assert!(text.contains("error"), "a final error event: {text}");
}

/// Heads that do not frame a body (two lengths), do not fit in a connection's read buffer
/// (16 KiB), or whose `Connection` header names more headers than the gateway reads (16), fail
/// the attempt with the API's own error, at once.
#[tokio::test]
async fn a_head_with_conflicting_lengths_too_large_or_naming_too_many_is_a_502() {
    for script in [
        (|_| {
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}".to_vec(),
                None,
            )
        }) as Script,
        |_| {
            let head = format!(
                "HTTP/1.1 200 OK\r\nx-padding: {}\r\ncontent-length: 2\r\n\r\n{{}}",
                "p".repeat(20 * 1024)
            );
            (head.into_bytes(), None)
        },
        |_| {
            let names = vec!["x-a"; 17].join(",");
            let answer = String::from_utf8(completion("ok")).unwrap().replacen(
                "\r\n",
                &format!("\r\nconnection: {names}\r\n"),
                1,
            );
            (answer.into_bytes(), None)
        },
    ] {
        let backend = Scripted::start(script);
        let gw = backend.gateway();
        let r = chat(&gw, &chat_body("m", false)).await;
        let status = r.status();
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(status, 502, "{body}");
        assert!(body["error"]["message"].is_string(), "{body}");
    }
}

/// A stored object's body that stalls mid-way is cut off after `upstream.stream_idle_timeout`,
/// not held until the client leaves.
#[tokio::test]
async fn a_stored_objects_body_that_stalls_is_cut_off() {
    let backend = Scripted::start(|n| {
        match n {
        0 => {
            let body = r#"{"id":"resp_stall","object":"response","created_at":0,"status":"completed","model":"m","output":[],"usage":{"input_tokens":1,"output_tokens":1,"total_tokens":2}}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            (head.into_bytes(), None)
        }
        // 10 bytes of 1000, then nothing, the connection held open.
        _ => (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"id\":\"re"
                .to_vec(),
            None,
        ),
    }
    });
    let gw = gateway(&format!(
        "[health_check]\nenabled = false\n[upstream]\nstream_idle_timeout = \"300ms\"\n{}engine = \"none\"\n",
        model("m", &[("b", "r", backend.url.clone())])
    ));
    let c = spillway_testkit::http::client();
    let created = c
        .post(gw.url("/v1/responses"))
        .bearer_auth(KEY)
        .json(&serde_json::json!({"model": "m", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 200);
    created.bytes().await.unwrap();
    let r = c
        .get(gw.url("/v1/responses/resp_stall"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(20), r.bytes())
        .await
        .expect("cut off, not held until the client leaves");
    assert!(body.is_err(), "a truncated body, not a short valid one");
}

/// A backend's answer loses the headers its `Connection` header nominates.
#[tokio::test]
async fn an_answers_connection_header_takes_what_it_nominates_along() {
    let backend = Scripted::start(|_| {
        let answer = String::from_utf8(completion("ok")).unwrap().replacen(
            "\r\n",
            "\r\nconnection: X-Backend-Hop\r\nx-backend-hop: s\r\nx-kept: k\r\n",
            1,
        );
        (answer.into_bytes(), None)
    });
    let gw = backend.gateway();
    let r = chat(&gw, &chat_body("m", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-kept"], "k");
    assert!(!r.headers().contains_key("x-backend-hop"), "{r:?}");
}
