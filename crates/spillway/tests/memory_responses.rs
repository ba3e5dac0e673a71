//! The memory bound of docs/admission.md on the response side: backends answering large bodies
//! as fast as loopback carries them, to clients that never read (every byte the gateway may
//! hold per request is held), over HTTP/1 and over HTTP/2, and to clients that read everything
//! (upstream connections read at full speed, then kept for the next request). Each measures
//! the gateway's resident memory (VmRSS) while the flood runs, against its size after a warm-up.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spillway_testkit::http::client;
use support::memory::*;
use support::*;
use tokio::io::AsyncWriteExt;

/// A backend that answers every request with a completion of `max_tokens` KiB, written as fast
/// as its connection takes it, keeping each connection open for the next request.
struct LargeAnswers {
    url: String,
    started: Arc<AtomicU64>,
}

impl LargeAnswers {
    fn start() -> LargeAnswers {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let started = Arc::new(AtomicU64::new(0));
        let count = started.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let count = count.clone();
                std::thread::spawn(move || answer_large(stream, &count));
            }
        });
        LargeAnswers { url, started }
    }
}

fn answer_large(stream: TcpStream, started: &AtomicU64) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    while let Some(body) = read_request(&mut reader) {
        let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let kib = request["max_tokens"].as_u64().unwrap_or(1) as usize;
        let (open, close) = (
            r#"{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":""#,
            r#""},"finish_reason":"stop"}]}"#,
        );
        let content = kib * 1024;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{open}",
            open.len() + content + close.len()
        );
        started.fetch_add(1, Ordering::Relaxed);
        if writer.write_all(head.as_bytes()).is_err() {
            return;
        }
        let piece = vec![b'x'; 64 * 1024];
        let mut left = content;
        while left > 0 {
            let n = left.min(piece.len());
            if writer.write_all(&piece[..n]).is_err() {
                return;
            }
            left -= n;
        }
        if writer.write_all(close.as_bytes()).is_err() {
            return;
        }
    }
}

/// A gateway with `backends` as model `m`'s, and `settings` after its `[server]` lines.
fn gateway_over(server: &str, settings: &str, backends: &[&LargeAnswers]) -> Proc {
    let mut config = format!(
        "{server}\n[health_check]\nenabled = false\n{settings}\n[[models]]\nname = \"m\"\n"
    );
    for (i, b) in backends.iter().enumerate() {
        config += &format!(
            "[[models.backends]]\nname = \"b{i}\"\nregion = \"r\"\nurl = \"{}\"\nmax_concurrency = 1000\nengine = \"none\"\n",
            b.url
        );
    }
    gateway(&config)
}

fn asking(kib: u64) -> serde_json::Value {
    let mut body = chat_body("m", false);
    body["max_tokens"] = kib.into();
    body
}

/// Returns once the flood is stopped.
async fn until_stopped(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Of the flood's 200 requests, how many must reach the backend for its worst case to be in place.
const MOST: u64 = 150;

/// Requests of the flood (after the warm-up's 20) that reached the backend counting `started`.
fn reached(started: &AtomicU64) -> u64 {
    started.load(Ordering::Relaxed).saturating_sub(20)
}

/// At least [`MOST`] of the flood's 200 requests reached `backend`.
fn most_reached(backend: &LargeAnswers, which: &str) {
    let answering = reached(&backend.started);
    assert!(
        answering >= MOST,
        "only {answering} of 200 {which} requests reached the backend"
    );
}

/// The flood runs 5 s, and on a loaded machine on until [`MOST`] of it reached `backend` (at
/// most 60 s): the memory is measured with the worst case in place, not before it is.
fn flood_time(backend: &LargeAnswers) -> ((Duration, Duration), impl Fn() -> bool) {
    let started = backend.started.clone();
    (
        (Duration::from_secs(5), Duration::from_secs(60)),
        move || reached(&started) >= MOST,
    )
}

/// Each in-flight request's response is as large as a stalled client lets the gateway hold: the
/// client sends its request and never reads, so the gateway's write queue to it, the frame in
/// its relay and its upstream connection's read buffer all fill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_within_the_bound_when_clients_never_read_large_answers() {
    let backend = LargeAnswers::start();
    let gw = gateway_over(
        "max_body_bytes = 65536\nmax_connections = 300",
        "[admission]\nmax_in_flight = 200\nmax_buffered_body_bytes = 1048576",
        &[&backend],
    );
    warm_up(&gw, &asking(1)).await;
    let request = {
        let body = serde_json::to_string(&asking(8 * 1024)).unwrap();
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let addr = gw.addr;
    let (times, most) = flood_time(&backend);
    let measured = growth_until(
        &gw,
        times,
        move |stop| {
            (0..200)
                .map(|_| {
                    let (request, stop) = (request.clone(), stop.clone());
                    tokio::spawn(async move {
                        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                        s.write_all(request.as_bytes()).await.unwrap();
                        // Never read: hold the connection until the flood ends.
                        until_stopped(&stop).await;
                    })
                })
                .collect()
        },
        most,
    )
    .await;
    most_reached(&backend, "stalled");
    assert_within(
        "200 clients never reading 8 MiB answers",
        measured,
        bound(MIB, 300, 200),
    );
}

/// The same over HTTP/2: 20 connections of 10 streams each ask for 8 MiB answers and read none,
/// so each stream's send buffer in the gateway fills (the client's windows take 64 KiB a
/// connection), then its relay and its upstream connection's read buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_within_the_bound_when_http2_clients_never_read_large_answers() {
    let backend = LargeAnswers::start();
    let gw = gateway_over(
        "max_body_bytes = 65536\nmax_connections = 30\nhttp2_max_concurrent_streams = 16",
        "[admission]\nmax_in_flight = 200\nmax_buffered_body_bytes = 1048576",
        &[&backend],
    );
    warm_up(&gw, &asking(1)).await;
    let body = serde_json::to_vec(&asking(8 * 1024)).unwrap();
    let addr = gw.addr;
    let (times, most) = flood_time(&backend);
    let measured = growth_until(
        &gw,
        times,
        move |stop| {
            (0..20)
                .map(|_| {
                    let (body, stop) = (body.clone(), stop.clone());
                    tokio::spawn(async move {
                        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
                        let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
                        tokio::spawn(conn);
                        let mut answers = Vec::new();
                        for _ in 0..10 {
                            let Ok(mut ready) = h2.clone().ready().await else {
                                return;
                            };
                            let req = http::Request::post("/v1/chat/completions")
                                .header("authorization", format!("Bearer {KEY}"))
                                .header("content-type", "application/json")
                                .body(())
                                .unwrap();
                            let Ok((answer, mut send)) = ready.send_request(req, false) else {
                                return;
                            };
                            let _ = send.send_data(body.clone().into(), true);
                            answers.push(answer);
                        }
                        // Each answer's head is taken, its body never read, until the flood ends.
                        let mut kept = Vec::new();
                        for answer in answers {
                            if let Ok(r) = answer.await {
                                kept.push(r);
                            }
                        }
                        until_stopped(&stop).await;
                        drop(kept);
                    })
                })
                .collect()
        },
        most,
    )
    .await;
    most_reached(&backend, "unread");
    assert_within(
        "20 HTTP/2 clients of 10 streams never reading 8 MiB answers",
        measured,
        bound_http2(MIB, 30, 16, 200),
    );
}

/// Upstream connections that carried large answers at full speed are kept for the next request:
/// eight backends, each keeping up to 64 of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_within_the_bound_when_kept_connections_carried_large_answers() {
    let backends: Vec<LargeAnswers> = (0..8).map(|_| LargeAnswers::start()).collect();
    let gw = gateway_over(
        "max_body_bytes = 65536\nmax_connections = 300",
        "[upstream]\npool_max_idle_per_host = 64\n\
         [admission]\nmax_in_flight = 256\nmax_buffered_body_bytes = 1048576",
        &backends.iter().collect::<Vec<_>>(),
    );
    warm_up(&gw, &asking(1)).await;
    let url = gw.url("/v1/chat/completions");
    let served = Arc::new(AtomicU64::new(0));
    let counted = served.clone();
    let measured = growth_under(&gw, Duration::from_secs(5), move |stop: Arc<AtomicBool>| {
        (0..256)
            .map(|_| {
                let (url, stop, served) = (url.clone(), stop.clone(), counted.clone());
                tokio::spawn(async move {
                    let c = client();
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(r) = c
                            .post(&url)
                            .bearer_auth(KEY)
                            .json(&asking(1024))
                            .send()
                            .await
                        else {
                            continue;
                        };
                        if r.status() == 200 && r.bytes().await.is_ok() {
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect()
    })
    .await;
    assert!(
        served.load(Ordering::Relaxed) >= 256,
        "only {} answers of 1 MiB were read",
        served.load(Ordering::Relaxed)
    );
    assert_within(
        "256 clients reading 1 MiB answers from 8 backends",
        measured,
        bound(MIB, 300, 256) + kept_bound(8, 64),
    );
}
