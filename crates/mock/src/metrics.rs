//! `GET /metrics`: the load a real vLLM reports, in its Prometheus names, from the mock's state.
//!
//! A gateway that routes on each engine's own load scrapes these: requests running and waiting,
//! the share of the KV cache in use, and the prefix cache's queries and hits. They are read from
//! the state that paces the requests (the generation slots and the recorder's counters), never
//! kept beside it, so a scrape shows what the next request will meet. A gateway scrapes several
//! times a second, so a scrape takes one short lock and writes one buffer. The profile's
//! `metrics_error_status` and `metrics_stall` break the endpoint itself, for testing a gateway
//! that must keep routing when an engine's load goes stale.

use std::fmt::{self, Write};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::header::CONTENT_TYPE;
use http::{HeaderValue, StatusCode};
use spillway_config::MockProfile;

use crate::slots::Load;
use crate::stats::EngineCounters;
use crate::MockServer;

/// The Prometheus text exposition format, as vLLM's Python client sends it.
const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(crate) async fn metrics(State(server): State<MockServer>) -> Response {
    let live = server.live();
    let fault = &live.profile.fault;
    if let Some(stall) = fault.metrics_stall {
        tokio::time::sleep(stall).await;
    }
    if let Some(status) = fault.metrics_error_status {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = format!("simulated failure: the mock profile answers /metrics with {status}\n");
        return (status, body).into_response();
    }
    // Read after any stall, so the answer is the load when it is sent.
    let body = render(
        &server.live().profile,
        server.slots().load(),
        server.recorder().engine_counters(),
    );
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_TEXT));
    response
}

/// The exposition text: each metric with its `# HELP` and `# TYPE` lines and one sample
/// labelled with the profile's first model, as vLLM labels its own.
fn render(profile: &MockProfile, load: Load, counters: EngineCounters) -> String {
    let kv_usage =
        (load.kv_tokens as f64 / f64::from(profile.kv_cache_tokens.max(1))).clamp(0.0, 1.0);
    let samples: [(&str, &str, &str, &dyn fmt::Display); 6] = [
        (
            "vllm:num_requests_running",
            "gauge",
            "Requests holding a generation slot.",
            &load.generating,
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Requests waiting for a generation slot.",
            &load.waiting,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage: tokens of running requests (prompt plus planned output) over kv_cache_tokens. 1 means 100 percent usage.",
            &kv_usage,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in prompt tokens looked up.",
            &counters.prefix_query_tokens,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in prompt tokens found cached.",
            &counters.prefix_hit_tokens,
        ),
        (
            "vllm:request_success_total",
            "counter",
            "Requests answered completely and successfully.",
            &counters.served,
        ),
    ];
    let model = profile.models.first().map_or("", String::as_str);
    let mut labels = String::with_capacity(model.len() + 16);
    labels.push_str("{model_name=\"");
    escape_label_value(&mut labels, model);
    labels.push_str("\"}");
    let mut out = String::with_capacity(1536);
    for (name, kind, help, value) in samples {
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{labels} {value}"
        );
    }
    out
}

/// A label value as the text format quotes it: backslash, double quote and newline escaped.
fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>(text: &'a str, name: &str) -> &'a str {
        text.lines()
            .find_map(|l| l.strip_prefix(name).filter(|rest| rest.starts_with('{')))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    }

    #[test]
    fn every_metric_has_help_type_and_one_labelled_sample() {
        let profile = MockProfile {
            models: vec!["a\"b\\c\nd".to_owned(), "other".to_owned()],
            kv_cache_tokens: 1000,
            ..MockProfile::default()
        };
        let load = Load {
            generating: 2,
            waiting: 3,
            kv_tokens: 250,
        };
        let counters = EngineCounters {
            served: 7,
            prefix_query_tokens: 40,
            prefix_hit_tokens: 10,
        };
        let text = render(&profile, load, counters);
        assert_eq!(text.lines().count(), 6 * 3, "{text}");
        let labels = r#"{model_name="a\"b\\c\nd"}"#;
        assert_eq!(
            sample(&text, "vllm:num_requests_running"),
            format!("{labels} 2")
        );
        assert_eq!(
            sample(&text, "vllm:num_requests_waiting"),
            format!("{labels} 3")
        );
        assert_eq!(
            sample(&text, "vllm:kv_cache_usage_perc"),
            format!("{labels} 0.25")
        );
        assert!(text.contains("# TYPE vllm:prefix_cache_hits_total counter\n"));
        assert_eq!(
            sample(&text, "vllm:request_success_total"),
            format!("{labels} 7")
        );
    }

    #[test]
    fn kv_usage_is_clamped_at_one() {
        let profile = MockProfile {
            kv_cache_tokens: 10,
            ..MockProfile::default()
        };
        let load = Load {
            kv_tokens: 11,
            ..Load::default()
        };
        let counters = EngineCounters {
            served: 0,
            prefix_query_tokens: 0,
            prefix_hit_tokens: 0,
        };
        let text = render(&profile, load, counters);
        assert!(
            sample(&text, "vllm:kv_cache_usage_perc").ends_with("} 1"),
            "{text}"
        );
    }
}
