//! The client's request body: read under a size cap, checked as JSON, and rewritten only when a
//! backend knows the model by another name.
//!
//! The body is forwarded as the bytes the client sent, so fields spillway does not know (new
//! OpenAI parameters, vendor extensions, `encoding_format`) pass through untouched. Only `model`
//! and `stream` are read.

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use serde::Deserialize;

use crate::error::{ApiError, ErrorKind};

/// The fields of a request body that routing needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSummary {
    pub model: String,
    pub stream: bool,
}

#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow)]
    model: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
}

/// Reads the whole body, refusing it with 413 as soon as it passes `cap` bytes.
pub async fn read_body(body: axum::body::Body, cap: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, cap).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::new(
            ErrorKind::BodyTooLarge,
            format!("request body is larger than the limit of {cap} bytes"),
        )),
        Err(e) => Err(ApiError::new(
            ErrorKind::MalformedRequest,
            format!("could not read the request body: {e}"),
        )),
    }
}

/// Checks that `body` is a JSON object with a string `model` and reads what routing needs.
pub fn summarize(body: &[u8]) -> Result<RequestSummary, ApiError> {
    let peek: Peek<'_> = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            ErrorKind::MalformedRequest,
            format!("request body is not valid JSON: {e}"),
        )
    })?;
    let model = peek.model.filter(|m| !m.is_empty()).ok_or_else(|| {
        ApiError::new(
            ErrorKind::MalformedRequest,
            "request body needs a non-empty string field `model`",
        )
    })?;
    Ok(RequestSummary {
        model: model.into_owned(),
        stream: peek.stream.unwrap_or(false),
    })
}

/// The body with `model` replaced, every other field kept as it was (order included).
pub fn with_model(body: &Bytes, model: &str) -> Result<Bytes, ApiError> {
    let mut value: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(ErrorKind::MalformedRequest, e.to_string()))?;
    value.insert(
        "model".to_owned(),
        serde_json::Value::String(model.to_owned()),
    );
    serde_json::to_vec(&value)
        .map(Bytes::from)
        .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn reads_model_and_stream_and_ignores_the_rest() {
        let s = summarize(br#"{"model":"m","stream":true,"x_vendor":{"a":[1]}}"#).unwrap();
        assert_eq!(
            s,
            RequestSummary {
                model: "m".into(),
                stream: true
            }
        );
        let s = summarize(br#"{"model":"m\u00e9"}"#).unwrap();
        assert_eq!(
            s,
            RequestSummary {
                model: "mé".into(),
                stream: false
            }
        );
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
            let e = summarize(body).unwrap_err();
            assert_eq!(
                e.kind,
                ErrorKind::MalformedRequest,
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn model_rewrite_keeps_unknown_fields_and_order() {
        let body = Bytes::from_static(
            br#"{"z":1,"model":"public","encoding_format":"base64","input":"x"}"#,
        );
        let out = with_model(&body, "private").unwrap();
        assert_eq!(
            &out[..],
            br#"{"z":1,"model":"private","encoding_format":"base64","input":"x"}"#
        );
    }

    #[tokio::test]
    async fn body_over_the_cap_is_413() {
        let e = read_body(axum::body::Body::from(vec![b' '; 11]), 10)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::BodyTooLarge);
        let ok = read_body(axum::body::Body::from(vec![b' '; 10]), 10)
            .await
            .unwrap();
        assert_eq!(ok.len(), 10);
    }

    proptest! {
        #[test]
        fn parser_never_panics_on_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = summarize(&bytes);
            let _ = with_model(&Bytes::from(bytes), "m");
        }

        #[test]
        fn parser_accepts_any_object_with_a_model(model in "[a-zA-Z0-9._/-]{1,40}", extra in "[a-z]{1,8}") {
            let body = serde_json::json!({ "model": model, extra: [1, {"k": null}] }).to_string();
            prop_assert_eq!(summarize(body.as_bytes()).unwrap().model, model);
        }
    }
}
