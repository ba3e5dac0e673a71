//! Whether and when to try an upstream request again.
//!
//! A retry is a bet that another attempt succeeds where this one failed. It is only taken when
//! the outcome's class makes that likely, within a fixed number of attempts, after a delay with
//! full jitter (`rand(0, min(cap, base * 2^n))`, from "Exponential Backoff And Jitter", AWS
//! Architecture Blog: the jitter spreads the retries of many callers that failed together, which
//! is exactly the IL-0248 situation), never past the request's deadline, and never against what
//! the upstream asked (`x-should-retry: false`, a `Retry-After` longer than the time left).
//!
//! Capacity failures and transient ones back off differently: a backend that is full needs time
//! for its queue to drain, so throttling uses a longer base and cap. And a capacity failure is
//! never retried on the backend that reported it; a transient one prefers another backend too.
//!
//! A backend refusing the gateway's own credential (`UpstreamAuth`: 401, 403) is retried at once
//! and only elsewhere, like a connection that could not be made: waiting fixes no credential,
//! and another backend holds another one. Its `x-should-retry` and `Retry-After` speak for the
//! credential it refused, so they do not hold the retry back.
//!
//! The shared retry budget (`budget`) is checked by the caller after this decides "retry": this
//! module knows one request, the budget knows all of them.

use std::time::Duration;

use rand::Rng;

use crate::classify::{Class, Pushback};

/// The hard cap on attempts per request, whatever the configuration says.
pub const MAX_ATTEMPTS_CAP: u32 = 5;

/// Exponential backoff with full jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
}

impl Backoff {
    /// The ceiling of the `n`-th retry's delay (n = 0 for the first retry): `min(cap, base * 2^n)`.
    pub fn ceiling(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The delay before the `n`-th retry: uniform in `[0, ceiling(n)]`.
    pub fn delay(&self, n: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(n);
        if ceiling.is_zero() {
            return Duration::ZERO;
        }
        Duration::from_nanos(rng.random_range(0..=ceiling.as_nanos().min(u64::MAX as u128) as u64))
    }
}

/// Retry settings of one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per request, the first one included (1 = never retry). At most `MAX_ATTEMPTS_CAP`.
    pub max_attempts: u32,
    /// For transient failures and timeouts.
    pub transient: Backoff,
    /// For capacity failures (throttling).
    pub capacity: Backoff,
    /// Whether the backend's `Retry-After`, `retry-after-ms` and `x-should-retry` are heeded
    /// (always, but in the naive policy of replays).
    pub honour_pushback: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            transient: Backoff {
                base: Duration::from_millis(50),
                cap: Duration::from_secs(2),
            },
            capacity: Backoff {
                base: Duration::from_millis(250),
                cap: Duration::from_secs(5),
            },
            honour_pushback: true,
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Try again after `after`. `same_backend_ok` is false when the next attempt must go to a
    /// different backend (always for capacity and upstream credential failures).
    Retry {
        after: Duration,
        same_backend_ok: bool,
    },
    /// Do not retry; the last outcome stands.
    Stop(Stop),
}

/// Why a request is not retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The outcome is final: a success or a client error.
    Final,
    /// The class is not retryable, or the upstream said `x-should-retry: false`.
    NotRetryable,
    /// `max_attempts` reached.
    AttemptsExhausted,
    /// The next attempt could not start before the deadline.
    Deadline,
}

impl RetryPolicy {
    /// The retries of a gateway without protections, for replays that show what they prevent
    /// (the IL-0248 layers): `max_attempts` attempts at once, no backoff, and no heed to what
    /// the backend says about retrying.
    pub fn naive(max_attempts: u32) -> Self {
        let none = Backoff {
            base: Duration::ZERO,
            cap: Duration::ZERO,
        };
        RetryPolicy {
            max_attempts,
            transient: none,
            capacity: none,
            honour_pushback: false,
        }
    }

    /// The policy with `max_attempts` held to `[1, MAX_ATTEMPTS_CAP]`.
    pub fn clamped(mut self) -> Self {
        self.max_attempts = self.max_attempts.clamp(1, MAX_ATTEMPTS_CAP);
        self
    }

    /// Decides after attempt number `attempts` (1 for the first) ended in `class` with the
    /// upstream's `pushback`, with `time_left` until the request's deadline.
    pub fn decide(
        &self,
        class: Class,
        pushback: Pushback,
        attempts: u32,
        time_left: Duration,
        rng: &mut impl Rng,
    ) -> Decision {
        let pushback = if self.honour_pushback {
            pushback
        } else {
            Pushback::default()
        };
        let backoff = match class {
            Class::Success | Class::ClientError => return Decision::Stop(Stop::Final),
            Class::ServerError if pushback.should_retry != Some(true) => {
                return Decision::Stop(Stop::NotRetryable)
            }
            Class::UpstreamAuth => None,
            Class::Capacity => Some(&self.capacity),
            Class::Transient | Class::Timeout | Class::ServerError => Some(&self.transient),
        };
        if backoff.is_some() && pushback.should_retry == Some(false) {
            return Decision::Stop(Stop::NotRetryable);
        }
        if attempts >= self.max_attempts.clamp(1, MAX_ATTEMPTS_CAP) {
            return Decision::Stop(Stop::AttemptsExhausted);
        }
        let mut after =
            backoff.map_or(Duration::ZERO, |b| b.delay(attempts.saturating_sub(1), rng));
        let same_backend_ok = !matches!(class, Class::Capacity | Class::UpstreamAuth);
        // A capacity or credential failure moves to another backend, so the backend's
        // Retry-After is honoured by skipping it (the caller's job), not by waiting. Any other
        // retry may land on the same backend and waits at least as long as it asked.
        if same_backend_ok {
            if let Some(wait) = pushback.retry_after {
                after = after.max(wait);
            }
        }
        if after >= time_left {
            return Decision::Stop(Stop::Deadline);
        }
        Decision::Retry {
            after,
            same_backend_ok,
        }
    }
}

#[cfg(test)]
mod tests;
