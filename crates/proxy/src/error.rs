//! The one error type of the request path, and its one mapping to HTTP.
//!
//! Each error records what went wrong (`ErrorKind`). The mapping to a status, an OpenAI-style
//! body and the retry headers lives in one place, so callers and SDKs always get the same
//! honest answer for the same cause.

use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};

use crate::answer::Answer;
use crate::endpoint::{Dialect, Endpoint};
use crate::lines::Lines;

/// `Retry-After` in milliseconds, as the OpenAI SDKs read it.
pub(crate) const RETRY_AFTER_MS: http::HeaderName = http::HeaderName::from_static("retry-after-ms");
/// The OpenAI SDKs' hint: `false` tells them not to retry.
pub(crate) const X_SHOULD_RETRY: http::HeaderName = http::HeaderName::from_static("x-should-retry");

/// The most header lines [`ApiError::answer`] adds of its own: the content type, `x-should-retry`
/// and the two `Retry-After`s.
pub(crate) const OWN_HEADERS: usize = 4;

/// How long a caller refused for lack of capacity is told to wait.
pub(crate) const NO_CAPACITY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    MalformedRequest,
    BodyTooLarge,
    /// The request line and headers are larger than the gateway reads.
    HeadTooLarge,
    UriTooLong,
    /// The client did not send the whole body within `server.body_read_timeout`.
    BodyReadTimeout,
    /// The tenant's request bodies hold its share of the gateway's body budget.
    TenantBodyBudget,
    /// The API listener has its maximum of open connections.
    TooManyConnections,
    MissingApiKey,
    InvalidApiKey,
    ModelNotFound,
    ModelNotAllowed,
    /// No backend of the model serves the request's API surface.
    SurfaceNotServed,
    /// The Responses API: no stored response with this id is known for this caller.
    ResponseNotFound,
    RouteNotFound,
    MethodNotAllowed,
    /// Every backend of the model is full or unreachable.
    NoCapacity,
    /// Backends failed and the shared retry budget had no retry left for this request.
    RetryBudgetExhausted,
    /// A caller's own retry, refused first while the model's backends are failing.
    ClientRetryShed,
    /// Refused by adaptive throttling: the model's backends have been failing, and only a share
    /// of requests reaches them until they accept again.
    BackendsFailing,
    /// A backend did not answer in time.
    UpstreamTimeout,
    /// A backend could not be reached or broke the connection.
    UpstreamUnavailable,
    /// A backend refused the gateway's own credential for it (its 401 or 403): the operator's
    /// fault, never the caller's, so it is not relayed as an authentication error.
    UpstreamAuth,
    /// The gateway is shutting down.
    ShuttingDown,
    /// The key's tenant is disabled.
    TenantDisabled,
    /// Admin API: no or a wrong admin token.
    AdminUnauthorized,
    /// Admin API: no admin token is configured, so the admin API is off.
    AdminDisabled,
    /// Admin API: no such tenant or key.
    NotFound,
    /// Admin API: the tenant already exists.
    Conflict,
    /// The tenant store cannot be reached.
    StoreUnavailable,
    /// The tenant is over its requests-per-minute limit.
    RequestRateLimited,
    /// The tenant is over its tokens-per-minute limit.
    TokenRateLimited,
    /// The request alone needs more tokens than the tenant's limit allows at once: it can
    /// never pass, so it is not worth retrying.
    TokensOverLimit,
    /// The tenant has its maximum of requests in flight.
    ConcurrencyLimited,
    /// The gateway is at one of its global caps (requests in flight, buffered bytes).
    GatewayOverloaded,
    Internal,
}

/// An error on the request path, ready to become an OpenAI-style response.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    pub retry_after: Option<Duration>,
    /// Sent with the error (`x-ratelimit-*` on a 429), the answer's lines to which its own are
    /// added; boxed, as most errors have none.
    pub(crate) headers: Option<Box<Lines>>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
            headers: None,
        }
    }

    pub(crate) fn with_headers(mut self, headers: Lines) -> Self {
        self.headers = Some(Box::new(headers));
        self
    }

    /// Whether a retry after `Retry-After` may succeed, so the caller is not told otherwise:
    /// limits and caps that free up with time, and a gateway going away (another instance
    /// can serve).
    pub fn retry_may_help(&self) -> bool {
        use ErrorKind::*;
        matches!(
            self.kind,
            ShuttingDown
                | RequestRateLimited
                | TokenRateLimited
                | ConcurrencyLimited
                | GatewayOverloaded
                | TenantBodyBudget
                | TooManyConnections
        )
    }

    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Status, OpenAI error `type` and `code`.
    pub fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        use ErrorKind::*;
        match self.kind {
            MalformedRequest => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_request",
            ),
            BodyTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "body_too_large",
            ),
            HeadTooLarge => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "invalid_request_error",
                "request_head_too_large",
            ),
            UriTooLong => (
                StatusCode::URI_TOO_LONG,
                "invalid_request_error",
                "uri_too_long",
            ),
            BodyReadTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                "body_read_timeout",
            ),
            TenantBodyBudget => (
                StatusCode::TOO_MANY_REQUESTS,
                "requests",
                "body_budget_exceeded",
            ),
            TooManyConnections => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "too_many_connections",
            ),
            MissingApiKey => (
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing_api_key",
            ),
            InvalidApiKey => (
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "invalid_api_key",
            ),
            ModelNotFound => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
            ),
            ModelNotAllowed => (
                StatusCode::FORBIDDEN,
                "permission_error",
                "model_not_allowed",
            ),
            SurfaceNotServed => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "surface_not_served",
            ),
            ResponseNotFound => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "response_not_found",
            ),
            RouteNotFound => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "unknown_url",
            ),
            MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "method_not_allowed",
            ),
            NoCapacity => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "capacity_exhausted",
            ),
            RetryBudgetExhausted => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "retry_budget_exhausted",
            ),
            ClientRetryShed => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "client_retry_shed",
            ),
            BackendsFailing => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "backends_failing",
            ),
            UpstreamTimeout => (
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                "upstream_timeout",
            ),
            UpstreamUnavailable => (
                StatusCode::BAD_GATEWAY,
                "server_error",
                "upstream_unavailable",
            ),
            UpstreamAuth => (
                StatusCode::BAD_GATEWAY,
                "server_error",
                "upstream_auth_failed",
            ),
            ShuttingDown => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "shutting_down",
            ),
            TenantDisabled => (StatusCode::FORBIDDEN, "permission_error", "tenant_disabled"),
            AdminUnauthorized => (
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "invalid_admin_token",
            ),
            AdminDisabled => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "admin_api_disabled",
            ),
            NotFound => (StatusCode::NOT_FOUND, "invalid_request_error", "not_found"),
            Conflict => (StatusCode::CONFLICT, "invalid_request_error", "conflict"),
            StoreUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "store_unavailable",
            ),
            RequestRateLimited => (
                StatusCode::TOO_MANY_REQUESTS,
                "requests",
                "rate_limit_exceeded",
            ),
            TokenRateLimited => (
                StatusCode::TOO_MANY_REQUESTS,
                "tokens",
                "rate_limit_exceeded",
            ),
            TokensOverLimit => (StatusCode::TOO_MANY_REQUESTS, "tokens", "request_too_large"),
            ConcurrencyLimited => (
                StatusCode::TOO_MANY_REQUESTS,
                "requests",
                "concurrency_limit_exceeded",
            ),
            GatewayOverloaded => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "gateway_overloaded",
            ),
            Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal_error",
            ),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The body of an OpenAI-style error.
    pub fn body(&self) -> serde_json::Value {
        let (_, kind, code) = self.parts();
        serde_json::json!({
            "error": { "message": self.message, "type": kind, "param": null, "code": code }
        })
    }

    /// The body of this error in `dialect`.
    pub fn body_in(&self, dialect: Dialect) -> serde_json::Value {
        match dialect {
            Dialect::OpenAi => self.body(),
            Dialect::Anthropic => serde_json::json!({
                "type": "error",
                "error": { "type": anthropic_type(self.status()), "message": self.message }
            }),
        }
    }

    /// The event that ends a stream of `endpoint` that broke off: in the shape its caller's SDK
    /// reads as an error (the Messages API's `error` event, the Responses API's `error` event,
    /// and for chat and completions an `error` object in the data), never its clean end event.
    pub fn stream_event(&self, endpoint: Endpoint) -> String {
        let data = match endpoint {
            Endpoint::Responses => serde_json::json!({
                "type": "error", "code": self.parts().2, "message": self.message, "param": null
            }),
            other => self.body_in(other.dialect()),
        };
        format!("event: error\ndata: {data}\n\n")
    }

    /// The answer to send in `dialect`, with the retry headers, made as the client's writer takes
    /// it (its lines a list, its body the JSON's bytes), so that a refusal, the whole of the
    /// traffic when every backend is down, costs no header map and no conversion.
    pub(crate) fn answer(mut self, dialect: Dialect) -> Answer {
        // A `serde_json::Value` always serializes (its keys are strings).
        let body = serde_json::to_vec(&self.body_in(dialect)).unwrap_or_default();
        // The error's own lines first, then this answer's, which have the last word.
        let mut lines = match self.headers.take() {
            Some(extra) => *extra,
            None => Lines::with_capacity(OWN_HEADERS),
        };
        lines.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        // A client error fails the same way again; anything else spillway gives up on has had
        // its retries here already, within the budget, so a retry stacked on top would only
        // multiply load (IL-0248). Limits and caps that free up with time are the exception,
        // and so is a gateway shutting down (another instance can serve the retry): those say
        // when to come back with `Retry-After`.
        if !self.retry_may_help() {
            lines.insert(X_SHOULD_RETRY, HeaderValue::from_static("false"));
        }
        if let Some(after) = self.retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            lines.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            lines.insert(RETRY_AFTER_MS, HeaderValue::from(after.as_millis() as u64));
        }
        Answer::new(self.status(), lines, Body::from(body))
    }

    /// The same answer as an `http::Response`, for the handlers axum serves.
    pub fn response(self, dialect: Dialect) -> Response {
        self.answer(dialect).into_response()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.response(Dialect::OpenAi)
    }
}

/// The Messages API's error `type` for a status, as Anthropic's own API answers it.
fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_capacity_is_503_with_retry_headers() {
        let r = ApiError::new(ErrorKind::NoCapacity, "all full")
            .retry_after(Duration::from_millis(1500))
            .into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        assert_eq!(r.headers()["retry-after-ms"], "1500");
    }

    #[tokio::test]
    async fn a_refusals_answer_is_its_json_with_its_own_headers_and_the_retry_ones_last_word() {
        let extra: Lines = [
            (
                http::HeaderName::from_static("x-ratelimit-remaining-requests"),
                HeaderValue::from_static("0"),
            ),
            (header::VARY, HeaderValue::from_static("a")),
            (header::VARY, HeaderValue::from_static("b")),
            // The error's own retry headers are the last word on when to come back, and its
            // body's content type on what it is.
            (header::RETRY_AFTER, HeaderValue::from_static("99")),
            (header::CONTENT_TYPE, HeaderValue::from_static("text/plain")),
        ]
        .into_iter()
        .collect();
        let answer = ApiError::new(ErrorKind::RequestRateLimited, "slow down")
            .with_headers(extra)
            .retry_after(Duration::from_millis(250))
            .answer(Dialect::Anthropic);

        assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
        let lines: Vec<(&str, &[u8])> = answer.lines.iter().map(|(n, v)| (n.as_str(), v)).collect();
        assert_eq!(
            lines,
            [
                ("x-ratelimit-remaining-requests", &b"0"[..]),
                ("vary", b"a"),
                ("vary", b"b"),
                ("retry-after", b"1"),
                ("content-type", b"application/json"),
                ("retry-after-ms", b"250"),
            ]
        );
        let body = axum::body::to_bytes(answer.body, 1 << 16).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(body["error"]["message"], "slow down");
    }

    #[test]
    fn client_errors_say_do_not_retry_and_carry_openai_shape() {
        let e = ApiError::new(ErrorKind::InvalidApiKey, "bad key");
        assert_eq!(e.body()["error"]["code"], "invalid_api_key");
        assert_eq!(e.body()["error"]["type"], "invalid_request_error");
        let r = e.into_response();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers()["x-should-retry"], "false");
    }

    #[test]
    fn the_messages_dialect_has_anthropic_types_by_status() {
        let cases = [
            (ErrorKind::InvalidApiKey, "authentication_error"),
            (ErrorKind::ModelNotAllowed, "permission_error"),
            (ErrorKind::SurfaceNotServed, "not_found_error"),
            (ErrorKind::BodyTooLarge, "request_too_large"),
            (ErrorKind::TokenRateLimited, "rate_limit_error"),
            (ErrorKind::NoCapacity, "overloaded_error"),
            (ErrorKind::MalformedRequest, "invalid_request_error"),
            (ErrorKind::UpstreamTimeout, "api_error"),
        ];
        for (kind, expected) in cases {
            let body = ApiError::new(kind, "why").body_in(Dialect::Anthropic);
            assert_eq!(body["type"], "error");
            assert_eq!(body["error"]["type"], expected, "{kind:?}");
            assert_eq!(body["error"]["message"], "why");
        }
    }

    #[test]
    fn a_broken_stream_ends_with_each_surfaces_error_event() {
        let e = ApiError::new(ErrorKind::UpstreamUnavailable, "broke");
        let data = |endpoint| {
            let event = e.stream_event(endpoint);
            let data = event
                .strip_prefix("event: error\ndata: ")
                .and_then(|d| d.strip_suffix("\n\n"))
                .unwrap_or_else(|| panic!("not one error event: {event:?}"));
            serde_json::from_str::<serde_json::Value>(data).unwrap()
        };
        assert_eq!(
            data(Endpoint::ChatCompletions)["error"]["code"],
            "upstream_unavailable"
        );
        let messages = data(Endpoint::Messages);
        assert_eq!(
            (
                messages["type"].as_str(),
                messages["error"]["type"].as_str()
            ),
            (Some("error"), Some("api_error"))
        );
        let responses = data(Endpoint::Responses);
        assert_eq!(
            (responses["type"].as_str(), responses["code"].as_str()),
            (Some("error"), Some("upstream_unavailable"))
        );
    }
}
