//! The simulated backend's profile: capacity, latency and faults.
//!
//! It lives in the config crate because a `kind = "mock"` backend in a gateway config and the
//! standalone `spillway mock-backend` process are the same server with the same knobs; keeping one
//! type means a replay or a test can describe a backend once and run it either way.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a simulated inference server behaves. Every field has a default, so `MockProfile::default()`
/// is a healthy, fast server for model `mock-small`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MockProfile {
    /// Model names the server answers for; any other model gets a 404 like a real server.
    pub models: Vec<String>,
    /// Requests generated at once; further requests wait in the queue.
    pub capacity: u32,
    /// Requests allowed to wait for a generation slot; beyond it the server answers 429.
    pub queue: u32,
    /// Time to first token once a generation slot is held.
    #[serde(with = "humantime_serde")]
    pub ttft: Duration,
    /// Output tokens per second per request after the first token; 0 means no delay between tokens.
    pub tokens_per_sec: f64,
    /// Output tokens when the request does not set `max_tokens` (or sets more).
    pub max_output_tokens: u32,
    /// Length of the vectors `/v1/embeddings` returns.
    pub embedding_dim: u32,
    /// Injected failures.
    pub fault: MockFault,
}

/// Failures a simulated server injects. Rates are probabilities in `[0, 1]`, drawn per request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MockFault {
    /// Share of requests answered with `error_status` instead of being served.
    pub error_rate: f64,
    /// Status of injected errors (e.g. 500, 503, 429).
    pub error_status: u16,
    /// `Retry-After` sent with injected errors, if any (whole seconds on the wire).
    #[serde(with = "humantime_serde")]
    pub retry_after: Option<Duration>,
    /// Share of requests that hang before the first byte for `stall`.
    pub stall_rate: f64,
    /// How long a stalled request hangs before it is served normally.
    #[serde(with = "humantime_serde")]
    pub stall: Duration,
    /// Share of requests whose connection is reset before any response byte.
    pub reset_rate: f64,
    /// Break every streamed response off after this many chunks (no `[DONE]`, connection dropped).
    pub break_stream_after: Option<u32>,
}

impl Default for MockProfile {
    fn default() -> Self {
        Self {
            models: vec!["mock-small".to_owned()],
            capacity: 64,
            queue: 256,
            ttft: Duration::from_millis(20),
            tokens_per_sec: 200.0,
            max_output_tokens: 16,
            embedding_dim: 16,
            fault: MockFault::default(),
        }
    }
}

impl Default for MockFault {
    fn default() -> Self {
        Self {
            error_rate: 0.0,
            error_status: 500,
            retry_after: None,
            stall_rate: 0.0,
            stall: Duration::from_secs(30),
            reset_rate: 0.0,
            break_stream_after: None,
        }
    }
}

impl MockProfile {
    /// The problems with this profile, each as (field, message); empty when it is usable.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.models.is_empty() || self.models.iter().any(|m| m.trim().is_empty()) {
            out.push((
                "models",
                "needs at least one non-empty model name".to_owned(),
            ));
        }
        if self.capacity == 0 {
            out.push(("capacity", "must be at least 1".to_owned()));
        }
        if !(self.tokens_per_sec.is_finite() && self.tokens_per_sec >= 0.0) {
            out.push(("tokens_per_sec", "must be a finite number >= 0".to_owned()));
        }
        for (field, rate) in [
            ("fault.error_rate", self.fault.error_rate),
            ("fault.stall_rate", self.fault.stall_rate),
            ("fault.reset_rate", self.fault.reset_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                out.push((field, format!("must be between 0 and 1, got {rate}")));
            }
        }
        if !(400..=599).contains(&self.fault.error_status) {
            out.push((
                "fault.error_status",
                format!(
                    "must be a 4xx or 5xx status, got {}",
                    self.fault.error_status
                ),
            ));
        }
        out
    }
}
