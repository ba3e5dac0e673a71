//! The scrape tasks: one per engine, reading its `/metrics` on a jittered interval into its
//! [`EngineLoad`].
//!
//! Each scrape is bounded in time (request and body together) and in size, so a wedged or
//! misconfigured engine costs one connection and `max_body_bytes` at most. A failed scrape
//! leaves the previous reading in place to age: it goes stale, and a stale engine counts as
//! saturated.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use rand::Rng;
use spillway_config::{Engine, EngineMetricsConfig};
use tokio::sync::watch;
use tracing::debug;

use super::load::EngineLoad;
use super::metrics::{Reason, ScrapeErrors};
use super::parse::{parse, ParseError, Sample};
use crate::pool::{Backend, ModelPool};
use crate::upstream::HttpClient;

/// A backend as `(model, backend)` names, for labels.
type Pair = (Arc<str>, Arc<str>);

/// One engine, the names of the backends reading it and the backends themselves.
type Readers = (Arc<EngineLoad>, Vec<Pair>, Vec<Arc<Backend>>);

/// Starts one scrape task for each distinct engine of `pools` until `stop` turns true; the first
/// scrape of each is at once, the next ones every `interval`, shortened or lengthened at random
/// by up to `jitter` so the scrapes of many engines never align.
pub fn spawn_scrapes(
    pools: Vec<Arc<ModelPool>>,
    client: HttpClient,
    config: EngineMetricsConfig,
    stop: watch::Receiver<bool>,
) {
    // Backends sharing an engine share its state: group them by it.
    let mut engines: Vec<Readers> = Vec::new();
    for pool in &pools {
        for backend in &pool.backends {
            let Some(load) = &backend.engine else {
                continue;
            };
            let pair = (pool.name.clone(), backend.name.clone());
            match engines.iter_mut().find(|(l, _, _)| Arc::ptr_eq(l, load)) {
                Some((_, pairs, backends)) => {
                    pairs.push(pair);
                    backends.push(backend.clone());
                }
                None => engines.push((load.clone(), vec![pair], vec![backend.clone()])),
            }
        }
    }
    for (load, backends, limits) in engines {
        let errors = ScrapeErrors::new(backends.iter().map(|(m, b)| (m, b)));
        let (client, config, stop) = (client.clone(), config.clone(), stop.clone());
        let label = backends
            .iter()
            .map(|(m, b)| format!("{m}/{b}"))
            .collect::<Vec<_>>()
            .join(",");
        tokio::spawn(run(load, limits, errors, label, client, config, stop));
    }
}

/// How long to wait before the next scrape: `interval` times a factor drawn from
/// `1 - jitter ..= 1 + jitter` by `unit` (uniform in `0..1`).
pub(crate) fn next_wait(interval: Duration, jitter: f64, unit: f64) -> Duration {
    interval.mul_f64((1.0 + jitter * (unit * 2.0 - 1.0)).max(0.05))
}

async fn run(
    load: Arc<EngineLoad>,
    backends: Vec<Arc<Backend>>,
    errors: ScrapeErrors,
    label: String,
    client: HttpClient,
    config: EngineMetricsConfig,
    mut stop: watch::Receiver<bool>,
) {
    let mut failing = false;
    while !*stop.borrow() {
        let started = tokio::time::Instant::now();
        match scrape(&client, &load, &config).await {
            Ok((engine, sample)) => {
                let now = crate::clock::now();
                load.store(engine, &sample, now);
                // What the engine runs sets each backend's limit floor; its queue growing past
                // the saturation bound is an overload signal.
                if let Some(r) = load.reading(now) {
                    for b in &backends {
                        b.health
                            .engine_reading(now, r.running, r.waiting, config.max_queue);
                    }
                }
                if failing {
                    debug!(backends = %label, uri = %load.uri(), "engine metrics readable again");
                    failing = false;
                }
            }
            Err(e) => {
                errors.count(e.reason());
                // Once per change of state: a down engine must not flood the log.
                if !failing {
                    debug!(backends = %label, uri = %load.uri(), "engine metrics scrape failing: {e}");
                    failing = true;
                }
            }
        }
        let wait = next_wait(config.interval, config.jitter, rand::rng().random());
        tokio::select! {
            _ = tokio::time::sleep_until(started + wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Why one scrape gave no reading.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScrapeError {
    #[error("request failed: {0}")]
    Connect(String),
    #[error("status {0}")]
    Status(http::StatusCode),
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
    #[error("page larger than {0} bytes")]
    TooLarge(usize),
    #[error("{0}")]
    Parse(#[from] ParseError),
    #[error("page is not UTF-8")]
    NotText,
}

impl ScrapeError {
    fn reason(&self) -> Reason {
        match self {
            ScrapeError::Connect(_) => Reason::Connect,
            ScrapeError::Status(_) => Reason::Status,
            ScrapeError::Timeout(_) => Reason::Timeout,
            ScrapeError::TooLarge(_) => Reason::TooLarge,
            ScrapeError::Parse(_) | ScrapeError::NotText => Reason::Parse,
        }
    }
}

/// One `GET` of the engine's page, read and parsed.
pub(crate) async fn scrape(
    client: &HttpClient,
    load: &EngineLoad,
    config: &EngineMetricsConfig,
) -> Result<(Engine, Sample), ScrapeError> {
    let max = config.max_body_bytes;
    let fetch = async {
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.method_mut() = Method::GET;
        *req.uri_mut() = load.uri().clone();
        // The classic text format: every engine serves it, and OpenMetrics adds nothing read here.
        req.headers_mut()
            .insert(header::ACCEPT, HeaderValue::from_static("text/plain"));
        if let Some((name, value)) = load.auth_header() {
            req.headers_mut().insert(name.clone(), value.clone());
        }
        let response = client
            .request(req)
            .await
            .map_err(|e| ScrapeError::Connect(e.to_string()))?;
        if !response.status().is_success() {
            return Err(ScrapeError::Status(response.status()));
        }
        let body = Limited::new(response.into_body(), max)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<LengthLimitError>() {
                    ScrapeError::TooLarge(max)
                } else {
                    ScrapeError::Connect(e.to_string())
                }
            })?;
        Ok(body.to_bytes())
    };
    let body = tokio::time::timeout(config.timeout, fetch)
        .await
        .map_err(|_| ScrapeError::Timeout(config.timeout))??;
    let text = std::str::from_utf8(&body).map_err(|_| ScrapeError::NotText)?;
    Ok(parse(load.engine(), text)?)
}

#[cfg(test)]
mod tests;
