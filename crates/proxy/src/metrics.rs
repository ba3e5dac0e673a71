//! What the request path reports to Prometheus, and the recorder behind `/metrics`.
//!
//! Label values come only from configuration (tenant, model and backend names) or from small fixed
//! sets (status, reason): a name a client made up is reported as `unknown`, so no caller can grow
//! the series count without bound.

use std::sync::OnceLock;
use std::time::Instant;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::pool::Models;
use crate::relay::{BodyEnd, EndObserver};

pub const REQUESTS: &str = "spillway_requests_total";
pub const REQUEST_DURATION: &str = "spillway_request_duration_seconds";
pub const UPSTREAM_HEADERS: &str = "spillway_upstream_response_seconds";
pub const UPSTREAM_ERRORS: &str = "spillway_upstream_errors_total";
pub const STREAMS_BROKEN: &str = "spillway_streams_broken_total";
pub const CLIENT_CANCELLED: &str = "spillway_client_cancelled_total";
pub const SPILLOVERS: &str = "spillway_spillovers_total";
pub const OUTSTANDING: &str = "spillway_backend_outstanding";

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// Installs the process-wide Prometheus recorder once and returns its handle.
pub fn recorder() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .expect("bucket list is not empty")
                .build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder is installed (embedding), in which case that one
            // receives the metrics and this handle renders an empty page.
            let _ = metrics::set_global_recorder(recorder);
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
    describe_gauge!(OUTSTANDING, "Requests in flight to a backend.");
}

/// Renders the page, refreshing the gauges that are read rather than pushed.
pub fn render(handle: &PrometheusHandle, models: &Models) -> String {
    for name in &models.names {
        if let Some(pool) = models.get(name) {
            for b in &pool.backends {
                gauge!(OUTSTANDING, "model" => name.clone(), "backend" => b.name.clone())
                    .set(b.outstanding() as f64);
            }
        }
    }
    handle.run_upkeep();
    handle.render()
}

/// The labels of one answered request.
#[derive(Debug, Clone)]
pub struct RequestLabels {
    pub tenant: String,
    pub model: String,
    pub backend: String,
}

impl RequestLabels {
    pub fn unrouted(tenant: Option<&str>, model: Option<&str>) -> Self {
        Self {
            tenant: tenant.unwrap_or("unknown").to_owned(),
            model: model.unwrap_or("unknown").to_owned(),
            backend: "none".to_owned(),
        }
    }

    pub fn answered(&self, status: u16) {
        counter!(REQUESTS, "tenant" => self.tenant.clone(), "model" => self.model.clone(),
            "backend" => self.backend.clone(), "status" => status.to_string())
        .increment(1);
    }

    pub fn upstream_error(&self, reason: &'static str) {
        counter!(UPSTREAM_ERRORS, "model" => self.model.clone(), "backend" => self.backend.clone(),
            "reason" => reason)
        .increment(1);
    }

    pub fn upstream_responded(&self, after: std::time::Duration) {
        histogram!(UPSTREAM_HEADERS, "model" => self.model.clone(), "backend" => self.backend.clone())
            .record(after.as_secs_f64());
    }

    pub fn spilled_over(&self) {
        counter!(SPILLOVERS, "model" => self.model.clone(), "backend" => self.backend.clone())
            .increment(1);
    }
}

/// Records the end of a relayed body.
pub struct BodyMetrics {
    pub labels: RequestLabels,
    pub started: Instant,
}

impl EndObserver for BodyMetrics {
    fn ended(&mut self, end: BodyEnd) {
        let l = &self.labels;
        histogram!(REQUEST_DURATION, "model" => l.model.clone(), "backend" => l.backend.clone())
            .record(self.started.elapsed().as_secs_f64());
        let broken = |reason: &'static str| {
            counter!(STREAMS_BROKEN, "model" => l.model.clone(), "backend" => l.backend.clone(),
                "reason" => reason)
            .increment(1)
        };
        match end {
            BodyEnd::Complete => {}
            BodyEnd::UpstreamBroke => broken("upstream_error"),
            BodyEnd::UpstreamStalled => broken("idle_timeout"),
            BodyEnd::ClientGone => {
                counter!(CLIENT_CANCELLED, "model" => l.model.clone(), "backend" => l.backend.clone())
                    .increment(1)
            }
        }
    }
}
