//! An accepted client connection: its place under the connection cap, what it reads reported to
//! its [`Activity`], and hyper's own error answers given the API's JSON shape.
//!
//! hyper answers a head it cannot parse (400), one too large (431) or a URI too long (414) by
//! itself, with an empty body, and closes the connection; the service never sees that request.
//! An OpenAI SDK then reports an error with no message. Such an answer is recognised here, as
//! bytes written while the connection is between requests with part of a head read and that
//! begin with an HTTP/1 status line of 4xx, and is replaced whole by the same status with an
//! OpenAI-style error body and `Connection: close`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use super::activity::Activity;
use super::refuse;

/// The first bytes of an HTTP/2 connection (RFC 9113, section 3.4), enough to tell it apart.
const H2_PREFACE_START: &[u8] = b"PRI * HTTP/2.0";

pub(crate) struct GuardedIo {
    io: TcpStream,
    activity: Arc<Activity>,
    /// Whether the first bytes were looked at for the HTTP/2 preface.
    sniffed: bool,
    /// A replacement answer still being written.
    replacing: Option<Bytes>,
    /// hyper's answer was replaced: every later write of it is dropped.
    replaced: bool,
    _permit: OwnedSemaphorePermit,
}

impl GuardedIo {
    pub(crate) fn new(
        io: TcpStream,
        activity: Arc<Activity>,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        GuardedIo {
            io,
            activity,
            sniffed: false,
            replacing: None,
            replaced: false,
            _permit: permit,
        }
    }

    /// Writes what is left of a replacement answer; ready when nothing is left.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(rest) = &mut self.replacing {
            if rest.is_empty() {
                self.replacing = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            rest.advance(n);
        }
        Poll::Ready(Ok(()))
    }

    /// hyper's own error answer, if `first` (the start of a write) is one; its replacement.
    fn replacement_for(&self, first: &[u8]) -> Option<Bytes> {
        if self.activity.is_http2() || !self.activity.reading_head() {
            return None;
        }
        refuse::replace_hyper_error(first)
    }
}

impl AsyncRead for GuardedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        let read = &buf.filled()[before..];
        if !read.is_empty() {
            if !this.sniffed {
                this.sniffed = true;
                if read.starts_with(&H2_PREFACE_START[..read.len().min(H2_PREFACE_START.len())]) {
                    this.activity.set_http2();
                }
            }
            if this.activity.awaits_head() {
                this.activity.bytes_read(crate::clock::now());
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for GuardedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !this.replaced {
            if let Some(replacement) = this.replacement_for(buf) {
                this.replacing = Some(replacement);
                this.replaced = true;
            }
        }
        if this.replaced {
            // hyper's answer is replaced whole: what it writes is dropped.
            ready!(this.poll_replacement(cx))?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total = bufs.iter().map(|b| b.len()).sum();
        if !this.replaced {
            let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
            if let Some(replacement) = this.replacement_for(first) {
                this.replacing = Some(replacement);
                this.replaced = true;
            }
        }
        if this.replaced {
            ready!(this.poll_replacement(cx))?;
            return Poll::Ready(Ok(total));
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}
