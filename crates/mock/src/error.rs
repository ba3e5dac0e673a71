//! The OpenAI-style error every refusal of the mock server answers with.
//!
//! Clients and the gateway parse `{"error":{"message","type","param","code"}}` the same way for
//! every upstream, so the mock never answers an error in any other shape: one type, one place
//! that turns it into a response.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{HeaderValue, StatusCode};
use serde_json::json;

/// A refused request: the status, the OpenAI `type` and `code`, and a sentence for humans.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    message: String,
    param: Option<&'static str>,
    retry_after: Option<Duration>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: String) -> Self {
        Self {
            status,
            kind,
            code,
            message,
            param: None,
            retry_after: None,
        }
    }

    /// A request the server cannot use: bad JSON, a missing or mistyped field.
    pub(crate) fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message.into(),
        )
    }

    /// Like [`ApiError::invalid`], naming the request field at fault.
    pub(crate) fn invalid_param(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param),
            ..Self::invalid("invalid_value", message)
        }
    }

    pub(crate) fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "body_too_large",
            format!("request body is larger than {limit} bytes"),
        )
    }

    pub(crate) fn model_not_found(model: &str) -> Self {
        Self {
            param: Some("model"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                format!("The model `{model}` does not exist or you do not have access to it."),
            )
        }
    }

    pub(crate) fn unauthorized(code: &'static str, message: &str) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            code,
            message.to_owned(),
        )
    }

    pub(crate) fn queue_full(capacity: u32, queue: u32) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "requests",
            "queue_full",
            format!(
                "the server is at capacity ({capacity} generating, {queue} waiting); try again later"
            ),
        )
    }

    pub(crate) fn route_not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown_url",
            "no such endpoint".to_owned(),
        )
    }

    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            "method not allowed on this endpoint".to_owned(),
        )
    }

    /// The failure a fault profile asked for; `status` is any 4xx or 5xx the profile names.
    pub(crate) fn injected(status: u16, retry_after: Option<Duration>) -> Self {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let (kind, code) = match status.as_u16() {
            429 => ("requests", "rate_limit_exceeded"),
            503 => ("server_error", "service_unavailable"),
            400..=499 => ("invalid_request_error", "injected_error"),
            _ => ("server_error", "injected_error"),
        };
        Self {
            retry_after,
            ..Self::new(
                status,
                kind,
                code,
                format!("simulated failure: the mock profile injects {status}"),
            )
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }});
        let mut response = (self.status, Json(body)).into_response();
        if let Some(wait) = self.retry_after {
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                HeaderValue::from(whole_seconds(wait)),
            );
        }
        response
    }
}

/// `Retry-After` carries whole seconds; rounding up never tells a client to come back too early.
fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::ZERO), 0);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2500)), 3);
    }

    #[test]
    fn injected_error_keeps_any_status_the_profile_names() {
        let r = ApiError::injected(503, Some(Duration::from_millis(1500))).into_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "2");
        let r = ApiError::injected(418, None).into_response();
        assert_eq!(r.status(), 418);
        assert!(!r.headers().contains_key("retry-after"));
    }
}
