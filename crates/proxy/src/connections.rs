//! A cap on open client connections on the API listener.
//!
//! Every other cap of the gateway counts requests; a connection costs memory before it has sent
//! one (its task, hyper's buffers), so a flood of connections that never finish a request would
//! grow the process without bound. At `server.max_connections` the listener stops accepting:
//! new connections wait in the kernel's backlog, and beyond it the kernel refuses them. Each
//! accepted connection holds a permit until it closes.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Pause after an accept error (out of file descriptors, say), as axum's own listener does.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The API listener with its connection cap.
pub(crate) struct CappedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
}

impl CappedListener {
    pub(crate) fn new(inner: TcpListener, permits: Arc<Semaphore>) -> CappedListener {
        CappedListener { inner, permits }
    }
}

impl axum::serve::Listener for CappedListener {
    type Io = CappedIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (CappedIo, SocketAddr) {
        // The semaphore is never closed (it lives as long as the gateway); if it were, accept
        // nothing more rather than spin.
        let Ok(permit) = self.permits.clone().acquire_owned().await else {
            return std::future::pending().await;
        };
        loop {
            match self.inner.accept().await {
                Ok((tcp, addr)) => {
                    // Without TCP_NODELAY, small SSE chunks wait on Nagle's algorithm.
                    let _ = tcp.set_nodelay(true);
                    return (
                        CappedIo {
                            io: tcp,
                            _permit: permit,
                        },
                        addr,
                    );
                }
                Err(_) => tokio::time::sleep(ACCEPT_ERROR_PAUSE).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An accepted connection and its permit, given back when it closes.
pub(crate) struct CappedIo {
    io: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for CappedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for CappedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
