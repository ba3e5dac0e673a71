//! The flags of `spillway replay cache-flush`, checked once into a [`FlushPlan`].

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::error::ReplayError;
use crate::plan::Mode;

/// The phases of a run, in order; each starts with its event.
pub(crate) const PHASES: [&str; 6] = ["start", "steady", "flush", "restart", "outage", "recovery"];
/// The phase whose store rate is the baseline of every "vs steady" figure.
pub(crate) const STEADY: usize = 1;

/// Where the replay's PostgreSQL is unless `--store` says otherwise.
pub(crate) const DEFAULT_STORE: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Flags of `spillway replay cache-flush`.
#[derive(Debug, Clone, clap::Args)]
pub struct CacheFlushArgs {
    /// Run only the gateway with its protections (default: protected, then naive).
    #[arg(long, conflicts_with = "naive")]
    pub protected: bool,
    /// Run only the naive gateway: no single flight, no stale answers, a probe that fails when
    /// the store does, and a supervisor that restarts the gateway on it.
    #[arg(long)]
    pub naive: bool,
    /// PostgreSQL to use (a schema of its own is created in it and dropped at the end).
    #[arg(long, value_name = "URL", default_value = DEFAULT_STORE)]
    pub store: String,
    /// API keys in the store; every request uses one of them, uniformly at random.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub keys: u32,
    /// Requests offered per second, whatever happens to earlier ones.
    #[arg(long, value_name = "PER_SEC", default_value_t = 1000.0)]
    pub rate: f64,
    /// Length of the first phase, from the gateway's first start: how it fills its cache.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub start: humantime::Duration,
    /// Length of the phase before the flush: the store's steady query rate.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub steady: humantime::Duration,
    /// Length of the phase that starts with `POST /admin/cache/flush`.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub flush: humantime::Duration,
    /// Length of the phase that starts with a restart of the gateway (SIGTERM, then a new
    /// process on the same ports).
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub restart: humantime::Duration,
    /// How long the store is gone: its port closed and its connections broken.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub outage: humantime::Duration,
    /// Length of the phase after the store is back.
    #[arg(long, value_name = "DURATION", default_value = "20s")]
    pub recovery: humantime::Duration,
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

/// A checked `cache-flush` invocation.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FlushPlan {
    pub(crate) modes: Vec<Mode>,
    #[serde(skip)]
    pub(crate) store: String,
    pub(crate) keys: u32,
    pub(crate) rate: f64,
    #[serde(skip)]
    pub(crate) phases: [Duration; 6],
    #[serde(skip)]
    pub(crate) json: Option<PathBuf>,
    #[serde(skip)]
    pub(crate) out: Option<PathBuf>,
}

const MAX_KEYS: u32 = 1_000_000;
const MAX_RATE: f64 = 10_000.0;

impl CacheFlushArgs {
    /// The plan these flags describe, or every problem with them in one error.
    pub(crate) fn check(&self) -> Result<FlushPlan, ReplayError> {
        let mut problems = Vec::new();
        if !(self.store.starts_with("postgres://") || self.store.starts_with("postgresql://")) {
            problems.push("--store must be a postgres:// URL".to_owned());
        }
        if !(1..=MAX_KEYS).contains(&self.keys) {
            problems.push(format!(
                "--keys must be from 1 to {MAX_KEYS}, got {}",
                self.keys
            ));
        }
        if !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= MAX_RATE) {
            problems.push(format!(
                "--rate must be above 0 and at most {MAX_RATE}, got {}",
                self.rate
            ));
        }
        let phases = [
            self.start,
            self.steady,
            self.flush,
            self.restart,
            self.outage,
            self.recovery,
        ]
        .map(Duration::from);
        let flags = PHASES.map(|p| format!("--{p}"));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        crate::plan::check_phases(&flags, &phases, &mut problems);
        if !problems.is_empty() {
            return Err(ReplayError::InvalidArgs(problems.join("; ")));
        }
        let modes = crate::plan::modes(self.protected, self.naive);
        Ok(FlushPlan {
            modes,
            store: self.store.clone(),
            keys: self.keys,
            rate: self.rate,
            phases,
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
        args: CacheFlushArgs,
    }

    fn parse(args: &[&str]) -> Result<CacheFlushArgs, clap::Error> {
        Ok(Cli::try_parse_from(["cache-flush"].iter().chain(args))?.args)
    }

    #[test]
    fn defaults_are_the_incident_s_shape() {
        let plan = parse(&[]).unwrap().check().unwrap();
        assert_eq!(plan.modes, [Mode::Protected, Mode::Naive]);
        assert_eq!(plan.keys, 10_000);
        assert_eq!(plan.phases.map(|d| d.as_secs()), [10, 30, 10, 10, 30, 20]);
        assert_eq!(plan.store, DEFAULT_STORE);
    }

    #[test]
    fn every_bad_value_is_reported_on_one_line() {
        let e = parse(&["--keys", "0", "--outage", "0s", "--store", "mysql://x"])
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        for needle in ["--keys", "--outage", "--store"] {
            assert!(e.contains(needle), "{e}");
        }
        assert!(!e.contains('\n'), "{e}");
        assert!(parse(&["--naive", "--protected"]).is_err());
    }
}
