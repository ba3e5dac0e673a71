//! Answers written straight to a connection, below hyper: to a connection over the cap, and in
//! place of hyper's empty answers to heads it could not read. Each is a whole HTTP/1.1 response
//! with the API's JSON error body and `Connection: close`.

use bytes::Bytes;

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

/// hyper's own answer to a head it could not read, if `written` begins with one (a 4xx or 5xx
/// status line of HTTP/1), replaced by the same status with a JSON error body.
pub(crate) fn replace_hyper_error(written: &[u8]) -> Option<Bytes> {
    let rest = written
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| written.strip_prefix(b"HTTP/1.0 "))?;
    let code = std::str::from_utf8(rest.get(..3)?).ok()?;
    let (kind, message) = match code {
        "400" => (
            ErrorKind::MalformedRequest,
            "the request could not be read as HTTP/1.1",
        ),
        "414" => (ErrorKind::UriTooLong, "the request's URI is too long"),
        "431" => (
            ErrorKind::HeadTooLarge,
            "the request's line and headers are larger than the gateway reads",
        ),
        c if c.starts_with('4') || c.starts_with('5') => (
            ErrorKind::MalformedRequest,
            "the request could not be read as HTTP/1.1",
        ),
        _ => return None,
    };
    Some(raw_response(&ApiError::new(kind, message), None))
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
    fn hyper_answers_become_json_with_their_status() {
        let r = replace_hyper_error(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n",
        )
        .expect("a 431 is hyper's");
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
    }

    #[test]
    fn other_bytes_are_left_alone() {
        assert!(replace_hyper_error(b"HTTP/1.1 200 OK\r\n").is_none());
        assert!(replace_hyper_error(b"{\"data\": 1}").is_none());
        assert!(replace_hyper_error(b"HTTP/1.1 4").is_none());
    }
}
