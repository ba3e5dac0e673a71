//! Paged listings, as the OpenAI API pages its lists: a query's `limit` (1 to 100, 20 by
//! default), `order` (`asc` or `desc`) and cursors, and the `list` object a page is answered in
//! (`data`, `first_id`, `last_id`, `has_more`).
//!
//! A cursor is the id of one of the listed things; `after` starts the page just past it, in
//! the page's order, and `before` (where the listing reads it) ends the page just short of it.
//! A cursor that names none of them is a 400. A listing may also be filtered: the cursors are
//! placed among everything listed, so a cursor that the filter leaves out still marks its
//! place, and `has_more` tells whether the filter kept more past the page.

use axum::extract::Query;
use http::request::Parts;
use serde_json::{json, Value};

use crate::error::ApiError;

/// How one listing reads its query: its order when none is asked for, and whether it reads the
/// `before` cursor (a listing that does not ignores it, as any other parameter it does not
/// know).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Paging {
    pub(crate) ascending: bool,
    pub(crate) before: bool,
}

/// The page a listing asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    limit: usize,
    ascending: bool,
    after: Option<String>,
    before: Option<String>,
}

/// The query's parameters, decoded, in order (a bracketed key such as `metadata[k]` as such).
pub(crate) fn query_pairs(parts: &Parts) -> Result<Vec<(String, String)>, ApiError> {
    let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
        .map_err(|e| ApiError::invalid("invalid_query", e.body_text()))?;
    Ok(pairs)
}

impl Page {
    const DEFAULT_LIMIT: usize = 20;
    const MAX_LIMIT: usize = 100;

    /// Reads the page from the query's `pairs`; a parameter given twice counts as last given,
    /// and parameters a page does not know are left to the caller.
    pub(crate) fn read(pairs: &[(String, String)], paging: Paging) -> Result<Self, ApiError> {
        let mut page = Page {
            limit: Self::DEFAULT_LIMIT,
            ascending: paging.ascending,
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
                "after" => page.after = Some(value.clone()),
                "before" if paging.before => page.before = Some(value.clone()),
                _ => {}
            }
        }
        Ok(page)
    }

    /// This page of `items` (given oldest first): those between the cursors in the page's
    /// order that `keep` keeps, at most `limit` of them, and whether `keep` kept more in the
    /// window. A cursor must be the `id_of` one of `items`; `of` names them for the error.
    pub(crate) fn select<I>(
        &self,
        items: impl DoubleEndedIterator<Item = I>,
        id_of: impl Fn(&I) -> Option<&str>,
        keep: impl Fn(&I) -> bool,
        of: &str,
    ) -> Result<(Vec<I>, bool), ApiError> {
        let mut ordered: Vec<I> = if self.ascending {
            items.collect()
        } else {
            items.rev().collect()
        };
        let place = |cursor: &str, param: &'static str| {
            ordered
                .iter()
                .position(|v| id_of(v) == Some(cursor))
                .ok_or_else(|| {
                    ApiError::invalid_param(param, format!("`{param}` must be the id of {of}"))
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
        // Crossed cursors make an empty window.
        let end = end.max(start);
        let mut kept = ordered.drain(start..end).filter(|v| keep(v));
        let data: Vec<I> = kept.by_ref().take(self.limit).collect();
        let more = kept.next().is_some();
        Ok((data, more))
    }
}

/// The `list` object of one page: `data` (each with an `id`) and whether more follow it.
pub(crate) fn list_object(data: Vec<Value>, has_more: bool) -> Value {
    let id_of = |v: &Value| v.get("id").cloned().unwrap_or(Value::Null);
    json!({
        "object": "list",
        "first_id": data.first().map_or(Value::Null, id_of),
        "last_id": data.last().map_or(Value::Null, id_of),
        "has_more": has_more,
        "data": data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEWEST_FIRST: Paging = Paging {
        ascending: false,
        before: true,
    };

    fn page(query: &str, paging: Paging) -> Result<Page, ApiError> {
        let req = http::Request::get(format!("/list?{query}"))
            .body(())
            .unwrap();
        Page::read(&query_pairs(&req.into_parts().0)?, paging)
    }

    fn list(page: &Page, items: &[Value]) -> Result<Value, ApiError> {
        let (data, more) = page.select(
            items.iter(),
            |v| v.get("id").and_then(Value::as_str),
            |_| true,
            "an item",
        )?;
        Ok(list_object(data.into_iter().cloned().collect(), more))
    }

    fn ids(v: &Value) -> Vec<&str> {
        let data = v["data"].as_array().unwrap();
        data.iter().map(|i| i["id"].as_str().unwrap()).collect()
    }

    #[test]
    fn a_listing_pages_in_either_order_by_cursor() {
        let items: Vec<Value> = (0..5).map(|i| json!({"id": format!("msg_{i}")})).collect();
        let all = list(&page("", NEWEST_FIRST).unwrap(), &items).unwrap();
        assert_eq!(ids(&all), ["msg_4", "msg_3", "msg_2", "msg_1", "msg_0"]);
        assert_eq!(
            (&all["first_id"], &all["last_id"], &all["has_more"]),
            (&json!("msg_4"), &json!("msg_0"), &json!(false))
        );
        let first = list(&page("order=asc&limit=2", NEWEST_FIRST).unwrap(), &items).unwrap();
        assert_eq!(ids(&first), ["msg_0", "msg_1"]);
        assert_eq!(first["has_more"], true);
        let q = "order=asc&limit=2&after=msg_1";
        let next = list(&page(q, NEWEST_FIRST).unwrap(), &items).unwrap();
        assert_eq!(ids(&next), ["msg_2", "msg_3"]);
        let q = "before=msg_2&include[]=x";
        let before = list(&page(q, NEWEST_FIRST).unwrap(), &items).unwrap();
        assert_eq!(ids(&before), ["msg_4", "msg_3"]);
        let last = list(&page("after=msg_0", NEWEST_FIRST).unwrap(), &items).unwrap();
        assert_eq!(ids(&last), Vec::<&str>::new());
        assert_eq!(
            (&last["first_id"], &last["has_more"]),
            (&Value::Null, &json!(false))
        );
        // A listing that does not read `before` ignores it, and may default to oldest first.
        let paging = Paging {
            ascending: true,
            before: false,
        };
        let q = "before=nope&limit=3";
        let asc = list(&page(q, paging).unwrap(), &items).unwrap();
        assert_eq!(ids(&asc), ["msg_0", "msg_1", "msg_2"]);
    }

    #[test]
    fn a_filter_keeps_its_own_and_cursors_keep_their_place() {
        let items: Vec<(String, u32)> = (0..10).map(|n| (n.to_string(), n)).collect();
        let paging = Paging {
            ascending: true,
            before: false,
        };
        let select = |query: &str| {
            let p = page(query, paging).unwrap();
            let (data, more) = p
                .select(
                    items.iter(),
                    |(id, _)| Some(id.as_str()),
                    |(_, n)| n % 2 == 0,
                    "a number",
                )
                .unwrap();
            (
                data.into_iter().map(|(_, n)| *n).collect::<Vec<u32>>(),
                more,
            )
        };
        assert_eq!(select("limit=2"), (vec![0, 2], true));
        // After a number the filter leaves out: the next kept ones.
        assert_eq!(select("limit=2&after=3"), (vec![4, 6], true));
        assert_eq!(select("limit=2&after=5"), (vec![6, 8], false));
        assert_eq!(select("order=desc&after=5"), (vec![4, 2, 0], false));
        assert_eq!(select("after=9"), (vec![], false));
    }

    #[test]
    fn bad_pages_are_refused() {
        for query in [
            "limit=0",
            "limit=101",
            "limit=x",
            "limit=-1",
            "order=up",
            "order=",
        ] {
            assert!(page(query, NEWEST_FIRST).is_err(), "{query}");
        }
        let items = [json!({"id": "msg_0"})];
        assert!(list(&page("after=nope", NEWEST_FIRST).unwrap(), &items).is_err());
        assert!(list(&page("before=nope", NEWEST_FIRST).unwrap(), &items).is_err());
        // Crossed cursors give an empty page, not a panic.
        let items: Vec<Value> = (0..3).map(|i| json!({"id": format!("m{i}")})).collect();
        let crossed = page("order=asc&after=m2&before=m0", NEWEST_FIRST).unwrap();
        assert!(ids(&list(&crossed, &items).unwrap()).is_empty());
    }
}
