//! A streamed completion as a response body: one server-sent event per frame, each produced
//! when its token is due.
//!
//! The body owns the request's generation slot and its outcome, so a client that goes away
//! mid-stream frees the slot and counts as cancelled the moment hyper drops the body. A profile
//! with `break_stream_after` ends the body with an error instead of `[DONE]`; hyper then aborts
//! the chunked response without its terminating chunk, which is what a crashed upstream looks
//! like to the gateway.

use std::fmt;

use axum::body::Body;
use bytes::Bytes;

use crate::generate::{Pace, Plan};
use crate::slots::SlotPermit;
use crate::stats::{Event, Outcome};

/// What a streamed reply is made of, and what it holds until it ends.
pub(crate) struct StreamParts {
    pub(crate) plan: Plan,
    pub(crate) pace: Pace,
    pub(crate) include_usage: bool,
    pub(crate) break_after: Option<u32>,
    pub(crate) permit: SlotPermit,
    pub(crate) outcome: Outcome,
}

/// The body error that aborts a stream the profile breaks off.
#[derive(Debug)]
pub(crate) struct StreamBroken;

impl fmt::Display for StreamBroken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stream broken off by the mock profile (break_stream_after)")
    }
}

impl std::error::Error for StreamBroken {}

/// The body of a streamed completion.
pub(crate) fn body(parts: StreamParts) -> Body {
    let state = TokenStream {
        sent: 0,
        ended: false,
        permit: Some(parts.permit),
        plan: parts.plan,
        pace: parts.pace,
        include_usage: parts.include_usage,
        break_after: parts.break_after,
        outcome: parts.outcome,
    };
    Body::from_stream(futures_util::stream::unfold(state, |mut s| async move {
        let frame = s.next_frame().await?;
        Some((frame, s))
    }))
}

/// The events of a stream, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Role,
    Token(u32),
    Finish,
    Usage,
    Done,
    End,
}

struct TokenStream {
    plan: Plan,
    pace: Pace,
    include_usage: bool,
    break_after: Option<u32>,
    /// Events sent so far.
    sent: u32,
    ended: bool,
    /// Dropped as soon as the stream ends, so `in_flight` is down before the client sees `[DONE]`.
    permit: Option<SlotPermit>,
    outcome: Outcome,
}

impl TokenStream {
    async fn next_frame(&mut self) -> Option<Result<Bytes, StreamBroken>> {
        if self.ended {
            return None;
        }
        let step = self.step(self.sent);
        if let Some(n) = self.break_after {
            if self.sent >= n || step == Step::Done {
                // Give hyper one pending poll so it flushes the events already produced; an
                // error on the very next poll would otherwise discard them unsent.
                tokio::task::yield_now().await;
                self.end(Event::StreamBroken);
                return Some(Err(StreamBroken));
            }
        }
        let plan = &self.plan;
        let frame = match step {
            Step::Role => {
                tokio::time::sleep_until(self.pace.due(0)).await;
                plan.role_chunk()
            }
            Step::Token(i) => {
                tokio::time::sleep_until(self.pace.due(i)).await;
                plan.token_chunk(i)
            }
            Step::Finish => {
                // With no tokens at all, the first (and only) event still waits for ttft.
                tokio::time::sleep_until(self.pace.done(plan.tokens)).await;
                plan.finish_chunk()
            }
            Step::Usage => plan.usage_chunk(),
            Step::Done => {
                self.end(Event::Served);
                Bytes::from_static(b"data: [DONE]\n\n")
            }
            Step::End => return None,
        };
        self.sent = self.sent.saturating_add(1);
        Some(Ok(frame))
    }

    fn end(&mut self, event: Event) {
        self.ended = true;
        self.permit = None;
        self.outcome.settle(Some(event));
    }

    /// The event at position `i`: [role], tokens, finish, [usage], `[DONE]`.
    fn step(&self, mut i: u32) -> Step {
        if self.plan.has_role_chunk() {
            if i == 0 {
                return Step::Role;
            }
            i -= 1;
        }
        let tokens = self.plan.tokens;
        if i < tokens {
            return Step::Token(i);
        }
        i -= tokens;
        let tail: &[Step] = if self.include_usage {
            &[Step::Finish, Step::Usage, Step::Done]
        } else {
            &[Step::Finish, Step::Done]
        };
        tail.get(i as usize).copied().unwrap_or(Step::End)
    }
}
