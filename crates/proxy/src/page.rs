//! The `/metrics` page of the admin listener: the recorder, every metric's description, and
//! the gauges that are read from the gateway's state when the page is rendered rather than
//! pushed on the request path.
//!
//! It sits above every module that reports metrics, so that none of them needs to know the
//! others: each registers its own series, and only this page walks them all.

use metrics::{counter, gauge};
use spillway_policy::outlier::Health;

use crate::gateway::Gateway;
use crate::histograms::MetricsHandle;
use crate::metrics::{
    MEMORY_BUDGET, MEMORY_LIMIT, RESIDENT_MEMORY, STORE_POOL_CONNECTIONS, STORE_POOL_MAX,
    STORE_POOL_TIMEOUTS, STORE_POOL_WAITERS,
};

/// The process-wide recorder, with every metric of the gateway described.
pub(crate) fn recorder() -> MetricsHandle {
    let handle = crate::metrics::recorder();
    crate::admission::metrics::describe();
    crate::engine::metrics::describe();
    crate::reload::describe();
    crate::rollout::describe();
    crate::anomaly::describe();
    crate::genai::describe();
    crate::trace::describe();
    handle
}

/// Renders the page, refreshing the gauges that are read rather than pushed.
pub(crate) fn render(handle: &MetricsHandle, gw: &Gateway) -> String {
    let live = gw.live();
    crate::admission::metrics::caps(live.admission.in_flight(), gw.body_budget.usage());
    let (open, max) = gw.connections.open();
    crate::admission::metrics::connections(open, max);
    crate::admission::metrics::queues(&live.admission.queue_figures());
    gw.tenants.cache().stats(); // sets the key cache's gauges
    let pool = gw.tenants.store().pool_stats();
    gauge!(STORE_POOL_CONNECTIONS, "state" => "idle").set(f64::from(pool.idle));
    gauge!(STORE_POOL_CONNECTIONS, "state" => "in_use")
        .set(f64::from(pool.size.saturating_sub(pool.idle)));
    gauge!(STORE_POOL_MAX).set(f64::from(pool.max_size));
    gauge!(STORE_POOL_WAITERS).set(pool.waiters as f64);
    counter!(STORE_POOL_TIMEOUTS).absolute(pool.acquire_timeouts);
    let now = crate::clock::now();
    for pool in live.models.pools() {
        for b in &pool.backends {
            let ejected = b.health.health(now) != Health::Healthy;
            b.metrics
                .read_gauges(b.outstanding(), b.health.limit(), ejected);
            if let Some(engine) = &b.engine {
                crate::engine::metrics::render(&pool.name, &b.name, engine, now);
            }
        }
    }
    memory(&live.config);
    handle.run_upkeep();
    let mut page = handle.render();
    crate::reload::render(&live, &gw.changes, &mut page);
    gw.rollouts.render(&mut page);
    page
}

/// The process's resident memory beside the budget its config's caps allow
/// (`spillway_config::MemoryBudget`), so an alert can fire before the container's limit does.
fn memory(config: &spillway_config::Config) {
    let budget = spillway_config::MemoryBudget::of(config);
    gauge!(MEMORY_BUDGET).set(budget.total() as f64);
    if let Some(rss) = resident_bytes() {
        gauge!(RESIDENT_MEMORY).set(rss as f64);
    }
    if let Some(limit) = cgroup_limit() {
        gauge!(MEMORY_LIMIT).set(limit as f64);
    }
}

/// The memory limit of the process's cgroup (a container's `resources.limits.memory`), cgroup
/// v2's `memory.max` or v1's `memory.limit_in_bytes`; `None` without one.
fn cgroup_limit() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let text = read("/sys/fs/cgroup/memory.max")
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))?;
    // "max" (v2) or a huge number (v1) says there is no limit.
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|&bytes| bytes < u64::MAX / 2)
}

/// `VmRSS` of `/proc/self/status` (Linux); `None` where there is no such file.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
