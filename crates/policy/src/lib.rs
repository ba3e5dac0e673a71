//! Pure decisions of the request path, with no I/O and no async runtime.
//!
//! Everything here takes the current time and a random source as arguments, so each decision can
//! be unit- and property-tested deterministically with a manual clock and a seeded RNG. The crate
//! does not depend on tokio: the compiler holds that invariant for us.

pub mod balance;
pub mod budget;
pub mod classify;
pub mod concurrency;
pub mod outlier;
pub mod retry;

pub use balance::{pick, Candidate, Pick};
pub use budget::{BudgetConfig, Refusal, RetryBudget};
pub use classify::{classify, Class, Outcome, Pushback, Rules};
pub use concurrency::{Aimd, AimdConfig};
pub use outlier::{may_eject, panic_mode, Health, Outlier, OutlierConfig};
pub use retry::{Backoff, Decision, RetryPolicy, Stop};
