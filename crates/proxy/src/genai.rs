//! The OpenTelemetry GenAI metrics, beside the `spillway_*` ones, named as the GenAI semantic
//! conventions' instruments map to Prometheus: `gen_ai.server.request.duration` becomes
//! `gen_ai_server_request_duration_seconds`, `gen_ai.server.time_to_first_token`
//! `gen_ai_server_time_to_first_token_seconds`, `gen_ai.server.time_per_output_token`
//! `gen_ai_server_time_per_output_token_seconds`, and `gen_ai.client.token.usage` (the
//! gateway is the backends' client; its unit `{token}` is an annotation and adds no suffix)
//! `gen_ai_client_token_usage`. Buckets are those the conventions advise.
//!
//! Labels: `gen_ai_operation_name`, `gen_ai_request_model` (a configured model name, or
//! `unknown`), `gen_ai_token_type` (`input`, `output`) and, on a failed request's duration,
//! `error_type`. The response's model is not a label: a backend could name anything there.

use std::sync::Arc;
use std::time::Duration;

use metrics::{describe_histogram, histogram, Histogram, Label, Unit};

use crate::endpoint::Endpoint;

pub const REQUEST_DURATION: &str = "gen_ai_server_request_duration_seconds";
pub const TIME_TO_FIRST_TOKEN: &str = "gen_ai_server_time_to_first_token_seconds";
pub const TIME_PER_OUTPUT_TOKEN: &str = "gen_ai_server_time_per_output_token_seconds";
pub const TOKEN_USAGE: &str = "gen_ai_client_token_usage";

pub(crate) const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
pub(crate) const FIRST_TOKEN_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
pub(crate) const PER_TOKEN_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
pub(crate) const TOKEN_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// `gen_ai.operation.name` of a call to `endpoint`.
pub(crate) fn operation(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::ChatCompletions
        | Endpoint::Responses
        | Endpoint::ResponsesCompact
        | Endpoint::Messages => "chat",
        Endpoint::Completions => "text_completion",
        Endpoint::Embeddings => "embeddings",
        Endpoint::CountTokens => "count_tokens",
    }
}

/// `error.type` of an answer with `status`: the status code, as the conventions ask.
pub(crate) fn status_error(status: u16) -> &'static str {
    const NAMED: [(u16, &str); 13] = [
        (400, "400"),
        (401, "401"),
        (403, "403"),
        (404, "404"),
        (408, "408"),
        (409, "409"),
        (413, "413"),
        (422, "422"),
        (429, "429"),
        (500, "500"),
        (502, "502"),
        (503, "503"),
        (504, "504"),
    ];
    match NAMED.iter().find(|(code, _)| *code == status) {
        Some((_, named)) => named,
        None if status < 500 => "4xx",
        None => "5xx",
    }
}

pub(crate) fn describe() {
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "GenAI requests from arrival to the end of the response (gen_ai.server.request.duration)."
    );
    describe_histogram!(
        TIME_TO_FIRST_TOKEN,
        Unit::Seconds,
        "Streamed GenAI requests: arrival to the first byte of the streamed body (gen_ai.server.time_to_first_token)."
    );
    describe_histogram!(
        TIME_PER_OUTPUT_TOKEN,
        Unit::Seconds,
        "Streamed GenAI requests: time per output token after the first (gen_ai.server.time_per_output_token)."
    );
    describe_histogram!(
        TOKEN_USAGE,
        "Tokens the backends reported, by type: input or output (gen_ai.client.token.usage)."
    );
}

/// The operations a call can be, in the order of [`GenAiSeries`]'s series.
const OPERATIONS: [&str; 4] = ["chat", "text_completion", "embeddings", "count_tokens"];

/// One model's GenAI series, registered when its pool is built, so a request's end records
/// into handles rather than looking its series up by name.
#[derive(Debug)]
pub(crate) struct GenAiSeries {
    model: Arc<str>,
    ops: [OperationSeries; OPERATIONS.len()],
}

#[derive(Debug)]
struct OperationSeries {
    duration: Histogram,
    first_token: Histogram,
    per_token: Histogram,
    input: Histogram,
    output: Histogram,
}

impl GenAiSeries {
    pub(crate) fn new(model: &Arc<str>) -> Self {
        let labels = |op: &'static str| {
            vec![
                Label::new("gen_ai_operation_name", op),
                Label::new("gen_ai_request_model", model.clone()),
            ]
        };
        let tokens = |op: &'static str, kind: &'static str| {
            let mut l = labels(op);
            l.push(Label::new("gen_ai_token_type", kind));
            histogram!(TOKEN_USAGE, l)
        };
        GenAiSeries {
            model: model.clone(),
            ops: OPERATIONS.map(|op| OperationSeries {
                duration: histogram!(REQUEST_DURATION, labels(op)),
                first_token: histogram!(TIME_TO_FIRST_TOKEN, labels(op)),
                per_token: histogram!(TIME_PER_OUTPUT_TOKEN, labels(op)),
                input: tokens(op, "input"),
                output: tokens(op, "output"),
            }),
        }
    }

    /// Records a relayed response to a call to `endpoint`.
    pub(crate) fn record(&self, endpoint: Endpoint, served: &Served) {
        let op = operation(endpoint);
        let Some(i) = OPERATIONS.iter().position(|o| *o == op) else {
            return;
        };
        let series = &self.ops[i];
        match served.error {
            None => series.duration.record(served.duration.as_secs_f64()),
            Some(error) => failed(op, &self.model, error, served.duration),
        }
        if let Some(first) = served.first_byte {
            series.first_token.record(first.as_secs_f64());
            if let Some(per) = served.per_output_token(first) {
                series.per_token.record(per);
            }
        }
        if let Some((input, output)) = served.tokens {
            series.input.record(input as f64);
            series.output.record(output as f64);
        }
    }
}

/// The duration of a failed call: its series has the `error_type` label, looked up by name, as
/// failures are few and their types many.
pub(crate) fn failed(
    operation: &'static str,
    model: &Arc<str>,
    error: &'static str,
    took: Duration,
) {
    histogram!(
        REQUEST_DURATION,
        "gen_ai_operation_name" => operation,
        "gen_ai_request_model" => model.clone(),
        "error_type" => error
    )
    .record(took.as_secs_f64());
}

/// One relayed response, as the metrics see it.
pub(crate) struct Served {
    pub duration: Duration,
    /// Why it failed, if it did.
    pub error: Option<&'static str>,
    /// Streamed: when its first byte came, since it arrived.
    pub first_byte: Option<Duration>,
    /// The backend's report: (input, output) tokens.
    pub tokens: Option<(u64, u64)>,
}

impl Served {
    /// The time per output token after the first: what follows the first byte, over the tokens
    /// after the first. Unknown without a report of at least two output tokens.
    fn per_output_token(&self, first: Duration) -> Option<f64> {
        let (_, output) = self.tokens?;
        (output > 1 && self.error.is_none())
            .then(|| self.duration.saturating_sub(first).as_secs_f64() / (output - 1) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_type_is_the_status_or_its_class() {
        assert_eq!(status_error(429), "429");
        assert_eq!(status_error(418), "4xx");
        assert_eq!(status_error(507), "5xx");
    }

    #[test]
    fn time_per_output_token_is_what_follows_the_first_over_the_tokens_after_it() {
        let s = Served {
            duration: Duration::from_millis(1100),
            error: None,
            first_byte: Some(Duration::from_millis(100)),
            tokens: Some((7, 11)),
        };
        let per = s.per_output_token(Duration::from_millis(100)).unwrap();
        assert!((per - 0.1).abs() < 1e-9, "{per}");
        let one = Served {
            tokens: Some((7, 1)),
            ..s
        };
        assert_eq!(one.per_output_token(Duration::from_millis(100)), None);
    }
}
