//! The shared retry budget: retries may add at most a fixed share to the load.
//!
//! Per-request attempt caps do not stop a storm: when every request fails, three attempts each
//! still triple the load on a backend that is already failing. A budget bounds retries by what
//! the whole gateway does, in the style of Finagle's `RetryBudget`, Envoy's retry budgets and
//! tower's `TpsBudget`:
//!
//! - every request deposits one unit; a retry withdraws `1 / ratio` units' worth, so over the
//!   window retries stay under `ratio` (default 10 %) of requests, plus
//! - a small floor of `min_per_sec` retries per second, so a gateway with little traffic can
//!   still retry a lone failure, and
//! - at most `max_retrying_share` of the requests in flight may be retrying at once, so a burst
//!   of failures cannot turn most of the in-flight work into retries even while the rate budget
//!   has room; but always at least `min_retrying` (default 8).
//!
//! Why the `min_retrying` floor: a backend that crashes fails every request it holds at the same
//! moment. With a share of 0.2 and five requests in flight, the share alone let one of them
//! retry and refused the other four, although each could have been served elsewhere and the
//! rate budget had room for all. A crash is exactly the failure retries are for, and its burst
//! is as large as the backend's slots, which is small on an inference engine, so a small fixed
//! number may always be retrying at once. The floor only lifts the concurrency cap: every retry
//! is still withdrawn from the rate budget first.
//!
//! Hence the guarantee (G1), which neither concurrency rule weakens: over any window, upstream
//! attempts <= requests x (1 + ratio) + min_per_sec x window. The window slides in `BUCKETS`
//! steps; time comes from the caller.

use std::time::{Duration, Instant};

use crate::window::PairWindow;

/// Settings of a retry budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetConfig {
    /// Retries allowed per request over the window (0.1 = 10 %).
    pub ratio: f64,
    /// Retries allowed per second regardless of traffic.
    pub min_per_sec: f64,
    /// How far back requests and retries are counted.
    pub window: Duration,
    /// Share of in-flight requests that may be retrying at once...
    pub max_retrying_share: f64,
    /// ...but at least this many, whatever the share allows (0 is taken as 1: a lone failure
    /// may always retry while the rate allows).
    pub min_retrying: u32,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            ratio: 0.1,
            min_per_sec: 1.0,
            window: Duration::from_secs(10),
            max_retrying_share: 0.2,
            min_retrying: 8,
        }
    }
}

impl BudgetConfig {
    /// A budget that never refuses, for replays of a gateway without protections.
    pub fn unlimited() -> Self {
        BudgetConfig {
            // Finite, so that `ratio x 0 requests` is 0 rather than NaN; the floor term alone is
            // then infinite.
            ratio: f64::MAX,
            min_per_sec: f64::MAX,
            window: Duration::from_secs(1),
            max_retrying_share: f64::MAX,
            min_retrying: u32::MAX,
        }
    }
}

/// Counts of requests and retries over a sliding window.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    config: BudgetConfig,
    /// Requests (0) and retries (1).
    window: PairWindow,
}

/// Why a retry was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Retries over the window already reach the ratio plus the floor.
    RateSpent,
    /// Too many of the requests in flight are already retrying.
    TooManyRetrying,
}

impl Refusal {
    /// A short stable name, for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::RateSpent => "rate_spent",
            Refusal::TooManyRetrying => "too_many_retrying",
        }
    }

    /// One line saying why, for the caller and for operators.
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::RateSpent => {
                "retry budget spent: recent retries already reach their share of traffic"
            }
            Refusal::TooManyRetrying => "too many requests are already being retried at once",
        }
    }
}

impl RetryBudget {
    pub fn new(config: BudgetConfig, now: Instant) -> Self {
        RetryBudget {
            window: PairWindow::new(config.window, now),
            config,
        }
    }

    pub fn config(&self) -> &BudgetConfig {
        &self.config
    }

    /// (requests, retries) in the window ending at `now`.
    pub fn totals(&self, now: Instant) -> (u64, u64) {
        self.window.totals(now)
    }

    /// Retries the window may hold: `ratio x requests + min_per_sec x window`.
    fn allowance(&self, requests: u64) -> f64 {
        self.config.ratio.max(0.0) * requests as f64
            + self.config.min_per_sec.max(0.0) * self.config.window.as_secs_f64()
    }

    /// A new request arrived.
    pub fn deposit(&mut self, now: Instant) {
        self.window.add(now, 0);
    }

    /// Takes one retry from the budget if it has room. `in_flight` is the number of requests in
    /// flight and `retrying` how many of them are currently on a retry.
    ///
    /// Refused with [`Refusal::RateSpent`] when the window's retries already reach
    /// `ratio x requests + min_per_sec x window`, else with [`Refusal::TooManyRetrying`] when
    /// `retrying >= max(floor(max_retrying_share x in_flight), min_retrying)`.
    pub fn try_withdraw(
        &mut self,
        now: Instant,
        in_flight: u64,
        retrying: u64,
    ) -> Result<(), Refusal> {
        let (requests, retries) = self.totals(now);
        if (retries + 1) as f64 > self.allowance(requests) {
            return Err(Refusal::RateSpent);
        }
        let by_share = (self.config.max_retrying_share.max(0.0) * in_flight as f64).floor();
        let floor = f64::from(self.config.min_retrying.max(1));
        if retrying as f64 >= by_share.max(floor) {
            return Err(Refusal::TooManyRetrying);
        }
        self.window.add(now, 1);
        Ok(())
    }

    /// Whether a retry would be allowed now by the rate alone (for shedding client retries
    /// while the budget is spent).
    pub fn is_spent(&self, now: Instant) -> bool {
        let (requests, retries) = self.totals(now);
        (retries + 1) as f64 > self.allowance(requests)
    }
}

#[cfg(test)]
mod tests;
