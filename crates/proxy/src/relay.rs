//! Relaying a response body to the client frame by frame, as it arrives.
//!
//! Nothing is buffered: each upstream frame is handed to the client connection when it arrives,
//! so a streamed completion's first token reaches the caller when the backend sends it. The relay
//! also owns the request's hold on its backend (released when the body ends or the client goes
//! away, which also drops the upstream connection and so cancels the generation) and reports how
//! the body ended. A stream that breaks off upstream, or stalls past the idle timeout, is never
//! passed on as a clean end: an SSE client gets a final error event and no `[DONE]`; any other
//! body is aborted so the client sees a truncated response, not a short valid one.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::endpoint::Endpoint;
use crate::error::{ApiError, ErrorKind};
use crate::pool::{Backend, InFlight};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a relayed body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    Complete,
    /// The upstream connection failed mid-body.
    UpstreamBroke,
    /// The upstream sent nothing for longer than the idle timeout.
    UpstreamStalled,
    /// The client went away first.
    ClientGone,
}

/// Shown every data frame, and told once how the body ended.
///
/// A frame is shown twice: [`arrived`](EndObserver::arrived) as it comes, before it is passed
/// on (for its time), and [`frame`](EndObserver::frame) once it has been passed on, when the
/// body is next asked for a frame or ends (for what reads its bytes: the usage scan). So the
/// client connection, which writes an answer of known length once it has all of it, writes it
/// before the gateway reads it (a stream's event is read when the next one is asked for, which
/// may come before it is written); every frame is read before [`ended`](EndObserver::ended),
/// however the body ends. The end is told with the backend that answered (the relay's hold on
/// it), which the observer reads from there rather than holding it a second time.
pub trait EndObserver: Send + Sync + Unpin + 'static {
    fn arrived(&mut self, _data: &Bytes) {}
    fn frame(&mut self, _data: &Bytes) {}
    fn ended(&mut self, end: BodyEnd, backend: &Backend);
}

pub struct RelayBody<B: Body<Data = Bytes> + Unpin, O: EndObserver> {
    inner: B,
    sse: bool,
    /// Whose stream error event ends a broken SSE body.
    endpoint: Endpoint,
    idle_timeout: Duration,
    last_frame: Instant,
    /// Armed the first time the upstream makes the relay wait: most bodies never do.
    idle: Option<Pin<Box<Sleep>>>,
    /// Boxed: the observer is large (the call's ticket, usage scan and trace), and the body is
    /// moved into a box of its own and its state out of it at the end, each a copy by value.
    state: Option<Box<(InFlight, O)>>,
    /// The last data frame passed on, not yet shown to the observer's `frame`.
    unread: Option<Bytes>,
}

impl<B: Body<Data = Bytes> + Unpin, O: EndObserver> RelayBody<B, O> {
    /// `state` is the hold on the backend and the observer, boxed by the caller: built inside
    /// `Box::new` they are copied once, into the box, where passing them here by value would
    /// copy them again on the way.
    pub fn new(
        inner: B,
        sse: bool,
        endpoint: Endpoint,
        idle_timeout: Duration,
        state: Box<(InFlight, O)>,
    ) -> Self {
        Self {
            inner,
            sse,
            endpoint,
            idle_timeout,
            last_frame: now(),
            idle: None,
            state: Some(state),
            unread: None,
        }
    }

    /// Shows the observer the frame passed on last, if it has not seen it.
    fn read_passed(&mut self) {
        if let (Some(data), Some((_, observer))) = (self.unread.take(), self.state.as_deref_mut()) {
            observer.frame(&data);
        }
    }

    fn finish(&mut self, end: BodyEnd) {
        self.read_passed();
        if let Some(mut state) = self.state.take() {
            let (hold, observer) = &mut *state;
            observer.ended(end, hold.backend());
            // Then dropped: the hold before the observer, as a tuple's fields drop.
        }
    }

    /// Ends a broken body: a final error event for SSE clients, an aborted body otherwise.
    fn broken(
        &mut self,
        end: BodyEnd,
        why: String,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.finish(end);
        if self.sse {
            let kind = if end == BodyEnd::UpstreamStalled {
                ErrorKind::UpstreamTimeout
            } else {
                ErrorKind::UpstreamUnavailable
            };
            let event = ApiError::new(kind, format!("the upstream stream broke off: {why}"))
                .stream_event(self.endpoint);
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
        } else {
            Poll::Ready(Some(Err(why.into())))
        }
    }
}

impl<B, O> Body for RelayBody<B, O>
where
    B: Body<Data = Bytes, Error: std::fmt::Display> + Unpin,
    O: EndObserver,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.state.is_none() {
            return Poll::Ready(None);
        }
        this.read_passed();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.last_frame = now();
                if let (Some(data), Some((_, observer))) =
                    (frame.data_ref(), this.state.as_deref_mut())
                {
                    observer.arrived(data);
                    this.unread = Some(data.clone());
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => this.broken(BodyEnd::UpstreamBroke, e.to_string()),
            Poll::Ready(None) => {
                this.finish(BodyEnd::Complete);
                Poll::Ready(None)
            }
            Poll::Pending => {
                // The timer is moved only when it fires, not on every frame.
                loop {
                    let deadline = this.last_frame + this.idle_timeout;
                    let idle = this
                        .idle
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                    if idle.deadline() < deadline {
                        idle.as_mut().reset(deadline);
                    }
                    ready!(idle.as_mut().poll(cx));
                    if now() >= this.last_frame + this.idle_timeout {
                        let why = format!("no data for {:?}", this.idle_timeout);
                        return this.broken(BodyEnd::UpstreamStalled, why);
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Not the inner body's answer: the relay must be polled to its end to report it.
        self.state.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.sse {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin, O: EndObserver> Drop for RelayBody<B, O> {
    fn drop(&mut self) {
        // hyper drops a body of known length once it has written that many bytes, without a
        // last poll: that is a complete response, not a client that went away.
        let end = if self.inner.is_end_stream() {
            BodyEnd::Complete
        } else {
            BodyEnd::ClientGone
        };
        self.finish(end);
    }
}

/// Now, as the relay's timer counts it: the request path's clock (`clock::now`, read once per
/// poll of a connection's task).
fn now() -> Instant {
    Instant::from_std(crate::clock::now())
}
