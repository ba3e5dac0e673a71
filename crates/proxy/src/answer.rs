//! A response as the inference path makes it and the HTTP/1 writer writes it: its status, its
//! header lines and its body.
//!
//! A backend's answer keeps its header lines as they came, in its head ([`Lines`]: each value a
//! place in the head, found by a pass over a few lines), from the upstream reader through the
//! attempt loop and the respond stage to the client's writer, which writes them from there. An
//! `http::HeaderMap` would take two allocations and an atomic count on the head's buffer for
//! each value, and hash each name, for lines that are looked at a few times and written once.
//! The gateway's own refusals are made as one (`ApiError::answer`); a response that axum makes
//! comes as an `http::Response` and is taken as it is ([`Answer::from`]); HTTP/2, which hyper
//! writes, gets one back ([`Answer::into_response`]).

use axum::body::Body;
use http::{Extensions, StatusCode};

use crate::lines::Lines;

/// A response: status, header lines, body.
pub(crate) struct Answer<B = Body> {
    pub status: StatusCode,
    pub lines: Lines,
    pub body: B,
    /// What a response made by axum carries for hyper; nothing on the inference path.
    pub extensions: Extensions,
}

impl<B> Answer<B> {
    pub(crate) fn new(status: StatusCode, lines: Lines, body: B) -> Self {
        Answer {
            status,
            lines,
            body,
            extensions: Extensions::new(),
        }
    }

    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    #[cfg(test)]
    pub(crate) fn into_body(self) -> B {
        self.body
    }

    /// The same answer with its body made by `f` from this one's.
    pub(crate) fn map<C>(self, f: impl FnOnce(B) -> C) -> Answer<C> {
        Answer {
            status: self.status,
            lines: self.lines,
            body: f(self.body),
            extensions: self.extensions,
        }
    }

    /// The same answer as an `http::Response`, its lines in a header map.
    pub(crate) fn into_response(self) -> http::Response<B> {
        let mut response = http::Response::new(self.body);
        *response.status_mut() = self.status;
        *response.headers_mut() = self.lines.into_map();
        *response.extensions_mut() = self.extensions;
        response
    }
}

impl<B> From<http::Response<B>> for Answer<B> {
    fn from(response: http::Response<B>) -> Self {
        let (parts, body) = response.into_parts();
        Answer {
            status: parts.status,
            lines: Lines::from_map(parts.headers),
            body,
            extensions: parts.extensions,
        }
    }
}

#[cfg(test)]
mod tests {
    use http::{header, HeaderValue};

    use super::*;

    #[test]
    fn a_response_comes_back_as_it_was_taken() {
        let mut response = http::Response::new("body");
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let headers = response.headers_mut();
        headers.append(header::RETRY_AFTER, HeaderValue::from_static("3"));
        headers.append(header::VARY, HeaderValue::from_static("a"));
        headers.append(header::VARY, HeaderValue::from_static("b"));
        response.extensions_mut().insert(7u8);
        let expected = response.headers().clone();

        let answer = Answer::from(response);
        assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.lines.get(&header::RETRY_AFTER), Some(&b"3"[..]));
        let vary: Vec<_> = answer.lines.get_all(&header::VARY).collect();
        assert_eq!(vary, [&b"a"[..], b"b"]);

        let back = answer.map(|body| body.len()).into_response();
        assert_eq!(back.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(back.headers(), &expected);
        assert_eq!(back.extensions().get::<u8>(), Some(&7));
        assert_eq!(*back.body(), 4);
    }
}
