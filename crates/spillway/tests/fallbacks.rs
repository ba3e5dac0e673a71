//! Fallbacks to other models through the gateway, against real mock-backend processes: each
//! trigger moves a request to its fallback, the answer names the model that gave it, and with
//! every backend failing and a caller resending, fallbacks add nothing beyond the retry budget.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use serde_json::{json, Value};
use spillway_testkit::http::{client, get_json};
use support::*;

const FAST: [&str; 4] = ["--ttft", "0ms", "--tokens-per-sec", "0"];

fn mock_for(model: &str, extra: &[&str]) -> Proc {
    let mut flags = vec!["--model", model];
    flags.extend_from_slice(&FAST);
    flags.extend_from_slice(extra);
    mock(&flags)
}

/// Model `big` on `big_url` falling back to `small` on `small_url` on `on`.
fn config(big_url: &str, small_url: &str, on: &str, extra: &str) -> String {
    format!(
        "{extra}\n\
         [[models]]\nname = \"small\"\n\
         [[models.backends]]\nname = \"s1\"\nurl = \"{small_url}\"\n\
         [[models]]\nname = \"big\"\nfallbacks = [{{ model = \"small\", on = {on} }}]\n\
         [[models.backends]]\nname = \"b1\"\nurl = \"{big_url}\"\n"
    )
}

fn chat_to(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
}

#[tokio::test]
async fn a_model_out_of_capacity_is_answered_by_its_fallback_which_the_answer_names() {
    let big = mock_for("big", &["--error-rate", "1", "--error-status", "503"]);
    let small = mock_for("small", &[]);
    let gw = gateway(&config(
        &big.url("/v1"),
        &small.url("/v1"),
        r#"["capacity"]"#,
        "",
    ));
    let r = chat(&gw, &chat_to("big")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-spillway-model"], "small");
    let v: Value = r.json().await.unwrap();
    // The body's model is the one the fallback's backend answered for.
    assert_eq!(v["model"], "small", "{v}");
    assert_eq!(
        get_json(&small.url("/stats")).await["last_request"]["model"],
        "small"
    );
    let m = metrics(&gw).await;
    assert_eq!(
        sample(
            &m,
            r#"spillway_fallbacks_total{model="big",to="small",trigger="capacity"}"#
        ),
        Some(1.0),
        "{m}"
    );
}

#[tokio::test]
async fn an_unreachable_model_falls_back_as_unavailable_and_others_are_not_moved() {
    let small = mock_for("small", &[]);
    let gw = gateway(&config(
        &closed_port_url(),
        &small.url("/v1"),
        r#"["unavailable"]"#,
        "",
    ));
    let r = chat(&gw, &chat_to("big")).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // A fallback only for capacity does not move a request whose model is down.
    let small2 = mock_for("small", &[]);
    let gw = gateway(&config(
        &closed_port_url(),
        &small2.url("/v1"),
        r#"["capacity", "context_window"]"#,
        "",
    ));
    let r = chat(&gw, &chat_to("big")).await;
    assert_ne!(r.status(), 200);
    assert!(r.headers().get("x-spillway-model").is_none());
    assert_eq!(get_json(&small2.url("/stats")).await["received"], 0);
}

#[tokio::test]
async fn a_fallback_the_tenant_may_not_use_is_skipped() {
    let big = mock_for("big", &["--error-rate", "1", "--error-status", "503"]);
    let small = mock_for("small", &[]);
    let gw = gateway(&format!(
        "{}\n[[tenants]]\nname = \"big-only\"\nkeys = [{{ sha256 = \"{}\" }}]\nmodels = [\"big\"]\n",
        config(&big.url("/v1"), &small.url("/v1"), r#"["capacity"]"#, ""),
        sha256_hex("sk-big-only")
    ));
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-big-only")
        .json(&chat_to("big"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(get_json(&small.url("/stats")).await["received"], 0);
}

#[tokio::test]
async fn with_every_backend_failing_a_naive_retrying_caller_gets_no_more_than_the_budget() {
    // Both models' backends fail every request; the caller resends each failure four times,
    // ignoring `x-should-retry`. The budget: 10 % of requests plus 1 a second over 10 s.
    let big = mock_for("big", &["--error-rate", "1", "--error-status", "502"]);
    let small = mock_for("small", &["--error-rate", "1", "--error-status", "502"]);
    let budget = "[retry]\nbudget_ratio = 0.1\nbudget_min_per_sec = 1.0\nbudget_window = \"10s\"\n\
                  transient_backoff_base = \"0s\"\n";
    let gw = gateway(&config(
        &big.url("/v1"),
        &small.url("/v1"),
        r#"["unavailable", "capacity"]"#,
        budget,
    ));
    let started = std::time::Instant::now();
    let mut requests = 0u64;
    for _ in 0..60 {
        for _ in 0..5 {
            requests += 1;
            let r = chat(&gw, &chat_to("big")).await;
            if r.status() == 200 {
                break;
            }
        }
    }
    let received = |m: &Proc| {
        let url = m.url("/stats");
        async move { get_json(&url).await["received"].as_u64().unwrap() }
    };
    let reached = received(&big).await + received(&small).await;
    // The floor refills at 1 a second: over a run longer than the window, each second adds one.
    let seconds = started.elapsed().as_secs_f64().ceil().max(10.0);
    let bound = requests as f64 * 1.1 + seconds;
    assert!(
        reached as f64 <= bound,
        "{reached} attempts reached the backends for {requests} requests (bound {bound})"
    );
    assert!(received(&small).await > 0, "no request fell back at all");
}
