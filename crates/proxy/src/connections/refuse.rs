//! Answers written straight to a connection before any request is served: to a connection over
//! the cap, and to a head that could not be read. Each is a whole HTTP/1.1 response with the
//! API's JSON error body and `Connection: close`.

use bytes::Bytes;

use super::h1::Refusal;
use crate::error::{ApiError, ErrorKind};

/// The answer to a connection accepted while the listener has its maximum open: the client is
/// told at once, instead of waiting in the kernel's backlog until its own timeout.
pub(crate) fn over_capacity(max: usize) -> Bytes {
    let e = ApiError::new(
        ErrorKind::TooManyConnections,
        format!("the gateway has its maximum of {max} client connections open; try again shortly"),
    );
    raw_response(&e, Some(1))
}

/// The answer to a head that could not be read: its status with a JSON error body.
pub(crate) fn bad_head(refusal: Refusal) -> Bytes {
    let (kind, message) = match refusal {
        Refusal::Malformed(why) => (
            ErrorKind::MalformedRequest,
            format!("the request could not be read as HTTP/1.1: {why}"),
        ),
        Refusal::TargetTooLong => (
            ErrorKind::UriTooLong,
            "the request's URI is too long".to_string(),
        ),
        Refusal::TooLarge => (
            ErrorKind::HeadTooLarge,
            "the request's line and headers are larger than the gateway reads".to_string(),
        ),
    };
    raw_response(&ApiError::new(kind, message), None)
}

fn raw_response(e: &ApiError, retry_after_secs: Option<u64>) -> Bytes {
    let status = e.status();
    let body = e.body().to_string();
    let mut head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    match retry_after_secs {
        Some(secs) => head.push_str(&format!(
            "retry-after: {secs}\r\nretry-after-ms: {}\r\n",
            secs * 1000
        )),
        None => head.push_str("x-should-retry: false\r\n"),
    }
    head.push_str("\r\n");
    head.push_str(&body);
    Bytes::from(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_heads_are_answered_in_json_with_their_status() {
        let r = bad_head(Refusal::TooLarge);
        let text = std::str::from_utf8(&r).unwrap();
        assert!(text.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(text.contains("connection: close\r\n"));
        let body = text.split("\r\n\r\n").nth(1).unwrap();
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], "request_head_too_large");
        let length: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, body.len());
        let r = bad_head(Refusal::Malformed("invalid method"));
        let text = std::str::from_utf8(&r).unwrap();
        assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(text.contains("invalid method"));
        assert!(std::str::from_utf8(&bad_head(Refusal::TargetTooLong))
            .unwrap()
            .starts_with("HTTP/1.1 414 "));
    }
}
