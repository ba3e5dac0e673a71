//! Routing on the engines' own signals: spillover before an engine's queue passes its bound, a
//! stale reading counted as saturated, prefix and session affinity within a load bound.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use spillway_testkit::eventually;
use spillway_testkit::http::{client, get_json};
use support::*;

/// Engine metrics read every 50 ms (stale after 500 ms), no active health checks.
const FAST_SCRAPES: &str = "[engine_metrics]\ninterval = \"50ms\"\ntimeout = \"200ms\"\nstale_after = \"500ms\"\nmax_queue = 2\n\n[health_check]\nenabled = false\n\n";

/// The sum over `backends` of a gateway gauge `name{model="m",backend=...}`.
fn gauge_sum(page: &str, name: &str, backends: &[&str]) -> f64 {
    backends
        .iter()
        .filter_map(|b| sample(page, &format!("{name}{{model=\"m\",backend=\"{b}\"}}")))
        .sum()
}

/// A gateway whose home region `region-a` has backend `a` on `home`, with `b` on `away` in
/// `region-b`, reading both engines fast.
fn home_and_away(home: &Proc, away: &Proc) -> Proc {
    let backends = [
        ("a", "region-a", home.url("/v1")),
        ("b", "region-b", away.url("/v1")),
    ];
    gateway(&format!(
        "home_region = \"region-a\"\n{FAST_SCRAPES}{}",
        model("m", &backends)
    ))
}

async fn served(m: &Proc) -> u64 {
    get_json(&m.url("/stats")).await["served"]
        .as_u64()
        .unwrap_or(0)
}

#[tokio::test]
async fn spillover_happens_before_an_engines_queue_passes_its_bound() {
    // The home engine runs one request and queues three; a fourth in its queue gets a 429.
    let home = mock(&[
        "--model",
        "m",
        "--capacity",
        "1",
        "--queue",
        "3",
        "--ttft",
        "3s",
        "--tokens-per-sec",
        "0",
    ]);
    let away = mock(&[
        "--model",
        "m",
        "--capacity",
        "16",
        "--ttft",
        "3s",
        "--tokens-per-sec",
        "0",
    ]);
    let gw = home_and_away(&home, &away);
    let c = client();
    let mut sent = Vec::new();
    for i in 1..=7u32 {
        let req = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&chat_body("m", false))
            .send();
        sent.push(tokio::spawn(req));
        // The next request is placed only once the gateway's reading shows this one.
        eventually(
            Duration::from_secs(10),
            "the reading to show every request",
            || async {
                let page = metrics(&gw).await;
                let running = gauge_sum(&page, "spillway_engine_requests_running", &["a", "b"]);
                let waiting = gauge_sum(&page, "spillway_engine_requests_waiting", &["a", "b"]);
                running + waiting == f64::from(i)
            },
        )
        .await;
    }
    for r in sent {
        let r = r.await.unwrap().unwrap();
        let status = r.status();
        assert_eq!(status, 200, "{}", r.text().await.unwrap());
    }
    // Home took one running and its queue up to the bound of 2 (one more is sent before the
    // reading shows the bound passed); the rest spilled over before the engine had to refuse.
    let home_stats = get_json(&home.url("/stats")).await;
    assert_eq!(home_stats["rejected_queue_full"], 0, "{home_stats}");
    assert_eq!(served(&home).await, 4);
    assert_eq!(served(&away).await, 3);
}

#[tokio::test]
async fn a_stale_engine_reading_counts_as_saturated() {
    let fast = ["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"];
    let (home, away) = (mock(&fast), mock(&fast));
    let gw = home_and_away(&home, &away);
    let age = "spillway_engine_reading_age_seconds{model=\"m\",backend=\"a\"}";
    eventually(
        Duration::from_secs(10),
        "a fresh reading of home",
        || async { sample(&metrics(&gw).await, age).is_some_and(|a| a < 0.5) },
    )
    .await;
    for _ in 0..5 {
        assert_eq!(chat(&gw, &chat_body("m", false)).await.status(), 200);
    }
    assert_eq!((served(&home).await, served(&away).await), (5, 0));

    // Home's metrics page breaks; inference there still works, but nothing says how loaded it is.
    control(
        &home,
        serde_json::json!({"fault": {"metrics_error_status": 500}}),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "home's reading to go stale",
        || async { sample(&metrics(&gw).await, age).is_some_and(|a| a > 0.5) },
    )
    .await;
    for _ in 0..5 {
        assert_eq!(chat(&gw, &chat_body("m", false)).await.status(), 200);
    }
    assert_eq!((served(&home).await, served(&away).await), (5, 5));
    let page = metrics(&gw).await;
    // The series exist from the start at 0: the failed scrapes must have counted.
    assert!(
        sample_sum(
            &page,
            "spillway_engine_scrape_errors_total{model=\"m\",backend=\"a\",reason=\"status\"}"
        ) > 0.0,
        "{page}"
    );

    // Readable again: home is home again.
    control(
        &home,
        serde_json::json!({"fault": {"metrics_error_status": null}}),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "a fresh reading of home again",
        || async { sample(&metrics(&gw).await, age).is_some_and(|a| a < 0.5) },
    )
    .await;
    assert_eq!(chat(&gw, &chat_body("m", false)).await.status(), 200);
    assert_eq!(served(&home).await, 6);
}

fn shared_prompt(system: &str, question: &str) -> serde_json::Value {
    serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question}
        ],
        "max_tokens": 4,
    })
}

/// Two engines without metrics (load is spillway's own count) behind `balance`.
fn affinity_gateway(a: &Proc, b: &Proc, balance: &str) -> Proc {
    let cfg = format!(
        "[health_check]\nenabled = false\n\n[[models]]\nname = \"m\"\nbalance = \"{balance}\"\naffinity_prefix_chars = 256\n\
         [[models.backends]]\nname = \"a\"\nurl = \"{}\"\nengine = \"none\"\n\
         [[models.backends]]\nname = \"b\"\nurl = \"{}\"\nengine = \"none\"\n",
        a.url("/v1"),
        b.url("/v1")
    );
    gateway(&cfg)
}

#[tokio::test]
async fn prefix_affinity_keeps_a_shared_prefix_on_one_backend_until_the_load_bound_overflows() {
    let fast = ["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"];
    let (a, b) = (mock(&fast), mock(&fast));
    let gw = affinity_gateway(&a, &b, "prefix_affinity");
    let system = "You answer questions about the billing system, briefly. ".repeat(8);
    for i in 0..10 {
        let r = chat(&gw, &shared_prompt(&system, &format!("question {i}"))).await;
        assert_eq!(r.status(), 200);
    }
    let (on_a, on_b) = (served(&a).await, served(&b).await);
    assert!(
        (on_a, on_b) == (10, 0) || (on_a, on_b) == (0, 10),
        "a shared prefix was split: {on_a} / {on_b}"
    );
    // Other prefixes spread over both (20 distinct keys all on one backend: p = 2^-19).
    for i in 0..20 {
        let system = format!("You are assistant number {i}. ").repeat(12);
        assert_eq!(chat(&gw, &shared_prompt(&system, "hi")).await.status(), 200);
    }
    assert!(served(&a).await > on_a && served(&b).await > on_b);
    let page = metrics(&gw).await;
    assert_eq!(
        sample(
            &page,
            "spillway_affinity_total{model=\"m\",outcome=\"hit\"}"
        ),
        Some(30.0),
        "{page}"
    );
}

#[tokio::test]
async fn a_burst_on_one_prefix_overflows_past_the_load_bound() {
    let slow = ["--model", "m", "--ttft", "1s", "--tokens-per-sec", "0"];
    let (a, b) = (mock(&slow), mock(&slow));
    let gw = affinity_gateway(&a, &b, "prefix_affinity");
    let system = "Summarise the ticket below for the on-call engineer. ".repeat(8);
    all_served_at_once(
        &gw,
        (0..6).map(|i| shared_prompt(&system, &format!("ticket {i}"))),
    )
    .await;
    // With 1.25x the average as the bound, no backend takes all six at once.
    let (on_a, on_b) = (served(&a).await, served(&b).await);
    assert_eq!(on_a + on_b, 6);
    assert!(on_a > 0 && on_b > 0, "{on_a} / {on_b}");
    assert!(on_a.max(on_b) <= 4, "{on_a} / {on_b}");
    let page = metrics(&gw).await;
    assert!(
        sample(
            &page,
            "spillway_affinity_total{model=\"m\",outcome=\"overflow\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{page}"
    );
}

#[tokio::test]
async fn session_affinity_keeps_a_session_on_one_backend() {
    let fast = ["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"];
    let (a, b) = (mock(&fast), mock(&fast));
    let gw = affinity_gateway(&a, &b, "session_affinity");
    for i in 0..10 {
        let body = shared_prompt(&format!("turn {i}"), "and then?");
        let r = chat_with_header(&gw, &body, Some(("x-session-id", "conversation-7"))).await;
        assert_eq!(r.status(), 200);
    }
    let (on_a, on_b) = (served(&a).await, served(&b).await);
    assert!(
        (on_a, on_b) == (10, 0) || (on_a, on_b) == (0, 10),
        "a session was split: {on_a} / {on_b}"
    );
}

#[tokio::test]
async fn a_priority_header_lowers_the_class_and_reaches_engines_that_take_it() {
    let engine = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let cfg = format!(
        "[health_check]\nenabled = false\n\n{}forward_priority = true\n",
        model("m", &[("vllm", "default", engine.url("/v1"))])
    );
    let gw = gateway(&cfg);
    let forwarded = |engine: &Proc| {
        let url = engine.url("/stats");
        async move { get_json(&url).await["last_request"]["body"]["priority"].clone() }
    };
    let body = chat_body("m", false);
    // No header: the tenant's class (standard), the engine's default value.
    assert_eq!(chat(&gw, &body).await.status(), 200);
    assert_eq!(forwarded(&engine).await, 0);
    // A request may lower its class...
    let r = chat_with_header(&gw, &body, Some(("x-spillway-priority", "batch"))).await;
    assert_eq!(r.status(), 200);
    assert_eq!(forwarded(&engine).await, 10);
    // ...never raise it above its tenant's.
    let r = chat_with_header(&gw, &body, Some(("x-spillway-priority", "critical"))).await;
    assert_eq!(r.status(), 200);
    assert_eq!(forwarded(&engine).await, 0);
    let page = metrics(&gw).await;
    let waits = |class: &str| {
        sample(
            &page,
            &format!("spillway_queue_wait_seconds_count{{tenant=\"tenant-a\",class=\"{class}\"}}"),
        )
    };
    assert_eq!(
        (waits("standard"), waits("batch"), waits("critical")),
        (Some(2.0), Some(1.0), None)
    );
    // A value that is no class is the caller's error.
    let r = chat_with_header(&gw, &body, Some(("x-spillway-priority", "urgent"))).await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("x-spillway-priority"),
        "{v}"
    );
}
