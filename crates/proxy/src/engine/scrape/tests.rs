//! The scrape tasks against small engines served on 127.0.0.1 whose page the test changes,
//! stalls or inflates, and against the real llama.cpp server when one is running.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderMap;
use spillway_config::{BackendKind, Config};
use tokio::sync::watch;

use super::*;
use crate::engine::metrics::{READING_AGE, RUNNING, SCRAPE_ERRORS, WAITING};
use crate::pool::Models;

/// A stand-in engine: serves `text` at `/metrics`, or never answers while `stall` is set, and
/// remembers the `authorization` header it was sent.
#[derive(Clone, Default)]
struct FakeEngine {
    text: Arc<Mutex<String>>,
    stall: Arc<AtomicBool>,
    authorization: Arc<Mutex<Option<String>>>,
}

impl FakeEngine {
    fn with_page(text: &str) -> Self {
        let engine = FakeEngine::default();
        engine.set_page(text);
        engine
    }

    fn set_page(&self, text: &str) {
        *self.text.lock().unwrap() = text.to_owned();
    }

    async fn serve(&self) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let me = self.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move |headers: HeaderMap| {
                let me = me.clone();
                async move {
                    *me.authorization.lock().unwrap() = headers
                        .get(http::header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    if me.stall.load(Ordering::SeqCst) {
                        std::future::pending::<()>().await;
                    }
                    let text = me.text.lock().unwrap().clone();
                    text
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }
}

fn llama_page(processing: u32, deferred: u32) -> String {
    format!(
        "# HELP llamacpp:requests_processing Number of requests processing\n\
         # TYPE llamacpp:requests_processing gauge\n\
         llamacpp:requests_processing {processing}\n\
         # HELP llamacpp:requests_deferred Number of requests deferred\n\
         # TYPE llamacpp:requests_deferred gauge\n\
         llamacpp:requests_deferred {deferred}\n"
    )
}

/// A gateway's pools for `model` with one backend `b` at `url`, fast scrapes and `extra`
/// settings for the backend.
fn models(model: &str, url: &str, extra: &str) -> (Models, EngineMetricsConfig, HttpClient) {
    let config = Config::from_toml(&format!(
        r#"
[engine_metrics]
interval = "20ms"
jitter = 0.0
timeout = "200ms"
stale_after = "500ms"
max_body_bytes = 4096
[[models]]
name = "{model}"
[[models.backends]]
name = "b"
url = "{url}"
{extra}
"#
    ))
    .unwrap();
    let models = crate::pool::tests::models(&config);
    let client = crate::upstream::client(&config.upstream);
    (models, config.engine_metrics, client)
}

/// Polls `f` until it gives a value; fails the test after ten seconds (a busy 2-core machine).
async fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let mut found = None;
    spillway_testkit::eventually(Duration::from_secs(10), what, || {
        found = f();
        std::future::ready(found.is_some())
    })
    .await;
    found.expect("eventually returns once a value was found")
}

/// The value of a series on spillway's own metrics page, 0 when it is not there.
fn series(name: &str, model: &str, reason: Option<&str>) -> f64 {
    let page = crate::metrics::recorder().render();
    let model = format!("model=\"{model}\"");
    let reason = reason.map(|r| format!("reason=\"{r}\""));
    page.lines()
        .find(|l| {
            l.starts_with(&format!("{name}{{"))
                && l.contains(&model)
                && reason.as_ref().is_none_or(|r| l.contains(r.as_str()))
        })
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

fn load_of(models: &Models, model: &str) -> Arc<EngineLoad> {
    models.get(model).unwrap().backends[0]
        .engine
        .clone()
        .unwrap()
}

#[tokio::test]
async fn the_reading_appears_and_follows_the_page() {
    let engine = FakeEngine::with_page(&llama_page(2, 1));
    let addr = engine.serve().await;
    let (models, config, client) = models("scrape-follows", &format!("http://{addr}/v1"), "");
    let load = load_of(&models, "scrape-follows");
    assert_eq!(load.uri().to_string(), format!("http://{addr}/metrics"));
    assert_eq!(load.reading(Instant::now()), None);
    let (stop, stop_rx) = watch::channel(false);
    spawn_scrapes(models.pools(), client, config, stop_rx);

    let first = until("a first reading", || load.reading(Instant::now())).await;
    assert_eq!(
        (first.running, first.waiting, first.kv_usage, first.engine),
        (2, 1, None, Engine::Llamacpp)
    );
    assert!(!first.stale);
    engine.set_page(&llama_page(0, 5));
    until("the new page's reading", || {
        load.reading(Instant::now())
            .filter(|r| (r.running, r.waiting) == (0, 5))
    })
    .await;

    let pool = models.get("scrape-follows").unwrap();
    let b = &pool.backends[0];
    crate::engine::metrics::render(
        &pool.name,
        &b.name,
        b.engine.as_ref().unwrap(),
        Instant::now(),
    );
    assert_eq!(series(RUNNING, "scrape-follows", None), 0.0);
    assert_eq!(series(WAITING, "scrape-follows", None), 5.0);
    assert!(series(READING_AGE, "scrape-follows", None) < 10.0);
    let _ = stop.send(true);
}

#[tokio::test]
async fn attempts_sent_since_the_reading_count_until_the_next_one() {
    let engine = FakeEngine::with_page(&llama_page(1, 0));
    let addr = engine.serve().await;
    let (models, config, client) = models("scrape-sent", &format!("http://{addr}/v1"), "");
    let load = load_of(&models, "scrape-sent");
    let (stop, stop_rx) = watch::channel(false);
    spawn_scrapes(models.pools(), client, config, stop_rx);
    until("a first reading", || load.reading(Instant::now())).await;

    // Hold the scrapes off (they time out) so no reading lands while attempts are counted.
    let timeouts = series(SCRAPE_ERRORS, "scrape-sent", Some("timeout"));
    engine.stall.store(true, Ordering::SeqCst);
    until("a scrape timing out", || {
        (series(SCRAPE_ERRORS, "scrape-sent", Some("timeout")) > timeouts).then_some(())
    })
    .await;
    let backend = &models.get("scrape-sent").unwrap().backends[0];
    let holds: Vec<_> = (0..3).map(|_| backend.try_acquire().unwrap()).collect();
    assert_eq!(load.reading(Instant::now()).unwrap().sent_since, 3);
    drop(holds);

    engine.set_page(&llama_page(4, 0));
    engine.stall.store(false, Ordering::SeqCst);
    let next = until("the next reading", || {
        load.reading(Instant::now()).filter(|r| r.running == 4)
    })
    .await;
    assert_eq!(next.sent_since, 0);
    let _ = stop.send(true);
}

#[tokio::test]
async fn a_stalled_engine_counts_timeouts_and_its_reading_goes_stale() {
    let engine = FakeEngine::with_page(&llama_page(1, 0));
    let addr = engine.serve().await;
    let (models, config, client) = models("scrape-stall", &format!("http://{addr}/v1"), "");
    let stale_after = config.stale_after;
    let load = load_of(&models, "scrape-stall");
    let (stop, stop_rx) = watch::channel(false);
    spawn_scrapes(models.pools(), client, config, stop_rx);
    until("a first reading", || load.reading(Instant::now())).await;

    engine.stall.store(true, Ordering::SeqCst);
    until("a scrape timing out", || {
        (series(SCRAPE_ERRORS, "scrape-stall", Some("timeout")) > 0.0).then_some(())
    })
    .await;
    let stale = until("the reading going stale", || {
        load.reading(Instant::now()).filter(|r| r.stale)
    })
    .await;
    assert!(stale.age > stale_after, "{stale:?}");
    // The last numbers stay, flagged: a reader counts the engine as full, not as idle.
    assert_eq!((stale.running, stale.waiting), (1, 0));
    let _ = stop.send(true);
}

#[tokio::test]
async fn an_oversized_page_is_refused_and_counted() {
    let huge = format!("{}{}", "# padding\n".repeat(1000), llama_page(1, 0));
    let engine = FakeEngine::with_page(&huge);
    let addr = engine.serve().await;
    let (models, config, client) = models("scrape-huge", &format!("http://{addr}/v1"), "");
    let load = load_of(&models, "scrape-huge");
    let (stop, stop_rx) = watch::channel(false);
    spawn_scrapes(models.pools(), client, config, stop_rx);
    until("a page refused as too large", || {
        (series(SCRAPE_ERRORS, "scrape-huge", Some("too_large")) >= 2.0).then_some(())
    })
    .await;
    assert_eq!(load.reading(Instant::now()), None);
    let _ = stop.send(true);
}

#[tokio::test]
async fn a_page_of_another_engine_is_a_parse_error() {
    let engine = FakeEngine::with_page(&llama_page(1, 0));
    let addr = engine.serve().await;
    let extra = "engine = \"vllm\"";
    let (models, config, client) = models("scrape-wrong", &format!("http://{addr}/v1"), extra);
    let load = load_of(&models, "scrape-wrong");
    let (stop, stop_rx) = watch::channel(false);
    spawn_scrapes(models.pools(), client, config, stop_rx);
    until("a parse error", || {
        (series(SCRAPE_ERRORS, "scrape-wrong", Some("parse")) > 0.0).then_some(())
    })
    .await;
    assert_eq!(load.reading(Instant::now()), None);
    let _ = stop.send(true);
}

#[tokio::test]
async fn the_backend_key_is_sent_with_the_scrape() {
    std::env::set_var("SPILLWAY_TEST_ENGINE_SCRAPE_KEY", "sk-engine-test");
    let engine = FakeEngine::with_page(&llama_page(1, 0));
    let addr = engine.serve().await;
    let extra = "api_key_env = \"SPILLWAY_TEST_ENGINE_SCRAPE_KEY\"";
    let (models, config, client) = models("scrape-key", &format!("http://{addr}/v1"), extra);
    let load = load_of(&models, "scrape-key");
    let (stop, stop_rx) = watch::channel(false);
    spawn_scrapes(models.pools(), client, config, stop_rx);
    until("a first reading", || load.reading(Instant::now())).await;
    assert_eq!(
        engine.authorization.lock().unwrap().as_deref(),
        Some("Bearer sk-engine-test")
    );
    let _ = stop.send(true);
}

#[tokio::test]
async fn backends_on_one_engine_share_its_state() {
    let config = Config::from_toml(
        r#"
[[models]]
name = "shared-a"
[[models.backends]]
name = "one"
url = "http://127.0.0.1:9/v1"
[[models]]
name = "shared-b"
[[models.backends]]
name = "one"
url = "http://127.0.0.1:9/v1"
[[models.backends]]
name = "two"
url = "http://127.0.0.1:9/v1"
metrics_url = "http://127.0.0.1:10/metrics"
[[models.backends]]
name = "off"
url = "http://127.0.0.1:9/v1"
engine = "none"
[[models.backends]]
name = "sim"
kind = "mock"
"#,
    )
    .unwrap();
    // A mock's base URL is its in-process listener's, known only at start.
    let models = Models::new(&config, |_, b| match &b.kind {
        BackendKind::OpenAi { url } => Ok(url.clone()),
        BackendKind::Mock(_) => Ok("http://127.0.0.1:5555/v1".parse().unwrap()),
        other => Err(format!("unexpected {other:?}")),
    })
    .unwrap();
    let a = &models.get("shared-a").unwrap().backends;
    let b = &models.get("shared-b").unwrap().backends;
    let (a1, b1) = (a[0].engine.as_ref().unwrap(), b[0].engine.as_ref().unwrap());
    assert!(Arc::ptr_eq(a1, b1));
    assert!(!Arc::ptr_eq(a1, b[1].engine.as_ref().unwrap()));
    assert!(b[2].engine.is_none());
    let sim = b[3].engine.as_ref().unwrap();
    assert_eq!(sim.uri().to_string(), "http://127.0.0.1:5555/metrics");
    assert_eq!(sim.engine(), Engine::Auto);
}

#[test]
fn the_wait_stays_within_the_jitter() {
    let interval = Duration::from_millis(250);
    assert_eq!(next_wait(interval, 0.2, 0.0), Duration::from_millis(200));
    assert_eq!(next_wait(interval, 0.2, 0.5), interval);
    assert!(next_wait(interval, 0.2, 0.999_999) <= Duration::from_millis(300));
    assert_eq!(next_wait(interval, 0.0, 0.9), interval);
    assert_eq!(next_wait(interval, 1.0, 0.0), interval.mul_f64(0.05));
}

/// Against llama.cpp's own server, when one runs on 127.0.0.1:18101 (CI starts its own).
#[tokio::test]
async fn the_real_llamacpp_server_is_read() {
    let addr: SocketAddr = "127.0.0.1:18101".parse().unwrap();
    let reachable =
        tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
            .await
            .is_ok_and(|c| c.is_ok());
    if !reachable {
        println!("skipped: no llama.cpp server on {addr}");
        return;
    }
    let (models, config, client) = models("scrape-llamacpp", &format!("http://{addr}/v1"), "");
    let load = load_of(&models, "scrape-llamacpp");
    let (stop, stop_rx) = watch::channel(false);
    spawn_scrapes(models.pools(), client, config, stop_rx);
    let reading = until("a reading from llama.cpp", || load.reading(Instant::now())).await;
    assert_eq!(reading.engine, Engine::Llamacpp);
    assert!(!reading.stale);
    let _ = stop.send(true);
}
