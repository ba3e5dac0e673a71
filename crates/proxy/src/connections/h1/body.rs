//! A client connection's socket: one read buffer for the whole connection, from which heads are
//! parsed and request bodies decoded, shared by the connection's loop (heads, responses, and
//! watching for the client's close while a response is made) and the request body the handler
//! reads (which may owe the client `100 Continue`).
//!
//! Both run in the connection's task, one after the other, so the lock is never contended; it
//! is there because the body is a separate value the handler owns. It is a spin lock: taking
//! one is a compare-and-swap and giving it back a plain store, where std's mutex gives it back
//! with an atomic swap (it must learn whether to wake a waiter); the connection takes it about
//! three times a request (`bench/instructions.sh`, one client), more when a request waits. No
//! guard is held across an await, so a lock that did meet another (a body read from another
//! task) would spin only while the other side ran synchronous code.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::upstream::h1::decode::{DecodeError, Decoder, Framing, Step};
use crate::upstream::h1::poll_read_capped;

/// The most one connection buffers: a head, or what arrives while a response is made.
pub(crate) const MAX_BUFFER: usize = super::super::HTTP1_MAX_BUF;
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The connection's socket: its read side with its buffer, and its write side.
pub(crate) struct Socket {
    reading: spin::Mutex<Reading>,
    pub write: OwnedWriteHalf,
}

pub(crate) struct Reading {
    read: OwnedReadHalf,
    pub buf: BytesMut,
    /// The body of the request being served.
    decoder: Decoder,
    /// Which request's body `decoder` is: a body kept past its request reads nothing more.
    request: u64,
    /// `100 Continue` is to be written before the body is read.
    continue_owed: bool,
    /// The client closed its side, or reading failed.
    ended: bool,
    /// How much of `buf` is known to hold no blank line (no whole head).
    scanned: usize,
}

impl Socket {
    pub(crate) fn new(read: OwnedReadHalf, write: OwnedWriteHalf) -> Arc<Socket> {
        Arc::new(Socket {
            reading: spin::Mutex::new(Reading {
                read,
                buf: BytesMut::new(),
                decoder: Decoder::new(Framing::Length(0)),
                request: 0,
                continue_owed: false,
                ended: false,
                scanned: 0,
            }),
            write,
        })
    }

    pub(crate) fn lock(&self) -> spin::MutexGuard<'_, Reading> {
        self.reading.lock()
    }

    /// The socket whole again, with what was read of it and not taken; `None` while a request
    /// body still refers to it.
    pub(crate) fn into_parts(this: Arc<Socket>) -> Option<(tokio::net::TcpStream, BytesMut)> {
        let socket = Arc::into_inner(this)?;
        let reading = socket.reading.into_inner();
        let tcp = reading.read.reunite(socket.write).ok()?;
        Some((tcp, reading.buf))
    }
}

impl Reading {
    /// Reads what the connection has into the buffer, at most [`MAX_BUFFER`] in all; 0 at its
    /// end.
    pub(crate) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let read = poll_read_capped(Pin::new(&mut self.read), cx, &mut self.buf, MAX_BUFFER);
        if matches!(read, Poll::Ready(Ok(0) | Err(_))) {
            self.ended = true;
        }
        read
    }

    /// The next request's body is framed so; returns the request's number for its body, and
    /// the body itself when it is all in the buffer already (its length given and every byte
    /// of it read with the head, as a small request's is): taken out, and the body read, so the
    /// handler reads it without this lock. `100 Continue` is not owed for a body already sent.
    pub(crate) fn begin(
        &mut self,
        framing: Framing,
        expect_continue: bool,
    ) -> (u64, Option<Bytes>) {
        self.request += 1;
        let length = match framing {
            Framing::Length(n) => usize::try_from(n).ok(),
            Framing::Chunked | Framing::UntilClose => None,
        };
        if let Some(n) = length.filter(|&n| n <= self.buf.len()) {
            self.decoder = Decoder::new(Framing::Length(0));
            self.continue_owed = false;
            return (self.request, Some(self.buf.split_to(n).freeze()));
        }
        self.decoder = Decoder::new(framing);
        self.continue_owed = expect_continue && !self.decoder.is_done();
        (self.request, None)
    }

    /// Whether the buffer may hold a whole head: a blank line after what was looked at before.
    /// A head's bytes are parsed only then, so one trickled a byte at a time is looked at once
    /// per byte, not parsed again from its start each time.
    pub(crate) fn may_hold_head(&mut self) -> bool {
        let whole = blank_line_after(&self.buf, self.scanned);
        self.scanned = self.buf.len();
        whole
    }

    /// A head was taken from the buffer: what follows is looked at afresh.
    pub(crate) fn head_taken(&mut self) {
        self.scanned = 0;
    }

    /// The client closed its side, or reading failed.
    pub(crate) fn ended(&self) -> bool {
        self.ended
    }

    /// Whether the request's body was read to its end (so the next bytes are the next head).
    pub(crate) fn body_done(&self) -> bool {
        self.decoder.is_done()
    }

    /// Ready when the client has closed the connection (or it failed). Looks only once the
    /// body has been read, and buffers what else arrives (a pipelined request) up to the cap;
    /// beyond it, stops looking.
    pub(crate) fn poll_hangup(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.ended {
            return Poll::Ready(());
        }
        if !self.decoder.is_done() {
            return Poll::Pending;
        }
        while self.buf.len() < MAX_BUFFER {
            match ready!(self.poll_fill(cx)) {
                Ok(0) | Err(_) => return Poll::Ready(()),
                Ok(_) => {}
            }
        }
        Poll::Pending
    }
}

/// Whether `buf` has an empty line (`\n\n` or `\n\r\n`, which end a head) that is not wholly
/// within its first `from` bytes.
fn blank_line_after(buf: &[u8], from: usize) -> bool {
    let start = from.saturating_sub(2).min(buf.len());
    memchr::memchr_iter(b'\n', &buf[start..]).any(|i| {
        let rest = &buf[start + i + 1..];
        rest.starts_with(b"\n") || rest.starts_with(b"\r\n")
    })
}

/// A request body as the handler reads it: decoded from the connection's buffer, which is
/// filled as it is asked for.
pub(crate) struct RequestBody {
    socket: Arc<Socket>,
    request: u64,
    hint: SizeHint,
}

impl RequestBody {
    pub(crate) fn new(socket: Arc<Socket>, request: u64, framing: Framing) -> RequestBody {
        let hint = match framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        };
        RequestBody {
            socket,
            request,
            hint,
        }
    }
}

/// A request body could not be read.
#[derive(Debug)]
pub(crate) enum BodyError {
    Decode(DecodeError),
    Io(io::Error),
    /// Asked for after its request ended.
    Gone,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Decode(e) => write!(f, "{e}"),
            BodyError::Io(e) => write!(f, "{e}"),
            BodyError::Gone => f.write_str("the request has ended"),
        }
    }
}

impl std::error::Error for BodyError {}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let mut r = this.socket.lock();
        if r.request != this.request {
            return Poll::Ready(Some(Err(BodyError::Gone)));
        }
        if r.continue_owed {
            // The client waits for it before it sends the body: owed once the body is asked
            // for. Nothing else is being written then (the last response was written whole), so
            // the socket takes these few bytes at once; one that does not is given up on.
            r.continue_owed = false;
            match this.socket.write.try_write(CONTINUE) {
                Ok(n) if n == CONTINUE.len() => {}
                Ok(_) => {
                    return Poll::Ready(Some(Err(BodyError::Io(io::ErrorKind::WriteZero.into()))))
                }
                Err(e) => return Poll::Ready(Some(Err(BodyError::Io(e)))),
            }
        }
        loop {
            let Reading { decoder, buf, .. } = &mut *r;
            match decoder.step(buf) {
                Ok(Step::Data(data)) => {
                    // A body whose end came with its last bytes is known to be done now.
                    let _ = decoder.settle(buf);
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Step::Done) => return Poll::Ready(None),
                Ok(Step::NeedMore) => {}
                Err(e) => return Poll::Ready(Some(Err(BodyError::Decode(e)))),
            }
            match ready!(r.poll_fill(cx)) {
                Ok(0) => {
                    let e = r.decoder.closed().err().unwrap_or(DecodeError::Truncated);
                    return Poll::Ready(Some(Err(BodyError::Decode(e))));
                }
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(BodyError::Io(e)))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let r = self.socket.lock();
        r.request == self.request && r.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

#[cfg(test)]
mod tests {
    use super::blank_line_after;

    #[test]
    fn a_head_is_whole_only_from_its_blank_line_however_it_arrives() {
        let head = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
        let mut scanned = 0;
        for end in 1..=head.len() {
            let whole = blank_line_after(&head[..end], scanned);
            assert_eq!(whole, end == head.len(), "at {end}");
            scanned = end;
        }
        assert!(blank_line_after(b"GET / HTTP/1.1\nhost: x\n\n", 0));
        assert!(!blank_line_after(b"GET / HTTP/1.1\r\nhost: x\r\n", 0));
        assert!(!blank_line_after(b"", 5));
    }
}
