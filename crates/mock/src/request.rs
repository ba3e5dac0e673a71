//! Reading the fields of an inference request the mock acts on.
//!
//! The body is kept as a `serde_json::Value` (it is also what `/stats` shows as the last request),
//! and only the few fields that change the answer are read from it. Fields the mock does not know
//! are ignored, as a real server ignores vendor extensions; fields it knows but cannot use are
//! refused with the error a real server gives. Chat and text completions are read here; the
//! Responses and Messages APIs read their own prompt fields (`responses.rs`, `messages.rs`) and
//! share the rest: one token estimate for every prompt, one reading of `stream` and of limits.

use serde_json::{Map, Value};

use crate::error::{ApiError, Dialect};
pub(crate) use crate::prompt::{for_each_content_text, is_object_list, Generation, Surface};
use crate::{messages, responses};

/// The inference endpoints. Chat, completions and embeddings are reachable under `/v1` and
/// under Azure deployment paths; the Responses (create and compact) and Anthropic endpoints
/// under `/v1` only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// Text generation, answered in one API's shapes.
    Generate(Surface),
    Embeddings,
    /// Anthropic's `/v1/messages/count_tokens`: the prompt's size, nothing generated.
    CountTokens,
    /// The Responses API's `/v1/responses/compact`: a conversation compacted into one item.
    Compact,
}

impl Endpoint {
    /// The API whose conventions this endpoint's answers, errors included, follow.
    pub(crate) fn dialect(self) -> Dialect {
        match self {
            Endpoint::Generate(Surface::Messages) | Endpoint::CountTokens => Dialect::Anthropic,
            Endpoint::Generate(_) | Endpoint::Embeddings | Endpoint::Compact => Dialect::OpenAi,
        }
    }
}

/// Reads a generation request in `surface`'s shape.
pub(crate) fn generation(
    surface: Surface,
    body: &Map<String, Value>,
) -> Result<Generation, ApiError> {
    let prompt_tokens = prompt_tokens(surface, body)?;
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
    let include_usage = match (surface, body.get("stream_options")) {
        (Surface::Responses | Surface::Messages, _) | (_, None | Some(Value::Null)) => false,
        (_, Some(Value::Object(o))) => o
            .get("include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        (_, Some(_)) => {
            return Err(ApiError::invalid_param(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };
    let max_tokens = match surface {
        Surface::Chat | Surface::Completions => match token_limit(body, "max_completion_tokens")? {
            Some(n) => Some(n),
            None => token_limit(body, "max_tokens")?,
        },
        Surface::Responses => token_limit(body, "max_output_tokens")?,
        Surface::Messages => Some(
            token_limit(body, "max_tokens")?
                .ok_or_else(|| ApiError::invalid_param("max_tokens", "`max_tokens` is required"))?,
        ),
    };
    Ok(Generation {
        stream,
        include_usage,
        max_tokens,
        prompt_tokens,
    })
}

/// The prompt's tokens by the mock's estimate, once its prompt fields are checked: what usage
/// reports, what prefill takes, and what Anthropic's `count_tokens` answers.
pub(crate) fn prompt_tokens(surface: Surface, body: &Map<String, Value>) -> Result<u32, ApiError> {
    match surface {
        Surface::Chat => check_chat(body)?,
        Surface::Completions => return text_prompt_tokens(body.get("prompt"), "prompt"),
        Surface::Responses => responses::check_prompt(body)?,
        Surface::Messages => messages::check_prompt(body)?,
    }
    let mut chars = 0usize;
    for_each_prompt_text(surface, body, |s| {
        chars = chars.saturating_add(s.chars().count());
    });
    Ok(tokens_for_chars(chars))
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
/// contents (strings and text parts), a completion's string prompt or prompts, or what the
/// Responses and Messages APIs read (instructions or system prompt first). Prompts given as
/// token ids have no text. These are the characters [`tokens_for_chars`] counts.
pub(crate) fn for_each_prompt_text<'a>(
    surface: Surface,
    body: &'a Map<String, Value>,
    mut f: impl FnMut(&'a str),
) {
    match surface {
        Surface::Chat => {
            let messages = body.get("messages").and_then(Value::as_array);
            for content in messages
                .into_iter()
                .flatten()
                .filter_map(|m| m.get("content"))
            {
                for_each_content_text(content, &mut f);
            }
        }
        Surface::Completions => match body.get("prompt") {
            Some(Value::String(s)) => f(s),
            Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).for_each(f),
            _ => {}
        },
        Surface::Responses => responses::for_each_prompt_text(body, f),
        Surface::Messages => messages::for_each_prompt_text(body, f),
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

fn check_chat(body: &Map<String, Value>) -> Result<(), ApiError> {
    if is_object_list(body, "messages") {
        return Ok(());
    }
    Err(ApiError::invalid_param(
        "messages",
        "`messages` must be a non-empty array of message objects",
    ))
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

    fn parse(surface: Surface, v: Value) -> Result<Generation, ApiError> {
        generation(surface, v.as_object().unwrap())
    }

    #[test]
    fn chat_reads_limits_stream_and_usage_options() {
        let g = parse(
            Surface::Chat,
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
            Surface::Chat,
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
            assert!(parse(Surface::Chat, body.clone()).is_err(), "{body}");
        }
        assert!(parse(Surface::Completions, json!({})).is_err());
        assert!(parse(Surface::Completions, json!({"prompt": [{"a": 1}]})).is_err());
    }

    #[test]
    fn prompt_text_is_what_the_token_estimate_counts() {
        let texts = |surface, v: Value| {
            let mut out = Vec::new();
            for_each_prompt_text(surface, v.as_object().unwrap(), |s| out.push(s.to_owned()));
            out
        };
        let chat = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
            {"role": "assistant", "tool_calls": []},
        ]});
        assert_eq!(texts(Surface::Chat, chat), ["be brief", "hi"]);
        assert_eq!(
            texts(Surface::Completions, json!({"prompt": ["a", "b"]})),
            ["a", "b"]
        );
        assert!(texts(Surface::Completions, json!({"prompt": [1, 2]})).is_empty());
    }

    #[test]
    fn completion_prompts_in_every_shape() {
        let tokens = |p: Value| {
            parse(Surface::Completions, json!({"prompt": p}))
                .unwrap()
                .prompt_tokens
        };
        assert_eq!(tokens(json!("")), 1);
        assert_eq!(tokens(json!(["abcdefgh", "abcd"])), 3);
        assert_eq!(tokens(json!([1, 2, 3])), 3);
        assert_eq!(tokens(json!([[1, 2], [3, 4, 5]])), 5);
    }
}
