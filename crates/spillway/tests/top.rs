//! `spillway top` and `GET /admin/top` against a real gateway: who drives the load (offered,
//! shed by reason, callers' and upstream retries) counted alike by the view and by the metrics
//! page, the tenants sorted by who drives the load now, a backend ejected, the admin token, the
//! quickstart's way without one, and the live view in a real terminal (tmux).

mod support;

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use spillway_testkit::eventually;
use spillway_testkit::http::client;
use support::*;

const ADMIN_TOKEN: &str = "test-admin-token";
const HEAVY_KEY: &str = "sk-test-heavy";
const LIGHT_KEY: &str = "sk-test-light";
/// Requests the heavy tenant sends, and its rate limit (its burst is a minute's allowance).
const HEAVY_SENT: usize = 60;
const HEAVY_PER_MIN: u32 = 24;
/// The most the light tenant sends while it drives the load: its total stays below the heavy
/// tenant's.
const LIGHT_MORE: usize = 40;

/// Two tenants beside the test ones, a model with a healthy and a failing backend in two
/// regions, ejection after three failures for longer than the test.
fn config(good: &Proc, sick: &Proc) -> String {
    let mut body = String::from(
        "[outlier]\nconsecutive_failures = 3\nbase_ejection = \"10m\"\nmax_ejection = \"10m\"\n",
    );
    body += &format!(
        "[[tenants]]\nname = \"heavy\"\nkeys = [{{ sha256 = \"{}\" }}]\nrequests_per_min = {HEAVY_PER_MIN}\n",
        sha256_hex(HEAVY_KEY)
    );
    body += &format!(
        "[[tenants]]\nname = \"light\"\nkeys = [{{ sha256 = \"{}\" }}]\n",
        sha256_hex(LIGHT_KEY)
    );
    body += &model(
        "m",
        &[
            ("good", "region-a", good.url("/v1")),
            ("sick", "region-b", sick.url("/v1")),
        ],
    );
    body
}

/// A healthy backend, a backend that answers every request 503, and a gateway in front.
async fn fleet(envs: &[(&str, &str)]) -> (Proc, Proc, Proc) {
    let good = fast_mock(&["m"], &[]);
    let sick = fast_mock(&["m"], &[]);
    control(
        &sick,
        serde_json::json!({"fault": {"error_rate": 1.0, "error_status": 503}}),
    )
    .await;
    let gw = gateway_with_env(&config(&good, &sick), envs);
    (good, sick, gw)
}

/// One chat as the tenant of `key`, marked as the caller's own retry when `retry`: the status
/// and the error code.
async fn send(gw: &Proc, key: &str, retry: bool) -> (u16, String) {
    let mut req = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat_body("m", false));
    if retry {
        req = req.header("x-stainless-retry-count", "1");
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or_default();
    let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
    (status, code)
}

/// `spillway top ARGS` with `envs`, and without an admin token unless `envs` has one: exit
/// status, stdout, stderr.
fn top_cli(args: &[&str], envs: &[(&str, &str)]) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(bin())
        .arg("top")
        .args(args)
        .env_remove("SPILLWAY_ADMIN_TOKEN")
        .env_remove("SPILLWAY_ADMIN_URL")
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status, text(&out.stdout), text(&out.stderr))
}

/// `spillway top --once --json` against `gw` with the admin token: the view.
fn top_json(gw: &Proc, interval: &str) -> Value {
    let url = gw.admin_url("");
    let (status, out, err) = top_cli(
        &[
            "--once",
            "--json",
            "--interval",
            interval,
            "--admin-url",
            &url,
        ],
        &[("SPILLWAY_ADMIN_TOKEN", ADMIN_TOKEN)],
    );
    assert!(status.success(), "spillway top failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn tenant<'a>(view: &'a Value, name: &str) -> &'a Value {
    view["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tenant"] == name)
        .unwrap_or_else(|| panic!("no tenant {name} in {view:#}"))
}

fn order(view: &Value) -> Vec<String> {
    view["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap().to_owned())
        .collect()
}

fn total(v: &Value) -> u64 {
    v["total"]
        .as_u64()
        .unwrap_or_else(|| panic!("no total in {v}"))
}

/// The sum of the samples of `name` whose labels include every one of `labels`.
fn series(page: &str, name: &str, labels: &[&str]) -> u64 {
    page.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn backend_state(view: &Value, name: &str) -> String {
    let b = view["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["backend"] == name)
        .unwrap_or_else(|| panic!("no backend {name} in {view:#}"));
    b["state"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn top_shows_who_drives_the_load_what_was_shed_and_retried_and_the_backends() {
    let (good, _sick, gw) = fleet(&[("SPILLWAY_ADMIN_TOKEN", ADMIN_TOKEN)]).await;
    // The heavy tenant sends far more than the light one, in fours, every third request marked
    // as its caller's own retry; past its burst it is rate limited.
    let mut statuses = Vec::new();
    for chunk in (0..HEAVY_SENT).collect::<Vec<_>>().chunks(4) {
        let sends = chunk.iter().map(|i| send(&gw, HEAVY_KEY, i % 3 == 0));
        statuses.extend(futures_util::future::join_all(sends).await);
    }
    for _ in 0..5 {
        assert_eq!(send(&gw, LIGHT_KEY, false).await.0, 200);
    }
    let rate_limited = statuses
        .iter()
        .filter(|(s, code)| *s == 429 && code == "rate_limit_exceeded")
        .count() as u64;
    assert!(
        rate_limited > 0,
        "the heavy tenant was never rate limited: {statuses:?}"
    );

    let view = top_json(&gw, "300ms");
    let page = metrics(&gw).await;
    assert_eq!(order(&view), ["heavy", "light"], "{view:#}");
    let heavy = tenant(&view, "heavy");
    assert_eq!(total(&heavy["offered"]), HEAVY_SENT as u64);
    assert_eq!(total(&heavy["shed"]["rate_limited_requests"]), rate_limited);
    // Every request offered was admitted or shed, and the shed ones add up by reason.
    let shed_by_reason: u64 = heavy["shed"].as_object().unwrap().values().map(total).sum();
    assert_eq!(total(&heavy["shed_total"]), shed_by_reason);
    assert_eq!(
        total(&heavy["admitted"]) + shed_by_reason,
        HEAVY_SENT as u64,
        "{heavy:#}"
    );
    assert_eq!(
        total(&heavy["admitted"]),
        series(
            &page,
            "spillway_admissions_total",
            &["tenant=\"heavy\"", "outcome=\"admitted\""]
        ),
    );
    // The same counts as the metrics page's series, counted at the same places.
    let attempts = series(
        &page,
        "spillway_upstream_attempts_total",
        &["tenant=\"heavy\""],
    );
    assert_eq!(total(&heavy["upstream_attempts"]), attempts);
    let caller_retries = series(
        &page,
        "spillway_client_retries_total",
        &["tenant=\"heavy\""],
    ) + series(
        &page,
        "spillway_client_retries_shed_total",
        &["tenant=\"heavy\""],
    );
    assert!(caller_retries > 0);
    assert_eq!(total(&heavy["client_retries"]), caller_retries);
    assert_eq!(total(&tenant(&view, "light")["offered"]), 5);
    // The failing backend's answers were retried on the healthy one, and it was ejected.
    assert!(total(&heavy["upstream_retries"]) > 0, "{heavy:#}");
    assert_eq!(backend_state(&view, "sick"), "ejected");
    assert_eq!(backend_state(&view, "good"), "healthy");
    let all_attempts: u64 = ["heavy", "light"]
        .iter()
        .map(|t| total(&tenant(&view, t)["upstream_attempts"]))
        .sum();
    let all_offered = HEAVY_SENT as f64 + 5.0;
    let since_start = view["amplification_since_start"].as_f64().unwrap();
    assert!((since_start - all_attempts as f64 / all_offered).abs() < 1e-9);
    let m = &view["models"][0];
    assert_eq!(m["model"], "m");
    assert_eq!(total(&m["upstream_attempts"]), all_attempts);
    assert!(m["amplification_since_start"].as_f64().unwrap() > 0.0);
    // Nothing was sent between the two reads.
    assert_eq!(heavy["offered"]["per_second"], 0.0);
    assert!(view["interval_seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(view["amplification"], Value::Null);

    // Now only the light tenant sends, slowly enough that its total stays below the heavy
    // one's: it drives the load now, whatever the totals say.
    control(&good, serde_json::json!({"ttft": "150ms"})).await;
    let gw = Arc::new(gw);
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let load = tokio::spawn({
        let (gw, stop, sent) = (gw.clone(), stop.clone(), sent.clone());
        async move {
            // Bounded whatever happens to the view.
            for _ in 0..LIGHT_MORE {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                assert_eq!(send(&gw, LIGHT_KEY, false).await.0, 200);
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    eventually(
        Duration::from_secs(10),
        "the light tenant sending",
        || async { sent.load(Ordering::Relaxed) > 0 },
    )
    .await;
    let reading = gw.clone();
    let view = tokio::task::spawn_blocking(move || top_json(&reading, "1s"))
        .await
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert!(
        total(&tenant(&view, "light")["offered"]) < total(&tenant(&view, "heavy")["offered"]),
        "{view:#}"
    );
    assert_eq!(order(&view), ["light", "heavy"], "{view:#}");
    assert!(
        tenant(&view, "light")["offered"]["per_second"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert_eq!(tenant(&view, "heavy")["offered"]["per_second"], 0.0);
}

#[tokio::test]
async fn the_endpoint_and_the_view_refuse_without_the_admin_token() {
    let (_good, _sick, gw) = fleet(&[("SPILLWAY_ADMIN_TOKEN", ADMIN_TOKEN)]).await;
    let url = gw.admin_url("/admin/top");
    let refused = client().get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 401);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_admin_token");
    let wrong = client()
        .get(&url)
        .bearer_auth("guess")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let right = client()
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 200);
    let top: Value = right.json().await.unwrap();
    assert!(top["uptime_seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(top["backends"].as_array().unwrap().len(), 2);

    let admin = gw.admin_url("");
    let once = [
        "--once",
        "--interval",
        "100ms",
        "--admin-url",
        admin.as_str(),
    ];
    let one_line = |err: &str, says: &str| {
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    };
    let (status, out, err) = top_cli(&once, &[]);
    assert!(!status.success() && out.is_empty());
    one_line(&err, "needs its admin token: set SPILLWAY_ADMIN_TOKEN");
    let (status, _, err) = top_cli(&once, &[("SPILLWAY_ADMIN_TOKEN", "guess")]);
    assert!(!status.success());
    one_line(&err, "refused the admin token in SPILLWAY_ADMIN_TOKEN");
    let nowhere = format!("http://127.0.0.1:{}", spillway_testkit::closed_port());
    let (status, _, err) = top_cli(&["--once", "--admin-url", &nowhere], &[]);
    assert!(!status.success());
    one_line(&err, "cannot reach the gateway's admin listener");
}

#[tokio::test]
async fn without_a_token_a_loopback_admin_listener_answers_top_and_nothing_else() {
    let (_good, _sick, gw) = fleet(&[]).await;
    assert_eq!(send(&gw, LIGHT_KEY, false).await.0, 200);
    let other = client()
        .get(gw.admin_url("/admin/tenants"))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    let body: Value = other.json().await.unwrap();
    assert_eq!(body["error"]["code"], "admin_api_disabled");
    let url = gw.admin_url("");
    // Without --once, on a standard output that is not a terminal: one frame of text, said so.
    let (status, out, err) = top_cli(&["--interval", "100ms", "--admin-url", &url], &[]);
    assert!(status.success(), "{err}");
    assert!(err.contains("not a terminal"), "{err}");
    assert!(out.starts_with("spillway top"), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("light "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.split_whitespace().count() >= 9, "{row}");
}

/// A tmux server of this test's own, on its own socket, stopped when dropped.
struct Tmux(String);

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.0])
            .args(args)
            .output()
            .expect("tmux")
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[tokio::test]
async fn the_live_view_in_a_terminal_shows_the_tenants_and_quits_on_q() {
    let (_good, _sick, gw) = fleet(&[]).await;
    for key in [HEAVY_KEY, HEAVY_KEY, LIGHT_KEY] {
        send(&gw, key, false).await;
    }
    let dir = std::env::temp_dir().join(format!("spillway-top-tmux-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let status = dir.join("status");
    let stty = dir.join("stty");
    // The view runs in the pane's shell; when it exits, the shell writes its status and the
    // terminal's modes after it.
    let script = format!(
        "{} top --interval 200ms --admin-url {}; echo $? > {}; stty -a > {}",
        bin(),
        gw.admin_url(""),
        status.display(),
        stty.display()
    );
    let tmux = Tmux(format!("spillway-top-{}", std::process::id()));
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "40",
        "env",
        "-u",
        "SPILLWAY_ADMIN_TOKEN",
        "sh",
        "-c",
        &script,
    ]);
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    let screen = || {
        String::from_utf8_lossy(&tmux.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    };
    eventually(
        Duration::from_secs(20),
        "the frame with the tenants and backends",
        || async {
            let s = screen();
            s.contains("TENANT")
                && s.contains("heavy ")
                && s.contains("light ")
                && s.contains("sick")
                && s.contains("q: quit")
        },
    )
    .await;
    // Refreshed: a later frame has rates over an interval.
    eventually(Duration::from_secs(20), "a refreshed frame", || async {
        screen().contains("rates over")
    })
    .await;
    let sent = tmux.run(&["send-keys", "-t", "top", "q"]);
    assert!(sent.status.success());
    eventually(
        Duration::from_secs(20),
        "spillway top to exit on q",
        || async { std::fs::read_to_string(&status).is_ok_and(|s| s.ends_with('\n')) },
    )
    .await;
    assert_eq!(std::fs::read_to_string(&status).unwrap().trim(), "0");
    eventually(
        Duration::from_secs(20),
        "the terminal's modes written",
        || async { std::fs::read_to_string(&stty).is_ok_and(|s| s.contains("icanon")) },
    )
    .await;
    // The terminal is given back in its usual (cooked) mode.
    let modes = std::fs::read_to_string(&stty).unwrap();
    let words: Vec<&str> = modes.split_whitespace().collect();
    assert!(
        words.contains(&"icanon") && words.contains(&"echo"),
        "{modes}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
