//! What every scenario's checked plan is made of: the gateway modes compared, the load a
//! client offers, and the checks of the flags they share.
//!
//! Each scenario checks its own flags into its own plan (`scenarios/*/args.rs`); these are the
//! pieces those plans have in common, here so that scenarios share them without importing
//! each other or the module that lists them.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

/// The gateway configurations a replay compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Mode {
    /// spillway's defaults: the protections the scenario is about.
    Protected,
    /// The same gateway with those protections turned off, as a gateway without them would be.
    Naive,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Protected => "protected",
            Mode::Naive => "naive",
        })
    }
}

/// How a client behaves.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct LoadPlan {
    pub(crate) rate: f64,
    pub(crate) max_outstanding: usize,
    pub(crate) client_retries: u32,
    /// Whether a 429 is resent at once too (a caller that ignores rate limits).
    pub(crate) resend_429: bool,
    /// A phase in which requests are offered at another rate: (phase, rate).
    #[serde(skip)]
    pub(crate) surge: Option<(usize, f64)>,
    #[serde(rename = "attempt_timeout_ms", serialize_with = "as_millis")]
    pub(crate) attempt_timeout: Duration,
}

/// Bounds of a phase's length, which keep a replay a bounded experiment on a small machine.
const MIN_PHASE: Duration = Duration::from_millis(100);
const MAX_PHASE: Duration = Duration::from_secs(3600);

/// The modes `--protected` / `--naive` select: one of them, or both (protected first).
pub(crate) fn modes(protected: bool, naive: bool) -> Vec<Mode> {
    match (protected, naive) {
        (true, false) => vec![Mode::Protected],
        (false, true) => vec![Mode::Naive],
        _ => vec![Mode::Protected, Mode::Naive],
    }
}

/// Adds a problem for each phase length outside 100 ms to 1 h, named by its flag.
pub(crate) fn check_phases(flags: &[&str], lengths: &[Duration], problems: &mut Vec<String>) {
    for (flag, d) in flags.iter().zip(lengths) {
        if !(MIN_PHASE..=MAX_PHASE).contains(d) {
            problems.push(format!(
                "{flag} must be from {} to {}, got {}",
                humantime::format_duration(MIN_PHASE),
                humantime::format_duration(MAX_PHASE),
                humantime::format_duration(*d)
            ));
        }
    }
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u128(d.as_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_modes_unless_one_is_asked_for_protected_first() {
        assert_eq!(modes(false, false), [Mode::Protected, Mode::Naive]);
        assert_eq!(modes(true, false), [Mode::Protected]);
        assert_eq!(modes(false, true), [Mode::Naive]);
    }

    #[test]
    fn a_phase_out_of_bounds_is_named_by_its_flag() {
        let mut problems = Vec::new();
        let lengths = [Duration::from_millis(99), Duration::from_secs(1)];
        check_phases(&["--a", "--b"], &lengths, &mut problems);
        assert_eq!(problems, ["--a must be from 100ms to 1h, got 99ms"]);
    }
}
