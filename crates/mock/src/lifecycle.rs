//! The routes of what this server stored, outside inference: the Responses API's `GET
//! /v1/responses/{id}` (the response as stored), `DELETE /v1/responses/{id}`, `POST
//! /v1/responses/{id}/cancel` and `GET /v1/responses/{id}/input_items`; and the stored chat
//! completions' `GET /v1/chat/completions` (the list), `GET`, `POST` (the metadata) and
//! `DELETE /v1/chat/completions/{id}`, and `GET /v1/chat/completions/{id}/messages`
//! (`chats.rs`).
//!
//! Each takes the first steps of an inference request (`api.rs`): it is counted under its
//! route (`{id}` for the id) and remembered for `/stats` (with its body, for the one route
//! that reads one: a chat completion's metadata update), meets the profile's faults, and must
//! present the key; then it reads or changes the [`Store`](crate::store::Store) at once, with
//! no generation slot and no pacing. Every exit records one outcome: served, or rejected for an
//! unknown id (404 `response_not_found`, or `not_found` for a chat completion), a bad query or
//! body, a missing key, or a fault. The query is accepted whatever it carries (`include[]`,
//! say) and remembered; the listings read their own (`page.rs`): `input_items` reads `limit`,
//! `order` (`desc` by default, as the API documents) and the cursors `after` and `before`, each
//! the id of one of the response's items; the chat listings read `limit`, `order` (`asc` by
//! default) and `after`, and the list of completions its filters, `model` and
//! `metadata[KEY]`.
//!
//! Cancelling differs from the API on purpose: there only a `background` response still
//! running can be cancelled; the mock generates every response while its create waits, so it
//! lets any stored response be cancelled, which stores it with `status: cancelled`.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::request::Parts;
use serde_json::{json, Map, Value};

use crate::api::{self, invalid};
use crate::chats;
use crate::error::{ApiError, Dialect};
use crate::page::{list_object, query_pairs, Page, Paging};
use crate::stats::Event;
use crate::MockServer;

/// How `input_items` pages: newest first unless asked otherwise, with both cursors.
const INPUT_ITEMS: Paging = Paging {
    ascending: false,
    before: true,
};

/// What a stored-state route does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Retrieve,
    Delete,
    Cancel,
    InputItems,
    ListChats,
    RetrieveChat,
    UpdateChat,
    DeleteChat,
    ChatMessages,
}

impl Action {
    /// The route, the key `/stats` counts it under.
    fn route(self) -> &'static str {
        match self {
            Action::Retrieve | Action::Delete => "/v1/responses/{id}",
            Action::Cancel => "/v1/responses/{id}/cancel",
            Action::InputItems => "/v1/responses/{id}/input_items",
            Action::ListChats => "/v1/chat/completions",
            Action::RetrieveChat | Action::UpdateChat | Action::DeleteChat => {
                "/v1/chat/completions/{id}"
            }
            Action::ChatMessages => "/v1/chat/completions/{id}/messages",
        }
    }

    /// The name of the id in the path, for the error when it cannot be read.
    fn id_name(self) -> &'static str {
        match self {
            Action::Retrieve | Action::Delete | Action::Cancel | Action::InputItems => {
                "response_id"
            }
            _ => "completion_id",
        }
    }
}

/// The id in the path, or why it could not be read.
pub(crate) type StoredId = Result<Path<String>, PathRejection>;

/// Serves one stored-state request; `id` is the path's, for every route but the list.
pub(crate) async fn serve(
    server: MockServer,
    action: Action,
    id: Option<StoredId>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let live = server.live();
    let mut outcome = server.recorder().arrive(action.route());
    let read = match action {
        Action::UpdateChat => Some(api::read_body(&parts.headers, body).await),
        _ => None,
    };
    let (json, json_error) = match &read {
        Some(read) => api::parse_json(read),
        None => (Arc::new(Value::Null), None),
    };
    let remembered = api::remembered(&parts, None, Arc::clone(&json));
    server.recorder().remember(remembered);
    let done = async {
        if let Some(read) = read {
            read.map_err(invalid)?;
        }
        api::strike(&live, &outcome).await?;
        api::authorize(&live, &parts.headers).map_err(invalid)?;
        let id = match id {
            Some(Ok(Path(id))) => Some(id),
            Some(Err(e)) => {
                let name = action.id_name();
                let why = format!("the id in the path cannot be read: {}", e.body_text());
                return Err(invalid(ApiError::invalid_param(name, why)));
            }
            None => None,
        };
        let body = match action {
            Action::UpdateChat => Some(api::json_object(&json, json_error).map_err(invalid)?),
            _ => None,
        };
        act(&server, action, id.as_deref().unwrap_or(""), &parts, body).map_err(invalid)
    };
    match done.await {
        Ok(v) => {
            outcome.settle(Some(Event::Served));
            Json(v).into_response()
        }
        Err(refusal) => api::refuse(outcome, refusal, Dialect::OpenAi),
    }
}

fn act(
    server: &MockServer,
    action: Action,
    id: &str,
    parts: &Parts,
    body: Option<&Map<String, Value>>,
) -> Result<Value, ApiError> {
    let store = server.responses();
    let chats = server.chats();
    let not_found = || ApiError::response_not_found(id);
    match action {
        Action::Retrieve => store.response(id).ok_or_else(not_found),
        Action::Delete if store.delete(id) => {
            Ok(json!({"id": id, "object": "response", "deleted": true}))
        }
        Action::Delete => Err(not_found()),
        Action::Cancel => store.cancel(id).ok_or_else(not_found),
        Action::InputItems => {
            let page = Page::read(&query_pairs(parts)?, INPUT_ITEMS)?;
            let items = store.input_items(id).ok_or_else(not_found)?;
            let (data, more) = page.select(
                items.iter(),
                |v| v.get("id").and_then(Value::as_str),
                |_| true,
                "one of this response's input items",
            )?;
            Ok(list_object(data.into_iter().cloned().collect(), more))
        }
        Action::ListChats => chats::list(chats, &query_pairs(parts)?),
        Action::RetrieveChat => chats::retrieve(chats, id),
        Action::UpdateChat => chats::update(chats, id, body.unwrap_or(&Map::new())),
        Action::DeleteChat => chats::delete(chats, id),
        Action::ChatMessages => chats::messages(chats, id, &query_pairs(parts)?),
    }
}
