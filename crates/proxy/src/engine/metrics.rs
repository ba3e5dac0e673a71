//! The engine series on spillway's own `/metrics`: each backend's last reading, set when the page
//! is rendered, and the scrapes that failed, by reason.

use std::sync::Arc;
use std::time::Instant;

use metrics::{counter, gauge, Counter, Label};

use super::load::EngineLoad;

pub const RUNNING: &str = "spillway_engine_requests_running";
pub const WAITING: &str = "spillway_engine_requests_waiting";
pub const KV_USAGE: &str = "spillway_engine_kv_cache_usage";
pub const READING_AGE: &str = "spillway_engine_reading_age_seconds";
pub const SCRAPE_ERRORS: &str = "spillway_engine_scrape_errors_total";

pub(crate) fn describe() {
    use metrics::{describe_counter, describe_gauge, Unit};
    describe_gauge!(
        RUNNING,
        "Requests the backend's engine reported running, at its last reading."
    );
    describe_gauge!(
        WAITING,
        "Requests the backend's engine reported queued, at its last reading."
    );
    describe_gauge!(
        KV_USAGE,
        "Share of the engine's KV cache in use (0 to 1), at its last reading; only for engines that report it."
    );
    describe_gauge!(
        READING_AGE,
        Unit::Seconds,
        "Age of the engine's last reading; past engine_metrics.stale_after the engine counts as saturated."
    );
    describe_counter!(
        SCRAPE_ERRORS,
        "Scrapes of the engine's /metrics that gave no reading, by reason (connect, status, timeout, too_large, parse)."
    );
}

/// Sets the backend's engine gauges from its last reading; none before the first.
pub(crate) fn render(model: &Arc<str>, backend: &Arc<str>, engine: &EngineLoad, now: Instant) {
    let Some(reading) = engine.reading(now) else {
        return;
    };
    let labels = || {
        vec![
            Label::new("model", model.clone()),
            Label::new("backend", backend.clone()),
        ]
    };
    gauge!(RUNNING, labels()).set(f64::from(reading.running));
    gauge!(WAITING, labels()).set(f64::from(reading.waiting));
    if let Some(kv) = reading.kv_usage {
        gauge!(KV_USAGE, labels()).set(kv);
    }
    gauge!(READING_AGE, labels()).set(reading.age.as_secs_f64());
}

/// Why a scrape gave no reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Connect,
    Status,
    Timeout,
    TooLarge,
    Parse,
}

impl Reason {
    const ALL: [Reason; 5] = [
        Reason::Connect,
        Reason::Status,
        Reason::Timeout,
        Reason::TooLarge,
        Reason::Parse,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Connect => "connect",
            Reason::Status => "status",
            Reason::Timeout => "timeout",
            Reason::TooLarge => "too_large",
            Reason::Parse => "parse",
        }
    }
}

/// The error counters of every backend that reads one engine, registered once.
pub(crate) struct ScrapeErrors(Vec<[Counter; 5]>);

impl ScrapeErrors {
    pub(crate) fn new<'a>(
        backends: impl IntoIterator<Item = (&'a Arc<str>, &'a Arc<str>)>,
    ) -> Self {
        crate::metrics::recorder();
        Self(
            backends
                .into_iter()
                .map(|(model, backend)| {
                    Reason::ALL.map(|r| {
                        counter!(SCRAPE_ERRORS, "model" => model.clone(), "backend" => backend.clone(), "reason" => r.as_str())
                    })
                })
                .collect(),
        )
    }

    pub(crate) fn count(&self, reason: Reason) {
        for counters in &self.0 {
            counters[reason as usize].increment(1);
        }
    }
}
