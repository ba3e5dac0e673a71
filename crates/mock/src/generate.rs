//! Simulated generation: how many tokens, when each is due, and the OpenAI response shapes.
//!
//! The shapes follow what the official `openai` SDKs parse: `chat.completion` and
//! `text_completion` objects with `usage`, and for streams `chat.completion.chunk` /
//! `text_completion` chunks framed as server-sent events. Timing is a schedule (first token
//! after `ttft` plus the prefill of the prompt tokens the prefix cache did not hold, then one per
//! `1 / tokens_per_sec`) measured from one start instant, so slow polling never makes a stream
//! drift later than the profile says.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{json, Value};
use spillway_config::MockProfile;
use tokio::time::Instant;

use crate::request::{Endpoint, Generation};

/// The longest single wait the schedule computes; beyond it a profile is effectively "never".
const LONGEST_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// Words the mock "generates", one per token, each with the leading space BPE tokens carry.
const WORDS: [&str; 16] = [
    " the", " quick", " mock", " model", " writes", " short", " plain", " words", " for", " every",
    " token", " it", " is", " asked", " to", " emit",
];

/// The reply one request gets, fixed before the first token.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    chat: bool,
    id: String,
    created: u64,
    model: String,
    pub(crate) tokens: u32,
    finish_reason: &'static str,
    prompt_tokens: u32,
}

impl Plan {
    /// The request's limit caps the profile's; stopping at the request's own limit is
    /// `"length"`, stopping where the server would anyway is `"stop"`.
    pub(crate) fn new(
        endpoint: Endpoint,
        model: &str,
        g: &Generation,
        profile: &MockProfile,
    ) -> Self {
        let (tokens, finish_reason) = output_length(g, profile);
        let chat = endpoint == Endpoint::Chat;
        let prefix = if chat { "chatcmpl" } else { "cmpl" };
        Self {
            chat,
            id: format!("{prefix}-{:024x}", rand::random::<u128>() >> 32),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: model.to_owned(),
            tokens,
            finish_reason,
            prompt_tokens: g.prompt_tokens,
        }
    }

    /// The whole non-streaming response.
    pub(crate) fn completion(&self) -> Value {
        let text = (0..self.tokens).map(token_text).collect::<String>();
        let choice = if self.chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text, "refusal": null},
                   "logprobs": null, "finish_reason": self.finish_reason})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": self.finish_reason})
        };
        json!({
            "id": self.id, "object": self.object(false), "created": self.created, "model": self.model,
            "system_fingerprint": "fp_spillway_mock", "choices": [choice], "usage": self.usage(),
        })
    }

    /// Whether streams begin with a chunk carrying only the assistant role (chat does).
    pub(crate) fn has_role_chunk(&self) -> bool {
        self.chat
    }

    pub(crate) fn role_chunk(&self) -> Bytes {
        self.chunk(json!({"role": "assistant", "content": ""}), "", None)
    }

    pub(crate) fn token_chunk(&self, i: u32) -> Bytes {
        let text = token_text(i);
        self.chunk(json!({"content": text}), text, None)
    }

    pub(crate) fn finish_chunk(&self) -> Bytes {
        self.chunk(json!({}), "", Some(self.finish_reason))
    }

    /// The chunk `stream_options.include_usage` asks for: no choices, only usage.
    pub(crate) fn usage_chunk(&self) -> Bytes {
        sse(&json!({
            "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "system_fingerprint": "fp_spillway_mock", "choices": [], "usage": self.usage(),
        }))
    }

    fn chunk(&self, delta: Value, text: &str, finish: Option<&str>) -> Bytes {
        let choice = if self.chat {
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
        match (self.chat, chunk) {
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

/// How many tokens a request gets and why it stops there.
pub(crate) fn output_length(g: &Generation, profile: &MockProfile) -> (u32, &'static str) {
    match g.max_tokens {
        Some(limit) if limit <= profile.max_output_tokens => (limit, "length"),
        _ => (profile.max_output_tokens, "stop"),
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

/// Token `i` as text; the first drops its leading space so the reply does not start with one.
fn token_text(i: u32) -> &'static str {
    let word = WORDS[i as usize % WORDS.len()];
    if i == 0 {
        word.trim_start()
    } else {
        word
    }
}

/// One server-sent event: `data: JSON` and a blank line.
pub(crate) fn sse(v: &Value) -> Bytes {
    let mut out = b"data: ".to_vec();
    // Writing a `Value` into a Vec cannot fail: every key is a string and there is no I/O.
    if serde_json::to_writer(&mut out, v).is_err() {
        out.extend_from_slice(b"{}");
    }
    out.extend_from_slice(b"\n\n");
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let plan = Plan::new(Endpoint::Chat, "m", &gen(Some(3)), &p);
        let v = plan.completion();
        assert_eq!(v["choices"][0]["message"]["content"], "the quick mock");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["total_tokens"], 8);
        let plan = Plan::new(Endpoint::Completions, "m", &gen(Some(50)), &p);
        let v = plan.completion();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["usage"]["completion_tokens"], 10);
    }

    #[test]
    fn chunks_are_single_sse_events() {
        let plan = Plan::new(Endpoint::Chat, "m", &gen(None), &MockProfile::default());
        let c = plan.token_chunk(1);
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
