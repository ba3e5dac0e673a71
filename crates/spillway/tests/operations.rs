//! Operating the gateway: probes, metrics, graceful shutdown, the quickstart and check-config.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::process::Command;
use std::time::Duration;

use futures_util::StreamExt;
use spillway_testkit::eventually;
use spillway_testkit::http::client;
use support::*;

#[tokio::test]
async fn probes_and_metrics_are_on_their_listeners() {
    let mock = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let gw = gateway(&model("m", &[("b", "r", mock.url("/v1"))]));
    let c = client();
    assert_eq!(c.get(gw.url("/livez")).send().await.unwrap().status(), 200);
    eventually(
        Duration::from_secs(5),
        "the gateway becomes ready",
        || async { matches!(c.get(gw.url("/readyz")).send().await, Ok(r) if r.status() == 200) },
    )
    .await;
    for _ in 0..3 {
        chat(&gw, &chat_body("m", false)).await;
    }
    c.post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-nope")
        .json(&chat_body("m", false))
        .send()
        .await
        .unwrap();
    // Refused while read: labelled with what was known by then.
    let no_model = chat(&gw, &chat_body("no-such-model", false)).await;
    assert_eq!(no_model.status(), 404);
    let urgent = Some(("x-spillway-priority", "urgent"));
    let bad_class = chat_with_header(&gw, &chat_body("m", false), urgent).await;
    assert_eq!(bad_class.status(), 400);
    // Metrics are not on the API listener.
    assert_eq!(
        c.get(gw.url("/metrics")).send().await.unwrap().status(),
        404
    );
    let text = metrics(&gw).await;
    let ok = r#"spillway_requests_total{tenant="tenant-a",model="m",backend="b",status="200"} 3"#;
    assert!(text.contains(ok), "{text}");
    let refused = r#"spillway_requests_total{tenant="unknown",model="unknown",backend="none",status="401"} 1"#;
    assert!(text.contains(refused), "{text}");
    let no_model = r#"spillway_requests_total{tenant="tenant-a",model="unknown",backend="none",status="404"} 1"#;
    assert!(text.contains(no_model), "{text}");
    let bad_class =
        r#"spillway_requests_total{tenant="tenant-a",model="m",backend="none",status="400"} 1"#;
    assert!(text.contains(bad_class), "{text}");
    assert!(
        text.contains("spillway_request_duration_seconds_bucket{model=\"m\",backend=\"b\""),
        "{text}"
    );
    assert!(
        text.contains("spillway_backend_outstanding{model=\"m\",backend=\"b\"} 0"),
        "{text}"
    );
    // Responses read to their end are not client cancellations (the series exists from the
    // start, at zero, so alerts on it have something to evaluate).
    assert!(
        text.contains(r#"spillway_client_cancelled_total{model="m",backend="b"} 0"#),
        "{text}"
    );
    // The caller's key never shows up in metrics.
    assert!(!text.contains("sk-nope") && !text.contains(KEY));
}

/// A mock backend of model `m` that answers at 20 tokens a second, up to `max_tokens`: an answer
/// of that many tokens takes `max_tokens / 20` seconds.
fn slow_mock(max_tokens: u32) -> Proc {
    let max = max_tokens.to_string();
    let flags = ["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "20"];
    mock(&[&flags[..], &["--max-output-tokens", &max]].concat())
}

/// A SIGTERM (or SIGINT) that comes as soon as the gateway says it listens is a shutdown like any
/// other: the gateway exits on its own with success, not killed by the signal. Its handlers are
/// in place before it accepts a connection; they were set only once the shutdown was first
/// awaited, after the listeners' tasks had started, and a signal in between killed it (seen as
/// "signal: 15" in a test that stopped a gateway right after its first answer).
#[test]
fn a_signal_as_soon_as_the_gateway_listens_shuts_it_down_cleanly() {
    for (i, signal) in ["TERM", "INT"].iter().cycle().take(16).enumerate() {
        let mut gw = gateway(&model("m", &[("b", "r", "http://127.0.0.1:9/v1".into())]));
        // Sent from here, microseconds after the line is read (a `kill` process takes a
        // millisecond or more to start, past the moment this is about).
        let pid = rustix::process::Pid::from_raw(gw.pid() as i32).expect("a pid");
        let sig = match *signal {
            "TERM" => rustix::process::Signal::TERM,
            _ => rustix::process::Signal::INT,
        };
        rustix::process::kill_process(pid, sig).expect("the signal is sent");
        let status = gw
            .wait_exit(Duration::from_secs(30))
            .expect("the gateway exits after the signal");
        assert!(status.success(), "start {i}, SIG{signal}: {status}");
    }
}

#[tokio::test]
async fn sigterm_lets_inflight_streams_finish_then_exits() {
    let mock = slow_mock(20);
    let mut gw = gateway(&model("m", &[("b", "r", mock.url("/v1"))]));
    let mut body = chat_body("m", true);
    body["max_tokens"] = 20.into();
    let r = chat(&gw, &body).await;
    let mut stream = r.bytes_stream();
    stream.next().await.unwrap().unwrap();
    gw.signal("TERM");
    // New connections are refused soon after the signal...
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    eventually(Duration::from_secs(10), "the listener closes", || async {
        c.get(gw.url("/livez")).send().await.is_err()
    })
    .await;
    // ...while the stream in flight runs to its end.
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.expect("stream completes during shutdown"));
    }
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
    let status = gw
        .wait_exit(Duration::from_secs(20))
        .expect("gateway exits after draining");
    assert!(status.success(), "{status:?}");
}

/// At SIGTERM a keep-alive connection awaiting its next request is closed at once, not held until
/// `shutdown_grace`; a request being served on another is answered, with `connection: close`,
/// and then the gateway exits.
#[tokio::test]
async fn sigterm_closes_idle_connections_at_once_and_closes_busy_ones_after_their_answer() {
    use support::raw::{connect, kept_alive, response, send_chat, until_closed};
    let mock = slow_mock(40);
    let mut gw = gateway(&format!(
        "shutdown_grace = \"60s\"\n{}",
        model("m", &[("b", "r", mock.url("/v1"))])
    ));
    let mut idle = kept_alive(&gw).await;
    let mut busy = connect(&gw).await;
    let mut body = chat_body("m", false);
    body["max_tokens"] = 40.into();
    send_chat(&mut busy, body.to_string().as_bytes()).await;
    eventually(Duration::from_secs(10), "the request in flight", || async {
        sample(&metrics(&gw).await, "spillway_requests_in_flight ").unwrap_or(0.0) >= 1.0
    })
    .await;
    gw.signal("TERM");
    assert!(
        until_closed(&mut idle).await.is_some(),
        "the idle connection is still open"
    );
    let (status, head, _) = response(&mut busy).await;
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert!(until_closed(&mut busy).await.is_some());
    let status = gw
        .wait_exit(Duration::from_secs(20))
        .expect("gateway exits once the answer is written");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn one_worker_thread_serves_completions_streams_and_metrics_then_exits_on_sigterm() {
    let mock = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let backends = model("m", &[("b", "r", mock.url("/v1"))]);
    let mut gw = gateway(&format!("worker_threads = 1\n{backends}"));
    all_served_at_once(&gw, (0..8).map(|i| chat_body("m", i % 2 == 0))).await;
    let text = metrics(&gw).await;
    assert!(
        sample_sum(&text, "spillway_requests_total{") >= 8.0,
        "{text}"
    );
    gw.signal("TERM");
    let status = gw
        .wait_exit(Duration::from_secs(20))
        .expect("gateway exits on SIGTERM");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn sigterm_turns_readiness_off_before_the_listener_closes() {
    let mock = mock(&["--model", "m"]);
    let mut gw = gateway(&format!(
        "shutdown_delay = \"2s\"\n{}",
        model("m", &[("b", "r", mock.url("/v1"))])
    ));
    let c = client();
    eventually(
        Duration::from_secs(5),
        "the gateway becomes ready",
        || async { matches!(c.get(gw.url("/readyz")).send().await, Ok(r) if r.status() == 200) },
    )
    .await;
    gw.signal("TERM");
    eventually(
        Duration::from_secs(5),
        "readiness turns off while still listening",
        || async { matches!(c.get(gw.url("/readyz")).send().await, Ok(r) if r.status() == 503) },
    )
    .await;
    // Liveness stays fine: the process is healthy, only leaving.
    assert_eq!(c.get(gw.url("/livez")).send().await.unwrap().status(), 200);
    let status = gw
        .wait_exit(Duration::from_secs(20))
        .expect("gateway exits after the delay");
    assert!(status.success(), "{status:?}");
}

#[test]
fn check_config_reports_each_problem_with_its_location() {
    let path = std::env::temp_dir().join(format!("spillway-check-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "[[models]]\nname = \"m\"\n[[models.backends]]\nname = \"b\"\nurl = \"nope\"\nweight = 0\n",
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["check-config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("models[\"m\"].backends[0] (\"b\").url: \"nope\" is not an http(s) URL"),
        "{stderr}"
    );
    assert!(
        stderr.contains(".weight: must be between 1 and 1000"),
        "{stderr}"
    );
    // Tenants may live in the store alone: a file without any is not a problem.
    assert!(!stderr.contains("tenants"), "{stderr}");

    std::fs::write(&path, "[server]\nlisten = 1\n").unwrap();
    let out = Command::new(bin())
        .args(["check-config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("line 2"), "{stderr}");

    let ok = Command::new(bin())
        .args(["check-config", "../../examples/quickstart.toml"])
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let missing = Command::new(bin())
        .args(["check-config", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    std::fs::remove_file(&path).unwrap();
}

/// `spillway check-config` on `toml` with `envs` set: exit code and stderr.
fn check_config(toml: &str, envs: &[(&str, &str)]) -> (Option<i32>, String) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("spillway-check-{}-{n}.toml", std::process::id()));
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(bin())
        .args(["check-config", path.to_str().unwrap()])
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const ONE_MODEL: &str = "[[models]]\nname = \"m\"\n[[models.backends]]\nname = \"b\"\nurl = \"http://127.0.0.1:1/v1\"\n";

#[test]
fn check_config_refuses_zero_limits_and_the_tenant_names_dot_and_dot_dot() {
    let toml = format!(
        "[[tenants]]\nname = \"..\"\n[[tenants]]\nname = \"z\"\nrequests_per_min = 0\n\
         tokens_per_min = 0\n{ONE_MODEL}"
    );
    let (code, stderr) = check_config(&toml, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    for e in [
        "tenants[0] (\"..\").name: '.' and '..' are not names",
        "tenants[1] (\"z\").requests_per_min: must be at least 1",
        "tenants[1] (\"z\").tokens_per_min: must be at least 1",
    ] {
        assert!(stderr.contains(e), "missing {e:?} in {stderr}");
    }
}

#[test]
fn check_config_refuses_what_serve_refuses_and_reports_every_problem_at_once() {
    // What the file says: three mistakes in three places, all reported in one run.
    let toml =
        "[[tenants]]\nname = \"bad name\"\n[[tenants]]\nname = \"z\"\nrequests_per_min = 0\n\
                [[models]]\nname = \"m\"\n[[models.backends]]\nname = \"b\"\n\
                url = \"http://127.0.0.1:1/v1\"\nweight = 0\n";
    let (code, stderr) = check_config(toml, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    for e in [
        "tenants[0] (\"bad name\").name: use 1 to 64 characters",
        "tenants[1] (\"z\").requests_per_min: must be at least 1",
        ".weight: must be between 1 and 1000",
        "3 problem(s)",
    ] {
        assert!(stderr.contains(e), "missing {e:?} in {stderr}");
    }

    // What serve would find in the environment: keys named by variables that are not set.
    let db = std::env::temp_dir().join(format!("spillway-check-env-{}.db", std::process::id()));
    let toml = format!(
        "[store]\nurl = \"sqlite://{}\"\n[[tenants]]\nname = \"t\"\n\
         keys = [{{ env = \"SPILLWAY_TEST_UNSET_TENANT_KEY\" }}]\n{ONE_MODEL}\
         api_key_env = \"SPILLWAY_TEST_UNSET_UPSTREAM_KEY\"\n",
        db.display()
    );
    let unset = [
        "tenants[0] (\"t\").keys[0].env: environment variable SPILLWAY_TEST_UNSET_TENANT_KEY is not set",
        "models[\"m\"].backends[0] (\"b\").api_key_env: environment variable SPILLWAY_TEST_UNSET_UPSTREAM_KEY is not set",
    ];
    let (code, stderr) = check_config(&toml, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    for e in unset {
        assert!(stderr.contains(e), "missing {e:?} in {stderr}");
    }
    let set = [
        ("SPILLWAY_TEST_UNSET_TENANT_KEY", "sk-tenant"),
        ("SPILLWAY_TEST_UNSET_UPSTREAM_KEY", "sk-upstream"),
    ];
    let (code, stderr) = check_config(&toml, &set);
    assert_eq!(code, Some(0), "{stderr}");
    // Away from its secrets, the file alone can be checked.
    let path = std::env::temp_dir().join(format!("spillway-check-env-{}.toml", std::process::id()));
    std::fs::write(&path, &toml).unwrap();
    let out = Command::new(bin())
        .args(["check-config", "--no-env", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // serve refuses the same file for the same reasons, all of them.
    let mut serve = Command::new(bin())
        .args(["serve", "--config", path.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = spillway_testkit::wait_exit(&mut serve, Duration::from_secs(30));
    if status.is_none() {
        let _ = serve.kill();
    }
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut serve.stderr.take().unwrap(), &mut stderr).unwrap();
    let _ = serve.wait();
    assert!(
        status.is_some_and(|s| !s.success()),
        "serve did not refuse: {stderr}"
    );
    for e in unset {
        assert!(stderr.contains(e), "serve: missing {e:?} in {stderr}");
    }
    std::fs::remove_file(&path).unwrap();
    for ext in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{ext}", db.display()));
    }

    // Type errors in several tables: one line each, with its line number.
    let (code, stderr) = check_config(
        "[server]\nlisten = 1\n[upstream]\nconnect_timeout = 5\n",
        &[],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("line 2") && stderr.contains("line 4"),
        "{stderr}"
    );
    assert!(stderr.contains("2 problem(s)"), "{stderr}");
}

#[test]
fn every_example_config_is_valid() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            // The examples name environment variables for their keys that are not set here.
            let out = Command::new(bin())
                .args(["check-config", "--no-env"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            seen += 1;
        }
    }
    assert!(
        seen >= 3,
        "examples: quickstart, vLLM in two regions, Azure"
    );
}

#[tokio::test]
async fn quickstart_serves_mock_small_with_the_printed_key() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env("SPILLWAY_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut url = None;
    let mut key = None;
    for line in lines.by_ref().take(10) {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("spillway listening on ") {
            url = rest.split_whitespace().next().map(str::to_owned);
        }
        if let Some(k) = line.strip_prefix("API key: ") {
            key = Some(k.trim().to_owned());
            break;
        }
    }
    let (url, key) = (url.expect("URL printed"), key.expect("key printed"));
    let v: serde_json::Value = client()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&chat_body("mock-small", false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "chat.completion", "{v}");
    let _ = child.kill();
    let _ = child.wait();
}
