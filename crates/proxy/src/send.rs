//! Writes to a TCP socket, each one system call made directly (by rustix), not through the C
//! library's wrapper: the answer to the client (`connections::h1::write`) and the request to a
//! backend over plain TCP (`upstream::h1`), two writes a request.
//!
//! In a process with more than one thread glibc's `send` and `writev` are cancellation points:
//! each marks the thread cancellable before the call and not after, two locked read-modify-writes
//! around every write (some 20 cycles each on the machines measured), for a thread cancellation
//! the gateway never uses. Reads stay tokio's: a read made here would need the spare room of its
//! buffer zeroed first (safe code cannot read into memory not yet written), which costs more
//! than the wrapper does.
//!
//! Each write is made through tokio's `try_io`, which clears the socket's write readiness when
//! the call would block, as tokio's own writes do. With `MSG_NOSIGNAL`, a write to a connection
//! the peer has reset fails with `EPIPE` rather than raising `SIGPIPE`, as std's writes do.

use std::io::{self, IoSlice};
use std::task::{ready, Context, Poll};

use rustix::net::{SendAncillaryBuffer, SendFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Writes what the socket takes now of `first` and then `second` (in one call), without waiting:
/// `WouldBlock` when it takes nothing.
pub(crate) fn try_send(tcp: &TcpStream, first: &[u8], second: &[u8]) -> io::Result<usize> {
    tcp.try_io(Interest::WRITABLE, || loop {
        let sent = match (first.is_empty(), second.is_empty()) {
            (_, true) => rustix::net::send(tcp, first, SendFlags::NOSIGNAL),
            (true, false) => rustix::net::send(tcp, second, SendFlags::NOSIGNAL),
            (false, false) => rustix::net::sendmsg(
                tcp,
                &[IoSlice::new(first), IoSlice::new(second)],
                &mut SendAncillaryBuffer::default(),
                SendFlags::NOSIGNAL,
            ),
        };
        match sent {
            // A signal came before anything was written: the write is made again.
            Err(rustix::io::Errno::INTR) => continue,
            sent => return sent.map_err(io::Error::from),
        }
    })
}

/// Writes what the socket takes of `buf`, once it takes some: `AsyncWrite::poll_write` for a TCP
/// stream, made directly.
pub(crate) fn poll_send(
    tcp: &TcpStream,
    cx: &mut Context<'_>,
    buf: &[u8],
) -> Poll<io::Result<usize>> {
    loop {
        ready!(tcp.poll_write_ready(cx))?;
        match try_send(tcp, buf, &[]) {
            // Its readiness is cleared: the next poll waits for the socket to take more.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            sent => return Poll::Ready(sent),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A connected pair over loopback: the near end, and the far end as accepted.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap());
        let (near, far) = tokio::join!(near, listener.accept());
        (near.unwrap(), far.unwrap().0)
    }

    #[tokio::test]
    async fn both_pieces_arrive_in_order_and_one_alone_does() {
        let (near, mut far) = pair().await;
        for (first, second) in [
            (&b"head "[..], &b"body"[..]),
            (b"", b"body"),
            (b"head", b""),
        ] {
            let sent = try_send(&near, first, second).unwrap();
            assert_eq!(sent, first.len() + second.len());
            let mut got = vec![0; sent];
            far.read_exact(&mut got).await.unwrap();
            assert_eq!(got, [first, second].concat());
        }
    }

    #[tokio::test]
    async fn a_full_socket_would_block_and_a_poll_waits_until_it_takes_more() {
        let (near, mut far) = pair().await;
        let chunk = vec![7u8; 64 * 1024];
        let mut sent = 0;
        // Nobody reads: the socket's buffers fill, and a write then takes nothing.
        let blocked = loop {
            match try_send(&near, &chunk, &[]) {
                Ok(n) => sent += n,
                Err(e) => break e,
            }
            assert!(sent < 256 << 20, "a socket nobody reads took 256 MiB");
        };
        assert_eq!(blocked.kind(), io::ErrorKind::WouldBlock);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(poll_send(&near, &mut cx, &chunk).is_pending());
        // Read everything written; the socket then takes more.
        let mut got = vec![0; sent];
        far.read_exact(&mut got).await.unwrap();
        let more = std::future::poll_fn(|cx| poll_send(&near, cx, b"more")).await;
        assert_eq!(more.unwrap(), 4);
    }

    #[tokio::test]
    async fn a_write_to_a_connection_the_peer_reset_fails_without_a_signal() {
        let (near, far) = pair().await;
        // Closed with unread data, the far end resets the connection.
        try_send(&near, b"unread", b"").unwrap();
        far.set_zero_linger().unwrap();
        drop(far);
        // On loopback the reset is there at once; a write or two may still go out before it.
        let mut failed = None;
        for _ in 0..100 {
            match std::future::poll_fn(|cx| poll_send(&near, cx, b"more")).await {
                Ok(_) => tokio::task::yield_now().await,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let failed = failed.expect("a write to a reset connection fails");
        assert!(
            matches!(
                failed.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "{failed:?}"
        );
    }
}
