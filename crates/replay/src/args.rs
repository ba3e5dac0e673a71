//! The flags of `spillway replay`, and the checked plan a replay runs from.
//!
//! As elsewhere in spillway, what the user typed ([`RetryStormArgs`]) is checked once into what
//! the program uses ([`StormPlan`]); every problem is reported together on one line, so a bad
//! invocation costs one try and never starts a process.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::ReplayError;

/// `spillway replay SCENARIO`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    #[command(subcommand)]
    pub scenario: Scenario,
}

/// The incidents that can be replayed.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Scenario {
    /// IL-0248: backends answer HTTP 500 and callers resend at once, up to 48 times.
    ///
    /// Runs three mock backends and a gateway on 127.0.0.1, once with spillway's protections
    /// and once as a naive gateway, switches the fault on and off on a schedule (steady; fault:
    /// the home region fails; outage: every backend fails; recovery), and prints per phase what
    /// the callers and the backends saw.
    RetryStorm(RetryStormArgs),
    /// IL-0136: the key cache flushed at peak, the gateway restarted, the store gone for 30 s.
    ///
    /// Creates a tenant and 10,000 keys in a new schema of PostgreSQL, runs a gateway that
    /// reaches it through a link that counts SQL statements and can be cut, sends requests
    /// spread over the keys, and prints per phase (steady, flush, restart, outage, recovery)
    /// requests/s, errors, store queries/s, lookup p99 and restarts: once with spillway's
    /// protections and once naive (no single flight, no stale answers, a supervisor that
    /// restarts the gateway when its store probe fails).
    CacheFlush(crate::flush::CacheFlushArgs),
    /// IL-0248 and IL-0110: one tenant floods at 50 times its limit, resending every refusal;
    /// another, within its limit, must not notice.
    ///
    /// Runs a mock backend and a gateway with two tenants on one pool of 8 seats, once with
    /// spillway's admission (tenant limits, fair queuing, bounded queues) and once naive (no
    /// limits, one unbounded first-come-first-served queue), and prints per phase and tenant
    /// what was offered, what succeeded, what was shed, p99 and the gateway's RSS.
    NoisyNeighbor(crate::neighbor::NoisyNeighborArgs),
}

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
}

/// The gateway configurations a replay compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Mode {
    /// spillway's retry defaults (budget, backoff, ejection).
    Protected,
    /// `[retry] naive = true, max_attempts = 5`: what a gateway without protections does.
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

/// A checked `retry-storm` invocation.
#[derive(Debug, Clone)]
pub(crate) struct StormPlan {
    pub(crate) modes: Vec<Mode>,
    /// Steady, fault, outage, recovery.
    pub(crate) phases: [Duration; 4],
    pub(crate) load: LoadPlan,
    pub(crate) json: Option<PathBuf>,
}

/// How the client behaves.
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

/// Bounds that keep a replay a bounded experiment on a small machine.
const MAX_RATE: f64 = 10_000.0;
const MAX_OUTSTANDING: usize = 10_000;
const MAX_CLIENT_RETRIES: u32 = 1_000;
const MIN_PHASE: Duration = Duration::from_millis(100);
const MAX_PHASE: Duration = Duration::from_secs(3600);
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
        check_phases(
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
            modes: modes(self.protected, self.naive),
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
        })
    }
}

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
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        scenario: Scenario,
    }

    fn parse(args: &[&str]) -> Result<RetryStormArgs, clap::Error> {
        let cli = Cli::try_parse_from(["replay", "retry-storm"].iter().chain(args))?;
        match cli.scenario {
            Scenario::RetryStorm(a) => Ok(a),
            other => panic!("parsed as {other:?}"),
        }
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
