//! The upstream client's connector: hyper-util's, without the per-response cost of the
//! connection's addresses.
//!
//! hyper-util's HTTP connector tells the client each connection's local and remote address
//! (`HttpInfo`), and the client copies them into every response it reads: an extensions map and
//! three allocations per response, which nothing in spillway reads. [`Plain`] wraps the connector
//! so that its connections report only what the client acts on (a proxy in the way, HTTP/2
//! negotiated with ALPN).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::TryFutureExt;
use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};

/// A connector whose connections are [`PlainIo`].
#[derive(Debug, Clone)]
pub struct Plain<C>(pub C);

impl<C: tower::Service<Uri>> tower::Service<Uri> for Plain<C> {
    type Response = PlainIo<C::Response>;
    type Error = C::Error;
    type Future = futures_util::future::MapOk<C::Future, fn(C::Response) -> PlainIo<C::Response>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        self.0.call(uri).map_ok(PlainIo)
    }
}

/// A connection that reports no extra information about itself.
#[derive(Debug)]
pub struct PlainIo<T>(T);

impl<T: Connection> Connection for PlainIo<T> {
    fn connected(&self) -> Connected {
        let inner = self.0.connected();
        let plain = Connected::new().proxy(inner.is_proxied());
        if inner.is_negotiated_h2() {
            plain.negotiated_h2()
        } else {
            plain
        }
    }
}

impl<T: Read + Unpin> Read for PlainIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for PlainIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::client::legacy::connect::HttpInfo;

    #[tokio::test]
    async fn a_plain_connection_carries_no_addresses_into_responses() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(|_req| async {
                Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Empty::<
                    bytes::Bytes,
                >::new()))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
        let config = spillway_config::Config::from_toml(
            "[[models]]\nname = \"m\"\n[[models.backends]]\nname = \"b\"\nurl = \"http://127.0.0.1:1/v1\"\n",
        )
        .unwrap();
        let client = super::super::client(&config.upstream);
        let uri: Uri = format!("http://{addr}/").parse().unwrap();
        let response = client
            .request(
                http::Request::get(uri)
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert!(response.extensions().get::<HttpInfo>().is_none());
    }
}
