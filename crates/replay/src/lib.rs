//! spillway-replay: incidents replayed with real processes on 127.0.0.1.
//!
//! A claim like "the gateway does not amplify a retry storm" is only worth something if it is
//! measured against the incident that made it matter, with the same processes a user runs. A
//! replay starts `spillway mock-backend` and `spillway serve` as child processes of the current
//! executable, drives them with a load client that behaves like the callers of the incident,
//! switches faults on and off on a schedule through the mocks' `PATCH /control`, and reports
//! per phase what the callers and the backends saw, side by side for the gateway's protections
//! and for a naive configuration.
//!
//! Scenarios: `retry-storm` (IL-0248, capacity failures surfacing as 500 under callers that
//! retry immediately, up to 48 times) and `cache-flush` (IL-0136, a key cache flushed at peak,
//! a restart, and the metadata store going away, with PostgreSQL behind a counting link).
//!
//! Every child is killed by its own PID when a replay ends, fails or is interrupted, and every
//! wait has a deadline, so a replay's run time is bounded by its phases plus start-up deadlines.
//!
//! Architecture Invariant: this crate knows the gateway and the mock only through their command
//! lines, their config file and their HTTP APIs, never through their Rust types: a replay must
//! measure the binary a user would run.

mod args;
mod error;
mod fleet;
mod flush;
mod http;
mod load;
mod neighbor;
mod process;
mod report;
mod rss;
mod store_link;
mod storm;
mod tally;

pub use args::{ReplayArgs, RetryStormArgs, Scenario};
pub use error::ReplayError;
pub use flush::CacheFlushArgs;
pub use neighbor::NoisyNeighborArgs;
pub use rss::resident_bytes;

/// Runs the chosen scenario: progress lines on stderr, the results table on stdout, and the raw
/// figures as JSON when asked. When `interrupted` resolves (the binary passes its SIGINT/SIGTERM
/// future), the scenario's future is dropped, which kills every child process by its PID, and
/// the result is [`ReplayError::Interrupted`].
pub async fn run(
    args: ReplayArgs,
    interrupted: impl std::future::Future<Output = ()>,
) -> Result<(), ReplayError> {
    match args.scenario {
        Scenario::RetryStorm(storm) => {
            let plan = storm.check()?;
            tokio::select! {
                result = storm::run(plan) => result,
                () = interrupted => Err(ReplayError::Interrupted),
            }
        }
        Scenario::NoisyNeighbor(neighbor) => {
            let plan = neighbor.check()?;
            tokio::select! {
                result = neighbor::run(plan) => result,
                () = interrupted => Err(ReplayError::Interrupted),
            }
        }
        Scenario::CacheFlush(flush) => {
            let plan = flush.check()?;
            tokio::select! {
                result = flush::run(plan) => result,
                () = interrupted => Err(ReplayError::Interrupted),
            }
        }
    }
}
