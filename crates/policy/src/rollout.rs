//! A staged rollout of a new version of a model's backends against the old version: the new
//! version takes a growing share of traffic, step by step, and loses all of it at once when it
//! answers measurably worse than the old version over the same window.
//!
//! Why (IL-0235): a model update turned on a feature the deployed engine did not support, and
//! requests failed with 400 and 429 in seven regions. Monitoring watched only client-side
//! errors, so the service's own 4xx went unseen for an hour, and the rollback took 15 hours. So
//! here every step compares the versions class by class, 4xx status by status (a 400 the old
//! version never returns is a signal of its own, not noise among the clients' mistakes),
//! capacity answers (429, 503), other 5xx, timeouts, broken streams and slow first tokens; a
//! significant excess halts the rollout without waiting for anyone; and the early steps, where a
//! halt is cheap, must see enough requests to show one (`min_step_requests`).
//!
//! How a step is judged: while it runs, both versions' outcomes are counted in a [`Tally`] each,
//! from the moment the step began, so that both sides cover the same window and a change of the
//! traffic's mix over the day affects both alike. At each [`Rollout::evaluate`] every class is
//! compared with the exact conditional binomial test for two rates: given `k` events of the
//! class on both sides, the new version's `x_new` is `Binomial(k, n_new / (n_new + n_old))`
//! under equal rates, and the p-value is `P(X >= x_new)`. A class is in excess when `p < alpha`,
//! the new version shows at least `min_excess_events` of it, and its rate is at least
//! `min_ratio` times the old one's. Slow first tokens are counted above the old version's TTFT
//! quantile on both sides and compared the same way (see [`RolloutConfig`] for the defaults and
//! the multiplicity behind `alpha`). An excess halts at any time, however young the step;
//! promotion needs both `min_step_duration` and `min_step_requests` answered by the new
//! version. On promotion both tallies start again from zero.
//!
//! The last step (100 %) sends the old version nothing, so it has no old window to compare with.
//! There it compares with the old version's tally of the step before, kept at promotion: two
//! windows side by side in time rather than the same one, which is the best comparison left for
//! error rates; first-token times are not compared there, as they move with the load of the
//! moment, which two windows at different times do not share.
//! Why not a one-sample test against a floor rate, as for a side with no requests: any class the
//! old version also shows (the clients' own 400s, say 1 %) would exceed any small floor and halt
//! a healthy rollout; what a rollout must judge is the difference the new version makes, and
//! without an old version there is none to measure. So where no old window exists at all (a
//! rollout resumed at its last step, see below), the step refuses to judge: it only holds its
//! time and requests.
//!
//! A halt is final until [`Rollout::restart`]: the status keeps the evidence, and the new
//! version's share is 0 at once. [`Rollout::abort`] does the same by hand, with a reason.
//!
//! Which request goes to the new version is [`takes_new`]'s decision, from a uniform 64-bit draw
//! the caller makes (random, or a hash of a session so that a conversation stays on one
//! version): exact to 2^-64 for any share in basis points, and monotone in the share, so a draw
//! sent to the new version at 1 % is still sent there at 5 %.
//!
//! Persisting: [`RolloutState`] (the status, with its step and reason) is what the gateway keeps
//! across restarts; [`Rollout::resume`] starts from it. A resumed step starts its hold time and
//! its window afresh, because the time it held before the restart cannot be verified: the
//! counts that were to show the step healthy were lost with the process, and promoting on time
//! alone would skip the check the step exists for.

use std::time::Instant;

mod compare;
mod config;
mod tally;

pub use compare::{Counts, Evidence};
pub use config::{RolloutConfig, RolloutConfigError};
pub use tally::{Ending, Observation, Side, Signal, Tally};

use compare::most_significant;
use config::FULL_SHARE;

/// Where a rollout is.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(tag = "status", rename_all = "snake_case")
)]
pub enum Status {
    /// At step `step` (an index into the config's steps).
    Running { step: usize },
    /// Halted at step `step` by a significant excess; the new version takes no traffic.
    Halted { step: usize, reason: Evidence },
    /// Stopped by hand at step `step`; the new version takes no traffic.
    Aborted { step: usize, reason: String },
    /// The new version holds all traffic, and held it for a whole step.
    Completed,
}

/// What [`Rollout::evaluate`] (or [`Rollout::promote`]) decided, and has already applied.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Nothing changed: the step needs more time or requests, shows no excess, or the rollout
    /// is not running.
    Hold,
    /// The rollout moved to step `to_step`, with fresh windows.
    Promote { to_step: usize },
    /// The last step held: the rollout is complete.
    Complete,
    /// A significant excess: the new version's share is now 0.
    Halt(Evidence),
}

/// What a gateway keeps of a rollout across restarts.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RolloutState {
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub status: Status,
    /// The share of the status's step, in basis points, so that a rollout resumed under changed
    /// steps goes to the highest step not above it, never to more traffic than it had.
    pub step_share: u32,
}

/// A staged rollout of one model's new backends.
#[derive(Debug, Clone)]
pub struct Rollout {
    config: RolloutConfig,
    status: Status,
    /// When the current step (or the current status) began.
    since: Instant,
    old: Tally,
    new: Tally,
    /// The old version's tally of the last step it served in, for the last step.
    reference: Option<Tally>,
}

impl Rollout {
    /// A rollout at its first step from `now`.
    pub fn try_new(config: RolloutConfig, now: Instant) -> Result<Self, RolloutConfigError> {
        config.check()?;
        Ok(Rollout {
            config,
            status: Status::Running { step: 0 },
            since: now,
            old: Tally::default(),
            new: Tally::default(),
            reference: None,
        })
    }

    /// A rollout as `state` left it, with its step's hold time and window started at `now` (see
    /// the module documentation). Under changed steps, the step is the highest whose share is
    /// not above the saved one (the first step if none is).
    pub fn resume(
        config: RolloutConfig,
        state: &RolloutState,
        now: Instant,
    ) -> Result<Self, RolloutConfigError> {
        let mut rollout = Rollout::try_new(config, now)?;
        let step = (0..rollout.config.steps.len())
            .rev()
            .find(|&i| rollout.config.share_of(i) <= state.step_share)
            .unwrap_or(0);
        rollout.status = match &state.status {
            Status::Running { .. } => Status::Running { step },
            Status::Halted { reason, .. } => Status::Halted {
                step,
                reason: reason.clone(),
            },
            Status::Aborted { reason, .. } => Status::Aborted {
                step,
                reason: reason.clone(),
            },
            Status::Completed => Status::Completed,
        };
        Ok(rollout)
    }

    pub fn config(&self) -> &RolloutConfig {
        &self.config
    }

    pub fn status(&self) -> &Status {
        &self.status
    }

    /// When the current step or status began.
    pub fn since(&self) -> Instant {
        self.since
    }

    /// What to keep across restarts.
    pub fn state(&self) -> RolloutState {
        let step_share = match self.status {
            Status::Running { step }
            | Status::Halted { step, .. }
            | Status::Aborted { step, .. } => self.config.share_of(step),
            Status::Completed => FULL_SHARE,
        };
        RolloutState {
            status: self.status.clone(),
            step_share,
        }
    }

    /// The new version's share of traffic now, in basis points (10_000 is all of it): the
    /// step's while running, all once complete, none once halted or aborted.
    pub fn share(&self) -> u32 {
        match self.status {
            Status::Running { step } => self.config.share_of(step),
            Status::Completed => FULL_SHARE,
            Status::Halted { .. } | Status::Aborted { .. } => 0,
        }
    }

    /// One side's outcomes in the current step.
    pub fn tally(&self, side: Side) -> &Tally {
        match side {
            Side::Old => &self.old,
            Side::New => &self.new,
        }
    }

    /// Counts one request's outcome. Outside a running step it is ignored: a halted rollout
    /// keeps the window that halted it.
    pub fn record(&mut self, side: Side, observation: Observation) {
        if matches!(self.status, Status::Running { .. }) {
            match side {
                Side::Old => self.old.record(observation),
                Side::New => self.new.record(observation),
            }
        }
    }

    /// Judges the step at `now`, and applies the verdict: a significant excess halts (whatever
    /// the step's age), else a step that has held `min_step_duration` with `min_step_requests`
    /// answered by the new version is promoted, or completes the rollout if it is the last.
    pub fn evaluate(&mut self, now: Instant) -> Verdict {
        let Status::Running { step } = self.status else {
            return Verdict::Hold;
        };
        let same_window = self.share() < FULL_SHARE;
        let old = if same_window {
            Some(&self.old)
        } else {
            self.reference.as_ref()
        };
        let excess =
            old.and_then(|old| most_significant(&self.config, &self.new, old, same_window));
        if let Some(evidence) = excess {
            self.status = Status::Halted {
                step,
                reason: evidence.clone(),
            };
            self.since = now;
            return Verdict::Halt(evidence);
        }
        let held = now.saturating_duration_since(self.since) >= self.config.min_step_duration;
        if held && self.new.requests() >= self.config.min_step_requests {
            return self.advance(step, now);
        }
        Verdict::Hold
    }

    /// Promotes the running step by hand, whatever its time, requests and counts; `Hold` when
    /// the rollout is not running (a halt stands until [`Rollout::restart`]).
    pub fn promote(&mut self, now: Instant) -> Verdict {
        match self.status {
            Status::Running { step } => self.advance(step, now),
            _ => Verdict::Hold,
        }
    }

    /// Stops a running or completed rollout by hand: the new version's share goes to 0. Returns
    /// false, changing nothing, for a rollout already halted (which keeps its evidence) or
    /// aborted.
    pub fn abort(&mut self, now: Instant, reason: impl Into<String>) -> bool {
        let step = match self.status {
            Status::Running { step } => step,
            Status::Completed => self.config.steps.len() - 1,
            Status::Halted { .. } | Status::Aborted { .. } => return false,
        };
        self.status = Status::Aborted {
            step,
            reason: reason.into(),
        };
        self.since = now;
        true
    }

    /// Starts the rollout over at its first step, with fresh windows.
    pub fn restart(&mut self, now: Instant) {
        self.status = Status::Running { step: 0 };
        self.since = now;
        self.old = Tally::default();
        self.new = Tally::default();
        self.reference = None;
    }

    fn advance(&mut self, step: usize, now: Instant) -> Verdict {
        self.since = now;
        if step + 1 == self.config.steps.len() {
            self.status = Status::Completed;
            return Verdict::Complete;
        }
        let old = std::mem::take(&mut self.old);
        if old.requests() > 0 {
            self.reference = Some(old);
        }
        self.new = Tally::default();
        self.status = Status::Running { step: step + 1 };
        Verdict::Promote { to_step: step + 1 }
    }
}

/// Whether a request with the uniformly distributed `draw` goes to the new version at `share`
/// basis points: exactly the draws below `share / 10_000` of the 64-bit range, so the share
/// taken is exact to 2^-64, 0 takes none, 10_000 (or more) takes all, and a draw taken at one
/// share is taken at every larger one.
pub fn takes_new(share: u32, draw: u64) -> bool {
    u128::from(draw) * u128::from(FULL_SHARE) < u128::from(share) << 64
}

#[cfg(test)]
mod tests;
