//! Changing a running gateway's config (IL-0235): reloads under load, rejected reloads,
//! live state kept across them, what needs a restart, the triggers (admin API, `SIGHUP`, the
//! CLI, the file watch), and the last-known-good config.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::Method;
use serde_json::Value;
use spillway_testkit::eventually;
use spillway_testkit::http::client;
use support::*;

const ADMIN_TOKEN: &str = "test-admin-token";
const ENV: &[(&str, &str)] = &[("SPILLWAY_ADMIN_TOKEN", ADMIN_TOKEN)];
/// A mock backend of the models these tests use (`m`, `n`, `other`) that answers at once.
fn backend(extra: &[&str]) -> Proc {
    fast_mock(&["m", "n", "other"], extra)
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn reload(gw: &Proc) -> (u16, Value) {
    let r = admin_call(
        gw.admin_url("/admin/config/reload"),
        ADMIN_TOKEN,
        Method::POST,
        None,
    )
    .await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn shown(gw: &Proc) -> Value {
    let r = admin_call(
        gw.admin_url("/admin/config"),
        ADMIN_TOKEN,
        Method::GET,
        None,
    )
    .await;
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

fn names(v: &Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} in {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// Outlier settings that eject a backend after three failures, for longer than any test runs.
const EJECT_FOR_LONG: &str =
    "[outlier]\nconsecutive_failures = 3\nbase_ejection = \"10m\"\nmax_ejection = \"10m\"\n";

/// Sends chats until the gauge `ejected` of the gateway says 1.
async fn wait_ejected(gw: &Proc, ejected: &str) {
    eventually(
        Duration::from_secs(20),
        "the sick backend ejected",
        || async {
            let _ = chat(gw, &chat_body("m", false)).await;
            sample(&metrics(gw).await, ejected) == Some(1.0)
        },
    )
    .await;
}

/// The hash the gateway reports for its running config.
async fn running_hash(gw: &Proc) -> String {
    shown(gw).await["running"]["source"]["hash"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Sends chats, streamed and not in turn, until `stop`; counts successes and failures.
async fn steady_client(gw: Arc<Proc>, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) -> Vec<String> {
    let mut failures = Vec::new();
    let mut stream = false;
    while !stop.load(Ordering::Relaxed) {
        stream = !stream;
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&chat_body("m", stream))
            .send()
            .await;
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("send: {e}"));
                continue;
            }
        };
        let status = r.status();
        let mut body = String::new();
        let mut chunks = r.bytes_stream();
        let mut broken = None;
        while let Some(chunk) = chunks.next().await {
            match chunk {
                Ok(c) => body.push_str(&String::from_utf8_lossy(&c)),
                Err(e) => {
                    broken = Some(e.to_string());
                    break;
                }
            }
        }
        if status != 200 || broken.is_some() {
            failures.push(format!("{status} {broken:?}: {body}"));
        } else if stream && !body.contains("data: [DONE]") {
            failures.push(format!("a stream ended without [DONE]: {body}"));
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    failures
}

#[tokio::test]
async fn a_reload_under_steady_load_loses_no_request_and_no_stream() {
    // Streams of 8 tokens at 40 a second last about 200 ms, so reloads land in the middle of
    // them; every other config drops backend "b" while requests and streams are on it.
    let slow = ["--model", "m", "--ttft", "20ms", "--tokens-per-sec", "40"];
    let (a, b) = (mock(&slow), mock(&slow));
    let one = model("m", &[("a", "r", a.url("/v1"))]);
    let two = model("m", &[("a", "r", a.url("/v1")), ("b", "r", b.url("/v1"))]);
    let gw = Arc::new(gateway_with_env(&two, ENV));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..8)
        .map(|_| tokio::spawn(steady_client(gw.clone(), stop.clone(), done.clone())))
        .collect();
    for i in 0..10u64 {
        // Let requests run on each config before the next.
        let target = (i + 1) * 6;
        eventually(Duration::from_secs(30), "requests to complete", || {
            let done = done.clone();
            async move { done.load(Ordering::Relaxed) >= target }
        })
        .await;
        gw.rewrite_config(if i % 2 == 0 { &one } else { &two });
        let (status, v) = reload(&gw).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["result"], "applied", "{v}");
        // The backend that stays keeps its state through every reload.
        assert!(
            names(&v, "backends_kept").contains(&"m/a".to_owned()),
            "{v}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for c in clients {
        failures.extend(c.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "requests failed across reloads: {failures:#?}"
    );
    assert!(done.load(Ordering::Relaxed) >= 60);
    assert!(chats_received(&b).await > 0, "backend b never served");
    let m = metrics(&gw).await;
    assert_eq!(
        sample(&m, r#"spillway_config_reloads_total{result="applied"}"#),
        Some(10.0),
        "{m}"
    );
}

#[tokio::test]
async fn an_invalid_reload_is_rejected_and_the_old_config_keeps_serving() {
    let a = backend(&[]);
    let body = model("m", &[("a", "r", a.url("/v1"))]);
    let gw = gateway_with_env(&body, ENV);
    let hash = hex_sha256(&std::fs::read(gw.config_path()).unwrap());
    assert_eq!(running_hash(&gw).await, hash);
    let bad = [
        // A setting out of range.
        (
            format!("{body}weight = 0\n"),
            r#"models["m"].backends[0] ("a").weight"#,
        ),
        // Not TOML.
        (format!("{body}[[models"), "TOML"),
        // An environment variable the file names but the process does not have.
        (
            format!("{body}api_key_env = \"SPILLWAY_TEST_NEVER_SET\"\n"),
            "SPILLWAY_TEST_NEVER_SET",
        ),
    ];
    for (text, named) in &bad {
        gw.rewrite_config(text);
        let (status, v) = reload(&gw).await;
        assert_eq!(status, 422, "{v}");
        assert_eq!(v["result"], "rejected", "{v}");
        assert_eq!(v["error"]["code"], "config_rejected", "{v}");
        let problems = names(&v, "problems").join("\n");
        assert!(problems.contains(named), "{named} not in {problems}");
        assert_eq!(v["running"], hash.as_str(), "{v}");
        // The old config keeps serving.
        let r = chat(&gw, &chat_body("m", false)).await;
        assert_eq!(r.status(), 200);
    }
    // Larger than any config may be.
    gw.rewrite_config(&format!("{body}# {}\n", "x".repeat(5 * 1024 * 1024)));
    let (status, v) = reload(&gw).await;
    assert_eq!(status, 422, "{v}");
    assert!(names(&v, "problems")[0].contains("larger than"), "{v}");
    // The admin API shows the file as pending and broken, the running config untouched.
    gw.rewrite_config(&bad[0].0);
    let v = shown(&gw).await;
    assert_eq!(v["running"]["source"]["hash"], hash.as_str(), "{v}");
    assert_eq!(v["pending"]["differs"], true, "{v}");
    assert!(!names(&v["pending"], "problems").is_empty(), "{v}");
    let m = metrics(&gw).await;
    assert_eq!(
        sample(&m, r#"spillway_config_reloads_total{result="rejected"}"#),
        Some(4.0),
        "{m}"
    );
    assert!(
        m.contains(&format!(
            r#"spillway_config_info{{sha256="{hash}",source="file"}} 1"#
        )),
        "{m}"
    );
    // Without the admin token, nothing is reloaded.
    let r = client()
        .post(gw.admin_url("/admin/config/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn unchanged_backends_keep_their_ejection_state_across_a_reload() {
    let sick = backend(&["--error-rate", "1", "--error-status", "500"]);
    let well = backend(&[]);
    let frame = EJECT_FOR_LONG;
    let pool = model(
        "m",
        &[
            ("sick", "r", sick.url("/v1")),
            ("well", "r", well.url("/v1")),
        ],
    );
    let gw = gateway_with_env(&format!("{frame}{pool}"), ENV);
    let ejected = r#"spillway_backend_ejected{model="m",backend="sick"}"#;
    wait_ejected(&gw, ejected).await;
    // A reload that adds a model leaves model m's backends as they were: still ejected.
    let other = model("other", &[("w", "r", well.url("/v1"))]);
    gw.rewrite_config(&format!("{frame}{pool}{other}"));
    let (status, v) = reload(&gw).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(names(&v, "models_kept"), ["m"], "{v}");
    assert_eq!(names(&v, "models_added"), ["other"], "{v}");
    assert!(
        names(&v, "backends_kept").contains(&"m/sick".to_owned()),
        "{v}"
    );
    assert_eq!(sample(&metrics(&gw).await, ejected), Some(1.0));
    let before = chats_received(&sick).await;
    for _ in 0..10 {
        assert_eq!(chat(&gw, &chat_body("m", false)).await.status(), 200);
    }
    assert_eq!(
        chats_received(&sick).await,
        before,
        "an ejected backend was sent traffic after a reload"
    );
    // A backend whose own settings change is a new backend: it starts with a clean record.
    let reweighted = pool.replacen(
        &format!("url = \"{}\"\n", sick.url("/v1")),
        &format!("url = \"{}\"\nweight = 2\n", sick.url("/v1")),
        1,
    );
    gw.rewrite_config(&format!("{frame}{reweighted}{other}"));
    let (status, v) = reload(&gw).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(names(&v, "backends_fresh"), ["m/sick"], "{v}");
    assert_eq!(names(&v, "models_changed"), ["m"], "{v}");
    assert_eq!(sample(&metrics(&gw).await, ejected), Some(0.0));
}

#[tokio::test]
async fn a_setting_that_needs_a_restart_is_named_and_keeps_its_running_value() {
    let a = backend(&[]);
    let body = model("m", &[("a", "r", a.url("/v1"))]);
    let gw = gateway_with_env(&body, ENV);
    // `max_connections` belongs to the [server] table the frame opens; the new model is served
    // by an in-process mock backend started by the reload.
    let extra =
        "[[models]]\nname = \"extra\"\n[[models.backends]]\nname = \"x\"\nkind = \"mock\"\n";
    gw.rewrite_config(&format!("max_connections = 500\n{body}{extra}"));
    let (status, v) = reload(&gw).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"], "applied", "{v}");
    assert_eq!(
        names(&v, "restart_required"),
        ["server.max_connections"],
        "{v}"
    );
    assert_eq!(names(&v, "models_added"), ["extra"], "{v}");
    let m = metrics(&gw).await;
    assert_eq!(
        sample(&m, "spillway_config_restart_required"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        chat(&gw, &chat_body("extra", false)).await.status(),
        200,
        "the model added by the reload is not served"
    );
    // The same file again: nothing to do.
    let (status, v) = reload(&gw).await;
    assert_eq!(
        (status, v["result"].as_str()),
        (200, Some("unchanged")),
        "{v}"
    );
}

#[tokio::test]
async fn sighup_the_cli_and_the_file_watch_each_reload_the_file() {
    let a = backend(&[]);
    let body = model("m", &[("a", "r", a.url("/v1"))]);
    let watch = "[reload]\nwatch = true\nwatch_interval = \"100ms\"\n";
    let gw = gateway_with_env(&body, ENV);
    let applied = r#"spillway_config_reloads_total{result="applied"}"#;
    // SIGHUP reloads; it does not end the process.
    gw.rewrite_config(&format!("{body}weight = 2\n"));
    gw.signal("HUP");
    eventually(Duration::from_secs(10), "SIGHUP to reload", || async {
        sample(&metrics(&gw).await, applied) == Some(1.0)
    })
    .await;
    assert_eq!(chat(&gw, &chat_body("m", false)).await.status(), 200);
    // `spillway reload` through the admin API: applied, then a rejected file is an error exit.
    let cli = |args: &[&str]| admin_cli(&gw, ADMIN_TOKEN, args);
    gw.rewrite_config(&format!("{body}weight = 3\n"));
    let (status, out, err) = cli(&["reload"]);
    assert!(status.success(), "{out}{err}");
    assert!(out.starts_with("applied "), "{out}");
    gw.rewrite_config(&format!("{body}weight = 0\n"));
    let (status, out, err) = cli(&["reload"]);
    assert!(!status.success(), "{out}");
    assert!(err.contains("weight: must be between"), "{err}");
    let (status, out, _) = cli(&["config", "show"]);
    assert!(status.success());
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["last_reload"]["result"], "rejected", "{shown}");
    // Turning the watch on is itself a reload; from then on an edit of the file is enough.
    gw.rewrite_config(&format!("{watch}{body}"));
    let (status, _, err) = cli(&["reload"]);
    assert!(status.success(), "{err}");
    gw.rewrite_config(&format!("{watch}{body}weight = 4\n"));
    let edited = hex_sha256(&std::fs::read(gw.config_path()).unwrap());
    eventually(
        Duration::from_secs(10),
        "the watch to reload the edit",
        || async { running_hash(&gw).await == edited },
    )
    .await;
}

#[tokio::test]
async fn concurrent_reloads_apply_a_change_once() {
    let a = backend(&[]);
    let body = model("m", &[("a", "r", a.url("/v1"))]);
    let gw = gateway_with_env(&body, ENV);
    gw.rewrite_config(&format!("{body}weight = 5\n"));
    let answers = futures_util::future::join_all((0..16).map(|_| reload(&gw))).await;
    let applied = answers
        .iter()
        .filter(|(_, v)| v["result"] == "applied")
        .count();
    let unchanged = answers
        .iter()
        .filter(|(_, v)| v["result"] == "unchanged")
        .count();
    assert_eq!((applied, unchanged), (1, 15), "{answers:?}");
}

#[tokio::test]
async fn a_config_that_served_is_kept_and_a_bad_file_falls_back_to_it_only_when_asked() {
    let a = backend(&[]);
    let body = format!(
        "[reload]\nlast_known_good_after = \"1s\"\n{}",
        model("m", &[("a", "r", a.url("/v1"))])
    );
    let mut good = gateway_with_env(&body, ENV);
    let hash = hex_sha256(&std::fs::read(good.config_path()).unwrap());
    let data_dir = good.data_dir();
    let saved = data_dir.join("last-known-good.json");
    eventually(
        Duration::from_secs(20),
        "the config saved as last-known-good",
        || {
            let saved = saved.clone();
            let hash = hash.clone();
            async move {
                std::fs::read(&saved)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                    .is_some_and(|v| v["hash"] == hash.as_str())
            }
        },
    )
    .await;
    assert_eq!(shown(&good).await["last_known_good"]["hash"], hash.as_str());
    good.signal("TERM");
    assert!(good.wait_exit(Duration::from_secs(20)).is_some());

    // A file that does not pass its checks: refused, naming the problem...
    let bad = new_config_path();
    std::fs::write(&bad, format!("{body}weight = 0\n")).unwrap();
    let dir = data_dir.to_str().unwrap();
    let mut refused = std::process::Command::new(bin())
        .args([
            "serve",
            "--config",
            bad.to_str().unwrap(),
            "--data-dir",
            dir,
        ])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = spillway_testkit::wait_exit(&mut refused, Duration::from_secs(20))
        .expect("a gateway with a bad config exits");
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut refused.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("weight: must be between"), "{err}");
    // ...unless asked to fall back: then the last-known-good config serves, and says so.
    let fallen = serve_file(
        bad,
        ENV,
        &["--data-dir", dir, "--fallback-to-last-known-good"],
    );
    assert_eq!(chat(&fallen, &chat_body("m", false)).await.status(), 200);
    let v = shown(&fallen).await;
    assert_eq!(v["running"]["source"]["last_known_good"], true, "{v}");
    assert_eq!(v["running"]["source"]["hash"], hash.as_str(), "{v}");
    let m = metrics(&fallen).await;
    assert!(
        m.contains(&format!(
            r#"spillway_config_info{{sha256="{hash}",source="last_known_good"}} 1"#
        )),
        "{m}"
    );
}

#[tokio::test]
async fn a_rollback_puts_the_last_known_good_config_back() {
    let a = backend(&[]);
    // The file is watched: the watch must not undo the rollback.
    let frame =
        "[reload]\nlast_known_good_after = \"1s\"\nwatch = true\nwatch_interval = \"100ms\"\n";
    let gw = gateway_with_env(
        &format!("{frame}{}", model("m", &[("a", "r", a.url("/v1"))])),
        ENV,
    );
    let hash = running_hash(&gw).await;
    eventually(
        Duration::from_secs(20),
        "a last-known-good config",
        || async { shown(&gw).await["last_known_good"]["hash"] == hash.as_str() },
    )
    .await;
    // A change that drops model m, applied (by this reload, or by the watch just before it)...
    gw.rewrite_config(&format!(
        "{frame}{}",
        model("n", &[("a", "r", a.url("/v1"))])
    ));
    let (status, v) = reload(&gw).await;
    assert!(
        status == 200 && matches!(v["result"].as_str(), Some("applied" | "unchanged")),
        "{v}"
    );
    assert_ne!(running_hash(&gw).await, hash, "the change is running");
    assert_eq!(chat(&gw, &chat_body("m", false)).await.status(), 404);
    // ...and rolled back.
    let r = admin_call(
        gw.admin_url("/admin/config/rollback"),
        ADMIN_TOKEN,
        Method::POST,
        None,
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["hash"], hash.as_str(), "{v}");
    assert_eq!(chat(&gw, &chat_body("m", false)).await.status(), 200);
    let v = shown(&gw).await;
    assert_eq!(v["running"]["source"]["last_known_good"], true, "{v}");
    // The file still holds the other config: it shows as pending.
    assert_eq!(v["pending"]["differs"], true, "{v}");
    // The watch reads the file the rollback replaced and leaves it alone...
    let checks = "spillway_config_watch_checks_total";
    let applied = r#"spillway_config_reloads_total{result="applied"}"#;
    let m = metrics(&gw).await;
    let (read, before) = (
        sample(&m, checks).unwrap_or(0.0),
        sample(&m, applied).unwrap(),
    );
    eventually(
        Duration::from_secs(10),
        "the watch to read the file again",
        || async { sample(&metrics(&gw).await, checks).unwrap_or(0.0) >= read + 3.0 },
    )
    .await;
    assert_eq!(sample(&metrics(&gw).await, applied), Some(before));
    assert_eq!(
        running_hash(&gw).await,
        hash,
        "the watch undid the rollback"
    );
    // ...and acts on the next edit.
    gw.rewrite_config(&format!(
        "{frame}{}",
        model("m", &[("a", "r", a.url("/v1"))]).replace("region = \"r\"", "region = \"r2\"")
    ));
    let edited = hex_sha256(&std::fs::read(gw.config_path()).unwrap());
    eventually(
        Duration::from_secs(10),
        "the watch to apply the edit",
        || async { running_hash(&gw).await == edited },
    )
    .await;
    assert_eq!(sample(&metrics(&gw).await, applied), Some(before + 1.0));
}

#[tokio::test]
async fn a_backend_a_reload_removes_leaves_no_stale_ejection_on_the_metrics_page() {
    let sick = backend(&["--error-rate", "1", "--error-status", "500"]);
    let well = backend(&[]);
    let frame = EJECT_FOR_LONG;
    let gw = gateway_with_env(
        &format!(
            "{frame}{}",
            model(
                "m",
                &[
                    ("sick", "r", sick.url("/v1")),
                    ("well", "r", well.url("/v1"))
                ]
            )
        ),
        ENV,
    );
    let ejected = r#"spillway_backend_ejected{model="m",backend="sick"}"#;
    wait_ejected(&gw, ejected).await;
    // Removed from the config: its series no longer says it is ejected (an alert on it would
    // fire for a backend that is gone).
    gw.rewrite_config(&format!(
        "{frame}{}",
        model("m", &[("well", "r", well.url("/v1"))])
    ));
    let (status, v) = reload(&gw).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(sample(&metrics(&gw).await, ejected), Some(0.0));
}
