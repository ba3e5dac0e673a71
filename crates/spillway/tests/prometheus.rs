//! The shipped alerts and dashboard against a real Prometheus scraping a real gateway through a
//! retry storm (IL-0248): mock backends fail a share of their requests while naive callers
//! resend every failure at once. Prometheus loads `deploy/prometheus/alerts.yml` (its `for:`
//! held at 0s and its rates taken over 30s here; promtool's unit tests hold the real timing)
//! and must see the amplification and retry-budget alerts fire, evaluate every rule without an
//! error, and answer every query of `deploy/grafana/spillway.json` and every series the rules
//! read with data: a rule or a panel that reads nothing is a defect.
//!
//! Each panel gets its data from the scenario. Model `m` (backends `a`, `b`) is stormed: its
//! retry budget is raised to 20 % so that its amplification can pass 1.1x, its backends each
//! fail 30 % of requests (too few to be ejected), and an SDK-like caller's marked retries are
//! shed. Model `m2` (backend `c`) starts answering 400 to half its requests (IL-0235) under a
//! short `[anomaly]` window. Model `m3` (backend `d`) is sometimes full, so another SDK-like
//! caller's marked retries are served. Tenant `tenant-c`, over its requests-per-minute limit,
//! is shed; a caller tries keys nobody has (the negative cache, of one entry, evicts); both
//! Redis layers point at a closed port (the shared limits fall back to local ones, the key
//! cache's layer counts its errors); the key cache's short TTL keeps the store and its pool
//! busy.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

#[path = "prom/mod.rs"]
mod prom;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_testkit::http::client;
use support::*;

const KEY_C: &str = "sk-test-tenant-c";
/// What the storm must make Prometheus fire.
const MUST_FIRE: [&str; 5] = [
    "SpillwayRetryAmplification",
    "SpillwayRetryBudgetExhausted",
    "SpillwaySharedLimitsFallback",
    "SpillwayTenantShedRateHigh",
    "SpillwayUpstream4xxJump",
];
/// The longest the whole storm may run (each caller stops at it, whatever happens).
const STORM_AT_MOST: Duration = Duration::from_secs(120);
/// What a failure prints: the figures behind the alerts that must fire.
const DIAGNOSE: [&str; 6] = [
    "model:spillway_requests:rate5m",
    "model:spillway_upstream_attempts:rate5m",
    "max_over_time(model:spillway_amplification:ratio5m[2m])",
    "max_over_time((model:spillway_upstream_attempts:rate5m - 1.1 * model:spillway_requests:rate5m)[2m:1s])",
    "model:spillway_retry_budget_exhausted:rate5m",
    "spillway_backend_4xx_share or spillway_backend_4xx_anomaly",
];
/// Stands in for Grafana's `$__rate_interval` (several 1 s scrapes).
const RATE_INTERVAL: &str = "30s";

/// One open-loop caller: `per_sec` new requests a second, each resent at once after a 429, a
/// 5xx or a connection error, up to `resends` times, with `x-stainless-retry-count` if `marked`
/// (as the OpenAI SDKs mark theirs). At most 64 chains in flight (a new one beyond is dropped);
/// stops at `stop` or `until`.
struct Caller {
    /// `None`: a key the gateway does not know, a new one per request (a caller probing keys).
    key: Option<&'static str>,
    model: &'static str,
    per_sec: u32,
    resends: u32,
    marked: bool,
}

async fn run_caller(
    gw_url: String,
    who: Caller,
    until: Instant,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) {
    let c = client();
    let seats = Arc::new(tokio::sync::Semaphore::new(64));
    let gap = Duration::from_secs(1) / who.per_sec;
    let mut next = Instant::now();
    let mut chains = Vec::new();
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        tokio::time::sleep_until(next.into()).await;
        next += gap;
        let Ok(seat) = seats.clone().try_acquire_owned() else {
            continue;
        };
        let (c, url, stop, sent) = (c.clone(), gw_url.clone(), stop.clone(), sent.clone());
        let (key, model, resends, marked) = (who.key, who.model, who.resends, who.marked);
        chains.push(tokio::spawn(async move {
            let _seat = seat;
            for attempt in 0..=resends {
                if stop.load(Ordering::Relaxed) || Instant::now() >= until {
                    return;
                }
                sent.fetch_add(1, Ordering::Relaxed);
                let key = key.map_or_else(
                    || format!("sk-unknown-{}", sent.load(Ordering::Relaxed)),
                    str::to_owned,
                );
                let mut req = c.post(&url).bearer_auth(key).json(&chat_body(model, false));
                if marked && attempt > 0 {
                    req = req.header("x-stainless-retry-count", attempt.to_string());
                }
                match req.send().await {
                    Ok(r) if r.status() == 429 || r.status().is_server_error() => continue,
                    Ok(r) => {
                        let _ = r.bytes().await;
                        return;
                    }
                    Err(_) => continue,
                }
            }
        }));
        chains.retain(|c| !c.is_finished());
    }
    for chain in chains {
        let _ = chain.await;
    }
}

/// One line per sample: its labels (the metric name aside) and value.
fn brief(samples: &[serde_json::Value]) -> String {
    samples
        .iter()
        .map(|s| {
            let mut labels = s["metric"].clone();
            labels.as_object_mut().map(|m| m.remove("__name__"));
            format!("{labels} = {}", s["value"][1])
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn gateway_body(a: &Proc, b: &Proc, c: &Proc, d: &Proc) -> String {
    let closed = spillway_testkit::closed_port();
    format!(
        r#"[retry]
budget_ratio = 0.2
[outlier]
consecutive_failures = 1000
failure_rate = 0.9
[anomaly]
window = "2s"
baseline = "120s"
min_events = 3
[cache]
ttl = "2s"
max_negative_entries = 1
redis = "redis://127.0.0.1:{closed}"
[admission]
redis = "redis://127.0.0.1:{closed}"
{}{}{}
[[tenants]]
name = "tenant-c"
keys = [{{ sha256 = "{}" }}]
models = ["m2"]
requests_per_min = 6
"#,
        model("m", &[("a", "r", a.url("/v1")), ("b", "r", b.url("/v1"))]),
        model("m2", &[("c", "r", c.url("/v1"))]),
        model("m3", &[("d", "r", d.url("/v1"))]),
        sha256_hex(KEY_C),
    )
}

/// The shipped rules for a run of a minute or two: every `for:` at 0s, and their 5m rates over
/// 30s. Prometheus's `rate` divides by its whole window, so a 5m rate of a storm one minute old
/// shows a fifth of it, and an alert on an absolute rate (extra attempts per second) would wait
/// five minutes. promtool's unit tests hold the shipped windows and durations.
fn rules_for_a_short_run(rules: &str) -> String {
    rules
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for:") {
            Some(_) => format!("{}for: 0s", &l[..l.len() - l.trim_start().len()]),
            None => l.replace("[5m]", "[30s]"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn prometheus_config(target: std::net::SocketAddr) -> String {
    format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - alerts.yml\n\
         scrape_configs:\n  - job_name: spillway\n    static_configs:\n      - targets: [\"{target}\"]\n"
    )
}

/// A Grafana query with its variables as Grafana would fill them for this gateway.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("${job}", "spillway")
        .replace("$job", "spillway")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_storm_fires_the_alerts_and_fills_every_dashboard_panel() {
    let Some(bin) = prom::prometheus_bin() else {
        return;
    };
    let (a, b, c, d) = (
        fast_mock(&["m"], &[]),
        fast_mock(&["m"], &[]),
        fast_mock(&["m2"], &[]),
        fast_mock(&["m3"], &[]),
    );
    let gw = gateway(&gateway_body(&a, &b, &c, &d));
    let rules = std::fs::read_to_string(prom::rules_path()).unwrap();
    let p = prom::Prometheus::start(
        &bin,
        &prometheus_config(gw.admin.unwrap()),
        &[("alerts.yml", rules_for_a_short_run(&rules))],
    )
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + STORM_AT_MOST;
    let callers = [
        // IL-0248's callers: every failure resent at once, up to 48 times, unmarked.
        Caller {
            key: Some(KEY),
            model: "m",
            per_sec: 20,
            resends: 48,
            marked: false,
        },
        // An SDK: two marked retries, shed while the backends fail.
        Caller {
            key: Some(KEY),
            model: "m",
            per_sec: 2,
            resends: 2,
            marked: true,
        },
        Caller {
            key: Some(KEY),
            model: "m2",
            per_sec: 10,
            resends: 0,
            marked: false,
        },
        // An SDK on a model whose one backend is sometimes full: its marked retries are served.
        Caller {
            key: Some(KEY),
            model: "m3",
            per_sec: 4,
            resends: 2,
            marked: true,
        },
        // A caller trying keys the gateway does not know (the negative cache evicts).
        Caller {
            key: None,
            model: "m",
            per_sec: 2,
            resends: 0,
            marked: false,
        },
        // Over its limit of 6 a minute.
        Caller {
            key: Some(KEY_C),
            model: "m2",
            per_sec: 3,
            resends: 2,
            marked: true,
        },
    ];
    let load: Vec<_> = callers
        .into_iter()
        .map(|who| {
            tokio::spawn(run_caller(
                gw.url("/v1/chat/completions"),
                who,
                until,
                stop.clone(),
                sent.clone(),
            ))
        })
        .collect();

    // Healthy first, until Prometheus has scraped the gateway a few times: the baseline.
    spillway_testkit::eventually(
        Duration::from_secs(30),
        "a few scrapes of the gateway",
        || async {
            p.query(r#"count_over_time(up{job="spillway"}[1m]) >= 3"#)
                .await
                .len()
                == 1
        },
    )
    .await;
    let fault = |rate: f64, status: u16| serde_json::json!({"fault": {"error_rate": rate, "error_status": status}});
    control(&a, fault(0.3, 502)).await;
    control(&b, fault(0.3, 502)).await;
    control(&c, fault(0.5, 400)).await;
    control(&d, fault(0.1, 503)).await;

    let deadline = Instant::now() + Duration::from_secs(90);
    // Every alert seen firing at some poll: a 4xx jump, for one, is judged against its
    // baseline and ends once the baseline has taken its level.
    let mut fired: Vec<String> = Vec::new();
    loop {
        let alerts = p.alerts().await;
        fired.extend(prom::firing(&alerts));
        fired.sort();
        fired.dedup();
        if MUST_FIRE.iter().all(|a| fired.iter().any(|f| f == a)) {
            break;
        }
        if Instant::now() >= deadline {
            let mut figures = String::new();
            for q in DIAGNOSE {
                figures += &format!("{q}: {}\n", brief(&p.query(q).await));
            }
            panic!(
                "not all of {MUST_FIRE:?} fired within 90s; fired: {fired:?}\nalerts: {alerts:#?}\n\
                 {figures}targets: {}\nprometheus log:\n{}",
                p.targets().await,
                p.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("fired: {fired:?}");
    for (what, q) in [
        ("amplification", "model:spillway_amplification:ratio5m"),
        (
            "budget refusals/s",
            "model:spillway_retry_budget_exhausted:rate5m",
        ),
        ("shed share by tenant", "tenant:spillway_shed:ratio5m"),
        (
            "RSS of budget",
            "instance:spillway_memory_budget_used:ratio",
        ),
    ] {
        let values: Vec<String> = p
            .query(q)
            .await
            .iter()
            .map(|s| format!("{} = {}", s["metric"], s["value"][1]))
            .collect();
        eprintln!("{what}: {values:?}");
    }
    // Prometheus evaluated every rule without an error.
    let broken: Vec<String> = p
        .rules()
        .await
        .iter()
        .filter(|r| r["health"] != "ok")
        .map(|r| format!("{}: {} ({})", r["name"], r["health"], r["lastError"]))
        .collect();
    assert!(broken.is_empty(), "rules that failed: {broken:#?}");
    // The memory alert stays silent: the storm is bounded by the caps, far below the budget.
    assert!(
        !fired.iter().any(|f| f == "SpillwayMemoryNearBudget"),
        "{fired:?}"
    );

    // Every dashboard query, and every series and recorded rule the alerts read, has data.
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(prom::dashboard_path()).unwrap()).unwrap();
    let exprs = prom::dashboard_exprs(&dashboard);
    assert!(exprs.len() >= 30, "{} queries", exprs.len());
    let mut names: Vec<String> = rules
        .split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == ':'))
        .filter(|w| w.starts_with("spillway_") || w.contains(":spillway_"))
        .filter(|w| !w.ends_with(':'))
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 25, "{names:?}");
    // Series appear as what they count first happens, and a rate needs two scrapes of them: the
    // storm goes on until every query has data, or the deadline.
    let queries: Vec<String> = exprs.iter().map(|e| substitute(e)).chain(names).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let empty = loop {
        let mut empty = Vec::new();
        for q in &queries {
            if p.query(q).await.is_empty() {
                empty.push(q.clone());
            }
        }
        if empty.is_empty() || Instant::now() >= deadline {
            break empty;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    eprintln!("callers sent {} requests", sent.load(Ordering::Relaxed));
    assert!(empty.is_empty(), "queries without data: {empty:#?}");
}
