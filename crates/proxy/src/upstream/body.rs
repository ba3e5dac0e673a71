//! An upstream response body that gives its connection back to its backend's idle ones when
//! it has been read to its end.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::pool::idle::{IdleConns, Keep, Sender};

/// An upstream response body. Its connection goes back to its backend's idle connections once
/// the body has been read to its end; a body dropped before that closes it.
pub(crate) struct UpstreamBody {
    inner: Incoming,
    conn: Option<(Sender, Arc<IdleConns>)>,
    keep: Keep,
}

impl UpstreamBody {
    /// `inner` with the connection it came on, which goes back to `idle` at the body's end (at
    /// once for a body that has none).
    pub(super) fn new(inner: Incoming, conn: Sender, idle: &Arc<IdleConns>, keep: Keep) -> Self {
        let mut body = UpstreamBody {
            inner,
            conn: Some((conn, idle.clone())),
            keep,
        };
        if body.inner.is_end_stream() {
            body.give_back();
        }
        body
    }

    fn give_back(&mut self) {
        if let Some((conn, idle)) = self.conn.take() {
            idle.put(conn, crate::clock::now(), self.keep);
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.give_back(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.give_back(),
            Poll::Ready(Some(Err(_))) => self.conn = None,
            _ => {}
        }
        polled
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
    use super::*;
    use std::time::Duration;

    use http::{header, Request};
    use http_body_util::Full;

    /// A connection to a server that answers one request with `answer` and then holds the
    /// connection open, and that request's response.
    async fn answered(answer: &'static [u8]) -> (Sender, http::Response<Incoming>) {
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
        let io = hyper_util::rt::TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let req = Request::post("/v1/chat/completions")
            .header(header::HOST, "b")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = sender.send_request(req).await.unwrap();
        (sender, response)
    }

    fn body_of(
        response: http::Response<Incoming>,
        sender: Sender,
        idle: &Arc<IdleConns>,
    ) -> UpstreamBody {
        UpstreamBody {
            inner: response.into_body(),
            conn: Some((sender, idle.clone())),
            keep: Keep {
                max: 4,
                idle_timeout: Duration::from_secs(60),
            },
        }
    }

    #[tokio::test]
    async fn a_connection_goes_back_when_its_body_was_read_to_its_end_and_never_before() {
        use http_body_util::BodyExt;
        let idle = Arc::new(IdleConns::default());
        let (sender, response) =
            answered(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n12345").await;
        let mut body = body_of(response, sender, &idle);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "12345");
        assert_eq!(
            idle.len(),
            1,
            "given back at the last byte, before the end is polled"
        );
        drop(body);
        assert_eq!(idle.len(), 1);

        // Half a body, and the client goes away: its connection is not reused.
        let idle = Arc::new(IdleConns::default());
        let (sender, response) =
            answered(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345").await;
        let mut body = body_of(response, sender, &idle);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "12345");
        drop(body);
        assert_eq!(idle.len(), 0);
    }
}
