//! Pure decisions of the request path, with no I/O and no async runtime.
//!
//! Everything here takes the current time and a random source as arguments, so each decision can
//! be unit- and property-tested deterministically with a manual clock and a seeded RNG. The crate
//! does not depend on tokio: the compiler holds that invariant for us.
//!
//! What the engines report about themselves (requests running and waiting, KV cache in use, and
//! whether the reading is recent) enters as plain numbers: [`EngineView`] for the balancer,
//! [`Aimd::on_engine`] for the concurrency limit. Scraping and parsing their metrics is the
//! proxy's work; deciding what the numbers mean is this crate's.
//!
//! The staged rollout's vocabulary (its status, verdicts, the classes it compares) is read through
//! [`rollout`], and the 4xx detector's changes through [`anomaly`], whose names would be
//! ambiguous at the crate's root; only their entry points are re-exported here.

// Tests may time real processes and sockets on the system clock (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod anomaly;
pub mod balance;
mod binomial;
pub mod budget;
pub mod classify;
pub mod concurrency;
pub mod fair;
pub mod fallback;
pub mod outlier;
pub mod pause;
pub mod rate;
pub mod retry;
pub mod rollout;
pub mod throttle;
mod window;

pub use anomaly::{AnomalyConfig, AnomalyConfigError, FourXxDetector};
pub use balance::affinity::{hrw_score, splitmix64, stable_hash, DEFAULT_LOAD_FACTOR};
pub use balance::{pick, AffinityOutcome, Candidate, EngineView, Pick, Saturation, Strategy};
pub use budget::{BudgetConfig, Refusal, RetryBudget};
pub use classify::{classify, Class, Outcome, Pushback, Rules};
pub use concurrency::{Aimd, AimdConfig};
pub use fair::{FairQueue, Offer, Priority, QueueBounds, Rejection, Released, Ticket, Waiter};
pub use fallback::{Fallback, Trigger};
pub use outlier::{may_eject, panic_mode, Health, Outlier, OutlierConfig};
pub use pause::{PauseAfterErrors, PauseError};
pub use rate::{
    Dimension, Gcra, Quota, RateDecision, RateHeaders, RateLimit, RateLimitError, RateRefusal,
    Reservation, TenantLimiter,
};
pub use retry::{Backoff, Decision, RetryPolicy, Stop};
pub use rollout::{takes_new, Rollout, RolloutConfig, RolloutConfigError, RolloutState};
pub use throttle::{Throttle, ThrottleConfig};
