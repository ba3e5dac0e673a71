//! The request body as JSON: the few fields routing and admission read from it (what spillway
//! rewrites is in `rewrite.rs`).

use std::borrow::Cow;

use serde::Deserialize;

use crate::endpoint::Endpoint;
use crate::error::{ApiError, ErrorKind};

mod plain;

/// The fields of a request body that routing and admission need.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestSummary {
    /// Empty only where the caller may leave it out (see [`summarize`]).
    pub model: String,
    pub stream: bool,
    /// `max_completion_tokens`, else `max_output_tokens` (the Responses API), else `max_tokens`
    /// (also the Messages API's): the most output tokens the caller allows.
    pub max_tokens: Option<u64>,
    /// Choices asked for (`n`), at least 1.
    pub choices: u64,
    /// The stored response a Responses API request continues.
    pub previous_response_id: Option<String>,
    /// `store`: whether the backend is asked to keep the completion.
    pub store: Option<bool>,
}

impl RequestSummary {
    /// Whether the call asks its backend to keep the completion (`store: true` on a chat
    /// completion): a backend that keeps them is told the tenant (`pool::Backend::changes`).
    pub fn stores_chat(&self, endpoint: Endpoint) -> bool {
        self.store == Some(true) && endpoint == Endpoint::ChatCompletions
    }
}

/// The fields read, as serde reads them (a missing one is `None`).
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    stream: Option<bool>,
    // Any JSON value: a field of the wrong type is the backend's to refuse, not ours.
    max_tokens: Option<serde_json::Value>,
    max_completion_tokens: Option<serde_json::Value>,
    /// The Responses API's name for it.
    max_output_tokens: Option<serde_json::Value>,
    n: Option<serde_json::Value>,
    #[serde(borrow)]
    previous_response_id: Option<Cow<'a, str>>,
    store: Option<serde_json::Value>,
}

/// What a body says of the fields read: the strings as they are, the counts and flags as
/// `serde_json::Value::as_u64` and `as_bool` read them (a value of another type is `None`).
#[derive(Debug, Default, PartialEq, Eq)]
struct Fields<'a> {
    model: Option<Cow<'a, str>>,
    stream: Option<bool>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
    n: Option<u64>,
    previous_response_id: Option<Cow<'a, str>>,
    store: Option<bool>,
}

impl<'a> From<Peek<'a>> for Fields<'a> {
    fn from(peek: Peek<'a>) -> Fields<'a> {
        let count = |v: Option<serde_json::Value>| v.as_ref().and_then(serde_json::Value::as_u64);
        Fields {
            model: peek.model,
            stream: peek.stream,
            max_tokens: count(peek.max_tokens),
            max_completion_tokens: count(peek.max_completion_tokens),
            max_output_tokens: count(peek.max_output_tokens),
            n: count(peek.n),
            previous_response_id: peek.previous_response_id,
            store: peek.store.as_ref().and_then(serde_json::Value::as_bool),
        }
    }
}

/// serde's reading of `body`: the fields, or why it is not JSON as a request must be.
fn by_serde(body: &[u8]) -> Result<Fields<'_>, serde_json::Error> {
    serde_json::from_slice::<Peek<'_>>(body).map(Fields::from)
}

/// Checks that `body` is a JSON object with a string `model` and reads what routing needs. With
/// `model_optional` (the Responses API, whose create may name no model) a body without one
/// gives an empty `model`, for the handler to resolve.
///
/// A plain body is read without serde (`plain`), with the same answer; serde reads the rest and
/// words the error for a body that is not JSON.
pub fn summarize(body: &[u8], model_optional: bool) -> Result<RequestSummary, ApiError> {
    let fields = match plain::read(body) {
        Some(fields) => fields,
        None => by_serde(body).map_err(|e| {
            ApiError::new(
                ErrorKind::MalformedRequest,
                format!("request body is not valid JSON: {e}"),
            )
        })?,
    };
    let previous_response_id = fields
        .previous_response_id
        .filter(|id| !id.is_empty())
        .map(|id| id.into_owned());
    let model = match fields.model.filter(|m| !m.is_empty()) {
        Some(model) => model,
        None if model_optional => Default::default(),
        None => {
            return Err(ApiError::new(
                ErrorKind::MalformedRequest,
                "request body needs a non-empty string field `model`",
            ))
        }
    };
    let max_tokens = fields
        .max_completion_tokens
        .or(fields.max_output_tokens)
        .or(fields.max_tokens);
    Ok(RequestSummary {
        model: model.into_owned(),
        stream: fields.stream.unwrap_or(false),
        max_tokens,
        choices: fields.n.unwrap_or(1).clamp(1, 128),
        previous_response_id,
        store: fields.store,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn reads_model_and_stream_and_ignores_the_rest() {
        let s = summarize(
            br#"{"model":"m","stream":true,"x_vendor":{"a":[1]}}"#,
            false,
        )
        .unwrap();
        assert_eq!(
            s,
            RequestSummary {
                model: "m".into(),
                stream: true,
                max_tokens: None,
                choices: 1,
                previous_response_id: None,
                store: None,
            }
        );
        let s = summarize(br#"{"model":"m\u00e9"}"#, false).unwrap();
        assert_eq!(s.model, "mé");
        assert!(!s.stream);
    }

    #[test]
    fn reads_what_a_token_estimate_needs() {
        let s = summarize(br#"{"model":"m","max_tokens":50,"n":3}"#, false).unwrap();
        assert_eq!((s.max_tokens, s.choices), (Some(50), 3));
        let s = summarize(
            br#"{"model":"m","max_tokens":50,"max_completion_tokens":70}"#,
            false,
        )
        .unwrap();
        assert_eq!(s.max_tokens, Some(70));
        // The Responses API's field; the Messages API uses `max_tokens`.
        let s = summarize(
            br#"{"model":"m","input":"hi","max_output_tokens":90}"#,
            false,
        )
        .unwrap();
        assert_eq!(s.max_tokens, Some(90));
        // Wrong types are left for the backend to refuse.
        let s = summarize(br#"{"model":"m","max_tokens":"lots","n":-1}"#, false).unwrap();
        assert_eq!((s.max_tokens, s.choices), (None, 1));
    }

    #[test]
    fn refuses_non_objects_missing_model_and_bad_types() {
        for body in [
            &b"[]"[..],
            b"{}",
            b"{\"model\":3}",
            b"{\"model\":\"\"}",
            b"{\"model\":\"m\",\"stream\":\"yes\"}",
            b"nul",
        ] {
            let e = summarize(body, false).unwrap_err();
            assert_eq!(
                e.kind,
                ErrorKind::MalformedRequest,
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn a_missing_model_is_left_to_resolve_where_it_may_be_missing() {
        for body in [
            &b"{}"[..],
            b"{\"model\":\"\"}",
            b"{\"previous_response_id\":\"r\"}",
        ] {
            assert_eq!(summarize(body, true).unwrap().model, "");
            assert!(summarize(body, false).is_err());
        }
        assert!(
            summarize(b"{\"model\":3}", true).is_err(),
            "a wrong type still is"
        );
        assert!(summarize(b"[]", true).is_err());
    }

    proptest! {
        #[test]
        fn parser_never_panics_on_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = summarize(&bytes, false);
            let _ = summarize(&bytes, true);
        }

        #[test]
        fn parser_accepts_any_object_with_a_model(model in "[a-zA-Z0-9._/-]{1,40}", extra in "[a-z]{1,8}") {
            let body = serde_json::json!({ "model": model, extra: [1, {"k": null}] }).to_string();
            prop_assert_eq!(summarize(body.as_bytes(), false).unwrap().model, model);
        }
    }
}
