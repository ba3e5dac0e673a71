//! Retries, budgets, ejection and what callers are told, against real mock backends (IL-0248).

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use spillway_testkit::eventually;
use support::*;

const FAST: [&str; 6] = ["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"];

fn failing(status: &str) -> Proc {
    let mut flags = FAST.to_vec();
    flags.extend_from_slice(&["--error-rate", "1", "--error-status", status]);
    mock(&flags)
}

fn three_backends(a1: &Proc, a2: &Proc, b1: &Proc) -> String {
    model(
        "m",
        &[
            ("a1", "region-a", a1.url("/v1")),
            ("a2", "region-a", a2.url("/v1")),
            ("b1", "region-b", b1.url("/v1")),
        ],
    )
}

#[tokio::test]
async fn a_capacity_failure_is_retried_once_in_the_other_region() {
    let full = failing("503");
    let healthy = mock(&FAST);
    let gw = gateway(&format!(
        "home_region = \"region-a\"\n{}",
        model(
            "m",
            &[
                ("a1", "region-a", full.url("/v1")),
                ("b1", "region-b", healthy.url("/v1")),
            ]
        )
    ));
    let r = chat(&gw, &chat_body("m", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(chats_received(&full).await, 1);
    assert_eq!(chats_received(&healthy).await, 1);
    let m = metrics(&gw).await;
    assert_eq!(
        sample(&m, r#"spillway_retries_total{model="m",reason="capacity"}"#),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            r#"spillway_upstream_attempts_total{tenant="tenant-a",model="m"}"#
        ),
        Some(2.0),
        "{m}"
    );
}

#[tokio::test]
async fn a_client_error_is_returned_as_is_and_never_retried() {
    let bad = failing("400");
    let other = mock(&FAST);
    let gw = gateway(&model(
        "m",
        &[("a1", "r", bad.url("/v1")), ("b1", "r", other.url("/v1"))],
    ));
    // Pin the first attempt to the failing backend by filling nothing: send until it is hit.
    for _ in 0..10 {
        let r = chat(&gw, &chat_body("m", false)).await;
        assert!(r.status() == 200 || r.status() == 400, "{}", r.status());
    }
    let total = chats_received(&bad).await + chats_received(&other).await;
    assert_eq!(total, 10, "a 400 was retried");
}

#[tokio::test]
async fn retries_stay_within_the_budget_when_every_backend_is_full() {
    let (a1, a2, b1) = (failing("503"), failing("503"), failing("503"));
    let gw = gateway(&format!(
        // The budget alone: adaptive throttling (tested in storm.rs) would refuse most of these
        // requests before any attempt, and leave the budget nothing to bound.
        "{}\n[retry]\nbudget_ratio = 0.1\nbudget_min_per_sec = 0.2\nbudget_window = \"10s\"\ncapacity_backoff_base = \"1ms\"\ncapacity_backoff_cap = \"2ms\"\nthrottle_k = 0\n[outlier]\nenabled = false\n",
        three_backends(&a1, &a2, &b1)
    ));
    let n = 60;
    let started = Instant::now();
    for _ in 0..n {
        let r = chat(&gw, &chat_body("m", false)).await;
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["x-should-retry"], "false");
        assert!(r.headers().contains_key("retry-after"));
        assert!(r.headers().contains_key("retry-after-ms"));
        let v: serde_json::Value = r.json().await.unwrap();
        let code = v["error"]["code"].as_str().unwrap().to_owned();
        assert!(
            [
                "capacity_exhausted",
                "retry_budget_exhausted",
                "backends_failing"
            ]
            .contains(&code.as_str()),
            "{v}"
        );
    }
    let attempts =
        chats_received(&a1).await + chats_received(&a2).await + chats_received(&b1).await;
    // G1: attempts <= requests x (1 + ratio) + floor x window, per window the run spans.
    let windows = (started.elapsed().as_secs_f64() / 10.0).floor() + 1.0;
    let bound = n as f64 * 1.1 + 0.2 * 10.0 * windows;
    assert!(
        attempts as f64 <= bound,
        "{attempts} upstream attempts for {n} requests (bound {bound})"
    );
    assert!(attempts > n, "no retry at all: {attempts}");
    let m = metrics(&gw).await;
    let refused = sample_sum(&m, r#"spillway_retry_budget_exhausted_total{model="m","#);
    assert!(refused > 0.0, "{m}");
}

#[tokio::test]
async fn callers_retries_are_shed_first_while_the_pool_is_failing() {
    let (a1, a2, b1) = (failing("503"), failing("503"), failing("503"));
    let gw = gateway(&format!(
        "{}\n[retry]\nbudget_ratio = 0.0\nbudget_min_per_sec = 0.0\n[outlier]\nenabled = false\n",
        three_backends(&a1, &a2, &b1)
    ));
    let before = chats_received(&a1).await + chats_received(&a2).await + chats_received(&b1).await;
    let marked = Some(("x-stainless-retry-count", "1"));
    let r = chat_with_header(&gw, &chat_body("m", false), marked).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["x-should-retry"], "false");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "client_retry_shed", "{v}");
    let after = chats_received(&a1).await + chats_received(&a2).await + chats_received(&b1).await;
    assert_eq!(after, before, "a shed retry reached a backend");
    // A first attempt still goes through to a backend.
    let r = chat(&gw, &chat_body("m", false)).await;
    assert_eq!(r.status(), 503);
    let m = metrics(&gw).await;
    assert_eq!(
        sample(
            &m,
            r#"spillway_client_retries_shed_total{tenant="tenant-a",model="m"}"#
        ),
        Some(1.0),
        "{m}"
    );
}

#[tokio::test]
async fn a_failing_backend_is_ejected_and_readmitted_by_health_checks() {
    let sick = failing("500");
    let well = mock(&FAST);
    let gw = gateway(&format!(
        "{}\n[outlier]\nconsecutive_failures = 3\nbase_ejection = \"300ms\"\n[health_check]\ninterval = \"100ms\"\ntimeout = \"100ms\"\n",
        model(
            "m",
            &[("sick", "r", sick.url("/v1")), ("well", "r", well.url("/v1"))]
        )
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let _ = chat(&gw, &chat_body("m", false)).await;
        let m = metrics(&gw).await;
        if sample(&m, r#"spillway_ejections_total{model="m",backend="sick"}"#).unwrap_or(0.0) >= 1.0
        {
            break;
        }
        assert!(Instant::now() < deadline, "never ejected: {m}");
    }
    // While ejected, requests go to the healthy backend.
    let before = chats_received(&sick).await;
    let mut served = 0;
    for _ in 0..5 {
        if chat(&gw, &chat_body("m", false)).await.status() == 200 {
            served += 1;
        }
    }
    assert!(
        chats_received(&sick).await - before <= 1,
        "an ejected backend kept getting traffic"
    );
    assert!(served >= 4);
    // The backend heals: health checks (which it always passed) and probes bring it back.
    control(&sick, serde_json::json!({"fault": {"error_rate": 0.0}})).await;
    eventually(
        Duration::from_secs(10),
        "the healed backend serves again",
        || async {
            let _ = chat(&gw, &chat_body("m", false)).await;
            let m = metrics(&gw).await;
            sample(&m, r#"spillway_backend_ejected{model="m",backend="sick"}"#) == Some(0.0)
                && chats_received(&sick).await > before + 1
        },
    )
    .await;
}

#[tokio::test]
async fn a_full_backends_retry_after_keeps_requests_away_from_it() {
    let mut flags = FAST.to_vec();
    flags.extend_from_slice(&[
        "--error-rate",
        "1",
        "--error-status",
        "503",
        "--retry-after",
        "30s",
    ]);
    let full = mock(&flags);
    let healthy = mock(&FAST);
    let gw = gateway(&format!(
        "home_region = \"region-a\"\n{}",
        model(
            "m",
            &[
                ("a1", "region-a", full.url("/v1")),
                ("b1", "region-b", healthy.url("/v1")),
            ]
        )
    ));
    for _ in 0..3 {
        assert_eq!(chat(&gw, &chat_body("m", false)).await.status(), 200);
    }
    // Only the first request reached the full backend: its Retry-After kept the others away,
    // although the home region prefers it and one failure does not eject it.
    assert_eq!(chats_received(&full).await, 1);
    assert_eq!(chats_received(&healthy).await, 3);
}
