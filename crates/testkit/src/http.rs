//! HTTP as the black-box tests speak it: a client, JSON fetches, the OpenAI error shape.
//!
//! The mock's tests and the gateway's tests check the same wire: OpenAI-style bodies, errors
//! and server-sent events. One client setting (a fresh client per call, so no test reuses
//! another's connections, with an overall timeout so a hung server fails the test instead of
//! hanging it) and one reading of each shape keep the two suites judging alike.

use std::time::Duration;

use serde_json::Value;

/// Time allowed for one whole request, body included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A new client, so new connections, with [`REQUEST_TIMEOUT`].
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .expect("a reqwest client")
}

/// `GET url`, its body read as JSON.
pub async fn get_json(url: &str) -> Value {
    client()
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: the body is not JSON: {e}"))
}

/// Asserts that `r` is an OpenAI-style error: status `status`, and a JSON body whose `error`
/// has code `code`, a non-empty message and a type. Returns the response's headers.
pub async fn expect_openai_error(
    r: reqwest::Response,
    status: u16,
    code: &str,
) -> reqwest::header::HeaderMap {
    let headers = r.headers().clone();
    assert_eq!(r.status().as_u16(), status);
    let v: Value = r.json().await.expect("error body is JSON");
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    assert!(v["error"]["type"].is_string(), "{v}");
    headers
}

/// The `data:` payloads of a server-sent event stream, in order.
pub fn sse_data(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_data_is_every_data_payload_in_order() {
        let stream = "event: x\ndata: {\"a\":1}\n\ndata: [DONE]\n\n: comment\n";
        assert_eq!(sse_data(stream), ["{\"a\":1}", "[DONE]"]);
        assert!(sse_data("").is_empty());
    }
}
