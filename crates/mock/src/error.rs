//! The error every refusal of the mock server answers with, in the dialect of the API asked.
//!
//! Clients and the gateway parse an OpenAI upstream's `{"error":{"message","type","param","code"}}`
//! and an Anthropic upstream's `{"type":"error","error":{"type","message"}}` each the same way for
//! every upstream of that kind, so the mock never answers an error in any other shape: one type
//! that carries its [`Dialect`], one place that turns it into a response. The dialect is the
//! endpoint's: Anthropic's for `/v1/messages` and `/v1/messages/count_tokens`, OpenAI's for
//! everything else. Anthropic's error `type` follows from the status alone, as its API documents
//! it, and every Anthropic answer, error or not, carries a `request-id` header.

use std::borrow::Cow;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{HeaderValue, StatusCode};
use serde_json::json;

/// Which API's conventions an answer follows: its error shape and its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Dialect {
    #[default]
    OpenAi,
    Anthropic,
}

impl Dialect {
    /// The dialect of a URL path: Anthropic's under `/v1/messages`, OpenAI's elsewhere. For
    /// answers given before any endpoint is known (an unknown path, a wrong method).
    pub(crate) fn of_path(path: &str) -> Self {
        let rest = path.strip_prefix("/v1/messages");
        if rest.is_some_and(|r| r.is_empty() || r.starts_with('/')) {
            Dialect::Anthropic
        } else {
            Dialect::OpenAi
        }
    }

    /// Adds the headers every answer in this dialect carries: Anthropic's `request-id`.
    pub(crate) fn stamp(self, response: &mut Response) {
        if self == Dialect::Anthropic {
            let id = format!("req_{:024x}", rand::random::<u128>() >> 32);
            if let Ok(v) = HeaderValue::from_str(&id) {
                response.headers_mut().insert("request-id", v);
            }
        }
    }

    /// [`ApiError::into_response`] in this dialect, stamped with its headers.
    pub(crate) fn answer(self, error: ApiError) -> Response {
        let mut response = error.in_dialect(self).into_response();
        self.stamp(&mut response);
        response
    }
}

/// A refused request: the status, the OpenAI `type` and `code`, a sentence for humans, and the
/// dialect its body is written in.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    message: String,
    /// The request field at fault: one the mock reads, or one a profile names.
    param: Option<Cow<'static, str>>,
    retry_after: Option<Duration>,
    dialect: Dialect,
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
            dialect: Dialect::OpenAi,
        }
    }

    /// The same error, answered in `dialect`'s shape.
    pub(crate) fn in_dialect(self, dialect: Dialect) -> Self {
        Self { dialect, ..self }
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
            param: Some(param.into()),
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
            param: Some("model".into()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                format!("The model `{model}` does not exist or you do not have access to it."),
            )
        }
    }

    /// A create or compaction whose `previous_response_id` names no response this server holds.
    pub(crate) fn previous_response_not_found(id: &str) -> Self {
        Self {
            param: Some("previous_response_id".into()),
            ..Self::invalid(
                "previous_response_not_found",
                format!("Previous response with id '{}' not found.", shown(id)),
            )
        }
    }

    /// A stored-response route whose id names no response this server holds.
    pub(crate) fn response_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "response_not_found",
            format!("Response with id '{}' not found.", shown(id)),
        )
    }

    /// A stored-chat-completion route whose id names no completion this server holds.
    pub(crate) fn chat_completion_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            format!("No chat completion found with id '{}'.", shown(id)),
        )
    }

    /// A body field the endpoint does not accept.
    pub(crate) fn unknown_parameter(name: &str) -> Self {
        Self::invalid(
            "unknown_parameter",
            format!("Unrecognized request argument supplied: {}", shown(name)),
        )
    }

    /// A top-level body field this server does not support, worded as OpenAI words it, so a
    /// backend without a feature fails the requests that use it the way a real one does.
    pub(crate) fn unsupported_parameter(field: &str) -> Self {
        Self {
            param: Some(Cow::Owned(field.to_owned())),
            ..Self::invalid(
                "unsupported_parameter",
                format!(
                    "Unsupported parameter: '{}' is not supported with this model.",
                    shown(field)
                ),
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
        let body = match self.dialect {
            Dialect::OpenAi => json!({"error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }}),
            Dialect::Anthropic => json!({"type": "error", "error": {
                "type": anthropic_type(self.status),
                "message": self.message,
            }}),
        };
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

/// An id from the client as an error message quotes it: whole unless it is absurdly long.
fn shown(id: &str) -> &str {
    const MAX_CHARS: usize = 128;
    match id.char_indices().nth(MAX_CHARS) {
        Some((end, _)) => &id[..end],
        None => id,
    }
}

/// Anthropic's error `type` for a status, as its API documents them; statuses it does not
/// list take the type of their class.
fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
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
        let r = ApiError::injected(529, None).into_response();
        assert_eq!(r.status(), 529);
    }

    async fn body(r: Response) -> serde_json::Value {
        let bytes = http_body_util::BodyExt::collect(r.into_body())
            .await
            .unwrap()
            .to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn one_error_answers_in_either_dialect() {
        let e = ApiError::model_not_found("x");
        let v = body(e.clone().into_response()).await;
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        let r = Dialect::Anthropic.answer(e);
        assert_eq!(r.status(), 404);
        assert!(r.headers()["request-id"]
            .to_str()
            .unwrap()
            .starts_with("req_"));
        let v = body(r).await;
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "not_found_error");
        assert!(v["error"]["message"].as_str().unwrap().contains('x'));
        assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
        let r = Dialect::OpenAi.answer(ApiError::route_not_found());
        assert!(!r.headers().contains_key("request-id"));
    }

    #[tokio::test]
    async fn unknown_responses_name_their_id_and_field() {
        let r = ApiError::previous_response_not_found("resp_1").into_response();
        assert_eq!(r.status(), 400);
        let v = body(r).await;
        assert_eq!(
            v["error"],
            json!({"message": "Previous response with id 'resp_1' not found.",
                   "type": "invalid_request_error", "param": "previous_response_id",
                   "code": "previous_response_not_found"})
        );
        let long = "é".repeat(1000);
        let r = ApiError::response_not_found(&long).into_response();
        assert_eq!(r.status(), 404);
        let v = body(r).await;
        assert_eq!(v["error"]["code"], "response_not_found");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.len() < 400, "{message}");
        let v = body(ApiError::chat_completion_not_found("chatcmpl-1").into_response()).await;
        assert_eq!(
            v["error"],
            json!({"message": "No chat completion found with id 'chatcmpl-1'.",
                   "type": "invalid_request_error", "param": null, "code": "not_found"})
        );
    }

    #[tokio::test]
    async fn an_unsupported_parameter_is_named_in_either_dialect() {
        let e = ApiError::unsupported_parameter("tools");
        let r = e.clone().into_response();
        assert_eq!(r.status(), 400);
        assert_eq!(
            body(r).await["error"],
            json!({"message": "Unsupported parameter: 'tools' is not supported with this model.",
                   "type": "invalid_request_error", "param": "tools",
                   "code": "unsupported_parameter"})
        );
        let v = body(Dialect::Anthropic.answer(e)).await;
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("'tools'"));
    }

    #[test]
    fn anthropic_types_follow_the_status() {
        let t = |s: u16| anthropic_type(StatusCode::from_u16(s).unwrap());
        assert_eq!(t(400), "invalid_request_error");
        assert_eq!(t(401), "authentication_error");
        assert_eq!(t(403), "permission_error");
        assert_eq!(t(404), "not_found_error");
        assert_eq!(t(405), "invalid_request_error");
        assert_eq!(t(413), "request_too_large");
        assert_eq!(t(429), "rate_limit_error");
        assert_eq!(t(500), "api_error");
        assert_eq!(t(502), "api_error");
        assert_eq!(t(503), "overloaded_error");
        assert_eq!(t(529), "overloaded_error");
    }

    #[test]
    fn the_dialect_of_a_path() {
        assert_eq!(Dialect::of_path("/v1/messages"), Dialect::Anthropic);
        assert_eq!(
            Dialect::of_path("/v1/messages/count_tokens"),
            Dialect::Anthropic
        );
        assert_eq!(Dialect::of_path("/v1/messagesx"), Dialect::OpenAi);
        assert_eq!(Dialect::of_path("/v1/chat/completions"), Dialect::OpenAi);
    }
}
