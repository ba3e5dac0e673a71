//! What a pool learns from its attempts: each outcome recorded in its backend's health (and an
//! ejection logged and counted), adaptive throttling fed and consulted, and whether the pool is
//! failing, for the shedding of callers' own retries.

use std::time::Instant;

use spillway_policy::outlier::Health;
use spillway_policy::Class;

use super::pass::ThrottlePass;
use super::{Backend, ModelPool};

/// What the pool learns from attempts: health, ejections and adaptive throttling.
impl ModelPool {
    /// Whether one more backend of this pool may be ejected now.
    pub fn may_eject(&self, now: Instant) -> bool {
        let out = self
            .backends
            .iter()
            .filter(|b| b.health.health(now) != Health::Healthy)
            .count();
        spillway_policy::outlier::may_eject(self.backends.len(), out, self.max_ejected_share)
    }

    /// Records an attempt's outcome on `backend` (`in_flight`: the backend's outstanding
    /// requests when it was sent; `status`: its answer's, if it answered) and logs and counts
    /// an ejection.
    pub fn record(
        &self,
        backend: &Backend,
        now: Instant,
        class: Class,
        in_flight: u32,
        status: Option<u16>,
    ) {
        let may_eject = class.is_backend_failure() && self.may_eject(now);
        if let Some(until) = backend
            .health
            .record(now, class, in_flight, status, may_eject)
        {
            backend.ejected(until - now, class.as_str());
        }
    }

    /// Whether the pool is failing: its retry budget is spent, its backends have failed enough
    /// recently for throttling to be in force, or so few backends are healthy that it is in panic
    /// mode. Callers' retries are shed first while it is.
    pub fn is_failing(&self, now: Instant) -> bool {
        let spent = self
            .budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_spent(now);
        spent || self.throttling(now) || self.in_panic(now)
    }

    /// Whether adaptive throttling refuses some requests now.
    pub fn throttling(&self, now: Instant) -> bool {
        self.throttle.as_ref().is_some_and(|t| {
            t.lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_throttling(now)
        })
    }

    /// Whether a new request may be sent to the backends now (adaptive throttling): `None` when
    /// not, else its pass, which counts it as on its way to a backend until its first attempt
    /// is recorded.
    pub fn throttle_admits(&self, now: Instant) -> Option<ThrottlePass> {
        let Some(t) = &self.throttle else {
            return Some(ThrottlePass::default());
        };
        let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
        if !t.admit(now, self.throttle_pending.now()) {
            return None;
        }
        self.throttle_pending.up();
        Some(ThrottlePass::counted())
    }

    /// Counts an attempt sent to a backend, and whether the backend accepted it (answered with
    /// anything but a backend failure), for adaptive throttling.
    pub fn throttle_record(&self, now: Instant, accepted: bool) {
        if let Some(t) = &self.throttle {
            let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
            t.sent(now);
            if accepted {
                t.accepted(now);
            }
        }
    }

    /// Whether so few backends are healthy that health is ignored (panic mode).
    pub fn in_panic(&self, now: Instant) -> bool {
        let healthy = self
            .backends
            .iter()
            .filter(|b| b.health.health(now) == Health::Healthy)
            .count();
        self.panics_with(healthy)
    }

    /// Panic mode given how many backends are healthy.
    pub fn panics_with(&self, healthy: usize) -> bool {
        spillway_policy::outlier::panic_mode(self.backends.len(), healthy, self.panic_threshold)
    }
}
