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
    /// Prompt tokens per second a request prefills before its first token: the time to first
    /// token becomes `ttft + uncached prompt tokens / prefill_tokens_per_sec` (an embeddings
    /// request prefills its whole input before it is answered). 0 means prefill is free, so the
    /// first token comes after `ttft` whatever the prompt.
    pub prefill_tokens_per_sec: f64,
    /// Tokens the simulated KV cache holds; `/metrics` reports the share of it that running
    /// requests take (prompt plus the output they will generate). It reports load and limits
    /// nothing: admission is by `capacity` and `queue` alone.
    pub kv_cache_tokens: u32,
    /// Prompt blocks the prefix cache remembers, least recently used evicted first; 0 turns the
    /// cache off, so every prompt prefills whole.
    pub prefix_cache_entries: u32,
    /// Characters per prefix-cache block (1024 is about 256 tokens). A prompt is cached up to the
    /// last block it shares with a prompt this server served recently, as in vLLM's automatic
    /// prefix caching; an exact repeat is cached whole.
    pub prefix_chars: u32,
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
    /// Answer every `GET /metrics` with this status instead of the metrics.
    pub metrics_error_status: Option<u16>,
    /// Hang this long before answering each `GET /metrics`.
    #[serde(with = "humantime_serde")]
    pub metrics_stall: Option<Duration>,
    /// Answer 400 `unsupported_parameter` to every inference request whose JSON body has this
    /// top-level field with a value other than `null` (e.g. `"tools"`), as an engine version
    /// without that feature does; requests without it are served normally. `null` counts as
    /// absent because clients send unset options as `null`, and an engine that lacks a feature
    /// fails only the requests that use it.
    pub reject_field: Option<String>,
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
            prefill_tokens_per_sec: 0.0,
            kv_cache_tokens: 65536,
            prefix_cache_entries: 256,
            prefix_chars: 1024,
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
            metrics_error_status: None,
            metrics_stall: None,
            reject_field: None,
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
        for (field, rate) in [
            ("tokens_per_sec", self.tokens_per_sec),
            ("prefill_tokens_per_sec", self.prefill_tokens_per_sec),
        ] {
            if !(rate.is_finite() && rate >= 0.0) {
                out.push((field, "must be a finite number >= 0".to_owned()));
            }
        }
        if self.kv_cache_tokens == 0 {
            out.push(("kv_cache_tokens", "must be at least 1".to_owned()));
        }
        if self.prefix_chars == 0 {
            out.push(("prefix_chars", "must be at least 1".to_owned()));
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
        let statuses = [
            ("fault.error_status", Some(self.fault.error_status)),
            (
                "fault.metrics_error_status",
                self.fault.metrics_error_status,
            ),
        ];
        for (field, status) in statuses {
            if let Some(status) = status.filter(|s| !(400..=599).contains(s)) {
                out.push((field, format!("must be a 4xx or 5xx status, got {status}")));
            }
        }
        // An empty name matches no field a client sends, so the fault would silently do nothing.
        if self.fault.reject_field.as_deref() == Some("") {
            out.push(("fault.reject_field", "must name a field".to_owned()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_profile_has_no_problems() {
        assert_eq!(MockProfile::default().problems(), []);
    }

    #[test]
    fn cache_prefill_and_metrics_fault_settings_are_checked() {
        let p = MockProfile {
            prefill_tokens_per_sec: f64::INFINITY,
            kv_cache_tokens: 0,
            prefix_chars: 0,
            fault: MockFault {
                metrics_error_status: Some(200),
                ..MockFault::default()
            },
            ..MockProfile::default()
        };
        let fields: Vec<&str> = p.problems().iter().map(|(f, _)| *f).collect();
        assert_eq!(
            fields,
            [
                "prefill_tokens_per_sec",
                "kv_cache_tokens",
                "prefix_chars",
                "fault.metrics_error_status"
            ]
        );
        let negative = MockProfile {
            prefill_tokens_per_sec: -1.0,
            prefix_cache_entries: 0,
            fault: MockFault {
                metrics_error_status: Some(503),
                ..MockFault::default()
            },
            ..MockProfile::default()
        };
        let fields: Vec<&str> = negative.problems().iter().map(|(f, _)| *f).collect();
        assert_eq!(fields, ["prefill_tokens_per_sec"]);
    }

    #[test]
    fn reject_field_is_read_from_a_mock_backend_in_toml_and_must_name_a_field() {
        let config = |field: &str| {
            format!(
                "[[models]]\nname = \"m\"\n[[models.backends]]\nname = \"b\"\nkind = \"mock\"\n\
                 mock = {{ fault = {{ reject_field = \"{field}\" }} }}\n"
            )
        };
        let c = crate::Config::from_toml(&config("tools")).unwrap();
        let crate::BackendKind::Mock(p) = &c.models[0].backends[0].kind else {
            panic!("not a mock backend: {:?}", c.models[0].backends[0].kind);
        };
        assert_eq!(p.fault.reject_field.as_deref(), Some("tools"));
        let Err(crate::ConfigError::Invalid(problems)) = crate::Config::from_toml(&config(""))
        else {
            panic!("an empty reject_field must be refused");
        };
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(
            text.iter()
                .any(|t| t.contains("mock.fault.reject_field: must name a field")),
            "{text:?}"
        );
    }
}
