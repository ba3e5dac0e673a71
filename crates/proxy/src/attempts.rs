//! The attempts of one request: pick a backend, send, classify, and retry only when the policy
//! and the shared budget allow.
//!
//! This is the one place on the path that retries (G1). Each attempt's outcome is classified
//! once (`spillway_policy::classify`) and reported to the backend's health state; the retry
//! decision is the policy's (`RetryPolicy::decide`), and a retry also needs the model's budget
//! to have room. A capacity failure never goes back to the backend that reported it and moves
//! to another region while one has room. Nothing is retried once a response is relayed: the
//! decision is made on the response head, before a byte of the body reaches the client.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue};
use hyper::body::Incoming;
use spillway_policy::{classify, Class, Decision, Outcome, Priority, Pushback, Stop};
use tracing::{debug, warn};

use crate::error::{ApiError, ErrorKind};
use crate::metrics::{RequestLabels, UpstreamFailure};
use crate::pool::{Acquired, Ask, Backend, Endpoint, InFlight, ModelPool};
use crate::request::with_fields;
use crate::server::{Gateway, NO_CAPACITY_RETRY_AFTER};
use crate::upstream;

/// How often a request waiting for a backend looks again when none frees up (an ejection may
/// end, or a cooldown, without a request finishing).
const RECHECK_EVERY: Duration = Duration::from_millis(100);

/// Counts itself in an atomic gauge while alive.
pub(crate) struct Counted<'a>(&'a AtomicU64);

impl<'a> Counted<'a> {
    pub(crate) fn new(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Counted(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The response chosen to be relayed, with the hold on its backend.
pub(crate) struct Chosen {
    pub response: http::Response<Incoming>,
    pub hold: InFlight,
    pub spilled_over: bool,
}

/// One request's attempts.
pub(crate) struct Attempts<'a> {
    pub gw: &'a Gateway,
    pub pool: &'a ModelPool,
    pub endpoint: Endpoint,
    pub headers: &'a HeaderMap,
    pub body: &'a Bytes,
    pub region: Option<&'a str>,
    /// The tenant's dedicated pool: only its backends are used.
    pub bulkhead: Option<&'a str>,
    pub deadline: Instant,
    /// Until when a seated request waits for a backend to free up before its first attempt.
    pub wait_until: Instant,
    /// The request's affinity key, if its model balances by affinity.
    pub affinity_key: Option<u64>,
    /// Its priority class, passed to engines that take one (`forward_priority`).
    pub priority: Priority,
}

/// The last failed attempt, for the answer when no retry follows.
struct Failure {
    class: Class,
    outcome: Outcome,
    pushback: Pushback,
}

impl Attempts<'_> {
    /// Runs attempts until one is relayed or the request gives up. Returns the attempts made.
    pub(crate) async fn run(self, labels: &mut RequestLabels) -> (Result<Chosen, ApiError>, u32) {
        let naive = self.gw.retry.naive;
        let mut tried: Vec<usize> = Vec::with_capacity(3);
        let mut attempts = 0u32;
        let mut exclude_tried = false;
        let mut avoid_region: Option<String> = None;
        let mut last: Option<Failure> = None;
        let mut _retrying: Option<Counted<'_>> = None;
        loop {
            let exclude: &[usize] = if exclude_tried { &tried } else { &[] };
            let ask = Ask {
                bulkhead: self.bulkhead,
                region: self.region,
                avoid_region: avoid_region.as_deref(),
                affinity_key: self.affinity_key,
            };
            let acquired = self.pool.acquire(ask, exclude).or_else(|| {
                // A transient failure prefers another backend but may use the same one; a
                // capacity answer or a refused credential never goes back to it.
                let fallback = exclude_tried
                    && last
                        .as_ref()
                        .is_some_and(|f| !matches!(f.class, Class::Capacity | Class::UpstreamAuth));
                let again = Ask {
                    avoid_region: None,
                    ..ask
                };
                fallback.then(|| self.pool.acquire(again, &[])).flatten()
            });
            let Some(Acquired {
                index,
                hold,
                spilled_over,
                affinity,
            }) = acquired
            else {
                // A seated request found every backend full: a limit fell or a backend left
                // after it was seated. It waits for one to free up, as it would have in the
                // queue, rather than being refused while a backend is about to have room.
                // Only while nothing has reached a backend yet (no attempt, or only refused
                // connections), and only while some backend can take requests at all.
                let now = Instant::now();
                let until = self.wait_until.min(self.deadline);
                let unsent = last
                    .as_ref()
                    .is_none_or(|f| f.outcome == Outcome::ConnectFailed);
                if unsent && now < until && self.pool.seats(self.bulkhead, now) > 0 {
                    self.pool
                        .freed(until.duration_since(now).min(RECHECK_EVERY))
                        .await;
                    continue;
                }
                return (Err(self.no_backend(last, attempts)), attempts);
            };
            attempts += 1;
            tried.push(index);
            let backend = hold.backend().clone();
            if attempts == 1 {
                self.pool.metrics.affinity(affinity);
            }
            labels.backend = backend.name.clone();
            let in_flight = backend.outstanding();
            let (outcome, response) = match self.send(&backend).await {
                Ok(r) => (Outcome::Response(r.status().as_u16()), Some(r)),
                Err(outcome) => (outcome, None),
            };
            let now = Instant::now();
            let class = if naive {
                naive_class(outcome)
            } else {
                classify(outcome, &backend.rules)
            };
            let pushback = response
                .as_ref()
                .map_or_else(Pushback::default, |r| pushback(r.headers()));
            self.pool.record(&backend, now, class, in_flight);
            if outcome != Outcome::ConnectFailed {
                // A connection never made put no load on a backend.
                self.pool.throttle_record(now, !class.is_backend_failure());
            }
            if class == Class::UpstreamAuth {
                // The gateway's own key for this backend is wrong: the operator must hear of it,
                // once in a while rather than once per request.
                if let Some(held_back) = backend.auth_log.pass(now) {
                    warn!(
                        backend = %backend.name,
                        status = response.as_ref().map_or(0, |r| r.status().as_u16()),
                        held_back,
                        "the backend refused spillway's credential for it; check its api_key_env"
                    );
                }
            }
            if class == Class::Capacity {
                if let Some(wait) = pushback.retry_after {
                    // The full backend asked for time: it gets it, and this request moves on.
                    backend.skip_for(wait.min(Duration::from_secs(60)));
                }
            }
            let time_left = self.deadline.saturating_duration_since(now);
            let decision = if naive {
                naive_decide(class, attempts, self.gw.retry.policy.max_attempts)
            } else {
                self.gw
                    .retry
                    .policy
                    .decide(class, pushback, attempts, time_left, &mut rand::rng())
            };
            let (after, same_backend_ok) = match decision {
                // Nothing was sent: the next backend can be tried at once.
                Decision::Retry {
                    same_backend_ok, ..
                } if outcome == Outcome::ConnectFailed => (Duration::ZERO, same_backend_ok),
                Decision::Retry {
                    after,
                    same_backend_ok,
                } => (after, same_backend_ok),
                Decision::Stop(stop) => {
                    debug!(class = class.as_str(), ?stop, attempts, "no retry");
                    let failure = Failure {
                        class,
                        outcome,
                        pushback,
                    };
                    return match response {
                        Some(response)
                            if !matches!(class, Class::Capacity | Class::UpstreamAuth) =>
                        {
                            (
                                Ok(Chosen {
                                    response,
                                    hold,
                                    spilled_over,
                                }),
                                attempts,
                            )
                        }
                        _ => (Err(self.give_up(failure, stop, attempts)), attempts),
                    };
                }
            };
            // A connection that was never made put no load on the backend: moving to the next
            // one needs no budget (it still counts against the attempts).
            if !naive && outcome != Outcome::ConnectFailed {
                // This request's own earlier retry is not another request retrying.
                let others =
                    self.pool.retrying.load(Ordering::Relaxed) - u64::from(_retrying.is_some());
                let granted = self
                    .pool
                    .budget
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .try_withdraw(now, self.pool.in_flight.load(Ordering::Relaxed), others);
                if let Err(refusal) = granted {
                    self.pool.metrics.budget_exhausted(refusal);
                    debug!(
                        class = class.as_str(),
                        refusal = refusal.as_str(),
                        "retry budget refused a retry"
                    );
                    return (
                        Err(ApiError::new(
                            ErrorKind::RetryBudgetExhausted,
                            format!(
                                "the backend of the model {:?} failed ({}) and no retry was allowed: {}",
                                &*self.pool.name,
                                class.as_str(),
                                refusal.describe()
                            ),
                        )
                        .retry_after(NO_CAPACITY_RETRY_AFTER)),
                        attempts,
                    );
                }
            }
            self.pool.metrics.retried(class);
            _retrying.get_or_insert_with(|| Counted::new(&self.pool.retrying));
            drop(response);
            drop(hold);
            exclude_tried = true;
            if !same_backend_ok {
                avoid_region = Some(backend.region.clone());
            }
            last = Some(Failure {
                class,
                outcome,
                pushback,
            });
            if !after.is_zero() {
                tokio::time::sleep(after).await;
            }
        }
    }

    /// Sends one attempt to `backend`; `Err` is the outcome when no response head came.
    async fn send(&self, backend: &Arc<Backend>) -> Result<http::Response<Incoming>, Outcome> {
        let priority = backend
            .forward_priority
            .then(|| self.priority.engine_value());
        let body = match (&backend.rename_to, priority) {
            (None, None) => self.body.clone(),
            (name, priority) => with_fields(self.body, name.as_deref(), priority)
                .unwrap_or_else(|_| self.body.clone()),
        };
        let gw = self.gw;
        let build = || {
            upstream::request(
                backend,
                self.endpoint,
                self.headers,
                &gw.server.region_header,
                body.clone(),
            )
        };
        let sent = Instant::now();
        let timeout = gw
            .upstream
            .response_timeout
            .min(self.deadline.saturating_duration_since(sent));
        let mut result = tokio::time::timeout(timeout, gw.client.request(build())).await;
        let mut resent = false;
        if let Ok(Err(e)) = &result {
            if upstream::is_stale_connection(e) {
                resent = true;
                // The pooled connection was already closed: the backend never read the request.
                backend
                    .metrics
                    .upstream_failed(UpstreamFailure::StaleConnection);
                debug!(backend = %backend.name, "pooled connection was closed; sending again on a new one: {e}");
                let left = timeout.saturating_sub(sent.elapsed());
                result = tokio::time::timeout(left, gw.fresh_client.request(build())).await;
            }
        }
        match result {
            Ok(Ok(response)) => {
                backend.metrics.upstream_responded(sent.elapsed());
                Ok(response)
            }
            Ok(Err(e)) if e.is_connect() => {
                backend.metrics.upstream_failed(UpstreamFailure::Connect);
                warn!(backend = %backend.name, "cannot connect upstream: {e}");
                backend.skip_for(gw.upstream.unreachable_cooldown);
                if resent {
                    // The closed connection was the backend going down with the request on
                    // it, not a stale one: the request did reach it, so what follows is a
                    // retry like any other, drawn from the budget.
                    Err(Outcome::ResetBeforeResponse)
                } else {
                    Err(Outcome::ConnectFailed)
                }
            }
            Ok(Err(e)) => {
                backend.metrics.upstream_failed(UpstreamFailure::Connection);
                warn!(backend = %backend.name, "upstream request failed: {e}");
                Err(Outcome::ResetBeforeResponse)
            }
            Err(_) => {
                backend.metrics.upstream_failed(UpstreamFailure::Timeout);
                warn!(backend = %backend.name, "no response within {timeout:?}");
                Err(Outcome::TimedOut)
            }
        }
    }

    /// The answer when no backend could be picked at all.
    fn no_backend(&self, last: Option<Failure>, attempts: u32) -> ApiError {
        match last {
            Some(failure) => self.give_up(failure, Stop::AttemptsExhausted, attempts),
            None => ApiError::new(
                ErrorKind::NoCapacity,
                format!(
                    "every backend of the model {:?} is at its concurrency limit, ejected or unreachable",
                    &*self.pool.name
                ),
            )
            .retry_after(NO_CAPACITY_RETRY_AFTER),
        }
    }

    /// The answer when the last attempt failed without a response worth relaying, after
    /// `attempts` attempts.
    fn give_up(&self, failure: Failure, stop: Stop, attempts: u32) -> ApiError {
        let model = &*self.pool.name;
        match (failure.class, failure.outcome) {
            (Class::Capacity, _) => ApiError::new(
                ErrorKind::NoCapacity,
                format!("the backends of the model {model:?} have no capacity left ({stop:?})"),
            )
            .retry_after(
                failure
                    .pushback
                    .retry_after
                    .unwrap_or(NO_CAPACITY_RETRY_AFTER)
                    .max(NO_CAPACITY_RETRY_AFTER),
            ),
            (Class::UpstreamAuth, _) => ApiError::new(
                ErrorKind::UpstreamAuth,
                format!(
                    "the backends of the model {model:?} refused spillway's own credentials for them; the gateway's operator must fix its backend keys"
                ),
            ),
            (_, Outcome::ConnectFailed) => ApiError::new(
                ErrorKind::NoCapacity,
                format!("no backend of the model {model:?} could be reached"),
            )
            .retry_after(NO_CAPACITY_RETRY_AFTER),
            (_, Outcome::TimedOut) => ApiError::new(
                ErrorKind::UpstreamTimeout,
                self.timed_out(model, stop, attempts),
            ),
            _ => ApiError::new(
                ErrorKind::UpstreamUnavailable,
                "the backend closed the connection before answering",
            ),
        }
    }

    /// What happened to a request whose last attempt timed out: how many attempts were made
    /// and how long they took in all, not just one attempt's timeout.
    fn timed_out(&self, model: &str, stop: Stop, attempts: u32) -> String {
        // The deadline is the request's start plus `retry.deadline` (see `forward`).
        let spent = self
            .deadline
            .checked_sub(self.gw.retry.deadline)
            .map_or(Duration::ZERO, |started| started.elapsed());
        let plural = if attempts == 1 { "" } else { "s" };
        let mut message = format!(
            "no backend of the model {model:?} answered in time: {attempts} attempt{plural} \
             in {:.1}s, each allowed at most {:?} (upstream.response_timeout)",
            spent.as_secs_f64(),
            self.gw.upstream.response_timeout,
        );
        if stop == Stop::Deadline {
            message += &format!(
                "; the request's deadline of {:?} (retry.deadline) left no time for another",
                self.gw.retry.deadline
            );
        }
        message
    }
}

/// The IL-0248 behaviour, for replays: every 5xx and every failed connection is worth a retry.
fn naive_class(outcome: Outcome) -> Class {
    match outcome {
        Outcome::Response(s) if s >= 500 => Class::Transient,
        Outcome::Response(s) if s >= 400 => Class::ClientError,
        Outcome::Response(_) => Class::Success,
        _ => Class::Transient,
    }
}

fn naive_decide(class: Class, attempts: u32, max_attempts: u32) -> Decision {
    if class == Class::Transient && attempts < max_attempts {
        Decision::Retry {
            after: Duration::ZERO,
            same_backend_ok: true,
        }
    } else {
        Decision::Stop(Stop::Final)
    }
}

fn pushback(headers: &HeaderMap) -> Pushback {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    Pushback::parse(
        get(header::RETRY_AFTER.as_str()),
        get("retry-after-ms"),
        get("x-should-retry"),
    )
}

pub(crate) fn is_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Whether a request carries a caller's retry marker with a value other than 0.
pub(crate) fn is_client_retry(headers: &HeaderMap, markers: &[http::HeaderName]) -> bool {
    markers.iter().any(|name| {
        headers
            .get(name)
            .is_some_and(|v| v.as_bytes() != b"0" && !v.is_empty())
    })
}

/// Marks a relayed 5xx as not worth a retry above spillway (see `ApiError`'s response).
pub(crate) fn discourage_retry(headers: &mut HeaderMap) {
    headers.insert("x-should-retry", HeaderValue::from_static("false"));
}
