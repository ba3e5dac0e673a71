//! Admission's metric names and where they are recorded: what was admitted and refused, by
//! tenant, class and reason; tokens reserved against what backends reported; and the global
//! caps against their use.

use std::sync::Arc;

use metrics::{counter, describe_counter, describe_gauge, gauge, histogram, Counter, Histogram};
use spillway_policy::Priority;

/// Counter, labels `tenant`, `class`, `outcome`: `admitted`, `gateway_overloaded`,
/// `concurrency_limited`, `rate_limited_requests`, `rate_limited_tokens`, `tokens_over_limit`.
pub const ADMISSIONS: &str = "spillway_admissions_total";
/// Counter, label `tenant`: tokens reserved at admission (estimates).
pub const TOKENS_RESERVED: &str = "spillway_tokens_reserved_total";
/// Counter, label `tenant`: tokens backends reported (or streamed, when they reported none).
pub const TOKENS_REPORTED: &str = "spillway_tokens_reported_total";
/// Gauges: requests admitted and not finished, and the cap.
pub const IN_FLIGHT: &str = "spillway_requests_in_flight";
pub const IN_FLIGHT_MAX: &str = "spillway_requests_in_flight_max";
/// Gauges: open client connections on the API listener, and the cap.
pub const CONNECTIONS: &str = "spillway_client_connections";
pub const CONNECTIONS_MAX: &str = "spillway_client_connections_max";
/// Counter, labels `listener` (`api`, `admin`), `reason`: client connections the gateway
/// closed itself, `over_capacity` (refused at accept), `idle_timeout`, `header_read_timeout`,
/// `malformed_head` (a head that could not be read, answered and closed).
pub const CONNECTIONS_CLOSED: &str = "spillway_client_connections_closed_total";
/// Gauges: request body bytes being read or held, and the cap.
pub const BUFFERED_BYTES: &str = "spillway_buffered_body_bytes";
pub const BUFFERED_BYTES_MAX: &str = "spillway_buffered_body_bytes_max";
/// Gauge: 1 while the Redis holding shared tenant limits answers, 0 while it does not.
pub const SHARED_UP: &str = "spillway_shared_limits_up";
/// Counter: admissions decided locally (with this instance's share of the limits) because
/// Redis did not answer.
pub const SHARED_FALLBACKS: &str = "spillway_shared_limits_fallbacks_total";
/// Histogram, labels `tenant`, `class`: how long admitted requests waited for a seat.
pub const QUEUE_WAIT: &str = "spillway_queue_wait_seconds";
/// Gauge, labels `model`, `class`: requests waiting for a seat.
pub const QUEUED: &str = "spillway_queued_requests";
/// Gauges, label `model`: seats in use, and seats (the backends' concurrency limits together).
pub const SEATS_IN_USE: &str = "spillway_pool_seats_in_use";
pub const SEATS: &str = "spillway_pool_seats";

pub(crate) fn describe() {
    describe_counter!(
        ADMISSIONS,
        "Admission decisions, by tenant, priority class and outcome."
    );
    describe_counter!(TOKENS_RESERVED, "Tokens reserved at admission (estimates).");
    describe_counter!(
        TOKENS_REPORTED,
        "Tokens backends reported for admitted requests."
    );
    describe_gauge!(IN_FLIGHT, "Requests admitted and not yet finished.");
    describe_gauge!(IN_FLIGHT_MAX, "The cap on requests in flight.");
    describe_gauge!(BUFFERED_BYTES, "Request body bytes being read or held.");
    describe_gauge!(
        BUFFERED_BYTES_MAX,
        "The cap on buffered request body bytes."
    );
    metrics::describe_histogram!(
        QUEUE_WAIT,
        metrics::Unit::Seconds,
        "Time admitted requests waited for a seat in their pool."
    );
    describe_gauge!(QUEUED, "Requests waiting for a seat, by model and class.");
    describe_gauge!(SEATS_IN_USE, "Seats in use in a model's pool.");
    describe_gauge!(SEATS, "Seats in a model's pool.");
    describe_gauge!(
        SHARED_UP,
        "1 while the Redis of shared tenant limits answers."
    );
    describe_counter!(
        SHARED_FALLBACKS,
        "Admissions decided locally, with this instance's share, because Redis did not answer."
    );
    describe_gauge!(CONNECTIONS, "Open client connections on the API listener.");
    describe_gauge!(CONNECTIONS_MAX, "The cap on open client connections.");
    describe_counter!(
        CONNECTIONS_CLOSED,
        "Client connections closed by the gateway: refused over the cap, or timed out."
    );
}

pub(crate) fn connection_closed(listener: &'static str, reason: &'static str) {
    counter!(CONNECTIONS_CLOSED, "listener" => listener, "reason" => reason).increment(1);
}

pub(crate) fn admission(tenant: &str, class: Priority, outcome: &'static str) {
    counter!(ADMISSIONS, "tenant" => tenant.to_owned(), "class" => class.as_str(), "outcome" => outcome)
        .increment(1);
}

/// A tenant's series recorded on every admitted request, registered once per tenant.
pub(crate) struct TenantSeries {
    class: Priority,
    admitted: Counter,
    queue_wait: Histogram,
    tokens_reserved: Counter,
    pub(crate) tokens_reported: Counter,
}

impl TenantSeries {
    pub(crate) fn new(tenant: &str, class: Priority) -> TenantSeries {
        let t = tenant.to_owned();
        TenantSeries {
            class,
            admitted: counter!(ADMISSIONS, "tenant" => t.clone(), "class" => class.as_str(), "outcome" => "admitted"),
            queue_wait: histogram!(QUEUE_WAIT, "tenant" => t.clone(), "class" => class.as_str()),
            tokens_reserved: counter!(TOKENS_RESERVED, "tenant" => t.clone()),
            tokens_reported: counter!(TOKENS_REPORTED, "tenant" => t),
        }
    }

    /// An admission of the tenant, now in `class` (a class changed since registration is
    /// recorded by labels).
    pub(crate) fn admitted(&self, tenant: &str, class: Priority, tokens: u64) {
        if class == self.class {
            self.admitted.increment(1);
        } else {
            admission(tenant, class, "admitted");
        }
        self.tokens_reserved.increment(tokens);
    }

    /// How long one of the tenant's requests waited for a seat, in `class`.
    pub(crate) fn queue_wait(&self, tenant: &str, class: Priority, waited: std::time::Duration) {
        if class == self.class {
            self.queue_wait.record(waited.as_secs_f64());
        } else {
            queue_wait(tenant, class, waited);
        }
    }
}

/// Sets the cap gauges when `/metrics` is rendered.
pub(crate) fn caps(in_flight: (usize, usize), buffered: (u64, u64)) {
    gauge!(IN_FLIGHT).set(in_flight.0 as f64);
    gauge!(IN_FLIGHT_MAX).set(in_flight.1 as f64);
    gauge!(BUFFERED_BYTES).set(buffered.0 as f64);
    gauge!(BUFFERED_BYTES_MAX).set(buffered.1 as f64);
}

fn queue_wait(tenant: &str, class: Priority, waited: std::time::Duration) {
    histogram!(QUEUE_WAIT, "tenant" => tenant.to_owned(), "class" => class.as_str())
        .record(waited.as_secs_f64());
}

/// One queue's figures, for the gauges.
pub(crate) struct QueueFigures {
    pub model: Arc<str>,
    pub bulkhead: Option<Arc<str>>,
    /// Waiting, by class: critical, standard, batch.
    pub queued: [usize; 3],
    pub in_use: usize,
    pub seats: usize,
}

/// Sets the queue gauges when `/metrics` is rendered; the shared backends' pool is `shared`.
pub(crate) fn queues(figures: &[QueueFigures]) {
    for f in figures {
        let model = f.model.to_string();
        let pool = f.bulkhead.as_deref().unwrap_or("shared").to_owned();
        for (class, n) in Priority::ALL.iter().zip(f.queued) {
            gauge!(QUEUED, "model" => model.clone(), "pool" => pool.clone(), "class" => class.as_str())
                .set(n as f64);
        }
        gauge!(SEATS_IN_USE, "model" => model.clone(), "pool" => pool.clone()).set(f.in_use as f64);
        gauge!(SEATS, "model" => model, "pool" => pool).set(f.seats as f64);
    }
}

pub(crate) fn shared_up(up: bool) {
    gauge!(SHARED_UP).set(if up { 1.0 } else { 0.0 });
}

pub(crate) fn shared_fallback() {
    counter!(SHARED_FALLBACKS).increment(1);
}

pub(crate) fn connections(open: usize, max: usize) {
    gauge!(CONNECTIONS).set(open as f64);
    gauge!(CONNECTIONS_MAX).set(max as f64);
}
