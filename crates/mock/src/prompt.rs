//! What every surface's request is read into ([`Generation`], in its [`Surface`]), and the
//! pieces of a prompt all of them share: a message's content text and a list of messages.

use serde_json::{Map, Value};

/// The APIs a generated reply can be asked for in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Surface {
    /// OpenAI chat completions (`messages`).
    Chat,
    /// OpenAI text completions (`prompt`).
    Completions,
    /// The OpenAI Responses API (`input`, `instructions`).
    Responses,
    /// The Anthropic Messages API (`messages`, `system`).
    Messages,
}

/// What a generation request asks of the generator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Generation {
    pub(crate) stream: bool,
    /// `stream_options.include_usage` (chat and completions): send a usage chunk before `[DONE]`.
    pub(crate) include_usage: bool,
    /// The request's own output limit: `max_completion_tokens` or `max_tokens` for chat and
    /// completions (the former wins), `max_output_tokens` for Responses, `max_tokens` (required)
    /// for Messages.
    pub(crate) max_tokens: Option<u32>,
    pub(crate) prompt_tokens: u32,
}

/// The text of one message's content: a string, or the `text` of each part of an array (chat's
/// `text` parts, the Responses API's `input_text`, Anthropic's `text` blocks). Other parts, and
/// content of any other type, have none.
pub(crate) fn for_each_content_text<'a>(content: &'a Value, f: &mut impl FnMut(&'a str)) {
    match content {
        Value::String(s) => f(s),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .for_each(f),
        _ => {}
    }
}

/// Whether `field` is a non-empty array of objects, as every API's message list must be.
pub(crate) fn is_object_list(body: &Map<String, Value>, field: &str) -> bool {
    let list = body.get(field).and_then(Value::as_array);
    list.is_some_and(|m| !m.is_empty() && m.iter().all(Value::is_object))
}
