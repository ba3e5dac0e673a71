//! The memory bound of docs/admission.md, held by a real gateway process under each kind of
//! flood that broke an earlier formula: many clients, one tenant's many connections with large
//! bodies, HTTP/2 streams stalled mid-body, connections opened and closed as fast as possible,
//! and bodies the size of the cap. Each measures the gateway's resident memory (VmRSS) while the
//! flood runs, against its size after a warm-up.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spillway_testkit::eventually;
use spillway_testkit::http::client;
use support::memory::*;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A backend slow enough that requests pile up in it: 300 ms to its first token.
fn slow_mock() -> Proc {
    mock(&[
        "--model",
        "m",
        "--ttft",
        "300ms",
        "--tokens-per-sec",
        "0",
        "--capacity",
        "64",
    ])
}

/// A gateway in front of a backend slow enough that requests pile up in it.
fn slow_gateway(server: &str, admission: &str, tenant_limits: &str) -> (Proc, Proc) {
    let slow = slow_mock();
    let gw = gateway_with_env(
        &format!(
            "{server}\n[admission]\n{admission}\n[[models]]\nname = \"m\"\n\
             [[models.backends]]\nname = \"b\"\nregion = \"r\"\nurl = \"{}\"\nmax_concurrency = 20\n\
             [[tenants]]\nname = \"limited\"\nkeys = [{{ env = \"LIMITED_KEY\" }}]\n{tenant_limits}\n",
            slow.url("/v1")
        ),
        &[("LIMITED_KEY", "limited-key")],
    );
    (gw, slow)
}

/// `clients` clients, each posting `body` as tenant-a as fast as it is answered until stopped,
/// counting the answers that are 200 in `served`.
fn posting_clients(
    clients: usize,
    url: String,
    body: Vec<u8>,
    served: Arc<AtomicU64>,
) -> impl FnOnce(Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>> {
    move |stop| {
        (0..clients)
            .map(|_| {
                let (url, body, stop) = (url.clone(), body.clone(), stop.clone());
                let served = served.clone();
                tokio::spawn(async move {
                    let c = client();
                    while !stop.load(Ordering::Relaxed) {
                        let sent = c
                            .post(&url)
                            .bearer_auth(KEY)
                            .header("content-type", "application/json")
                            .body(body.clone())
                            .send()
                            .await;
                        if sent.is_ok_and(|r| r.status() == 200) {
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect()
    }
}

fn body_of(bytes: usize) -> serde_json::Value {
    let mut body = chat_body("m", false);
    body["messages"][0]["content"] = "x".repeat(bytes).into();
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_within_the_bound_under_a_flood_of_clients() {
    let (gw, _slow) = slow_gateway(
        "max_body_bytes = 65536\nmax_connections = 300",
        "max_in_flight = 100\nmax_buffered_body_bytes = 1048576",
        "",
    );
    let body = body_of(8 * 1024);
    warm_up(&gw, &body).await;
    let url = gw.url("/v1/chat/completions");
    let flood = posting_clients(600, url, serde_json::to_vec(&body).unwrap(), Arc::default());
    let measured = growth_under(&gw, Duration::from_secs(4), flood).await;
    let m = metrics(&gw).await;
    assert!(
        sample_sum(
            &m,
            "spillway_client_connections_closed_total{listener=\"api\",reason=\"over_capacity\"}"
        ) > 0.0,
        "600 clients never passed the cap of 300 connections: {m}"
    );
    assert_within("600 clients", measured, bound(MIB, 300, 100));
}

/// IL-0110's shape: one tenant opens a thousand connections, each sending a 100 KB body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_within_the_bound_when_one_tenant_sends_large_bodies_on_many_connections() {
    let (gw, _slow) = slow_gateway(
        "max_body_bytes = 1048576\nmax_connections = 1000",
        "max_in_flight = 200\nmax_buffered_body_bytes = 16777216",
        "",
    );
    let body = body_of(100 * 1000);
    warm_up(&gw, &body).await;
    let url = gw.url("/v1/chat/completions");
    let flood = posting_clients(
        1000,
        url,
        serde_json::to_vec(&body).unwrap(),
        Arc::default(),
    );
    let measured = growth_under(&gw, Duration::from_secs(5), flood).await;
    assert_within(
        "1000 connections, 100 KB bodies",
        measured,
        bound(16 * MIB, 1000, 200),
    );
}

/// Requests whose bodies never finish arriving, over HTTP/2 (many streams on few connections)
/// from a tenant allowed 4 at a time: beyond its 4, each is refused at its head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_within_the_bound_under_stalled_http2_streams() {
    let (gw, _slow) = slow_gateway(
        "max_body_bytes = 1048576\nmax_connections = 50",
        "max_in_flight = 200\nmax_buffered_body_bytes = 16777216",
        "max_concurrency = 4",
    );
    warm_up(&gw, &body_of(1000)).await;
    let addr = gw.addr;
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = refused.clone();
    let measured = growth_under(&gw, Duration::from_secs(6), move |stop| {
        (0..50)
            .map(|_| {
                let (stop, refused) = (stop.clone(), counted.clone());
                tokio::spawn(async move {
                    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
                    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
                    tokio::spawn(conn);
                    let mut open = Vec::new();
                    // 400 streams per connection at most, 20,000 in all.
                    for _ in 0..400 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        // h2's futures do not yield to the runtime on their own.
                        tokio::task::yield_now().await;
                        let Ok(mut ready) = h2.clone().ready().await else {
                            return;
                        };
                        let req = http::Request::post("/v1/chat/completions")
                            .header("authorization", "Bearer limited-key")
                            .header("content-type", "application/json")
                            .header("content-length", "100000")
                            .body(())
                            .unwrap();
                        let Ok((answer, mut send)) = ready.send_request(req, false) else {
                            return;
                        };
                        let _ = send.send_data(vec![b' '; 10_000].into(), false);
                        let refused = refused.clone();
                        // The stream stays open, its body unfinished, until the test ends.
                        open.push(send);
                        tokio::spawn(async move {
                            if let Ok(r) = answer.await {
                                if r.status() == 429 {
                                    refused.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        });
                    }
                    // The streams stay open, bodies unfinished, until the flood is stopped.
                    std::future::pending::<()>().await;
                    drop(open);
                })
            })
            .collect()
    })
    .await;
    assert!(
        refused.load(Ordering::Relaxed) > 100,
        "streams beyond the tenant's 4 were not refused at their heads"
    );
    assert_within(
        "stalled HTTP/2 streams",
        measured,
        bound_http2(16 * MIB, 50, 100, 200),
    );
}

/// Connections opened, used once and closed, as fast as 200 clients can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_within_the_bound_under_connection_churn() {
    let (gw, _slow) = slow_gateway(
        "max_body_bytes = 65536\nmax_connections = 300",
        "max_in_flight = 100\nmax_buffered_body_bytes = 1048576",
        "",
    );
    warm_up(&gw, &body_of(1000)).await;
    let addr = gw.addr;
    let measured = growth_under(&gw, Duration::from_secs(4), move |stop| {
        (0..200)
            .map(|_| {
                let stop = stop.clone();
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
                            continue;
                        };
                        let _ = s
                            .write_all(
                                b"GET /livez HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
                            )
                            .await;
                        let mut sink = Vec::new();
                        let _ = s.read_to_end(&mut sink).await;
                    }
                })
            })
            .collect()
    })
    .await;
    assert_within("connection churn", measured, bound(MIB, 300, 100));
}

/// Bodies of the cap's size, from more clients than the body budget holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_within_the_bound_under_bodies_the_size_of_the_cap() {
    let (gw, _slow) = slow_gateway(
        "max_body_bytes = 4194304\nmax_connections = 100",
        "max_in_flight = 50\nmax_buffered_body_bytes = 33554432\nmax_buffered_body_bytes_per_tenant = 33554432",
        "",
    );
    warm_up(&gw, &body_of(1000)).await;
    let body = serde_json::to_vec(&body_of(4 * 1024 * 1024 - 200)).unwrap();
    let url = gw.url("/v1/chat/completions");
    let served = Arc::new(AtomicU64::new(0));
    let flood = posting_clients(40, url, body, served.clone());
    let measured = growth_under(&gw, Duration::from_secs(5), flood).await;
    assert_within("4 MiB bodies", measured, bound(32 * MIB, 100, 50));
    assert!(served.load(Ordering::Relaxed) > 0, "no request was served");
    given_back(&gw).await;
}

/// Bodies of the cap's size to a backend that knows the model by another name: each attempt
/// sends a rewritten copy, which is counted in the body budget as the body is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_within_the_bound_when_every_body_is_rewritten_for_its_backend() {
    let slow = slow_mock();
    let (gw, measured, served) = rewritten_flood(&[&slow], true).await;
    assert_within(
        "4 MiB bodies, rewritten",
        measured,
        bound(32 * MIB, 100, 50),
    );
    assert!(served > 0, "no request was served");
    given_back(&gw).await;
}

/// The same with every backend failing at once (503), so that each call retries on the
/// other: every attempt sends a copy of its own, one after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_within_the_bound_when_rewritten_bodies_meet_failing_backends() {
    let failing = || mock(&["--model", "m", "--error-rate", "1", "--error-status", "503"]);
    let (a, b) = (failing(), failing());
    let (gw, measured, _) = rewritten_flood(&[&a, &b], false).await;
    assert_within(
        "4 MiB bodies, rewritten, every backend failing",
        measured,
        bound(32 * MIB, 100, 50),
    );
    assert!(
        chats_received(&a).await + chats_received(&b).await > 0,
        "no body reached a backend"
    );
    given_back(&gw).await;
}

/// A gateway whose model `alias` is served by `backends`, each knowing it as `m`, under 40
/// clients sending 4 MiB bodies for 5 s: the gateway, its growth, and the answers that were 200.
/// `until_served`: the flood goes on past its 5 s (at most to 30 s) until an answer has come
/// back, so that a loaded machine cannot make it measure a flood nothing got through.
async fn rewritten_flood(backends: &[&Proc], until_served: bool) -> (Proc, (u64, u64), u64) {
    let mut config = "max_body_bytes = 4194304\nmax_connections = 100\n\
         [admission]\nmax_in_flight = 50\nmax_buffered_body_bytes = 33554432\n\
         max_buffered_body_bytes_per_tenant = 33554432\n\
         [[models]]\nname = \"alias\"\n"
        .to_owned();
    for (i, b) in backends.iter().enumerate() {
        config += &format!(
            "[[models.backends]]\nname = \"b{i}\"\nregion = \"r\"\nurl = \"{}\"\n\
             upstream_model = \"m\"\nmax_concurrency = 20\n",
            b.url("/v1")
        );
    }
    let gw = gateway(&config);
    let mut small = body_of(1000);
    small["model"] = "alias".into();
    // The allocator's and the runtime's pools exist before the baseline is read (the
    // answers may be failures).
    futures_util::future::join_all((0..20).map(|_| chat(&gw, &small))).await;
    let mut body = body_of(4 * 1024 * 1024 - 200);
    body["model"] = "alias".into();
    let served = Arc::new(AtomicU64::new(0));
    let flood = posting_clients(
        40,
        gw.url("/v1/chat/completions"),
        serde_json::to_vec(&body).unwrap(),
        served.clone(),
    );
    let counted = served.clone();
    let measured = growth_until(
        &gw,
        (Duration::from_secs(5), Duration::from_secs(30)),
        flood,
        move || !until_served || counted.load(Ordering::Relaxed) > 0,
    )
    .await;
    let served = served.load(Ordering::Relaxed);
    (gw, measured, served)
}

/// Once the clients are gone, every byte of body they held is given back to the budget.
async fn given_back(gw: &Proc) {
    eventually(
        Duration::from_secs(10),
        "the body budget to be all given back",
        || async { sample(&metrics(gw).await, "spillway_buffered_body_bytes ") == Some(0.0) },
    )
    .await;
}

/// Clients that declare large bodies and stall after a few bytes: the budget counts what they
/// declared, but the gateway holds only what they sent (a large body's pages become resident
/// as its bytes arrive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_at_what_stalled_large_bodies_sent_not_what_they_declared() {
    const CLIENTS: u64 = 40;
    const DECLARED: u64 = 1_000_000;
    let (gw, _slow) = slow_gateway(
        "max_body_bytes = 1048576\nmax_connections = 100\nbody_read_timeout = \"1h\"",
        "max_in_flight = 100\nmax_buffered_body_bytes = 67108864\n\
         max_buffered_body_bytes_per_tenant = 67108864",
        "",
    );
    warm_up(&gw, &body_of(1000)).await;
    let baseline = rss_bytes(gw.pid());
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n\
             content-type: application/json\r\ncontent-length: {DECLARED}\r\n\r\n{{\"model\":\"m\","
        );
        s.write_all(head.as_bytes()).await.unwrap();
        clients.push(s);
    }
    let gauge = "spillway_buffered_body_bytes ";
    eventually(
        Duration::from_secs(10),
        "every declared body counted",
        || async { sample(&metrics(&gw).await, gauge) == Some((CLIENTS * DECLARED) as f64) },
    )
    .await;
    // A second piece, read as a frame of its own: the body is now being put together.
    for s in &mut clients {
        s.write_all(&[b' '; 1000]).await.unwrap();
    }
    let mut peak = 0;
    for _ in 0..25 {
        peak = peak.max(rss_bytes(gw.pid()).saturating_sub(baseline));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let declared = CLIENTS * DECLARED;
    eprintln!(
        "stalled bodies: grew {} KiB, declared {} KiB",
        peak / KIB,
        declared / KIB
    );
    assert!(
        peak < declared / 4,
        "grew {} KiB with {} KiB declared and about {} KiB sent",
        peak / KIB,
        declared / KIB,
        CLIENTS * 1020 / KIB
    );
}
