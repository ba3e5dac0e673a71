//! Admission black-box: per-tenant requests, tokens and concurrency limits answered with 429,
//! `Retry-After` and OpenAI's `x-ratelimit-*` headers; tokens reconciled with the usage the
//! backend reports (plain and streamed); the gateway's global cap; and a noisy tenant that
//! cannot take another tenant's requests away.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use spillway_testkit::eventually;
use spillway_testkit::http::client;
use support::*;

const FAST: [&str; 6] = ["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"];

/// A tenant `limited` with key `limited-key` and `limits` (TOML lines), in front of `mock`.
fn limited_gateway(mock: &Proc, limits: &str, extra: &str) -> Proc {
    gateway_with_env(
        &format!(
            "{extra}\n{}\n[[tenants]]\nname = \"limited\"\nkeys = [{{ env = \"LIMITED_KEY\" }}]\n{limits}\n",
            model("m", &[("b", "r", mock.url("/v1"))])
        ),
        &[("LIMITED_KEY", "limited-key")],
    )
}

async fn chat_as(gw: &Proc, key: &str, body: &serde_json::Value) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// Waits until the gateway's count of requests in flight (the gauge on its admin listener's
/// `/metrics`, the count its global cap is taken from) satisfies `holds`.
async fn until_in_flight(gw: &Proc, what: &str, holds: impl Fn(f64) -> bool) {
    eventually(Duration::from_secs(10), what, || async {
        let page = metrics(gw).await;
        holds(sample(&page, "spillway_requests_in_flight ").unwrap_or(0.0))
    })
    .await;
}

#[tokio::test]
async fn a_tenant_over_its_requests_per_minute_gets_429_with_retry_after_and_ratelimit_headers() {
    let mock = mock(&FAST);
    let gw = limited_gateway(&mock, "requests_per_min = 3", "");
    let body = chat_body("m", false);
    for i in 0..3u32 {
        let r = chat_as(&gw, "limited-key", &body).await;
        assert_eq!(r.status(), 200, "request {i}");
        let h = r.headers();
        assert_eq!(h["x-ratelimit-limit-requests"], "3");
        assert_eq!(
            h["x-ratelimit-remaining-requests"],
            (2 - i).to_string().as_str()
        );
        assert!(h.contains_key("x-ratelimit-reset-requests"));
    }
    let r = chat_as(&gw, "limited-key", &body).await;
    assert_eq!(r.status(), 429);
    let h = r.headers().clone();
    let wait: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=20).contains(&wait), "retry-after {wait}");
    assert_eq!(h["x-ratelimit-remaining-requests"], "0");
    // A retry after the given time may pass, so the caller is not told never to retry.
    assert!(!h.contains_key("x-should-retry"), "{h:?}");
    let err: serde_json::Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "rate_limit_exceeded", "{err}");
    assert_eq!(err["error"]["type"], "requests", "{err}");
    // Another tenant is not limited by this one.
    assert_eq!(chat(&gw, &body).await.status(), 200);
    assert_eq!(chats_received(&mock).await, 4);
    let m = metrics(&gw).await;
    assert!(
        m.contains("spillway_admissions_total{tenant=\"limited\",class=\"standard\",outcome=\"rate_limited_requests\"} 1"),
        "{m}"
    );
}

/// 1,000 tokens a minute; each request reserves about 600 (its prompt and `max_tokens` 500)
/// but the mock reports 8 prompt + a few completion tokens: without reconciliation the second
/// request would be refused.
#[tokio::test]
async fn tokens_are_reconciled_with_the_reported_usage_plain_and_streamed() {
    let mock = mock(&FAST);
    let gw = limited_gateway(&mock, "tokens_per_min = 1000", "");
    let mut body = chat_body("m", false);
    body["max_tokens"] = 500.into();
    let mut streamed = chat_body("m", true);
    streamed["max_tokens"] = 500.into();
    streamed["stream_options"] = serde_json::json!({"include_usage": true});
    const REPORTED: &str = "spillway_tokens_reported_total{tenant=\"limited\"}";
    let mut reported = 0.0;
    for i in 0..6 {
        let b = if i % 2 == 0 { &body } else { &streamed };
        let r = chat_as(&gw, "limited-key", b).await;
        assert_eq!(r.status(), 200, "request {i}");
        assert_eq!(r.headers()["x-ratelimit-limit-tokens"], "1000");
        let _ = r.bytes().await.unwrap();
        // Reconciled just after the answer's last byte (docs/admission.md): the next request
        // may go out on another connection, so it waits for the report to be counted.
        let before = reported;
        eventually(
            Duration::from_secs(10),
            "the usage is reconciled",
            || async { sample(&metrics(&gw).await, REPORTED).unwrap_or(0.0) > before },
        )
        .await;
        reported = sample(&metrics(&gw).await, REPORTED).unwrap_or(0.0);
    }
    let m = metrics(&gw).await;
    let reserved = sample(&m, "spillway_tokens_reserved_total{tenant=\"limited\"}").unwrap();
    let reported = sample(&m, REPORTED).unwrap();
    assert!(reserved > 6.0 * 500.0, "{m}");
    assert!(reported > 0.0 && reported < 6.0 * 100.0, "{m}");

    // A tenant without a tokens limit has nothing reconciled, but what its backends report
    // is counted all the same (per-tenant usage for those that are not limited).
    let r = chat(&gw, &chat_body("m", false)).await;
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await.unwrap();
    const UNLIMITED: &str = "spillway_tokens_reported_total{tenant=\"tenant-a\"}";
    eventually(
        Duration::from_secs(10),
        "the unlimited tenant's usage is counted",
        || async { sample(&metrics(&gw).await, UNLIMITED).unwrap_or(0.0) > 0.0 },
    )
    .await;

    // A request that needs more than the whole limit at once can never pass.
    body["max_tokens"] = 5000.into();
    let r = chat_as(&gw, "limited-key", &body).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-should-retry"], "false");
    assert!(!r.headers().contains_key("retry-after"));
    let err: serde_json::Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "request_too_large", "{err}");
}

/// On one keep-alive connection the next request is read only once the one before it is
/// reconciled (docs/admission.md): back to back, each reserving 600 of the 1,000 tokens a minute,
/// every one passes without waiting.
#[tokio::test]
async fn on_one_connection_each_request_finds_the_one_before_it_reconciled() {
    use support::raw::{connect, response};
    use tokio::io::AsyncWriteExt;
    let mock = mock(&FAST);
    let gw = limited_gateway(&mock, "tokens_per_min = 1000", "");
    let mut body = chat_body("m", false);
    body["max_tokens"] = 500.into();
    let body = body.to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer limited-key\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = connect(&gw).await;
    for i in 0..6 {
        s.write_all(request.as_bytes()).await.unwrap();
        let (status, head, body) = response(&mut s).await;
        assert_eq!(status, 200, "request {i}: {head}\n{body}");
        assert!(!head.contains("connection: close"), "request {i}: {head}");
    }
}

#[tokio::test]
async fn concurrency_and_the_global_cap_refuse_at_once() {
    let slow = mock(&["--model", "m", "--ttft", "400ms", "--tokens-per-sec", "0"]);
    let gw = limited_gateway(
        &slow,
        "max_concurrency = 1",
        "[admission]\nmax_in_flight = 2\n",
    );
    let body = chat_body("m", false);
    let (first, second) = tokio::join!(chat_as(&gw, "limited-key", &body), async {
        until_in_flight(&gw, "the first request in flight", |n| n >= 1.0).await;
        chat_as(&gw, "limited-key", &body).await
    });
    assert_eq!(first.status(), 200);
    assert_eq!(second.status(), 429);
    let err: serde_json::Value = second.json().await.unwrap();
    assert_eq!(err["error"]["code"], "concurrency_limit_exceeded", "{err}");

    // Two requests of another tenant fill the gateway's cap of 2; a third waits for nothing.
    until_in_flight(&gw, "the requests above finished", |n| n == 0.0).await;
    let (a, b, c) = tokio::join!(chat(&gw, &body), chat(&gw, &body), async {
        until_in_flight(&gw, "two requests in flight", |n| n >= 2.0).await;
        chat(&gw, &body).await
    });
    let mut statuses = [a.status(), b.status(), c.status()].map(|s| s.as_u16());
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 503]);
    let m = metrics(&gw).await;
    assert!(m.contains("spillway_requests_in_flight_max 2"), "{m}");
}

/// A tenant flooding at 50x its limit with a naive loop (every 429 resent at once) is refused
/// at the gate; a well-behaved tenant on the same backend keeps every request succeeding.
#[tokio::test]
async fn a_flooding_tenant_is_shed_and_its_neighbour_keeps_succeeding() {
    let mock = mock(&FAST);
    let gw = limited_gateway(&mock, "requests_per_min = 60", "");
    let body = chat_body("m", false);
    let flood = async {
        let mut outcomes = (0u32, 0u32);
        for _ in 0..300 {
            match chat_as(&gw, "limited-key", &body).await.status().as_u16() {
                200 => outcomes.0 += 1,
                429 => outcomes.1 += 1,
                other => panic!("flood got {other}"),
            }
        }
        outcomes
    };
    let neighbour = async {
        let mut ok = 0;
        for _ in 0..50 {
            if chat(&gw, &body).await.status() == 200 {
                ok += 1;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ok
    };
    let ((flood_ok, flood_refused), neighbour_ok) = tokio::join!(flood, neighbour);
    assert_eq!(neighbour_ok, 50);
    assert!(
        flood_ok <= 62,
        "the flood got {flood_ok} through a 60/min limit"
    );
    assert!(flood_refused >= 238);
    // Refused requests never reached the backend.
    assert_eq!(chats_received(&mock).await, u64::from(flood_ok) + 50);
}

/// Two tenants on one pool of 2 seats. Tenant A floods with 30 concurrent loops that resend
/// every refusal at once; tenant B sends one request at a time. A's excess is shed at its own
/// queue bound, and B, queued fairly beside A, gets every request through.
#[tokio::test]
async fn fair_queuing_keeps_a_quiet_tenant_served_beside_a_flooding_one() {
    let slow = mock(&["--model", "m", "--ttft", "50ms", "--tokens-per-sec", "0"]);
    let config = format!(
        "[admission]\nmax_queued_per_tenant = 4\nqueue_wait = \"10s\"\n\
         [[models]]\nname = \"m\"\n[[models.backends]]\nname = \"b\"\nregion = \"r\"\n\
         url = \"{}\"\nmax_concurrency = 2\n\
         [[tenants]]\nname = \"flood\"\nkeys = [{{ env = \"FLOOD_KEY\" }}]\n",
        slow.url("/v1")
    );
    let gw = gateway_with_env(&config, &[("FLOOD_KEY", "flood-key")]);
    let body = chat_body("m", false);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut flood = Vec::new();
    for _ in 0..30 {
        let (url, body, stop) = (gw.url("/v1/chat/completions"), body.clone(), stop.clone());
        flood.push(tokio::spawn(async move {
            let c = client();
            let mut seen = (0u32, 0u32);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = c
                    .post(&url)
                    .bearer_auth("flood-key")
                    .json(&body)
                    .send()
                    .await;
                match r.map(|r| r.status().as_u16()) {
                    Ok(200) => seen.0 += 1,
                    Ok(503) => seen.1 += 1,
                    other => panic!("flood got {other:?}"),
                }
            }
            seen
        }));
    }
    let mut quiet_ok = 0;
    for _ in 0..20 {
        if chat(&gw, &body).await.status() == 200 {
            quiet_ok += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut flood_ok, mut flood_shed) = (0, 0);
    for f in flood {
        let (ok, shed) = f.await.unwrap();
        flood_ok += ok;
        flood_shed += shed;
    }
    assert_eq!(quiet_ok, 20, "the quiet tenant lost requests");
    // Its queue wait stayed under the bound of docs/admission.md: fair queuing hands it a seat
    // after at most one of the flood's requests per seat, and `queue_wait` caps any wait. Every
    // one of its 20 waits is in the buckets up to 1 s (10 times one request's service time).
    let m = metrics(&gw).await;
    let quiet = "spillway_queue_wait_seconds_bucket{tenant=\"tenant-a\",class=\"standard\"";
    assert_eq!(
        sample(&m, &format!("{quiet},le=\"1\"}}")),
        Some(20.0),
        "{m}"
    );
    assert!(
        flood_ok > 0 && flood_shed > 0,
        "{flood_ok} ok, {flood_shed} shed"
    );
    let m = metrics(&gw).await;
    assert!(
        m.contains("spillway_admissions_total{tenant=\"flood\",class=\"standard\",outcome=\"tenant_queue_full\"}"),
        "{m}"
    );
    assert!(
        m.contains("spillway_pool_seats{model=\"m\",pool=\"shared\"} 2"),
        "{m}"
    );
}

/// A tenant pinned to a dedicated pool (bulkhead) uses only that pool's backends, and a surge of
/// the shared pool's tenants never reaches them.
#[tokio::test]
async fn a_tenant_pinned_to_a_dedicated_pool_is_untouched_by_a_surge_in_the_shared_one() {
    let shared = mock(&["--model", "m", "--ttft", "50ms", "--tokens-per-sec", "0"]);
    let dedicated = mock(&FAST);
    let config = format!(
        "[admission]\nmax_queued_per_tenant = 2\n\
         [[models]]\nname = \"m\"\n\
         [[models.backends]]\nname = \"shared\"\nregion = \"r\"\nurl = \"{}\"\nmax_concurrency = 1\n\
         [[models.backends]]\nname = \"vip\"\nregion = \"r\"\nurl = \"{}\"\npool = \"vip\"\n\
         [[tenants]]\nname = \"vip\"\nkeys = [{{ env = \"VIP_KEY\" }}]\npool = \"vip\"\n",
        shared.url("/v1"),
        dedicated.url("/v1")
    );
    let gw = gateway_with_env(&config, &[("VIP_KEY", "vip-key")]);
    let body = chat_body("m", false);
    let surge = futures_util::future::join_all((0..20).map(|_| chat(&gw, &body)));
    let vip = async {
        let mut ok = 0;
        for _ in 0..20 {
            if chat_as(&gw, "vip-key", &body).await.status() == 200 {
                ok += 1;
            }
        }
        ok
    };
    let (surge, vip_ok) = tokio::join!(surge, vip);
    assert_eq!(vip_ok, 20);
    let shed = surge.iter().filter(|r| r.status() == 503).count();
    assert!(shed > 0, "the shared pool's surge was not shed");
    // The dedicated backend served the pinned tenant only; the shared one never saw it.
    assert_eq!(chats_received(&dedicated).await, 20);
    assert_eq!(
        chats_received(&shared).await,
        surge.iter().filter(|r| r.status() == 200).count() as u64
    );
}

/// Closed-loop clients, each sending its next request when the last one is answered, for
/// `run`; returns the 2xx answers per second and every status seen.
async fn closed_loop(gw: &Proc, clients: usize, run: Duration) -> (f64, Vec<u16>) {
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let url = gw.url("/v1/chat/completions");
        tasks.push(tokio::spawn(async move {
            let c = client();
            let mut statuses = Vec::new();
            while started.elapsed() < run {
                let r = c
                    .post(&url)
                    .bearer_auth(KEY)
                    .json(&chat_body("m", false))
                    .send()
                    .await
                    .unwrap();
                statuses.push(r.status().as_u16());
            }
            statuses
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.extend(t.await.unwrap());
    }
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    (ok as f64 / started.elapsed().as_secs_f64(), statuses)
}

/// At ten times the pool's capacity the seats stay busy and the excess waits or is shed: the
/// gateway still delivers at least 90 % of the goodput it delivers at capacity, and no admitted
/// request waited longer than `admission.queue_wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goodput_at_ten_times_capacity_stays_near_goodput_at_capacity() {
    let slow = mock(&["--model", "m", "--ttft", "50ms", "--tokens-per-sec", "0"]);
    let config = format!(
        "[admission]\nqueue_wait = \"2s\"\n\
         [[models]]\nname = \"m\"\n[[models.backends]]\nname = \"b\"\nregion = \"r\"\n\
         url = \"{}\"\nmax_concurrency = 4\n",
        slow.url("/v1")
    );
    let gw = gateway(&config);
    let (at_capacity, _) = closed_loop(&gw, 4, Duration::from_secs(3)).await;
    let (overloaded, statuses) = closed_loop(&gw, 40, Duration::from_secs(3)).await;
    assert!(
        overloaded >= 0.9 * at_capacity,
        "goodput {overloaded:.1}/s at 10x against {at_capacity:.1}/s at 1x"
    );
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 503),
        "{statuses:?}"
    );
    let m = metrics(&gw).await;
    let count = sample(
        &m,
        "spillway_queue_wait_seconds_count{tenant=\"tenant-a\",class=\"standard\"}",
    )
    .unwrap();
    let within = sample(
        &m,
        "spillway_queue_wait_seconds_bucket{tenant=\"tenant-a\",class=\"standard\",le=\"2.5\"}",
    )
    .unwrap();
    assert!(count > 0.0);
    assert_eq!(
        within, count,
        "an admitted request waited past queue_wait: {m}"
    );
}
