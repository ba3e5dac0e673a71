//! spillway in front of real llama.cpp servers (the `xllamacpp` wheel with Gemma 3 270M, started
//! by `tests/llamacpp/serve.py`): it reads their metrics and routes on them.
//!
//! Needs `SPILLWAY_LLAMACPP_PYTHON` (a Python with `tests/llamacpp/requirements.txt`); without it
//! the tests say so and pass, unless `SPILLWAY_REQUIRE_LLAMACPP=1` (as `.ci/run` sets), when they
//! fail.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use spillway_testkit::eventually;
use spillway_testkit::http::client;
use support::*;

/// A llama.cpp server, killed on drop.
struct Llama {
    child: Child,
    url: String,
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a llama.cpp server with `slots` slots, or `None` (with a note) when none can be run
/// here and none is required.
fn llama(slots: u32) -> Option<Llama> {
    llama_ctx(slots, 2048 * slots)
}

/// Like [`llama`], with `ctx` tokens of context split across the slots.
fn llama_ctx(slots: u32, ctx: u32) -> Option<Llama> {
    let Ok(python) = std::env::var("SPILLWAY_LLAMACPP_PYTHON") else {
        assert!(
            std::env::var("SPILLWAY_REQUIRE_LLAMACPP").as_deref() != Ok("1"),
            "SPILLWAY_REQUIRE_LLAMACPP=1 but SPILLWAY_LLAMACPP_PYTHON is not set"
        );
        eprintln!("skipped: SPILLWAY_LLAMACPP_PYTHON is not set (see tests/llamacpp/README.md)");
        return None;
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/llamacpp/serve.py");
    let ctx = ctx.to_string();
    let mut child = Command::new(python)
        .args([
            script,
            "--port",
            "0",
            "--threads",
            "1",
            "--exit-with-parent",
        ])
        .args(["--slots", &slots.to_string(), "--ctx", &ctx])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start tests/llamacpp/serve.py");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("ready ") {
                let _ = tx.send(url.trim().to_owned());
            }
        }
    });
    let url = match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(url) => url,
        Err(_) => {
            let _ = child.kill();
            panic!("llama.cpp did not start within 120 s");
        }
    };
    Some(Llama { child, url })
}

fn gauge(page: &str, name: &str, backend: &str) -> Option<f64> {
    sample(
        page,
        &format!("{name}{{model=\"m\",backend=\"{backend}\"}}"),
    )
}

/// A long generation, so that a request holds its slot for seconds.
fn long_request() -> serde_json::Value {
    serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": 400,
        "ignore_eos": true,
    })
}

#[tokio::test]
async fn llamacpp_metrics_are_read_and_a_queueing_engine_spills_over() {
    let Some(home) = llama(1) else { return };
    let Some(away) = llama(1) else { return };
    let cfg = format!(
        "home_region = \"region-a\"\n\
         [engine_metrics]\ninterval = \"100ms\"\ntimeout = \"1s\"\nstale_after = \"3s\"\nmax_queue = 0\n\
         [upstream]\nresponse_timeout = \"120s\"\n\n\
         [[models]]\nname = \"m\"\n\
         [[models.backends]]\nname = \"a\"\nregion = \"region-a\"\nurl = \"{}/v1\"\nengine = \"llamacpp\"\n\
         [[models.backends]]\nname = \"b\"\nregion = \"region-b\"\nurl = \"{}/v1\"\nengine = \"llamacpp\"\n",
        home.url, away.url
    );
    let gw = gateway(&cfg);
    let deadline = Duration::from_secs(60);
    let read = |backend: &'static str, name: &'static str, want: f64| {
        let gw = &gw;
        async move {
            let page = metrics(gw).await;
            let fresh = gauge(&page, "spillway_engine_reading_age_seconds", backend)
                .is_some_and(|age| age < 3.0);
            fresh && gauge(&page, name, backend) == Some(want)
        }
    };
    eventually(deadline, "idle readings of both engines", || async {
        read("a", "spillway_engine_requests_running", 0.0).await
            && read("b", "spillway_engine_requests_running", 0.0).await
    })
    .await;

    let c = client();
    let send = || tokio::spawn(chat_through(&c, &gw, &long_request()).send());
    // The home engine's one slot takes the first request...
    let first = send();
    eventually(deadline, "home running one request", || {
        read("a", "spillway_engine_requests_running", 1.0)
    })
    .await;
    // ...it queues the second (an empty queue is not saturated)...
    let second = send();
    eventually(deadline, "home queueing one request", || {
        read("a", "spillway_engine_requests_waiting", 1.0)
    })
    .await;
    // ...and, its queue past the bound, the third spills over to the other region.
    let third = send();
    eventually(deadline, "the other engine running the third", || {
        read("b", "spillway_engine_requests_running", 1.0)
    })
    .await;
    let page = metrics(&gw).await;
    assert_eq!(
        gauge(&page, "spillway_engine_requests_waiting", "a"),
        Some(1.0),
        "{page}"
    );
    for r in [first, second, third] {
        r.abort();
    }
}

/// The lesson of the adaptive limit that throttled healthy llama.cpp servers: a burst of
/// concurrent requests on healthy engines, more than their slots, is queued and served, never
/// shed by admission, throttling or the adaptive limit, streams included.
#[tokio::test]
async fn llamacpp_a_concurrent_burst_on_healthy_engines_is_all_served() {
    let Some(one) = llama(2) else { return };
    let Some(two) = llama(2) else { return };
    let cfg = format!(
        "[upstream]\nresponse_timeout = \"120s\"\n\n\
         [[models]]\nname = \"m\"\n\
         [[models.backends]]\nname = \"a\"\nurl = \"{}/v1\"\nengine = \"llamacpp\"\n\
         [[models.backends]]\nname = \"b\"\nurl = \"{}/v1\"\nengine = \"llamacpp\"\n",
        one.url, two.url
    );
    let gw = gateway(&cfg);
    served_in_full(&gw, 24).await;
    let page = metrics(&gw).await;
    assert_eq!(sample_sum(&page, "spillway_throttled_total"), 0.0, "{page}");
    // llama.cpp's server sends no `Date`; the gateway dates what it relays.
    let c = client();
    let ask = serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "Say a word."}],
        "max_tokens": 2,
    });
    let direct = c
        .post(format!("{}/v1/chat/completions", one.url))
        .timeout(Duration::from_secs(120))
        .json(&ask);
    let direct = direct.send().await.unwrap();
    assert_eq!(direct.status(), 200);
    assert!(direct.headers().get("date").is_none(), "{direct:?}");
    let through = chat_through(&c, &gw, &ask).send().await.unwrap();
    assert_eq!(through.status(), 200);
    dated_now(through.headers());
}

/// The `event:` names of an SSE body in order, each run of one name (the deltas) as one.
fn event_kinds(text: &str) -> Vec<String> {
    let mut kinds: Vec<String> = Vec::new();
    for name in text.lines().filter_map(|l| l.strip_prefix("event:")) {
        let name = name.trim();
        if kinds.last().map(String::as_str) != Some(name) {
            kinds.push(name.to_owned());
        }
    }
    kinds
}

/// Prompt and output tokens of a Responses or Messages answer, plain or streamed, as a caller
/// adds them up (the Messages API counts prompt-cache reads apart).
fn tokens(text: &str) -> (u64, u64) {
    let docs: Vec<serde_json::Value> = if text.trim_start().starts_with('{') {
        vec![serde_json::from_str(text).unwrap()]
    } else {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    };
    let (mut input, mut output) = (0, 0);
    for doc in &docs {
        for usage in [
            &doc["usage"],
            &doc["message"]["usage"],
            &doc["response"]["usage"],
        ] {
            let n = |f: &str| usage[f].as_u64();
            if let Some(i) = n("input_tokens") {
                input = i + n("cache_read_input_tokens").unwrap_or(0);
            }
            if let Some(o) = n("output_tokens") {
                output = o;
            }
        }
    }
    (input, output)
}

#[tokio::test]
async fn llamacpp_responses_and_messages_through_spillway_answer_as_direct() {
    let Some(engine) = llama(2) else { return };
    let gw = gateway(&format!(
        "[upstream]\nresponse_timeout = \"120s\"\n\n\
         [[models]]\nname = \"m\"\n\
         [[models.backends]]\nname = \"a\"\nurl = \"{}/v1\"\nengine = \"llamacpp\"\n\n\
         [[tenants]]\nname = \"metered\"\nkeys = [{{ sha256 = \"{}\" }}]\ntokens_per_min = 1000000\n",
        engine.url,
        sha256_hex("sk-metered")
    ));
    let prompt = "Name a colour.";
    let mut charged = 0;
    let calls = [
        (
            "/v1/responses",
            serde_json::json!({"model": "m", "input": prompt, "max_output_tokens": 6, "temperature": 0}),
        ),
        (
            "/v1/responses",
            serde_json::json!({"model": "m", "input": prompt, "max_output_tokens": 6, "temperature": 0, "stream": true}),
        ),
        (
            "/v1/messages",
            serde_json::json!({"model": "m", "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": prompt}]}),
        ),
        (
            "/v1/messages",
            serde_json::json!({"model": "m", "max_tokens": 6, "temperature": 0, "stream": true, "messages": [{"role": "user", "content": prompt}]}),
        ),
        (
            "/v1/messages/count_tokens",
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": prompt}]}),
        ),
    ];
    let c = client();
    for (path, body) in calls {
        let send = |url: String, key: bool| {
            let mut req = c.post(url).timeout(Duration::from_secs(120)).json(&body);
            if key {
                req = req
                    .header("x-api-key", "sk-metered")
                    .header("anthropic-version", "2023-06-01");
            }
            async move {
                let r = req.send().await.unwrap();
                (r.status().as_u16(), r.text().await.unwrap())
            }
        };
        let (direct_status, direct) = send(format!("{}{path}", engine.url), false).await;
        let (status, through) = send(gw.url(path), true).await;
        assert_eq!(
            status, direct_status,
            "{path}: {through} / direct: {direct}"
        );
        assert_eq!(status, 200, "{path}: {through}");
        if body["stream"] == true {
            assert_eq!(
                event_kinds(&through),
                event_kinds(&direct),
                "{path}: {through}"
            );
        }
        if path.ends_with("count_tokens") {
            let n = |t: &str| {
                serde_json::from_str::<serde_json::Value>(t).unwrap()["input_tokens"].as_u64()
            };
            assert_eq!(n(&through), n(&direct), "{through} / {direct}");
            assert!(n(&through).unwrap() > 0);
        } else {
            // Greedy decoding: the same tokens, however much of the prompt was cached.
            assert_eq!(
                tokens(&through),
                tokens(&direct),
                "{path}: {through} / direct: {direct}"
            );
            assert!(tokens(&through).1 > 0, "{path}: {through}");
            charged += tokens(&through).0 + tokens(&through).1;
        }
    }
    // Each answer's usage, as the engine reported it, was what the tenant was charged.
    eventually(Duration::from_secs(10), "usage settled", || async {
        let page = metrics(&gw).await;
        sample(&page, r#"spillway_tokens_reported_total{tenant="metered"}"#) == Some(charged as f64)
    })
    .await;
}

#[tokio::test]
async fn llamacpp_a_prompt_over_a_models_context_falls_back_to_one_with_room() {
    let Some(short) = llama_ctx(1, 256) else {
        return;
    };
    let Some(long) = llama(1) else { return };
    let gw = gateway(&format!(
        "[upstream]\nresponse_timeout = \"120s\"\n\n\
         [[models]]\nname = \"long\"\n\
         [[models.backends]]\nname = \"l\"\nurl = \"{}/v1\"\nengine = \"llamacpp\"\n\
         [[models]]\nname = \"short\"\nfallbacks = [{{ model = \"long\", on = [\"context_window\"] }}]\n\
         [[models.backends]]\nname = \"s\"\nurl = \"{}/v1\"\nengine = \"llamacpp\"\n",
        long.url, short.url
    ));
    let prompt = "Tell me about lighthouses and the sea. ".repeat(60);
    let body = serde_json::json!({
        "model": "short", "max_tokens": 4,
        "messages": [{"role": "user", "content": prompt}],
    });
    // Directly, the short-context engine refuses the prompt.
    let direct = client()
        .post(format!("{}/v1/chat/completions", short.url))
        .timeout(Duration::from_secs(120))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 400);
    let why = direct.text().await.unwrap();
    assert!(why.contains("exceed_context_size"), "{why}");
    // Through spillway, the request moves on to the model with room.
    let r = chat_through(&client(), &gw, &body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-spillway-model"], "long");
    let page = metrics(&gw).await;
    assert_eq!(
        sample(
            &page,
            r#"spillway_fallbacks_total{model="short",to="long",trigger="context_window"}"#
        ),
        Some(1.0),
        "{page}"
    );
}

/// A chat completion through `gw` with the test key, given the time a CPU-bound engine needs.
fn chat_through(
    c: &reqwest::Client,
    gw: &Proc,
    body: &serde_json::Value,
) -> reqwest::RequestBuilder {
    c.post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .timeout(Duration::from_secs(120))
        .json(body)
}

/// Sends `requests` at once; each one's status and body, in order (a send that failed panics,
/// naming its index).
async fn all_at_once(requests: Vec<reqwest::RequestBuilder>) -> Vec<(u16, String)> {
    let sends = requests.into_iter().map(|req| async move {
        let r = req.send().await.map_err(|e| e.to_string())?;
        let status = r.status().as_u16();
        Ok::<_, String>((status, r.text().await.map_err(|e| e.to_string())?))
    });
    futures_util::future::join_all(sends)
        .await
        .into_iter()
        .enumerate()
        .map(|(i, answer)| answer.unwrap_or_else(|e| panic!("{i}: {e}")))
        .collect()
}

/// Sends `n` small chats at once (every third streamed) and asserts each was answered in full.
async fn served_in_full(gw: &Proc, n: usize) {
    let c = client();
    let requests = (0..n)
        .map(|i| {
            let body = serde_json::json!({
                "model": "m",
                "messages": [{"role": "user", "content": format!("Say a word, {i}.")}],
                "max_tokens": 8,
                "stream": i % 3 == 0,
            });
            chat_through(&c, gw, &body)
        })
        .collect();
    for (i, (status, body)) in all_at_once(requests).await.into_iter().enumerate() {
        assert_eq!(status, 200, "request {i}: {body}");
        if i % 3 == 0 {
            assert!(
                body.trim_end().ends_with("data: [DONE]"),
                "stream {i}: {body}"
            );
        }
    }
}

#[tokio::test]
async fn llamacpp_a_rollout_onto_an_identical_engine_completes_through_a_reload() {
    // The new version is another llama.cpp server with the same model: a rollout that must not
    // halt on a real engine's own variation, and a reload in its middle that loses nothing.
    let Some(one) = llama(2) else { return };
    let Some(two) = llama(2) else { return };
    let body = |retry: u32| {
        format!(
            "[upstream]\nresponse_timeout = \"120s\"\n[retry]\nmax_attempts = {retry}\n\
             [[models]]\nname = \"m\"\n\
             [[models.backends]]\nname = \"a\"\nurl = \"{}/v1\"\nengine = \"llamacpp\"\n\
             [models.rollout]\nsteps = [50, 100]\nmin_step_duration = \"1s\"\nmin_step_requests = 8\n\
             [[models.rollout.backends]]\nname = \"b\"\nurl = \"{}/v1\"\nengine = \"llamacpp\"\n",
            one.url, two.url
        )
    };
    let token = "llamacpp-admin-token";
    let gw = gateway_with_env(&body(3), &[("SPILLWAY_ADMIN_TOKEN", token)]);
    let status = || async {
        let r = admin_call(
            gw.admin_url("/admin/rollouts"),
            token,
            reqwest::Method::GET,
            None,
        )
        .await;
        let v: serde_json::Value = r.json().await.unwrap();
        v["rollouts"][0].clone()
    };
    // A reload that lands while a burst is on the engines.
    gw.rewrite_config(&body(2));
    let reload = admin_call(
        gw.admin_url("/admin/config/reload"),
        token,
        reqwest::Method::POST,
        None,
    );
    let ((), r) = tokio::join!(served_in_full(&gw, 8), reload);
    assert_eq!(r.status(), 200);
    eventually(
        Duration::from_secs(240),
        "the rollout to complete",
        || async {
            served_in_full(&gw, 8).await;
            let r = status().await;
            let state = r["state"]["status"].as_str().unwrap_or("").to_owned();
            assert!(
                state == "running" || state == "completed",
                "the rollout stopped: {r}"
            );
            state == "completed"
        },
    )
    .await;
    let page = metrics(&gw).await;
    assert_eq!(
        sample_sum(&page, "spillway_backend_4xx_anomaly"),
        0.0,
        "{page}"
    );
}

/// Affinity's load bound on real engines under a burst on one prompt prefix: twelve requests
/// sharing a system prompt, sent at once to two llama.cpp servers of two slots each (engine
/// metrics off, so the bound alone decides), each holding its slot for seconds. Every one is
/// served; the key's backend takes no more than 1.25 x its share of the twelve in flight
/// (ceil(1.25 x 12 / 2) = 8); the rest overflow to the other.
#[tokio::test]
async fn llamacpp_a_burst_on_one_prefix_is_all_served_within_the_load_bound() {
    let Some(one) = llama(2) else { return };
    let Some(two) = llama(2) else { return };
    let cfg = format!(
        "[health_check]\nenabled = false\n\n[upstream]\nresponse_timeout = \"120s\"\n\n\
         [[models]]\nname = \"m\"\nbalance = \"prefix_affinity\"\naffinity_prefix_chars = 256\n\
         [[models.backends]]\nname = \"a\"\nurl = \"{}/v1\"\nengine = \"none\"\n\
         [[models.backends]]\nname = \"b\"\nurl = \"{}/v1\"\nengine = \"none\"\n",
        one.url, two.url
    );
    let gw = gateway(&cfg);
    let system = "You summarise support tickets for the on-call engineer, briefly. ".repeat(6);
    let c = client();
    let requests = (0..12)
        .map(|i| {
            let body = serde_json::json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": format!("Ticket {i}: the printer is on fire.")}
                ],
                "max_tokens": 48,
                "ignore_eos": true,
            });
            chat_through(&c, &gw, &body)
        })
        .collect();
    for (i, (status, body)) in all_at_once(requests).await.into_iter().enumerate() {
        assert_eq!(status, 200, "request {i}: {body}");
    }
    let page = metrics(&gw).await;
    let on = |backend: &str| {
        sample(
            &page,
            &format!(
                "spillway_requests_total{{tenant=\"tenant-a\",model=\"m\",backend=\"{backend}\",status=\"200\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    let (on_a, on_b) = (on("a"), on("b"));
    assert_eq!(on_a + on_b, 12.0, "{page}");
    assert!(on_a.max(on_b) <= 8.0, "{on_a} / {on_b}");
    assert!(on_a.min(on_b) >= 4.0, "{on_a} / {on_b}");
    let overflows = sample(
        &page,
        "spillway_affinity_total{model=\"m\",outcome=\"overflow\"}",
    );
    assert!(overflows.unwrap_or(0.0) >= 4.0, "{page}");
}
