//! Fallbacks to other models (`[[models]] fallbacks`): when a call's own model cannot answer it,
//! the call moves to the next fallback for that failure, as one more attempt of the same call.
//!
//! A fallback is drawn from the call's own model's retry budget and counts against the same
//! attempt cap (`retry.max_attempts`), so a chain of fallbacks never gives a call more attempts
//! than retries alone would; it happens only before a byte of a response was relayed (the loop
//! decides on response heads), only to models the caller's key may use and whose backends serve
//! the call's surface; and only the call's own model's list is followed.

use spillway_policy::{Class, Outcome, Trigger};
use tracing::debug;

use super::answer::Failure;
use super::Loop;
use crate::request::{rewritten, Changes};

/// Why a run on a model that found no backend to try (none had room, or none was up) ended,
/// after `last`, the failure of its last attempt, if any; `seats` is what its backends could
/// take when they are up.
pub(super) fn trigger_without_backend(last: Option<&Failure>, seats: usize) -> Option<Trigger> {
    match last {
        None => Some(if seats == 0 {
            Trigger::Unavailable
        } else {
            Trigger::Capacity
        }),
        Some(failure) if failure.outcome == Outcome::ConnectFailed && seats == 0 => {
            Some(Trigger::Unavailable)
        }
        Some(failure) => trigger_of(failure),
    }
}

/// Why a run on a model whose last attempt failed with `failure`, and was not retried, ended,
/// if a fallback is for it: backends full, or backends failing. A timeout is not: the deadline
/// that stopped the retries leaves a fallback no time either.
pub(super) fn trigger_of(failure: &Failure) -> Option<Trigger> {
    match failure.class {
        Class::Capacity => Some(Trigger::Capacity),
        Class::Transient => Some(Trigger::Unavailable),
        _ => None,
    }
}

impl Loop<'_, '_> {
    /// Whether a fallback for `trigger` is still to come for this call, one it may use.
    pub(super) fn fallback_waits(&self, trigger: Trigger) -> bool {
        self.next_fallback(trigger).is_some()
    }

    /// The fallback the call would go to next after `trigger`, by index in its model's list:
    /// one for that trigger, that the caller's key may use and whose backends serve its surface.
    fn next_fallback(&self, trigger: Trigger) -> Option<usize> {
        let (call, models) = (self.call, self.models);
        let surface = call.endpoint.surface();
        let bulkhead = call.tenant.pool.as_deref();
        let usable = |model: &String| {
            call.tenant.may_use(model)
                && models
                    .get(model)
                    .is_some_and(|p| p.serves(surface, bulkhead))
        };
        spillway_policy::fallback::next(&call.pool.fallbacks, trigger, self.on_fallback, usable)
    }

    /// Moves the call to its next fallback for why its last run ended, if there is one it may
    /// use and the budget, the attempt cap and the deadline allow one more attempt. `false`: the
    /// call ends with what its last run gave.
    pub(super) fn fall_back(&mut self) -> bool {
        let Some(trigger) = self.trigger.take() else {
            return false;
        };
        let Some(i) = self.next_fallback(trigger) else {
            return false;
        };
        let (call, models) = (self.call, self.models);
        let own = call.pool;
        let now = crate::clock::now();
        if self.made >= self.retries.policy.max_attempts || now >= call.deadline {
            return false;
        }
        let name = &own.fallbacks[i].model;
        let model = Changes {
            model: Some(name),
            ..Changes::default()
        };
        // The copy is inside the room the call holds for it (`Call::_rewrite_room`).
        let (Some(pool), Ok(body)) = (models.get(name), rewritten(&call.body, &model)) else {
            return false;
        };
        // One more attempt of this call: a retry like any other, from its own model's budget
        // (unless the budget granted one that found no backend here).
        if !std::mem::take(&mut self.spare_retry) {
            let others = own.retrying.load(std::sync::atomic::Ordering::Relaxed);
            if own.withdraw_retry(now, others).is_err() {
                return false;
            }
        }
        debug!(request_id = ?call.id(), from = %own.name, to = %name, trigger = trigger.as_str(), "falling back");
        own.metrics.fell_back(name, trigger);
        self.fallback = Some((pool, body));
        self.on_fallback = Some(i);
        self.tried.clear();
        self.refused.clear();
        true
    }
}
