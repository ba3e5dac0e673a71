//! The Responses API's calls on a stored response: `GET` and `DELETE /v1/responses/{id}`,
//! `POST /v1/responses/{id}/cancel` and `GET /v1/responses/{id}/input_items`. Each goes to the
//! backend that created the response (`crate::homes`), for the tenant that created it; an id the
//! gateway does not know for the caller is a 404, whatever other backends might say.
//!
//! These calls generate nothing: they pass the key check and the in-flight caps (global and the
//! tenant's), not the token limits or the queue, and are not retried elsewhere, as no other
//! backend has the response.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use http::Method;

use crate::endpoint::Endpoint;
use crate::error::{ApiError, ErrorKind};
use crate::gateway::Gateway;
use crate::metrics::RequestLabels;
use crate::upstream;

pub(crate) async fn get(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    lifecycle(&gw, Method::GET, &id, "", req).await
}

pub(crate) async fn delete(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    lifecycle(&gw, Method::DELETE, &id, "", req).await
}

pub(crate) async fn cancel(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    lifecycle(&gw, Method::POST, &id, "/cancel", req).await
}

pub(crate) async fn input_items(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    lifecycle(&gw, Method::GET, &id, "/input_items", req).await
}

async fn lifecycle(gw: &Gateway, method: Method, id: &str, suffix: &str, req: Request) -> Response {
    let mut labels = RequestLabels::unrouted();
    let response = match forward(gw, method, id, suffix, req, &mut labels).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    };
    labels.answered(response.status().as_u16());
    response
}

async fn forward(
    gw: &Gateway,
    method: Method,
    id: &str,
    suffix: &str,
    req: Request,
    labels: &mut RequestLabels,
) -> Result<Response, ApiError> {
    let (parts, _) = req.into_parts();
    let tenant = super::authenticate(gw, &parts.headers).await?;
    labels.tenant = tenant.name.clone();
    let _places = gw.admission.enter(&tenant)?;
    let unknown = || {
        let shown: String = id.chars().take(64).collect();
        ApiError::new(
            ErrorKind::ResponseNotFound,
            format!("no stored response {shown:?} was created through this gateway for this key (or it expired)"),
        )
    };
    // Ids are the backend's own (`resp_...`); one that could not be a path segment as it is was
    // never remembered.
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err(unknown());
    }
    let home = gw.homes.find(id, &tenant.name).ok_or_else(unknown)?;
    let pool = gw.models.get(&home.model).ok_or_else(unknown)?;
    labels.model = pool.name.clone();
    let backend = pool
        .backends
        .iter()
        .find(|b| b.name == home.backend)
        .ok_or_else(unknown)?;
    labels.backend = backend.name.clone();
    let mut headers = parts.headers;
    upstream::outbound_headers(&mut headers, &gw.server.region_header);
    let path = format!("/{id}{suffix}");
    let uri = upstream::resource_uri(backend.uri(Endpoint::Responses), &path, parts.uri.query())
        .ok_or_else(unknown)?;
    let response = gw
        .upstream
        .forward(backend, method.clone(), uri, headers)
        .await?;
    if method == Method::DELETE && response.status().is_success() {
        gw.homes.forget(id);
    }
    let (mut head, body) = response.into_parts();
    upstream::strip_response_headers(&mut head.headers);
    upstream::keep_upstream_request_id(&mut head.headers);
    Ok(Response::from_parts(head, Body::new(body)))
}
