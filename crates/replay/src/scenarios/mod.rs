//! The incidents that can be replayed, one folder each, and the subcommand that picks one.
//!
//! This module is the list of scenarios and nothing else: what each one is (its folder: flags,
//! processes, phases, figures) stays in its folder, and what they share (modes, load, the
//! run-report-publish skeleton in `incident.rs`) lives outside, in modules that never import a
//! scenario. Adding a scenario is a folder, a variant here, and its arm in [`Scenario::check`].

mod flush;
mod neighbor;
mod rollout;
mod storm;

use std::future::Future;
use std::pin::Pin;

use crate::error::ReplayError;
pub use flush::CacheFlushArgs;
pub use neighbor::NoisyNeighborArgs;
pub use rollout::BadRolloutArgs;
pub use storm::RetryStormArgs;

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
    CacheFlush(CacheFlushArgs),
    /// IL-0248 and IL-0110: one tenant floods at 50 times its limit, resending every refusal;
    /// another, within its limit, must not notice.
    ///
    /// Runs a mock backend and a gateway with two tenants on one pool of 8 seats, once with
    /// spillway's admission (tenant limits, fair queuing, bounded queues) and once naive (no
    /// limits, one unbounded first-come-first-served queue), and prints per phase and tenant
    /// what was offered, what succeeded, what was shed, p99 and the gateway's RSS.
    NoisyNeighbor(NoisyNeighborArgs),
    /// IL-0235: a new version that refuses a feature (400) and has less capacity (429) is
    /// rolled out.
    ///
    /// Runs an old-version and a new-version mock backend in each region (3 by default) and a
    /// gateway on the old version; callers send a share of their requests with `tools`, which
    /// the new version refuses. At the rollout phase's start the config is rewritten with a
    /// `[models.rollout]` and reloaded: staged and halted by its comparator (protected), or
    /// replacing the old version at once (naive). Prints per phase what the callers saw and
    /// what reached the new version, and how long it took until the halt and until every
    /// request was served by the old version again.
    BadRollout(BadRolloutArgs),
}

/// A scenario's replay, checked and not started yet; dropping it stops it.
pub(crate) type Replay = Pin<Box<dyn Future<Output = Result<(), ReplayError>>>>;

impl Scenario {
    /// The replay these flags describe, or every problem with them in one error; nothing has
    /// started either way.
    pub(crate) fn check(&self) -> Result<Replay, ReplayError> {
        Ok(match self {
            Scenario::RetryStorm(args) => Box::pin(storm::replay(args)?),
            Scenario::CacheFlush(args) => Box::pin(flush::replay(args)?),
            Scenario::NoisyNeighbor(args) => Box::pin(neighbor::replay(args)?),
            Scenario::BadRollout(args) => Box::pin(rollout::replay(args)?),
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
        args: ReplayArgs,
    }

    fn parse(args: &[&str]) -> Scenario {
        Cli::try_parse_from(["replay"].iter().chain(args))
            .unwrap()
            .args
            .scenario
    }

    #[test]
    fn each_subcommand_names_its_scenario() {
        assert!(matches!(parse(&["retry-storm"]), Scenario::RetryStorm(_)));
        assert!(matches!(parse(&["cache-flush"]), Scenario::CacheFlush(_)));
        assert!(matches!(
            parse(&["noisy-neighbor"]),
            Scenario::NoisyNeighbor(_)
        ));
        assert!(matches!(parse(&["bad-rollout"]), Scenario::BadRollout(_)));
    }

    #[test]
    fn bad_flags_are_refused_before_anything_starts() {
        for args in [
            &["retry-storm", "--rate", "0"][..],
            &["cache-flush", "--keys", "0"],
            &["noisy-neighbor", "--flood-limit", "0"],
            &["bad-rollout", "--tools-share", "2"],
        ] {
            let refused = parse(args).check().err().expect("refused");
            assert!(
                matches!(refused, ReplayError::InvalidArgs(_)),
                "{args:?}: {refused}"
            );
        }
    }
}
