//! The metadata database as the cache-flush replay sees it: a TCP link between the gateway and
//! PostgreSQL that counts the statements crossing it and can take the database away.
//!
//! IL-0136 began with a cache flush at peak that sent about twenty times the usual load to the
//! metadata database; then the database went away and health checks restarted the gateway's
//! instances in a loop. Replaying it takes two things the gateway cannot give about itself:
//! the number of SQL statements that reached the database, measured on the wire and summed
//! across gateway restarts (a restarted process forgets its own metrics), and a database that
//! goes away and comes back on the same address without stopping a PostgreSQL server that the
//! host may share. So the gateway's store URL names a [`StoreLink`] owned by the replay, which
//! forwards every connection to PostgreSQL byte for byte.
//!
//! Counting reads only the client-to-server bytes, through [`FrontendCounter`]: a streaming
//! parser of the frontend protocol that keeps message headers across read boundaries and never
//! holds back or changes a byte. A statement is a `Query` ('Q', simple protocol) or an `Execute`
//! ('E', extended protocol, what sqlx sends for every query) message; sqlx's `Sync`-only ping
//! is not one. Bytes the parser cannot read as the protocol (TLS, garbage) end counting for that
//! connection, never its forwarding.
//!
//! [`StoreLink::cut`] closes the listening socket, so new connections are refused, and closes
//! every connection through the link; [`StoreLink::restore`] listens on the same port again.
//! Every task belongs to the link: the accept task owns the connection tasks in a `JoinSet`,
//! and dropping the link aborts the accept task, which aborts them all.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, Mutex};
use tokio::task::{JoinHandle, JoinSet};

#[cfg(test)]
mod tests;

/// Pending connections the listening socket holds; a cache flush opens many at once.
const BACKLOG: u32 = 1024;
/// Bytes read from a client at a time.
const READ_BUFFER: usize = 16 * 1024;
/// Pause after a failed accept (typically out of file descriptors), so it does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// A TCP link to the metadata database, on 127.0.0.1, that counts statements and can be cut.
pub(crate) struct StoreLink {
    addr: SocketAddr,
    upstream: SocketAddr,
    counts: Arc<Counts>,
    up: AtomicBool,
    /// The accept task while the link is up; the lock also serialises `cut` and `restore`.
    serving: Mutex<Option<Serving>>,
}

impl StoreLink {
    /// Listens on 127.0.0.1:0 and forwards every accepted connection to `upstream`.
    pub(crate) async fn start(upstream: SocketAddr) -> io::Result<StoreLink> {
        let listener = listen(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let serving = Serving::spawn(listener, upstream, Arc::clone(&counts));
        Ok(StoreLink {
            addr,
            upstream,
            counts,
            up: AtomicBool::new(true),
            serving: Mutex::new(Some(serving)),
        })
    }

    /// The link's address; it stays the same across `cut` and `restore`.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Statements clients sent through the link since start: PostgreSQL frontend `Query` ('Q')
    /// and `Execute` ('E') messages, counted once their header has been written to the database.
    pub(crate) fn statements(&self) -> u64 {
        self.counts.statements.load(Ordering::Relaxed)
    }

    /// [`StoreLink::statements`] as a reader of its own, for a task that outlives a borrow.
    pub(crate) fn statement_counter(&self) -> Arc<dyn Fn() -> u64 + Send + Sync> {
        let counts = Arc::clone(&self.counts);
        Arc::new(move || counts.statements.load(Ordering::Relaxed))
    }

    /// Connections accepted since start.
    pub(crate) fn connections(&self) -> u64 {
        self.counts.connections.load(Ordering::Relaxed)
    }

    /// Whether the link is up.
    #[cfg(test)]
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// The database goes away: the listening socket is closed (new connections are refused)
    /// and every open connection through the link is closed both ways. Returns once all of
    /// that is done. Idempotent.
    pub(crate) async fn cut(&self) {
        let mut serving = self.serving.lock().await;
        self.up.store(false, Ordering::Relaxed);
        if let Some(Serving { stop, task }) = serving.take() {
            // If this future is dropped here, the accept task still stops: it has the signal.
            let _ = stop.send(());
            let _ = task.await;
        }
    }

    /// Listens on the same port again (SO_REUSEADDR, so connections the cut left in TIME_WAIT
    /// do not block it). Idempotent.
    pub(crate) async fn restore(&self) -> io::Result<()> {
        let mut serving = self.serving.lock().await;
        if serving.is_none() {
            let listener = listen(self.addr)?;
            *serving = Some(Serving::spawn(
                listener,
                self.upstream,
                Arc::clone(&self.counts),
            ));
        }
        self.up.store(true, Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for StoreLink {
    fn drop(&mut self) {
        // Aborting the accept task drops its listener and its JoinSet, which aborts every
        // connection task.
        if let Some(serving) = self.serving.get_mut().take() {
            serving.task.abort();
        }
    }
}

/// A streaming counter of the statements in the client-to-server bytes of one PostgreSQL
/// connection, fed the bytes as they are read.
#[derive(Debug, Default)]
pub(crate) struct FrontendCounter {
    phase: Phase,
    /// The header being read: untyped (Int32 length, Int32 code) or typed (Byte1, Int32 length).
    header: [u8; 8],
    filled: usize,
    /// Payload bytes of the current message still to pass before the next header.
    skip: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Untyped messages: SSL or GSS encryption requests, then a startup or cancel request.
    #[default]
    Startup,
    /// Typed messages, after the startup message.
    Typed,
    /// Nothing more is counted: a cancel request was sent, or the bytes are not the protocol
    /// (TLS after an accepted SSLRequest, or garbage).
    Uncounted,
}

/// Codes of the untyped messages, after their length.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;
/// Startup messages carry the protocol version, major in the high 16 bits.
const PROTOCOL_MAJOR: u32 = 3;
/// PostgreSQL's own limit on an untyped message (`MAX_STARTUP_PACKET_LENGTH`).
const MAX_UNTYPED_LEN: u32 = 10_000;
/// PostgreSQL refuses any message over 1 GiB.
const MAX_TYPED_LEN: u32 = 1 << 30;
/// Every frontend message type of protocol 3.x: Bind, Close, CopyData, CopyDone, CopyFail,
/// Describe, Execute, Flush, FunctionCall, the authentication responses, Parse, Query, Sync,
/// Terminate.
const FRONTEND_TYPES: &[u8] = b"BCdcfDEHFpPQSX";

impl FrontendCounter {
    /// Reads the next bytes the client sent and returns how many statements they started.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        let mut statements = 0;
        while !bytes.is_empty() {
            let header_len = match self.phase {
                Phase::Startup => 8,
                Phase::Typed => 5,
                Phase::Uncounted => break,
            };
            if self.skip > 0 {
                let passed = self.skip.min(bytes.len());
                self.skip -= passed;
                bytes = &bytes[passed..];
                continue;
            }
            let taken = (header_len - self.filled).min(bytes.len());
            self.header[self.filled..self.filled + taken].copy_from_slice(&bytes[..taken]);
            self.filled += taken;
            bytes = &bytes[taken..];
            if self.filled == header_len {
                self.filled = 0;
                statements += match self.phase {
                    Phase::Startup => self.untyped_header(),
                    Phase::Typed => self.typed_header(),
                    Phase::Uncounted => 0,
                };
            }
        }
        statements
    }

    fn untyped_header(&mut self) -> u64 {
        let len = int32(&self.header[0..4]);
        let code = int32(&self.header[4..8]);
        let (next, valid) = match code {
            // The server answers one byte; the client then sends another untyped message, or
            // encrypted bytes that the next header will not read as one.
            SSL_REQUEST | GSSENC_REQUEST => (Phase::Startup, len == 8),
            CANCEL_REQUEST => (Phase::Uncounted, true),
            code if code >> 16 == PROTOCOL_MAJOR => (Phase::Typed, true),
            _ => (Phase::Uncounted, false),
        };
        if !valid || !(8..=MAX_UNTYPED_LEN).contains(&len) {
            self.phase = Phase::Uncounted;
            return 0;
        }
        self.phase = next;
        self.skip = (len - 8) as usize;
        0
    }

    fn typed_header(&mut self) -> u64 {
        let kind = self.header[0];
        let len = int32(&self.header[1..5]);
        if !FRONTEND_TYPES.contains(&kind) || !(4..=MAX_TYPED_LEN).contains(&len) {
            self.phase = Phase::Uncounted;
            return 0;
        }
        self.skip = (len - 4) as usize;
        u64::from(matches!(kind, b'Q' | b'E'))
    }
}

fn int32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0, |n, &b| (n << 8) | u32::from(b))
}

#[derive(Debug, Default)]
struct Counts {
    statements: AtomicU64,
    connections: AtomicU64,
}

/// The accept task of one period in which the link is up, and the signal that ends it.
struct Serving {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Serving {
    fn spawn(listener: TcpListener, upstream: SocketAddr, counts: Arc<Counts>) -> Serving {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept(listener, upstream, counts, stopped));
        Serving { stop, task }
    }
}

/// A listening socket on `addr` with SO_REUSEADDR.
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Accepts and forwards connections until `stopped` fires (or its sender is gone), then closes
/// the listening socket and every connection, and returns once they are all closed.
async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    counts: Arc<Counts>,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    counts.connections.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(forward(client, upstream, Arc::clone(&counts)));
                }
                Err(_) => tokio::time::sleep(ACCEPT_BACKOFF).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    connections.shutdown().await;
}

/// Forwards one client connection to `upstream` both ways, counting the client's statements.
async fn forward(client: TcpStream, upstream: SocketAddr, counts: Arc<Counts>) {
    // A database that cannot be reached closes the client's connection, as one that failed
    // right after accepting would.
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    // Small protocol messages must not wait on Nagle's algorithm twice.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let to_server = async {
        let mut counter = FrontendCounter::default();
        let mut buffer = vec![0; READ_BUFFER];
        loop {
            let read = client_read.read(&mut buffer).await?;
            if read == 0 {
                break;
            }
            server_write.write_all(&buffer[..read]).await?;
            let statements = counter.feed(&buffer[..read]);
            counts.statements.fetch_add(statements, Ordering::Relaxed);
        }
        server_write.shutdown().await
    };
    let to_client = async {
        tokio::io::copy(&mut server_read, &mut client_write).await?;
        client_write.shutdown().await
    };
    // The first direction to fail ends both: a broken connection is broken both ways.
    let _ = tokio::try_join!(to_server, to_client);
}
