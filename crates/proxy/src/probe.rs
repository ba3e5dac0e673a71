//! Active health checks: a `GET` of each backend's health URL on a jittered interval, whose
//! failures eject the backend like passive failures do (within the pool's ejection cap).
//!
//! Kept apart from the health state (`health.rs`) it feeds: the state is read on every request,
//! these tasks run beside the request path and are its only users of the health URL.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use rand::Rng;
use spillway_config::HealthCheckConfig;
use tokio::sync::watch;
use tracing::debug;

use crate::pool::{Backend, ModelPool};
use crate::upstream::HttpClient;

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
                    let now = crate::clock::now();
                    let may_eject = !ok && pool.may_eject(now);
                    if let Some(until) = backend.health.health_check(now, ok, may_eject) {
                        backend.ejected(until - now, "health_check");
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
