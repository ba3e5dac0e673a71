//! From two reads of `GET /admin/top` to what `spillway top` shows: each counter's total and its
//! rate per second between the reads, the amplification ratios, and the tenants sorted by who
//! drives the load. Pure: the reads are arguments, so the tests inject them.
//!
//! The time between two reads is the gateway's own uptime difference (its monotonic clock), not
//! this process's clock. A gateway whose uptime went down was restarted: its counters started
//! again from zero, so the rates are taken over its uptime. A tenant or model missing from the
//! earlier read had counted nothing yet.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde::Serialize;
use spillway_proxy::top::{BackendTop, ModelTop, TenantTop, Top};

/// A counter's total since the gateway started and its rate between the two reads (`None`
/// with one read only).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Counter {
    pub total: u64,
    pub per_second: Option<f64>,
}

/// What one frame shows: the shape `spillway top --once --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct View {
    /// The gateway's admin listener.
    pub admin_url: String,
    pub uptime_seconds: f64,
    /// Seconds between the two reads the rates come from; `None` with one read only.
    pub interval_seconds: Option<f64>,
    /// Upstream attempts ÷ requests offered, over all tenants, between the reads.
    pub amplification: Option<f64>,
    /// The same since the gateway started.
    pub amplification_since_start: Option<f64>,
    /// Every tenant's counters added up.
    pub totals: Totals,
    /// Sorted by who drives the load: offered rate, then upstream attempts' rate (totals with
    /// one read), then name.
    pub tenants: Vec<TenantRow>,
    pub models: Vec<ModelRow>,
    pub backends: Vec<BackendTop>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Totals {
    pub offered: Counter,
    pub admitted: Counter,
    pub queued: u64,
    pub shed: Counter,
    pub client_retries: Counter,
    pub upstream_attempts: Counter,
    pub upstream_retries: Counter,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantRow {
    pub tenant: String,
    pub offered: Counter,
    pub admitted: Counter,
    /// Waiting for a seat at the last read.
    pub queued: u64,
    /// Every refusal, whatever its reason.
    pub shed_total: Counter,
    /// By reason: every reason the gateway reports.
    pub shed: BTreeMap<String, Counter>,
    pub client_retries: Counter,
    pub upstream_attempts: Counter,
    pub upstream_retries: Counter,
    /// Its upstream attempts ÷ its requests offered, between the reads.
    pub amplification: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelRow {
    pub model: String,
    pub offered: Counter,
    pub upstream_attempts: Counter,
    pub upstream_retries: Counter,
    /// Upstream attempts ÷ requests offered for the model, between the reads.
    pub amplification: Option<f64>,
    pub amplification_since_start: Option<f64>,
}

/// Reads `now` against `before` (the read one interval earlier, if any).
pub fn view(admin_url: &str, before: Option<&Top>, now: &Top) -> View {
    // A restarted gateway counted from zero since its start.
    let restart = Top {
        uptime_seconds: 0.0,
        tenants: Vec::new(),
        models: Vec::new(),
        backends: Vec::new(),
    };
    let before = before.map(|b| {
        if b.uptime_seconds > now.uptime_seconds {
            &restart
        } else {
            b
        }
    });
    let interval = match before {
        Some(b) => Some(now.uptime_seconds - b.uptime_seconds).filter(|s| *s > 0.0),
        None => None,
    };
    let clock = Clock { interval };
    let mut tenants: Vec<TenantRow> = now
        .tenants
        .iter()
        .map(|t| {
            let was = before.and_then(|b| b.tenants.iter().find(|x| x.tenant == t.tenant));
            tenant_row(&clock, was, before.is_some(), t)
        })
        .collect();
    tenants.sort_by(by_load);
    let models = now
        .models
        .iter()
        .map(|m| {
            let was = before.and_then(|b| b.models.iter().find(|x| x.model == m.model));
            model_row(&clock, was, before.is_some(), m)
        })
        .collect();
    let sum = |f: fn(&TenantRow) -> Counter| -> Counter {
        tenants.iter().map(f).fold(
            Counter {
                total: 0,
                per_second: clock.interval.map(|_| 0.0),
            },
            |a, c| Counter {
                total: a.total + c.total,
                per_second: a.per_second.zip(c.per_second).map(|(x, y)| x + y),
            },
        )
    };
    let totals = Totals {
        offered: sum(|t| t.offered),
        admitted: sum(|t| t.admitted),
        queued: tenants.iter().map(|t| t.queued).sum(),
        shed: sum(|t| t.shed_total),
        client_retries: sum(|t| t.client_retries),
        upstream_attempts: sum(|t| t.upstream_attempts),
        upstream_retries: sum(|t| t.upstream_retries),
    };
    View {
        admin_url: admin_url.to_owned(),
        uptime_seconds: now.uptime_seconds,
        interval_seconds: clock.interval,
        amplification: ratio_per_second(totals.upstream_attempts, totals.offered),
        amplification_since_start: ratio(totals.upstream_attempts.total, totals.offered.total),
        totals,
        tenants,
        models,
        backends: now.backends.clone(),
    }
}

/// Who drives more load first: the higher offered rate, then the higher rate of upstream
/// attempts; with one read (no rates) the higher totals; then by name.
pub fn by_load(a: &TenantRow, b: &TenantRow) -> Ordering {
    let key = |c: Counter| c.per_second.unwrap_or(0.0);
    key(b.offered)
        .total_cmp(&key(a.offered))
        .then_with(|| key(b.upstream_attempts).total_cmp(&key(a.upstream_attempts)))
        .then_with(|| b.offered.total.cmp(&a.offered.total))
        .then_with(|| b.upstream_attempts.total.cmp(&a.upstream_attempts.total))
        .then_with(|| a.tenant.cmp(&b.tenant))
}

struct Clock {
    interval: Option<f64>,
}

impl Clock {
    /// `total` now, against `was` at the earlier read (`None`: no earlier read at all).
    fn counter(&self, was: Option<u64>, total: u64) -> Counter {
        let per_second = self.interval.zip(was).map(|(seconds, was)| {
            // A counter never goes down within one process; if it seems to, it counted nothing.
            total.saturating_sub(was) as f64 / seconds
        });
        Counter { total, per_second }
    }
}

fn tenant_row(
    clock: &Clock,
    was: Option<&TenantTop>,
    read_before: bool,
    t: &TenantTop,
) -> TenantRow {
    // A tenant absent from an earlier read had counted nothing yet.
    let earlier = |f: fn(&TenantTop) -> u64| read_before.then(|| was.map_or(0, f));
    let c = |f: fn(&TenantTop) -> u64| clock.counter(earlier(f), f(t));
    let shed: BTreeMap<String, Counter> = t
        .shed
        .iter()
        .map(|(why, n)| {
            let before =
                read_before.then(|| was.and_then(|w| w.shed.get(why).copied()).unwrap_or(0));
            (why.clone(), clock.counter(before, *n))
        })
        .collect();
    let shed_sum = |s: &TenantTop| s.shed.values().sum::<u64>();
    let offered = c(|t| t.offered);
    let upstream_attempts = c(|t| t.upstream_attempts);
    TenantRow {
        tenant: t.tenant.clone(),
        offered,
        admitted: c(|t| t.admitted),
        queued: t.queued,
        shed_total: clock.counter(earlier(shed_sum), shed_sum(t)),
        shed,
        client_retries: c(|t| t.client_retries),
        upstream_attempts,
        upstream_retries: c(|t| t.upstream_retries),
        amplification: ratio_per_second(upstream_attempts, offered),
    }
}

fn model_row(clock: &Clock, was: Option<&ModelTop>, read_before: bool, m: &ModelTop) -> ModelRow {
    let earlier = |f: fn(&ModelTop) -> u64| read_before.then(|| was.map_or(0, f));
    let c = |f: fn(&ModelTop) -> u64| clock.counter(earlier(f), f(m));
    let offered = c(|m| m.offered);
    let upstream_attempts = c(|m| m.upstream_attempts);
    ModelRow {
        model: m.model.clone(),
        offered,
        upstream_attempts,
        upstream_retries: c(|m| m.upstream_retries),
        amplification: ratio_per_second(upstream_attempts, offered),
        amplification_since_start: ratio(upstream_attempts.total, offered.total),
    }
}

/// `a ÷ b`, or `None` when nothing was offered.
fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

/// The ratio of two counters' rates, or `None` without rates or when nothing was offered.
fn ratio_per_second(a: Counter, b: Counter) -> Option<f64> {
    match (a.per_second, b.per_second) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
