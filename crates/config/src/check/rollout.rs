//! `[models.rollout]`: a new version of a model's backends, and how it takes over; and
//! `[anomaly]`: when a backend's share of 4xx answers counts as a jump.
//!
//! Defaults come from `spillway_policy::RolloutConfig::default()` and `AnomalyConfig::default()`,
//! written once there, with the reasoning for each. A problem names the key it is about, so
//! `check-config` can point at it.

use spillway_policy::{AnomalyConfig, AnomalyConfigError, RolloutConfig, RolloutConfigError};

use super::Problems;
use crate::raw::{RawAnomaly, RawBackend, RawRollout};
use crate::{RolloutMode, RolloutPlan};

/// The plan of a model's rollout, and its new backends (checked by the caller with the model's).
pub(super) fn check_rollout(
    raw: RawRollout,
    model_at: &str,
    p: &mut Problems,
) -> (RolloutPlan, Vec<RawBackend>) {
    let at = format!("{model_at}.rollout");
    let mode = match raw.mode.as_deref().unwrap_or("staged") {
        "staged" => RolloutMode::Staged,
        "replace" => RolloutMode::Replace,
        other => {
            p.add(
                format!("{at}.mode"),
                format!("{other:?} is not a rollout mode: \"staged\" or \"replace\""),
            );
            RolloutMode::Staged
        }
    };
    let defaults = RolloutConfig::default();
    let policy = RolloutConfig {
        steps: raw.steps.unwrap_or(defaults.steps),
        min_step_duration: raw.min_step_duration.unwrap_or(defaults.min_step_duration),
        min_step_requests: raw.min_step_requests.unwrap_or(defaults.min_step_requests),
        alpha: raw.alpha.unwrap_or(defaults.alpha),
        min_excess_events: raw.min_excess_events.unwrap_or(defaults.min_excess_events),
        min_ratio: raw.min_ratio.unwrap_or(defaults.min_ratio),
        ttft_quantile: raw.ttft_quantile.unwrap_or(defaults.ttft_quantile),
    };
    if let Err(e) = policy.check() {
        let key = match e {
            RolloutConfigError::NoSteps
            | RolloutConfigError::StepOutOfRange
            | RolloutConfigError::StepTooFine
            | RolloutConfigError::StepsNotIncreasing
            | RolloutConfigError::LastStepNotFull => "steps",
            RolloutConfigError::ZeroStepRequests => "min_step_requests",
            RolloutConfigError::AlphaOutOfRange => "alpha",
            RolloutConfigError::ZeroExcessEvents => "min_excess_events",
            RolloutConfigError::RatioBelowOne => "min_ratio",
            RolloutConfigError::QuantileOutOfRange => "ttft_quantile",
        };
        p.add(format!("{at}.{key}"), e.to_string());
    }
    if raw.backends.is_empty() {
        p.add(
            format!("{at}.backends"),
            "no backends: a rollout brings at least one new backend",
        );
    }
    (RolloutPlan { mode, policy }, raw.backends)
}

pub(super) fn check_anomaly(raw: RawAnomaly, p: &mut Problems) -> AnomalyConfig {
    let d = AnomalyConfig::default();
    let config = AnomalyConfig {
        window: raw.window.unwrap_or(d.window),
        baseline: raw.baseline.unwrap_or(d.baseline),
        alpha: raw.alpha.unwrap_or(d.alpha),
        min_events: raw.min_events.unwrap_or(d.min_events),
        min_ratio: raw.min_ratio.unwrap_or(d.min_ratio),
        floor: raw.floor.unwrap_or(d.floor),
    };
    match config.check() {
        Ok(()) => config,
        Err(e) => {
            let key = match e {
                AnomalyConfigError::WindowTooShort => "window",
                AnomalyConfigError::BaselineTooShort => "baseline",
                AnomalyConfigError::AlphaOutOfRange => "alpha",
                AnomalyConfigError::ZeroEvents => "min_events",
                AnomalyConfigError::RatioBelowOne => "min_ratio",
                AnomalyConfigError::FloorOutOfRange => "floor",
            };
            p.add(format!("anomaly.{key}"), e.to_string());
            d
        }
    }
}
