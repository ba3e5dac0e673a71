//! Measuring a gateway's resident memory under a flood, against the bound docs/admission.md
//! states.

// A flood runs for a stretch of real time (see clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{chat, Proc};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;

/// What docs/admission.md counts per request in flight.
pub const PER_REQUEST: u64 = 192 * KIB;

/// The bound, as docs/admission.md states it, for HTTP/1 clients: twice the body budget (the
/// bodies, and as much again for what the allocator keeps of freed ones), plus per open
/// connection and per request in flight what hyper and the relay may hold for it.
pub fn bound(max_buffered: u64, max_connections: u64, max_in_flight: u64) -> u64 {
    max_buffered * 2 + max_connections * 64 * KIB + max_in_flight * PER_REQUEST
}

/// The bound for HTTP/2 clients: a connection also holds its receive window and, per stream it
/// may open, a request's head and task.
pub fn bound_http2(
    max_buffered: u64,
    max_connections: u64,
    streams: u64,
    max_in_flight: u64,
) -> u64 {
    bound(max_buffered, max_connections, max_in_flight)
        + max_connections * (256 * KIB + streams * 8 * KIB)
}

/// What `backends` plain-HTTP backends' kept upstream connections may hold, each keeping up to
/// `kept` of them and one for its health checks: a connection's 16 KiB read buffer, its socket
/// and its task.
pub fn kept_bound(backends: u64, kept: u64) -> u64 {
    backends * (kept + 1) * 24 * KIB
}

/// Twenty requests with `body`, all answered 200: the allocator's and the runtime's pools exist
/// before the baseline is read.
pub async fn warm_up(gw: &Proc, body: &serde_json::Value) {
    let warm = futures_util::future::join_all((0..20).map(|_| chat(gw, body))).await;
    assert!(warm.iter().all(|r| r.status() == 200));
}

/// Resident memory of process `pid`, in bytes, as the replay reads it.
pub fn rss_bytes(pid: u32) -> u64 {
    spillway_replay::resident_bytes(pid).expect("the gateway's VmRSS in /proc")
}

/// Runs `flood` for `run` while sampling the gateway's RSS; returns (baseline, peak growth).
pub async fn growth_under<F>(gw: &Proc, run: Duration, flood: F) -> (u64, u64)
where
    F: FnOnce(Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>>,
{
    growth_until(gw, (run, run), flood, || true).await
}

/// [`growth_under`], the flood going on past `run` (at most to `longest`) until `done` holds:
/// for a flood whose first answers may take longer than `run` on a loaded machine. The
/// memory is sampled all along.
pub async fn growth_until<F>(
    gw: &Proc,
    (run, longest): (Duration, Duration),
    flood: F,
    done: impl Fn() -> bool,
) -> (u64, u64)
where
    F: FnOnce(Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>>,
{
    let baseline = rss_bytes(gw.pid());
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = flood(stop.clone());
    let mut peak = baseline;
    let started = Instant::now();
    while started.elapsed() < run || (!done() && started.elapsed() < longest) {
        peak = peak.max(rss_bytes(gw.pid()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.abort();
    }
    (baseline, peak.saturating_sub(baseline))
}

pub fn assert_within(what: &str, (baseline, grew): (u64, u64), bound: u64) {
    eprintln!(
        "{what}: grew {} KiB over {} KiB, bound {} KiB",
        grew / KIB,
        baseline / KIB,
        bound / KIB
    );
    assert!(
        grew <= bound,
        "{what}: grew {} KiB over {} KiB, bound {} KiB",
        grew / KIB,
        baseline / KIB,
        bound / KIB
    );
}
