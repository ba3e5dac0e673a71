//! The reply one generation request gets, fixed before its first token ([`Plan`]), the layout of
//! a stream ([`Step`]), the generated text and the server-sent event framing: what every
//! surface's shapes (`generate.rs` for chat and completions, `responses.rs`, `messages.rs`) are
//! built from.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::Value;
use spillway_config::MockProfile;

use crate::prompt::{Generation, Surface};

/// Words the mock "generates", one per token, each with the leading space BPE tokens carry.
const WORDS: [&str; 16] = [
    " the", " quick", " mock", " model", " writes", " short", " plain", " words", " for", " every",
    " token", " it", " is", " asked", " to", " emit",
];

/// The reply one request gets, fixed before the first token.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) surface: Surface,
    pub(crate) id: String,
    /// The Responses API's output message id (empty on the other surfaces).
    pub(crate) item_id: String,
    /// Unix seconds.
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) tokens: u32,
    /// Generation stops at the request's own limit, not where the model would stop anyway.
    pub(crate) at_limit: bool,
    pub(crate) prompt_tokens: u32,
    /// The prompt tokens found in the prefix cache (at most `prompt_tokens`).
    pub(crate) cached_tokens: u32,
    /// Chat and completions streams: a usage chunk before `[DONE]`.
    pub(crate) include_usage: bool,
    /// The Responses API: the stored response this one continues.
    pub(crate) previous_response_id: Option<String>,
    /// The Responses API: whether the response is stored.
    pub(crate) store: bool,
}

/// One event of a stream, by its place in the stream's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The `i`th event before the first token: chat's role chunk, the Responses and Messages
    /// streams' opening events. All are due with the first token.
    Open(u32),
    /// The event carrying token `i`.
    Token(u32),
    /// The `i`th event after the last token; the first is due with the last token, and the last
    /// ends the stream (`[DONE]`, `response.completed`, `message_stop`).
    Close(u32),
}

impl Plan {
    /// The request's limit caps the profile's; the reply stops at the request's own limit
    /// ("length", "max_tokens", "incomplete") or where the server would anyway.
    /// `cached_tokens` is the prompt's start the prefix cache held.
    pub(crate) fn new(
        surface: Surface,
        model: &str,
        g: &Generation,
        profile: &MockProfile,
        cached_tokens: u32,
    ) -> Self {
        let (tokens, at_limit) = output_length(g, profile);
        let hex = || format!("{:032x}", rand::random::<u128>());
        let (id, item_id) = match surface {
            Surface::Chat => (format!("chatcmpl-{}", &hex()[8..]), String::new()),
            Surface::Completions => (format!("cmpl-{}", &hex()[8..]), String::new()),
            Surface::Responses => (format!("resp_{}", hex()), format!("msg_{}", hex())),
            Surface::Messages => (format!("msg_{}", &hex()[8..]), String::new()),
        };
        Self {
            surface,
            id,
            item_id,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: model.to_owned(),
            tokens,
            at_limit,
            prompt_tokens: g.prompt_tokens,
            cached_tokens: cached_tokens.min(g.prompt_tokens),
            include_usage: g.include_usage,
            previous_response_id: None,
            store: true,
        }
    }

    pub(crate) fn text(&self) -> String {
        (0..self.tokens).map(token_text).collect()
    }
}

/// How many tokens a request gets, and whether that is the request's own limit.
pub(crate) fn output_length(g: &Generation, profile: &MockProfile) -> (u32, bool) {
    match g.max_tokens {
        Some(limit) if limit <= profile.max_output_tokens => (limit, true),
        _ => (profile.max_output_tokens, false),
    }
}

/// Token `i` as text; the first drops its leading space so the reply does not start with one.
pub(crate) fn token_text(i: u32) -> &'static str {
    let word = WORDS[i as usize % WORDS.len()];
    if i == 0 {
        word.trim_start()
    } else {
        word
    }
}

/// One server-sent event: `data: JSON` and a blank line.
pub(crate) fn sse(v: &Value) -> Bytes {
    sse_event(None, v)
}

/// One server-sent event, named as the Responses and Messages streams name theirs: `event:
/// NAME`, `data: JSON` and a blank line.
pub(crate) fn sse_named(name: &str, v: &Value) -> Bytes {
    sse_event(Some(name), v)
}

fn sse_event(name: Option<&str>, v: &Value) -> Bytes {
    let mut out = Vec::new();
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    // Writing a `Value` into a Vec cannot fail: every key is a string and there is no I/O.
    if serde_json::to_writer(&mut out, v).is_err() {
        out.extend_from_slice(b"{}");
    }
    out.extend_from_slice(b"\n\n");
    out.into()
}
