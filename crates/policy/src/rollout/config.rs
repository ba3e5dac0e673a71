//! The settings of a staged rollout, and the check that makes them usable.

use std::fmt;
use std::time::Duration;

/// Settings of a staged rollout. See the module documentation of [`crate::rollout`] for how
/// each is used, and [`RolloutConfig::check`] for what is accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutConfig {
    /// The new version's share of traffic at each step, in percent: strictly increasing, each
    /// in (0, 100] and a whole number of basis points (0.01 %), the last 100.
    pub steps: Vec<f64>,
    /// How long each step holds before it may be promoted.
    pub min_step_duration: Duration,
    /// Requests the new version must have answered in a step before it may be promoted (at
    /// least 1). A step can only catch what its requests can show: a failure confined to the new
    /// version needs about `min_excess_events / share of its requests failing` of them, so 100
    /// catches one in 5 % of requests before the first step ends, and 500 one in 1 %. IL-0235's
    /// lesson is to send enough of them through the early steps, where a halt is cheap.
    pub min_step_requests: u64,
    /// The significance level of each comparison, in (0, 1).
    ///
    /// The multiplicity: every evaluation compares five fixed classes (capacity, other 5xx,
    /// timeouts, broken streams, slow first tokens) and each 4xx status the new version returned
    /// at least `min_excess_events` times, about eight comparisons; a rollout makes them at each
    /// of its steps, and again at every evaluation while a step's counts grow. By Bonferroni's
    /// bound, a false halt at one evaluation is at most as likely as the number of comparisons
    /// times `alpha`; successive evaluations of a step share most of their data, so they add far
    /// less than their number (about a factor of two, evaluated each second). Over a rollout of
    /// two identical versions that makes about 75 x `alpha`: in 4_000 seeded simulations (five
    /// steps, 300 requests a second, a background of 1 % 400s and a few tenths of a percent of
    /// every other class) 7.5 % of rollouts halted falsely at the default 0.001, and 0.9 % at
    /// 0.0001.
    ///
    /// Why the default is 0.0001: a false halt costs a rollout restarted by hand, a missed one an
    /// incident, and a gateway that halts one healthy rollout in thirteen (0.001) teaches its
    /// operators to restart halts without reading them. A failure confined to the new version
    /// (IL-0235's 400s) is caught at the first steps on its `min_excess_events` alone at either
    /// level (five against none at a share of 1 % is p = 1e-10), so the smaller alpha mostly
    /// delays halts on classes the old version shows too, and those at the later steps; 0.001
    /// catches those sooner, for twice to eight times the false halts.
    pub alpha: f64,
    /// Events of a class the new version must show before they can count as an excess (at least
    /// 1): a lone 500 from a new version at a step of 1 % is significant against an old rate of
    /// 0, and says nothing.
    pub min_excess_events: u64,
    /// The new version's rate of a class must also be at least this multiple of the old one's
    /// (at least 1), so that a difference significant only because the counts are huge (0.11 %
    /// against 0.10 % over millions of requests) does not halt.
    pub min_ratio: f64,
    /// The TTFT quantile of the old version above which a first token counts as slow, in
    /// (0, 1).
    pub ttft_quantile: f64,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            steps: vec![1.0, 5.0, 25.0, 50.0, 100.0],
            min_step_duration: Duration::from_secs(60),
            min_step_requests: 100,
            alpha: 0.0001,
            min_excess_events: 5,
            min_ratio: 2.0,
            ttft_quantile: 0.95,
        }
    }
}

/// What [`RolloutConfig::check`] found wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutConfigError {
    NoSteps,
    /// A step outside (0, 100] %.
    StepOutOfRange,
    /// A step finer than a basis point (0.01 %).
    StepTooFine,
    StepsNotIncreasing,
    /// The last step must send all traffic to the new version.
    LastStepNotFull,
    ZeroStepRequests,
    /// `alpha` outside (0, 1).
    AlphaOutOfRange,
    ZeroExcessEvents,
    /// `min_ratio` below 1 or not finite.
    RatioBelowOne,
    /// `ttft_quantile` outside (0, 1).
    QuantileOutOfRange,
}

impl fmt::Display for RolloutConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RolloutConfigError::NoSteps => "a rollout needs at least one step",
            RolloutConfigError::StepOutOfRange => "each step's share must be in (0, 100] %",
            RolloutConfigError::StepTooFine => {
                "each step's share must be a whole number of basis points (0.01 %)"
            }
            RolloutConfigError::StepsNotIncreasing => "the steps' shares must strictly increase",
            RolloutConfigError::LastStepNotFull => "the last step's share must be 100 %",
            RolloutConfigError::ZeroStepRequests => "the requests per step must be at least 1",
            RolloutConfigError::AlphaOutOfRange => "alpha must be in (0, 1)",
            RolloutConfigError::ZeroExcessEvents => "the excess events must be at least 1",
            RolloutConfigError::RatioBelowOne => "the minimum ratio must be a number of at least 1",
            RolloutConfigError::QuantileOutOfRange => "the TTFT quantile must be in (0, 1)",
        })
    }
}

impl std::error::Error for RolloutConfigError {}

/// The whole of traffic, in basis points.
pub(crate) const FULL_SHARE: u32 = 10_000;

impl RolloutConfig {
    /// Whether the settings can run a rollout; the first problem found otherwise.
    pub fn check(&self) -> Result<(), RolloutConfigError> {
        if self.steps.is_empty() {
            return Err(RolloutConfigError::NoSteps);
        }
        let mut previous = 0;
        for &percent in &self.steps {
            if !(percent > 0.0 && percent <= 100.0) {
                return Err(RolloutConfigError::StepOutOfRange);
            }
            let bp = percent * 100.0;
            if (bp - bp.round()).abs() > 1e-6 {
                return Err(RolloutConfigError::StepTooFine);
            }
            let bp = bp.round() as u32;
            if bp <= previous {
                return Err(RolloutConfigError::StepsNotIncreasing);
            }
            previous = bp;
        }
        if previous != FULL_SHARE {
            return Err(RolloutConfigError::LastStepNotFull);
        }
        if self.min_step_requests == 0 {
            return Err(RolloutConfigError::ZeroStepRequests);
        }
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return Err(RolloutConfigError::AlphaOutOfRange);
        }
        if self.min_excess_events == 0 {
            return Err(RolloutConfigError::ZeroExcessEvents);
        }
        if !(self.min_ratio.is_finite() && self.min_ratio >= 1.0) {
            return Err(RolloutConfigError::RatioBelowOne);
        }
        if !(self.ttft_quantile > 0.0 && self.ttft_quantile < 1.0) {
            return Err(RolloutConfigError::QuantileOutOfRange);
        }
        Ok(())
    }

    /// The share of step `step` in basis points, for a checked config.
    pub(crate) fn share_of(&self, step: usize) -> u32 {
        (self.steps[step] * 100.0).round() as u32
    }
}
