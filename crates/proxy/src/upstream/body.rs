//! An upstream response body, read from its connection by the task that relays it, that gives
//! the connection back to its backend's idle ones when it has been read to its end.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::h1::decode::{Framing, Step};
use super::h1::{Conn, Error, Keep};
use crate::pool::idle::IdleConns;

/// An upstream response body. Its connection goes back to its backend's idle connections once
/// the body has been read to its end and nothing was read past it, if its head allowed another
/// request; a body dropped before that, or that failed, closes it. What it reads by (its
/// decoder, whether the connection is kept and how) is in the connection's box, so that an
/// answer moved up the attempt loop and into the relay is small enough to be moved in
/// registers.
pub(crate) struct UpstreamBody {
    /// `None` once the body ended (the connection given back or closed) or failed.
    conn: Option<Conn>,
    idle: Arc<IdleConns>,
    /// Read to its end.
    ended: bool,
    /// A framing error found past the data already given, for the next poll.
    broken: Option<Box<Error>>,
}

// An answer with this body is moved some ten times a request, from the connection up the attempt
// loop and into the relay: at 128 bytes or less a move is a few register loads and stores, where
// a larger one is a call to `memcpy`.
const _: () = assert!(std::mem::size_of::<crate::answer::Answer<UpstreamBody>>() <= 128);

impl UpstreamBody {
    /// The body framed by `framing` on `conn`, which goes back to `idle` (kept by `keep`) at the
    /// body's end (at once for a body that has none) when `reusable`.
    pub(super) fn new(
        mut conn: Conn,
        (framing, reusable): (Framing, bool),
        idle: &Arc<IdleConns>,
        keep: Keep,
    ) -> Self {
        conn.begin(framing, reusable, keep);
        let done = conn.reading().0.decoder.is_done();
        let mut body = UpstreamBody {
            conn: Some(conn),
            idle: idle.clone(),
            ended: false,
            broken: None,
        };
        if done {
            body.finish();
        }
        body
    }

    /// The body ended: its connection goes back if it may carry another request.
    fn finish(&mut self) {
        self.ended = true;
        if let Some(mut conn) = self.conn.take() {
            let (reading, buf) = conn.reading();
            let keep = reading.keep;
            if reading.reusable && buf.is_empty() {
                self.idle.put(conn, crate::clock::now(), keep);
            }
        }
    }

    fn fail(&mut self, error: Error) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.conn = None;
        Poll::Ready(Some(Err(error)))
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        if let Some(error) = this.broken.take() {
            return this.fail(*error);
        }
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let (reading, buf) = conn.reading();
            match reading.decoder.step(buf) {
                Err(e) => return this.fail(Error::Body(e)),
                Ok(Step::Data(data)) => {
                    // The end, when the terminator came with the last bytes: known now, so the
                    // connection is back before the relay polls for the end.
                    match reading.decoder.settle(buf) {
                        Err(e) => {
                            this.conn = None;
                            this.broken = Some(Box::new(Error::Body(e)));
                        }
                        Ok(()) if reading.decoder.is_done() => this.finish(),
                        Ok(()) => {}
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Step::Done) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Step::NeedMore) => match conn.poll_read_more(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(0)) => {
                        // Never reused: the backend closed it.
                        let closed = conn.reading().0.decoder.closed();
                        this.conn = None;
                        return match closed {
                            Ok(()) => {
                                this.ended = true;
                                Poll::Ready(None)
                            }
                            Err(e) => Poll::Ready(Some(Err(Error::Body(e)))),
                        };
                    }
                    Poll::Ready(Ok(_)) => {}
                    Poll::Ready(Err(e)) => return this.fail(Error::Io(e)),
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.broken.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let remaining = match &self.conn {
            _ if self.ended => Some(0),
            Some(conn) => conn.remaining(),
            None => None,
        };
        remaining.map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// A body relayed as it is (a stored object's), cut off with an error when its backend sends
/// nothing for `timeout` (`upstream.stream_idle_timeout`): a backend that stalls mid-body does
/// not hold the call, and its connection, until the client leaves. The timer is armed only while
/// the body waits, and rearmed after each frame.
pub(crate) struct StallLimited<B> {
    inner: B,
    timeout: std::time::Duration,
    waiting: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> StallLimited<B> {
    pub(crate) fn new(inner: B, timeout: std::time::Duration) -> Self {
        StallLimited {
            inner,
            timeout,
            waiting: None,
        }
    }
}

impl<B> Body for StallLimited<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<crate::relay::BoxError>,
{
    type Data = Bytes;
    type Error = crate::relay::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.waiting = None;
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let timeout = this.timeout;
        let waiting = this
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match waiting.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                "the backend sent nothing for {timeout:?}"
            )
            .into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::super::h1::Outgoing;
    use super::*;
    use std::time::Duration;

    use http::{header, Request};

    /// A connection to a server that answers one request with `answer` and then holds the
    /// connection open, and that request's response head.
    async fn answered(answer: &'static [u8]) -> (Conn, super::super::h1::Head) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
            socket.write_all(answer).await.unwrap();
            // Open until the client closes it.
            while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
        });
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut conn = Conn::new(Box::new(tcp));
        let req = Request::post("/v1/chat/completions")
            .header(header::HOST, "b")
            .body(Bytes::new())
            .unwrap();
        let head = conn.send(&Outgoing::of(&req)).await.unwrap();
        (conn, head)
    }

    /// A connection to a server that answers one request with `answer` and then closes the
    /// connection, and that request's response head.
    async fn answered_then_closed(answer: &'static [u8]) -> (Conn, super::super::h1::Head) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let _ = socket.read(&mut [0u8; 1024]).await;
            socket.write_all(answer).await.unwrap();
        });
        let mut conn = Conn::new(Box::new(
            tokio::net::TcpStream::connect(addr).await.unwrap(),
        ));
        let req = Request::post("/").body(Bytes::new()).unwrap();
        let head = conn.send(&Outgoing::of(&req)).await.unwrap();
        (conn, head)
    }

    fn body_of(
        (conn, head): (Conn, super::super::h1::Head),
        idle: &Arc<IdleConns>,
    ) -> UpstreamBody {
        let keep = Keep {
            max: 4,
            idle_timeout: Duration::from_secs(60),
        };
        UpstreamBody::new(conn, (head.framing, head.reusable), idle, keep)
    }

    #[tokio::test]
    async fn a_connection_goes_back_when_its_body_was_read_to_its_end_and_never_before() {
        use http_body_util::BodyExt;
        for answer in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n12345"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\n12345\r\n0\r\n\r\n",
        ] {
            let idle = Arc::new(IdleConns::default());
            let mut body = body_of(answered(answer).await, &idle);
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), "12345");
            assert!(body.is_end_stream());
            assert_eq!(
                idle.len(),
                1,
                "given back at the last byte, before the end is polled"
            );
            assert!(body.frame().await.is_none());
            drop(body);
            assert_eq!(idle.len(), 1);
        }

        // Half a body, and the client goes away: its connection is not reused.
        let idle = Arc::new(IdleConns::default());
        let mut body = body_of(
            answered(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345").await,
            &idle,
        );
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "12345");
        drop(body);
        assert_eq!(idle.len(), 0);
    }

    #[tokio::test]
    async fn a_connection_whose_answer_overran_its_framing_or_said_close_is_not_kept() {
        use http_body_util::BodyExt;
        for answer in [
            // Bytes after the body's end: the next answer would be read from them.
            &b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        ] {
            let idle = Arc::new(IdleConns::default());
            let body = body_of(answered(answer).await, &idle);
            let data = body.collect().await.unwrap().to_bytes();
            assert_eq!(data, "ok");
            assert_eq!(idle.len(), 0, "{}", String::from_utf8_lossy(answer));
        }
    }

    /// A body's end and size as the relay reads them, now that its decoder is kept with the
    /// connection: told while the connection is held, and once it is given back or closed.
    #[tokio::test]
    async fn a_body_tells_its_size_and_end_after_its_connection_is_gone() {
        use http_body_util::BodyExt;
        let idle = Arc::new(IdleConns::default());
        let body = body_of(
            answered(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n").await,
            &idle,
        );
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!body.is_end_stream());
        drop(body);

        let mut body = body_of(
            answered(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n12345").await,
            &idle,
        );
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "12345");
        assert_eq!(idle.len(), 1, "given back");
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));

        // Ended by the backend's close: at its end, and the connection not kept.
        let idle = Arc::new(IdleConns::default());
        let (conn, head) = answered_then_closed(b"HTTP/1.1 200 OK\r\n\r\nuntil close").await;
        let mut body = body_of((conn, head), &idle);
        assert_eq!(body.size_hint().exact(), None);
        let mut data = Vec::new();
        while let Some(frame) = body.frame().await {
            data.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        assert_eq!(data, b"until close");
        assert!(body.is_end_stream());
        assert_eq!(idle.len(), 0);
    }

    #[tokio::test]
    async fn a_body_cut_short_by_the_backend_is_an_error_not_an_end() {
        use http_body_util::BodyExt;
        let (conn, head) = answered_then_closed(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\n12345\r\n",
        )
        .await;
        let idle = Arc::new(IdleConns::default());
        let body = body_of((conn, head), &idle);
        let error = body.collect().await.expect_err("a truncated body fails");
        assert!(
            error.to_string().contains("closed before the body's end"),
            "{error}"
        );
    }
}
