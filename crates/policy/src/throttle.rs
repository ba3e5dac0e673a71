//! Adaptive throttling of a model's pool: refuse locally, in proportion to how often its
//! backends have been failing, so callers' resends cannot multiply the load on failing backends.
//!
//! Why a budget on retries is not enough: spillway's own retries are bounded by the retry budget,
//! but a caller that resends every 5xx at once (IL-0248's layers did, up to 48 times) turns each
//! failure into a new request, and each new request is a first attempt the budget lets through.
//! With every backend failing, the backends then receive 49 attempts per logical request. The
//! cure is the adaptive throttling of the Google SRE book ("Handling Overload"): per pool and over
//! a sliding window, the gateway counts the attempts it sent (`requests`) and those the backends
//! accepted (`accepts`: answered with anything but a backend failure), and refuses a new
//! request locally with probability
//!
//! ```text
//! max(0, (requests - K x accepts) / (requests + 1))
//! ```
//!
//! While the backends accept everything, `requests <= K x accepts` and nothing is refused: no
//! effect on healthy traffic, nor while fewer than `1 - 1/K` of the attempts fail. When a share
//! `f` above that fails, a request is let through with probability about `K x (1 - f)`: the load
//! sent falls as the failures rise. When nothing is accepted, a request is let through with
//! probability `1 / (requests + 1)`, so a pool asked for `n` attempts over a window sends about
//! `sqrt(2n)` of them: probes that show when the backends heal, however fast callers resend.
//!
//! What it cannot do, and nothing can: while some attempts still succeed, a caller that resends
//! until it succeeds needs `1 / (1 - f)` attempts per success on average, sent or refused; the
//! throttle makes the refused ones cost the backends nothing.
//!
//! One change from the book: `requests` counts the attempts sent, not the ones refused locally.
//! Counting refusals, as the book's clients do, holds the throttle shut after the backends heal
//! while callers keep resending the refusals (each resend is another request to count, and the
//! few let through cannot raise `accepts` to match): recovery would wait for the callers to give
//! up. Counting what was sent, the first probes that succeed reopen the pool within a fraction of
//! a second, and the failures of the outage leave the window within `window` (default 5 s, in
//! ten buckets, so constant memory). Until they have, the successes must outnumber them `1 / (K -
//! 1)` to one before nothing is refused: about `sqrt(2n)` successes, a few seconds of traffic.

use std::time::{Duration, Instant};

/// Steps the window slides in.
const BUCKETS: usize = 10;

/// Settings of adaptive throttling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThrottleConfig {
    /// How many times what the backends accepted may be sent to them (at least 1).
    pub k: f64,
    /// How far back requests and accepts are counted.
    pub window: Duration,
    /// Nothing is refused while fewer attempts than this were sent in the window: a handful of
    /// failures (one refused connection, a bad minute of a quiet model) is no sample to shed on.
    pub min_requests: u64,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig {
            k: 2.0,
            window: Duration::from_secs(5),
            min_requests: 20,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    step: u64,
    requests: u64,
    accepts: u64,
}

/// Requests and accepts of one pool over a sliding window.
#[derive(Debug, Clone)]
pub struct Throttle {
    config: ThrottleConfig,
    epoch: Instant,
    step: Duration,
    buckets: [Bucket; BUCKETS],
}

impl Throttle {
    /// `k` below 1 is taken as 1 (sending less than is accepted would refuse healthy traffic);
    /// a zero window as 1 ms.
    pub fn new(config: ThrottleConfig, now: Instant) -> Self {
        let config = ThrottleConfig {
            k: if config.k.is_finite() {
                config.k.max(1.0)
            } else {
                1.0
            },
            ..config
        };
        let step = (config.window / BUCKETS as u32).max(Duration::from_millis(1));
        Throttle {
            config,
            epoch: now,
            step,
            buckets: [Bucket::default(); BUCKETS],
        }
    }

    pub fn config(&self) -> &ThrottleConfig {
        &self.config
    }

    fn step_of(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.epoch).as_nanos() / self.step.as_nanos()) as u64
    }

    fn current(&mut self, now: Instant) -> &mut Bucket {
        let step = self.step_of(now);
        let b = &mut self.buckets[(step % BUCKETS as u64) as usize];
        if b.step != step {
            *b = Bucket {
                step,
                ..Bucket::default()
            };
        }
        b
    }

    /// (requests, accepts) in the window ending at `now`.
    pub fn totals(&self, now: Instant) -> (u64, u64) {
        let step = self.step_of(now);
        self.buckets
            .iter()
            .filter(|b| b.step + (BUCKETS as u64) > step && b.step <= step)
            .fold((0, 0), |(q, a), b| (q + b.requests, a + b.accepts))
    }

    /// The probability with which an attempt asked for now is refused locally.
    pub fn refusal_probability(&self, now: Instant) -> f64 {
        let (requests, accepts) = self.totals(now);
        if requests < self.config.min_requests {
            return 0.0;
        }
        let excess = requests as f64 - self.config.k * accepts as f64;
        (excess / (requests as f64 + 1.0)).clamp(0.0, 1.0)
    }

    /// Whether a new request may be sent to a backend now: `unit` is a random number in
    /// `[0, 1)`, and the request is refused when it is below the refusal probability.
    pub fn admit(&self, now: Instant, unit: f64) -> bool {
        unit >= self.refusal_probability(now)
    }

    /// An attempt was sent to a backend (a first attempt or a retry).
    pub fn sent(&mut self, now: Instant) {
        self.current(now).requests += 1;
    }

    /// A backend accepted an attempt: it answered with anything but a backend failure.
    pub fn accepted(&mut self, now: Instant) {
        self.current(now).accepts += 1;
    }

    /// Whether the backends have recently refused so much that throttling is in force: callers'
    /// own retries are shed while it is.
    pub fn is_throttling(&self, now: Instant) -> bool {
        self.refusal_probability(now) > 0.0
    }
}

#[cfg(test)]
mod tests;
