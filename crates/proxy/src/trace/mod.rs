//! OpenTelemetry traces of the request path, exported over OTLP (`[telemetry]`, off by default).
//!
//! Each call has one SERVER span, named as the GenAI semantic conventions name it
//! (`chat MODEL`, `embeddings MODEL`, `text_completion MODEL`), from its head to the end of its
//! relayed body, and one CLIENT span per upstream attempt, a child of it, with the backend
//! (`server.address`, `server.port`), the attempt's number and, for a retry, why the attempt
//! before it failed (`spillway.retry.reason`). Admission is an event on the call's span
//! (admitted after so long in the queue, or refused and why). The call's span takes the
//! caller's W3C `traceparent` as its parent; each attempt sends its own `traceparent` upstream,
//! so an engine that traces shows its work under the attempt that caused it. The GenAI
//! attributes (`gen_ai.request.model`, `gen_ai.response.model`, `gen_ai.usage.input_tokens`,
//! `gen_ai.usage.output_tokens`, `gen_ai.response.finish_reasons`) and the tenant
//! (`spillway.tenant`) are set on the call's span, and those of the response on the attempt
//! that gave it too. No header is ever copied into a span, so no key can reach one.
//!
//! With tracing off every method here is a test of `None`. Ended spans go to a bounded queue
//! (`export.rs`) that drops and counts rather than grows.

mod export;
pub(crate) mod fields;

use std::borrow::Cow;
use std::time::Duration;

use http::HeaderMap;
use opentelemetry::propagation::Extractor;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::HeaderInjector;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use spillway_config::TelemetryConfig;
use spillway_policy::{Class, Outcome};

use crate::endpoint::{Dialect, Endpoint};
use crate::lines::Lines;
use crate::pool::Backend;
use crate::usage::Usage;
use fields::Fields;

pub(crate) use export::describe;

/// A request's header lines as the propagator reads them (`traceparent`, `tracestate`).
struct LinesExtractor<'a>(&'a Lines);

impl Extractor for LinesExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let (_, value) = self
            .0
            .iter()
            .find(|(name, _)| name.as_str().eq_ignore_ascii_case(key))?;
        crate::lines::text(value)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_str()).collect()
    }
}

/// The process's tracing: a tracer when `[telemetry]` names an endpoint.
pub(crate) struct Tracing {
    on: Option<(SdkTracer, SdkTracerProvider)>,
}

impl Tracing {
    pub(crate) fn off() -> Self {
        Tracing { on: None }
    }

    /// The tracing `config` asks for; an exporter that cannot be built is an error at start.
    pub(crate) fn new(config: &TelemetryConfig) -> Result<Self, String> {
        let Some(endpoint) = &config.otlp_endpoint else {
            return Ok(Self::off());
        };
        let client = opentelemetry_http::hyper::HyperClient::new(
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_webpki_roots()
                .https_or_http()
                .enable_http1()
                .build(),
            config.export_timeout,
            None,
        );
        // Headers (a collector's credentials) come from OTEL_EXPORTER_OTLP_HEADERS, read by the
        // exporter: secrets only from the environment.
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint.clone())
            .with_timeout(config.export_timeout)
            .build()
            .map_err(|e| format!("telemetry.otlp_endpoint: {e}"))?;
        let queue = export::Queue::start(
            exporter,
            export::Bounds {
                queue: config.export_queue,
                batch: config.export_batch,
                interval: config.export_interval,
                flush_wait: config.export_timeout + std::time::Duration::from_secs(1),
            },
        )
        .map_err(|e| format!("telemetry: cannot start the exporter thread: {e}"))?;
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sampling_ratio,
            ))))
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                    .build(),
            )
            .build();
        let tracer = provider.tracer("spillway");
        Ok(Tracing {
            on: Some((tracer, provider)),
        })
    }

    /// The trace of a call to `endpoint` whose request carries `headers`.
    pub(crate) fn start(&self, headers: &Lines, endpoint: Endpoint) -> CallTrace {
        let Some((tracer, _)) = &self.on else {
            return CallTrace(None);
        };
        let parent = TraceContextPropagator::new().extract(&LinesExtractor(headers));
        let operation = crate::genai::operation(endpoint);
        let span = tracer
            .span_builder(operation)
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("gen_ai.operation.name", operation),
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("url.path", endpoint.path()),
            ])
            .start_with_context(tracer, &parent);
        CallTrace(Some(Box::new(Traced {
            cx: parent.with_span(span),
            tracer: tracer.clone(),
            operation,
            provider: provider(endpoint),
        })))
    }

    /// Exports what is queued and stops the exporter, waiting at most `timeout`.
    pub(crate) fn shutdown(&self, timeout: Duration) {
        if let Some((_, provider)) = &self.on {
            if let Err(e) = provider.shutdown_with_timeout(timeout) {
                tracing::warn!("traces not all exported at shutdown: {e}");
            }
        }
    }
}

/// `gen_ai.provider.name`: whose API the call speaks.
fn provider(endpoint: Endpoint) -> &'static str {
    match endpoint.dialect() {
        Dialect::OpenAi => "openai",
        Dialect::Anthropic => "anthropic",
    }
}

/// One call's trace; `None` inside when tracing is off.
pub(crate) struct CallTrace(Option<Box<Traced>>);

struct Traced {
    /// The caller's context with the call's span in it; the span ends when the last clone of
    /// this context is dropped.
    cx: Context,
    tracer: SdkTracer,
    operation: &'static str,
    provider: &'static str,
}

impl CallTrace {
    pub(crate) fn none() -> Self {
        CallTrace(None)
    }

    /// Is this call's span recorded (tracing on and the call sampled)?
    pub(crate) fn recording(&self) -> bool {
        self.0.as_ref().is_some_and(|t| t.cx.span().is_recording())
    }

    fn span(&self) -> Option<opentelemetry::trace::SpanRef<'_>> {
        self.0
            .as_ref()
            .map(|t| t.cx.span())
            .filter(|s| s.is_recording())
    }

    /// What the read stage learnt: the tenant and the model (named now as it is known).
    pub(crate) fn read(&self, tenant: &str, model: &str, stream: bool) {
        let (Some(span), Some(t)) = (self.span(), &self.0) else {
            return;
        };
        span.update_name(format!("{} {model}", t.operation));
        span.set_attributes([
            KeyValue::new("gen_ai.request.model", model.to_owned()),
            KeyValue::new("gen_ai.provider.name", t.provider),
            KeyValue::new("spillway.tenant", tenant.to_owned()),
            KeyValue::new("spillway.stream", stream),
        ]);
    }

    /// Admission seated the call after `waited` in its model's queue.
    pub(crate) fn admitted(&self, waited: Duration) {
        if let Some(span) = self.span() {
            span.add_event(
                "admitted",
                vec![KeyValue::new("spillway.queue.wait_ms", millis(waited))],
            );
        }
    }

    /// The call was answered `status` without a relayed response: `code` says why.
    pub(crate) fn refused(&self, status: u16, code: &'static str) {
        if let Some(span) = self.span() {
            span.set_attributes([
                KeyValue::new("http.response.status_code", i64::from(status)),
                KeyValue::new("error.type", code),
            ]);
            span.set_status(Status::error(code));
        }
    }

    /// The span of attempt number `n` on `backend`; `retry_of`: the failure of the attempt
    /// before it.
    pub(crate) fn attempt(&self, n: u32, backend: &Backend, retry_of: Option<Class>) -> Attempt {
        let Some(t) = self.0.as_ref().filter(|t| t.cx.span().is_recording()) else {
            return Attempt(self.0.as_ref().map(|t| t.cx.clone()));
        };
        // Every endpoint of a backend is on the same host and port.
        let uri = backend.uri(Endpoint::ChatCompletions);
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", t.operation),
            KeyValue::new("gen_ai.provider.name", t.provider),
            KeyValue::new("spillway.backend", backend.name.to_string()),
            KeyValue::new("spillway.attempt", i64::from(n)),
        ];
        if let Some(host) = uri.host() {
            attributes.push(KeyValue::new("server.address", host.to_owned()));
        }
        if let Some(port) = uri.port_u16() {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        if let Some(class) = retry_of {
            attributes.push(KeyValue::new("spillway.retry.reason", class.as_str()));
        }
        let name = format!("{} {}", t.operation, backend.name);
        let span = t
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&t.tracer, &t.cx);
        Attempt(Some(t.cx.with_span(span)))
    }

    /// The relayed response ended: what was read of it, and how it ended.
    pub(crate) fn ended(&self, read: &Answer) {
        if let Some(span) = self.span() {
            span.set_attributes(read.attributes());
            if let Some(error) = read.error {
                span.set_status(Status::error(error));
            }
        }
    }
}

/// One attempt's span: its context goes upstream in `traceparent`.
pub(crate) struct Attempt(Option<Context>);

impl Attempt {
    /// Puts this attempt's `traceparent` (and `tracestate`) into `headers`: the span's own
    /// when it is recorded, the call's (sampled or not) otherwise.
    pub(crate) fn inject(&self, headers: &mut HeaderMap) {
        if let Some(cx) = &self.0 {
            TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
        }
    }

    fn span(&self) -> Option<opentelemetry::trace::SpanRef<'_>> {
        self.0
            .as_ref()
            .map(|c| c.span())
            .filter(|s| s.is_recording())
    }

    /// The attempt's outcome: its status, or the failure that gave none.
    pub(crate) fn outcome(&self, outcome: Outcome, class: Class) {
        let Some(span) = self.span() else { return };
        if let Outcome::Response(status) = outcome {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if class != Class::Success {
            span.set_attribute(KeyValue::new("error.type", class.as_str()));
            span.set_status(Status::error(class.as_str()));
        }
    }

    /// The response this attempt gave, relayed to its end.
    pub(crate) fn ended(&self, read: &Answer) {
        if let Some(span) = self.span() {
            span.set_attributes(read.attributes());
            if let Some(error) = read.error {
                span.set_status(Status::error(error));
            }
        }
    }
}

/// What a relayed response showed by its end.
pub(crate) struct Answer<'a> {
    pub status: u16,
    pub usage: Option<Usage>,
    pub fields: Option<&'a Fields>,
    /// Since the call arrived, when the first byte of the body came.
    pub first_byte: Option<Duration>,
    /// How it failed, if it did (`stream_broken`, `stream_stalled`, `client_gone`, or a status).
    pub error: Option<&'static str>,
}

impl Answer<'_> {
    fn attributes(&self) -> Vec<KeyValue> {
        let mut kv = vec![KeyValue::new(
            "http.response.status_code",
            i64::from(self.status),
        )];
        if let Some(u) = self.usage {
            kv.push(KeyValue::new(
                "gen_ai.usage.input_tokens",
                u.prompt_tokens as i64,
            ));
            kv.push(KeyValue::new(
                "gen_ai.usage.output_tokens",
                u.completion_tokens as i64,
            ));
        }
        if let Some(f) = self.fields {
            if let Some(model) = &f.model {
                kv.push(KeyValue::new("gen_ai.response.model", model.clone()));
            }
            if !f.finish_reasons.is_empty() {
                let reasons: Vec<opentelemetry::StringValue> = f
                    .finish_reasons
                    .iter()
                    .map(|r| Cow::<'static, str>::Owned(r.clone()).into())
                    .collect();
                kv.push(KeyValue::new(
                    "gen_ai.response.finish_reasons",
                    opentelemetry::Value::Array(reasons.into()),
                ));
            }
        }
        if let Some(first) = self.first_byte {
            kv.push(KeyValue::new(
                "spillway.time_to_first_byte_ms",
                millis(first),
            ));
        }
        if let Some(error) = self.error {
            kv.push(KeyValue::new("error.type", error));
        }
        kv
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use http::{HeaderName, HeaderValue};

    use super::*;

    fn parent_of(lines: &[(&'static str, &'static [u8])]) -> String {
        let lines: Lines = lines
            .iter()
            .map(|(n, v)| {
                (
                    HeaderName::from_static(n),
                    HeaderValue::from_bytes(v).unwrap(),
                )
            })
            .collect();
        let cx = TraceContextPropagator::new().extract(&LinesExtractor(&lines));
        cx.span().span_context().trace_id().to_string()
    }

    /// The caller's `traceparent` is read from its lines, its first value as a map would give
    /// it; one that is not text is no parent.
    #[test]
    fn the_callers_traceparent_is_read_from_its_lines() {
        const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
        let sent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let other = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let none = opentelemetry::trace::TraceId::INVALID.to_string();
        assert_eq!(
            parent_of(&[("accept", b"*/*"), ("traceparent", sent)]),
            TRACE
        );
        assert_eq!(
            parent_of(&[("traceparent", sent), ("traceparent", other)]),
            TRACE
        );
        assert_eq!(parent_of(&[("accept", b"*/*")]), none);
        assert_eq!(parent_of(&[("traceparent", b"00-\xff-01")]), none);
    }
}
