//! What spillway knows about each backend's health: passive outlier detection, the adaptive
//! concurrency limit, and the active health checks that re-admit ejected backends.
//!
//! Every finished attempt reports its class here once. Backend failures (capacity, transient,
//! timeout, server error) count towards ejection; capacity failures and timeouts also cut the
//! backend's concurrency limit, so spillway sends an overloaded backend less before it fails
//! harder. The decisions themselves are the pure ones in `spillway_policy`; this module holds
//! their state behind short locks and runs the probe tasks.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use rand::Rng;
use spillway_config::HealthCheckConfig;
use spillway_policy::concurrency::{Aimd, AimdConfig};
use spillway_policy::outlier::{Health, Outlier, OutlierConfig};
use spillway_policy::Class;
use tokio::sync::watch;
use tracing::{debug, info};

use crate::pool::{Backend, ModelPool};
use crate::upstream::HttpClient;

fn millis(epoch: Instant, at: Instant) -> u64 {
    at.saturating_duration_since(epoch).as_millis() as u64
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One backend's health state.
#[derive(Debug)]
pub struct BackendHealth {
    outlier: Option<Mutex<Outlier>>,
    aimd: Option<Mutex<Aimd>>,
    /// The concurrency limit in force: the adaptive one, or `max_concurrency` without it.
    limit: AtomicU32,
    /// Milliseconds since `epoch` from which the adaptive limit may recover (`u64::MAX`: not
    /// before something else changes it), so that reading the limit takes no lock until then.
    recover_at_ms: AtomicU64,
    epoch: Instant,
}

impl BackendHealth {
    pub fn new(
        max_concurrency: u32,
        outlier: Option<OutlierConfig>,
        adaptive: Option<AimdConfig>,
    ) -> Self {
        let aimd = adaptive.map(Aimd::new);
        let limit = aimd.as_ref().map_or(max_concurrency, Aimd::limit);
        Self {
            outlier: outlier.map(|c| Mutex::new(Outlier::new(c))),
            aimd: aimd.map(Mutex::new),
            limit: AtomicU32::new(limit),
            recover_at_ms: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
        }
    }

    /// The concurrency limit now. An adaptive limit that was cut recovers while no overload
    /// signal arrives, also while the backend is idle: it is brought up to date here, lazily.
    pub fn limit(&self) -> u32 {
        let due = self.recover_at_ms.load(Ordering::Relaxed);
        if due != u64::MAX {
            let now = Instant::now();
            if millis(self.epoch, now) >= due {
                if let Some(aimd) = &self.aimd {
                    let mut aimd = lock(aimd);
                    aimd.tick(now);
                    self.publish(&aimd);
                }
            }
        }
        self.limit.load(Ordering::Relaxed)
    }

    /// Stores the adaptive limit and when it may next recover.
    fn publish(&self, aimd: &Aimd) {
        self.limit.store(aimd.limit(), Ordering::Relaxed);
        let due = aimd
            .next_recovery()
            .map_or(u64::MAX, |at| millis(self.epoch, at));
        self.recover_at_ms.store(due, Ordering::Relaxed);
    }

    /// A fresh reading of the engine's own load: it sets the limit's floor (the engine runs that
    /// many at once) and its queue growing past `max_queue` is an overload signal.
    pub fn engine_reading(&self, now: Instant, running: u32, waiting: u32, max_queue: u32) {
        if let Some(aimd) = &self.aimd {
            let mut aimd = lock(aimd);
            aimd.on_engine(now, running, waiting, max_queue);
            self.publish(&aimd);
        }
    }

    pub fn health(&self, now: Instant) -> Health {
        self.outlier
            .as_ref()
            .map_or(Health::Healthy, |o| lock(o).health(now))
    }

    /// The health, and whether the backend is degraded (failing while the ejection cap keeps it
    /// in rotation), in one look.
    pub fn state(&self, now: Instant) -> (Health, bool) {
        self.outlier.as_ref().map_or((Health::Healthy, false), |o| {
            let o = lock(o);
            (o.health(now), o.degraded(now))
        })
    }

    /// Whether a request may go to this backend now (one probe at a time once an ejection ends).
    pub fn admit(&self, now: Instant) -> bool {
        self.outlier.as_ref().is_none_or(|o| lock(o).admit(now))
    }

    /// Records an attempt's outcome; `in_flight` is the backend's outstanding requests when it
    /// was sent. Only explicit capacity answers and timeouts cut the adaptive limit: how long a
    /// response head took is not a signal (an engine sends it when a slot takes the request).
    /// Returns when an ejection it caused ends.
    pub fn record(
        &self,
        now: Instant,
        class: Class,
        in_flight: u32,
        may_eject: bool,
    ) -> Option<Instant> {
        if let Some(aimd) = &self.aimd {
            let mut aimd = lock(aimd);
            if class.is_overload() {
                aimd.on_overload(now);
            } else if class == Class::Success {
                aimd.on_success(now, in_flight);
            }
            self.publish(&aimd);
        }
        let failed = class.is_backend_failure();
        if class == Class::ClientError {
            // Says nothing about the backend either way.
            return None;
        }
        self.outlier
            .as_ref()
            .and_then(|o| lock(o).record(now, !failed, may_eject))
    }

    fn health_check(&self, now: Instant, ok: bool, may_eject: bool) -> Option<Instant> {
        self.outlier
            .as_ref()
            .and_then(|o| lock(o).health_check(now, ok, may_eject))
    }
}

impl ModelPool {
    /// Whether one more backend of this pool may be ejected now.
    pub fn may_eject(&self, now: Instant) -> bool {
        let out = self
            .backends
            .iter()
            .filter(|b| b.health.health(now) != Health::Healthy)
            .count();
        spillway_policy::outlier::may_eject(self.backends.len(), out, self.max_ejected_share)
    }

    /// Records an attempt's outcome on `backend` and logs and counts an ejection.
    pub fn record(&self, backend: &Backend, now: Instant, class: Class, in_flight: u32) {
        let may_eject = class.is_backend_failure() && self.may_eject(now);
        if let Some(until) = backend.health.record(now, class, in_flight, may_eject) {
            ejected(backend, until - now, class.as_str());
        }
    }

    /// Whether the pool is failing: its retry budget is spent, its backends have failed enough
    /// recently for throttling to be in force, or so few backends are healthy that it is in panic
    /// mode. Callers' retries are shed first while it is.
    pub fn is_failing(&self, now: Instant) -> bool {
        let spent = self
            .budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_spent(now);
        spent || self.throttling(now) || self.in_panic(now)
    }

    /// Whether adaptive throttling refuses some requests now.
    pub fn throttling(&self, now: Instant) -> bool {
        self.throttle
            .as_ref()
            .is_some_and(|t| lock(t).is_throttling(now))
    }

    /// Whether a new request may be sent to the backends now (adaptive throttling).
    pub fn throttle_admits(&self, now: Instant) -> bool {
        self.throttle.as_ref().is_none_or(|t| lock(t).admit(now))
    }

    /// Counts an attempt sent to a backend, and whether the backend accepted it (answered with
    /// anything but a backend failure), for adaptive throttling.
    pub fn throttle_record(&self, now: Instant, accepted: bool) {
        if let Some(t) = &self.throttle {
            let mut t = lock(t);
            t.sent(now);
            if accepted {
                t.accepted(now);
            }
        }
    }

    /// Whether so few backends are healthy that health is ignored (panic mode).
    pub fn in_panic(&self, now: Instant) -> bool {
        let healthy = self
            .backends
            .iter()
            .filter(|b| b.health.health(now) == Health::Healthy)
            .count();
        self.panics_with(healthy)
    }

    /// Panic mode given how many backends are healthy.
    pub fn panics_with(&self, healthy: usize) -> bool {
        spillway_policy::outlier::panic_mode(self.backends.len(), healthy, self.panic_threshold)
    }
}

fn ejected(backend: &Backend, for_: Duration, why: &str) {
    info!(backend = %backend.name, seconds = for_.as_secs_f64(), reason = why, "backend ejected");
    backend.metrics.ejected();
}

/// Runs the active health checks of every backend that has a health URL until `stop` turns
/// true. Each backend gets its own task with a jittered interval, so probes never align.
pub fn spawn_checks(
    pools: Vec<Arc<ModelPool>>,
    client: HttpClient,
    config: HealthCheckConfig,
    stop: watch::Receiver<bool>,
) {
    if !config.enabled {
        return;
    }
    for pool in pools {
        for backend in pool.backends.clone() {
            if backend.health_uri.is_none() {
                continue;
            }
            let (pool, client, config, mut stop) =
                (pool.clone(), client.clone(), config.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    let jitter = config.jitter * (rand::rng().random::<f64>() * 2.0 - 1.0);
                    let wait = config.interval.mul_f64((1.0 + jitter).max(0.05));
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.wait_for(|s| *s) => return,
                    }
                    let ok = probe(&client, &backend, config.timeout).await;
                    let now = Instant::now();
                    let may_eject = !ok && pool.may_eject(now);
                    if let Some(until) = backend.health.health_check(now, ok, may_eject) {
                        ejected(&backend, until - now, "health_check");
                    }
                }
            });
        }
    }
}

/// One `GET` of the backend's health URL: healthy when it answers 2xx in time.
async fn probe(client: &HttpClient, backend: &Backend, timeout: Duration) -> bool {
    let Some(uri) = &backend.health_uri else {
        return true;
    };
    let mut req = Request::new(Full::new(Bytes::new()));
    *req.method_mut() = Method::GET;
    *req.uri_mut() = uri.clone();
    if let Some((name, value)) = &backend.auth_header {
        req.headers_mut().insert(name.clone(), value.clone());
    }
    match tokio::time::timeout(timeout, client.request(req)).await {
        Ok(Ok(response)) => {
            let ok = response.status().is_success();
            if !ok {
                debug!(backend = %backend.name, status = %response.status(), "health check failed");
            }
            ok
        }
        Ok(Err(e)) => {
            debug!(backend = %backend.name, "health check failed: {e}");
            false
        }
        Err(_) => {
            debug!(backend = %backend.name, "health check timed out");
            false
        }
    }
}
