//! The Responses API's stored-response routes: `GET /v1/responses/{id}` (the response as
//! stored), `DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel` and `GET
//! /v1/responses/{id}/input_items`.
//!
//! Each takes the first steps of an inference request (`api.rs`): it is counted and remembered
//! for `/stats` (its body is not read), meets the profile's faults, and must present the key;
//! then it reads or changes the [`ResponseStore`](crate::store::ResponseStore) at once, with
//! no generation slot and no pacing. Every exit records one outcome: served, or rejected for an
//! unknown id (404 `response_not_found`), a bad query, a missing key, or a fault. The query is
//! accepted whatever it carries (`include[]`, say) and remembered; only `input_items` reads
//! its own: `limit` (1 to 100, 20 by default), `order` (`asc` or `desc`, `desc` by default, as
//! the API documents), and the cursors `after` and `before`, each the id of one of the
//! response's items. A listing is the items between the cursors, in that order, at most
//! `limit` of them, with `has_more` telling whether the window held more.
//!
//! Cancelling differs from the API on purpose: there only a `background` response still
//! running can be cancelled; the mock generates every response while its create waits, so it
//! lets any stored response be cancelled, which stores it with `status: cancelled`.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, Request};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::request::Parts;
use serde_json::{json, Value};

use crate::api::{self, invalid, Refusal};
use crate::error::{ApiError, Dialect};
use crate::stats::Event;
use crate::MockServer;

/// What a stored-response route does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Retrieve,
    Delete,
    Cancel,
    InputItems,
}

impl Action {
    /// The route, the key `/stats` counts it under.
    fn route(self) -> &'static str {
        match self {
            Action::Retrieve | Action::Delete => "/v1/responses/{id}",
            Action::Cancel => "/v1/responses/{id}/cancel",
            Action::InputItems => "/v1/responses/{id}/input_items",
        }
    }
}

/// The id in the path, or why it could not be read.
pub(crate) type ResponseId = Result<Path<String>, PathRejection>;

/// Serves one stored-response request.
pub(crate) async fn serve(
    server: MockServer,
    action: Action,
    id: ResponseId,
    req: Request,
) -> Response {
    let (parts, _body) = req.into_parts();
    let live = server.live();
    let mut outcome = server.recorder().arrive(action.route());
    let remembered = api::remembered(&parts, None, Arc::new(Value::Null));
    server.recorder().remember(remembered);
    let done = async {
        api::strike(&live, &outcome).await?;
        api::authorize(&live, &parts.headers).map_err(invalid)?;
        let Path(id) = id.map_err(|e| {
            invalid(ApiError::invalid_param(
                "response_id",
                format!(
                    "the response id in the path cannot be read: {}",
                    e.body_text()
                ),
            ))
        })?;
        act(&server, action, &id, &parts)
    };
    match done.await {
        Ok(v) => {
            outcome.settle(Some(Event::Served));
            Json(v).into_response()
        }
        Err(refusal) => api::refuse(outcome, refusal, Dialect::OpenAi),
    }
}

fn act(server: &MockServer, action: Action, id: &str, parts: &Parts) -> Result<Value, Refusal> {
    let store = server.responses();
    let not_found = || invalid(ApiError::response_not_found(id));
    match action {
        Action::Retrieve => store.response(id).ok_or_else(not_found),
        Action::Delete if store.delete(id) => {
            Ok(json!({"id": id, "object": "response", "deleted": true}))
        }
        Action::Delete => Err(not_found()),
        Action::Cancel => store.cancel(id).ok_or_else(not_found),
        Action::InputItems => {
            let page = Page::read(parts).map_err(invalid)?;
            let items = store.input_items(id).ok_or_else(not_found)?;
            page.list(&items).map_err(invalid)
        }
    }
}

/// The page of input items a listing asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Page {
    limit: usize,
    ascending: bool,
    after: Option<String>,
    before: Option<String>,
}

impl Page {
    const DEFAULT_LIMIT: usize = 20;
    const MAX_LIMIT: usize = 100;

    fn read(parts: &Parts) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
            .map_err(|e| ApiError::invalid("invalid_query", e.body_text()))?;
        let mut page = Page {
            limit: Self::DEFAULT_LIMIT,
            ascending: false,
            after: None,
            before: None,
        };
        for (key, value) in pairs {
            match key.as_str() {
                "limit" => {
                    page.limit = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=Self::MAX_LIMIT).contains(n))
                        .ok_or_else(|| {
                            ApiError::invalid_param(
                                "limit",
                                "`limit` must be an integer from 1 to 100",
                            )
                        })?;
                }
                "order" => {
                    page.ascending = match value.as_str() {
                        "asc" => true,
                        "desc" => false,
                        _ => {
                            return Err(ApiError::invalid_param(
                                "order",
                                "`order` must be \"asc\" or \"desc\"",
                            ))
                        }
                    }
                }
                "after" => page.after = Some(value),
                "before" => page.before = Some(value),
                _ => {}
            }
        }
        Ok(page)
    }

    /// The list object of this page of `items` (stored in the order they were sent).
    fn list(&self, items: &[Value]) -> Result<Value, ApiError> {
        let mut ordered: Vec<&Value> = items.iter().collect();
        if !self.ascending {
            ordered.reverse();
        }
        let id_of = |v: &Value| v.get("id").and_then(Value::as_str).map(str::to_owned);
        let place = |cursor: &str, param: &'static str| {
            ordered
                .iter()
                .position(|v| id_of(v).as_deref() == Some(cursor))
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        param,
                        format!("`{param}` must be the id of one of this response's input items"),
                    )
                })
        };
        let start = match &self.after {
            Some(cursor) => place(cursor, "after")? + 1,
            None => 0,
        };
        let end = match &self.before {
            Some(cursor) => place(cursor, "before")?,
            None => ordered.len(),
        };
        let window = ordered.get(start..end).unwrap_or_default();
        let data: Vec<Value> = window
            .iter()
            .take(self.limit)
            .map(|v| Value::clone(v))
            .collect();
        Ok(json!({
            "object": "list",
            "first_id": data.first().and_then(id_of),
            "last_id": data.last().and_then(id_of),
            "has_more": window.len() > data.len(),
            "data": data,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(query: &str) -> Result<Page, ApiError> {
        let req = http::Request::get(format!("/v1/responses/r/input_items?{query}"))
            .body(())
            .unwrap();
        Page::read(&req.into_parts().0)
    }

    fn ids(v: &Value) -> Vec<&str> {
        let data = v["data"].as_array().unwrap();
        data.iter().map(|i| i["id"].as_str().unwrap()).collect()
    }

    #[test]
    fn a_listing_is_newest_first_by_default_and_pages_by_cursor() {
        let items: Vec<Value> = (0..5).map(|i| json!({"id": format!("msg_{i}")})).collect();
        let all = page("").unwrap().list(&items).unwrap();
        assert_eq!(ids(&all), ["msg_4", "msg_3", "msg_2", "msg_1", "msg_0"]);
        assert_eq!(
            (&all["first_id"], &all["last_id"], &all["has_more"]),
            (&json!("msg_4"), &json!("msg_0"), &json!(false))
        );
        let first = page("order=asc&limit=2").unwrap().list(&items).unwrap();
        assert_eq!(ids(&first), ["msg_0", "msg_1"]);
        assert_eq!(first["has_more"], true);
        let next = page("order=asc&limit=2&after=msg_1")
            .unwrap()
            .list(&items)
            .unwrap();
        assert_eq!(ids(&next), ["msg_2", "msg_3"]);
        let before = page("before=msg_2&include[]=x")
            .unwrap()
            .list(&items)
            .unwrap();
        assert_eq!(ids(&before), ["msg_4", "msg_3"]);
        let last = page("after=msg_0").unwrap().list(&items).unwrap();
        assert_eq!(ids(&last), Vec::<&str>::new());
        assert_eq!(
            (&last["first_id"], &last["has_more"]),
            (&Value::Null, &json!(false))
        );
    }

    #[test]
    fn bad_pages_are_refused() {
        for query in ["limit=0", "limit=101", "limit=x", "order=up"] {
            assert!(page(query).is_err(), "{query}");
        }
        let items = [json!({"id": "msg_0"})];
        assert!(page("after=nope").unwrap().list(&items).is_err());
        assert!(page("before=nope").unwrap().list(&items).is_err());
        // Crossed cursors give an empty page, not a panic.
        let items: Vec<Value> = (0..3).map(|i| json!({"id": format!("m{i}")})).collect();
        let crossed = page("order=asc&after=m2&before=m0").unwrap();
        assert!(ids(&crossed.list(&items).unwrap()).is_empty());
    }
}
