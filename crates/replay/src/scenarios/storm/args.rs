//! The flags of `spillway replay retry-storm`, and the checked plan a run goes by.
//!
//! As elsewhere in spillway, what the user typed ([`RetryStormArgs`]) is checked once into what
//! the program uses ([`StormPlan`]); every problem is reported together on one line, so a bad
//! invocation costs one try and never starts a process.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::ReplayError;
use crate::plan::{self, LoadPlan, Mode};

/// The phases of a retry-storm run, in order.
pub(crate) const PHASES: [&str; 4] = ["steady", "fault", "outage", "recovery"];

/// Flags of `spillway replay retry-storm`.
#[derive(Debug, Clone, clap::Args)]
pub struct RetryStormArgs {
    /// Run only the gateway with its protections (default: protected, then naive).
    #[arg(long, conflicts_with = "naive")]
    pub protected: bool,
    /// Run only the naive gateway: every 5xx retried at once, up to 5 attempts, no budget.
    #[arg(long)]
    pub naive: bool,
    /// Length of the healthy phase before the fault, e.g. 10s.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub steady: humantime::Duration,
    /// Length of the phase in which the home region's backends answer HTTP 500.
    #[arg(long, value_name = "DURATION", default_value = "20s")]
    pub fault: humantime::Duration,
    /// Length of the phase, after the fault, in which every backend (both regions) answers
    /// HTTP 500: nothing healthy is left to fail over to.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub outage: humantime::Duration,
    /// Length of the phase after the backends are healthy again.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub recovery: humantime::Duration,
    /// New client requests offered per second, whatever happens to earlier ones.
    #[arg(long, value_name = "PER_SEC", default_value_t = 100.0)]
    pub rate: f64,
    /// Request chains (a request and its retries) in flight at most; a new request that finds
    /// them all taken is dropped and counted, never queued.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_outstanding: usize,
    /// Immediate resends of a request after a 5xx or a connection error (IL-0248: 48).
    #[arg(long, value_name = "N", default_value_t = 48)]
    pub client_retries: u32,
    /// Time allowed for one HTTP attempt, response body included; past it the attempt is
    /// counted as `timeout` and resent like a connection error.
    #[arg(long, value_name = "DURATION", default_value = "5s")]
    pub attempt_timeout: humantime::Duration,
    /// Also write the raw figures to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also draw the run into DIR (created if missing): an SVG timeline per mode (offered
    /// load, upstream attempts, successes, shed, gateway RSS and store queries on one time axis,
    /// the phases marked) and index.html, which shows them side by side with the table and
    /// opens from the disk.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// A checked `retry-storm` invocation.
#[derive(Debug, Clone)]
pub(crate) struct StormPlan {
    pub(crate) modes: Vec<Mode>,
    /// Steady, fault, outage, recovery.
    pub(crate) phases: [Duration; 4],
    pub(crate) load: LoadPlan,
    pub(crate) json: Option<PathBuf>,
    pub(crate) out: Option<PathBuf>,
}

/// Bounds that keep a replay a bounded experiment on a small machine.
const MAX_RATE: f64 = 10_000.0;
const MAX_OUTSTANDING: usize = 10_000;
const MAX_CLIENT_RETRIES: u32 = 1_000;
const MIN_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(10);
const MAX_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(60);

impl RetryStormArgs {
    /// The plan these flags describe, or every problem with them in one error.
    pub(crate) fn check(&self) -> Result<StormPlan, ReplayError> {
        let mut problems = Vec::new();
        if !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= MAX_RATE) {
            problems.push(format!(
                "--rate must be above 0 and at most {MAX_RATE}, got {}",
                self.rate
            ));
        }
        if !(1..=MAX_OUTSTANDING).contains(&self.max_outstanding) {
            problems.push(format!(
                "--max-outstanding must be from 1 to {MAX_OUTSTANDING}, got {}",
                self.max_outstanding
            ));
        }
        if self.client_retries > MAX_CLIENT_RETRIES {
            problems.push(format!(
                "--client-retries must be at most {MAX_CLIENT_RETRIES}, got {}",
                self.client_retries
            ));
        }
        let phases = [self.steady, self.fault, self.outage, self.recovery].map(Duration::from);
        plan::check_phases(
            &["--steady", "--fault", "--outage", "--recovery"],
            &phases,
            &mut problems,
        );
        let attempt_timeout = Duration::from(self.attempt_timeout);
        if !(MIN_ATTEMPT_TIMEOUT..=MAX_ATTEMPT_TIMEOUT).contains(&attempt_timeout) {
            problems.push(format!(
                "--attempt-timeout must be from {} to {}, got {}",
                humantime::format_duration(MIN_ATTEMPT_TIMEOUT),
                humantime::format_duration(MAX_ATTEMPT_TIMEOUT),
                humantime::format_duration(attempt_timeout)
            ));
        }
        if !problems.is_empty() {
            return Err(ReplayError::InvalidArgs(problems.join("; ")));
        }
        Ok(StormPlan {
            modes: plan::modes(self.protected, self.naive),
            phases,
            load: LoadPlan {
                rate: self.rate,
                max_outstanding: self.max_outstanding,
                client_retries: self.client_retries,
                resend_429: false,
                surge: None,
                attempt_timeout,
            },
            json: self.json.clone(),
            out: self.out.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: RetryStormArgs,
    }

    fn parse(args: &[&str]) -> Result<RetryStormArgs, clap::Error> {
        Ok(Cli::try_parse_from(["retry-storm"].iter().chain(args))?.args)
    }

    #[test]
    fn defaults_run_both_modes_with_the_incident_s_figures() {
        let plan = parse(&[]).unwrap().check().unwrap();
        assert_eq!(plan.modes, [Mode::Protected, Mode::Naive]);
        assert_eq!(plan.phases.map(|d| d.as_secs()), [10, 20, 10, 10]);
        assert_eq!(plan.load.rate, 100.0);
        assert_eq!(plan.load.max_outstanding, 256);
        assert_eq!(plan.load.client_retries, 48);
    }

    #[test]
    fn mode_flags_pick_one_mode_and_exclude_each_other() {
        let only = |f: &str| parse(&[f]).unwrap().check().unwrap().modes;
        assert_eq!(only("--naive"), [Mode::Naive]);
        assert_eq!(only("--protected"), [Mode::Protected]);
        assert!(parse(&["--naive", "--protected"]).is_err());
    }

    #[test]
    fn every_bad_value_is_reported_on_one_line() {
        let e = parse(&["--rate", "0", "--fault", "0s", "--max-outstanding", "0"])
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        for needle in ["--rate", "--fault", "--max-outstanding"] {
            assert!(e.contains(needle), "{e}");
        }
        assert!(!e.contains('\n'), "{e}");
        let e = parse(&["--rate", "NaN"]).unwrap().check().unwrap_err();
        assert!(e.to_string().contains("--rate"), "{e}");
    }
}
