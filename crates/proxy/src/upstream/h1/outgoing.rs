//! The request a connection writes: its head made once per attempt, the body after it.

use std::borrow::Cow;

use bytes::Bytes;
use http::{header, HeaderName, Method};

/// A body up to this size is written in one piece with its head.
const INLINE_BODY: usize = 16 * 1024;

/// A request as a connection writes it, made once and written again as it is when a kept
/// connection turns out closed: its head (request line, headers, the body's own
/// `Content-Length`) with the body after it when the body is small, else the body apart.
pub(crate) struct Outgoing {
    pub(super) method: Method,
    pub(super) head: Vec<u8>,
    pub(super) rest: Bytes,
}

/// The header lines of an [`Outgoing`] request as they are written.
pub(crate) struct HeadLines(Vec<u8>);

impl HeadLines {
    /// Writes `name: value`, unless it is framing: the body's own is written, never a header's.
    pub(crate) fn header(&mut self, name: &HeaderName, value: &[u8]) {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            return;
        }
        self.0.extend_from_slice(name.as_str().as_bytes());
        self.0.extend_from_slice(b": ");
        self.0.extend_from_slice(value);
        self.0.extend_from_slice(b"\r\n");
    }
}

impl Outgoing {
    /// `method` on `target` (a path and query), with the header lines `headers` writes and
    /// `body`. Header names and values are `http`'s checked ones, which cannot hold a line break.
    /// A small body is copied into the head, so one lent is then not held (nor its reference
    /// count touched).
    pub(crate) fn new(
        method: Method,
        target: &str,
        headers: impl FnOnce(&mut HeadLines),
        body: Cow<'_, Bytes>,
    ) -> Outgoing {
        let inline = body.len() <= INLINE_BODY;
        let mut lines = HeadLines(Vec::with_capacity(
            512 + if inline { body.len() } else { 0 },
        ));
        let out = &mut lines.0;
        out.extend_from_slice(method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(if target.is_empty() { "/" } else { target }.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        headers(&mut lines);
        let mut head = lines.0;
        let with_body = matches!(method, Method::POST | Method::PUT | Method::PATCH);
        if with_body || !body.is_empty() {
            head.extend_from_slice(b"content-length: ");
            head.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");
        let rest = if inline {
            head.extend_from_slice(&body);
            Bytes::new()
        } else {
            body.into_owned()
        };
        Outgoing { method, head, rest }
    }

    /// `req` as it is: its method, the path and query of its URI, its headers and body.
    #[cfg(test)]
    pub(crate) fn of(req: &http::Request<Bytes>) -> Outgoing {
        let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let headers = |lines: &mut HeadLines| {
            for (name, value) in req.headers() {
                lines.header(name, value.as_bytes());
            }
        };
        Outgoing::new(
            req.method().clone(),
            target,
            headers,
            Cow::Borrowed(req.body()),
        )
    }
}
