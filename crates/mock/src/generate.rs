//! Simulated generation: how many tokens, when each is due, what a stream is made of, and the
//! OpenAI chat and text completion shapes.
//!
//! The shapes follow what the official `openai` SDKs parse: `chat.completion` and
//! `text_completion` objects with `usage`, and for streams `chat.completion.chunk` /
//! `text_completion` chunks framed as server-sent events. The Responses and Messages APIs'
//! shapes are in `responses.rs` and `messages.rs`; every surface shares the [`Plan`], its
//! tokens and their text, and a stream's layout of opening events, one event per token and
//! closing events ([`Step`]). Timing is a schedule (first token after `ttft` plus the prefill
//! of the prompt tokens the prefix cache did not hold, then one per `1 / tokens_per_sec`)
//! measured from one start instant, so slow polling never makes a stream drift later than the
//! profile says.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use spillway_config::MockProfile;
use tokio::time::Instant;

pub(crate) use crate::plan::{output_length, Plan, Step};
use crate::plan::{sse, token_text};
use crate::request::Surface;
use crate::{messages, responses};

/// The longest single wait the schedule computes; beyond it a profile is effectively "never".
const LONGEST_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

impl Plan {
    /// The whole non-streaming response.
    pub(crate) fn completion(&self) -> Value {
        match self.surface {
            Surface::Chat | Surface::Completions => self.openai_completion(),
            Surface::Responses => responses::response(self, true),
            Surface::Messages => messages::message(self),
        }
    }

    /// The whole generated text.
    /// Events in the whole stream.
    pub(crate) fn events(&self) -> u32 {
        let (open, close) = self.layout();
        open.saturating_add(self.tokens).saturating_add(close)
    }

    /// The event at place `i` of the stream, from 0; `None` past its end.
    pub(crate) fn step(&self, i: u32) -> Option<Step> {
        let (open, close) = self.layout();
        if i < open {
            return Some(Step::Open(i));
        }
        let i = i - open;
        if i < self.tokens {
            return Some(Step::Token(i));
        }
        let i = i - self.tokens;
        (i < close).then_some(Step::Close(i))
    }

    /// The place of the event `break_stream_after: Some(n)` breaks the stream off before: after
    /// `n` events of a chat or completions stream, after the opening events and `n` tokens of a
    /// Responses or Messages stream, and never later than before the event that ends it.
    pub(crate) fn break_point(&self, n: u32) -> u32 {
        let uncounted = match self.surface {
            Surface::Chat | Surface::Completions => 0,
            Surface::Responses | Surface::Messages => self.layout().0,
        };
        uncounted
            .saturating_add(n)
            .min(self.events().saturating_sub(1))
    }

    /// The bytes of event `step`, which is at place `seq` of the stream.
    pub(crate) fn frame(&self, step: Step, seq: u32) -> Bytes {
        match self.surface {
            Surface::Chat | Surface::Completions => self.openai_frame(step),
            Surface::Responses => responses::frame(self, step, seq),
            Surface::Messages => messages::frame(self, step),
        }
    }

    /// Events before the first token and after the last.
    fn layout(&self) -> (u32, u32) {
        match self.surface {
            Surface::Chat => (1, 2 + u32::from(self.include_usage)),
            Surface::Completions => (0, 2 + u32::from(self.include_usage)),
            Surface::Responses => (responses::OPENING, responses::CLOSING),
            Surface::Messages => (messages::OPENING, messages::CLOSING),
        }
    }

    fn chat(&self) -> bool {
        self.surface == Surface::Chat
    }

    fn finish_reason(&self) -> &'static str {
        if self.at_limit {
            "length"
        } else {
            "stop"
        }
    }

    fn openai_completion(&self) -> Value {
        let text = self.text();
        let choice = if self.chat() {
            json!({"index": 0, "message": {"role": "assistant", "content": text, "refusal": null},
                   "logprobs": null, "finish_reason": self.finish_reason()})
        } else {
            let finish = self.finish_reason();
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
        };
        json!({
            "id": self.id, "object": self.object(false), "created": self.created, "model": self.model,
            "system_fingerprint": "fp_spillway_mock", "choices": [choice], "usage": self.usage(),
        })
    }

    /// Chat and completions: the role chunk (chat only), tokens, finish, the usage chunk (if asked
    /// for), `[DONE]`.
    fn openai_frame(&self, step: Step) -> Bytes {
        match step {
            Step::Open(_) => self.chunk(json!({"role": "assistant", "content": ""}), "", None),
            Step::Token(i) => {
                let text = token_text(i);
                self.chunk(json!({"content": text}), text, None)
            }
            Step::Close(0) => self.chunk(json!({}), "", Some(self.finish_reason())),
            Step::Close(1) if self.include_usage => self.usage_chunk(),
            Step::Close(_) => Bytes::from_static(b"data: [DONE]\n\n"),
        }
    }

    /// The chunk `stream_options.include_usage` asks for: no choices, only usage.
    fn usage_chunk(&self) -> Bytes {
        sse(&json!({
            "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "system_fingerprint": "fp_spillway_mock", "choices": [], "usage": self.usage(),
        }))
    }

    fn chunk(&self, delta: Value, text: &str, finish: Option<&str>) -> Bytes {
        let choice = if self.chat() {
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
        };
        sse(&json!({
            "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "system_fingerprint": "fp_spillway_mock", "choices": [choice],
        }))
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.chat(), chunk) {
            (true, false) => "chat.completion",
            (true, true) => "chat.completion.chunk",
            (false, _) => "text_completion",
        }
    }

    fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.tokens,
            "total_tokens": u64::from(self.prompt_tokens) + u64::from(self.tokens),
        })
    }
}

/// When each token of one request is due.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pace {
    start: Instant,
    ttft: Duration,
    interval: Duration,
}

impl Pace {
    /// Starts the schedule now, when the request holds its generation slot and has `prefill`
    /// prompt tokens to compute before its first token.
    pub(crate) fn start(profile: &MockProfile, prefill: u32) -> Self {
        let time_for = |tokens: f64, rate: f64| {
            if rate > 0.0 {
                Duration::try_from_secs_f64(tokens / rate)
                    .map_or(LONGEST_WAIT, |d| d.min(LONGEST_WAIT))
            } else {
                Duration::ZERO
            }
        };
        let prefill = time_for(prefill.into(), profile.prefill_tokens_per_sec);
        Self {
            start: Instant::now(),
            ttft: profile.ttft.saturating_add(prefill).min(LONGEST_WAIT),
            interval: time_for(1.0, profile.tokens_per_sec),
        }
    }

    /// Token `i` (from 0) is due `ttft + prefill + i / tokens_per_sec` after the start.
    pub(crate) fn due(&self, i: u32) -> Instant {
        let offset = self
            .ttft
            .saturating_add(self.interval.saturating_mul(i))
            .min(LONGEST_WAIT);
        self.start + offset
    }

    /// When the last of `tokens` tokens is due (the first-token time if there are none).
    pub(crate) fn done(&self, tokens: u32) -> Instant {
        self.due(tokens.saturating_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::sse_named;
    use crate::request::Generation;

    fn gen(max_tokens: Option<u32>) -> Generation {
        Generation {
            stream: false,
            include_usage: false,
            max_tokens,
            prompt_tokens: 5,
        }
    }

    #[test]
    fn request_limit_caps_tokens_and_sets_finish_reason() {
        let p = MockProfile {
            max_output_tokens: 10,
            ..MockProfile::default()
        };
        let plan = Plan::new(Surface::Chat, "m", &gen(Some(3)), &p, 0);
        let v = plan.completion();
        assert_eq!(v["choices"][0]["message"]["content"], "the quick mock");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["total_tokens"], 8);
        let plan = Plan::new(Surface::Completions, "m", &gen(Some(50)), &p, 0);
        let v = plan.completion();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["usage"]["completion_tokens"], 10);
    }

    #[test]
    fn chunks_are_single_sse_events() {
        let plan = Plan::new(Surface::Chat, "m", &gen(None), &MockProfile::default(), 0);
        let c = plan.frame(Step::Token(1), 2);
        let text = std::str::from_utf8(&c).unwrap();
        assert!(
            text.starts_with("data: {") && text.ends_with("}\n\n"),
            "{text}"
        );
        let v: Value = serde_json::from_str(&text[6..]).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        assert_eq!(v["choices"][0]["delta"]["content"], " quick");
    }

    #[test]
    fn streams_are_opening_events_tokens_and_closing_events() {
        let p = MockProfile::default();
        let layout = |surface, include_usage| {
            let g = Generation {
                include_usage,
                ..gen(Some(2))
            };
            let plan = Plan::new(surface, "m", &g, &p, 0);
            let steps: Vec<Step> = (0..).map_while(|i| plan.step(i)).collect();
            assert_eq!(steps.len() as u32, plan.events());
            steps
        };
        use Step::{Close, Open, Token};
        assert_eq!(
            layout(Surface::Chat, true),
            [Open(0), Token(0), Token(1), Close(0), Close(1), Close(2)]
        );
        assert_eq!(
            layout(Surface::Completions, false),
            [Token(0), Token(1), Close(0), Close(1)]
        );
        assert_eq!(layout(Surface::Responses, true).len(), 4 + 2 + 4);
        assert_eq!(layout(Surface::Messages, false).len(), 3 + 2 + 3);
    }

    #[test]
    fn breaks_count_every_chat_event_but_only_tokens_elsewhere() {
        let p = MockProfile::default();
        let plan = |surface| Plan::new(surface, "m", &gen(Some(5)), &p, 0);
        // Chat: role, 5 tokens, finish, [DONE].
        assert_eq!(plan(Surface::Chat).break_point(3), 3);
        assert_eq!(plan(Surface::Chat).break_point(100), 7);
        assert_eq!(plan(Surface::Responses).break_point(0), 4);
        assert_eq!(plan(Surface::Responses).break_point(3), 7);
        // Never past the event that ends the stream, which is withheld.
        assert_eq!(plan(Surface::Responses).break_point(u32::MAX), 12);
        assert_eq!(plan(Surface::Messages).break_point(2), 5);
        assert_eq!(plan(Surface::Messages).break_point(9), 10);
    }

    #[test]
    fn named_events_carry_their_type_line() {
        let e = sse_named("ping", &json!({"type": "ping"}));
        assert_eq!(&e[..], b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
        assert_eq!(&sse(&json!(1))[..], b"data: 1\n\n");
    }

    #[test]
    fn schedule_saturates_instead_of_overflowing() {
        let p = MockProfile {
            ttft: Duration::from_millis(10),
            tokens_per_sec: 100.0,
            ..MockProfile::default()
        };
        let pace = Pace::start(&p, 0);
        assert_eq!(pace.due(0) - pace.start, Duration::from_millis(10));
        assert_eq!(pace.due(3) - pace.start, Duration::from_millis(40));
        let prefilling = MockProfile {
            prefill_tokens_per_sec: 1000.0,
            ..p
        };
        let pace = Pace::start(&prefilling, 500);
        assert_eq!(pace.due(0) - pace.start, Duration::from_millis(510));
        let slow = MockProfile {
            ttft: Duration::MAX,
            tokens_per_sec: 1e-300,
            ..MockProfile::default()
        };
        let pace = Pace::start(&slow, 0);
        assert_eq!(pace.due(u32::MAX) - pace.start, LONGEST_WAIT);
        let slow_prefill = MockProfile {
            prefill_tokens_per_sec: 1e-300,
            ..MockProfile::default()
        };
        let pace = Pace::start(&slow_prefill, u32::MAX);
        assert_eq!(pace.due(0) - pace.start, LONGEST_WAIT);
    }
}
