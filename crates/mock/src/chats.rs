//! Stored chat completions, as OpenAI's API keeps them: a `POST /v1/chat/completions` with
//! `store: true` (chat's default is not to store) is stored once it is answered 200, a plain
//! reply when it is answered, a stream when its last event is sent (one broken off or left by
//! its client is not). What is stored is the `chat.completion` object (a stream's assembled
//! from its chunks: the same id, created time, model, text and usage) with the create's
//! `metadata` (`{}` when none was given), and the create's `messages`, each given an id
//! (`<completion id>-<index>`) unless it carried one. The create's own answer is unchanged.
//!
//! `metadata` is an object of at most 16 string values, keys of at most 64 characters and
//! values of at most 512, as the API documents it; on a create it is checked whether or not the
//! completion is stored.
//!
//! The routes (`lifecycle.rs` serves them): `GET /v1/chat/completions` lists the stored
//! completions oldest first unless `order=desc`, filtered by `model` and by any number of
//! `metadata[KEY]=VALUE`, paged by `limit` and the cursor `after` (`page.rs`); `GET
//! /v1/chat/completions/{id}` is one; `POST /v1/chat/completions/{id}` with a body of only
//! `{"metadata": {...}}` replaces its metadata (`null` clears it) and answers it updated;
//! `DELETE /v1/chat/completions/{id}` forgets it; `GET /v1/chat/completions/{id}/messages`
//! lists its messages, paged the same way. An id this server does not hold is a 404
//! `not_found`.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::generate::Plan;
use crate::page::{list_object, Page, Paging};
use crate::store::Store;

/// The stored chat completions.
pub(crate) type ChatStore = Store<StoredChat>;

/// How the chat listings page: oldest first unless asked otherwise, with `after` only.
const PAGING: Paging = Paging {
    ascending: true,
    before: false,
};

/// Memory a stored completion is reckoned to hold besides its request body and output text,
/// with room for the largest metadata an update may give it.
const STORED_OVERHEAD_BYTES: usize =
    1024 + MAX_METADATA_PAIRS * (MAX_METADATA_KEY_CHARS + MAX_METADATA_VALUE_CHARS) * 4;

const MAX_METADATA_PAIRS: usize = 16;
const MAX_METADATA_KEY_CHARS: usize = 64;
const MAX_METADATA_VALUE_CHARS: usize = 512;

/// One stored chat completion.
#[derive(Debug, Clone)]
pub(crate) struct StoredChat {
    /// The `chat.completion` object, with its current `metadata`.
    completion: Value,
    /// The create's messages, each with an `id`.
    messages: Arc<Vec<Value>>,
    model: String,
}

/// What a chat create asks of the store, read with its other fields.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Create {
    store: bool,
    metadata: Map<String, Value>,
    /// The messages as sent; empty when the completion is not to be stored.
    messages: Vec<Value>,
    /// The size of the request body, the stored entry's main cost.
    body_bytes: usize,
}

impl Create {
    /// Reads `store` and `metadata` of a chat create whose body was `body_bytes` long.
    pub(crate) fn read(body: &Map<String, Value>, body_bytes: usize) -> Result<Self, ApiError> {
        let store = match body.get("store") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "store",
                    "`store` must be a boolean",
                ))
            }
        };
        let metadata = match body.get("metadata") {
            None | Some(Value::Null) => Map::new(),
            Some(v) => metadata(v)?,
        };
        let messages = match body.get("messages") {
            Some(Value::Array(messages)) if store => messages.clone(),
            _ => Vec::new(),
        };
        Ok(Self {
            store,
            metadata,
            messages,
            body_bytes,
        })
    }

    /// What storing this create's completion takes, if it is to be stored.
    pub(crate) fn keep(self, store: &Arc<ChatStore>) -> Option<Keep> {
        self.store.then(|| Keep {
            store: Arc::clone(store),
            create: self,
        })
    }
}

/// A chat completion to be stored once it is complete.
#[derive(Debug)]
pub(crate) struct Keep {
    store: Arc<ChatStore>,
    create: Create,
}

impl Keep {
    /// Stores the whole completion of `plan` and returns it as answered.
    pub(crate) fn commit(self, plan: &Plan) -> Value {
        let completion = plan.completion();
        let mut stored = completion.clone();
        stored["metadata"] = Value::Object(self.create.metadata);
        let messages = stored_messages(&plan.id, self.create.messages);
        let bytes = self
            .create
            .body_bytes
            .saturating_add(plan.text().len())
            .saturating_add(STORED_OVERHEAD_BYTES);
        let entry = StoredChat {
            completion: stored,
            messages: Arc::new(messages),
            model: plan.model.clone(),
        };
        self.store.insert(plan.id.clone(), entry, bytes);
        completion
    }
}

/// The messages as stored: each given the id `<completion id>-<index>` unless it has one.
fn stored_messages(completion_id: &str, messages: Vec<Value>) -> Vec<Value> {
    let with_id = |(i, message): (usize, Value)| match message {
        Value::Object(fields) if !fields.contains_key("id") => {
            let mut out = Map::new();
            out.insert("id".to_owned(), format!("{completion_id}-{i}").into());
            out.extend(fields);
            Value::Object(out)
        }
        other => other,
    };
    messages.into_iter().enumerate().map(with_id).collect()
}

/// Checks a `metadata` object: at most 16 pairs, each a key of at most 64 characters and a
/// string value of at most 512.
fn metadata(v: &Value) -> Result<Map<String, Value>, ApiError> {
    let bad = |why: String| ApiError::invalid_param("metadata", why);
    let Value::Object(fields) = v else {
        return Err(bad(
            "`metadata` must be an object of string values".to_owned()
        ));
    };
    if fields.len() > MAX_METADATA_PAIRS {
        return Err(bad(format!(
            "`metadata` may hold at most {MAX_METADATA_PAIRS} pairs"
        )));
    }
    for (key, value) in fields {
        if key.chars().count() > MAX_METADATA_KEY_CHARS {
            return Err(bad(format!(
                "`metadata` keys are at most {MAX_METADATA_KEY_CHARS} characters"
            )));
        }
        match value {
            Value::String(s) if s.chars().count() <= MAX_METADATA_VALUE_CHARS => {}
            Value::String(_) => {
                return Err(bad(format!(
                    "`metadata` values are at most {MAX_METADATA_VALUE_CHARS} characters"
                )))
            }
            _ => return Err(bad("`metadata` values must be strings".to_owned())),
        }
    }
    Ok(fields.clone())
}

/// What `GET /v1/chat/completions` keeps besides the page: `model`, and each
/// `metadata[KEY]=VALUE`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Filter {
    model: Option<String>,
    metadata: Vec<(String, String)>,
}

impl Filter {
    fn read(pairs: &[(String, String)]) -> Self {
        let mut filter = Filter::default();
        for (key, value) in pairs {
            if key == "model" {
                filter.model = Some(value.clone());
            } else if let Some(k) = key
                .strip_prefix("metadata[")
                .and_then(|k| k.strip_suffix(']'))
            {
                filter.metadata.push((k.to_owned(), value.clone()));
            }
        }
        filter
    }

    fn keeps(&self, chat: &StoredChat) -> bool {
        let metadata = chat.completion.get("metadata");
        self.model.as_ref().is_none_or(|m| *m == chat.model)
            && self.metadata.iter().all(|(k, v)| {
                metadata.and_then(|m| m.get(k)).and_then(Value::as_str) == Some(v.as_str())
            })
    }
}

/// `GET /v1/chat/completions`: a page of the stored completions the query keeps.
pub(crate) fn list(store: &ChatStore, pairs: &[(String, String)]) -> Result<Value, ApiError> {
    let page = Page::read(pairs, PAGING)?;
    let filter = Filter::read(pairs);
    let (data, more) = store.scan(|entries| {
        let (data, more) = page.select(
            entries,
            |(id, _)| Some(id),
            |(_, chat)| filter.keeps(chat),
            "a stored chat completion",
        )?;
        let data: Vec<Value> = data
            .into_iter()
            .map(|(_, c)| c.completion.clone())
            .collect();
        Ok::<_, ApiError>((data, more))
    })?;
    Ok(list_object(data, more))
}

/// `GET /v1/chat/completions/{id}`.
pub(crate) fn retrieve(store: &ChatStore, id: &str) -> Result<Value, ApiError> {
    store
        .get(id, |chat| chat.completion.clone())
        .ok_or_else(|| ApiError::chat_completion_not_found(id))
}

/// `POST /v1/chat/completions/{id}`: `body` must be `{"metadata": OBJECT or null}` alone.
pub(crate) fn update(
    store: &ChatStore,
    id: &str,
    body: &Map<String, Value>,
) -> Result<Value, ApiError> {
    if let Some(other) = body.keys().find(|k| *k != "metadata") {
        return Err(ApiError::unknown_parameter(other));
    }
    let metadata = match body.get("metadata") {
        None => {
            return Err(ApiError::invalid_param(
                "metadata",
                "`metadata` is required",
            ))
        }
        Some(Value::Null) => Map::new(),
        Some(v) => metadata(v)?,
    };
    store
        .update(id, |chat| {
            chat.completion["metadata"] = Value::Object(metadata);
            chat.completion.clone()
        })
        .ok_or_else(|| ApiError::chat_completion_not_found(id))
}

/// `DELETE /v1/chat/completions/{id}`.
pub(crate) fn delete(store: &ChatStore, id: &str) -> Result<Value, ApiError> {
    if store.delete(id) {
        Ok(json!({"object": "chat.completion.deleted", "id": id, "deleted": true}))
    } else {
        Err(ApiError::chat_completion_not_found(id))
    }
}

/// `GET /v1/chat/completions/{id}/messages`: a page of the stored completion's messages.
pub(crate) fn messages(
    store: &ChatStore,
    id: &str,
    pairs: &[(String, String)],
) -> Result<Value, ApiError> {
    let page = Page::read(pairs, PAGING)?;
    let messages = store
        .get(id, |chat| Arc::clone(&chat.messages))
        .ok_or_else(|| ApiError::chat_completion_not_found(id))?;
    let (data, more) = page.select(
        messages.iter(),
        |m| m.get("id").and_then(Value::as_str),
        |_| true,
        "one of this chat completion's messages",
    )?;
    Ok(list_object(data.into_iter().cloned().collect(), more))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{generation, Surface};
    use spillway_config::MockProfile;

    fn fields(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn read(v: Value) -> Result<Create, ApiError> {
        Create::read(&fields(v), 0)
    }

    #[test]
    fn store_is_off_by_default_and_both_fields_are_checked() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        assert!(!read(json!({"messages": msgs})).unwrap().store);
        assert!(
            !read(json!({"messages": msgs, "store": null}))
                .unwrap()
                .store
        );
        let off = read(json!({"messages": msgs, "store": false})).unwrap();
        assert!(off.messages.is_empty());
        let on = read(json!({"messages": msgs, "store": true, "metadata": {"a": "b"}})).unwrap();
        assert!(on.store);
        assert_eq!(on.messages, msgs.as_array().unwrap().clone());
        assert_eq!(Value::Object(on.metadata), json!({"a": "b"}));
        for bad in [
            json!({"store": "yes"}),
            json!({"store": 1}),
            json!({"metadata": "a=b"}),
            json!({"metadata": ["a"]}),
            json!({"metadata": {"a": 1}}),
            json!({"metadata": {"a": null}}),
            // Checked even when nothing is stored.
            json!({"store": false, "metadata": {"a": {"b": "c"}}}),
        ] {
            assert!(read(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn metadata_is_bounded_as_the_api_documents() {
        let many: Map<String, Value> = (0..16).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(metadata(&Value::Object(many.clone())).is_ok());
        let mut too_many = many;
        too_many.insert("k16".to_owned(), "v".into());
        assert!(metadata(&Value::Object(too_many)).is_err());
        assert!(metadata(&json!({"k".repeat(64): "v".repeat(512)})).is_ok());
        assert!(metadata(&json!({"k".repeat(65): "v"})).is_err());
        assert!(metadata(&json!({"k": "v".repeat(513)})).is_err());
        // Characters, not bytes.
        assert!(metadata(&json!({"é".repeat(64): "é".repeat(512)})).is_ok());
    }

    #[test]
    fn messages_get_ids_of_the_completion_unless_they_have_one() {
        let stored = stored_messages(
            "chatcmpl-x",
            vec![
                json!({"role": "system", "content": "be brief"}),
                json!({"id": "mine", "role": "user", "content": "hi"}),
                json!({"role": "user", "content": [{"type": "text", "text": "more"}]}),
            ],
        );
        assert_eq!(
            stored,
            [
                json!({"id": "chatcmpl-x-0", "role": "system", "content": "be brief"}),
                json!({"id": "mine", "role": "user", "content": "hi"}),
                json!({"id": "chatcmpl-x-2", "role": "user",
                       "content": [{"type": "text", "text": "more"}]}),
            ]
        );
    }

    fn chat(model: &str, metadata: Value) -> StoredChat {
        StoredChat {
            completion: json!({"metadata": metadata}),
            messages: Arc::new(Vec::new()),
            model: model.to_owned(),
        }
    }

    fn pairs(query: &[(&str, &str)]) -> Vec<(String, String)> {
        let owned = |(k, v): &(&str, &str)| ((*k).to_owned(), (*v).to_owned());
        query.iter().map(owned).collect()
    }

    #[test]
    fn the_filter_keeps_the_model_and_every_metadata_pair_asked_for() {
        let c = chat("m", json!({"team": "a", "run": "1"}));
        let keeps = |q: &[(&str, &str)]| Filter::read(&pairs(q)).keeps(&c);
        assert!(keeps(&[]));
        assert!(keeps(&[("model", "m"), ("limit", "2")]));
        assert!(!keeps(&[("model", "n")]));
        assert!(keeps(&[("metadata[team]", "a"), ("metadata[run]", "1")]));
        assert!(!keeps(&[("metadata[team]", "a"), ("metadata[run]", "2")]));
        assert!(!keeps(&[("metadata[other]", "a")]));
        // Not a metadata filter at all.
        assert!(keeps(&[("metadata", "x"), ("metadata[team", "b")]));
        assert!(!Filter::read(&pairs(&[("metadata[x]", "")])).keeps(&chat("m", json!({}))));
    }

    #[test]
    fn a_commit_stores_the_completion_with_metadata_and_answers_it_plain() {
        let store = Arc::new(ChatStore::default());
        let body = fields(json!({"messages": [{"role": "user", "content": "hi"}],
                                 "store": true, "metadata": {"a": "b"}}));
        let create = Create::read(&body, 100).unwrap();
        let g = generation(Surface::Chat, &body).unwrap();
        let plan = Plan::new(Surface::Chat, "m", &g, &MockProfile::default(), 0);
        let answered = create.keep(&store).unwrap().commit(&plan);
        assert_eq!(answered, plan.completion());
        assert!(answered.get("metadata").is_none());
        let stored = retrieve(&store, &plan.id).unwrap();
        assert_eq!(stored["metadata"], json!({"a": "b"}));
        assert_eq!(stored["choices"], answered["choices"]);
        let v = update(&store, &plan.id, &fields(json!({"metadata": null}))).unwrap();
        assert_eq!(v["metadata"], json!({}));
        assert!(update(&store, &plan.id, &fields(json!({}))).is_err());
        assert!(update(&store, &plan.id, &fields(json!({"metadata": {}, "x": 1}))).is_err());
        assert!(update(&store, "nope", &fields(json!({"metadata": {}}))).is_err());
        let listed = messages(&store, &plan.id, &[]).unwrap();
        assert_eq!(listed["first_id"], format!("{}-0", plan.id));
        // Not stored unless asked for.
        let off = Create::read(&fields(json!({"messages": [{"content": "x"}]})), 1).unwrap();
        assert!(off.keep(&store).is_none());
    }
}
