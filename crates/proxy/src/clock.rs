//! The request path's one reading of the clock.
//!
//! Every decision on the path takes `now` as an argument (the policies are pure); this is where
//! that `now` comes from. It is tokio's clock, so that a test on paused time
//! (`#[tokio::test(start_paused = true)]`) drives the retry loop, the pools and their health
//! through minutes of backoffs, cooldowns and ejections without waiting through them. Outside
//! such a test it is the monotonic system clock.

use std::time::{Duration, Instant};

/// Now, on the clock the request path and its timers share.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// How long since `earlier`, on the same clock.
pub(crate) fn since(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}
