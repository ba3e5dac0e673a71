//! Stored chat completions, as OpenAI's and Azure OpenAI's APIs serve them: a chat completion
//! created with `store: true` on a backend that declares `stored_chat` is kept by that backend,
//! and `GET /v1/chat/completions` (the list), `GET`, `POST` (metadata) and `DELETE
//! /v1/chat/completions/{id}` and `GET /v1/chat/completions/{id}/messages` reach it.
//!
//! One backend key serves many tenants, so the backend's store holds every tenant's
//! completions. Each stays its tenant's: the gateway tags a stored completion's `metadata` with
//! `spillway_tenant` when it is created and when its metadata is changed, every list asks the
//! backend for that tenant's tag only, and an id is reached only by the tenant that created it
//! through this gateway (`crate::homes`). Like the Responses API's stored responses, these calls
//! generate nothing: they pass the key check and the in-flight caps, not the token limits or the
//! queue, and are never retried elsewhere.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::Method;

use super::lifecycle::{answered, home_of, send, Asked, Caller};
use crate::auth::Tenant;
use crate::endpoint::Surface;
use crate::error::{ApiError, ErrorKind};
use crate::gateway::Gateway;
use crate::metrics::RequestLabels;
use crate::pool::Backend;
use crate::request::{read_body, rewritten_held, BodyLimits, Changes, TENANT_TAG};
use crate::upstream;

/// The largest metadata update read.
const MAX_UPDATE_BYTES: usize = 64 * 1024;

pub(crate) async fn list(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    answered(&gw, req, |gw, caller, asked, labels| {
        Box::pin(list_on(gw, caller.tenant.clone(), asked, labels))
    })
    .await
}

pub(crate) async fn get(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    by_id(&gw, Method::GET, id, "", req).await
}

pub(crate) async fn update(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    by_id(&gw, Method::POST, id, "", req).await
}

pub(crate) async fn delete(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    by_id(&gw, Method::DELETE, id, "", req).await
}

pub(crate) async fn messages(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    by_id(&gw, Method::GET, id, "/messages", req).await
}

async fn by_id(
    gw: &Gateway,
    method: Method,
    id: String,
    suffix: &'static str,
    req: Request,
) -> Response {
    answered(gw, req, move |gw, caller, asked, labels| {
        Box::pin(async move { on_id(gw, caller, method, &id, suffix, asked, labels).await })
    })
    .await
}

/// A call on one stored completion, sent to the backend that keeps it.
async fn on_id(
    gw: &Gateway,
    caller: &Caller,
    method: Method,
    id: &str,
    suffix: &str,
    (req, lines): Asked,
    labels: &mut RequestLabels,
) -> Result<Response, ApiError> {
    let tenant = &caller.tenant;
    let unknown = || {
        let shown: String = id.chars().take(64).collect();
        ApiError::new(
            ErrorKind::NotFound,
            format!("no stored chat completion {shown:?} was created through this gateway for this key (or it expired)"),
        )
    };
    let (pool, at) = home_of(gw, id, tenant, labels).ok_or_else(unknown)?;
    let backend = &pool.backends[at];
    let (parts, body) = req.into_parts();
    let body = if method == Method::POST {
        // A metadata update replaces the metadata: the tenant's tag goes back in. Read as a
        // request body is: capped in size and time, and counted in the body budget.
        let read_timeout = gw.live().config.server.body_read_timeout;
        let limits = BodyLimits {
            cap: MAX_UPDATE_BYTES,
            deadline: crate::clock::now() + read_timeout,
            timeout: read_timeout,
        };
        let held = caller.places.body_held();
        let read = read_body(body, limits, gw.body_budget, held).await?;
        let tag = Changes {
            tenant_tag: Some(&tenant.name),
            ..Changes::default()
        };
        rewritten_held(&read, &tag, gw.body_budget, held)?
    } else {
        Bytes::new()
    };
    let uri = upstream::resource_uri(
        &backend.stored_chat,
        &format!("/{id}{suffix}"),
        parts.uri.query(),
    )
    .ok_or_else(unknown)?;
    let response = send(gw, backend, method.clone(), uri, lines, body).await?;
    if method == Method::DELETE && response.status().is_success() {
        gw.homes.forget(id);
    }
    Ok(response)
}

/// `GET /v1/chat/completions`: the caller's own stored completions, from one backend that keeps
/// them: of the model named in `?model=`, else of the first model (in configuration order) the
/// key may use.
async fn list_on(
    gw: &Gateway,
    tenant: Arc<Tenant>,
    (req, lines): Asked,
    labels: &mut RequestLabels,
) -> Result<Response, ApiError> {
    let query = req.uri().query().unwrap_or("");
    let asked = form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == "model")
        .map(|(_, model)| model.into_owned());
    let live = gw.live();
    let names: Vec<&String> = match &asked {
        Some(m) => live.models.names.iter().filter(|n| *n == m).collect(),
        None => live.models.names.iter().collect(),
    };
    let bulkhead = tenant.pool.as_deref();
    let found = names
        .into_iter()
        .filter(|n| tenant.may_use(n))
        .find_map(|n| {
            let pool = live.models.get(n)?;
            let backend: &Arc<Backend> = pool.backends.iter().find(|b| {
                b.bulkhead.as_deref() == bulkhead && b.surfaces.contains(Surface::StoredChat)
            })?;
            Some((pool.name.clone(), backend.clone()))
        });
    let Some((model, backend)) = found else {
        return Err(ApiError::new(
            ErrorKind::SurfaceNotServed,
            "no model this key may use has a backend that stores chat completions",
        ));
    };
    labels.model = Some(model);
    labels.backend = Some(backend.name.clone());
    let uri = upstream::resource_uri(
        &backend.stored_chat,
        "",
        Some(&tenant_query(query, &tenant.name)),
    )
    .ok_or_else(|| {
        ApiError::new(
            ErrorKind::MalformedRequest,
            "the query string cannot be passed on",
        )
    })?;
    send(gw, &backend, Method::GET, uri, lines, Bytes::new()).await
}

/// The caller's list query, with the tenant's tag as the one `metadata[spillway_tenant]` filter:
/// a filter of the caller's on that key, however it is escaped, is dropped.
fn tenant_query(query: &str, tenant: &str) -> String {
    let own = format!("metadata[{TENANT_TAG}]");
    let mut kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| form_urlencoded::parse(pair.as_bytes()).all(|(key, _)| key != own))
        .collect();
    let tag = format!("metadata%5B{TENANT_TAG}%5D={tenant}");
    kept.push(&tag);
    kept.join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_filtered_by_the_tenants_tag_whatever_the_caller_asks() {
        assert_eq!(tenant_query("", "t"), "metadata%5Bspillway_tenant%5D=t");
        assert_eq!(
            tenant_query(
                "limit=5&metadata[spillway_tenant]=other&metadata%5Bspillway%5Ftenant%5D=x&order=desc",
                "t"
            ),
            "limit=5&order=desc&metadata%5Bspillway_tenant%5D=t"
        );
    }
}
