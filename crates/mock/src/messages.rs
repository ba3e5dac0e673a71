//! The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`): what the
//! mock reads from a request and the shapes it answers in.
//!
//! A request names its prompt as `messages` (each `user` or `assistant`, its `content` a string
//! or content blocks) with an optional `system` prompt (a string or text blocks), and must set
//! `max_tokens`, as the API requires. The answer is a `message` with one text block; its usage
//! splits the prompt into `input_tokens` (prefilled) and `cache_read_input_tokens` (found in the
//! prefix cache). A stream is the API's events, each `event: TYPE` with a JSON `data` carrying
//! the same `type`: `message_start`, `content_block_start`, `ping`, one `content_block_delta` per
//! token, `content_block_stop`, `message_delta` (the stop reason and output tokens) and
//! `message_stop`. `count_tokens` answers the mock's own estimate of the prompt, the same one
//! the other endpoints' usage reports. Errors and the `request-id` header follow the Anthropic
//! [`Dialect`](crate::error::Dialect).

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::plan::{sse_named, token_text, Plan, Step};
use crate::prompt::{for_each_content_text, is_object_list};

/// Events before the first token: `message_start`, `content_block_start`, `ping`.
pub(crate) const OPENING: u32 = 3;
/// Events after the last token: `content_block_stop`, `message_delta`, `message_stop`.
pub(crate) const CLOSING: u32 = 3;

/// Checks the fields the prompt is read from: `messages` and `system`.
pub(crate) fn check_prompt(body: &Map<String, Value>) -> Result<(), ApiError> {
    if !is_object_list(body, "messages") {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must be a non-empty array of message objects",
        ));
    }
    let messages = body.get("messages").and_then(Value::as_array);
    for (i, m) in messages.into_iter().flatten().enumerate() {
        let role = m.get("role").and_then(Value::as_str);
        if !matches!(role, Some("user" | "assistant")) {
            return Err(ApiError::invalid_param(
                "messages",
                format!(
                    "messages.{i}.role: must be \"user\" or \"assistant\" \
                     (a system prompt goes in the top-level `system` field)"
                ),
            ));
        }
    }
    match body.get("system") {
        None | Some(Value::Null | Value::String(_) | Value::Array(_)) => Ok(()),
        Some(_) => Err(ApiError::invalid_param(
            "system",
            "`system` must be a string or an array of text blocks",
        )),
    }
}

/// The prompt's text: the system prompt, then each message's content.
pub(crate) fn for_each_prompt_text<'a>(body: &'a Map<String, Value>, mut f: impl FnMut(&'a str)) {
    if let Some(system) = body.get("system") {
        for_each_content_text(system, &mut f);
    }
    let messages = body.get("messages").and_then(Value::as_array);
    for content in messages
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("content"))
    {
        for_each_content_text(content, &mut f);
    }
}

/// The answer of `count_tokens`.
pub(crate) fn token_count(input_tokens: u32) -> Value {
    json!({"input_tokens": input_tokens})
}

/// The whole message.
pub(crate) fn message(plan: &Plan) -> Value {
    let mut usage = usage(plan);
    usage["output_tokens"] = plan.tokens.into();
    json!({
        "id": plan.id, "type": "message", "role": "assistant", "model": plan.model,
        "content": [{"type": "text", "text": plan.text()}],
        "stop_reason": stop_reason(plan), "stop_sequence": null, "usage": usage,
    })
}

/// The event at `step`.
pub(crate) fn frame(plan: &Plan, step: Step) -> Bytes {
    let (name, v) = match step {
        Step::Open(0) => {
            let mut usage = usage(plan);
            // What the API reports before generating: one output token.
            usage["output_tokens"] = 1.into();
            let message = json!({
                "id": plan.id, "type": "message", "role": "assistant", "model": plan.model,
                "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage,
            });
            (
                "message_start",
                json!({"type": "message_start", "message": message}),
            )
        }
        Step::Open(1) => (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}}),
        ),
        Step::Open(_) => ("ping", json!({"type": "ping"})),
        Step::Token(i) => (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": token_text(i)}}),
        ),
        Step::Close(0) => (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        Step::Close(1) => (
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": stop_reason(plan), "stop_sequence": null},
                   "usage": {"output_tokens": plan.tokens}}),
        ),
        Step::Close(_) => ("message_stop", json!({"type": "message_stop"})),
    };
    sse_named(name, &v)
}

fn stop_reason(plan: &Plan) -> &'static str {
    if plan.at_limit {
        "max_tokens"
    } else {
        "end_turn"
    }
}

/// The prompt's tokens as the API splits them; `output_tokens` is the caller's to set.
fn usage(plan: &Plan) -> Value {
    json!({
        "input_tokens": plan.prompt_tokens.saturating_sub(plan.cached_tokens),
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": plan.cached_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{generation, prompt_tokens, Surface};
    use spillway_config::MockProfile;

    fn fields(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_prompt_is_the_system_prompt_then_every_message() {
        let body = fields(json!({
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": [{"type": "text", "text": "two"},
                                                  {"type": "tool_use", "id": "t", "input": {}}]},
            ],
        }));
        let mut out = Vec::new();
        for_each_prompt_text(&body, |s| out.push(s));
        assert_eq!(out, ["be brief", "one", "two"]);
        let body = fields(json!({"system": "s".repeat(8),
                                 "messages": [{"role": "user", "content": "u".repeat(12)}]}));
        assert_eq!(prompt_tokens(Surface::Messages, &body).unwrap(), 5);
    }

    #[test]
    fn max_tokens_is_required_and_prompts_are_checked() {
        let ok = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        let g = generation(Surface::Messages, &fields(ok.clone())).unwrap();
        assert_eq!(g.max_tokens, Some(4));
        let mut missing = ok.clone();
        missing.as_object_mut().unwrap().remove("max_tokens");
        for body in [
            missing,
            json!({"messages": [], "max_tokens": 4}),
            json!({"messages": [{"role": "system", "content": "x"}], "max_tokens": 4}),
            json!({"messages": [{"content": "x"}], "max_tokens": 4}),
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "system": 1}),
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -4}),
        ] {
            assert!(
                generation(Surface::Messages, &fields(body.clone())).is_err(),
                "{body}"
            );
        }
    }

    #[test]
    fn usage_splits_the_prompt_into_prefilled_and_cached() {
        let body = fields(
            json!({"messages": [{"role": "user", "content": "x".repeat(40)}],
                                 "max_tokens": 3}),
        );
        let g = generation(Surface::Messages, &body).unwrap();
        let plan = Plan::new(Surface::Messages, "m", &g, &MockProfile::default(), 6);
        let v = message(&plan);
        assert_eq!(v["stop_reason"], "max_tokens");
        assert_eq!(v["content"][0]["text"], "the quick mock");
        assert_eq!(
            v["usage"],
            json!({"input_tokens": 4, "output_tokens": 3, "cache_creation_input_tokens": 0,
                   "cache_read_input_tokens": 6})
        );
        let start = frame(&plan, Step::Open(0));
        let text = std::str::from_utf8(&start).unwrap();
        let data: Value = serde_json::from_str(
            text.strip_prefix("event: message_start\ndata: ")
                .unwrap()
                .trim_end(),
        )
        .unwrap();
        assert_eq!(data["message"]["usage"]["output_tokens"], 1);
        assert_eq!(data["message"]["usage"]["input_tokens"], 4);
    }
}
