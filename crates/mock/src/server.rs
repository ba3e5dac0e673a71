//! The accept loop: our own rather than `axum::serve`, because one fault needs the socket.
//!
//! A connection reset must reach the client as a TCP RST with no response byte, which is what a
//! crashed or overloaded upstream produces and what a gateway must treat as retryable. The
//! router marks such a response ([`ResetConnection`]); the service then fails, hyper drops the
//! connection, and the socket wrapper sets `SO_LINGER` to zero just before it closes, so the
//! kernel sends RST instead of FIN. Only that connection gets zero linger: set on every socket
//! at accept, an ordinary close could discard a response still in the send buffer.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::api::ResetConnection;
use crate::routes;
use crate::MockServer;

/// How long to back off after a failed accept (e.g. out of file descriptors) before retrying.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accepts and serves connections until `shutdown` resolves, then drops every connection.
pub(crate) async fn serve(
    server: MockServer,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let router = routes::router(server);
    let builder = auto::Builder::new(TokioExecutor::new());
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    connections.spawn(connection(builder.clone(), router.clone(), stream));
                }
                Err(e) => {
                    tracing::debug!("mock backend accept failed: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
    // Dropping the set aborts every connection task: in-flight requests are dropped.
    drop(connections);
    Ok(())
}

async fn connection(builder: auto::Builder<TokioExecutor>, router: Router, stream: TcpStream) {
    let reset = Arc::new(AtomicBool::new(false));
    let io = TokioIo::new(ResettableStream {
        inner: stream,
        reset: Arc::clone(&reset),
    });
    let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
        let router = router.clone();
        let reset = Arc::clone(&reset);
        async move {
            let Ok(response) = router.oneshot(req.map(Body::new)).await;
            if response.extensions().get::<ResetConnection>().is_some() {
                reset.store(true, Ordering::Relaxed);
                return Err(InjectedReset);
            }
            Ok(response)
        }
    });
    if let Err(e) = builder.serve_connection(io, service).await {
        tracing::debug!("mock backend connection ended: {e}");
    }
}

/// The service error that makes hyper drop a connection the profile resets.
#[derive(Debug)]
struct InjectedReset;

impl std::fmt::Display for InjectedReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection reset injected by the mock profile")
    }
}

impl std::error::Error for InjectedReset {}

/// A TCP stream that closes with RST instead of FIN once its connection asked for a reset.
struct ResettableStream {
    inner: TcpStream,
    reset: Arc<AtomicBool>,
}

impl Drop for ResettableStream {
    fn drop(&mut self) {
        if self.reset.load(Ordering::Relaxed) {
            // Zero linger cannot block on close; if it fails the peer sees a FIN, still no reply.
            let _ = self.inner.set_zero_linger();
        }
    }
}

impl AsyncRead for ResettableStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResettableStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
