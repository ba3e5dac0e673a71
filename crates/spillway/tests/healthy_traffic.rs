//! No protection harms healthy traffic (G9): each defect found in front of real engines
//! (llama.cpp's server) pinned by a test named after it.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

/// Reads one HTTP/1.1 request (head and Content-Length body); `None` at end of stream.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<()> {
    let mut length = 0usize;
    let mut first = true;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" && !first {
            break;
        }
        first = false;
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(())
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
        "[health_check]\nenabled = false\n\n{}",
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
    let c = client();
    let sends = (0..3).map(|_| {
        c.post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&chat_body("m", false))
            .send()
    });
    for r in futures_util::future::join_all(sends).await {
        let r = r.unwrap();
        let status = r.status();
        assert_eq!(status, 200, "{}", r.text().await.unwrap());
    }
    assert_eq!(chats_received(&live).await, 3);
}
