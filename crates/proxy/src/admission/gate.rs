//! A tenant's gate, and the places a request holds in the in-flight counts: the pieces of
//! admission that a request carries from its head to the end of its response.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use spillway_policy::TenantLimiter;

use super::metrics;
use crate::auth::TenantLimits;
use crate::traffic::TenantTraffic;

/// One tenant's admission state.
pub(super) struct Gate {
    pub(super) tenant: Arc<str>,
    /// The tenant's per-request series, registered once (a lookup by labels costs a hash and
    /// an allocation on every request otherwise).
    pub(super) series: metrics::TenantSeries,
    /// What the tenant brought and what became of it, for `GET /admin/top`.
    pub(super) traffic: Arc<TenantTraffic>,
    /// The tenant's requests in flight (counted only when it has a concurrency cap).
    pub(super) in_flight: AtomicUsize,
    /// The gateway's requests in flight: the one count every gate shares.
    pub(super) global: Arc<AtomicUsize>,
    /// Bytes of request body its requests hold, under its share of the body budget.
    pub(super) body_held: Arc<std::sync::atomic::AtomicU64>,
    /// The limits the limiter enforces, and the limiter.
    pub(super) rate: Mutex<(TenantLimits, TenantLimiter)>,
}

/// A request counted in flight, globally and, when its tenant has a concurrency cap, for its
/// tenant: from its head until its ticket (which takes this over) is dropped. The counts are its
/// gate's, reached through the gate it holds anyway: no reference to them of their own.
pub(crate) struct Entered {
    pub(super) gate: Arc<Gate>,
    /// Counted in its tenant's concurrency too.
    pub(super) own: bool,
}

impl Entered {
    /// Bytes of request body the tenant's requests hold now.
    pub(crate) fn body_held(&self) -> &Arc<std::sync::atomic::AtomicU64> {
        &self.gate.body_held
    }

    /// The tenant's traffic counters.
    pub(crate) fn traffic(&self) -> &Arc<TenantTraffic> {
        &self.gate.traffic
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.gate.global.fetch_sub(1, Ordering::AcqRel);
        if self.own {
            self.gate.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Takes a place in `counter` under `max`: false, nothing taken, when it is full.
pub(super) fn take_place(counter: &AtomicUsize, max: usize) -> bool {
    let before = counter.fetch_add(1, Ordering::AcqRel);
    if before >= max {
        counter.fetch_sub(1, Ordering::AcqRel);
        return false;
    }
    true
}
