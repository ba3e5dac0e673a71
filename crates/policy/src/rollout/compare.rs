//! The comparison of the new version's outcomes with the old version's, class by class, and the
//! evidence it leaves when a class is in significant excess.
//!
//! A count class (each 4xx status, capacity, other 5xx, timeouts, broken streams) is compared with
//! the exact conditional test for two rates with exposures (see `binomial::rate_excess_p`): the
//! new version's `x_new` events in `n_new` requests against the old one's `x_old` in `n_old`.
//!
//! Slow first tokens are compared the same way, on counts above a threshold: the old version's
//! `ttft_quantile` (p95 by default) cuts its TTFT histogram, and both versions' requests above
//! that bucket are counted. Why a two-sample test and not the one-sample test of the new
//! version's count against the share `1 - q` that the quantile implies: the quantile is itself an
//! estimate from the old version's requests. At the first step the old version has 99 times the
//! requests and the two tests agree; at 50 % it has as many as the new one, the threshold is as
//! noisy as the count above it, and a one-sample test that ignored that noise would find a
//! "significant" excess far more often than `alpha` says: simulated with 400 requests on each
//! side and identical versions, it did so at 20 times `alpha` (before the ratio rule), where the
//! two-sample test did at 0.7 times. Counting the old version's requests above the same
//! threshold and comparing the two counts carries that noise. The old version must have at least
//! `min_excess_events / (1 - q)` TTFTs (100 by default), so that the threshold is a quantile
//! with that many requests beyond it, not its slowest request.
//!
//! A class is in significant excess when the p-value is below `alpha`, the new version shows at
//! least `min_excess_events` of it, and its rate is at least `min_ratio` times the old one's.
//! A 4xx status the old version never returned has an old rate of 0, which any rate is a
//! multiple of: "4xx the old version did not return" needs no rule of its own.

use std::fmt;
use std::time::Duration;

use super::config::RolloutConfig;
use super::tally::{ttft_bucket_edge, Signal, Tally};
use crate::binomial::rate_excess_p;

/// The counts a comparison was made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Counts {
    pub new_events: u64,
    pub new_requests: u64,
    pub old_events: u64,
    pub old_requests: u64,
}

/// Why a rollout halted: the class in excess and the numbers that showed it.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Evidence {
    pub signal: Signal,
    /// One-sided p-value of the new version's rate being no higher than the old one's.
    pub p_value: f64,
    pub new_rate: f64,
    pub old_rate: f64,
    /// For TTFT, the requests are those that reported one, and the events those above
    /// `ttft_threshold`.
    pub counts: Counts,
    /// For [`Signal::SlowFirstToken`], the old version's quantile the first tokens were compared
    /// with (to its histogram bucket's upper edge).
    pub ttft_threshold: Option<Duration>,
}

impl fmt::Display for Evidence {
    /// One line for the log: `client_error 400: 2.1 % of the new version's requests against
    /// 0.0 % of the old version's (6 of 290 against 0 of 28710), p = 1.2e-12`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        f.write_str(self.signal.as_str())?;
        if let Some(status) = self.signal.status() {
            write!(f, " {status}")?;
        }
        if let Some(threshold) = self.ttft_threshold {
            write!(f, " (above {} ms)", threshold.as_millis())?;
        }
        write!(
            f,
            ": {:.1} % of the new version's requests against {:.1} % of the old version's \
             ({} of {} against {} of {}), p = {:.1e}",
            self.new_rate * 100.0,
            self.old_rate * 100.0,
            c.new_events,
            c.new_requests,
            c.old_events,
            c.old_requests,
            self.p_value,
        )
    }
}

/// The class in the most significant excess on the new version, if any is.
///
/// `same_window` says whether `old` was counted over the same time as `new`. When it was not
/// (the last step, compared with the old version's tally of the step before), first-token times
/// are not compared: they move with the load of the moment, which two windows at different times
/// do not share, so a busier minute would halt a healthy rollout. Error rates are compared still.
pub(crate) fn most_significant(
    config: &RolloutConfig,
    new: &Tally,
    old: &Tally,
    same_window: bool,
) -> Option<Evidence> {
    let mut found: Option<Evidence> = None;
    let mut consider = |evidence: Option<Evidence>| {
        if let Some(e) = evidence {
            if found.as_ref().is_none_or(|best| e.p_value < best.p_value) {
                found = Some(e);
            }
        }
    };
    let counted = |signal: Signal| {
        let events = |t: &Tally| t.count(signal).unwrap_or(0);
        let counts = Counts {
            new_events: events(new),
            new_requests: new.requests(),
            old_events: events(old),
            old_requests: old.requests(),
        };
        judge(config, signal, counts, None)
    };
    for (status, _) in new.client_errors() {
        consider(counted(Signal::ClientError(status)));
    }
    for signal in [
        Signal::Capacity,
        Signal::ServerError,
        Signal::Timeout,
        Signal::BrokenStream,
    ] {
        consider(counted(signal));
    }
    if same_window {
        consider(slow_first_tokens(config, new, old));
    }
    found
}

/// The slowness comparison: both versions' requests above the old version's TTFT quantile.
fn slow_first_tokens(config: &RolloutConfig, new: &Tally, old: &Tally) -> Option<Evidence> {
    let q = config.ttft_quantile;
    let needed = (config.min_excess_events as f64 / (1.0 - q)).ceil() as u64;
    if old.ttft_requests() < needed {
        return None;
    }
    let bucket = old.ttft_quantile_bucket(q)?;
    let counts = Counts {
        new_events: new.ttft_above(bucket),
        new_requests: new.ttft_requests(),
        old_events: old.ttft_above(bucket),
        old_requests: old.ttft_requests(),
    };
    judge(
        config,
        Signal::SlowFirstToken,
        counts,
        Some(ttft_bucket_edge(bucket)),
    )
}

/// The evidence of an excess, when the counts show a significant one.
fn judge(
    config: &RolloutConfig,
    signal: Signal,
    c: Counts,
    ttft_threshold: Option<Duration>,
) -> Option<Evidence> {
    if c.new_requests == 0 || c.old_requests == 0 || c.new_events < config.min_excess_events {
        return None;
    }
    let new_rate = c.new_events as f64 / c.new_requests as f64;
    let old_rate = c.old_events as f64 / c.old_requests as f64;
    if new_rate < config.min_ratio * old_rate {
        return None;
    }
    let p_value = rate_excess_p(c.new_events, c.new_requests, c.old_events, c.old_requests);
    (p_value < config.alpha).then_some(Evidence {
        signal,
        p_value,
        new_rate,
        old_rate,
        counts: c,
        ttft_threshold,
    })
}
