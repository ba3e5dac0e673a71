//! Reading the fields of an inference request the mock acts on.
//!
//! The body is kept as a `serde_json::Value` (it is also what `/stats` shows as the last request),
//! and only the few fields that change the answer are read from it. Fields the mock does not know
//! are ignored, as a real server ignores vendor extensions; fields it knows but cannot use are
//! refused with the OpenAI error a real server gives.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// The three inference endpoints, reachable under `/v1` and under Azure deployment paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Chat,
    Completions,
    Embeddings,
}

/// What a chat or text completion request asks of the generator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Generation {
    pub(crate) stream: bool,
    /// `stream_options.include_usage`: send a usage chunk before `[DONE]`.
    pub(crate) include_usage: bool,
    /// `max_completion_tokens` or `max_tokens`, whichever the request set (the former wins).
    pub(crate) max_tokens: Option<u32>,
    pub(crate) prompt_tokens: u32,
}

/// Reads a chat (`messages`) or text completion (`prompt`) request.
pub(crate) fn generation(
    endpoint: Endpoint,
    body: &Map<String, Value>,
) -> Result<Generation, ApiError> {
    let prompt_tokens = match endpoint {
        Endpoint::Chat => chat_prompt_tokens(body)?,
        Endpoint::Completions | Endpoint::Embeddings => {
            text_prompt_tokens(body.get("prompt"), "prompt")?
        }
    };
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "stream",
                "`stream` must be a boolean",
            ))
        }
    };
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => o
            .get("include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };
    let max_tokens = match token_limit(body, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => token_limit(body, "max_tokens")?,
    };
    Ok(Generation {
        stream,
        include_usage,
        max_tokens,
        prompt_tokens,
    })
}

/// Characters per token, as tokenizers roughly count English.
pub(crate) const CHARS_PER_TOKEN: usize = 4;

/// Prompt tokens of `chars` characters of text, at least one.
pub(crate) fn tokens_for_chars(chars: usize) -> u32 {
    u32::try_from(chars / CHARS_PER_TOKEN)
        .unwrap_or(u32::MAX)
        .max(1)
}

/// Calls `f` with each piece of a checked request's prompt text, in order: the chat messages'
/// contents (strings and text parts), or a completion's string prompt or prompts. Prompts given
/// as token ids have no text. These are the characters [`tokens_for_chars`] counts.
pub(crate) fn for_each_prompt_text<'a>(
    endpoint: Endpoint,
    body: &'a Map<String, Value>,
    mut f: impl FnMut(&'a str),
) {
    match endpoint {
        Endpoint::Chat => {
            let messages = body.get("messages").and_then(Value::as_array);
            for content in messages
                .into_iter()
                .flatten()
                .filter_map(|m| m.get("content"))
            {
                match content {
                    Value::String(s) => f(s),
                    Value::Array(parts) => parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .for_each(&mut f),
                    _ => {}
                }
            }
        }
        Endpoint::Completions => match body.get("prompt") {
            Some(Value::String(s)) => f(s),
            Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).for_each(f),
            _ => {}
        },
        Endpoint::Embeddings => {}
    }
}

/// Tokens of a completion `prompt` or an embeddings `input`: a string, strings, token ids, or
/// arrays of token ids.
pub(crate) fn text_prompt_tokens(v: Option<&Value>, param: &'static str) -> Result<u32, ApiError> {
    let missing = || ApiError::invalid_param(param, format!("`{param}` is required"));
    let shape = || {
        ApiError::invalid_param(
            param,
            format!("`{param}` must be a string, an array of strings, or token arrays"),
        )
    };
    match v.ok_or_else(missing)? {
        Value::String(s) => Ok(tokens_for_chars(s.chars().count())),
        Value::Array(items) => items.iter().try_fold(0u32, |sum, item| {
            let n = match item {
                Value::String(s) => tokens_for_chars(s.chars().count()),
                Value::Number(_) => 1,
                Value::Array(ids) if ids.iter().all(Value::is_u64) => len_u32(ids.len()),
                _ => return Err(shape()),
            };
            Ok(sum.saturating_add(n))
        }),
        Value::Null => Err(missing()),
        _ => Err(shape()),
    }
}

fn chat_prompt_tokens(body: &Map<String, Value>) -> Result<u32, ApiError> {
    match body.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() && m.iter().all(Value::is_object) => {}
        _ => {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` must be a non-empty array of message objects",
            ))
        }
    }
    let mut chars = 0usize;
    for_each_prompt_text(Endpoint::Chat, body, |s| {
        chars = chars.saturating_add(s.chars().count());
    });
    Ok(tokens_for_chars(chars))
}

fn token_limit(body: &Map<String, Value>, field: &'static str) -> Result<Option<u32>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(u32::try_from(n).unwrap_or(u32::MAX)))
            .ok_or_else(|| {
                ApiError::invalid_param(field, format!("`{field}` must be a non-negative integer"))
            }),
    }
}

fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(endpoint: Endpoint, v: Value) -> Result<Generation, ApiError> {
        generation(endpoint, v.as_object().unwrap())
    }

    #[test]
    fn chat_reads_limits_stream_and_usage_options() {
        let g = parse(
            Endpoint::Chat,
            json!({"messages": [{"role": "user", "content": "12345678"}], "stream": true,
                   "stream_options": {"include_usage": true}, "max_tokens": 9, "max_completion_tokens": 3}),
        )
        .unwrap();
        assert_eq!(
            g,
            Generation {
                stream: true,
                include_usage: true,
                max_tokens: Some(3),
                prompt_tokens: 2
            }
        );
    }

    #[test]
    fn content_parts_count_towards_the_prompt() {
        let g = parse(
            Endpoint::Chat,
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x".repeat(40)}]},
                                {"role": "assistant", "tool_calls": []}]}),
        )
        .unwrap();
        assert_eq!(g.prompt_tokens, 10);
        assert_eq!(g.max_tokens, None);
    }

    #[test]
    fn malformed_fields_are_refused() {
        for body in [
            json!({"messages": []}),
            json!({"messages": "hi"}),
            json!({"messages": [1]}),
            json!({"messages": [{"content": "x"}], "stream": 1}),
            json!({"messages": [{"content": "x"}], "max_tokens": -1}),
            json!({"messages": [{"content": "x"}], "stream_options": true}),
        ] {
            assert!(parse(Endpoint::Chat, body.clone()).is_err(), "{body}");
        }
        assert!(parse(Endpoint::Completions, json!({})).is_err());
        assert!(parse(Endpoint::Completions, json!({"prompt": [{"a": 1}]})).is_err());
    }

    #[test]
    fn prompt_text_is_what_the_token_estimate_counts() {
        let texts = |endpoint, v: Value| {
            let mut out = Vec::new();
            for_each_prompt_text(endpoint, v.as_object().unwrap(), |s| out.push(s.to_owned()));
            out
        };
        let chat = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
            {"role": "assistant", "tool_calls": []},
        ]});
        assert_eq!(texts(Endpoint::Chat, chat), ["be brief", "hi"]);
        assert_eq!(
            texts(Endpoint::Completions, json!({"prompt": ["a", "b"]})),
            ["a", "b"]
        );
        assert!(texts(Endpoint::Completions, json!({"prompt": [1, 2]})).is_empty());
    }

    #[test]
    fn completion_prompts_in_every_shape() {
        let tokens = |p: Value| {
            parse(Endpoint::Completions, json!({"prompt": p}))
                .unwrap()
                .prompt_tokens
        };
        assert_eq!(tokens(json!("")), 1);
        assert_eq!(tokens(json!(["abcdefgh", "abcd"])), 3);
        assert_eq!(tokens(json!([1, 2, 3])), 3);
        assert_eq!(tokens(json!([[1, 2], [3, 4, 5]])), 5);
    }
}
