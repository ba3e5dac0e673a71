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
//! Scenarios, one folder each under `scenarios/`: `retry-storm` (IL-0248, capacity failures
//! surfacing as 500 under callers that retry immediately, up to 48 times), `cache-flush`
//! (IL-0136, a key cache flushed at peak, a restart, and the metadata store going away, with
//! PostgreSQL behind a counting link), `noisy-neighbor` (IL-0248 and IL-0110, one tenant
//! flooding beside a quiet one) and `bad-rollout` (IL-0235, a new backend version that refuses a
//! feature, rolled out in stages or all at once through a config reload). Each goes through the same skeleton (`incident.rs`: its
//! modes run in turn, one report, the table and the JSON published); the modules beside
//! `scenarios/` are what they share, and never import a scenario: among them the run's
//! timeline (`timeline/`: the load client's counts per time bucket and the gateway's `/metrics`
//! read every bucket), the progress shown while a mode runs (`progress.rs`), and the pictures
//! `--out DIR` draws from the timelines (`pictures/`: an SVG per mode and one HTML page).
//!
//! Every child is killed by its own PID when a replay ends, fails or is interrupted, and every
//! wait has a deadline, so a replay's run time is bounded by its phases plus start-up deadlines.
//!
//! Architecture Invariant: this crate knows the gateway and the mock only through their command
//! lines, their config file and their HTTP APIs, never through their Rust types: a replay must
//! measure the binary a user would run.

// Tests may time real processes and sockets on the system clock (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod error;
mod http;
mod incident;
mod load;
mod pictures;
mod plan;
mod process;
mod progress;
mod ready;
mod report;
mod rss;
mod scenarios;
mod scratch;
mod tally;
mod timeline;

pub use error::ReplayError;
pub use rss::resident_bytes;
pub use scenarios::{
    BadRolloutArgs, CacheFlushArgs, NoisyNeighborArgs, ReplayArgs, RetryStormArgs, Scenario,
};

/// Runs the chosen scenario: progress on stderr (a bar on a terminal, a line per phase
/// elsewhere), the results table on stdout, the raw figures as JSON and the pictures when
/// asked. When `interrupted` resolves (the binary passes its SIGINT/SIGTERM
/// future), the scenario's future is dropped, which kills every child process by its PID, and
/// the result is [`ReplayError::Interrupted`].
pub async fn run(
    args: ReplayArgs,
    interrupted: impl std::future::Future<Output = ()>,
) -> Result<(), ReplayError> {
    let replay = args.scenario.check()?;
    tokio::select! {
        result = replay => result,
        () = interrupted => Err(ReplayError::Interrupted),
    }
}
