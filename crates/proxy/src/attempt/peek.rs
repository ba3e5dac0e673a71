//! A relayed upstream response whose body may have been read ahead: a `400` is, when the call's
//! model has a fallback for a prompt too long for its context window, so that the loop can tell
//! that error from the others before anything reaches the client.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use spillway_policy::fallback::{is_context_window_error, MAX_ERROR_BODY};
use spillway_policy::{Outcome, Trigger};

use super::Loop;
use crate::answer::Answer;

/// The longest an error body is waited for.
const MAX_PEEK_WAIT: Duration = Duration::from_secs(5);

/// A response body with the part already read (if any) ahead of the rest.
pub(crate) struct Peeked<B> {
    head: Option<Bytes>,
    rest: B,
}

impl<B> Peeked<B> {
    /// A body nothing was read of.
    pub(crate) fn new(rest: B) -> Self {
        Peeked { head: None, rest }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Peeked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(head) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let head = self.head.as_ref().map_or(0, |h| h.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + head);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + head);
        }
        hint
    }
}

impl Loop<'_, '_> {
    /// `response` as it will be relayed. A `400` is read ahead (its first [`MAX_ERROR_BODY`]
    /// bytes and the rest of the frame that reaches them, for at most [`MAX_PEEK_WAIT`]) when
    /// the call's model has a fallback for [`Trigger::ContextWindow`] still to come; if it says
    /// the prompt did not fit, the run ends with that trigger.
    pub(super) async fn peek<B>(
        &mut self,
        response: Answer<B>,
        outcome: Outcome,
    ) -> Answer<Peeked<B>>
    where
        B: Body<Data = Bytes> + Unpin,
    {
        if outcome != Outcome::Response(400) || !self.fallback_waits(Trigger::ContextWindow) {
            return response.map(Peeked::new);
        }
        let Answer {
            status,
            lines,
            mut body,
            extensions,
        } = response;
        let mut read = BytesMut::new();
        let _ = tokio::time::timeout(MAX_PEEK_WAIT, async {
            while read.len() < MAX_ERROR_BODY {
                match body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            read.extend_from_slice(&data);
                        }
                    }
                    _ => break,
                }
            }
        })
        .await;
        if is_context_window_error(&read) {
            self.trigger = Some(Trigger::ContextWindow);
        }
        let peeked = Peeked {
            head: (!read.is_empty()).then(|| read.freeze()),
            rest: body,
        };
        Answer {
            status,
            lines,
            body: peeked,
            extensions,
        }
    }
}
