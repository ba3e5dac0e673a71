//! The flags of `spillway replay noisy-neighbor`, checked once into a [`NeighborPlan`].

use std::path::PathBuf;
use std::time::Duration;

use crate::error::ReplayError;
use crate::plan::Mode;

/// The phases of a run; the flood tenant surges during the second.
pub(crate) const PHASES: [&str; 3] = ["steady", "flood", "recovery"];

/// Flags of `spillway replay noisy-neighbor`.
#[derive(Debug, Clone, clap::Args)]
pub struct NoisyNeighborArgs {
    /// Run only the gateway with its protections (default: protected, then naive).
    #[arg(long, conflicts_with = "naive")]
    pub protected: bool,
    /// Run only the naive gateway: no tenant limits, one unbounded first-come-first-served queue.
    #[arg(long)]
    pub naive: bool,
    /// Length of the phase before the flood.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub steady: humantime::Duration,
    /// Length of the flood.
    #[arg(long, value_name = "DURATION", default_value = "20s")]
    pub flood: humantime::Duration,
    /// Length of the phase after it.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub recovery: humantime::Duration,
    /// The flooding tenant's requests per minute limit; it floods at 50 times it.
    #[arg(long, value_name = "PER_MIN", default_value_t = 120)]
    pub flood_limit: u32,
    /// Requests per second the quiet tenant sends throughout (its limit is 600 a minute).
    #[arg(long, value_name = "PER_SEC", default_value_t = 5.0)]
    pub quiet_rate: f64,
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

/// A checked `noisy-neighbor` invocation.
#[derive(Debug, Clone)]
pub(crate) struct NeighborPlan {
    pub(crate) modes: Vec<Mode>,
    pub(crate) phases: [Duration; 3],
    pub(crate) flood_limit: u32,
    pub(crate) quiet_rate: f64,
    pub(crate) json: Option<PathBuf>,
    pub(crate) out: Option<PathBuf>,
}

impl NoisyNeighborArgs {
    pub(crate) fn check(&self) -> Result<NeighborPlan, ReplayError> {
        let mut problems = Vec::new();
        if !(1..=6000).contains(&self.flood_limit) {
            problems.push(format!(
                "--flood-limit must be from 1 to 6000, got {}",
                self.flood_limit
            ));
        }
        if !(self.quiet_rate.is_finite() && self.quiet_rate > 0.0 && self.quiet_rate <= 10.0) {
            problems.push(format!(
                "--quiet-rate must be above 0 and at most 10 (its limit), got {}",
                self.quiet_rate
            ));
        }
        let phases = [self.steady, self.flood, self.recovery].map(Duration::from);
        let flags = PHASES.map(|p| format!("--{p}"));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        crate::plan::check_phases(&flags, &phases, &mut problems);
        if !problems.is_empty() {
            return Err(ReplayError::InvalidArgs(problems.join("; ")));
        }
        let modes = crate::plan::modes(self.protected, self.naive);
        Ok(NeighborPlan {
            modes,
            phases,
            flood_limit: self.flood_limit,
            quiet_rate: self.quiet_rate,
            json: self.json.clone(),
            out: self.out.clone(),
        })
    }
}
