//! HTTP/1.1 client connections, served by the gateway itself: heads read from one buffer per
//! connection (`head.rs`), request bodies decoded from it as the handler asks (`body.rs`), and
//! responses written with their framing (`write.rs`). A connection whose first bytes are the
//! HTTP/2 preface is handed back, with those bytes, to be served by hyper.
//!
//! One request at a time: the next head is read only once the response before it has been
//! written whole, so requests a client sends without waiting (pipelined) are answered in order.
//! A connection carries another request only when both bodies ended exactly where their framing
//! said; anything else (a body left unread, a response cut short, a client's `close`, the
//! gateway shutting down) ends it after the response, which then says `connection: close`.
//! A head that cannot be read is answered with the API's JSON error and the connection closed.
//!
//! While a response is awaited or streamed, the connection watches for the client closing its
//! side (once the request's body has been read): the request is then dropped, as a client that
//! went away. So is one whose client takes none of the answer for `server.idle_timeout`.

pub(crate) mod body;
mod head;
mod write;

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::Method;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::activity::{Activity, Verdict};
use super::Serve;
use crate::registered::Quiet;
use body::{RequestBody, Socket, MAX_BUFFER};
use head::Head;
pub(crate) use head::Refusal;

/// The first bytes of an HTTP/2 connection (RFC 9113, section 3.4), enough to tell it apart.
const H2_PREFACE_START: &[u8] = b"PRI * HTTP/2.0";

/// How a connection's HTTP/1 service ended.
pub(crate) enum Ended {
    Closed,
    /// A head could not be read: the client is to be told why and the connection closed.
    Refused(TcpStream, Refusal),
    /// Closed with the request's body unread: what more the client sends is to be read away
    /// for a moment before the connection closes.
    Linger(TcpStream),
    /// Closed while awaiting a head: idle for `server.idle_timeout`, or a head slower than
    /// `server.header_read_timeout`.
    Outstayed(Verdict),
    /// The client speaks HTTP/2: its socket and what was read of it.
    Http2(TcpStream, BytesMut),
}

/// One HTTP/1 connection.
pub(crate) struct Conn<S> {
    pub socket: Arc<Socket>,
    pub activity: Arc<Activity>,
    pub router: S,
    /// Whether each request gets an `x-request-id` ([`crate::call::request_id`]).
    pub request_ids: bool,
    /// True once the gateway shuts down: the request being served is the connection's last.
    pub shutdown: watch::Receiver<bool>,
    /// How long a client may take none of its answer (`server.idle_timeout`) before the
    /// connection is dropped.
    pub stall: std::time::Duration,
}

enum Next {
    /// A head, put in the connection's slot for it, with its request's number and its body when
    /// that came whole with it ([`body::Reading::begin`]).
    Head((u64, Option<Bytes>)),
    Closed,
    Refused(Refusal),
    Http2,
    Outstayed(Verdict),
}

impl<S: Serve> Conn<S> {
    /// Serves requests until the connection ends.
    pub(crate) async fn run(self) -> Ended {
        // What can end a connection between its requests: its deadlines, and the gateway
        // shutting down. They are looked at while a head is awaited, not while a request is
        // served: a busy connection has no deadline of its own (its body and its answer
        // have theirs), and one that is shut down meanwhile says `connection: close` in the
        // answer and ends after it.
        let mut watchdog = pin!(super::outstayed(&self.activity));
        let mut shutdown = self.shutdown.clone();
        // Polled while a head is awaited, each time the socket wakes the task: only when the
        // signal has changed once its wait stands (`Quiet`).
        let probe = self.shutdown.clone();
        let mut stopping = pin!(Quiet::new(shutdown.wait_for(|stop| *stop), || {
            probe.has_changed().unwrap_or(true)
        }));
        let mut first = true;
        // The head of the request being served. It is read into this place and stays there,
        // lent to the service: a head is some 300 bytes, and each move would copy them.
        let mut head = None;
        loop {
            let between = (watchdog.as_mut(), stopping.as_mut());
            let begun = match self.next_head(first, between, &mut head).await {
                Next::Head(begun) => begun,
                Next::Closed => return Ended::Closed,
                Next::Outstayed(verdict) => return Ended::Outstayed(verdict),
                Next::Refused(refusal) => {
                    return match Socket::into_parts(self.socket) {
                        Some((tcp, _)) => Ended::Refused(tcp, refusal),
                        None => Ended::Closed,
                    }
                }
                Next::Http2 => {
                    self.activity.set_http2();
                    return match Socket::into_parts(self.socket) {
                        Some((tcp, buf)) => Ended::Http2(tcp, buf),
                        None => Ended::Closed,
                    };
                }
            };
            first = false;
            if !self.exchange(&mut head, begun).await {
                // A body the client may still be sending is read away for a moment before the
                // close: closing with it unread would reset the connection, and the answer with
                // it, before the client has read it.
                let unread = {
                    let r = self.socket.lock();
                    !r.body_done() && !r.ended()
                };
                return match unread.then(|| Socket::into_parts(self.socket)).flatten() {
                    Some((tcp, _)) => Ended::Linger(tcp),
                    None => Ended::Closed,
                };
            }
        }
    }

    /// The next request's head, reading until it is whole, put in `slot`; or why the connection
    /// ends first: `watchdog`'s verdict, or the gateway shutting down (`stopping`).
    async fn next_head<W, T>(
        &self,
        first: bool,
        (mut watchdog, mut stopping): (Pin<&mut W>, Pin<&mut T>),
        slot: &mut Option<Head>,
    ) -> Next
    where
        W: Future<Output = Verdict>,
        T: Future,
    {
        poll_fn(|cx| {
            let mut r = self.socket.lock();
            loop {
                let preface = first
                    && !r.buf.is_empty()
                    && H2_PREFACE_START
                        .starts_with(&r.buf[..r.buf.len().min(H2_PREFACE_START.len())]);
                if preface {
                    if r.buf.len() >= H2_PREFACE_START.len() {
                        return Poll::Ready(Next::Http2);
                    }
                } else if r.may_hold_head() {
                    match head::parse(&mut r.buf) {
                        Ok(Some(head)) => {
                            r.head_taken();
                            // Begun under this lock: its body may be in the buffer already.
                            let begun = r.begin(head.framing, head.expect_continue);
                            *slot = Some(head);
                            return Poll::Ready(Next::Head(begun));
                        }
                        Ok(None) if r.buf.len() >= MAX_BUFFER => {
                            return Poll::Ready(Next::Refused(Refusal::TooLarge))
                        }
                        Ok(None) => {}
                        Err(refusal) => return Poll::Ready(Next::Refused(refusal)),
                    }
                } else if r.buf.len() >= MAX_BUFFER {
                    return Poll::Ready(Next::Refused(Refusal::TooLarge));
                }
                let Poll::Ready(filled) = r.poll_fill(cx) else {
                    // Only while nothing is to be read: a head that came is read first.
                    if let Poll::Ready(verdict) = watchdog.as_mut().poll(cx) {
                        return Poll::Ready(Next::Outstayed(verdict));
                    }
                    if stopping.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Next::Closed);
                    }
                    return Poll::Pending;
                };
                match filled {
                    Ok(0) | Err(_) => return Poll::Ready(Next::Closed),
                    Ok(_) if self.activity.awaits_head() => {
                        self.activity.bytes_read(crate::clock::now())
                    }
                    Ok(_) => {}
                }
            }
        })
        .await
    }

    /// Serves one request, whose head [`next_head`](Conn::next_head) put in `slot`, and writes
    /// its response; true when the connection goes on. The head is dropped with the request.
    async fn exchange(
        &self,
        slot: &mut Option<Head>,
        (number, whole): (u64, Option<Bytes>),
    ) -> bool {
        let Some(Head {
            request,
            lines,
            framing,
            keep_alive,
            expect_continue: _,
        }) = slot.as_mut()
        else {
            // `next_head` put one there before this is called; were none there, the connection
            // would end rather than answer nothing.
            return false;
        };
        let (framing, keep_alive) = (*framing, *keep_alive);
        let mut lines = std::mem::take(lines);
        let busy = self.activity.serving();
        let read_whole = whole.is_some();
        let asked_head = request.method() == Method::HEAD;
        let version = request.version();
        let body = match whole {
            Some(whole) if whole.is_empty() => Body::empty(),
            Some(whole) => Body::from(whole),
            None => Body::new(RequestBody::new(self.socket.clone(), number, framing)),
        };
        let id = self
            .request_ids
            .then(|| crate::call::request_id(&mut lines));
        // The response, unless the client closes the connection first. The handler's future
        // is made in place here, not passed on: it is large, and every move copies it.
        let answered = {
            let mut served = pin!(self.router.serve(request, body, lines));
            poll_fn(|cx| {
                if let Poll::Ready(response) = served.as_mut().poll(cx) {
                    return Poll::Ready(Some(response));
                }
                match self.socket.lock().poll_hangup(cx) {
                    Poll::Ready(()) => Poll::Ready(None),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await
        };
        let Some(mut response) = answered else {
            return false;
        };
        // The body left unread (an answer given before it came) ends the connection: the next
        // head would be read from the middle of it.
        let body_done = read_whole || self.socket.lock().body_done();
        let close = !keep_alive || !body_done || self.shutting_down();
        if let Some(id) = id {
            response.lines.insert(crate::call::X_REQUEST_ID, id);
        }
        let asked = write::Asked {
            head: asked_head,
            version,
            close,
            stall: self.stall,
        };
        let kept = write::response(&self.socket, response, asked).await;
        *slot = None;
        drop(busy);
        kept && !self.shutting_down()
    }

    /// Whether the gateway shuts down: its one signal is `true`, sent once, so any change
    /// says it (an atomic load, where reading the value takes its lock).
    fn shutting_down(&self) -> bool {
        self.shutdown.has_changed().unwrap_or(true)
    }
}
