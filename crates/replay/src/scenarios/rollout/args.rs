//! The flags of `spillway replay bad-rollout`, checked once into a [`BadRolloutPlan`].

use std::path::PathBuf;
use std::time::Duration;

use crate::error::ReplayError;
use crate::plan::{self, LoadPlan, Mode};

/// The phases of a run; the rollout starts (a reload) at the start of the second.
pub(crate) const PHASES: [&str; 3] = ["steady", "rollout", "after"];

/// Flags of `spillway replay bad-rollout`.
#[derive(Debug, Clone, clap::Args)]
pub struct BadRolloutArgs {
    /// Run only the staged rollout, halted by its comparator (default: protected, then naive).
    #[arg(long, conflicts_with = "naive")]
    pub protected: bool,
    /// Run only the naive deployment: the new version takes every request at once.
    #[arg(long)]
    pub naive: bool,
    /// Length of the phase before the rollout, on the old version only.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub steady: humantime::Duration,
    /// Length of the phase that starts with the rollout (the config rewritten and reloaded).
    #[arg(long, value_name = "DURATION", default_value = "24s")]
    pub rollout: humantime::Duration,
    /// Length of the phase after it, the rollout left as it is.
    #[arg(long, value_name = "DURATION", default_value = "12s")]
    pub after: humantime::Duration,
    /// New requests offered per second, whatever happens to earlier ones; no client retries.
    #[arg(long, value_name = "PER_SEC", default_value_t = 40.0)]
    pub rate: f64,
    /// Share of requests, from 0 to 1, that use the feature the new version does not support
    /// (a `tools` field).
    #[arg(long, value_name = "SHARE", default_value_t = 0.3)]
    pub tools_share: f64,
    /// Regions, each with one backend of the old version and one of the new (IL-0235: 7).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub regions: usize,
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

/// A checked `bad-rollout` invocation.
#[derive(Debug, Clone)]
pub(crate) struct BadRolloutPlan {
    pub(crate) modes: Vec<Mode>,
    /// Steady, rollout, after.
    pub(crate) phases: [Duration; 3],
    pub(crate) load: LoadPlan,
    pub(crate) tools_share: f64,
    pub(crate) regions: usize,
    pub(crate) json: Option<PathBuf>,
    pub(crate) out: Option<PathBuf>,
}

/// Bounds that keep a replay a bounded experiment on a small machine: each region is two
/// processes, and the new version's small capacity is sized for rates up to a few hundred.
const MAX_RATE: f64 = 1000.0;
const MAX_REGIONS: usize = 10;
/// Requests in flight at most; a new request beyond them is dropped and counted.
const MAX_OUTSTANDING: usize = 1024;
/// No answer in this time counts as `timeout`: far above a served request (about 0.25 s), and
/// short enough that a request still waiting cannot hold the run past its drain.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

impl BadRolloutArgs {
    /// The plan these flags describe, or every problem with them in one error.
    pub(crate) fn check(&self) -> Result<BadRolloutPlan, ReplayError> {
        let mut problems = Vec::new();
        if !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= MAX_RATE) {
            problems.push(format!(
                "--rate must be above 0 and at most {MAX_RATE}, got {}",
                self.rate
            ));
        }
        if !(self.tools_share.is_finite() && (0.0..=1.0).contains(&self.tools_share)) {
            problems.push(format!(
                "--tools-share must be from 0 to 1, got {}",
                self.tools_share
            ));
        }
        if !(1..=MAX_REGIONS).contains(&self.regions) {
            problems.push(format!(
                "--regions must be from 1 to {MAX_REGIONS}, got {}",
                self.regions
            ));
        }
        let phases = [self.steady, self.rollout, self.after].map(Duration::from);
        let flags = PHASES.map(|p| format!("--{p}"));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        plan::check_phases(&flags, &phases, &mut problems);
        if !problems.is_empty() {
            return Err(ReplayError::InvalidArgs(problems.join("; ")));
        }
        Ok(BadRolloutPlan {
            modes: plan::modes(self.protected, self.naive),
            phases,
            load: LoadPlan {
                rate: self.rate,
                max_outstanding: MAX_OUTSTANDING,
                client_retries: 0,
                resend_429: false,
                surge: None,
                attempt_timeout: ATTEMPT_TIMEOUT,
            },
            tools_share: self.tools_share,
            regions: self.regions,
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
        args: BadRolloutArgs,
    }

    fn parse(args: &[&str]) -> Result<BadRolloutArgs, clap::Error> {
        Ok(Cli::try_parse_from(["bad-rollout"].iter().chain(args))?.args)
    }

    #[test]
    fn defaults_run_both_modes_over_three_regions_at_40_a_second() {
        let plan = parse(&[]).unwrap().check().unwrap();
        assert_eq!(plan.modes, [Mode::Protected, Mode::Naive]);
        assert_eq!(plan.phases.map(|d| d.as_secs()), [10, 24, 12]);
        assert_eq!(plan.load.rate, 40.0);
        assert_eq!(plan.load.client_retries, 0);
        assert_eq!(plan.tools_share, 0.3);
        assert_eq!(plan.regions, 3);
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
        let args = [
            "--rate",
            "0",
            "--tools-share",
            "1.5",
            "--regions",
            "0",
            "--rollout",
            "10ms",
        ];
        let e = parse(&args).unwrap().check().unwrap_err();
        assert!(matches!(e, ReplayError::InvalidArgs(_)), "{e}");
        let e = e.to_string();
        for needle in ["--rate", "--tools-share", "--regions", "--rollout"] {
            assert!(e.contains(needle), "{e}");
        }
        assert!(!e.contains('\n'), "{e}");
        let e = parse(&["--tools-share", "NaN", "--regions", "11"])
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--tools-share") && e.contains("--regions"),
            "{e}"
        );
    }
}
