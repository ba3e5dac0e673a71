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
    pub(super) in_flight: Arc<AtomicUsize>,
    /// Bytes of request body its requests hold, under its share of the body budget.
    pub(super) body_held: Arc<std::sync::atomic::AtomicU64>,
    /// The limits the limiter enforces, and the limiter.
    pub(super) rate: Mutex<(TenantLimits, TenantLimiter)>,
}

/// A request counted in flight, globally and for its tenant, whose body is yet to be read.
pub(crate) struct Entered {
    pub(super) gate: Arc<Gate>,
    pub(super) global: Slot,
    pub(super) own: Option<Slot>,
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

/// One place in a counter with a cap, given back on drop.
pub(super) struct Slot(Arc<AtomicUsize>);

impl Slot {
    pub(super) fn take(counter: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        let before = counter.fetch_add(1, Ordering::AcqRel);
        if before >= max {
            counter.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(counter.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
