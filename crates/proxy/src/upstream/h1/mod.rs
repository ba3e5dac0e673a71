//! The gateway's HTTP/1.1 client connection to a backend: one request at a time, written and
//! read by the task of the request that uses it, with no task of its own and no channel between
//! the two (hyper's client connection runs as a task the request hands its request to, and gets
//! its response and every frame of the body back from, a wake-up each way).
//!
//! What it reads from a backend is bounded: at most [`MAX_BUFFER`] buffered, a response head
//! must fit in it with at most [`MAX_HEADERS`] headers (`httparse` parses it), and a body is
//! decoded by [`decode`], which decides when the connection may carry another request. The
//! request it writes is the gateway's own ([`Outgoing`]): its head written once per attempt from
//! `http`'s checked header names and values (which cannot hold a line break), with the body's
//! length set here, never taken from the headers.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, BytesMut};
use http::{header, HeaderName, Method, StatusCode, Version};
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

pub(crate) mod decode;
pub(crate) mod names;
mod outgoing;

use super::hop;
use crate::answer::Answer;
use crate::lines::Lines;
use crate::registered::Alarm;
use decode::{DecodeError, Framing};
pub(crate) use outgoing::Outgoing;

/// The most a connection buffers of what it reads (the memory budget counts it).
pub(crate) const MAX_BUFFER: usize = spillway_config::memory::UPSTREAM_READ_BYTES as usize;
/// The most headers a response head may have.
const MAX_HEADERS: usize = 100;
/// How much a read asks for.
const READ_SIZE: usize = 8 * 1024;
/// A read goes into the room left after what was taken from the buffer when there is at least
/// this much: a request or an answer of a few hundred bytes leaves most of the last read's
/// allocation, and the next ones go there rather than into a new one each.
const SMALLEST_READ: usize = 2 * 1024;

/// What a connection runs on: TCP, or TLS over it.
pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin {
    /// Whether an idle connection can carry a request as far as its socket tells: its far end
    /// has not closed it nor sent anything unasked. Asked without waiting: at most one `recv`,
    /// answered at once, and a read of one byte at most.
    fn quiet_and_open(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut byte = [0u8; 1];
        let mut probe = ReadBuf::new(&mut byte);
        Pin::new(self).poll_read(&mut cx, &mut probe).is_pending()
    }
}

/// A plain TCP connection, the common case, is asked with `try_read`: while the runtime has
/// seen nothing come on it, that is one atomic load, where a read polled with a waker takes the
/// socket's waiter lock and swaps the waker its last reader left for one that wakes nothing.
impl Io for tokio::net::TcpStream {
    fn quiet_and_open(&mut self) -> bool {
        matches!(self.try_read(&mut [0u8; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

/// A TLS connection (its reads decrypt: they are asked as reads).
impl<T: hyper::rt::Read + hyper::rt::Write + Send + Unpin> Io for hyper_util::rt::TokioIo<T> {}

/// The tests' in-memory connections.
#[cfg(test)]
impl Io for tokio::io::DuplexStream {}

/// An HTTP/1.1 connection to a backend, idle between requests. Its parts are boxed once, when
/// it is made: a connection moves with every answer (up the attempt loop, into the relay and
/// back to its backend's idle ones), and a pointer moves where they would be copied each time.
pub(crate) struct Conn(Box<Parts>);

struct Parts {
    io: Box<dyn Io>,
    /// Read and not yet taken: part of a response head or body.
    buf: BytesMut,
    /// The timer of its exchanges' deadlines ([`Conn::send_until`]), kept from one to the next:
    /// moved to a later deadline, a registered timer only has its expiry pushed back (one
    /// atomic exchange), where a timer of its own for each exchange is put into the runtime's
    /// timer wheel and taken out again, under the wheel's lock, every time.
    timer: Option<Alarm>,
    /// The reading of the response body on it, as hyper's connection keeps its decoder.
    reading: Reading,
}

/// A response body being read on its connection: how it ends, and whether and how the
/// connection is kept after it.
pub(crate) struct Reading {
    pub decoder: decode::Decoder,
    pub reusable: bool,
    pub keep: Keep,
}

impl Reading {
    fn new(framing: Framing, reusable: bool, keep: Keep) -> Reading {
        Reading {
            decoder: decode::Decoder::new(framing),
            reusable,
            keep,
        }
    }
}

/// How many idle connections a backend keeps, and for how long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keep {
    pub max: usize,
    pub idle_timeout: std::time::Duration,
}

impl Keep {
    /// None kept.
    const NOTHING: Keep = Keep {
        max: 0,
        idle_timeout: std::time::Duration::ZERO,
    };
}

/// Why an exchange failed.
#[derive(Debug)]
pub(crate) enum Error {
    /// The connection ended (closed or reset) before any byte of a response, writing or reading.
    Closed(Option<io::Error>),
    /// It failed after a response had started.
    Io(io::Error),
    /// The response head did not fit in [`MAX_BUFFER`].
    HeadTooLarge,
    /// The response head was not HTTP/1.
    Head(&'static str),
    /// No response head came by the exchange's deadline ([`Conn::send_until`]).
    TimedOut,
    /// The body was not framed as its head said.
    Body(DecodeError),
}

impl Error {
    /// Whether no byte of a response had come: on a kept connection, the backend closed it
    /// before it read the request.
    pub(crate) fn before_response(&self) -> bool {
        matches!(self, Error::Closed(_))
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Closed(None) => f.write_str("connection closed before a response"),
            Error::Closed(Some(e)) => write!(f, "connection closed before a response: {e}"),
            Error::Io(e) => write!(f, "connection failed: {e}"),
            Error::HeadTooLarge => write!(f, "response head larger than {MAX_BUFFER} bytes"),
            Error::Head(what) => write!(f, "invalid response head: {what}"),
            Error::TimedOut => f.write_str("no response head by the deadline"),
            Error::Body(e) => write!(f, "invalid response body: {e}"),
        }
    }
}

impl std::error::Error for Error {}

/// A response head, with how its body is framed and whether the connection may carry another
/// request after it.
pub(crate) struct Head {
    pub response: Answer<()>,
    pub framing: Framing,
    pub reusable: bool,
}

impl Conn {
    pub(crate) fn new(io: Box<dyn Io>) -> Conn {
        Conn(Box::new(Parts {
            io,
            buf: BytesMut::new(),
            timer: None,
            // No body yet: one already at its end, after which nothing is kept.
            reading: Reading::new(Framing::Length(0), false, Keep::NOTHING),
        }))
    }

    /// [`send`](Conn::send), given up with [`Error::TimedOut`] when no response head has come by
    /// `deadline`.
    ///
    /// The connection's one timer is moved in for a deadline earlier than its own, and left as
    /// it is for a later one (each exchange's is later than the last's, as time goes on): when
    /// it fires before the exchange's deadline, it is set to that deadline then. A busy
    /// connection's timer is thus set once a timeout's length, not once an exchange (each setting
    /// takes it out of the timer wheel and puts it back).
    pub(crate) async fn send_until(
        &mut self,
        req: &Outgoing,
        deadline: tokio::time::Instant,
    ) -> Result<Head, Error> {
        let mut timer = match self.0.timer.take() {
            Some(mut timer) => {
                if timer.deadline() > deadline {
                    timer.reset(deadline);
                }
                timer
            }
            None => Alarm::at(deadline),
        };
        let sent = {
            let mut send = std::pin::pin!(self.send(req));
            std::future::poll_fn(|cx| {
                if let Poll::Ready(sent) = send.as_mut().poll(cx) {
                    return Poll::Ready(sent);
                }
                // Polled each time the exchange is woken, the timer registers this task once.
                while timer.poll(cx).is_ready() {
                    if timer.deadline() >= deadline {
                        return Poll::Ready(Err(Error::TimedOut));
                    }
                    // An earlier exchange's deadline: this one's is still to come.
                    timer.reset(deadline);
                }
                Poll::Pending
            })
            .await
        };
        self.0.timer = Some(timer);
        sent
    }

    /// Writes `req` and reads its response head. A backend that answers before it has read the
    /// whole request (a `413` to a large body) and stops reading is heard: its answer is read
    /// while the request is still being written, and the connection is not used again.
    pub(crate) async fn send(&mut self, req: &Outgoing) -> Result<Head, Error> {
        let method = &req.method;
        let (head, rest): (&[u8], &[u8]) = (&req.head, &req.rest);
        // Bytes of a response seen: after them, a close is a failure, not a stale connection.
        let mut seen = false;
        let mut written = 0;
        let early = std::future::poll_fn(|cx| {
            self.poll_write_request(cx, method, (head, rest), (&mut written, &mut seen))
        })
        .await?;
        if let Some(mut head) = early {
            head.reusable = false;
            return Ok(head);
        }
        if let Err(e) = self.0.io.flush().await {
            return Err(Error::Io(e));
        }
        std::future::poll_fn(|cx| self.poll_head(cx, method, &mut seen)).await
    }

    /// Writes what is left of the request's `head` and `rest` of its body, counting what was
    /// `written`; while the socket takes no more, reads what the backend sent, and returns the
    /// final response head if one came.
    fn poll_write_request(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
        (head, rest): (&[u8], &[u8]),
        (written, seen): (&mut usize, &mut bool),
    ) -> Poll<Result<Option<Head>, Error>> {
        // Nothing went out yet: on a kept connection, the backend never saw the request.
        let failed = |e: io::Error, written: usize| match written {
            0 => Error::Closed(Some(e)),
            _ => Error::Io(e),
        };
        loop {
            let piece = match *written {
                n if n < head.len() => &head[n..],
                n if n < head.len() + rest.len() => &rest[n - head.len()..],
                _ => return Poll::Ready(Ok(None)),
            };
            match Pin::new(&mut self.0.io).poll_write(cx, piece) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(failed(io::ErrorKind::WriteZero.into(), *written)))
                }
                Poll::Ready(Ok(n)) => {
                    *written += n;
                    continue;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(failed(e, *written))),
                Poll::Pending => {}
            }
            // Blocked: the backend may have answered already and stopped reading.
            return match self.poll_head(cx, method, seen) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(head)) => Poll::Ready(Ok(Some(head))),
                // Part of the request went out: not a connection closed before it.
                Poll::Ready(Err(Error::Closed(e))) if *written > 0 => Poll::Ready(Err(Error::Io(
                    e.unwrap_or_else(|| io::ErrorKind::UnexpectedEof.into()),
                ))),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            };
        }
    }

    /// Reads until the final response head is in, skipping interim (1xx) ones; `seen` records
    /// that bytes of a response came, after which a close is a failure, not a stale connection.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
        seen: &mut bool,
    ) -> Poll<Result<Head, Error>> {
        loop {
            while let Some(head) = self.parse_head(method)? {
                if !head.response.status.is_informational() {
                    return Poll::Ready(Ok(head));
                }
                *seen = true;
            }
            if self.0.buf.len() >= MAX_BUFFER {
                return Poll::Ready(Err(Error::HeadTooLarge));
            }
            *seen |= !self.0.buf.is_empty();
            match std::task::ready!(self.poll_read_more(cx)) {
                Ok(0) if *seen => {
                    return Poll::Ready(Err(Error::Io(io::ErrorKind::UnexpectedEof.into())))
                }
                Ok(0) => return Poll::Ready(Err(Error::Closed(None))),
                Ok(_) => {}
                Err(e) if *seen => return Poll::Ready(Err(Error::Io(e))),
                Err(e) => return Poll::Ready(Err(Error::Closed(Some(e)))),
            }
        }
    }

    /// The response head at the start of the buffer, taken from it; `None` while it is partial.
    fn parse_head(&mut self, method: &Method) -> Result<Option<Head>, Error> {
        if self.0.buf.is_empty() {
            return Ok(None);
        }
        // Left uninitialised: httparse writes each line it reads.
        let mut storage = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let config = httparse::ParserConfig::default();
        let len =
            match config.parse_response_with_uninit_headers(&mut parsed, &self.0.buf, &mut storage)
            {
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(Error::Head("too many headers"))
                }
                Err(_) => return Err(Error::Head("not an HTTP/1 response")),
            };
        let status = parsed
            .code
            .and_then(|code| StatusCode::from_u16(code).ok())
            .ok_or(Error::Head("invalid status"))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(Error::Head("unrequested protocol switch"));
        }
        let version = match parsed.version {
            Some(1) => Version::HTTP_11,
            _ => Version::HTTP_10,
        };
        // The answer's hop-by-hop headers (RFC 9110 §7.6.1: those that always are, and those
        // its `Connection` names) stay behind as the head is read rather than entering the
        // answer's lines to be taken out of them. Values are kept as places in the head, split
        // off the buffer once read: where each lies is noted while httparse borrows the buffer.
        let base = self.0.buf.as_ptr() as usize;
        let mut facts = Facts::default();
        let mut nominated = hop::Nominated::default();
        let mut kept: SmallVec<[(HeaderName, Range<usize>); 16]> = SmallVec::new();
        for h in parsed.headers.iter() {
            let name = names::header_name(h.name.as_bytes())
                .map_err(|_| Error::Head("invalid header name"))?;
            facts.read(&name, h.value, &mut nominated)?;
            let start = h.value.as_ptr() as usize - base;
            kept.push((name, start..start + h.value.len()));
        }
        kept.retain(|(name, _)| !hop::stays_behind(name, &nominated));
        // It borrows the buffer, which is split next.
        drop(nominated);
        let (framing, reusable) = framing(method, (status, version), facts, &mut kept)?;
        let head = self.0.buf.split_to(len).freeze();
        // Each value is one `http::HeaderValue` may hold: httparse refuses a head with any other
        // (a test holds it to that). Room for the `x-request-id` spillway sets on the answer it
        // relays, so setting it does not grow the list. Drained in place: iterating it by value
        // would move its inline array (760 bytes).
        let lines = Lines::in_head(head, kept.drain(..), 1);
        let response = Answer::new(status, lines, ());
        Ok(Some(Head {
            response,
            framing,
            reusable,
        }))
    }

    /// Reads what the connection has into the buffer, at most [`MAX_BUFFER`] in all; 0 at its
    /// end.
    pub(crate) fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        poll_read_capped(Pin::new(&mut self.0.io), cx, &mut self.0.buf, MAX_BUFFER)
    }

    /// The response body to be read on it next: framed by `framing`; the connection kept by
    /// `keep` after it when `reusable`.
    pub(crate) fn begin(&mut self, framing: Framing, reusable: bool, keep: Keep) {
        self.0.reading = Reading::new(framing, reusable, keep);
    }

    /// Bytes left of the response body on it, when its framing says.
    pub(crate) fn remaining(&self) -> Option<u64> {
        self.0.reading.decoder.remaining()
    }

    /// The reading of the response body on it, and the buffer it reads from.
    pub(crate) fn reading(&mut self) -> (&mut Reading, &mut BytesMut) {
        let parts = &mut *self.0;
        (&mut parts.reading, &mut parts.buf)
    }

    /// Whether an idle connection can carry a request: the backend has not closed it, nor sent
    /// anything unasked. Asks the socket without waiting (at most one `recv`, answered at once).
    pub(crate) fn is_open(&mut self) -> bool {
        self.0.buf.is_empty() && self.0.io.quiet_and_open()
    }
}

/// Reads what `io` has into `buf`, up to [`READ_SIZE`] at a time and `max` in all; 0 at its end.
/// The buffer never grows past `max`, where `reserve` could double its allocation. It is given
/// new room only when it has less than [`SMALLEST_READ`] (or than `max` allows) left.
pub(crate) fn poll_read_capped<R: AsyncRead + ?Sized>(
    io: Pin<&mut R>,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
    max: usize,
) -> Poll<io::Result<usize>> {
    let room = READ_SIZE.min(max.saturating_sub(buf.len()));
    if room == 0 {
        return Poll::Ready(Err(io::Error::other("read buffer full")));
    }
    if buf.capacity() - buf.len() < room.min(SMALLEST_READ) {
        if buf.is_empty() {
            buf.reserve(room);
        } else {
            // A new allocation of the size needed, and what is buffered (less than the cap)
            // copied over.
            let mut fresh = BytesMut::with_capacity(buf.len() + room);
            fresh.extend_from_slice(buf);
            *buf = fresh;
        }
    }
    tokio_util::io::poll_read_buf(io, cx, &mut buf.limit(room))
}

/// A non-empty string of ASCII digits as a number, if it fits (a `Content-Length` value).
pub(crate) fn decimal(item: &[u8]) -> Option<u64> {
    if item.is_empty() {
        return None;
    }
    item.iter().try_fold(0u64, |n, &d| {
        let d = d.is_ascii_digit().then(|| u64::from(d - b'0'))?;
        n.checked_mul(10)?.checked_add(d)
    })
}

/// What a response's framing depends on, read as its headers are (no look-up afterwards):
/// its `Connection` options, its last transfer coding, its `Content-Length`.
#[derive(Default)]
struct Facts {
    close: bool,
    keep_alive: bool,
    /// Names in its `Connection` headers, at most [`super::hop::MAX_NOMINATED`].
    named: usize,
    /// Whether it has a `Transfer-Encoding` whose last coding is `chunked`.
    coded: Option<bool>,
    /// The `Content-Length`: every value (and list item) the same decimal number; the error
    /// counts only where the length does.
    length: Option<Result<u64, &'static str>>,
}

impl Facts {
    /// Reads one header; the names a `Connection` header nominates go to `nominated`.
    fn read<'a>(
        &mut self,
        name: &HeaderName,
        value: &'a [u8],
        nominated: &mut hop::Nominated<'a>,
    ) -> Result<(), Error> {
        if name == header::CONNECTION {
            for item in hop::list_items(value) {
                self.close |= item.eq_ignore_ascii_case(b"close");
                self.keep_alive |= item.eq_ignore_ascii_case(b"keep-alive");
                self.named += 1;
                if self.named > hop::MAX_NOMINATED {
                    return Err(Error::Head("Connection names too many headers"));
                }
                nominated.push(item);
            }
        } else if name == header::TRANSFER_ENCODING {
            let last = value.rsplit(|&b| b == b',').next();
            self.coded =
                Some(last.is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked")));
        } else if name == header::CONTENT_LENGTH && !matches!(self.length, Some(Err(_))) {
            for item in value.split(|&b| b == b',') {
                let item = item.trim_ascii();
                let n = decimal(item).ok_or("invalid content-length");
                self.length = Some(match (self.length, n) {
                    (_, Err(e)) => Err(e),
                    (Some(Ok(l)), Ok(n)) if l != n => Err("conflicting content-length"),
                    (_, Ok(n)) => Ok(n),
                });
                if matches!(self.length, Some(Err(_))) {
                    break;
                }
            }
        }
        Ok(())
    }

    fn content_length(&self) -> Result<Option<u64>, Error> {
        self.length.transpose().map_err(Error::Head)
    }
}

/// How a response's body is framed (RFC 9112 §6.3), and whether its connection may carry
/// another request after it. A head with both `Transfer-Encoding` and `Content-Length` loses
/// the length and its connection.
fn framing(
    method: &Method,
    (status, version): (StatusCode, Version),
    facts: Facts,
    kept: &mut SmallVec<[(HeaderName, Range<usize>); 16]>,
) -> Result<(Framing, bool), Error> {
    let mut reusable = match version {
        Version::HTTP_11 => !facts.close,
        _ => facts.keep_alive,
    };
    let bodiless = *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if bodiless {
        // A body a bodiless answer must not have may still follow it: not read as the next
        // answer. (A 304's or a HEAD's Content-Length is the resource's, not a body's.)
        let framed_body = facts.coded.is_some()
            || (status == StatusCode::NO_CONTENT && facts.content_length()?.unwrap_or(0) > 0);
        return Ok((Framing::Length(0), reusable && !framed_body));
    }
    if let Some(chunked) = facts.coded {
        // Faulty framing for HTTP/1.0 (RFC 9112 §6.1), and a smuggling sign with a length:
        // neither connection carries another request.
        let lines = kept.len();
        kept.retain(|(name, _)| *name != header::CONTENT_LENGTH);
        if kept.len() < lines || version != Version::HTTP_11 {
            reusable = false;
        }
        return Ok(match chunked {
            true => (Framing::Chunked, reusable),
            false => (Framing::UntilClose, false),
        });
    }
    match facts.content_length()? {
        Some(n) => Ok((Framing::Length(n), reusable)),
        None => Ok((Framing::UntilClose, false)),
    }
}

#[cfg(test)]
mod tests;
