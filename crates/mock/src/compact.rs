//! The Responses API's compaction (`POST /v1/responses/compact`): a conversation, given as
//! `input` and/or a stored response named by `previous_response_id`, condensed into one opaque
//! item a later create can carry forward in place of the history.
//!
//! The shape is the mock's approximation of the API's `response.compaction` object: an id
//! (`cmp_` and 32 hex digits), `created_at`, an `output` of exactly one `compaction` item whose
//! `encrypted_content` is base64 text that means nothing (the real API's is encrypted model
//! state, and its output may also keep some of the conversation's messages), and `usage` in
//! the Responses shape. The prompt is counted as a create's is, the stored conversation's tokens
//! included; the output is a quarter of it, at least 1 and at most the profile's
//! `max_output_tokens`. Like a create it is inference work: faults, the key and the model are
//! checked, it holds a generation slot, and it is answered once its prompt is prefilled and its
//! output generated at the profile's pace, never streamed. Nothing is stored.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};
use spillway_config::MockProfile;

use crate::embeddings::base64;
use crate::error::ApiError;
use crate::request::{prompt_tokens, tokens_for_chars, Surface};
use crate::store::Earlier;

/// One compaction's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Compaction {
    pub(crate) input_tokens: u32,
    pub(crate) output_tokens: u32,
}

impl Compaction {
    /// Reads a compaction request that continues `earlier`, if it names a stored response.
    pub(crate) fn read(
        body: &Map<String, Value>,
        earlier: Option<&Earlier>,
        profile: &MockProfile,
    ) -> Result<Self, ApiError> {
        let given = !matches!(body.get("input"), None | Some(Value::Null));
        let own = if given {
            prompt_tokens(Surface::Responses, body)?
        } else if earlier.is_none() {
            return Err(ApiError::invalid_param(
                "input",
                "`input` or the id of a stored response in `previous_response_id` is required",
            ));
        } else {
            match body.get("instructions") {
                None | Some(Value::Null) => 0,
                Some(Value::String(s)) => tokens_for_chars(s.chars().count()),
                Some(_) => {
                    return Err(ApiError::invalid_param(
                        "instructions",
                        "`instructions` must be a string",
                    ))
                }
            }
        };
        let input_tokens = own
            .saturating_add(earlier.map_or(0, |e| e.conversation_tokens))
            .max(1);
        let output_tokens = (input_tokens / 4).min(profile.max_output_tokens).max(1);
        Ok(Self {
            input_tokens,
            output_tokens,
        })
    }
}

/// The `response.compaction` object.
pub(crate) fn object(c: &Compaction) -> Value {
    let created_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut opaque = format!("spillway-mock compaction of {} tokens:", c.input_tokens).into_bytes();
    opaque.extend_from_slice(&rand::random::<[u8; 48]>());
    json!({
        "id": format!("cmp_{:032x}", rand::random::<u128>()),
        "object": "response.compaction",
        "created_at": created_at,
        "output": [{
            "type": "compaction",
            "id": format!("cmp_item_{:032x}", rand::random::<u128>()),
            "encrypted_content": base64(&opaque),
        }],
        "usage": {
            "input_tokens": c.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": c.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u64::from(c.input_tokens) + u64::from(c.output_tokens),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: Value, earlier: Option<&Earlier>) -> Result<Compaction, ApiError> {
        let profile = MockProfile::default();
        Compaction::read(body.as_object().unwrap(), earlier, &profile)
    }

    #[test]
    fn the_prompt_is_the_input_and_the_stored_conversation() {
        let earlier = Earlier {
            id: "resp_1".to_owned(),
            model: "m".to_owned(),
            conversation_tokens: 30,
        };
        let c = read(json!({"input": "x".repeat(40)}), None).unwrap();
        assert_eq!((c.input_tokens, c.output_tokens), (10, 2));
        let c = read(json!({"input": "x".repeat(40)}), Some(&earlier)).unwrap();
        assert_eq!((c.input_tokens, c.output_tokens), (40, 10));
        let c = read(json!({}), Some(&earlier)).unwrap();
        assert_eq!(c.input_tokens, 30);
        // The output is capped by the profile's generation length (16 by default).
        let c = read(json!({"input": "x".repeat(4000)}), None).unwrap();
        assert_eq!(c.output_tokens, 16);
        for bad in [json!({}), json!({"input": 3}), json!({"input": []})] {
            assert!(read(bad.clone(), None).is_err(), "{bad}");
        }
        assert!(read(json!({"instructions": 1}), Some(&earlier)).is_err());
    }

    #[test]
    fn the_object_is_one_opaque_compaction_item_with_usage() {
        let v = object(&Compaction {
            input_tokens: 12,
            output_tokens: 3,
        });
        assert_eq!(v["object"], "response.compaction");
        assert!(v["id"].as_str().unwrap().starts_with("cmp_"));
        let items = v["output"].as_array().unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["type"], "compaction");
        assert!(items[0]["id"].as_str().unwrap().starts_with("cmp_item_"));
        let opaque = items[0]["encrypted_content"].as_str().unwrap();
        assert!(opaque.len() > 64, "{opaque}");
        assert_eq!(v["usage"]["total_tokens"], 15);
    }
}
