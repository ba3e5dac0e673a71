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
//!    reconciled with the usage the backend reports when the response ends ([`Ticket`]).
//!
//! A refusal is a 429 with `Retry-After` and the `x-ratelimit-*` headers OpenAI and Azure OpenAI
//! send; an admitted request carries the same headers on its response.
//!
//! The first two are taken at the request's head ([`Admission::enter`]), while its body is still
//! to be read; the rest in one call once the body is read ([`Admission::admit`]), which also
//! sheds a caller's own retry while the model's backends are failing, applies the model's
//! adaptive throttling and waits for a queue seat, and returns one [`Ticket`] that holds it all
//! until the response ends.

pub(crate) mod gate;
mod headers;
pub(crate) mod metrics;
mod queue;
mod rate;
mod ticket;

use foldhash::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use spillway_config::AdmissionConfig;
use spillway_policy::{Dimension, TenantLimiter};

use crate::auth::{Tenant, TenantLimits};
use crate::call::Call;
use crate::endpoint::Endpoint;
use crate::error::{ApiError, ErrorKind, NO_CAPACITY_RETRY_AFTER, OWN_HEADERS};
use crate::lines::Lines;
use crate::pool::ModelPool;
use crate::request::RequestSummary;
use crate::traffic::{Refused, TenantTraffic};

use gate::{take_place, Entered, Gate};
pub(crate) use headers::insert_rate_headers;
use headers::RATE_HEADERS;
pub(crate) use metrics::QueueFigures;
pub(crate) use queue::Shed;
use queue::{PoolQueue, Queues};
use rate::{Rates, Ruling};
pub(crate) use ticket::Ticket;

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
    /// Shared with the admission of the next config: a reload keeps each tenant's state.
    gates: Arc<RwLock<HashMap<Arc<str>, Arc<Gate>>>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: usize,
    default_completion_tokens: u64,
    rates: Arc<Rates>,
    /// Whether tenants are held to their own limits (rates and concurrency): always, but in the
    /// replays of a gateway without admission (`admission.naive`).
    tenant_limits: bool,
    /// Whether each tenant waits in its own line of a queue, served in turn; else everyone waits
    /// in one line, first come first served (`admission.naive`).
    fair_lines: bool,
    /// Callers' own retries are refused first while a model's backends are failing
    /// (`retry.shed_client_retries`).
    shed_client_retries: bool,
    /// One queue per model and bulkhead (`None`: the shared backends).
    queues: Queues,
    /// The longest a request waits for a seat, or, once seated, for a backend to free up.
    queue_wait: Duration,
}

/// The line everyone waits in when tenants have no lines of their own (`admission.naive`).
static ONE_LINE: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(""));

/// What an admission needs to know about the request.
pub(crate) struct Ask<'a> {
    pub summary: &'a RequestSummary,
    pub body_len: usize,
    /// Whether it is charged tokens at all: counting a prompt's tokens generates none and
    /// prefills nothing, so it counts as a request only.
    pub tokens: bool,
    /// Embeddings produce no completion tokens.
    pub completes: bool,
}

impl Admission {
    /// Admission for a gateway serving `pools`: a queue for each model and each bulkhead its
    /// backends belong to.
    pub(crate) fn new<'a>(
        config: &AdmissionConfig,
        shed_client_retries: bool,
        pools: impl IntoIterator<Item = &'a ModelPool>,
        shared: Option<crate::shared_limits::SharedLimits>,
    ) -> Admission {
        let rates = Arc::new(Rates {
            shared,
            instances: config.instances,
        });
        Self::with_state(config, shed_client_retries, pools, None, rates)
    }

    /// Admission for the next config: it keeps this one's tenants' gates (their concurrency and
    /// rates), the global count of requests in flight, the shared limits, and every queue whose
    /// model, bulkhead and bounds are unchanged (with the seats its requests hold).
    pub(crate) fn reloaded<'a>(
        &self,
        config: &AdmissionConfig,
        shed_client_retries: bool,
        pools: impl IntoIterator<Item = &'a ModelPool>,
    ) -> Admission {
        Self::with_state(
            config,
            shed_client_retries,
            pools,
            Some(self),
            self.rates.clone(),
        )
    }

    fn with_state<'a>(
        config: &AdmissionConfig,
        shed_client_retries: bool,
        pools: impl IntoIterator<Item = &'a ModelPool>,
        previous: Option<&Admission>,
        rates: Arc<Rates>,
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
        let mut queues = Queues::default();
        for p in pools {
            for b in &p.backends {
                queues.add(&p.name, &b.bulkhead, || {
                    previous
                        .and_then(|a| a.queues.get(&p.name, b.bulkhead.as_deref()))
                        .filter(|q| q.settings() == (bounds, wait))
                        .cloned()
                        .unwrap_or_else(|| PoolQueue::new(bounds, wait))
                });
            }
        }
        Admission {
            gates: previous.map_or_else(Arc::default, |a| a.gates.clone()),
            in_flight: previous.map_or_else(Arc::default, |a| a.in_flight.clone()),
            max_in_flight,
            queue_wait: wait,
            tenant_limits: !config.naive,
            fair_lines: !config.naive,
            shed_client_retries,
            default_completion_tokens: config.default_completion_tokens,
            rates,
            queues,
        }
    }

    /// The longest a request waits for a seat, or, once seated, for a backend to free up.
    pub(crate) fn queue_wait(&self) -> Duration {
        self.queue_wait
    }

    /// The queue `tenant`'s requests for `pool` wait in, and the seats its backends have at
    /// `now`; refused when there is no backend to wait for.
    fn queue_for(
        &self,
        now: Instant,
        pool: &ModelPool,
        tenant: &Tenant,
        traffic: &TenantTraffic,
    ) -> Result<(&Arc<PoolQueue>, usize), ApiError> {
        let Some(queue) = self.queues.get(&pool.name, tenant.pool.as_deref()) else {
            traffic.shed(Refused::NoBackend);
            let whose = match &tenant.pool {
                Some(p) => format!("in this tenant's pool {p:?}"),
                None => "outside dedicated pools".to_owned(),
            };
            return Err(ApiError::new(
                ErrorKind::NoCapacity,
                format!("the model {:?} has no backend {whose}", &*pool.name),
            ));
        };
        let seats = pool.seats(tenant.pool.as_deref(), now);
        if seats == 0 {
            // Nothing to wait for that a queue could hand out: say so at once.
            traffic.shed(Refused::NoBackend);
            return Err(ApiError::new(
                ErrorKind::NoCapacity,
                format!(
                    "no backend of the model {:?} can take a request now (ejected or unreachable)",
                    &*pool.name
                ),
            )
            .retry_after(OVERLOADED_RETRY_AFTER));
        }
        Ok((queue, seats))
    }

    /// Waits for a seat in `queue`, which has `seats`, for `call`, admitted with `admitted`
    /// (which then holds it until its response ends), or sheds it.
    async fn wait_for_seat(
        &self,
        (queue, seats): (&Arc<PoolQueue>, usize),
        now: Instant,
        call: &Call<'_>,
        admitted: &mut Ticket,
    ) -> Result<(), ApiError> {
        let (pool, tenant, class) = (call.pool, &*call.tenant, call.priority);
        let traffic = admitted.traffic();
        let line = match self.fair_lines {
            true => &tenant.name,
            false => &*ONE_LINE,
        };
        let entered = queue
            .enter(now, seats, class, line, || traffic.queued())
            .await;
        match entered {
            Ok((seat, waited)) => {
                admitted.seated(seat, &tenant.name, class, waited);
                admitted.traffic().admitted();
                Ok(())
            }
            Err(shed) => {
                admitted.traffic().shed(shed.refused());
                metrics::admission(&tenant.name, class, shed.refused().as_str());
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
            .map(|(model, bulkhead, q)| {
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

    /// Every tenant that sent a request since the gateway started, with its traffic counters.
    pub(crate) fn traffic(&self) -> Vec<(Arc<str>, Arc<TenantTraffic>)> {
        self.gates
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(name, gate)| (name.clone(), gate.traffic.clone()))
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
        let gate = self.gate(tenant);
        gate.traffic.offered();
        let refused = |gate: &Gate, why: Refused, e: ApiError| {
            gate.traffic.shed(why);
            metrics::admission(&tenant.name, tenant.limits.priority, why.as_str());
            Err(e)
        };
        if !take_place(&gate.global, self.max_in_flight) {
            let e = ApiError::new(
                ErrorKind::GatewayOverloaded,
                format!(
                    "the gateway is serving its maximum of {} requests; try again shortly",
                    self.max_in_flight
                ),
            )
            .retry_after(OVERLOADED_RETRY_AFTER);
            return refused(&gate, Refused::GatewayOverloaded, e);
        }
        // Counted from here: a refusal below gives the gateway's place back as it drops.
        let mut entered = Entered { gate, own: false };
        if let Some(max) = self.limits_of(tenant).max_concurrency {
            if !take_place(&entered.gate.in_flight, max as usize) {
                let e = ApiError::new(
                    ErrorKind::ConcurrencyLimited,
                    format!("this tenant already has its maximum of {max} requests in flight"),
                )
                .retry_after(CONCURRENCY_RETRY_AFTER);
                return refused(&entered.gate, Refused::ConcurrencyLimited, e);
            }
            entered.own = true;
        }
        Ok(entered)
    }

    /// Admits a call whose body is read, or says why not, as the error to answer with: its
    /// tenant's rate limits, then the shedding of a caller's own retry while the model's
    /// backends are failing, the model's adaptive throttling, and a seat in its queue. The
    /// ticket holds the call's places, reservation and seat until its response ends.
    pub(crate) async fn admit(&self, call: &mut Call<'_>) -> Result<Ticket, ApiError> {
        let entered = match call.entered.take() {
            Some(entered) => entered,
            None => self.enter(&call.tenant)?,
        };
        // The tenant's counters are those of the gate it entered, borrowed from its places.
        entered.traffic().offered_to(&call.pool.name);
        let ask = Ask {
            summary: &call.summary,
            body_len: call.body.len(),
            completes: call.endpoint.generates(),
            tokens: call.endpoint != Endpoint::CountTokens,
        };
        let mut ticket = self.limits(&call.tenant, entered, ask).await?;
        let pool = call.pool;
        let now = crate::clock::now();
        let traffic = ticket.traffic();
        if call.client_retry {
            // A caller's retry while the pool is failing would only stack its retries on ours.
            let shed = self.shed_client_retries && pool.is_failing(now);
            call.labels().client_retry(shed);
            traffic.client_retry();
            if shed {
                traffic.shed(Refused::ClientRetryShed);
                return Err(ApiError::new(
                    ErrorKind::ClientRetryShed,
                    format!(
                        "the backends of the model {:?} are failing and spillway has retried already; retried requests are refused first",
                        &*pool.name
                    ),
                )
                .retry_after(NO_CAPACITY_RETRY_AFTER));
            }
        }
        let Some(pass) = pool.throttle_admits(now) else {
            // The backends have been failing: only a share of requests reaches them until they
            // accept again, however often callers resend.
            pool.metrics.throttled();
            traffic.shed(Refused::Throttled);
            return Err(ApiError::new(
                ErrorKind::BackendsFailing,
                format!(
                    "the backends of the model {:?} are failing; spillway sends them only a share of requests until they recover",
                    &*pool.name
                ),
            )
            .retry_after(NO_CAPACITY_RETRY_AFTER));
        };
        call.throttle_pass = Some(pass);
        let (queue, seats) = self.queue_for(now, pool, &call.tenant, traffic)?;
        // A free seat is taken here, without the wait's future, which is set up only for a
        // request that may have to wait (and then on the heap, out of every request's future).
        if let Some(seat) = queue.try_enter(now, seats) {
            ticket.seated(seat, &call.tenant.name, call.priority, Duration::ZERO);
            ticket.traffic().admitted();
        } else {
            Box::pin(self.wait_for_seat((queue, seats), now, call, &mut ticket)).await?;
        }
        Ok(ticket)
    }

    /// The limits a tenant is held to.
    fn limits_of(&self, tenant: &Tenant) -> TenantLimits {
        if self.tenant_limits {
            tenant.limits
        } else {
            TenantLimits::default()
        }
    }

    /// Admits an entered request under its tenant's rate limits, or says why not, as the error
    /// to answer with.
    async fn limits(
        &self,
        tenant: &Tenant,
        entered: Entered,
        ask: Ask<'_>,
    ) -> Result<Ticket, ApiError> {
        let refused = |gate: &Gate, why: Refused, e: ApiError| {
            gate.traffic.shed(why);
            metrics::admission(&tenant.name, tenant.limits.priority, why.as_str());
            Err(e)
        };
        if !self.tenant_limits {
            return Ok(Ticket::unlimited(entered));
        }
        // A rate of 0 has no GCRA to enforce it; it means "admit nothing", never "no limit".
        // Nothing writes one any more, but a record from before may still hold one.
        let zero = [
            (
                tenant.limits.requests_per_min,
                ErrorKind::RequestRateLimited,
                "requests",
                Refused::RateLimitedRequests,
            ),
            (
                tenant.limits.tokens_per_min,
                ErrorKind::TokenRateLimited,
                "tokens",
                Refused::RateLimitedTokens,
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
            return refused(&entered.gate, outcome, e);
        }
        let estimate = self.estimate(&ask);
        match self
            .rates
            .decide(&entered.gate, &tenant.limits, estimate)
            .await
        {
            Ruling::Admitted {
                tokens,
                headers,
                shared,
            } => {
                entered
                    .gate
                    .series
                    .admitted(&tenant.name, tenant.limits.priority, tokens);
                Ok(Ticket::new(ticket::Places {
                    entered,
                    rates: shared.then(|| (self.rates.clone(), tenant.limits)),
                    reserved: tokens,
                    prompt: self.prompt_estimate(ask.body_len),
                    headers,
                    meters_tokens: tenant.limits.tokens_per_min.is_some(),
                }))
            }
            Ruling::Refused {
                which,
                retry_after,
                headers: quotas,
            } => {
                // Room for the refusal's own headers (`ApiError::answer`): its lines are
                // these, with them added, and written as they are.
                let mut headers = Lines::with_capacity(RATE_HEADERS + OWN_HEADERS);
                insert_rate_headers(&mut headers, &quotas);
                let (kind, outcome, what) = match (which, retry_after) {
                    (Dimension::Tokens, None) => (
                        ErrorKind::TokensOverLimit,
                        Refused::TokensOverLimit,
                        "tokens",
                    ),
                    (Dimension::Tokens, Some(_)) => (
                        ErrorKind::TokenRateLimited,
                        Refused::RateLimitedTokens,
                        "tokens",
                    ),
                    (Dimension::Requests, _) => (
                        ErrorKind::RequestRateLimited,
                        Refused::RateLimitedRequests,
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
                refused(&entered.gate, outcome, e)
            }
        }
    }

    /// About one token per four bytes of body (which over-counts JSON syntax a little).
    fn prompt_estimate(&self, body_len: usize) -> u64 {
        (body_len as u64 / 4).max(1)
    }

    /// Tokens to reserve: the prompt plus the completion the caller allows, per choice.
    fn estimate(&self, ask: &Ask<'_>) -> u64 {
        if !ask.tokens {
            return 0;
        }
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
                    traffic: Arc::new(crate::traffic::TenantTraffic::new()),
                    in_flight: AtomicUsize::new(0),
                    global: self.in_flight.clone(),
                    body_held: Arc::default(),
                    rate: Mutex::new((
                        tenant.limits,
                        TenantLimiter::new(crate::clock::now(), requests, tokens),
                    )),
                })
            })
            .clone()
    }
}

#[cfg(test)]
mod tests;
