//! Per-tenant rate limits on requests per minute and tokens per minute, by GCRA (the generic
//! cell rate algorithm), and what the gateway needs to answer with OpenAI-style headers.
//!
//! Why: one tenant must not take the gateway, or the backends behind it, down. Concurrency caps
//! bound what a tenant holds at once; a rate bounds what it takes over time, which is what a
//! tenant's contract (RPM, TPM) is written in. The limits apply to every tenant, internal ones
//! included: a batch job of our own floods a backend as well as anyone's.
//!
//! Why GCRA: it is a token bucket kept as a single number (the theoretical arrival time), so a
//! tenant's state is O(1), a refusal can say exactly when the same request would pass, and no
//! timer refills anything. Here the state is kept as the bucket's level at an instant rather than
//! as the arrival time itself: the two are equivalent (`tat = at + level / rate`), but the level
//! is in exact integers (one unit of cost is [`UNIT`] ticks; a minute drains `per_minute` units),
//! so the bounds below hold exactly, with no rounding.
//!
//! Why the burst defaults to a whole minute's allowance: OpenAI lets a tenant spend its full RPM
//! or TPM at once and then refills it continuously. A smaller burst would refuse clients that
//! stay within their published limit (a batch of 50 requests under a 60 RPM limit). The cost is
//! that admissions within any window shorter than a minute may reach `burst + per_minute - 1`
//! (a full bucket, then the refill); the property tests hold that exact bound.
//!
//! Reservations: a request's tokens are not known when it is admitted, so the gateway reserves
//! an estimate and reconciles it when the backend reports usage: the unused part is refunded,
//! the excess is charged, which may put the tenant in debt so that its next requests wait.

use std::fmt;
use std::time::{Duration, Instant};

/// Ticks per unit of cost: the nanoseconds in a minute, so that `per_minute` units drain in one.
pub const UNIT: u128 = 60_000_000_000;
/// The highest rate or burst accepted (a trillion per minute).
pub const MAX_PER_MINUTE: u64 = 1_000_000_000_000;
/// Minutes in a day: the burst is at most a day's allowance, and a tenant's debt at most a day's
/// refill, so every wait this module reports stays under two days.
const DAY_MINUTES: u64 = 24 * 60;

/// Settings of one rate: `per_minute` units refill continuously, at most `burst` may be taken at
/// once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    per_minute: u64,
    burst: u64,
}

/// Why a [`RateLimit`] was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitError {
    /// A rate of zero admits nothing: disable the tenant instead.
    ZeroPerMinute,
    /// A burst of zero admits nothing.
    ZeroBurst,
    /// Above [`MAX_PER_MINUTE`].
    PerMinuteTooHigh,
    /// Above a day's allowance (or [`MAX_PER_MINUTE`]).
    BurstTooHigh,
}

impl fmt::Display for RateLimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RateLimitError::ZeroPerMinute => "the rate per minute must be at least 1",
            RateLimitError::ZeroBurst => "the burst must be at least 1",
            RateLimitError::PerMinuteTooHigh => "the rate per minute is above 10^12",
            RateLimitError::BurstTooHigh => "the burst is above a day's allowance or 10^12",
        })
    }
}

impl std::error::Error for RateLimitError {}

impl RateLimit {
    /// `burst: None` takes a full minute's allowance (`per_minute`), as OpenAI does.
    pub fn try_new(per_minute: u64, burst: Option<u64>) -> Result<Self, RateLimitError> {
        let burst = burst.unwrap_or(per_minute);
        if per_minute == 0 {
            return Err(RateLimitError::ZeroPerMinute);
        }
        if per_minute > MAX_PER_MINUTE {
            return Err(RateLimitError::PerMinuteTooHigh);
        }
        if burst == 0 {
            return Err(RateLimitError::ZeroBurst);
        }
        if burst > MAX_PER_MINUTE || burst > per_minute.saturating_mul(DAY_MINUTES) {
            return Err(RateLimitError::BurstTooHigh);
        }
        Ok(RateLimit { per_minute, burst })
    }

    pub fn per_minute(&self) -> u64 {
        self.per_minute
    }

    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// This instance's share when `instances` gateways enforce the limit each on its own (the
    /// fallback when the shared state is out of reach): rate and burst divided, rounded down, at
    /// least 1 each (0 instances counts as 1). Together the instances then admit no more than
    /// the whole limit, unless it is below the number of instances. The price: a single request
    /// above the share's burst (but within the whole burst) is [`RateDecision::TooLarge`] here;
    /// the gateway should compare with the whole limit before answering 400.
    pub fn share(self, instances: u32) -> RateLimit {
        let n = u64::from(instances.max(1));
        let per_minute = (self.per_minute / n).max(1);
        RateLimit {
            per_minute,
            burst: (self.burst / n).max(1).min(per_minute * DAY_MINUTES),
        }
    }
}

/// What the `x-ratelimit-*` headers of one dimension say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// `x-ratelimit-limit-*`: the rate per minute.
    pub limit: u64,
    /// `x-ratelimit-remaining-*`: what could be taken now (at most the burst).
    pub remaining: u64,
    /// `x-ratelimit-reset-*`: until the bucket is full again, if nothing more is taken.
    pub reset: Duration,
}

/// The answer of [`Gcra::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateDecision {
    /// Taken; the quota is what is left after it.
    Admitted(Quota),
    /// Not taken, state unchanged; the same cost is admitted at `now + retry_after`.
    Limited { quota: Quota, retry_after: Duration },
    /// The cost is above the burst: it can never be admitted, so no retry time is given.
    TooLarge(Quota),
}

impl RateDecision {
    pub fn quota(&self) -> Quota {
        match *self {
            RateDecision::Admitted(q) | RateDecision::TooLarge(q) => q,
            RateDecision::Limited { quota, .. } => quota,
        }
    }

    pub fn is_admitted(&self) -> bool {
        matches!(self, RateDecision::Admitted(_))
    }
}

/// The state of one rate for one tenant: the bucket's level at an instant.
#[derive(Debug, Clone)]
pub struct Gcra {
    limit: RateLimit,
    /// Ticks taken and not yet drained as of `at`; above the capacity when in debt.
    level: u128,
    /// The latest time seen; earlier times are taken as this one.
    at: Instant,
}

impl Gcra {
    /// Starts full: the whole burst may be taken at once.
    pub fn new(limit: RateLimit, now: Instant) -> Self {
        Gcra {
            limit,
            level: 0,
            at: now,
        }
    }

    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// Changes the rate, keeping what was taken (a lower burst may leave the tenant in debt).
    pub fn set_limit(&mut self, now: Instant, limit: RateLimit) {
        self.settle(now);
        self.limit = limit;
        self.level = self.level.min(self.ceiling());
    }

    /// The headers' view at `now`, taking nothing.
    pub fn quota(&self, now: Instant) -> Quota {
        self.quota_of(now, self.level(now))
    }

    /// Takes `cost` if the bucket holds it now; otherwise changes nothing.
    pub fn check(&mut self, now: Instant, cost: u64) -> RateDecision {
        let (decision, after) = self.decide(now, cost);
        if let Some(level) = after {
            self.settle(now);
            self.level = level;
        }
        decision
    }

    /// What [`check`](Gcra::check) would answer, without taking anything.
    pub fn peek(&self, now: Instant, cost: u64) -> RateDecision {
        self.decide(now, cost).0
    }

    /// Gives back `amount` taken earlier and not used. What has drained since cannot be given
    /// back twice: the bucket never holds more than the burst.
    pub fn refund(&mut self, now: Instant, amount: u64) {
        self.settle(now);
        self.level = self.level.saturating_sub(u128::from(amount) * UNIT);
    }

    /// Takes `amount` more, admitted or not (usage above the reservation). The debt this may
    /// leave is capped at a day's refill, so the wait it causes is bounded.
    pub fn charge(&mut self, now: Instant, amount: u64) {
        self.settle(now);
        let level = self.level.saturating_add(u128::from(amount) * UNIT);
        self.level = level.min(self.ceiling());
    }

    fn capacity(&self) -> u128 {
        u128::from(self.limit.burst) * UNIT
    }

    /// The most the level may hold: the burst plus a day's refill of debt.
    fn ceiling(&self) -> u128 {
        self.capacity() + u128::from(self.limit.per_minute) * u128::from(DAY_MINUTES) * UNIT
    }

    /// Ticks drained per nanosecond.
    fn rate(&self) -> u128 {
        u128::from(self.limit.per_minute)
    }

    fn level(&self, now: Instant) -> u128 {
        let elapsed = now.saturating_duration_since(self.at).as_nanos();
        self.level
            .saturating_sub(elapsed.saturating_mul(self.rate()))
    }

    fn settle(&mut self, now: Instant) {
        self.level = self.level(now);
        self.at = self.at.max(now);
    }

    /// How long from `now` until the level has drained by `excess` ticks.
    fn wait(&self, now: Instant, excess: u128) -> Duration {
        if excess == 0 {
            return Duration::ZERO;
        }
        let lag = self.at.saturating_duration_since(now);
        // Below two days by the bounds on burst and debt, so u64 nanoseconds always suffice.
        let nanos = u64::try_from(excess.div_ceil(self.rate())).unwrap_or(u64::MAX);
        lag.saturating_add(Duration::from_nanos(nanos))
    }

    fn quota_of(&self, now: Instant, level: u128) -> Quota {
        let free = self.capacity().saturating_sub(level) / UNIT;
        Quota {
            limit: self.limit.per_minute,
            remaining: u64::try_from(free).unwrap_or(u64::MAX),
            reset: self.wait(now, level),
        }
    }

    /// The decision, and the level to commit when admitted.
    fn decide(&self, now: Instant, cost: u64) -> (RateDecision, Option<u128>) {
        let level = self.level(now);
        let quota = self.quota_of(now, level);
        if cost > self.limit.burst {
            return (RateDecision::TooLarge(quota), None);
        }
        let after = level + u128::from(cost) * UNIT;
        match after.checked_sub(self.capacity()) {
            Some(excess) if excess > 0 => {
                let retry_after = self.wait(now, excess);
                (RateDecision::Limited { quota, retry_after }, None)
            }
            _ => (
                RateDecision::Admitted(self.quota_of(now, after)),
                Some(after),
            ),
        }
    }
}

/// Which of a tenant's limits refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    Requests,
    Tokens,
}

/// Both dimensions' headers; `None` where the tenant has no limit of that kind (the default:
/// none of either).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RateHeaders {
    pub requests: Option<Quota>,
    pub tokens: Option<Quota>,
}

/// An admitted request: what it reserved, and the headers after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub tokens: u64,
    pub headers: RateHeaders,
}

/// A refused request; nothing was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateRefusal {
    /// The dimension that needs the longer wait (requests on a tie), or the one it is too large
    /// for.
    pub which: Dimension,
    /// When both dimensions admit the same request (`Retry-After`); `None` when it is larger
    /// than the token burst and can never be admitted.
    pub retry_after: Option<Duration>,
    pub headers: RateHeaders,
}

/// A tenant's request and token rates, checked together.
#[derive(Debug, Clone)]
pub struct TenantLimiter {
    requests: Option<Gcra>,
    tokens: Option<Gcra>,
}

impl TenantLimiter {
    /// `None`: no limit of that kind.
    pub fn new(now: Instant, requests: Option<RateLimit>, tokens: Option<RateLimit>) -> Self {
        TenantLimiter {
            requests: requests.map(|l| Gcra::new(l, now)),
            tokens: tokens.map(|l| Gcra::new(l, now)),
        }
    }

    /// The tenant's limits changed: a kept dimension keeps what was taken, a new one starts full.
    pub fn set_limits(
        &mut self,
        now: Instant,
        requests: Option<RateLimit>,
        tokens: Option<RateLimit>,
    ) {
        fn update(slot: &mut Option<Gcra>, now: Instant, limit: Option<RateLimit>) {
            match (slot.as_mut(), limit) {
                (Some(g), Some(l)) => g.set_limit(now, l),
                (_, l) => *slot = l.map(|l| Gcra::new(l, now)),
            }
        }
        update(&mut self.requests, now, requests);
        update(&mut self.tokens, now, tokens);
    }

    pub fn headers(&self, now: Instant) -> RateHeaders {
        RateHeaders {
            requests: self.requests.as_ref().map(|g| g.quota(now)),
            tokens: self.tokens.as_ref().map(|g| g.quota(now)),
        }
    }

    /// Admits one request reserving `est_tokens` only if both dimensions admit it; otherwise
    /// takes nothing from either.
    pub fn admit(&mut self, now: Instant, est_tokens: u64) -> Result<Reservation, RateRefusal> {
        let r = shortfall(self.requests.as_ref().map(|g| g.peek(now, 1)));
        let t = shortfall(self.tokens.as_ref().map(|g| g.peek(now, est_tokens)));
        // Too large beats any wait; otherwise the longer wait, requests on a tie.
        let severity = |s: Option<Duration>| (s.is_none(), s.unwrap_or_default());
        let refusal = match (r, t) {
            (None, None) => None,
            (Some(r), Some(t)) if severity(t) > severity(r) => Some((Dimension::Tokens, t)),
            (Some(r), _) => Some((Dimension::Requests, r)),
            (None, Some(t)) => Some((Dimension::Tokens, t)),
        };
        if let Some((which, retry_after)) = refusal {
            return Err(RateRefusal {
                which,
                retry_after,
                headers: self.headers(now),
            });
        }
        let requests = self.requests.as_mut().map(|g| g.check(now, 1).quota());
        let tokens = self
            .tokens
            .as_mut()
            .map(|g| g.check(now, est_tokens).quota());
        Ok(Reservation {
            tokens: est_tokens,
            headers: RateHeaders { requests, tokens },
        })
    }

    /// The backend reported `actual` tokens for a request that reserved `reserved`: refunds the
    /// difference, or charges it.
    pub fn reconcile(&mut self, now: Instant, reserved: u64, actual: u64) {
        if let Some(g) = self.tokens.as_mut() {
            if actual > reserved {
                g.charge(now, actual - reserved);
            } else {
                g.refund(now, reserved - actual);
            }
        }
    }

    /// The request never reached a backend: gives back the request and its reserved tokens.
    pub fn undo(&mut self, now: Instant, reserved: u64) {
        if let Some(g) = self.requests.as_mut() {
            g.refund(now, 1);
        }
        if let Some(g) = self.tokens.as_mut() {
            g.refund(now, reserved);
        }
    }
}

/// `None` when admitted (or unlimited); `Some(None)` when it never will be.
fn shortfall(decision: Option<RateDecision>) -> Option<Option<Duration>> {
    match decision? {
        RateDecision::Admitted(_) => None,
        RateDecision::Limited { retry_after, .. } => Some(Some(retry_after)),
        RateDecision::TooLarge(_) => Some(None),
    }
}

#[cfg(test)]
mod tests;
