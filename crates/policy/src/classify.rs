//! What an upstream outcome means, decided once and in one place.
//!
//! The IL-0248 storm began when capacity failures started to surface as generic server errors
//! and every layer above treated them as "transient, retry at once". Here every outcome of an
//! upstream attempt (a response, or the reason there was none) is put in exactly one class, and
//! everything downstream (retry, ejection, the concurrency limit, what the caller is told) reads
//! the class instead of re-deriving it from status codes:
//!
//! - `Capacity`: the backend says it is full (429, 503, the Anthropic API's 529, or a status
//!   configured as its own overload code). Retried only elsewhere; it shrinks that backend's
//!   concurrency limit.
//! - `Transient`: the request never got an answer (connection refused or reset before a byte,
//!   which the backend never processed), or a gateway error in front of the backend (502, 504),
//!   or a 500 from a backend marked retry-safe.
//! - `Timeout`: no response head within the response timeout. The backend may still be working
//!   on it, so it counts against the backend as overload.
//! - `UpstreamAuth`: 401 or 403 from the backend. The gateway checks the caller's key itself and
//!   sends the backend its own credential, so a backend refusing it says the gateway's
//!   credential for that backend is wrong or revoked, not that the caller is. Retried at once on
//!   another backend, whose credential may be good; it counts against the backend in outlier
//!   detection (the gateway cannot use it until its credential is fixed) but is no overload, so
//!   it leaves the concurrency limit alone.
//! - `ClientError`: any other 4xx. The same request would fail again anywhere: never retried.
//! - `ServerError`: any other 5xx (a 500 from a backend not marked retry-safe: a crash on this
//!   input is likely to repeat, and retrying it multiplies load for nothing).
//! - `Success`: everything below 400.
//!
//! The upstream's own pushback (`x-should-retry`, `Retry-After`, `retry-after-ms`) is read here
//! too, so it is honoured the same way for every backend kind.

use std::time::Duration;

/// How an upstream attempt ended, before interpretation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response head arrived with this status.
    Response(u16),
    /// No connection could be made (refused, unreachable, connect timeout): nothing was sent.
    ConnectFailed,
    /// The connection failed after sending and before any response byte.
    ResetBeforeResponse,
    /// No response head within the response timeout.
    TimedOut,
}

/// The class of an outcome; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Success,
    Capacity,
    Transient,
    Timeout,
    UpstreamAuth,
    ClientError,
    ServerError,
}

impl Class {
    /// A short stable name, for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Success => "success",
            Class::Capacity => "capacity",
            Class::Transient => "transient",
            Class::Timeout => "timeout",
            Class::UpstreamAuth => "upstream_auth",
            Class::ClientError => "client_error",
            Class::ServerError => "server_error",
        }
    }

    /// Whether the outcome says the backend cannot serve now (for outlier ejection). A client's
    /// bad request says nothing about the backend.
    pub fn is_backend_failure(self) -> bool {
        matches!(
            self,
            Class::Capacity
                | Class::Transient
                | Class::Timeout
                | Class::UpstreamAuth
                | Class::ServerError
        )
    }

    /// Whether the outcome says the backend is overloaded: it said it is full, or it did not
    /// answer in time. These alone cut its concurrency limit (see `concurrency`).
    pub fn is_overload(self) -> bool {
        matches!(self, Class::Capacity | Class::Timeout)
    }
}

/// What the upstream asked of retries, from its response headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pushback {
    /// `Retry-After` (seconds) or `retry-after-ms`, whichever is more precise.
    pub retry_after: Option<Duration>,
    /// `x-should-retry: true|false`.
    pub should_retry: Option<bool>,
}

/// The longest `Retry-After` taken from an upstream: a larger value is treated as this, so a
/// misconfigured backend cannot park the gateway's view of it for hours.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

impl Pushback {
    /// Reads the headers' values (`None` for absent headers). Unparsable values are ignored.
    pub fn parse(
        retry_after: Option<&str>,
        retry_after_ms: Option<&str>,
        should_retry: Option<&str>,
    ) -> Self {
        let ms = retry_after_ms
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map(|v| Duration::from_secs_f64((v / 1000.0).min(MAX_RETRY_AFTER.as_secs_f64())));
        // Only the delta-seconds form: an HTTP date needs a wall clock and backends send seconds.
        let secs = retry_after
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map(|v| Duration::from_secs_f64(v.min(MAX_RETRY_AFTER.as_secs_f64())));
        let should_retry = match should_retry.map(str::trim) {
            Some(v) if v.eq_ignore_ascii_case("true") => Some(true),
            Some(v) if v.eq_ignore_ascii_case("false") => Some(false),
            _ => None,
        };
        Pushback {
            retry_after: ms.or(secs),
            should_retry,
        }
    }
}

/// Which statuses mean what for one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// Statuses that mean "full": retried elsewhere, and they shrink the concurrency limit.
    pub capacity: Vec<u16>,
    /// Statuses that mean "did not get through": retried with backoff, preferably elsewhere.
    pub transient: Vec<u16>,
    /// Whether a 500 from this backend may be retried (it is known not to fail deterministically).
    pub retry_500: bool,
    /// Statuses that mean the backend refused the gateway's own credential for it.
    pub upstream_auth: Vec<u16>,
}

impl Rules {
    /// The classification of a gateway without protections, for replays that show what they
    /// prevent (the IL-0248 layers): every 5xx is worth another attempt, nothing is a capacity
    /// answer or a refused credential, and every other 4xx goes back to the caller.
    pub fn naive() -> Self {
        Rules {
            capacity: Vec::new(),
            transient: (500..=599).collect(),
            retry_500: true,
            upstream_auth: Vec::new(),
        }
    }
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            capacity: vec![429, 503, 529],
            transient: vec![502, 504],
            retry_500: false,
            upstream_auth: vec![401, 403],
        }
    }
}

/// The one classification of an outcome.
pub fn classify(outcome: Outcome, rules: &Rules) -> Class {
    match outcome {
        Outcome::ConnectFailed | Outcome::ResetBeforeResponse => Class::Transient,
        Outcome::TimedOut => Class::Timeout,
        Outcome::Response(status) => {
            if rules.capacity.contains(&status) {
                Class::Capacity
            } else if rules.transient.contains(&status) || (status == 500 && rules.retry_500) {
                Class::Transient
            } else if rules.upstream_auth.contains(&status) {
                Class::UpstreamAuth
            } else if status < 400 {
                Class::Success
            } else if status < 500 {
                Class::ClientError
            } else {
                Class::ServerError
            }
        }
    }
}

#[cfg(test)]
mod tests;
