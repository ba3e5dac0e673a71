//! A streamed reply as a response body: one server-sent event per frame, each produced when its
//! token is due.
//!
//! The events and their order are the [`Plan`]'s (chat and completions chunks ending in
//! `[DONE]`, the Responses and Messages APIs' named events); this module only paces them: the
//! events before the first token are due with it, each token's event when that token is, and
//! the first event after the last token with the last token. The body owns the request's
//! generation slot and its outcome, so a client that goes away mid-stream frees the slot and
//! counts as cancelled the moment hyper drops the body. A profile with `break_stream_after` ends
//! the body with an error instead of the stream's last event (`[DONE]`, `response.completed`,
//! `message_stop`); hyper then aborts the chunked response without its terminating chunk, which
//! is what a crashed upstream looks like to the gateway. A Responses or chat stream to be stored
//! is stored as its last event is produced, so a client that has read the whole stream finds
//! it stored; one broken off or left by its client is not.

use std::fmt;

use axum::body::Body;
use bytes::Bytes;

use serde_json::Value;

use crate::generate::{Pace, Plan, Step};
use crate::slots::SlotPermit;
use crate::stats::{Event, Outcome};
use crate::{chats, responses};

/// What a streamed reply is made of, and what it holds until it ends.
pub(crate) struct StreamParts {
    pub(crate) plan: Plan,
    pub(crate) pace: Pace,
    pub(crate) break_after: Option<u32>,
    pub(crate) permit: Option<SlotPermit>,
    pub(crate) outcome: Outcome,
    /// Where the response is stored once the stream completes, if it is to be.
    pub(crate) keep: Option<Keep>,
}

/// A reply to be stored once it is complete: a Responses create's, or a chat completion's.
#[derive(Debug)]
pub(crate) enum Keep {
    Response(responses::Keep),
    Chat(chats::Keep),
}

impl Keep {
    /// Stores the whole reply of `plan` and returns the object a plain reply answers.
    pub(crate) fn commit(self, plan: &Plan) -> Value {
        match self {
            Keep::Response(keep) => keep.commit(plan),
            Keep::Chat(keep) => keep.commit(plan),
        }
    }
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

/// The body of a streamed reply.
pub(crate) fn body(parts: StreamParts) -> Body {
    let state = TokenStream {
        sent: 0,
        ended: false,
        break_at: parts.break_after.map(|n| parts.plan.break_point(n)),
        permit: parts.permit,
        plan: parts.plan,
        pace: parts.pace,
        outcome: parts.outcome,
        keep: parts.keep,
    };
    Body::from_stream(futures_util::stream::unfold(state, |mut s| async move {
        let frame = s.next_frame().await?;
        Some((frame, s))
    }))
}

struct TokenStream {
    plan: Plan,
    pace: Pace,
    /// The place of the event the profile breaks the stream off before.
    break_at: Option<u32>,
    /// Events sent so far.
    sent: u32,
    ended: bool,
    /// Dropped as soon as the stream ends, so `in_flight` is down before the client sees the
    /// last event.
    permit: Option<SlotPermit>,
    outcome: Outcome,
    keep: Option<Keep>,
}

impl TokenStream {
    async fn next_frame(&mut self) -> Option<Result<Bytes, StreamBroken>> {
        if self.ended {
            return None;
        }
        let step = self.plan.step(self.sent)?;
        if self.break_at.is_some_and(|at| self.sent >= at) {
            // Give hyper one pending poll so it flushes the events already produced; an
            // error on the very next poll would otherwise discard them unsent.
            tokio::task::yield_now().await;
            self.end(Event::StreamBroken);
            return Some(Err(StreamBroken));
        }
        match step {
            Step::Open(_) => tokio::time::sleep_until(self.pace.due(0)).await,
            Step::Token(i) => tokio::time::sleep_until(self.pace.due(i)).await,
            // With no tokens at all, this still waits for the first-token time.
            Step::Close(0) => tokio::time::sleep_until(self.pace.done(self.plan.tokens)).await,
            Step::Close(_) => {}
        }
        let frame = self.plan.frame(step, self.sent);
        self.sent = self.sent.saturating_add(1);
        if self.sent >= self.plan.events() {
            if let Some(keep) = self.keep.take() {
                keep.commit(&self.plan);
            }
            self.end(Event::Served);
        }
        Some(Ok(frame))
    }

    fn end(&mut self, event: Event) {
        self.ended = true;
        self.permit = None;
        self.outcome.settle(Some(event));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use spillway_config::MockProfile;
    use tokio::time::Instant;

    use super::*;
    use crate::request::{Generation, Surface};
    use crate::stats::Recorder;

    /// Each event of a stream with when it came, on the paused clock, from the pace's start.
    async fn timed_events(surface: Surface, break_after: Option<u32>) -> Vec<(Step, Duration)> {
        let profile = MockProfile {
            ttft: Duration::from_millis(100),
            tokens_per_sec: 10.0,
            ..MockProfile::default()
        };
        let g = Generation {
            stream: true,
            include_usage: false,
            max_tokens: Some(3),
            prompt_tokens: 1,
        };
        let recorder = Arc::new(Recorder::default());
        let start = Instant::now();
        let mut s = TokenStream {
            plan: Plan::new(surface, "m", &g, &profile, 0),
            pace: Pace::start(&profile, 0),
            break_at: None,
            sent: 0,
            ended: false,
            permit: None,
            outcome: recorder.arrive("/"),
            keep: None,
        };
        s.break_at = break_after.map(|n| s.plan.break_point(n));
        let mut out = Vec::new();
        while let Some(frame) = s.next_frame().await {
            if frame.is_err() {
                break;
            }
            let step = s.plan.step(s.sent - 1).unwrap();
            out.push((step, start.elapsed()));
        }
        let stats = recorder.snapshot(0, 0);
        let counted = if break_after.is_some() {
            stats.streams_broken
        } else {
            stats.served
        };
        assert_eq!(counted, 1, "{stats:?}");
        out
    }

    #[tokio::test(start_paused = true)]
    async fn every_surface_paces_its_token_events_as_chat_does() {
        let ms = Duration::from_millis;
        for surface in [Surface::Chat, Surface::Responses, Surface::Messages] {
            let events = timed_events(surface, None).await;
            let tokens: Vec<Duration> = events
                .iter()
                .filter(|(step, _)| matches!(step, Step::Token(_)))
                .map(|&(_, at)| at)
                .collect();
            assert_eq!(tokens, [ms(100), ms(200), ms(300)], "{surface:?}");
            for (step, at) in &events {
                match step {
                    Step::Open(_) => assert_eq!(*at, ms(100), "{surface:?}"),
                    Step::Close(_) => assert_eq!(*at, ms(300), "{surface:?}"),
                    Step::Token(_) => {}
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_break_withholds_the_rest_and_counts_as_broken() {
        let events = timed_events(Surface::Messages, Some(2)).await;
        let steps: Vec<Step> = events.into_iter().map(|(s, _)| s).collect();
        assert_eq!(
            steps,
            [
                Step::Open(0),
                Step::Open(1),
                Step::Open(2),
                Step::Token(0),
                Step::Token(1)
            ]
        );
    }
}
