//! What a request's affinity is keyed on: the start of its prompt, or its session.
//!
//! Engines keep the KV cache of prompts they have served (vLLM's automatic prefix caching,
//! SGLang's radix cache, llama.cpp's slot cache): a request whose prompt starts like a recent one
//! on the same engine skips most of its prefill, which is most of the time to first token for a
//! long system prompt. Spreading such requests evenly throws that away. So `prefix_affinity`
//! hashes the first `affinity_prefix_chars` characters of the prompt (the system prompt and the
//! first turns, which every later turn of a conversation repeats) and `session_affinity` a
//! caller-chosen session id; the balancer maps the key onto backends with bounded loads
//! (`spillway_policy::balance`), so affinity never piles a popular prefix onto one backend.
//!
//! The hash is `spillway_policy`'s `stable_hash`: it must be the same in every gateway instance
//! and release, which `std`'s hasher does not promise.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use spillway_config::{Balance, BalanceConfig};
use spillway_policy::balance::affinity::stable_hash;

use crate::lines::Lines;

/// The key a request's affinity hashes to, or `None` when it has none (no prompt, no session)
/// or the model does not use affinity: the balancer then uses least load.
pub(crate) fn key(balance: &BalanceConfig, headers: &Lines, body: &[u8]) -> Option<u64> {
    match balance.strategy {
        Balance::LeastLoad | Balance::RoundRobin => None,
        Balance::PrefixAffinity => {
            prompt_prefix(body, balance.prefix_chars).map(|p| stable_hash(&p))
        }
        Balance::SessionAffinity => {
            if let Some(id) = headers.get(&balance.session_header) {
                return (!id.is_empty()).then(|| stable_hash(id));
            }
            if !balance.session_from_user {
                return None;
            }
            let peek: UserPeek<'_> = serde_json::from_slice(body).ok()?;
            peek.user
                .filter(|u| !u.is_empty())
                .map(|u| stable_hash(u.as_bytes()))
        }
    }
}

#[derive(Deserialize)]
struct UserPeek<'a> {
    #[serde(borrow, default)]
    user: Option<std::borrow::Cow<'a, str>>,
}

/// The prompt fields, left unparsed: only the messages that the prefix reaches are read, so a
/// body of a thousand turns costs a scan, not a tree of a thousand turns.
#[derive(Deserialize)]
struct PromptPeek<'a> {
    #[serde(borrow, default)]
    messages: Option<Vec<&'a RawValue>>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    /// The Messages API's system prompt, ahead of its messages.
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    /// The Responses API's system prompt, ahead of its input.
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct MessagePeek<'a> {
    #[serde(borrow, default)]
    role: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// The first `limit` bytes (cut at a character boundary) of the prompt: a Messages `system` or a
/// Responses `instructions` first, then chat or Messages messages' roles and texts in order, or
/// a completion's prompt, or a Responses/embeddings input.
fn prompt_prefix(body: &[u8], limit: usize) -> Option<Vec<u8>> {
    let peek: PromptPeek<'_> = serde_json::from_slice(body).ok()?;
    let mut out = Prefix {
        bytes: Vec::with_capacity(limit.min(4096)),
        limit,
    };
    if let Some(system) = peek.system.or(peek.instructions) {
        out.push("system\n");
        out.push_raw(system);
        out.push("\n");
    }
    if let Some(messages) = &peek.messages {
        for raw in messages {
            if out.full() {
                break;
            }
            let Ok(m) = serde_json::from_str::<MessagePeek<'_>>(raw.get()) else {
                continue;
            };
            if let Some(role) = &m.role {
                out.push(role);
                out.push("\n");
            }
            if let Some(content) = m.content {
                out.push_raw(content);
            }
            out.push("\n");
        }
    } else if let Some(prompt) = peek.prompt.or(peek.input) {
        out.push_raw(prompt);
    }
    (!out.bytes.is_empty()).then_some(out.bytes)
}

struct Prefix {
    bytes: Vec<u8>,
    limit: usize,
}

impl Prefix {
    fn full(&self) -> bool {
        self.bytes.len() >= self.limit
    }

    fn push(&mut self, text: &str) {
        let room = self.limit.saturating_sub(self.bytes.len());
        let mut cut = text.len().min(room);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        self.bytes.extend_from_slice(&text.as_bytes()[..cut]);
    }

    /// A value still in its JSON text: a string is read borrowed, anything else as a tree (content
    /// parts, a list of prompts).
    fn push_raw(&mut self, raw: &RawValue) {
        if let Ok(text) = serde_json::from_str::<std::borrow::Cow<'_, str>>(raw.get()) {
            self.push(&text);
        } else if let Ok(value) = serde_json::from_str::<Value>(raw.get()) {
            self.push_text(&value);
        }
    }

    /// A string, or the `text` of content parts (`[{"type":"text","text":...}]`), or the
    /// first element of a list of prompts.
    fn push_text(&mut self, value: &Value) {
        match value {
            Value::String(s) => self.push(s),
            Value::Array(items) => {
                for item in items {
                    if self.full() {
                        return;
                    }
                    match item {
                        Value::String(s) => {
                            self.push(s);
                            // A list of prompts: each is its own request; the first keys it.
                            return;
                        }
                        Value::Object(part) => {
                            if let Some(text) = part.get("text").and_then(Value::as_str) {
                                self.push(text);
                            } else if let Some(content) = part.get("content") {
                                self.push_text(content);
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(strategy: Balance, prefix_chars: usize) -> BalanceConfig {
        BalanceConfig {
            strategy,
            prefix_chars,
            load_factor: 1.25,
            session_header: http::HeaderName::from_static("x-session-id"),
            session_from_user: true,
        }
    }

    fn chat(system: &str, user: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "model": "m",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        }))
        .unwrap()
    }

    #[test]
    fn requests_sharing_a_long_system_prompt_share_a_key() {
        let c = config(Balance::PrefixAffinity, 64);
        let system = "You are a careful assistant for the billing team. ".repeat(4);
        let h = Lines::default();
        let a = key(&c, &h, &chat(&system, "first question")).unwrap();
        let b = key(&c, &h, &chat(&system, "another question entirely")).unwrap();
        let other = key(
            &c,
            &h,
            &chat(&"You translate. ".repeat(8), "first question"),
        )
        .unwrap();
        assert_eq!(a, b);
        assert_ne!(a, other);
    }

    #[test]
    fn a_messages_or_responses_system_prompt_keys_like_a_chat_system_message() {
        let c = config(Balance::PrefixAffinity, 64);
        let h = Lines::default();
        let system = "You are a careful assistant for the billing team. ".repeat(4);
        let as_chat = key(&c, &h, &chat(&system, "q")).unwrap();
        let messages = serde_json::json!({
            "model": "m", "max_tokens": 5, "system": system,
            "messages": [{"role": "user", "content": "q"}],
        });
        let responses = serde_json::json!({"model": "m", "instructions": system, "input": "q"});
        for body in [messages, responses] {
            assert_eq!(
                key(&c, &h, &serde_json::to_vec(&body).unwrap()),
                Some(as_chat)
            );
        }
    }

    #[test]
    fn the_prefix_covers_later_turns_when_it_is_long_enough() {
        let c = config(Balance::PrefixAffinity, 4096);
        let h = Lines::default();
        assert_ne!(
            key(&c, &h, &chat("short system", "question one")),
            key(&c, &h, &chat("short system", "question two"))
        );
    }

    #[test]
    fn completions_prompts_and_content_parts_are_read() {
        let c = config(Balance::PrefixAffinity, 5);
        let h = Lines::default();
        let plain = key(&c, &h, br#"{"model":"m","prompt":"hello world"}"#);
        let listed = key(&c, &h, br#"{"model":"m","prompt":["hello there","x"]}"#);
        assert_eq!(plain, listed);
        let parts = br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"abc"}]}]}"#;
        assert!(key(&c, &h, parts).is_some());
        assert_eq!(key(&c, &h, br#"{"model":"m"}"#), None);
        assert_eq!(key(&c, &h, b"not json"), None);
    }

    #[test]
    fn a_multibyte_character_is_never_cut() {
        let c = config(Balance::PrefixAffinity, 2);
        assert!(key(
            &c,
            &Lines::default(),
            r#"{"model":"m","prompt":"éé"}"#.as_bytes()
        )
        .is_some());
    }

    #[test]
    fn session_affinity_keys_on_the_header_then_the_user_field() {
        let c = config(Balance::SessionAffinity, 64);
        let mut h = Lines::default();
        h.insert(
            http::HeaderName::from_static("x-session-id"),
            "s-1".parse().unwrap(),
        );
        let body = br#"{"model":"m","user":"u-9"}"#;
        assert_eq!(key(&c, &h, body), Some(stable_hash(b"s-1")));
        assert_eq!(key(&c, &Lines::default(), body), Some(stable_hash(b"u-9")));
        let no_user = BalanceConfig {
            session_from_user: false,
            ..c
        };
        assert_eq!(key(&no_user, &Lines::default(), body), None);
    }

    #[test]
    fn turns_past_the_prefix_do_not_change_the_key_however_many() {
        let c = config(Balance::PrefixAffinity, 256);
        let system = "You review pull requests for the payments service. ".repeat(8);
        let turns: Vec<_> = (0..20_000)
            .map(|i| serde_json::json!({"role": "user", "content": format!("turn {i}")}))
            .collect();
        let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
        messages.extend(turns);
        let long =
            serde_json::to_vec(&serde_json::json!({"model": "m", "messages": messages})).unwrap();
        let short = chat(&system, "turn 0");
        let h = Lines::default();
        assert_eq!(key(&c, &h, &long), key(&c, &h, &short));
    }

    #[test]
    fn least_load_has_no_key() {
        let c = config(Balance::LeastLoad, 64);
        assert_eq!(key(&c, &Lines::default(), &chat("s", "u")), None);
    }
}
