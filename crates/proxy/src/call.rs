//! The one value a request is on its path, `Call`: built once by the read stage
//! (`handler/read.rs`) and handed to each stage after it (admission, the attempt loop, the
//! response), like pingora's one context handed to every phase, so no stage reaches back into
//! another's locals.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use spillway_policy::Priority;

use crate::admission::gate::Entered;
use crate::auth::Tenant;
use crate::metrics::RequestLabels;
use crate::pool::{Endpoint, ModelPool, ThrottlePass};
use crate::request::{BodyHold, RequestSummary};

/// The header that carries a request's id, to the backend and back to the caller.
pub(crate) const X_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");

/// One request, as every stage of its path sees it.
pub(crate) struct Call {
    /// `x-request-id`: the caller's, or one made for it.
    pub id: Option<HeaderValue>,
    pub endpoint: Endpoint,
    pub started: Instant,
    /// No attempt starts after this (`retry.deadline` from `started`).
    pub deadline: Instant,
    pub tenant: Arc<Tenant>,
    /// Its headers as they travel upstream (`upstream::outbound_headers`).
    pub headers: HeaderMap,
    pub body: Bytes,
    pub summary: RequestSummary,
    pub pool: Arc<ModelPool>,
    /// The region whose backends are tried first.
    pub region: Option<Arc<str>>,
    /// The class it is scheduled in: its tenant's, or lower if it asked.
    pub priority: Priority,
    /// Its affinity key, if its model balances by affinity.
    pub affinity_key: Option<u64>,
    /// The caller marked it as its own retry.
    pub client_retry: bool,
    /// Its labels in `spillway_requests_total`, filled in as it goes.
    pub labels: RequestLabels,
    /// Its pass through the model's adaptive throttling, once admitted.
    pub throttle_pass: Option<ThrottlePass>,
    /// Its places in the in-flight counts, taken at its head, until admission takes them over.
    pub entered: Option<Entered>,
    /// Its body's bytes in the body budget, held (not read) as long as the body is.
    pub _body_hold: Option<BodyHold>,
}
