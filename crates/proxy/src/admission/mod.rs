//! Admission: the one gate every request passes before it may use a backend, whoever its
//! tenant (G3).
//!
//! In IL-0248 an internal workload skipped the rate limits and overload controls external
//! callers had, and its amplified traffic took the shared routing layer down; in IL-0110 one
//! memory-hungry neighbour took a node down. So there is no path around this gate, "internal"
//! tenants included, and it checks, in order:
//!
//! 1. the gateway's own cap on requests in flight (`admission.max_in_flight`): past it every
//!    request is refused at once with 503 and `Retry-After`, whoever sends it, instead of the
//!    gateway growing until it falls over;
//! 2. the tenant's `max_concurrency`: requests in flight for this tenant, streams included until
//!    their last byte;
//! 3. the tenant's requests-per-minute and tokens-per-minute limits (GCRA, `spillway-policy`),
//!    both or neither: tokens are estimated from the body and `max_tokens`, reserved, and
//!    reconciled with the usage the backend reports when the response ends ([`Admitted`]).
//!
//! A refusal is a 429 with `Retry-After` and the `x-ratelimit-*` headers OpenAI and Azure OpenAI
//! send; an admitted request carries the same headers on its response.

mod headers;
pub(crate) mod metrics;
mod queue;
mod rate;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use spillway_config::AdmissionConfig;
use spillway_policy::{Dimension, RateHeaders, TenantLimiter};

use crate::auth::{Tenant, TenantLimits};
use crate::error::{ApiError, ErrorKind};
use crate::request::RequestSummary;

pub(crate) use headers::insert_rate_headers;
use queue::PoolQueue;
pub(crate) use queue::{Seat, Shed};
use rate::{Rates, Ruling};

/// Queue bounds and in-flight cap of `admission.naive`: in effect none.
const NAIVE_UNBOUNDED: usize = 1 << 30;
/// How long a request may wait in the naive queue.
const NAIVE_QUEUE_WAIT: Duration = Duration::from_secs(600);

/// How long a caller refused by a global cap is told to wait.
const OVERLOADED_RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long a caller at its concurrency limit is told to wait.
const CONCURRENCY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The gateway's admission state: global counters and one gate per tenant seen.
pub(crate) struct Admission {
    gates: RwLock<HashMap<Arc<str>, Arc<Gate>>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: usize,
    default_completion_tokens: u64,
    rates: Arc<Rates>,
    /// `admission.naive`: no limits, one unbounded first-come-first-served queue.
    naive: bool,
    /// One queue per model and bulkhead (`None`: the shared backends).
    queues: HashMap<QueueKey, Arc<PoolQueue>>,
    /// The longest a request waits for a seat, or, once seated, for a backend to free up.
    queue_wait: Duration,
}

/// A model's name, and the bulkhead of the backends a queue seats (`None`: shared ones).
type QueueKey = (Arc<str>, Option<Arc<str>>);

/// One queue's figures, for the gauges.
pub(crate) struct QueueFigures {
    pub model: Arc<str>,
    pub bulkhead: Option<Arc<str>>,
    /// Waiting, by class: critical, standard, batch.
    pub queued: [usize; 3],
    pub in_use: usize,
    pub seats: usize,
}

/// One tenant's admission state.
struct Gate {
    tenant: Arc<str>,
    /// The tenant's per-request series, registered once (a lookup by labels costs a hash and
    /// an allocation on every request otherwise).
    series: metrics::TenantSeries,
    in_flight: Arc<AtomicUsize>,
    /// Bytes of request body its requests hold, under its share of the body budget.
    body_held: Arc<std::sync::atomic::AtomicU64>,
    /// The limits the limiter enforces, and the limiter.
    rate: Mutex<(TenantLimits, TenantLimiter)>,
}

/// What an admission needs to know about the request.
pub(crate) struct Ask<'a> {
    pub summary: &'a RequestSummary,
    pub body_len: usize,
    /// Embeddings produce no completion tokens.
    pub completes: bool,
}

impl Admission {
    /// Admission for a gateway serving `pools`: a queue for each model and each bulkhead its
    /// backends belong to.
    pub(crate) fn new<'a>(
        config: &AdmissionConfig,
        pools: impl IntoIterator<Item = &'a crate::pool::ModelPool>,
        shared: Option<crate::shared_limits::SharedLimits>,
    ) -> Admission {
        let (bounds, wait, max_in_flight) = if config.naive {
            let unbounded = spillway_policy::QueueBounds {
                total: NAIVE_UNBOUNDED,
                per_tenant: NAIVE_UNBOUNDED,
            };
            (unbounded, NAIVE_QUEUE_WAIT, NAIVE_UNBOUNDED)
        } else {
            let bounds = spillway_policy::QueueBounds {
                total: config.max_queued,
                per_tenant: config.max_queued_per_tenant,
            };
            (bounds, config.queue_wait, config.max_in_flight)
        };
        Admission {
            gates: RwLock::new(HashMap::new()),
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_in_flight,
            queue_wait: wait,
            naive: config.naive,
            default_completion_tokens: config.default_completion_tokens,
            rates: Arc::new(Rates {
                shared,
                instances: config.instances,
            }),
            queues: pools
                .into_iter()
                .flat_map(|p| {
                    p.backends
                        .iter()
                        .map(|b| (p.name.clone(), b.bulkhead.clone()))
                })
                .map(|key| (key, PoolQueue::new(bounds, wait)))
                .collect(),
        }
    }

    /// The longest a request waits for a seat, or, once seated, for a backend to free up.
    pub(crate) fn queue_wait(&self) -> Duration {
        self.queue_wait
    }

    /// Waits for a seat in `pool` for an admitted request (which then holds it until its
    /// response ends), or sheds it.
    pub(crate) async fn seat(
        &self,
        pool: &crate::pool::ModelPool,
        tenant: &Tenant,
        class: spillway_policy::Priority,
        admitted: &mut Admitted,
    ) -> Result<(), ApiError> {
        let key = (pool.name.clone(), tenant.pool.clone());
        let Some(queue) = self.queues.get(&key) else {
            let whose = match &tenant.pool {
                Some(p) => format!("in this tenant's pool {p:?}"),
                None => "outside dedicated pools".to_owned(),
            };
            return Err(ApiError::new(
                ErrorKind::NoCapacity,
                format!("the model {:?} has no backend {whose}", &*pool.name),
            ));
        };
        let now = Instant::now();
        let seats = pool.seats(tenant.pool.as_deref(), now);
        if seats == 0 {
            // Nothing to wait for that a queue could hand out: say so at once.
            return Err(ApiError::new(
                ErrorKind::NoCapacity,
                format!(
                    "no backend of the model {:?} can take a request now (ejected or unreachable)",
                    &*pool.name
                ),
            )
            .retry_after(OVERLOADED_RETRY_AFTER));
        }
        // Naive: everyone in one line, first come first served.
        let line = if self.naive {
            Arc::from("")
        } else {
            tenant.name.clone()
        };
        match queue.enter(now, seats, class, line).await {
            Ok((seat, waited)) => {
                admitted.gate.series.queue_wait(&tenant.name, class, waited);
                admitted.seat = Some(seat);
                Ok(())
            }
            Err(shed) => {
                metrics::admission(&tenant.name, class, shed.outcome());
                let message = match shed {
                    Shed::Timeout => format!(
                        "every backend of the model {:?} stayed busy for the longest queue wait",
                        &*pool.name
                    ),
                    Shed::Evicted => {
                        "shed to make room for a request of a higher priority class".to_owned()
                    }
                    Shed::TenantQueueFull => {
                        "this tenant has its maximum of requests waiting".to_owned()
                    }
                    Shed::QueueFull => format!("the queue of the model {:?} is full", &*pool.name),
                };
                Err(ApiError::new(ErrorKind::NoCapacity, message)
                    .retry_after(OVERLOADED_RETRY_AFTER))
            }
        }
    }

    /// Per model and bulkhead: requests queued by class, seats in use, seats.
    pub(crate) fn queue_figures(&self) -> Vec<QueueFigures> {
        self.queues
            .iter()
            .map(|((model, bulkhead), q)| {
                let (queued, in_use, seats) = q.figures();
                QueueFigures {
                    model: model.clone(),
                    bulkhead: bulkhead.clone(),
                    queued,
                    in_use,
                    seats,
                }
            })
            .collect()
    }

    /// Requests admitted and not yet finished, and the cap.
    pub(crate) fn in_flight(&self) -> (usize, usize) {
        (self.in_flight.load(Ordering::Relaxed), self.max_in_flight)
    }

    /// Counts a request against the global in-flight cap and its tenant's concurrency from the
    /// moment its head is read, before its body is: a request whose body is still arriving
    /// holds memory too (G4). Refuses it, as the error to answer with, when either is full.
    pub(crate) fn enter(&self, tenant: &Tenant) -> Result<Entered, ApiError> {
        let refused = |outcome, e: ApiError| {
            metrics::admission(&tenant.name, tenant.limits.priority, outcome);
            Err(e)
        };
        let Some(global) = Slot::take(&self.in_flight, self.max_in_flight) else {
            let e = ApiError::new(
                ErrorKind::GatewayOverloaded,
                format!(
                    "the gateway is serving its maximum of {} requests; try again shortly",
                    self.max_in_flight
                ),
            )
            .retry_after(OVERLOADED_RETRY_AFTER);
            return refused("gateway_overloaded", e);
        };
        let gate = self.gate(tenant);
        let mut own = None;
        if let (Some(max), false) = (tenant.limits.max_concurrency, self.naive) {
            own = Slot::take(&gate.in_flight, max as usize);
            if own.is_none() {
                let e = ApiError::new(
                    ErrorKind::ConcurrencyLimited,
                    format!("this tenant already has its maximum of {max} requests in flight"),
                )
                .retry_after(CONCURRENCY_RETRY_AFTER);
                return refused("concurrency_limited", e);
            }
        }
        Ok(Entered { gate, global, own })
    }

    /// Admits an entered request under its tenant's rate limits, or says why not, as the error
    /// to answer with.
    pub(crate) async fn admit(
        &self,
        tenant: &Tenant,
        entered: Entered,
        ask: Ask<'_>,
    ) -> Result<Admitted, ApiError> {
        let refused = |outcome, e: ApiError| {
            metrics::admission(&tenant.name, tenant.limits.priority, outcome);
            Err(e)
        };
        let Entered { gate, global, own } = entered;
        if self.naive {
            return Ok(Admitted {
                gate,
                rates: None,
                reserved: 0,
                prompt: 0,
                headers: RateHeaders {
                    requests: None,
                    tokens: None,
                },
                _global: global,
                _own: None,
                seat: None,
                settled: true,
            });
        }
        // A rate of 0 has no GCRA to enforce it; it means "admit nothing", never "no limit".
        // Nothing writes one any more, but a record from before may still hold one.
        let zero = [
            (
                tenant.limits.requests_per_min,
                ErrorKind::RequestRateLimited,
                "requests",
                "rate_limited_requests",
            ),
            (
                tenant.limits.tokens_per_min,
                ErrorKind::TokenRateLimited,
                "tokens",
                "rate_limited_tokens",
            ),
        ]
        .into_iter()
        .find(|(limit, ..)| *limit == Some(0));
        if let Some((_, kind, what, outcome)) = zero {
            let e = ApiError::new(
                kind,
                format!(
                    "this tenant's {what}-per-minute limit is 0, which admits no request; \
                     its limits must be changed"
                ),
            );
            return refused(outcome, e);
        }
        let estimate = self.estimate(&ask);
        match self.rates.decide(&gate, &tenant.limits, estimate).await {
            Ruling::Admitted {
                tokens,
                headers,
                shared,
            } => {
                gate.series
                    .admitted(&tenant.name, tenant.limits.priority, tokens);
                Ok(Admitted {
                    gate,
                    rates: shared.then(|| (self.rates.clone(), tenant.limits)),
                    reserved: tokens,
                    prompt: self.prompt_estimate(ask.body_len),
                    headers,
                    _global: global,
                    _own: own,
                    seat: None,
                    settled: false,
                })
            }
            Ruling::Refused {
                which,
                retry_after,
                headers: quotas,
            } => {
                let mut headers = http::HeaderMap::new();
                insert_rate_headers(&mut headers, &quotas);
                let (kind, outcome, what) = match (which, retry_after) {
                    (Dimension::Tokens, None) => {
                        (ErrorKind::TokensOverLimit, "tokens_over_limit", "tokens")
                    }
                    (Dimension::Tokens, Some(_)) => {
                        (ErrorKind::TokenRateLimited, "rate_limited_tokens", "tokens")
                    }
                    (Dimension::Requests, _) => (
                        ErrorKind::RequestRateLimited,
                        "rate_limited_requests",
                        "requests",
                    ),
                };
                let message = match retry_after {
                    Some(after) => format!(
                        "rate limit reached for {what} per minute; try again in {}",
                        headers::duration_text(after)
                    ),
                    None => format!(
                        "this request needs about {estimate} tokens, more than this tenant's \
                         tokens-per-minute limit allows at once; lower max_tokens or the input"
                    ),
                };
                let mut e = ApiError::new(kind, message).with_headers(headers);
                if let Some(after) = retry_after {
                    e = e.retry_after(after);
                }
                refused(outcome, e)
            }
        }
    }

    /// About one token per four bytes of body (which over-counts JSON syntax a little).
    fn prompt_estimate(&self, body_len: usize) -> u64 {
        (body_len as u64 / 4).max(1)
    }

    /// Tokens to reserve: the prompt plus the completion the caller allows, per choice.
    fn estimate(&self, ask: &Ask<'_>) -> u64 {
        let prompt = self.prompt_estimate(ask.body_len);
        if !ask.completes {
            return prompt;
        }
        let completion = ask
            .summary
            .max_tokens
            .unwrap_or(self.default_completion_tokens);
        prompt.saturating_add(completion.saturating_mul(ask.summary.choices))
    }

    fn gate(&self, tenant: &Tenant) -> Arc<Gate> {
        if let Some(gate) = self
            .gates
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&tenant.name)
        {
            return gate.clone();
        }
        let mut gates = self.gates.write().unwrap_or_else(|e| e.into_inner());
        gates
            .entry(tenant.name.clone())
            .or_insert_with(|| {
                let (requests, tokens) = self.rates.local(&tenant.limits);
                Arc::new(Gate {
                    tenant: tenant.name.clone(),
                    series: metrics::TenantSeries::new(&tenant.name, tenant.limits.priority),
                    in_flight: Arc::new(AtomicUsize::new(0)),
                    body_held: Arc::default(),
                    rate: Mutex::new((
                        tenant.limits,
                        TenantLimiter::new(Instant::now(), requests, tokens),
                    )),
                })
            })
            .clone()
    }
}

/// An admitted request: holds its places in the in-flight counts and its token reservation
/// until the response ends. Settle it with the usage the backend reported; dropped unsettled
/// (the request failed before a response), its reserved tokens are refunded.
pub(crate) struct Admitted {
    gate: Arc<Gate>,
    /// Set when Redis decided: the reservation is settled there.
    rates: Option<(Arc<Rates>, TenantLimits)>,
    reserved: u64,
    prompt: u64,
    /// The tenant's quotas after this admission, for the response's `x-ratelimit-*` headers.
    pub(crate) headers: RateHeaders,
    _global: Slot,
    _own: Option<Slot>,
    /// Its seat in the pool, once it has one.
    seat: Option<Seat>,
    settled: bool,
}

impl Admitted {
    /// The prompt's share of the reservation.
    pub(crate) fn prompt_estimate(&self) -> u64 {
        self.prompt
    }

    /// The request is over: `used` tokens if known (the backend's report, or a count of what
    /// was streamed); `None` keeps the reservation as it is.
    pub(crate) fn settle(mut self, used: Option<u64>) {
        if let Some(used) = used {
            self.gate.series.tokens_reported.increment(used);
            self.reconcile(used);
        }
        self.settled = true;
    }

    fn reconcile(&self, used: u64) {
        if let Some((rates, limits)) = &self.rates {
            rates.settle_shared(&self.gate.tenant, limits, self.reserved, used);
            return;
        }
        let mut rate = self.gate.rate.lock().unwrap_or_else(|e| e.into_inner());
        rate.1.reconcile(Instant::now(), self.reserved, used);
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if !self.settled {
            // Nothing was generated: give the tokens back (the request itself still counts).
            self.reconcile(0);
        }
    }
}

/// A request counted in flight, globally and for its tenant, whose body is yet to be read.
pub(crate) struct Entered {
    gate: Arc<Gate>,
    global: Slot,
    own: Option<Slot>,
}

impl Entered {
    /// Bytes of request body the tenant's requests hold now.
    pub(crate) fn body_held(&self) -> &Arc<std::sync::atomic::AtomicU64> {
        &self.gate.body_held
    }
}

/// One place in a counter with a cap, given back on drop.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(counter: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        let before = counter.fetch_add(1, Ordering::AcqRel);
        if before >= max {
            counter.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(counter.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests;
