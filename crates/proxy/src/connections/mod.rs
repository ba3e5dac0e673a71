//! Client connections, from accept to close: a cap on how many are open, how long each may hold
//! its place without a request, and how much each may make the gateway buffer.
//!
//! Every other cap of the gateway counts requests; a connection costs memory before it has sent
//! one (its task, its buffers), and a client that opens connections and never finishes a
//! request would otherwise hold them forever. So:
//! - at most `max_connections` are open; one accepted beyond it is answered `503` with
//!   `Retry-After` at once and closed, instead of waiting in the kernel's backlog;
//! - a connection with no request in flight is closed after `server.idle_timeout`, and an
//!   HTTP/1 request's head must arrive within `server.header_read_timeout` of its first byte
//!   (`activity.rs`); bodies have `server.body_read_timeout` (`request::read_body`);
//! - HTTP/1 (served by `h1/`) reads at most 64 KiB of head and buffer; HTTP/2 (hyper) opens at
//!   most `server.http2_max_concurrent_streams` streams per connection, with small flow-control
//!   windows and header lists, and pings a silent client, closing the connection when it does
//!   not answer;
//! - an answer given before the request's body was read says `Connection: close`, so the client
//!   does not send its next request on a connection about to close.

mod activity;
mod h1;
mod io;
mod refuse;

use std::convert::Infallible;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use spillway_config::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;
use tracing::debug;

use crate::answer::Answer;
use crate::lines::Lines;
use crate::registered::Alarm;

use activity::{Activity, Busy, Deadlines, Verdict};
use io::Prefixed;

/// Pause after an accept error (out of file descriptors, say), as axum's own listener does.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);
/// HTTP/1: the most of a head, and of a read buffer, one connection holds.
pub(crate) const HTTP1_MAX_BUF: usize = 64 * 1024;
/// HTTP/2: a stream's and a connection's receive windows, and the most of headers one stream
/// may send and of response data one stream may queue. A stream's request body beyond its
/// window waits in the client until the gateway reads it.
pub(crate) const HTTP2_STREAM_WINDOW: u32 = 64 * 1024;
pub(crate) const HTTP2_CONNECTION_WINDOW: u32 = 256 * 1024;
const HTTP2_MAX_HEADER_LIST: u32 = 64 * 1024;
const HTTP2_MAX_SEND_BUF: usize = 64 * 1024;
/// Refused connections being answered at once, at most; beyond it they are only closed.
const MAX_REFUSING: usize = 256;
/// How long a refused connection is read (and dropped) after its answer, so closing it does
/// not reset the answer away before the client has read it.
const REFUSED_LINGER: Duration = Duration::from_secs(1);
/// How long a connection told to close (idle, or shutting down) may take to say goodbye.
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// One listener's connections: the cap and the limits each connection gets.
pub(crate) struct Connections {
    permits: Arc<Semaphore>,
    max: usize,
    deadlines: Deadlines,
    http2: http2::Builder<TokioExecutor>,
    refusing: Arc<Semaphore>,
    /// `api` or `admin`, for the metrics.
    listener: &'static str,
    /// Whether each request gets an `x-request-id` (`call::request_id`), on its way upstream and
    /// on its response: the API's requests do, the admin listener's need none.
    request_ids: bool,
}

impl Connections {
    /// The connections of a listener with at most `max` open, each under `server`'s limits.
    pub(crate) fn new(server: &ServerConfig, max: usize, listener: &'static str) -> Connections {
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .keep_alive_interval(server.http2_keepalive_interval)
            .keep_alive_timeout(server.http2_keepalive_timeout)
            .max_concurrent_streams(server.http2_max_concurrent_streams)
            .initial_stream_window_size(HTTP2_STREAM_WINDOW)
            .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
            .max_header_list_size(HTTP2_MAX_HEADER_LIST)
            .max_send_buf_size(HTTP2_MAX_SEND_BUF);
        Connections {
            permits: Arc::new(Semaphore::new(max)),
            max,
            deadlines: Deadlines {
                idle: server.idle_timeout,
                header_read: server.header_read_timeout,
            },
            http2,
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            listener,
            request_ids: false,
        }
    }

    /// These connections' requests get an `x-request-id` each ([`crate::call::request_id`]).
    pub(crate) fn with_request_ids(mut self) -> Connections {
        self.request_ids = true;
        self
    }

    /// Connections open now, and the cap.
    pub(crate) fn open(&self) -> (usize, usize) {
        let free = self.permits.available_permits().min(self.max);
        (self.max - free, self.max)
    }

    /// Serves `router` on `listener` until `stop` resolves; then stops accepting, asks every
    /// open connection to close once its requests are done, and resolves when all have.
    pub(crate) async fn serve<S: Serve>(
        self: Arc<Self>,
        listener: TcpListener,
        router: S,
        stop: impl Future<Output = ()>,
    ) {
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut stop = pin!(stop);
        loop {
            let accepted = tokio::select! {
                () = &mut stop => break,
                accepted = listener.accept() => accepted,
            };
            let tcp = match accepted {
                Ok((tcp, _)) => tcp,
                Err(_) => {
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            // Without TCP_NODELAY, small SSE chunks wait on Nagle's algorithm.
            let _ = tcp.set_nodelay(true);
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    let activity = Activity::new(crate::clock::now(), self.deadlines);
                    let this = self.clone();
                    let router = router.clone();
                    let shutdown = shutdown_rx.clone();
                    tokio::spawn(crate::clock::OneReading::new(async move {
                        let _permit = permit;
                        this.connection(tcp, activity, router, shutdown).await
                    }));
                }
                Err(_) => self.refuse(tcp),
            }
        }
        drop(listener);
        let _ = shutdown.send(true);
        // Every connection task holds a receiver until it ends.
        drop(shutdown_rx);
        shutdown.closed().await;
    }

    async fn connection<S: Serve>(
        &self,
        tcp: TcpStream,
        activity: Arc<Activity>,
        router: S,
        shutdown: watch::Receiver<bool>,
    ) {
        let (read, write) = tcp.into_split();
        let conn = h1::Conn {
            socket: h1::body::Socket::new(read, write),
            activity: activity.clone(),
            router: router.clone(),
            request_ids: self.request_ids,
            shutdown: shutdown.clone(),
            stall: self.deadlines.idle,
        };
        let ended = conn.run().await;
        match ended {
            h1::Ended::Closed => {}
            h1::Ended::Outstayed(verdict) => {
                debug!(?verdict, "closing a client connection");
                closed(
                    self.listener,
                    match verdict {
                        Verdict::SlowHead => "header_read_timeout",
                        _ => "idle_timeout",
                    },
                );
            }
            h1::Ended::Linger(tcp) => linger_close(tcp).await,
            h1::Ended::Refused(tcp, refusal) => {
                closed(self.listener, "malformed_head");
                answer_and_close(tcp, &refuse::bad_head(refusal)).await;
            }
            h1::Ended::Http2(tcp, read) => {
                let io = Prefixed::new(tcp, read.freeze());
                self.http2(io, activity, router, shutdown).await;
            }
        }
    }

    /// Serves an HTTP/2 connection with hyper, its requests under the same limits.
    async fn http2<S: Serve>(
        &self,
        io: Prefixed,
        activity: Arc<Activity>,
        router: S,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let served = activity.clone();
        let request_ids = self.request_ids;
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let busy = served.begin();
            let router = router.clone();
            async move { Ok::<_, Infallible>(respond(router, req, busy, request_ids).await) }
        });
        let mut conn = pin!(self.http2.serve_connection(TokioIo::new(io), service));
        let mut watchdog = pin!(outstayed(&activity));
        let mut draining = false;
        let mut linger: Option<Pin<Box<tokio::time::Sleep>>> = None;
        loop {
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        debug!("client connection ended: {e}");
                    }
                    return;
                }
                _ = shutdown.wait_for(|s| *s), if !draining => {
                    // Requests in flight finish (bounded by shutdown_grace); then it closes.
                    conn.as_mut().graceful_shutdown();
                    draining = true;
                }
                verdict = &mut watchdog, if linger.is_none() => {
                    debug!(?verdict, "closing a client connection");
                    closed(self.listener, "idle_timeout");
                    conn.as_mut().graceful_shutdown();
                    linger = Some(Box::pin(tokio::time::sleep(CLOSE_LINGER)));
                }
                () = async { linger.as_mut().expect("guarded").await }, if linger.is_some() => return,
            }
        }
    }

    /// Answers a connection over the cap with 503 and closes it.
    fn refuse(&self, tcp: TcpStream) {
        closed(self.listener, "over_capacity");
        let Ok(turn) = self.refusing.clone().try_acquire_owned() else {
            return;
        };
        let answer = refuse::over_capacity(self.max);
        tokio::spawn(async move {
            let _turn = turn;
            answer_and_close(tcp, &answer).await;
        });
    }
}

/// Writes `answer` to a connection and closes it. The answer is small and the socket's send
/// buffer empty, so the write does not block (one that would is given up); reading what the
/// client still sends for a moment before the close lets its request arrive, where closing
/// with bytes unread would reset the connection and lose the answer.
async fn answer_and_close(tcp: TcpStream, answer: &[u8]) {
    if tcp.try_write(answer).is_err() {
        return;
    }
    linger_close(tcp).await;
}

/// Closes a connection after its last answer: the write side at once, the read side once the
/// client has closed its own or [`REFUSED_LINGER`] has passed, what it sent meanwhile dropped.
async fn linger_close(mut tcp: TcpStream) {
    let _ = tcp.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(REFUSED_LINGER, async {
        while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

fn closed(listener: &'static str, reason: &'static str) {
    crate::admission::metrics::connection_closed(listener, reason);
}

/// Resolves with the verdict once the connection has outstayed a deadline.
///
/// Its one timer is polled only when it may have fired (an HTTP/1 connection's task polls this
/// each time it is woken while it awaits a head: [`Alarm`] keeps that from registering the
/// task's waker again every time), and moved in place to the next time to look.
pub(super) async fn outstayed(activity: &Activity) -> Verdict {
    let mut alarm: Option<Alarm> = None;
    std::future::poll_fn(|cx| loop {
        if let Some(alarm) = alarm.as_mut() {
            if alarm.poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        match activity.verdict(crate::clock::now()) {
            Verdict::Until(due) => match alarm.as_mut() {
                Some(alarm) => alarm.reset(due.into()),
                None => alarm = Some(Alarm::at(due.into())),
            },
            verdict => return Poll::Ready(verdict),
        }
    })
    .await
}

/// What answers a listener's requests: an axum `Router`, or a service that answers the busiest
/// routes itself and leaves the rest to one.
pub(crate) trait Serve: Clone + Send + Sync + 'static {
    /// Answers the request whose line is `head` (its own header map is empty: its header lines
    /// are `lines`) with `body`. The head is lent, not given: it stays where the connection read
    /// it, as a request on the inference path needs no more of it than its query.
    fn serve<'a>(
        &'a self,
        head: &'a Request<()>,
        body: Body,
        lines: Lines,
    ) -> impl Future<Output = Answer> + Send + 'a;
}

impl Serve for Router {
    fn serve<'a>(
        &'a self,
        head: &'a Request<()>,
        body: Body,
        lines: Lines,
    ) -> impl Future<Output = Answer> + Send + 'a {
        let mut req = Request::new(body);
        *req.method_mut() = head.method().clone();
        *req.uri_mut() = head.uri().clone();
        *req.version_mut() = head.version();
        *req.headers_mut() = lines.into_map();
        *req.extensions_mut() = head.extensions().clone();
        let router = self.clone();
        async move {
            let response = router.oneshot(req).await;
            Answer::from(response.unwrap_or_else(|e| match e {}))
        }
    }
}

/// Serves one HTTP/2 request, its connection busy until the response's body is done with.
async fn respond<S: Serve>(
    router: S,
    req: Request<Incoming>,
    busy: Busy,
    request_ids: bool,
) -> Response<Tracked> {
    let (req, mut lines) = crate::lines::taken(req);
    let id = request_ids.then(|| crate::call::request_id(&mut lines));
    let (parts, body) = req.into_parts();
    let head = Request::from_parts(parts, ());
    let mut answer = router.serve(&head, Body::new(body), lines).await;
    if let Some(id) = id {
        answer.lines.insert(crate::call::X_REQUEST_ID, id);
    }
    // Handed to hyper as it is: no second box around the router's body.
    answer
        .map(|inner| Tracked { inner, _busy: busy })
        .into_response()
}

/// A response body that keeps its connection busy until it is done with.
struct Tracked {
    inner: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
