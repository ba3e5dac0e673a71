//! The IL-0248 storm against real processes: one region starts answering 500 for capacity while
//! a naive client retries every 5xx at once, up to 48 times. Spillway keeps upstream attempts
//! within its retry budget, keeps its memory flat, serves from the healthy region, and recovers
//! when the fault ends.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_testkit::eventually;
use spillway_testkit::http::client;
use support::*;

const MOCK: [&str; 10] = [
    "--model",
    "m",
    "--ttft",
    "5ms",
    "--tokens-per-sec",
    "0",
    "--capacity",
    "64",
    "--queue",
    "64",
];

async fn set_fault(m: &Proc, rate: f64) {
    set_fault_status(m, rate, 500).await;
}

/// Resident memory of process `pid` in KiB as the replay reads it, 0 when unreadable.
fn rss_kib(pid: u32) -> u64 {
    spillway_replay::resident_bytes(pid).map_or(0, |bytes| bytes / 1024)
}

#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    chains: AtomicU64,
    chains_ok: AtomicU64,
}

/// One naive caller: every 5xx or connection error is resent at once, up to 48 times.
async fn naive_caller(gw_url: String, until: Instant, tally: Arc<Tally>) {
    let c = client();
    while Instant::now() < until {
        tally.chains.fetch_add(1, Ordering::Relaxed);
        for _ in 0..=48 {
            tally.requests.fetch_add(1, Ordering::Relaxed);
            let r = c
                .post(&gw_url)
                .bearer_auth(KEY)
                .json(&chat_body("m", false))
                .send()
                .await;
            match r {
                Ok(r) if r.status().is_success() => {
                    let _ = r.bytes().await;
                    tally.chains_ok.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Ok(r) if r.status().is_client_error() => break,
                _ => continue,
            }
        }
    }
}

struct Phase {
    requests: u64,
    attempts: u64,
    chains: u64,
    chains_ok: u64,
    region_a: u64,
    peak_rss_kib: u64,
}

async fn run_phase(gw: &Proc, mocks: &[&Proc; 3], length: Duration) -> Phase {
    let before: Vec<u64> = [
        chats_received(mocks[0]).await,
        chats_received(mocks[1]).await,
        chats_received(mocks[2]).await,
    ]
    .to_vec();
    let tally = Arc::new(Tally::default());
    let until = Instant::now() + length;
    let callers: Vec<_> = (0..16)
        .map(|_| {
            tokio::spawn(naive_caller(
                gw.url("/v1/chat/completions"),
                until,
                tally.clone(),
            ))
        })
        .collect();
    let mut peak = 0;
    while Instant::now() < until {
        peak = peak.max(rss_kib(gw.pid()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for c in callers {
        c.await.unwrap();
    }
    let after = [
        chats_received(mocks[0]).await,
        chats_received(mocks[1]).await,
        chats_received(mocks[2]).await,
    ];
    let delta: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    Phase {
        requests: tally.requests.load(Ordering::Relaxed),
        attempts: delta.iter().sum(),
        chains: tally.chains.load(Ordering::Relaxed),
        chains_ok: tally.chains_ok.load(Ordering::Relaxed),
        region_a: delta[0] + delta[1],
        peak_rss_kib: peak.max(rss_kib(gw.pid())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_storm_stays_within_the_budget_and_recovers() {
    let (a1, a2, b1) = (mock(&MOCK), mock(&MOCK), mock(&MOCK));
    // The operator knows these backends answer 500 when out of capacity (the IL-0248 change),
    // and lets a whole region be ejected: two of three backends, without panic mode.
    let backend = |name: &str, region: &str, m: &Proc| {
        format!(
            "[[models.backends]]\nname = \"{name}\"\nregion = \"{region}\"\nurl = \"{}\"\ncapacity_statuses = [429, 500, 503]\n",
            m.url("/v1")
        )
    };
    let gw = gateway(&format!(
        "home_region = \"region-a\"\n\
         [outlier]\nmax_ejected_share = 0.67\npanic_threshold = 0.3\nbase_ejection = \"500ms\"\nmax_ejection = \"2s\"\n\
         [health_check]\ninterval = \"200ms\"\ntimeout = \"150ms\"\n\
         [[models]]\nname = \"m\"\n{}{}{}",
        backend("a1", "region-a", &a1),
        backend("a2", "region-a", &a2),
        backend("b1", "region-b", &b1),
    ));
    let mocks = [&a1, &a2, &b1];
    let steady = run_phase(&gw, &mocks, Duration::from_secs(2)).await;
    set_fault(&a1, 1.0).await;
    set_fault(&a2, 1.0).await;
    let fault = run_phase(&gw, &mocks, Duration::from_secs(4)).await;
    set_fault(&a1, 0.0).await;
    set_fault(&a2, 0.0).await;
    // A few backoff caps for ejections to end and health checks to re-admit.
    let _settle = run_phase(&gw, &mocks, Duration::from_secs(3)).await;
    let recovered = run_phase(&gw, &mocks, Duration::from_secs(2)).await;

    let report = |name: &str, p: &Phase| {
        format!(
            "{name}: client requests {} chains {} ok {} upstream attempts {} (region-a {}) peak RSS {} KiB",
            p.requests, p.chains, p.chains_ok, p.attempts, p.region_a, p.peak_rss_kib
        )
    };
    let all = [
        report("steady", &steady),
        report("fault", &fault),
        report("recovered", &recovered),
    ]
    .join("\n");
    assert_eq!(steady.chains_ok, steady.chains, "{all}");
    // G1: the gateway adds at most the budget (10 % + 1/s over 10 s windows) to what callers send.
    let bound = fault.requests as f64 * 1.1 + 10.0;
    assert!(fault.attempts as f64 <= bound, "{all}");
    // The healthy region serves the callers: nearly every chain ends in a success.
    assert!(
        fault.chains_ok as f64 >= fault.chains as f64 * 0.95,
        "{all}"
    );
    // Memory stays flat while callers hammer.
    assert!(
        fault.peak_rss_kib <= steady.peak_rss_kib * 3 / 2 + 16 * 1024,
        "{all}"
    );
    // No state keeps the overload going: the home region serves again, and every chain succeeds.
    assert_eq!(recovered.chains_ok, recovered.chains, "{all}");
    assert!(recovered.region_a > recovered.attempts / 2, "{all}");
    assert!(
        recovered.chains as f64 >= steady.chains as f64 * 0.5,
        "throughput did not come back: {all}"
    );
    eprintln!("{all}");
}

/// What an open-loop storm of naive callers got: chains started, chains that ended in a success,
/// and requests sent.
#[derive(Default)]
struct Storm {
    chains: AtomicU64,
    chains_ok: AtomicU64,
    requests: AtomicU64,
}

/// `per_sec` new logical requests a second for `length`, each resent at once after every 5xx, up
/// to 48 times (IL-0248's callers), marked as retries with `x-stainless-retry-count` if `marked`.
async fn open_loop_storm(gw: &Proc, per_sec: u32, length: Duration, marked: bool) -> Arc<Storm> {
    let tally = Arc::new(Storm::default());
    let c = client();
    let url = gw.url("/v1/chat/completions");
    let mut chains = Vec::new();
    let started = Instant::now();
    let gap = Duration::from_secs(1) / per_sec;
    let mut next = started;
    while next < started + length {
        tokio::time::sleep_until(next.into()).await;
        let (c, url, tally) = (c.clone(), url.clone(), tally.clone());
        chains.push(tokio::spawn(async move {
            tally.chains.fetch_add(1, Ordering::Relaxed);
            for attempt in 0..=48u32 {
                tally.requests.fetch_add(1, Ordering::Relaxed);
                let mut req = c.post(&url).bearer_auth(KEY).json(&chat_body("m", false));
                if marked && attempt > 0 {
                    req = req.header("x-stainless-retry-count", attempt.to_string());
                }
                match req.send().await {
                    Ok(r) if r.status().is_success() => {
                        let _ = r.bytes().await;
                        tally.chains_ok.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    Ok(r) if r.status().is_client_error() => return,
                    _ => continue,
                }
            }
        }));
        next += gap;
    }
    for chain in chains {
        chain.await.unwrap();
    }
    tally
}

async fn set_fault_status(m: &Proc, rate: f64, status: u16) {
    control(
        m,
        serde_json::json!({"fault": {"error_rate": rate, "error_status": status}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_storm_with_every_backend_failing_does_not_multiply_backend_attempts() {
    let (a, b) = (mock(&MOCK), mock(&MOCK));
    let gw = gateway(&format!(
        "[health_check]\ninterval = \"200ms\"\ntimeout = \"150ms\"\n\n{}",
        model(
            "m",
            &[
                ("a", "default", a.url("/v1")),
                ("b", "default", b.url("/v1"))
            ]
        )
    ));
    let received = || async { chats_received(&a).await + chats_received(&b).await };
    for (status, marked) in [(500, false), (503, true)] {
        set_fault_status(&a, 1.0, status).await;
        set_fault_status(&b, 1.0, status).await;
        let before = received().await;
        let storm = open_loop_storm(&gw, 50, Duration::from_secs(10), marked).await;
        let attempts = received().await - before;
        let logical = storm.chains.load(Ordering::Relaxed);
        let sent = storm.requests.load(Ordering::Relaxed);
        let figures = format!(
            "{status} (marked retries: {marked}): {logical} logical requests, {sent} sent by the callers, {attempts} reached the backends"
        );
        eprintln!("{figures}");
        // Without throttling, 49 attempts per logical request reached the backends.
        assert!(attempts as f64 <= logical as f64 * 1.1, "{figures}");
        assert!(attempts > 0, "no probe at all: {figures}");

        // Healed: service comes back within seconds, though callers storm on.
        set_fault_status(&a, 0.0, 500).await;
        set_fault_status(&b, 0.0, 500).await;
        let healed = Instant::now();
        eventually(
            Duration::from_secs(15),
            "full service to come back",
            || async {
                let s = open_loop_storm(&gw, 50, Duration::from_millis(500), marked).await;
                let chains = s.chains.load(Ordering::Relaxed);
                s.chains_ok.load(Ordering::Relaxed) == chains
                    && s.requests.load(Ordering::Relaxed) == chains
            },
        )
        .await;
        eprintln!(
            "{status}: full service again {:?} after the backends healed",
            healed.elapsed()
        );
        let after = open_loop_storm(&gw, 50, Duration::from_secs(2), marked).await;
        assert_eq!(
            after.chains_ok.load(Ordering::Relaxed),
            after.chains.load(Ordering::Relaxed),
            "{figures}"
        );
        assert_eq!(
            after.requests.load(Ordering::Relaxed),
            after.chains.load(Ordering::Relaxed),
            "healthy again, yet requests were refused: {figures}"
        );
    }
}
