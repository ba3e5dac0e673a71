//! What the request path reports to Prometheus, and the recorder behind `/metrics`.
//!
//! Label values come only from configuration (tenant, model and backend names) or from small fixed
//! sets (status, reason): a name a client made up is reported as `unknown`, so no caller can grow
//! the series count without bound.

use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram, Label};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::histograms::{Kept, MetricsHandle, SplitRecorder};

mod series;

use spillway_policy::{AffinityOutcome, Class, Refusal};

pub const REQUESTS: &str = "spillway_requests_total";
pub const REQUEST_DURATION: &str = "spillway_request_duration_seconds";
pub const UPSTREAM_HEADERS: &str = "spillway_upstream_response_seconds";
pub const UPSTREAM_ERRORS: &str = "spillway_upstream_errors_total";
pub const STREAMS_BROKEN: &str = "spillway_streams_broken_total";
pub const CLIENT_CANCELLED: &str = "spillway_client_cancelled_total";
pub const SPILLOVERS: &str = "spillway_spillovers_total";
pub const OUTSTANDING: &str = "spillway_backend_outstanding";
pub const CONCURRENCY_LIMIT: &str = "spillway_backend_concurrency_limit";
pub const EJECTED: &str = "spillway_backend_ejected";
pub const EJECTIONS: &str = "spillway_ejections_total";
pub const ATTEMPTS: &str = "spillway_attempts_per_request";
pub const UPSTREAM_ATTEMPTS: &str = "spillway_upstream_attempts_total";
pub const RETRIES: &str = "spillway_retries_total";
pub const BUDGET_EXHAUSTED: &str = "spillway_retry_budget_exhausted_total";
pub const FALLBACKS: &str = "spillway_fallbacks_total";
pub const AFFINITY: &str = "spillway_affinity_total";
pub const THROTTLED: &str = "spillway_throttled_total";
pub const CLIENT_RETRIES: &str = "spillway_client_retries_total";
pub const CLIENT_RETRIES_SHED: &str = "spillway_client_retries_shed_total";
pub const STORE_POOL_CONNECTIONS: &str = "spillway_store_pool_connections";
pub const STORE_POOL_MAX: &str = "spillway_store_pool_max_connections";
pub const STORE_POOL_WAITERS: &str = "spillway_store_pool_waiters";
pub const STORE_POOL_TIMEOUTS: &str = "spillway_store_pool_acquire_timeouts_total";
pub const RESIDENT_MEMORY: &str = "spillway_process_resident_memory_bytes";
pub const MEMORY_BUDGET: &str = "spillway_memory_budget_bytes";
pub const MEMORY_LIMIT: &str = "spillway_memory_limit_bytes";

pub(crate) const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// Installs the process-wide recorder once and returns its handle: counters, and histograms
/// with buckets counted as they are recorded, kept per thread (`crate::histograms`); gauges the
/// Prometheus exporter's.
pub fn recorder() -> MetricsHandle {
    static HANDLE: OnceLock<MetricsHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let full = |name: &str| Matcher::Full(name.to_owned());
            // Names before suffixes, as the exporter matched them.
            let kept = Arc::new(Kept::new(vec![
                (
                    full(spillway_directory::metrics::KEY_LOOKUP_SECONDS),
                    spillway_directory::metrics::KEY_LOOKUP_BUCKETS,
                ),
                (full(ATTEMPTS), &[1.0, 2.0, 3.0, 4.0, 5.0]),
                (
                    full(crate::genai::REQUEST_DURATION),
                    crate::genai::DURATION_BUCKETS,
                ),
                (
                    full(crate::genai::TIME_TO_FIRST_TOKEN),
                    crate::genai::FIRST_TOKEN_BUCKETS,
                ),
                (
                    full(crate::genai::TIME_PER_OUTPUT_TOKEN),
                    crate::genai::PER_TOKEN_BUCKETS,
                ),
                (full(crate::genai::TOKEN_USAGE), crate::genai::TOKEN_BUCKETS),
                (Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS),
            ]));
            let exporter = PrometheusBuilder::new().build_recorder();
            let handle = MetricsHandle {
                exporter: exporter.handle(),
                kept: Arc::clone(&kept),
            };
            // Fails only if another recorder is installed (embedding), in which case that one
            // receives the metrics and this handle renders an empty page.
            let _ = metrics::set_global_recorder(SplitRecorder {
                kept,
                exporter,
                folding: std::sync::Once::new(),
            });
            describe();
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        REQUESTS,
        "Client requests answered, by tenant, model, backend and status."
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Time from request to the end of the response body."
    );
    describe_histogram!(
        UPSTREAM_HEADERS,
        Unit::Seconds,
        "Time from sending upstream to the response head."
    );
    describe_counter!(
        UPSTREAM_ERRORS,
        "Upstream attempts that failed without a response, by reason."
    );
    describe_counter!(
        STREAMS_BROKEN,
        "Responses whose upstream body broke off or stalled mid-way."
    );
    describe_counter!(
        CLIENT_CANCELLED,
        "Responses abandoned by the client before their end."
    );
    describe_counter!(SPILLOVERS, "Requests served outside the preferred region.");
    spillway_directory::metrics::describe();
    describe_gauge!(OUTSTANDING, "Requests in flight to a backend.");
    describe_gauge!(
        STORE_POOL_CONNECTIONS,
        "The store's pooled connections, by state."
    );
    describe_gauge!(STORE_POOL_MAX, "The store's connection pool size limit.");
    describe_gauge!(
        RESIDENT_MEMORY,
        Unit::Bytes,
        "The gateway process's resident memory (VmRSS)."
    );
    describe_gauge!(
        MEMORY_BUDGET,
        Unit::Bytes,
        "The most memory the config's caps allow (docs/admission.md): a container limit below it can be reached."
    );
    describe_gauge!(
        MEMORY_LIMIT,
        Unit::Bytes,
        "The memory limit of the process's cgroup (the container's), when it has one."
    );
    describe_gauge!(
        STORE_POOL_WAITERS,
        "Store queries waiting for a connection."
    );
    describe_counter!(
        STORE_POOL_TIMEOUTS,
        "Store queries that gave up waiting for a pooled connection."
    );
    describe_histogram!(
        spillway_store::POOL_ACQUIRE_SECONDS,
        metrics::Unit::Seconds,
        "Time store queries waited for a pooled connection."
    );
    describe_gauge!(
        CONCURRENCY_LIMIT,
        "A backend's current (adaptive) concurrency limit."
    );
    describe_gauge!(EJECTED, "1 while a backend is ejected or probing, else 0.");
    describe_counter!(
        EJECTIONS,
        "Backends ejected by outlier detection or health checks."
    );
    describe_histogram!(ATTEMPTS, "Upstream attempts per client request.");
    describe_counter!(
        UPSTREAM_ATTEMPTS,
        "Upstream attempts, by model and tenant: divided by spillway_requests_total, the retry amplification."
    );
    describe_counter!(
        RETRIES,
        "Retries spillway made, by the class of the failure retried."
    );
    describe_counter!(
        BUDGET_EXHAUSTED,
        "Retries the model's retry budget refused, by reason: rate_spent (retries over the window reached the ratio plus the floor) or too_many_retrying (too many requests retrying at once)."
    );
    describe_counter!(
        THROTTLED,
        "Requests refused by adaptive throttling while the model's backends were failing, before reaching any backend."
    );
    describe_counter!(
        AFFINITY,
        "Requests of affinity-balanced models by outcome: hit (placed on the backend their prefix or session maps to) or overflow (that backend was over its load bound or could not take it)."
    );
    describe_counter!(
        CLIENT_RETRIES,
        "Requests that callers marked as their own retries, by tenant."
    );
    describe_counter!(
        CLIENT_RETRIES_SHED,
        "Callers' retries refused while the model's backends were failing."
    );
    describe_counter!(
        FALLBACKS,
        "Requests moved to a fallback model, by their own model, the fallback and the trigger."
    );
}

/// Why an upstream attempt produced no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFailure {
    Connect,
    Connection,
    Timeout,
    /// A pooled connection the backend had closed; the request was sent again on a new one.
    StaleConnection,
}

impl UpstreamFailure {
    const ALL: [UpstreamFailure; 4] = [
        Self::Connect,
        Self::Connection,
        Self::Timeout,
        Self::StaleConnection,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Connection => "connection",
            Self::Timeout => "timeout",
            Self::StaleConnection => "stale_connection",
        }
    }
}

/// One backend's series, registered when its pool is built, so that recording on the request
/// path is an atomic add rather than a label set built, hashed and looked up.
pub struct BackendMetrics {
    upstream_headers: Histogram,
    request_duration: Histogram,
    spillovers: Counter,
    upstream_errors: [Counter; 4],
    upstream_broke: Counter,
    upstream_stalled: Counter,
    client_cancelled: Counter,
    outstanding: Gauge,
    limit: Gauge,
    ejected: Gauge,
    ejections: Counter,
}

impl BackendMetrics {
    pub fn new(model: &Arc<str>, backend: &Arc<str>) -> Self {
        recorder(); // handles taken before the recorder is installed would record nowhere
        let pair = || {
            vec![
                Label::new("model", model.clone()),
                Label::new("backend", backend.clone()),
            ]
        };
        let with = |reason: &'static str| {
            let mut labels = pair();
            labels.push(Label::new("reason", reason));
            labels
        };
        Self {
            upstream_headers: histogram!(UPSTREAM_HEADERS, pair()),
            request_duration: histogram!(REQUEST_DURATION, pair()),
            spillovers: counter!(SPILLOVERS, pair()),
            upstream_errors: UpstreamFailure::ALL
                .map(|f| counter!(UPSTREAM_ERRORS, with(f.label()))),
            upstream_broke: counter!(STREAMS_BROKEN, with("upstream_error")),
            upstream_stalled: counter!(STREAMS_BROKEN, with("idle_timeout")),
            client_cancelled: counter!(CLIENT_CANCELLED, pair()),
            outstanding: gauge!(OUTSTANDING, pair()),
            limit: gauge!(CONCURRENCY_LIMIT, pair()),
            ejected: gauge!(EJECTED, pair()),
            ejections: counter!(EJECTIONS, pair()),
        }
    }

    pub fn ejected(&self) {
        self.ejections.increment(1);
    }

    pub fn upstream_failed(&self, why: UpstreamFailure) {
        self.upstream_errors[why as usize].increment(1);
    }

    pub fn upstream_responded(&self, after: Duration) {
        self.upstream_headers.record(after.as_secs_f64());
    }

    pub fn spilled_over(&self) {
        self.spillovers.increment(1);
    }

    /// A relayed body ended after `took` since its request arrived.
    pub fn body_ended(&self, took: Duration) {
        self.request_duration.record(took.as_secs_f64());
    }

    /// A relayed body broke off upstream: with an error, or `stalled` past the idle timeout.
    pub fn stream_broke(&self, stalled: bool) {
        if stalled {
            self.upstream_stalled.increment(1);
        } else {
            self.upstream_broke.increment(1);
        }
    }

    /// The client went away before the end of its response.
    pub fn client_cancelled(&self) {
        self.client_cancelled.increment(1);
    }

    /// The gauges read rather than pushed, set when the page is rendered.
    pub fn read_gauges(&self, outstanding: u32, limit: u32, ejected: bool) {
        self.outstanding.set(f64::from(outstanding));
        self.limit.set(f64::from(limit));
        self.ejected.set(if ejected { 1.0 } else { 0.0 });
    }
}

impl std::fmt::Debug for BackendMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BackendMetrics")
    }
}

fn label_value(text: &'static str) -> Arc<str> {
    Arc::from(text)
}

static UNKNOWN: LazyLock<Arc<str>> = LazyLock::new(|| label_value("unknown"));
static NO_BACKEND: LazyLock<Arc<str>> = LazyLock::new(|| label_value("none"));

/// The labels of one answered request, filled in as the request is routed: a label not known
/// (yet) is `unknown`, a backend `none`. Unknown ones are no string of their own, so labels are
/// made, moved out of a reader (`std::mem::take`) and dropped without a reference count touched;
/// a request's labels take one per name it is given, not three. (A request the inference
/// handler reads into a `Call` is labelled from its call instead, [`Labels`] borrowed from the
/// tenant and the pool it holds: these are filled in only if it is refused before.)
#[derive(Debug, Default)]
pub struct RequestLabels {
    pub tenant: Option<Arc<str>>,
    pub model: Option<Arc<str>>,
    pub backend: Option<Arc<str>>,
}

impl RequestLabels {
    pub fn unrouted() -> Self {
        Self::default()
    }

    /// What they say, borrowed.
    pub fn view(&self) -> Labels<'_> {
        Labels::new(
            self.tenant.as_ref(),
            self.model.as_ref(),
            self.backend.as_ref(),
        )
    }

    pub fn answered(self, status: u16) {
        self.view().answered(status);
    }
}

/// A request's labels, borrowed from the strings that name its tenant, model and backend (a
/// label not known is `unknown`, a backend `none`): counted in without a reference count taken.
#[derive(Debug, Clone, Copy)]
pub struct Labels<'a> {
    tenant: &'a Arc<str>,
    model: &'a Arc<str>,
    backend: &'a Arc<str>,
}

impl<'a> Labels<'a> {
    pub fn new(
        tenant: Option<&'a Arc<str>>,
        model: Option<&'a Arc<str>>,
        backend: Option<&'a Arc<str>>,
    ) -> Self {
        Labels {
            tenant: tenant.unwrap_or(&UNKNOWN),
            model: model.unwrap_or(&UNKNOWN),
            backend: backend.unwrap_or(&NO_BACKEND),
        }
    }

    pub fn model(self) -> &'a Arc<str> {
        self.model
    }

    /// The request was answered with `status`.
    pub fn answered(self, status: u16) {
        let labels = [self.tenant, self.model, self.backend];
        series::count(REQUESTS, labels, status, 1, |k| {
            counter!(REQUESTS, "tenant" => k.1.clone(), "model" => k.2.clone(),
                "backend" => k.3.clone(), "status" => status.to_string())
        });
    }

    /// Upstream attempts made for this request (all of them, at its end).
    pub fn attempted(self, attempts: u32) {
        let labels = [self.tenant, self.model, &*NO_BACKEND];
        series::count(
            UPSTREAM_ATTEMPTS,
            labels,
            0,
            u64::from(attempts),
            |k| counter!(UPSTREAM_ATTEMPTS, "tenant" => k.1.clone(), "model" => k.2.clone()),
        );
    }

    /// The caller marked this request as its own retry; `shed` when it was refused for it.
    pub fn client_retry(self, shed: bool) {
        let name = if shed {
            CLIENT_RETRIES_SHED
        } else {
            CLIENT_RETRIES
        };
        let labels = [self.tenant, self.model, &*NO_BACKEND];
        series::count(
            name,
            labels,
            0,
            1,
            |k| counter!(name, "tenant" => k.1.clone(), "model" => k.2.clone()),
        );
    }
}

/// One model's retry series, registered when its pool is built.
pub struct PoolMetrics {
    model: Arc<str>,
    attempts: Histogram,
    retries: [Counter; 5],
    budget_exhausted: [Counter; 2],
    affinity: [Counter; 2],
    throttled: Counter,
}

impl PoolMetrics {
    const RETRIED: [Class; 5] = [
        Class::Capacity,
        Class::Transient,
        Class::Timeout,
        Class::ServerError,
        Class::UpstreamAuth,
    ];
    const REFUSALS: [Refusal; 2] = [Refusal::RateSpent, Refusal::TooManyRetrying];
    const AFFINITY: [AffinityOutcome; 2] = [AffinityOutcome::Hit, AffinityOutcome::Overflow];

    pub fn new(model: &Arc<str>) -> Self {
        recorder();
        let m = || vec![Label::new("model", model.clone())];
        Self {
            model: model.clone(),
            attempts: histogram!(ATTEMPTS, m()),
            retries: Self::RETRIED.map(|c| {
                let mut labels = m();
                labels.push(Label::new("reason", c.as_str()));
                counter!(RETRIES, labels)
            }),
            budget_exhausted: Self::REFUSALS.map(|r| {
                let mut labels = m();
                labels.push(Label::new("reason", r.as_str()));
                counter!(BUDGET_EXHAUSTED, labels)
            }),
            throttled: counter!(THROTTLED, m()),
            affinity: Self::AFFINITY.map(|a| {
                let mut labels = m();
                labels.push(Label::new("outcome", a.as_str()));
                counter!(AFFINITY, labels)
            }),
        }
    }

    pub fn attempts(&self, n: u32) {
        self.attempts.record(f64::from(n));
    }

    pub fn retried(&self, class: Class) {
        if let Some(i) = Self::RETRIED.iter().position(|c| *c == class) {
            self.retries[i].increment(1);
        }
    }

    pub fn throttled(&self) {
        self.throttled.increment(1);
    }

    /// A request of this model moved on to the fallback model `to` after `trigger` (rare: the
    /// series is looked up when it happens).
    pub fn fell_back(&self, to: &str, trigger: spillway_policy::Trigger) {
        counter!(FALLBACKS, "model" => self.model.to_string(), "to" => to.to_owned(), "trigger" => trigger.as_str())
            .increment(1);
    }

    pub fn budget_exhausted(&self, why: Refusal) {
        if let Some(i) = Self::REFUSALS.iter().position(|r| *r == why) {
            self.budget_exhausted[i].increment(1);
        }
    }

    /// A request of an affinity-balanced model was placed: on its key's backend, or elsewhere
    /// because that one was over its load bound or could not take it.
    pub fn affinity(&self, outcome: AffinityOutcome) {
        if let Some(i) = Self::AFFINITY.iter().position(|a| *a == outcome) {
            self.affinity[i].increment(1);
        }
    }
}

impl std::fmt::Debug for PoolMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolMetrics")
    }
}

#[cfg(test)]
mod tests {
    /// The names of this process's threads.
    fn threads() -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_owned())
            .collect()
    }

    /// Histograms with buckets keep no samples; one without buckets is the exporter's, whose
    /// samples are then folded on a thread of its own, off the request path's.
    #[test]
    fn a_histogram_without_buckets_has_its_samples_folded_on_a_thread_of_its_own() {
        let _ = super::recorder();
        metrics::histogram!("spillway_test_unbucketed").record(1.0);
        // A thread takes its name once it runs, a moment after it is spawned.
        spillway_testkit::eventually_blocking(
            std::time::Duration::from_secs(10),
            "a thread named spillway-fold",
            || threads().iter().any(|t| t == "spillway-fold"),
        );
    }
}
