//! The OpenAI Responses API (`POST /v1/responses`): what the mock reads from a request and the
//! shapes it answers in.
//!
//! A request names its prompt as `input` (a string, or input items whose `content` is a string
//! or `input_text` parts) with optional `instructions`, and its limit as `max_output_tokens`.
//! The answer is a `response` object with one assistant message; its usage reports the prompt
//! tokens the prefix cache held as `input_tokens_details.cached_tokens`. A stream is the API's
//! semantic events, each `event: TYPE` with a JSON `data` carrying the same `type` and a
//! `sequence_number` that counts the events from 0: four opening events, one
//! `response.output_text.delta` per token, and four closing events ending with
//! `response.completed`, which carries the whole response (its status `incomplete` when the
//! reply stopped at `max_output_tokens`). There is no `[DONE]` line.
//!
//! A create is stored unless it sets `store: false` (the API's default is to store): a plain
//! response when it is answered, a stream when its last event is sent (one broken off or left
//! by its client is not). What is stored is the response object and the create's `input` as a
//! list of items ([`input_items`]), kept in the server's
//! [`ResponseStore`](crate::store::ResponseStore). A create that names a stored response as
//! `previous_response_id` continues its conversation: that response's prompt and output count
//! into the new prompt's tokens, its model serves when `model` is omitted, and the new response
//! carries the id. `background` is accepted and ignored: every response is generated while the
//! request waits.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::plan::{sse_named, token_text, Plan, Step};
use crate::prompt::{for_each_content_text, is_object_list};
use crate::store::{Earlier, ResponseStore, Stored};

/// Memory a stored response is reckoned to hold besides its request body and output text.
const STORED_OVERHEAD_BYTES: usize = 1024;

/// What a create asks of the stored state, read with its other fields.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Create {
    /// `store`: keep the response once answered.
    pub(crate) store: bool,
    /// The stored response this one continues, checked to exist.
    pub(crate) previous_response_id: Option<String>,
    /// The input as stored items; empty when the response is not to be stored.
    pub(crate) input_items: Vec<Value>,
    /// The size of the request body, the stored entry's main cost.
    pub(crate) body_bytes: usize,
}

impl Create {
    /// Reads `store` and the input items of a create whose body was `body_bytes` long and whose
    /// `previous_response_id`, if any, names `earlier`.
    pub(crate) fn read(
        body: &Map<String, Value>,
        earlier: Option<&Earlier>,
        body_bytes: usize,
    ) -> Result<Self, ApiError> {
        let store = match body.get("store") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "store",
                    "`store` must be a boolean",
                ))
            }
        };
        Ok(Self {
            store,
            previous_response_id: earlier.map(|e| e.id.clone()),
            input_items: if store { input_items(body) } else { Vec::new() },
            body_bytes,
        })
    }

    /// What storing this create's response takes, if it is to be stored.
    pub(crate) fn keep(self, store: &Arc<ResponseStore>) -> Option<Keep> {
        self.store.then(|| Keep {
            store: Arc::clone(store),
            input_items: self.input_items,
            body_bytes: self.body_bytes,
        })
    }
}

/// A response to be stored once it is complete.
#[derive(Debug)]
pub(crate) struct Keep {
    store: Arc<ResponseStore>,
    input_items: Vec<Value>,
    body_bytes: usize,
}

impl Keep {
    /// Stores the whole response of `plan` and returns it.
    pub(crate) fn commit(self, plan: &Plan) -> Value {
        let response = response(plan, true);
        let bytes = self
            .body_bytes
            .saturating_add(plan.text().len())
            .saturating_add(STORED_OVERHEAD_BYTES);
        let stored = Stored {
            response: response.clone(),
            input_items: Arc::new(self.input_items),
            model: plan.model.clone(),
            conversation_tokens: plan.prompt_tokens.saturating_add(plan.tokens),
        };
        self.store.insert(plan.id.clone(), stored, bytes);
        response
    }
}

/// The `previous_response_id` a create or compaction names, if any.
pub(crate) fn previous_response_id(body: &Map<String, Value>) -> Result<Option<&str>, ApiError> {
    match body.get("previous_response_id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) => Ok(Some(id)),
        Some(_) => Err(ApiError::invalid_param(
            "previous_response_id",
            "`previous_response_id` must be a string",
        )),
    }
}

/// The request's `input` as the list of items the server stores and `input_items` lists: a
/// string is one user message; an item without a `type` but with a `role` is a message; a
/// message's string `content` becomes one text part (`input_text`, or `output_text` for the
/// assistant); each message gets `status: completed`, and each item without an `id` one of
/// its own (`msg_` and 32 hex digits). Items are otherwise kept as sent.
pub(crate) fn input_items(body: &Map<String, Value>) -> Vec<Value> {
    match body.get("input") {
        Some(Value::String(text)) => {
            let item = json!({"type": "message", "role": "user",
                              "content": [{"type": "input_text", "text": text}]});
            vec![stored_item(&item)]
        }
        Some(Value::Array(items)) => items.iter().map(stored_item).collect(),
        _ => Vec::new(),
    }
}

fn stored_item(item: &Value) -> Value {
    let Some(fields) = item.as_object() else {
        return item.clone();
    };
    let mut out = Map::new();
    let id = fields
        .get("id")
        .cloned()
        .unwrap_or_else(|| format!("msg_{:032x}", rand::random::<u128>()).into());
    out.insert("id".to_owned(), id);
    let message = match fields.get("type") {
        None => fields.contains_key("role"),
        Some(t) => t == "message",
    };
    if message {
        out.insert("type".to_owned(), "message".into());
    }
    for (k, v) in fields {
        out.entry(k.as_str()).or_insert_with(|| v.clone());
    }
    if message {
        if let Some(Value::String(text)) = fields.get("content") {
            let assistant = fields.get("role").and_then(Value::as_str) == Some("assistant");
            let part = if assistant {
                output_text(text)
            } else {
                json!({"type": "input_text", "text": text})
            };
            out.insert("content".to_owned(), json!([part]));
        }
        out.entry("status").or_insert_with(|| "completed".into());
    }
    Value::Object(out)
}

/// Events before the first token: `response.created`, `response.in_progress`,
/// `response.output_item.added`, `response.content_part.added`.
pub(crate) const OPENING: u32 = 4;
/// Events after the last token: `response.output_text.done`, `response.content_part.done`,
/// `response.output_item.done`, and the response's end.
pub(crate) const CLOSING: u32 = 4;

/// Checks the fields the prompt is read from: `input` and `instructions`.
pub(crate) fn check_prompt(body: &Map<String, Value>) -> Result<(), ApiError> {
    let input_ok =
        matches!(body.get("input"), Some(Value::String(_))) || is_object_list(body, "input");
    if !input_ok {
        return Err(ApiError::invalid_param(
            "input",
            "`input` must be a string or a non-empty array of input items",
        ));
    }
    match body.get("instructions") {
        None | Some(Value::Null | Value::String(_)) => Ok(()),
        Some(_) => Err(ApiError::invalid_param(
            "instructions",
            "`instructions` must be a string",
        )),
    }
}

/// The prompt's text: the instructions, then the input string or each input item's content.
pub(crate) fn for_each_prompt_text<'a>(body: &'a Map<String, Value>, mut f: impl FnMut(&'a str)) {
    if let Some(instructions) = body.get("instructions").and_then(Value::as_str) {
        f(instructions);
    }
    match body.get("input") {
        Some(Value::String(s)) => f(s),
        Some(Value::Array(items)) => {
            for content in items.iter().filter_map(|item| item.get("content")) {
                for_each_content_text(content, &mut f);
            }
        }
        _ => {}
    }
}

/// The response object: as it starts (`in_progress`, no output or usage yet) or, when `done`,
/// whole.
pub(crate) fn response(plan: &Plan, done: bool) -> Value {
    let status = match (done, plan.at_limit) {
        (false, _) => "in_progress",
        (true, false) => "completed",
        (true, true) => "incomplete",
    };
    let (output, usage, incomplete) = if done {
        let item = message_item(plan, Some(&plan.text()));
        let incomplete = plan
            .at_limit
            .then(|| json!({"reason": "max_output_tokens"}));
        (
            json!([item]),
            usage(plan),
            incomplete.unwrap_or(Value::Null),
        )
    } else {
        (json!([]), Value::Null, Value::Null)
    };
    json!({
        "id": plan.id, "object": "response", "created_at": plan.created, "status": status,
        "model": plan.model, "output": output, "usage": usage,
        "incomplete_details": incomplete, "error": null,
        "previous_response_id": plan.previous_response_id, "store": plan.store,
    })
}

/// The event at `step`, the `seq`th of the stream.
pub(crate) fn frame(plan: &Plan, step: Step, seq: u32) -> Bytes {
    let at = || json!({"item_id": plan.item_id, "output_index": 0, "content_index": 0});
    let (name, mut fields) = match step {
        Step::Open(0) => (
            "response.created",
            json!({"response": response(plan, false)}),
        ),
        Step::Open(1) => (
            "response.in_progress",
            json!({"response": response(plan, false)}),
        ),
        Step::Open(2) => (
            "response.output_item.added",
            json!({"output_index": 0, "item": message_item(plan, None)}),
        ),
        Step::Open(_) => {
            let mut v = at();
            v["part"] = output_text("");
            ("response.content_part.added", v)
        }
        Step::Token(i) => {
            let mut v = at();
            v["delta"] = token_text(i).into();
            v["logprobs"] = json!([]);
            ("response.output_text.delta", v)
        }
        Step::Close(0) => {
            let mut v = at();
            v["text"] = plan.text().into();
            v["logprobs"] = json!([]);
            ("response.output_text.done", v)
        }
        Step::Close(1) => {
            let mut v = at();
            v["part"] = output_text(&plan.text());
            ("response.content_part.done", v)
        }
        Step::Close(2) => (
            "response.output_item.done",
            json!({"output_index": 0, "item": message_item(plan, Some(&plan.text()))}),
        ),
        Step::Close(_) => (
            "response.completed",
            json!({"response": response(plan, true)}),
        ),
    };
    let mut event = json!({"type": name});
    if let (Some(event), Some(fields)) = (event.as_object_mut(), fields.as_object_mut()) {
        event.append(fields);
        event.insert("sequence_number".to_owned(), seq.into());
    }
    sse_named(name, &event)
}

/// The assistant's output message: empty and `in_progress` until its `text` is known.
fn message_item(plan: &Plan, text: Option<&str>) -> Value {
    let (status, content) = match text {
        None => ("in_progress", json!([])),
        Some(text) if plan.at_limit => ("incomplete", json!([output_text(text)])),
        Some(text) => ("completed", json!([output_text(text)])),
    };
    json!({"type": "message", "id": plan.item_id, "status": status, "role": "assistant",
           "content": content})
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

fn usage(plan: &Plan) -> Value {
    json!({
        "input_tokens": plan.prompt_tokens,
        "input_tokens_details": {"cached_tokens": plan.cached_tokens},
        "output_tokens": plan.tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u64::from(plan.prompt_tokens) + u64::from(plan.tokens),
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

    fn texts(v: Value) -> Vec<String> {
        let body = fields(v);
        let mut out = Vec::new();
        for_each_prompt_text(&body, |s| out.push(s.to_owned()));
        out
    }

    #[test]
    fn the_prompt_is_the_instructions_then_every_input_item() {
        assert_eq!(
            texts(json!({"input": "hi", "instructions": "be brief"})),
            ["be brief", "hi"]
        );
        let items = json!({"input": [
            {"role": "user", "content": "one"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two"},
                                                            {"type": "input_image"}]},
            {"type": "function_call_output", "output": "{}"},
        ]});
        assert_eq!(texts(items), ["one", "two"]);
        let body = fields(json!({"input": "x".repeat(40), "instructions": "y".repeat(8)}));
        assert_eq!(prompt_tokens(Surface::Responses, &body).unwrap(), 12);
    }

    #[test]
    fn malformed_prompts_and_limits_are_refused() {
        for body in [
            json!({}),
            json!({"input": []}),
            json!({"input": 7}),
            json!({"input": ["a"]}),
            json!({"input": "a", "instructions": ["b"]}),
            json!({"input": "a", "max_output_tokens": "9"}),
            json!({"input": "a", "stream": "yes"}),
        ] {
            assert!(
                generation(Surface::Responses, &fields(body.clone())).is_err(),
                "{body}"
            );
        }
        let g = generation(
            Surface::Responses,
            &fields(
                json!({"input": "abcd", "max_output_tokens": 3, "stream": true,
                           "max_tokens": 99, "stream_options": 1}),
            ),
        )
        .unwrap();
        assert_eq!(
            (g.max_tokens, g.stream, g.include_usage),
            (Some(3), true, false)
        );
    }

    #[test]
    fn input_is_stored_as_items_each_with_an_id() {
        let items = input_items(&fields(json!({"input": "hi"})));
        assert_eq!(items.len(), 1);
        let id = items[0]["id"].as_str().unwrap();
        assert!(
            id.strip_prefix("msg_").is_some_and(|h| h.len() == 32),
            "{id}"
        );
        assert_eq!(
            items[0],
            json!({"id": id, "type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "hi"}], "status": "completed"})
        );
        let items = input_items(&fields(json!({"input": [
            {"role": "assistant", "content": "before"},
            {"id": "msg_mine", "type": "message", "role": "user", "status": "completed",
             "content": [{"type": "input_text", "text": "x"}]},
            {"type": "function_call_output", "call_id": "c", "output": "{}"},
        ]})));
        assert_eq!(
            items[0]["content"],
            json!([{"type": "output_text", "text": "before", "annotations": []}])
        );
        assert_eq!(items[0]["type"], "message");
        assert_eq!(items[1]["id"], "msg_mine");
        assert_eq!(items[1]["content"][0]["text"], "x");
        assert_eq!(items[2]["type"], "function_call_output");
        assert!(items[2]["id"].as_str().unwrap().starts_with("msg_"));
        assert!(items[2].get("status").is_none());
        assert_ne!(items[0]["id"], items[2]["id"]);
    }

    #[test]
    fn store_and_previous_response_id_are_checked() {
        let read = |v: Value| Create::read(&fields(v), None, 0);
        assert!(read(json!({"input": "a"})).unwrap().store);
        assert!(read(json!({"input": "a", "store": null})).unwrap().store);
        let off = read(json!({"input": "a", "store": false})).unwrap();
        assert!(!off.store && off.input_items.is_empty());
        assert!(read(json!({"input": "a", "store": "no"})).is_err());
        let id = |v: Value| previous_response_id(&fields(v)).map(|o| o.map(str::to_owned));
        assert_eq!(id(json!({})).unwrap(), None);
        assert_eq!(id(json!({"previous_response_id": null})).unwrap(), None);
        assert_eq!(
            id(json!({"previous_response_id": "resp_1"})).unwrap(),
            Some("resp_1".to_owned())
        );
        assert!(id(json!({"previous_response_id": 1})).is_err());
    }

    #[test]
    fn a_reply_cut_at_the_limit_is_incomplete() {
        let p = MockProfile::default();
        let g = generation(
            Surface::Responses,
            &fields(json!({"input": "abcdefgh", "max_output_tokens": 2})),
        )
        .unwrap();
        let plan = Plan::new(Surface::Responses, "m", &g, &p, 1);
        let v = response(&plan, true);
        assert_eq!(v["status"], "incomplete");
        assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(v["output"][0]["content"][0]["text"], "the quick");
        assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 1);
        assert_eq!(v["usage"]["total_tokens"], 4);
        let last = frame(&plan, Step::Close(3), 9);
        let text = std::str::from_utf8(&last).unwrap();
        assert!(
            text.starts_with("event: response.completed\ndata: "),
            "{text}"
        );
        assert!(text.contains(r#""status":"incomplete""#), "{text}");
    }
}
