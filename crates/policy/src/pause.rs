//! Leaving an optional dependency alone for a while after it failed several times in a row.
//!
//! Why: the gateway's Redis layers (the key cache's shared answers, the fleet's rate limits) are
//! optimisations, asked on the request path under a timeout, with a fallback when they do not
//! answer. While Redis hangs, every request would still wait that timeout before falling back;
//! after a few errors in a row the dependency is skipped outright for a pause instead, so a hung
//! Redis costs each request nothing. One error is not enough (a dropped connection, one slow
//! answer), and a pause is short, so a Redis that is back is used again within it.
//!
//! The count is not reset by the pause: the first call after it tries the dependency again,
//! and if that call fails too, another pause starts at once. Only a success ends the run of
//! errors. An error that arrives while paused (a call that started before the pause) starts the
//! pause again from its own time.

use std::fmt;
use std::time::{Duration, Instant};

/// The run of errors after which the gateway's Redis layers are skipped.
pub const ERRORS_BEFORE_PAUSE: u32 = 3;
/// How long they are skipped.
pub const PAUSE: Duration = Duration::from_secs(1);

/// Why [`PauseAfterErrors::try_new`] refused its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseError {
    /// A pause after zero errors would never use the dependency.
    ZeroErrors,
    /// A pause of zero time is no pause: leave the dependency's timeout to bound calls.
    ZeroPause,
}

impl fmt::Display for PauseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PauseError::ZeroErrors => "the errors before a pause must be at least 1",
            PauseError::ZeroPause => "the pause must be longer than zero",
        })
    }
}

impl std::error::Error for PauseError {}

/// Whether a dependency is being left alone, from the outcomes of the calls made to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseAfterErrors {
    errors_before_pause: u32,
    pause: Duration,
    errors_in_a_row: u32,
    paused_until: Option<Instant>,
}

impl Default for PauseAfterErrors {
    /// [`ERRORS_BEFORE_PAUSE`] errors in a row, then [`PAUSE`].
    fn default() -> Self {
        PauseAfterErrors {
            errors_before_pause: ERRORS_BEFORE_PAUSE,
            pause: PAUSE,
            errors_in_a_row: 0,
            paused_until: None,
        }
    }
}

impl PauseAfterErrors {
    /// Pauses for `pause` after `errors_before_pause` errors in a row.
    pub fn try_new(errors_before_pause: u32, pause: Duration) -> Result<Self, PauseError> {
        if errors_before_pause == 0 {
            return Err(PauseError::ZeroErrors);
        }
        if pause.is_zero() {
            return Err(PauseError::ZeroPause);
        }
        Ok(PauseAfterErrors {
            errors_before_pause,
            pause,
            ..PauseAfterErrors::default()
        })
    }

    /// True while the dependency is to be left alone: no call should be made at `now`.
    pub fn is_paused(&self, now: Instant) -> bool {
        self.paused_until.is_some_and(|until| now < until)
    }

    /// A call answered: the run of errors is over, and so is any pause.
    pub fn succeeded(&mut self) {
        self.errors_in_a_row = 0;
        self.paused_until = None;
    }

    /// A call failed or timed out at `now`; from the run's `errors_before_pause`-th error on,
    /// each one (re)starts the pause.
    pub fn failed(&mut self, now: Instant) {
        self.errors_in_a_row = self.errors_in_a_row.saturating_add(1);
        if self.errors_in_a_row >= self.errors_before_pause {
            self.paused_until = Some(now + self.pause);
        }
    }

    /// Errors since the last success.
    pub fn errors_in_a_row(&self) -> u32 {
        self.errors_in_a_row
    }
}

#[cfg(test)]
mod tests;
