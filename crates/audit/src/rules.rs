//! The rules: one table, each record with its id, severity, the incident and the lesson it
//! comes from, what it finds, and its check. docs/audit.md documents the same table, and a test
//! holds the two together.
//!
//! The checks live beside their kind of input: `rules/config.rs` for what a spillway config
//! says on its own, `rules/probes.rs` for probes, `rules/pods.rs` for memory, shutdown,
//! replicas and how workloads are updated.

mod config;
mod pods;
mod probes;

use crate::{AuditError, Hit, Severity, Sources};

/// One audit rule.
#[derive(Debug)]
pub struct Rule {
    pub id: &'static str,
    pub severity: Severity,
    /// The seed incident the lesson comes from (`IL-0136`).
    pub incident: &'static str,
    pub lesson: &'static str,
    /// What it finds, in one sentence.
    pub finds: &'static str,
    pub check: fn(&Sources) -> Result<Vec<Hit>, AuditError>,
}

const PROBE_LOOP: &str = "A health check that depends on a remote dependency turns a dependency problem into a restart loop: instances that cannot reach it are killed, the rest take more load, and adding instances does not help until the check changes.";
const NO_LIMIT: &str = "A workload without a memory limit can take its node down with it, and its neighbours with it; a limit bounds what one container can take.";
const RETRY_STORM: &str = "Layers that retried at once and without a budget turned capacity failures into up to 48 extra attempts per failed request, and the shared routing layer ran out of memory.";
const NO_BYPASS: &str = "Internal workloads skipped the rate limits and overload controls external callers had, so their amplified retries reached shared infrastructure.";
const STAGES: &str = "A change applied without early stages that could catch it reached seven regions before it was noticed; staged deployment with automatic halt and a fast rollback bound the damage.";

/// Every rule, in the order docs/audit.md lists them.
pub static RULES: &[Rule] = &[
    Rule {
        id: "liveness-calls-dependency",
        severity: Severity::Critical,
        incident: "IL-0136",
        lesson: PROBE_LOOP,
        finds: "A liveness probe that reaches beyond its own process: another host, a database client, an inference request, or on spillway any path but /livez.",
        check: probes::liveness_calls_dependency,
    },
    Rule {
        id: "readiness-calls-dependency",
        severity: Severity::High,
        incident: "IL-0136",
        lesson: "Readiness that follows a shared dependency takes every instance out of service at once when that dependency fails, although they could serve from what they hold.",
        finds: "A readiness or startup probe that reaches another host, a database or an inference request, or spillway's /healthz/deps.",
        check: probes::readiness_calls_dependency,
    },
    Rule {
        id: "probe-cannot-pass",
        severity: Severity::Critical,
        incident: "IL-0136",
        lesson: PROBE_LOOP,
        finds: "A probe of a spillway container that can never pass: a port neither listener uses, a listener bound to loopback, HTTPS, or a path spillway does not answer there.",
        check: probes::probe_cannot_pass,
    },
    Rule {
        id: "probe-on-api-listener",
        severity: Severity::Medium,
        incident: "IL-0136",
        lesson: PROBE_LOOP,
        finds: "A probe of a spillway container on the API listener, which refuses connections past server.max_connections, instead of the admin listener.",
        check: probes::probe_on_api_listener,
    },
    Rule {
        id: "memory-limit-missing",
        severity: Severity::High,
        incident: "IL-0110",
        lesson: NO_LIMIT,
        finds: "A container (init containers included) without resources.limits.memory.",
        check: pods::memory_limit_missing,
    },
    Rule {
        id: "memory-limit-below-budget",
        severity: Severity::High,
        incident: "IL-0110",
        lesson: "spillway bounds its memory by its caps; a container limit below that bound lets load the caps allow end in an OOM kill instead of fast refusals.",
        finds: "A spillway container whose memory limit is below the memory budget of its config (MemoryBudget, docs/admission.md).",
        check: pods::memory_limit_below_budget,
    },
    Rule {
        id: "config-not-found",
        severity: Severity::Info,
        incident: "IL-0110",
        lesson: "A memory limit and a probe are right only against the config they serve: the budget and the listeners come from it.",
        finds: "A spillway container whose config is neither in a ConfigMap of the manifests nor given with --config, so its limit and probes were not checked against one.",
        check: pods::config_not_found,
    },
    Rule {
        id: "termination-grace-short",
        severity: Severity::High,
        incident: "IL-0136",
        lesson: "A deployment at peak is where the incident began; an instance killed before its requests finish drops them on callers, who resend them.",
        finds: "A spillway pod whose terminationGracePeriodSeconds is shorter than server.shutdown_delay + server.shutdown_grace + 5 s.",
        check: pods::termination_grace_short,
    },
    Rule {
        id: "shared-limits-undercounted",
        severity: Severity::Medium,
        incident: "IL-0248",
        lesson: NO_BYPASS,
        finds: "admission.instances lower than the most replicas that may run (spec.replicas, or the HPA's maxReplicas): while Redis is down the fleet allows more than each limit.",
        check: pods::shared_limits_undercounted,
    },
    Rule {
        id: "limits-not-shared",
        severity: Severity::Medium,
        incident: "IL-0248",
        lesson: NO_BYPASS,
        finds: "Tenants with rate or concurrency limits on several replicas without admission.redis: each instance allows the whole limit.",
        check: pods::limits_not_shared,
    },
    Rule {
        id: "rollout-all-at-once",
        severity: Severity::Medium,
        incident: "IL-0235",
        lesson: STAGES,
        finds: "A Deployment (of spillway or of an inference server) replaced all at once: strategy Recreate, or maxUnavailable of 100 % or every replica.",
        check: pods::rollout_all_at_once,
    },
    Rule {
        id: "retry-without-budget",
        severity: Severity::Critical,
        incident: "IL-0248",
        lesson: RETRY_STORM,
        finds: "retry.naive: every 5xx retried at once, with no budget, backoff, ejection or shedding.",
        check: config::retry_without_budget,
    },
    Rule {
        id: "retry-budget-loose",
        severity: Severity::Medium,
        incident: "IL-0248",
        lesson: RETRY_STORM,
        finds: "A retry budget that allows more than 20 % retries (budget_ratio, max_retrying_share above 0.5) or more than 10 retries a second regardless of traffic.",
        check: config::retry_budget_loose,
    },
    Rule {
        id: "client-retries-not-shed",
        severity: Severity::High,
        incident: "IL-0248",
        lesson: RETRY_STORM,
        finds: "Callers' own retries not shed while a pool fails: retry.shed_client_retries off, or no retry.client_retry_headers to recognise them.",
        check: config::client_retries_not_shed,
    },
    Rule {
        id: "throttling-off",
        severity: Severity::Medium,
        incident: "IL-0248",
        lesson: RETRY_STORM,
        finds: "retry.throttle_k = 0: callers who resend every failure as a new request reach failing backends unthrottled.",
        check: config::throttling_off,
    },
    Rule {
        id: "caps-unbounded",
        severity: Severity::Critical,
        incident: "IL-0248",
        lesson: "The routing layer ran out of memory under amplified traffic: queues, requests in flight and buffered bytes must each have a cap.",
        finds: "admission.naive: no global caps, no queue bounds, no tenant limits.",
        check: config::caps_unbounded,
    },
    Rule {
        id: "cache-unprotected",
        severity: Severity::Critical,
        incident: "IL-0136",
        lesson: "A cache flushed at peak, with lookups that bypassed it, sent about 20 times the load to the metadata backend until its connections ran out.",
        finds: "cache.naive: no single flight, no cap on store queries, no stale answers, flushes not spread.",
        check: config::cache_unprotected,
    },
    Rule {
        id: "tenant-without-limits",
        severity: Severity::High,
        incident: "IL-0248",
        lesson: NO_BYPASS,
        finds: "A tenant declared with none of requests_per_min, tokens_per_min and max_concurrency.",
        check: config::tenant_without_limits,
    },
    Rule {
        id: "critical-tenant-on-shared-pool",
        severity: Severity::High,
        incident: "IL-0248",
        lesson: "The internal workload that amplified its retries shared the routing infrastructure with every customer; it was isolated onto dedicated infrastructure.",
        finds: "A tenant at priority critical without a dedicated pool: its surge is served before every other tenant's requests on the shared backends.",
        check: config::critical_tenant_on_shared_pool,
    },
    Rule {
        id: "rollout-without-stages",
        severity: Severity::High,
        incident: "IL-0235",
        lesson: STAGES,
        finds: "A [models.rollout] with mode = \"replace\": the new backends take every request at once, compared with nothing.",
        check: config::rollout_without_stages,
    },
];
