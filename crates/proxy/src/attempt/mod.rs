//! The attempts of one call: pick a backend, send, classify, and retry only when the policy and
//! the model's budget allow.
//!
//! This is the one owner of retries on the path (G1). It deposits the call into its model's
//! retry budget and withdraws from it for each retry, counts the attempts, and decides about
//! spillover; it sends through the [`Upstream`] seam, so that the whole loop runs in-process
//! against a scripted upstream in its tests (`tests.rs`), on paused time.
//!
//! Each attempt's outcome is classified once (`spillway_policy::classify`) and reported to the
//! backend's health. A retry needs the policy (`RetryPolicy::decide`) and the budget; a
//! connection never made put no load on a backend and draws nothing from the budget. A capacity
//! failure never goes back to the backend that reported it and moves to another region while
//! one has room. Nothing is retried once a response is chosen: the decision is made on the
//! response head, before a byte of the body reaches the client.

mod answer;
mod fallback;
#[cfg(test)]
mod fallback_tests;
#[cfg(test)]
mod in_flight_tests;
mod peek;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod throttle_tests;
#[cfg(test)]
mod wide_tests;

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderName};
use spillway_config::{RetryConfig, UpstreamConfig};
use spillway_policy::{classify, Class, Decision, Outcome, Pushback, RetryPolicy, Trigger};
use tracing::{debug, warn};

use crate::answer::Answer;
use crate::call::Call;
use crate::error::ApiError;
use crate::lines::Lines;
use crate::pool::{Acquired, Ask, Backend, InFlight, ModelPool, Models};
use crate::request::rewritten;
use crate::traffic::TenantTraffic;
use crate::upstream::{self, Upstream};
use answer::Failure;
pub(crate) use peek::Peeked;

/// How often a call waiting for a backend looks again when none frees up (an ejection may
/// end, or a cooldown, without a request finishing).
const RECHECK_EVERY: Duration = Duration::from_millis(100);

/// The longest a backend that asked for time with a capacity answer is left out of new picks.
const MAX_PUSHBACK_COOLDOWN: Duration = Duration::from_secs(60);

/// What the attempt loop is configured with.
#[derive(Debug, Clone)]
pub(crate) struct Retries {
    pub policy: RetryPolicy,
    /// No attempt of a call starts after this long since it arrived (`retry.deadline`).
    pub deadline: Duration,
    /// One attempt's longest wait for a response head (`upstream.response_timeout`), for the
    /// message when attempts time out.
    pub response_timeout: Duration,
    /// How long a seated call waits for a backend to free up before its first attempt.
    pub queue_wait: Duration,
}

impl Retries {
    pub(crate) fn new(
        retry: &RetryConfig,
        upstream: &UpstreamConfig,
        queue_wait: Duration,
    ) -> Self {
        Retries {
            policy: retry.policy,
            deadline: retry.deadline,
            response_timeout: upstream.response_timeout,
            queue_wait,
        }
    }
}

/// The response chosen to be relayed, with the hold on its backend.
pub(crate) struct Chosen<B> {
    pub response: Answer<Peeked<B>>,
    pub hold: InFlight,
    /// The rollout of the model whose backend gave it (the call's own, or a fallback), if that
    /// model has one.
    pub rollout: Option<Arc<crate::rollout::RolloutCell>>,
    /// The attempt's span, ended with the body.
    pub trace: crate::trace::Attempt,
}

/// How a call's attempts ended. The names are lent by the models the call runs on (`'l`).
pub(crate) struct Attempted<'l, B> {
    pub result: Result<Chosen<B>, ApiError>,
    /// The last backend tried, if any.
    pub backend: Option<&'l Arc<str>>,
    /// The model that answered, when a fallback did.
    pub fallback: Option<&'l Arc<str>>,
}

/// Runs the attempts of `call` (its tenant's counters `traffic`, its admission ticket's) until one is chosen or the call gives up, on its own model and
/// then, if its model cannot answer it, on the model's fallbacks (`fallback.rs`), all within the
/// one budget and attempt cap of the call's own model.
pub(crate) async fn run<'l, U: Upstream>(
    call: &Call<'l>,
    traffic: &TenantTraffic,
    retries: &Retries,
    upstream: &U,
    models: &'l Models,
) -> Attempted<'l, U::Body> {
    let pool = call.pool;
    let now = crate::clock::now();
    pool.budget
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .deposit(now);
    let _in_flight = pool.in_flight.enter();
    let mut attempts = Loop {
        call,
        retries,
        models,
        fallback: None,
        on_fallback: None,
        trigger: None,
        spare_retry: false,
        made: 0,
        tried: Vec::with_capacity(3),
        refused: Vec::new(),
        wait_until: now + retries.queue_wait,
    };
    let mut result = attempts.run(upstream).await;
    while attempts.fall_back() {
        result = attempts.run(upstream).await;
    }
    pool.metrics.attempts(attempts.made);
    call.labels().attempted(attempts.made);
    traffic.attempted(&call.pool.name, attempts.made);
    let pool = attempts.pool();
    Attempted {
        result,
        backend: attempts.tried.last().map(|&i| &pool.backends[i].name),
        fallback: attempts.on_fallback.map(|_| &pool.name),
    }
}

/// The state of one call's attempts; the models it may fall back on are lent for `'l`, as the
/// call's own is.
struct Loop<'a, 'l> {
    call: &'a Call<'l>,
    retries: &'a Retries,
    /// Every model, for the fallbacks.
    models: &'l Models,
    /// The fallback model it is on and the body as its backends get it (naming it); none
    /// while on the call's own model, whose pool and body are the call's.
    fallback: Option<(&'l Arc<ModelPool>, Bytes)>,
    /// The fallback it is on, by index in its own model's list.
    on_fallback: Option<usize>,
    /// Why the last run on a model ended without an answer from it, if a fallback may help.
    trigger: Option<Trigger>,
    /// A retry the budget granted that no attempt has used yet (the run then found no backend
    /// to send it to): a fallback uses it rather than drawing another.
    spare_retry: bool,
    /// Attempts made, on every model.
    made: u32,
    /// The backends tried, by index in the pool, in order.
    tried: Vec<usize>,
    /// The backends tried that must not be tried again: they gave a capacity answer or refused
    /// the gateway's credential.
    refused: Vec<usize>,
    /// Until when the call waits for a backend to free up before it has reached one.
    wait_until: Instant,
}

impl<'l> Loop<'_, 'l> {
    /// The model whose backends are tried: the call's own, or the fallback it is on. Retries
    /// are drawn from the call's own model's budget whichever it is.
    fn pool(&self) -> &'l Arc<ModelPool> {
        self.fallback
            .as_ref()
            .map_or(self.call.pool, |&(pool, _)| pool)
    }

    /// The body as the current model's backends get it.
    fn body(&self) -> &Bytes {
        self.fallback
            .as_ref()
            .map_or(&self.call.body, |(_, body)| body)
    }

    async fn run<U: Upstream>(&mut self, upstream: &U) -> Result<Chosen<U::Body>, ApiError> {
        let call = self.call;
        // Its retries are drawn from, and counted in, the call's own model.
        let own = call.pool;
        // Lent by the models, apart from `self`, which the attempts change.
        let pool = self.pool();
        self.trigger = None;
        let mut avoid_region: Option<String> = None;
        let mut last: Option<Failure> = None;
        let mut retrying: Option<Counted<'_>> = None;
        // During a rollout: the version the next attempt goes to.
        let mut side = pool.rollout.as_ref().map(|r| r.first_side());
        loop {
            let now = crate::clock::now();
            let ask = Ask {
                bulkhead: call.tenant.pool.as_deref(),
                region: call.region.as_deref(),
                avoid_region: avoid_region.as_deref(),
                affinity_key: call.affinity_key,
                surface: call.endpoint.surface(),
                // A call that continues a stored response goes to the backend that has it.
                only: call.home.filter(|_| self.on_fallback.is_none()),
                side,
                spill_to_old: pool.rollout.as_ref().is_some_and(|r| r.spills_to_old()),
            };
            // Once every backend of this model has failed it, a fallback for that is better
            // than another try on one of them.
            let failed_everywhere = last.is_some() && self.fallback_waits(Trigger::Unavailable);
            // A retry goes to a backend not tried yet...
            let acquired = pool.acquire(now, ask, &self.tried).or_else(|| {
                // ...and after a transient failure, failing that, to one tried before; never to
                // one that gave a capacity answer or refused the credential.
                let fallback =
                    !failed_everywhere && last.as_ref().is_some_and(|f| f.same_backend_ok());
                let again = Ask {
                    avoid_region: None,
                    ..ask
                };
                fallback
                    .then(|| pool.acquire(now, again, &self.refused))
                    .flatten()
            });
            let Some(Acquired {
                index,
                hold,
                spilled_over,
                affinity,
            }) = acquired
            else {
                // A seated call found every backend full: a limit fell or a backend left after
                // it was seated. It waits for one to free up, as it would have in the queue,
                // rather than being refused while a backend is about to have room. Only while
                // nothing has reached a backend yet (no attempt, or only refused connections),
                // and only while some backend can take requests at all.
                let until = self.wait_until.min(call.deadline);
                let unsent = last
                    .as_ref()
                    .is_none_or(|f| f.outcome == Outcome::ConnectFailed);
                let seats = pool.seats(ask.bulkhead, now);
                if unsent && !failed_everywhere && now < until && seats > 0 {
                    pool.freed(until.duration_since(now).min(RECHECK_EVERY))
                        .await;
                    continue;
                }
                self.trigger = if failed_everywhere {
                    Some(Trigger::Unavailable)
                } else {
                    fallback::trigger_without_backend(last.as_ref(), seats)
                };
                return Err(self.spent().no_backend(last));
            };
            self.made += 1;
            self.spare_retry = false;
            self.tried.push(index);
            // The pool's own: the hold is given away with the answer it chose.
            let backend = &pool.backends[index];
            if self.made == 1 {
                pool.metrics.affinity(affinity);
            }
            let in_flight = backend.outstanding();
            let span = call
                .trace
                .attempt(self.made, backend, last.as_ref().map(|f| f.class));
            let sent = upstream.send(backend, self.attempt(backend, &span));
            let (outcome, response) = match sent.await {
                Ok(r) => (Outcome::Response(r.status().as_u16()), Some(r)),
                Err(outcome) => (outcome, None),
            };
            let now = crate::clock::now();
            if let Some(rollout) = &pool.rollout {
                rollout.attempt_failed(backend.side, outcome);
                side = Some(rollout.retry_side());
            }
            let class = classify(outcome, &backend.rules);
            span.outcome(outcome, class);
            // A backend's pushback (`retry-after`, `x-should-retry`) bears only on a failure
            // that may be retried: a success or a client error is final whatever it says, and
            // its headers are not looked up.
            let pushback = match (&response, class) {
                (Some(r), class) if !matches!(class, Class::Success | Class::ClientError) => {
                    pushback(&r.lines)
                }
                _ => Pushback::default(),
            };
            self.learn(
                backend,
                now,
                outcome,
                class,
                pushback,
                in_flight,
                response.as_ref(),
            );
            let time_left = call.deadline.saturating_duration_since(now);
            let decision =
                self.retries
                    .policy
                    .decide(class, pushback, self.made, time_left, &mut rand::rng());
            let failure = Failure {
                class,
                outcome,
                pushback,
            };
            let after = match decision {
                Decision::Retry { .. } if outcome == Outcome::ConnectFailed => {
                    // Nothing was sent: the next backend can be tried at once, and the budget
                    // pays nothing, as no backend took any load.
                    Duration::ZERO
                }
                Decision::Retry { after, .. } => {
                    // This call's own earlier retry is not another call retrying.
                    let others =
                        own.retrying.load(Ordering::Relaxed) - u64::from(retrying.is_some());
                    if let Err(refusal) = own.withdraw_retry(now, others) {
                        debug!(
                            request_id = ?call.id(),
                            class = class.as_str(),
                            refusal = refusal.as_str(),
                            "retry budget refused a retry"
                        );
                        // No fallback either: the budget has no attempt left for this call.
                        return Err(answer::budget_refused(&pool.name, class, refusal));
                    }
                    self.spare_retry = true;
                    after
                }
                Decision::Stop(stop) => {
                    debug!(request_id = ?call.id(), class = class.as_str(), ?stop, attempts = self.made, "no retry");
                    self.trigger = fallback::trigger_of(&failure);
                    return match response {
                        Some(response) if failure.is_relayed() => {
                            let response = self.peek(response, outcome).await;
                            if spilled_over && self.trigger.is_none() {
                                backend.metrics.spilled_over();
                            }
                            Ok(Chosen {
                                response,
                                hold,
                                rollout: pool.rollout.clone(),
                                trace: span,
                            })
                        }
                        _ => Err(self.spent().give_up(failure, stop)),
                    };
                }
            };
            own.metrics.retried(class);
            retrying.get_or_insert_with(|| Counted::new(&own.retrying));
            drop(response);
            drop(hold);
            if !failure.same_backend_ok() {
                self.refused.push(index);
                avoid_region = Some(backend.region.clone());
            }
            last = Some(failure);
            if !after.is_zero() {
                tokio::time::sleep(after).await;
            }
        }
    }

    /// What the call's answer says of its attempts when they end without a response.
    fn spent(&self) -> answer::Spent<'_> {
        answer::Spent {
            model: &self.pool().name,
            made: self.made,
            started: self.call.started,
            response_timeout: self.retries.response_timeout,
            deadline: self.retries.deadline,
        }
    }

    /// The attempt as `backend` gets it, traced by `span`.
    fn attempt<'s>(
        &'s self,
        backend: &Backend,
        span: &'s crate::trace::Attempt,
    ) -> upstream::Attempt<'s> {
        let call = self.call;
        let changes = backend.changes(
            call.summary.stores_chat(call.endpoint),
            &call.tenant.name,
            call.priority,
        );
        // The copy is inside the room the call holds for it (`Call::_rewrite_room`). The body
        // was read as a JSON object, so the rewrite does not fail.
        let body = self.body();
        let body = if changes.is_empty() {
            Cow::Borrowed(body)
        } else {
            rewritten(body, &changes).map_or(Cow::Borrowed(body), Cow::Owned)
        };
        upstream::Attempt {
            endpoint: call.endpoint,
            query: call.query.as_deref(),
            headers: &call.headers,
            trace: span,
            body,
            until: call.deadline,
        }
    }

    /// What the pool and the backend learn from one attempt: its health, throttling, a
    /// credential the operator must fix, a backend that asked for time or cannot be reached.
    #[allow(clippy::too_many_arguments)]
    fn learn<B>(
        &self,
        backend: &Backend,
        now: Instant,
        outcome: Outcome,
        class: Class,
        pushback: Pushback,
        in_flight: u32,
        response: Option<&Answer<B>>,
    ) {
        let pool = self.pool();
        let status = match outcome {
            Outcome::Response(status) => Some(status),
            _ => None,
        };
        pool.record(backend, now, class, in_flight, status);
        if outcome != Outcome::ConnectFailed {
            // A connection never made put no load on a backend.
            pool.throttle_record(now, !class.is_backend_failure());
            self.call.close_throttle_pass();
        }
        if class == Class::UpstreamAuth {
            // The gateway's own key for this backend is wrong: the operator must hear of it,
            // once in a while rather than once per request.
            if let Some(held_back) = backend.auth_log.pass(now) {
                warn!(
                    backend = %backend.name,
                    status = response.map_or(0, |r| r.status().as_u16()),
                    held_back,
                    "the backend refused spillway's credential for it; check its api_key_env"
                );
            }
        }
        if class == Class::Capacity {
            if let Some(wait) = pushback.retry_after {
                // The full backend asked for time: it gets it, and this call moves on.
                backend.skip_for(now, wait.min(MAX_PUSHBACK_COOLDOWN));
            }
        }
    }
}

/// Counts itself in an atomic gauge while alive.
struct Counted<'a>(&'a AtomicU64);

impl<'a> Counted<'a> {
    fn new(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Counted(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn pushback(lines: &Lines) -> Pushback {
    use crate::error::{RETRY_AFTER_MS, X_SHOULD_RETRY};
    let get = |name: &HeaderName| lines.get(name).and_then(crate::lines::text);
    Pushback::parse(
        get(&header::RETRY_AFTER),
        get(&RETRY_AFTER_MS),
        get(&X_SHOULD_RETRY),
    )
}
