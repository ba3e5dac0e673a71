//! No protection harms healthy traffic (G9): each defect found in front of real engines
//! (llama.cpp's server) pinned by a test named after it.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spillway_testkit::eventually;
use spillway_testkit::http::{client, get_json};
use support::*;

/// A backend that behaves like llama.cpp's server with a pooled connection: it answers
/// `Keep-Alive` on the first request of each connection, then reads the second request on that
/// connection and closes it without an answer (the backend never processed it).
struct ClosingBackend {
    url: String,
    answered: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

impl ClosingBackend {
    fn start() -> ClosingBackend {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let answered = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicU64::new(0));
        let (a, d) = (answered.clone(), dropped.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (a, d) = (a.clone(), d.clone());
                std::thread::spawn(move || serve_one_then_close(stream, &a, &d));
            }
        });
        ClosingBackend {
            url,
            answered,
            dropped,
        }
    }
}

fn serve_one_then_close(stream: TcpStream, answered: &AtomicU64, dropped: &AtomicU64) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    if read_request(&mut reader).is_none() {
        return;
    }
    let body = r#"{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nKeep-Alive: timeout=5, max=100\r\n\r\n",
        body.len()
    );
    if writer.write_all(head.as_bytes()).is_err() || writer.write_all(body.as_bytes()).is_err() {
        return;
    }
    answered.fetch_add(1, Ordering::Relaxed);
    if read_request(&mut reader).is_some() {
        dropped.fetch_add(1, Ordering::Relaxed);
    }
    // Dropping both halves closes the connection without an answer.
}

#[tokio::test]
async fn stale_pooled_connections_are_resent_on_a_new_one_without_counting_against_the_backend() {
    let backend = ClosingBackend::start();
    let cfg = format!(
        "[health_check]\nenabled = false\n\n{}engine = \"none\"\n",
        model("m", &[("closer", "default", backend.url.clone())])
    );
    let gw = gateway(&cfg);
    let c = client();
    for i in 0..20 {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&chat_body("m", false))
            .send()
            .await
            .unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 200, "request {i}: {text}");
    }
    assert_eq!(backend.answered.load(Ordering::Relaxed), 20);
    // The closed connections were met (pooled reuse happened) and resent.
    assert!(backend.dropped.load(Ordering::Relaxed) >= 1);
    let page = metrics(&gw).await;
    let stale = sample(
        &page,
        "spillway_upstream_errors_total{model=\"m\",backend=\"closer\",reason=\"stale_connection\"}",
    )
    .unwrap_or(0.0);
    assert!(stale >= 1.0, "no stale connection counted:\n{page}");
    // Not a backend failure: no retry drawn from the budget, no ejection, no connection error.
    assert_eq!(
        sample(&page, "spillway_retries_total").unwrap_or(0.0),
        0.0,
        "{page}"
    );
    assert_eq!(
        sample(&page, "spillway_ejections_total").unwrap_or(0.0),
        0.0,
        "{page}"
    );
    assert_eq!(
        sample(
            &page,
            "spillway_upstream_errors_total{model=\"m\",backend=\"closer\",reason=\"connection\"}"
        )
        .unwrap_or(0.0),
        0.0,
        "{page}"
    );
}

/// A backend that reads each request and closes its connection without an answer, as one
/// crashing under every request would. It counts the requests it read.
fn unanswering_backend() -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let read = Arc::new(AtomicU64::new(0));
    let count = read.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            if read_request(&mut BufReader::new(stream)).is_some() {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    (url, read)
}

#[tokio::test]
async fn a_new_connection_closed_before_its_answer_is_one_failed_attempt_not_a_resend() {
    // Only a kept connection can be stale. A new one that the backend closes without an answer
    // means the backend read the request: sending it again outside the budget would double the
    // load on a backend that fails every request.
    let (url, read) = unanswering_backend();
    let cfg = format!(
        "[health_check]\nenabled = false\n\n[retry]\nmax_attempts = 1\n\n{}engine = \"none\"\n",
        model("m", &[("crashing", "default", url)])
    );
    let gw = gateway(&cfg);
    for i in 0..5 {
        let r = chat(&gw, &chat_body("m", false)).await;
        assert_eq!(r.status(), 502, "request {i}: {}", r.text().await.unwrap());
    }
    assert_eq!(read.load(Ordering::Relaxed), 5, "each request read once");
    let page = metrics(&gw).await;
    assert_eq!(
        sample(
            &page,
            "spillway_upstream_errors_total{model=\"m\",backend=\"crashing\",reason=\"stale_connection\"}"
        )
        .unwrap_or(0.0),
        0.0,
        "{page}"
    );
}

/// A backend that keeps every connection open and answers each request on it: a JSON body of
/// known length, or (for `"stream": true`) a chunked event stream. It counts the connections it
/// accepted, and those the gateway closed.
struct KeepAliveBackend {
    url: String,
    connections: Arc<AtomicU64>,
    closed: Arc<AtomicU64>,
}

impl KeepAliveBackend {
    fn start() -> KeepAliveBackend {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicU64::new(0));
        let closed = Arc::new(AtomicU64::new(0));
        let (count, ends) = (connections.clone(), closed.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                count.fetch_add(1, Ordering::Relaxed);
                let ends = ends.clone();
                std::thread::spawn(move || {
                    answer_every_request(stream);
                    ends.fetch_add(1, Ordering::Relaxed);
                });
            }
        });
        KeepAliveBackend {
            url,
            connections,
            closed,
        }
    }

    /// A gateway with this backend as model `m`'s only one, and `upstream` in `[upstream]`.
    fn gateway(&self, upstream: &str) -> Proc {
        gateway(&format!(
            "[health_check]\nenabled = false\n\n[upstream]\n{upstream}\n\n{}engine = \"none\"\n",
            model("m", &[("kept", "default", self.url.clone())])
        ))
    }
}

fn answer_every_request(stream: TcpStream) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    while let Some(body) = read_request(&mut reader) {
        let stream = String::from_utf8_lossy(&body).contains("\"stream\":true");
        let message = r#"{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;
        let out = if stream {
            let mut out = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n".to_owned();
            for event in [
                r#"data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":null}]}"#,
                "data: [DONE]",
            ] {
                let chunk = format!("{event}\n\n");
                out += &format!("{:x}\r\n{chunk}\r\n", chunk.len());
            }
            out + "0\r\n\r\n"
        } else {
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{message}",
                message.len()
            )
        };
        if writer.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn one_kept_alive_connection_carries_sequential_requests_plain_and_streamed() {
    let backend = KeepAliveBackend::start();
    let gw = backend.gateway("");
    for i in 0..20 {
        let r = chat(&gw, &chat_body("m", i % 2 == 1)).await;
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 200, "request {i}: {text}");
        if i % 2 == 1 {
            assert!(text.contains("[DONE]"), "request {i}: {text}");
        }
    }
    // Each body, of known length or chunked, ended with its connection ready for the next.
    assert_eq!(backend.connections.load(Ordering::Relaxed), 1);
    let page = metrics(&gw).await;
    assert_eq!(
        sample_sum(&page, "spillway_upstream_errors_total"),
        0.0,
        "{page}"
    );
}

#[tokio::test]
async fn an_idle_upstream_connection_is_closed_after_the_pool_idle_timeout() {
    let backend = KeepAliveBackend::start();
    let gw = backend.gateway("pool_idle_timeout = \"300ms\"");
    for stream in [false, true] {
        let r = chat(&gw, &chat_body("m", stream)).await;
        assert_eq!(r.status(), 200);
        r.text().await.unwrap();
    }
    assert_eq!(
        backend.connections.load(Ordering::Relaxed),
        1,
        "kept between the two"
    );
    // No request comes after: the gateway itself closes the connection once it has been idle
    // for the timeout, rather than holding it (and the backend's socket) open.
    eventually(
        Duration::from_secs(10),
        "the idle connection closed",
        || async { backend.closed.load(Ordering::Relaxed) == 1 },
    )
    .await;
    // The next request opens a new one.
    let r = chat(&gw, &chat_body("m", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(backend.connections.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn with_no_idle_connections_kept_each_request_has_a_connection_of_its_own() {
    let backend = KeepAliveBackend::start();
    let gw = backend.gateway("pool_max_idle_per_host = 0");
    for i in 0..4 {
        let r = chat(&gw, &chat_body("m", i % 2 == 1)).await;
        assert_eq!(r.status(), 200);
        r.text().await.unwrap();
    }
    assert_eq!(backend.connections.load(Ordering::Relaxed), 4);
    // Each is closed once its response has been relayed.
    eventually(
        Duration::from_secs(10),
        "every connection closed",
        || async { backend.closed.load(Ordering::Relaxed) == 4 },
    )
    .await;
}

/// A `[[models]]` block whose backends each take `max_concurrency` requests at once.
fn limited_model(name: &str, backends: &[(&str, String)], max_concurrency: u32) -> String {
    let mut s = format!("[[models]]\nname = \"{name}\"\n");
    for (b, url) in backends {
        s += &format!(
            "[[models.backends]]\nname = \"{b}\"\nurl = \"{url}\"\nmax_concurrency = {max_concurrency}\n"
        );
    }
    s
}

#[tokio::test]
async fn overflow_waits_for_a_backend_instead_of_an_instant_503() {
    // One live backend that takes one request at a time (300 ms each), one that is down.
    let live = mock(&["--model", "m", "--ttft", "300ms", "--tokens-per-sec", "0"]);
    let cfg = limited_model(
        "m",
        &[("live", live.url("/v1")), ("dead", closed_port_url())],
        1,
    );
    let gw = gateway(&cfg);
    all_served_at_once(&gw, (0..3).map(|_| chat_body("m", false))).await;
    assert_eq!(chats_received(&live).await, 3);
}

/// A chat body with a system prompt of `system_chars` characters.
fn prompt_body(model: &str, system_chars: usize, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "a".repeat(system_chars)},
            {"role": "user", "content": "Hello there"}
        ],
        "stream": stream,
        "max_tokens": 4,
    })
}

#[tokio::test]
async fn the_adaptive_limit_never_throttles_a_healthy_backend() {
    // A healthy engine with room for all: short and long prompts (a long prompt's prefill makes
    // its first token later), streamed and not, 16 at once. Time to the head varies by orders of
    // magnitude between them; none of that is overload.
    let engine = mock(&[
        "--model",
        "m",
        "--capacity",
        "64",
        "--ttft",
        "1ms",
        "--tokens-per-sec",
        "0",
        "--prefill-tokens-per-sec",
        "20000",
        "--prefix-cache-entries",
        "0",
    ]);
    let cfg = format!(
        "[health_check]\nenabled = false\n\n{}",
        limited_model("m", &[("engine", engine.url("/v1"))], 16)
    );
    let gw = gateway(&cfg);
    let c = client();
    let clients = (0..16).map(|i| {
        let (c, url) = (c.clone(), gw.url("/v1/chat/completions"));
        async move {
            let mut statuses = Vec::new();
            for j in 0..12 {
                let long = (i + j) % 3 == 0;
                let body = prompt_body("m", if long { 8000 } else { 20 }, (i + j) % 2 == 0);
                let r = c
                    .post(&url)
                    .bearer_auth(KEY)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let _ = r.bytes().await;
                statuses.push(status);
            }
            statuses
        }
    });
    let statuses: Vec<u16> = futures_util::future::join_all(clients)
        .await
        .into_iter()
        .flatten()
        .collect();
    let failed: Vec<&u16> = statuses.iter().filter(|s| **s != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        statuses.len()
    );
    let page = metrics(&gw).await;
    assert_eq!(
        sample(
            &page,
            "spillway_backend_concurrency_limit{model=\"m\",backend=\"engine\"}"
        ),
        Some(16.0),
        "{page}"
    );
    let stats = get_json(&engine.url("/stats")).await;
    assert_eq!(stats["rejected_queue_full"], 0);
}

#[tokio::test]
async fn a_backend_crash_fails_its_in_flight_requests_over_to_the_healthy_one() {
    let slow = ["--model", "m", "--ttft", "3s", "--tokens-per-sec", "0"];
    let doomed = mock(&slow);
    let healthy = mock(&["--model", "m", "--ttft", "10ms", "--tokens-per-sec", "0"]);
    let cfg = format!(
        "[health_check]\nenabled = false\n\n{}",
        limited_model(
            "m",
            &[
                ("doomed", doomed.url("/v1")),
                ("healthy", healthy.url("/v1"))
            ],
            64
        )
    );
    let gw = gateway(&cfg);
    let c = client();
    // Six requests in flight at once, about half of them on the backend about to crash.
    let sends: Vec<_> = (0..6)
        .map(|_| {
            let req = c
                .post(gw.url("/v1/chat/completions"))
                .bearer_auth(KEY)
                .json(&chat_body("m", false))
                .send();
            tokio::spawn(req)
        })
        .collect();
    eventually(
        std::time::Duration::from_secs(10),
        "requests in flight on the doomed backend",
        || async {
            get_json(&doomed.url("/stats")).await["in_flight"]
                .as_u64()
                .unwrap_or(0)
                >= 2
        },
    )
    .await;
    drop(doomed); // killed: its connections break before any response byte
    for send in sends {
        let r = send.await.unwrap().unwrap();
        let status = r.status();
        assert_eq!(status, 200, "{}", r.text().await.unwrap());
    }
}

#[tokio::test]
async fn a_refused_backend_credential_is_the_gateways_fault_not_the_callers() {
    let locked = mock_with_env(
        &["--model", "m", "--require-api-key-env", "ENGINE_KEY"],
        &[("ENGINE_KEY", "right-key")],
    );
    let cfg = format!(
        "[health_check]\nenabled = false\n\n{}api_key_env = \"WRONG_ENGINE_KEY\"\n",
        model("m", &[("locked", "default", locked.url("/v1"))])
    );
    let gw = gateway_with_env(&cfg, &[("WRONG_ENGINE_KEY", "wrong-key")]);
    let r = chat(&gw, &chat_body("m", false)).await;
    assert_eq!(r.status(), 502);
    assert_eq!(r.headers()["x-should-retry"], "false");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_auth_failed", "{body}");

    // With a second backend whose key is right, callers are served.
    let open = mock(&["--model", "m"]);
    let cfg = format!(
        "[health_check]\nenabled = false\n\n{}api_key_env = \"WRONG_ENGINE_KEY\"\n[[models.backends]]\nname = \"open\"\nurl = \"{}\"\n",
        model("m", &[("locked", "default", locked.url("/v1"))]),
        open.url("/v1")
    );
    let gw = gateway_with_env(&cfg, &[("WRONG_ENGINE_KEY", "wrong-key")]);
    for _ in 0..10 {
        let r = chat(&gw, &chat_body("m", false)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
}

#[tokio::test]
async fn a_passing_health_check_readmits_a_restarted_backend_before_its_ejection_ends() {
    let first = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let addr = first.addr;
    let other = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    // A long ejection: without the early end the backend would stay out for a minute.
    let cfg = format!(
        "[outlier]\nconsecutive_failures = 1\nbase_ejection = \"60s\"\nmax_ejection = \"120s\"\n[health_check]\ninterval = \"100ms\"\ntimeout = \"100ms\"\n\n{}",
        model(
            "m",
            &[("restarted", "default", first.url("/v1")), ("other", "default", other.url("/v1"))]
        )
    );
    let gw = gateway(&cfg);
    let ejected = "spillway_backend_ejected{model=\"m\",backend=\"restarted\"}";
    drop(first);
    eventually(
        std::time::Duration::from_secs(10),
        "the dead backend ejected",
        || async { sample(&metrics(&gw).await, ejected) == Some(1.0) },
    )
    .await;
    let back = mock_at(
        &addr.to_string(),
        &["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"],
    );
    // Once its health checks pass it takes requests again, long before the minute is over.
    eventually(
        std::time::Duration::from_secs(20),
        "the restarted backend serving",
        || async {
            let r = chat(&gw, &chat_body("m", false)).await;
            assert_eq!(r.status(), 200);
            chats_received(&back).await > 0
        },
    )
    .await;
}

#[tokio::test]
async fn failures_that_happen_together_all_fail_over_within_the_budget() {
    // A proxy in front of a dead engine answers 502 to everything; the healthy backend takes a
    // second per request, so every retry is still running when the next failure comes. The
    // 502s come half a second after each request, so that all eight are in the gateway before
    // the first failure is known, as failures that happen together are; without that pause a
    // slow machine reads the requests one by one, and the pool's adaptive throttling rightly
    // refuses requests to a pool whose every answered attempt has failed.
    let broken = mock(&[
        "--model",
        "m",
        "--error-rate",
        "1",
        "--error-status",
        "502",
        "--stall-rate",
        "1",
        "--stall",
        "500ms",
    ]);
    let healthy = mock(&["--model", "m", "--ttft", "1s", "--tokens-per-sec", "0"]);
    let cfg = format!(
        "[health_check]\nenabled = false\n[outlier]\nenabled = false\n\n{}",
        limited_model(
            "m",
            &[
                ("broken", broken.url("/v1")),
                ("healthy", healthy.url("/v1"))
            ],
            64
        )
    );
    let gw = gateway(&cfg);
    all_served_at_once(&gw, (0..8).map(|_| chat_body("m", false))).await;
    assert!(chats_received(&broken).await >= 1);
}

#[tokio::test]
async fn a_crash_with_the_request_on_the_backend_is_a_retry_drawn_from_the_budget() {
    // The stale-connection resend must not turn a crash into a free failover: the request did
    // reach the crashed backend. With no budget at all, its retry is refused, and says why.
    let doomed = mock(&["--model", "m", "--ttft", "3s", "--tokens-per-sec", "0"]);
    let healthy = mock(&["--model", "m", "--ttft", "10ms", "--tokens-per-sec", "0"]);
    let cfg = format!(
        "[retry]\nbudget_ratio = 0.0\nbudget_min_per_sec = 0.0\n[health_check]\nenabled = false\n\n{}",
        limited_model(
            "m",
            &[("doomed", doomed.url("/v1")), ("healthy", healthy.url("/v1"))],
            64
        )
    );
    let gw = gateway(&cfg);
    let c = client();
    let sends: Vec<_> = (0..6)
        .map(|_| {
            let req = c
                .post(gw.url("/v1/chat/completions"))
                .bearer_auth(KEY)
                .json(&chat_body("m", false))
                .send();
            tokio::spawn(req)
        })
        .collect();
    eventually(
        std::time::Duration::from_secs(10),
        "requests in flight on the doomed backend",
        || async {
            get_json(&doomed.url("/stats")).await["in_flight"]
                .as_u64()
                .unwrap_or(0)
                >= 1
        },
    )
    .await;
    drop(doomed);
    let mut refused = 0;
    for send in sends {
        let r = send.await.unwrap().unwrap();
        if r.status() == 503 {
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "retry_budget_exhausted", "{body}");
            refused += 1;
        } else {
            assert_eq!(r.status(), 200);
        }
    }
    assert!(
        refused >= 1,
        "the crashed backend's requests failed over for free"
    );
}
