//! A request's head as a client sends it (RFC 9112), read from the start of the connection's
//! buffer: the request (method, target, version, headers), how its body is framed, and whether
//! the connection may carry another request after it. Pure, so every way a head can be
//! malformed is tested without a socket.
//!
//! Where readers could disagree about where a body ends (the request smuggling of RFC 9112
//! §11.2), the head is refused rather than read one way: `Transfer-Encoding` together with
//! `Content-Length`, `Transfer-Encoding` in HTTP/1.0, any coding but one `chunked`,
//! `Content-Length` values that are not one decimal number, more than one `Host`. httparse
//! refuses what else is ambiguous: a line folded over two (obs-fold), white space before a
//! header's colon, a bare CR.

use std::mem::MaybeUninit;
use std::sync::LazyLock;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName};
use http::{Method, Request, Uri, Version};
use smallvec::SmallVec;

use crate::endpoint::Endpoint;
use crate::lines::Lines;
use crate::upstream::h1::decode::Framing;

/// The most header lines one head may have.
pub(crate) const MAX_HEADERS: usize = 100;
/// The longest request target read.
pub(crate) const MAX_TARGET: usize = 16 * 1024;

/// A request head read whole.
#[derive(Debug)]
pub(crate) struct Head {
    /// The request line; its headers are in `lines`.
    pub request: Request<()>,
    pub lines: Lines,
    /// A request's body is never delimited by the connection's close: a length (0 without
    /// either header) or chunked.
    pub framing: Framing,
    /// The client keeps the connection for another request (HTTP/1.1 unless it says `close`;
    /// HTTP/1.0 only when it says `keep-alive`).
    pub keep_alive: bool,
    /// `Expect: 100-continue`: the client waits for `100 Continue` before sending its body.
    pub expect_continue: bool,
}

/// Why a head is refused; the connection is answered and closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not a request head as RFC 9112 writes it, or framed ambiguously.
    Malformed(&'static str),
    /// More than the buffer holds, or more than [`MAX_HEADERS`] lines.
    TooLarge,
    /// A request target longer than [`MAX_TARGET`].
    TargetTooLong,
}

/// The head at the start of `buf`, taken from it; `None` while it is partial.
pub(crate) fn parse(buf: &mut BytesMut) -> Result<Option<Head>, Refusal> {
    // Left uninitialised: httparse writes each line it reads.
    let mut storage = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let len = match parsed.parse_with_uninit_headers(buf, &mut storage) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Refusal::TooLarge),
        Err(_) => return Err(Refusal::Malformed("the request head is not HTTP/1.1")),
    };
    let (Some(method), Some(target), Some(minor)) = (parsed.method, parsed.path, parsed.version)
    else {
        return Err(Refusal::Malformed("the request head is not HTTP/1.1"));
    };
    if target.len() > MAX_TARGET {
        return Err(Refusal::TargetTooLong);
    }
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|_| Refusal::Malformed("invalid method"))?;
    let version = if minor == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    // Values are kept as slices of the head, which is split off the buffer once it is read:
    // where each one lies is noted now, while httparse borrows the buffer.
    let base = buf.as_ptr() as usize;
    let span = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        start..start + s.len()
    };
    let target_at = span(target.as_bytes());
    let mut facts = Facts::default();
    // Made empty and then grown: `with_capacity` would return the inline array by value, a copy
    // of its 784 bytes on every request.
    let mut names: SmallVec<[(HeaderName, std::ops::Range<usize>); 16]> = SmallVec::new();
    names.reserve_exact(parsed.headers.len());
    for h in parsed.headers.iter() {
        let name = crate::upstream::h1::names::header_name(h.name.as_bytes())
            .map_err(|_| Refusal::Malformed("invalid header name"))?;
        facts.read(&name, h.value)?;
        names.push((name, span(h.value)));
    }
    let head = buf.split_to(len).freeze();
    let uri =
        target_uri(&head, target_at).map_err(|_| Refusal::Malformed("invalid request target"))?;
    // httparse has refused every value with a byte a field value may not hold. Room for the
    // `x-request-id` the connection adds when the caller sent none.
    let lines = Lines::in_head(head, names.drain(..), 1);
    let framing = facts.framing(version)?;
    let keep_alive = match version {
        Version::HTTP_11 => !facts.close,
        _ => facts.keep_alive && !facts.close,
    };
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    Ok(Some(Head {
        request,
        lines,
        framing,
        keep_alive,
        expect_continue: facts.expect_continue && version == Version::HTTP_11,
    }))
}

/// The request target at `at` in `head`, as a `Uri`. An inference endpoint's own path, nearly
/// every request's whole target, is a copy of its `Uri` parsed once (a static one: no parse, and
/// no count kept on the head's buffer); any other target is parsed where it lies.
fn target_uri(head: &Bytes, at: std::ops::Range<usize>) -> Result<Uri, http::uri::InvalidUri> {
    static PARSED: LazyLock<[Uri; Endpoint::ALL.len()]> = LazyLock::new(|| {
        Endpoint::ALL.map(|e| {
            let path = format!("/v1{}", e.path());
            Uri::from_maybe_shared(Bytes::from(path)).expect("an endpoint's path is a URI")
        })
    });
    let target = &head[at.clone()];
    let endpoint = target.strip_prefix(b"/v1").and_then(|path| {
        Endpoint::ALL
            .iter()
            .position(|e| e.path().as_bytes() == path)
    });
    match endpoint {
        Some(i) => Ok(PARSED[i].clone()),
        None => Uri::from_maybe_shared(head.slice(at)),
    }
}

/// What the body's framing and the connection depend on, read as the headers are.
#[derive(Default)]
struct Facts {
    close: bool,
    keep_alive: bool,
    expect_continue: bool,
    hosts: usize,
    /// A `Transfer-Encoding` header came; the codings it named, and whether every one was
    /// `chunked`.
    coded: bool,
    codings: usize,
    only_chunked: bool,
    /// The `Content-Length`: every value (and list item) the same decimal number.
    length: Option<u64>,
}

impl Facts {
    fn read(&mut self, name: &HeaderName, value: &[u8]) -> Result<(), Refusal> {
        if name == header::CONTENT_LENGTH {
            // Every item counts, the empty ones too (which are refused).
            for item in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                let n = crate::upstream::h1::decimal(item)
                    .ok_or(Refusal::Malformed("invalid content-length"))?;
                if self.length.is_some_and(|l| l != n) {
                    return Err(Refusal::Malformed("conflicting content-length values"));
                }
                self.length = Some(n);
            }
        } else if name == header::TRANSFER_ENCODING {
            if !self.coded {
                self.coded = true;
                self.only_chunked = true;
            }
            for item in crate::upstream::hop::list_items(value) {
                self.codings += 1;
                self.only_chunked &= item.eq_ignore_ascii_case(b"chunked");
            }
        } else if name == header::CONNECTION {
            for item in crate::upstream::hop::list_items(value) {
                self.close |= item.eq_ignore_ascii_case(b"close");
                self.keep_alive |= item.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name == header::HOST {
            self.hosts += 1;
            if self.hosts > 1 {
                return Err(Refusal::Malformed("more than one host header"));
            }
        } else if name == header::EXPECT {
            self.expect_continue |= value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
        }
        Ok(())
    }

    fn framing(&self, version: Version) -> Result<Framing, Refusal> {
        if !self.coded {
            return Ok(Framing::Length(self.length.unwrap_or(0)));
        }
        if version != Version::HTTP_11 {
            return Err(Refusal::Malformed(
                "transfer-encoding in an HTTP/1.0 request",
            ));
        }
        if self.length.is_some() {
            return Err(Refusal::Malformed(
                "both transfer-encoding and content-length",
            ));
        }
        if self.codings != 1 || !self.only_chunked {
            return Err(Refusal::Malformed(
                "the only transfer coding accepted is a single chunked",
            ));
        }
        Ok(Framing::Chunked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read(bytes: &[u8]) -> Result<Option<Head>, Refusal> {
        parse(&mut BytesMut::from(bytes))
    }

    fn framing_of(bytes: &[u8]) -> Result<Framing, Refusal> {
        read(bytes).map(|h| h.expect("a whole head").framing)
    }

    #[test]
    fn a_chat_request_head_is_read_with_its_length_and_leaves_the_body() {
        let mut buf = BytesMut::from(
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 4\r\n\
              Authorization: Bearer k\r\nX-Custom: a b\r\n\r\nbody"
                .as_slice(),
        );
        let head = parse(&mut buf).unwrap().unwrap();
        assert_eq!(head.request.method(), Method::POST);
        assert_eq!(head.request.uri().path(), "/v1/chat/completions");
        assert_eq!(head.request.uri().query(), Some("x=1"));
        assert_eq!(head.request.version(), Version::HTTP_11);
        let line = |name: &str| {
            head.lines
                .get(&HeaderName::from_bytes(name.as_bytes()).unwrap())
        };
        assert_eq!(line("authorization"), Some(&b"Bearer k"[..]));
        assert_eq!(line("x-custom"), Some(&b"a b"[..]));
        assert!(head.request.headers().is_empty());
        assert_eq!(head.framing, Framing::Length(4));
        assert!(head.keep_alive && !head.expect_continue);
        assert_eq!(&buf[..], b"body");
    }

    #[test]
    fn an_endpoints_target_is_the_uri_its_parse_gives_and_any_other_is_parsed() {
        let endpoints = Endpoint::ALL.map(|e| format!("/v1{}", e.path()));
        let others = [
            "/v1/chat/completions?api-version=1",
            "/v1/chat/completion",
            "/v1/chat/completions/",
            "/chat/completions",
            "/v1/models",
            "*",
        ];
        for target in endpoints.iter().map(String::as_str).chain(others) {
            let head = Bytes::from(format!("GET {target} HTTP/1.1"));
            let uri = target_uri(&head, 4..4 + target.len()).unwrap();
            let parsed = Uri::from_maybe_shared(Bytes::from(target.to_owned())).unwrap();
            assert_eq!(uri, parsed, "{target}");
            assert_eq!(uri.path_and_query(), parsed.path_and_query(), "{target}");
            assert_eq!(uri.to_string(), target);
        }
        let head = Bytes::from_static(b"GET /v1/\x7f HTTP/1.1");
        assert!(target_uri(&head, 4..9).is_err());
    }

    #[test]
    fn a_partial_head_waits_for_more() {
        assert!(read(b"POST /v1/chat HTTP/1.1\r\nHost: gw\r\n")
            .unwrap()
            .is_none());
        assert!(read(b"PO").unwrap().is_none());
    }

    #[test]
    fn keep_alive_follows_the_version_and_the_connection_header() {
        let alive = |b: &[u8]| read(b).unwrap().unwrap().keep_alive;
        assert!(alive(b"GET / HTTP/1.1\r\n\r\n"));
        assert!(!alive(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"));
        assert!(!alive(b"GET / HTTP/1.0\r\n\r\n"));
        assert!(alive(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
        assert!(!alive(
            b"GET / HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n"
        ));
    }

    #[test]
    fn expect_continue_is_heard_in_http_11_only() {
        let expects = |b: &[u8]| read(b).unwrap().unwrap().expect_continue;
        assert!(expects(
            b"POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n"
        ));
        assert!(!expects(
            b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n"
        ));
    }

    #[test]
    fn chunked_is_the_one_coding_read() {
        assert_eq!(
            framing_of(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Ok(Framing::Chunked)
        );
        assert_eq!(
            framing_of(b"POST / HTTP/1.1\r\nTransfer-Encoding:  Chunked \r\n\r\n"),
            Ok(Framing::Chunked)
        );
        assert_eq!(
            framing_of(b"GET / HTTP/1.1\r\n\r\n"),
            Ok(Framing::Length(0))
        );
        assert_eq!(
            framing_of(b"POST / HTTP/1.1\r\nContent-Length: 7, 7\r\nContent-Length: 7\r\n\r\n"),
            Ok(Framing::Length(7))
        );
    }

    /// Every head below is read one way by some servers or proxies and another way by others:
    /// each is refused, so none can smuggle a request past the gateway into the next one.
    #[test]
    fn ambiguous_framing_is_refused() {
        let refused: &[&[u8]] = &[
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked;q=1\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: \r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 0x5\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5,\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5\rX: 1\r\n\r\n",
            b"POST / HTTP/1.1\r\nX-A: a\0b\r\n\r\n",
            b"POST /a b HTTP/1.1\r\n\r\n",
            b"POST / HTTP/2.0\r\n\r\n",
            b"NOT HTTP AT ALL\r\n\r\n",
        ];
        for head in refused {
            assert!(
                matches!(read(head), Err(Refusal::Malformed(_))),
                "read: {:?}",
                String::from_utf8_lossy(head)
            );
        }
    }

    /// The lines keep their values as the head has them, unchecked: the reader must refuse
    /// every byte a field value may not hold, as `HeaderValue` does, and take every other.
    #[test]
    fn a_value_is_refused_for_exactly_the_bytes_a_header_value_may_not_hold() {
        for b in 0..=255u8 {
            let mut bytes = b"POST / HTTP/1.1\r\nX-A: a".to_vec();
            bytes.extend_from_slice(&[b, b'z']);
            bytes.extend_from_slice(b"\r\n\r\n");
            let valid = http::HeaderValue::from_bytes(&[b'a', b, b'z']).is_ok();
            match read(&bytes) {
                Ok(Some(head)) => {
                    assert!(valid, "byte {b} was taken");
                    let value = head.lines.get(&HeaderName::from_static("x-a")).unwrap();
                    assert_eq!(value, [b'a', b, b'z'], "byte {b}");
                }
                Err(Refusal::Malformed(_)) => assert!(!valid, "byte {b} was refused"),
                other => panic!("byte {b}: {other:?}"),
            }
        }
    }

    /// More lines than the list noted while reading keeps in place (16): every one is kept,
    /// in order, its value where it lay.
    #[test]
    fn a_head_of_many_lines_keeps_every_one() {
        let mut head = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..MAX_HEADERS {
            head.extend_from_slice(format!("x-{i}: value {i}\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        let read = read(&head).unwrap().unwrap();
        let lines: Vec<_> = read
            .lines
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.to_vec()))
            .collect();
        let sent: Vec<_> = (0..MAX_HEADERS)
            .map(|i| (format!("x-{i}"), format!("value {i}").into_bytes()))
            .collect();
        assert_eq!(lines, sent);
    }

    #[test]
    fn too_many_lines_and_too_long_a_target_are_refused_by_size() {
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            many.extend_from_slice(format!("x-{i}: 1\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(read(&many).unwrap_err(), Refusal::TooLarge);
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_TARGET));
        assert_eq!(read(long.as_bytes()).unwrap_err(), Refusal::TargetTooLong);
    }

    proptest! {
        /// A head cut anywhere is partial until its last byte, and then read the same.
        #[test]
        fn a_head_is_read_the_same_however_it_arrives(cut in 0usize..200, n in 0u64..100_000) {
            let whole = format!(
                "POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-length: {n}\r\nx-y: z\r\n\r\n"
            );
            let cut = cut % whole.len();
            prop_assert!(read(&whole.as_bytes()[..cut]).unwrap().is_none());
            let head = read(whole.as_bytes()).unwrap().unwrap();
            prop_assert_eq!(head.framing, Framing::Length(n));
        }

        /// Any bytes at all give a head, a wait for more or a refusal, never a panic.
        #[test]
        fn any_bytes_are_read_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = read(&bytes);
        }
    }
}
