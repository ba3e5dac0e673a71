//! At most one log line per interval for a failure that repeats on every request.
//!
//! When Redis or the store is down, every lookup meets the same error. Logging each one would
//! turn an outage into a second one (disk, log pipeline), so a [`LogGate`] lets one line through
//! per interval and counts what it held back; the metrics count every occurrence.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Whether a line may be logged at `now` when the last one went out at `last`.
pub fn may_log(now: Instant, last: Option<Instant>, every: Duration) -> bool {
    last.is_none_or(|at| now.saturating_duration_since(at) >= every)
}

#[derive(Debug)]
pub struct LogGate {
    every: Duration,
    state: Mutex<GateState>,
}

#[derive(Debug, Default)]
struct GateState {
    last: Option<Instant>,
    held_back: u64,
}

impl LogGate {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new(GateState::default()),
        }
    }

    /// `Some(lines held back since the last one)` when this line may be logged.
    pub fn pass(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if may_log(now, state.last, self.every) {
            state.last = Some(now);
            Some(std::mem::take(&mut state.held_back))
        } else {
            state.held_back += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_the_rest_counted() {
        let t0 = Instant::now();
        let gate = LogGate::new(Duration::from_secs(10));
        assert_eq!(gate.pass(t0), Some(0));
        assert_eq!(gate.pass(t0 + Duration::from_secs(1)), None);
        assert_eq!(gate.pass(t0 + Duration::from_secs(9)), None);
        assert_eq!(gate.pass(t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(gate.pass(t0 + Duration::from_secs(11)), None);
    }

    #[test]
    fn the_first_line_always_passes() {
        assert!(may_log(Instant::now(), None, Duration::from_secs(10)));
    }
}
