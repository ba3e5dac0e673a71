//! Staged rollouts (IL-0235): a new backend version that rejects a feature halts at its first
//! step and its traffic returns to the old version; a healthy one reaches all traffic; a hand can
//! promote, abort and restart; the state survives a reload and a restart; a jump in a backend's
//! 4xx share is reported outside rollouts.
// The tests time real processes on the system clock.
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use spillway_testkit::eventually;
use support::*;

const ADMIN_TOKEN: &str = "test-admin-token";
const ENV: &[(&str, &str)] = &[("SPILLWAY_ADMIN_TOKEN", ADMIN_TOKEN)];
/// A mock backend of model `m` that answers at once.
fn backend(extra: &[&str]) -> Proc {
    fast_mock(&["m"], extra)
}

/// Model m on `old`, rolling out to `new` with `settings` in `[models.rollout]`.
fn rolling(old: &Proc, new: &Proc, settings: &str) -> String {
    format!(
        "{}[models.rollout]\n{settings}\n[[models.rollout.backends]]\nname = \"new\"\nregion = \"r\"\nurl = \"{}\"\n",
        model("m", &[("old", "r", old.url("/v1"))]),
        new.url("/v1")
    )
}

async fn rollouts(gw: &Proc) -> Vec<Value> {
    let r = admin_call(
        gw.admin_url("/admin/rollouts"),
        ADMIN_TOKEN,
        Method::GET,
        None,
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    v["rollouts"].as_array().unwrap().clone()
}

async fn status_of(gw: &Proc) -> String {
    rollouts(gw).await[0]["state"]["status"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A chat that uses the `tools` field, as a share of the traffic does.
fn with_tools() -> Value {
    let mut body = chat_body("m", false);
    body["tools"] = json!([{"type": "function", "function": {"name": "lookup", "parameters": {}}}]);
    body
}

/// Sends `n` chats at once, every third using `tools`; the statuses.
async fn wave(gw: &Proc, n: usize) -> Vec<u16> {
    let c = spillway_testkit::http::client();
    let sends = (0..n).map(|i| {
        let body = if i % 3 == 0 {
            with_tools()
        } else {
            chat_body("m", false)
        };
        c.post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&body)
            .send()
    });
    futures_util::future::join_all(sends)
        .await
        .into_iter()
        .map(|r| r.unwrap().status().as_u16())
        .collect()
}

#[tokio::test]
async fn a_new_version_that_rejects_a_field_halts_at_its_first_step_and_its_traffic_returns() {
    let old = backend(&[]);
    let new = backend(&["--reject-field", "tools"]);
    let gw = gateway_with_env(
        &rolling(
            &old,
            &new,
            "steps = [10, 50, 100]\nmin_step_duration = \"10m\"",
        ),
        ENV,
    );
    // Load until the comparator halts the rollout; bounded: 10 % of a third of the requests
    // reach the new version with the field, and five 400s against none halt it.
    let mut sent = 0;
    let mut refused = 0;
    while status_of(&gw).await == "running" {
        assert!(
            sent < 50_000,
            "no halt after {sent} requests: {:?}",
            rollouts(&gw).await
        );
        let statuses = wave(&gw, 50).await;
        sent += statuses.len();
        refused += statuses.iter().filter(|&&s| s == 400).count();
        for s in statuses {
            assert!(s == 200 || s == 400, "unexpected status {s}");
        }
    }
    let r = &rollouts(&gw).await[0];
    assert_eq!(r["state"]["status"], "halted", "{r}");
    assert_eq!(r["state"]["step"], 0, "halted at its first step: {r}");
    assert_eq!(r["state"]["reason"]["signal"]["client_error"], 400, "{r}");
    assert_eq!(r["share_percent"], 0.0, "{r}");
    assert!(refused >= 5, "{refused} callers saw the new version's 400");
    // Every request now goes to the old version, the field or not.
    let before = chats_received(&new).await;
    let statuses = wave(&gw, 60).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(
        chats_received(&new).await,
        before,
        "the halted version got traffic"
    );
    let m = metrics(&gw).await;
    assert_eq!(
        sample(
            &m,
            r#"spillway_rollout_halts_total{model="m",signal="client_error_400"}"#
        ),
        Some(1.0),
        "{m}"
    );
    assert!(
        m.contains(r#"spillway_rollout_status{model="m",status="halted"} 1"#),
        "{m}"
    );
}

#[tokio::test]
async fn a_halt_survives_a_restart_of_the_gateway() {
    let old = backend(&[]);
    let new = backend(&["--reject-field", "tools"]);
    let mut gw = gateway_with_env(
        &rolling(&old, &new, "steps = [50, 100]\nmin_step_duration = \"10m\""),
        ENV,
    );
    let mut sent = 0;
    while status_of(&gw).await == "running" {
        assert!(sent < 50_000, "no halt after {sent} requests");
        sent += wave(&gw, 30).await.len();
    }
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(20)).is_some());
    let again = serve_file(gw.config_path().to_path_buf(), ENV, &[]);
    let r = &rollouts(&again).await[0];
    assert_eq!(r["state"]["status"], "halted", "{r}");
    assert_eq!(r["share_percent"], 0.0, "{r}");
    let before = chats_received(&new).await;
    assert!(wave(&again, 20).await.iter().all(|&s| s == 200));
    assert_eq!(chats_received(&new).await, before);
}

#[tokio::test]
async fn a_healthy_rollout_reaches_all_traffic() {
    let (old, new) = (backend(&[]), backend(&[]));
    let gw = gateway_with_env(
        &rolling(
            &old,
            &new,
            "steps = [20, 100]\nmin_step_duration = \"1s\"\nmin_step_requests = 20",
        ),
        ENV,
    );
    eventually(
        Duration::from_secs(60),
        "the rollout to complete",
        || async {
            let statuses = wave(&gw, 20).await;
            assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
            let status = status_of(&gw).await;
            assert!(
                status == "running" || status == "completed",
                "a healthy rollout stopped: {:?}",
                rollouts(&gw).await
            );
            status == "completed"
        },
    )
    .await;
    let r = &rollouts(&gw).await[0];
    assert_eq!(r["share_percent"], 100.0, "{r}");
    let before = chats_received(&old).await;
    assert!(wave(&gw, 20).await.iter().all(|&s| s == 200));
    assert_eq!(
        chats_received(&old).await,
        before,
        "the old version still got traffic"
    );
}

#[tokio::test]
async fn a_rollout_is_steered_by_hand_and_keeps_its_step_across_a_reload() {
    let (old, new) = (backend(&[]), backend(&[]));
    let body = rolling(
        &old,
        &new,
        "steps = [10, 60, 100]\nmin_step_duration = \"10m\"",
    );
    let gw = gateway_with_env(&body, ENV);
    let cli = |args: &[&str]| admin_cli(&gw, ADMIN_TOKEN, args);
    let (status, out, err) = cli(&["rollout", "promote", "m"]);
    assert!(status.success(), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["share_percent"], 60.0, "{v}");
    // A reload that changes something else keeps the rollout where it is.
    gw.rewrite_config(&format!("[retry]\nmax_attempts = 2\n{body}"));
    let r = admin_call(
        gw.admin_url("/admin/config/reload"),
        ADMIN_TOKEN,
        Method::POST,
        None,
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(rollouts(&gw).await[0]["share_percent"], 60.0);
    // Aborted: nothing goes to the new version.
    let (status, out, err) = cli(&["rollout", "abort", "m"]);
    assert!(status.success(), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"]["status"], "aborted", "{v}");
    let before = chats_received(&new).await;
    assert!(wave(&gw, 20).await.iter().all(|&s| s == 200));
    assert_eq!(chats_received(&new).await, before);
    // An aborted rollout cannot be promoted; it can be restarted.
    let (status, _, err) = cli(&["rollout", "promote", "m"]);
    assert!(!status.success());
    assert!(err.contains("409"), "{err}");
    let (status, out, _) = cli(&["rollout", "restart", "m"]);
    assert!(status.success());
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"]["status"], "running", "{v}");
    assert_eq!(v["share_percent"], 10.0, "{v}");
    // A model without a rollout: a clear error, not a crash.
    let (status, _, err) = cli(&["rollout", "abort", "no such model"]);
    assert!(!status.success());
    assert!(err.contains("has no staged rollout"), "{err}");
    let (status, out, _) = cli(&["rollout", "status"]);
    assert!(status.success());
    assert!(out.contains("\"model\": \"m\""), "{out}");
}

#[tokio::test]
async fn replace_mode_sends_every_request_to_the_new_version_at_once() {
    let (old, new) = (backend(&[]), backend(&[]));
    let gw = gateway_with_env(&rolling(&old, &new, "mode = \"replace\""), ENV);
    assert!(wave(&gw, 20).await.iter().all(|&s| s == 200));
    assert_eq!(chats_received(&old).await, 0);
    assert_eq!(chats_received(&new).await, 20);
}

#[tokio::test]
async fn a_jump_in_a_backends_4xx_share_is_reported_outside_a_rollout() {
    // A short window and baseline, so that the test need not run for half an hour.
    let (steady, turned) = (backend(&[]), backend(&[]));
    let gw = gateway_with_env(
        &format!(
            "[anomaly]\nwindow = \"1s\"\nbaseline = \"30s\"\n{}",
            model(
                "m",
                &[
                    ("steady", "r", steady.url("/v1")),
                    ("turned", "r", turned.url("/v1"))
                ]
            )
        ),
        ENV,
    );
    let anomalous = |b: &str| format!(r#"spillway_backend_4xx_anomaly{{model="m",backend="{b}"}}"#);
    // A baseline without 4xx: traffic for a few seconds.
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        assert!(wave(&gw, 10).await.iter().all(|&s| s != 500));
        let _ = chat(&gw, &chat_body("m", false)).await;
    }
    // Then one backend starts refusing a field a third of the requests use.
    control(&turned, json!({"fault": {"reject_field": "tools"}})).await;
    eventually(
        Duration::from_secs(20),
        "the jump to be reported",
        || async {
            let _ = wave(&gw, 30).await;
            sample(&metrics(&gw).await, &anomalous("turned")) == Some(1.0)
        },
    )
    .await;
    let m = metrics(&gw).await;
    assert_eq!(
        sample(
            &m,
            r#"spillway_4xx_anomalies_total{model="m",backend="turned"}"#
        ),
        Some(1.0),
        "{m}"
    );
    assert_ne!(sample(&m, &anomalous("steady")), Some(1.0), "{m}");
}

#[tokio::test]
async fn a_new_version_that_hangs_halts_on_its_timeouts_and_its_callers_are_served_by_the_old() {
    let old = backend(&[]);
    let new = backend(&["--stall-rate", "1", "--stall", "30s"]);
    let gw = gateway_with_env(
        &format!(
            "[upstream]\nresponse_timeout = \"300ms\"\n{}",
            rolling(&old, &new, "steps = [50, 100]\nmin_step_duration = \"10m\"")
        ),
        ENV,
    );
    eventually(
        Duration::from_secs(30),
        "the hanging version halted",
        || async {
            // Each timed-out attempt is retried on the old version: the callers are served.
            // Eight at a time: however many of a wave's first attempts land on the hanging
            // version, `retry.min_retrying` (8) lets them all be retried at once.
            let statuses = wave(&gw, 8).await;
            assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
            status_of(&gw).await != "running"
        },
    )
    .await;
    let r = &rollouts(&gw).await[0];
    assert_eq!(r["state"]["status"], "halted", "{r}");
    assert_eq!(r["state"]["reason"]["signal"], "timeout", "{r}");
}

#[tokio::test]
async fn unreadable_rollout_states_start_the_rollout_aborted_not_running() {
    let (old, new) = (backend(&[]), backend(&[]));
    let path = new_config_path();
    let db = path.with_extension("db");
    std::fs::write(
        &path,
        gateway_config(&rolling(&old, &new, "steps = [50, 100]"), &db),
    )
    .unwrap();
    let data = data_dir_of(&path);
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("rollouts.json"), "{ torn").unwrap();
    let gw = serve_file(path, ENV, &[]);
    let r = &rollouts(&gw).await[0];
    assert_eq!(r["state"]["status"], "aborted", "{r}");
    assert!(wave(&gw, 10).await.iter().all(|&s| s == 200));
    assert_eq!(
        chats_received(&new).await,
        0,
        "a rollout of unknown state got traffic"
    );
}

#[tokio::test]
async fn replace_mode_never_sends_to_the_old_version_even_when_the_new_one_is_full() {
    // A replaced version is gone: a full new version answers for itself, it does not borrow the
    // old one's capacity (which a staged rollout does).
    let old = backend(&[]);
    let new = mock(&[
        "--model",
        "m",
        "--capacity",
        "1",
        "--queue",
        "0",
        "--ttft",
        "200ms",
    ]);
    let gw = gateway_with_env(&rolling(&old, &new, "mode = \"replace\""), ENV);
    let statuses = wave(&gw, 20).await;
    assert!(statuses.iter().any(|&s| s != 200), "{statuses:?}");
    assert_eq!(chats_received(&old).await, 0);
}

#[tokio::test]
async fn with_every_backend_of_both_versions_failing_a_rollout_neither_halts_nor_multiplies_load() {
    // The worst case for the comparator: both versions fail alike (502, which is retried), so
    // the new one is not worse and must not be blamed; and the retries, all to the old version,
    // stay within the retry budget and adaptive throttling rather than tripling the load.
    let old = backend(&["--error-rate", "1", "--error-status", "502"]);
    let new = backend(&["--error-rate", "1", "--error-status", "502"]);
    let gw = gateway_with_env(
        &rolling(&old, &new, "steps = [50, 100]\nmin_step_duration = \"10m\""),
        ENV,
    );
    // Load for three seconds, so that the comparator (once a second) judges it at least twice.
    let mut sent = 0u64;
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let statuses = wave(&gw, 20).await;
        assert!(statuses.iter().all(|&s| s >= 500), "{statuses:?}");
        sent += statuses.len() as u64;
        assert!(sent < 50_000);
    }
    assert_eq!(status_of(&gw).await, "running", "{:?}", rollouts(&gw).await);
    let reached = chats_received(&old).await + chats_received(&new).await;
    assert!(
        reached <= sent * 3 / 2,
        "{reached} attempts reached the backends for {sent} requests"
    );
}
