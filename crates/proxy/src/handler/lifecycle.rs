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

use bytes::Bytes;

use crate::admission::gate::Entered;
use crate::auth::Tenant;
use crate::endpoint::Endpoint;
use crate::error::{ApiError, ErrorKind};
use crate::gateway::Gateway;
use crate::lines::Lines;
use crate::metrics::RequestLabels;
use crate::pool::{Backend, ModelPool};
use crate::upstream;

pub(crate) async fn get(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    lifecycle(&gw, Method::GET, id, "", req).await
}

pub(crate) async fn delete(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    lifecycle(&gw, Method::DELETE, id, "", req).await
}

pub(crate) async fn cancel(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    lifecycle(&gw, Method::POST, id, "/cancel", req).await
}

pub(crate) async fn input_items(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    lifecycle(&gw, Method::GET, id, "/input_items", req).await
}

async fn lifecycle(
    gw: &Gateway,
    method: Method,
    id: String,
    suffix: &'static str,
    req: Request,
) -> Response {
    answered(gw, req, move |gw, caller, asked, labels| {
        Box::pin(
            async move { forward(gw, &caller.tenant, method, &id, suffix, asked, labels).await },
        )
    })
    .await
}

/// A call on a stored object as it came: its request, whose header lines come apart.
pub(super) type Asked = (Request, Lines);

pub(super) type Call<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response, ApiError>> + Send + 'a>>;

/// A caller's tenant and its in-flight places, held while a call on a stored object runs (a
/// body it reads counts in the tenant's share of the body budget through them).
pub(super) struct Caller {
    pub tenant: Arc<Tenant>,
    pub places: Entered,
}

/// Authenticates the caller, holds its in-flight places while `call` runs, and counts the answer.
pub(super) async fn answered(
    gw: &Gateway,
    req: Request,
    call: impl for<'a> FnOnce(&'a Gateway, &'a Caller, Asked, &'a mut RequestLabels) -> Call<'a>,
) -> Response {
    let mut labels = RequestLabels::unrouted();
    let (req, lines) = crate::lines::taken(req);
    let response = match super::authenticate(gw, &lines).await {
        Ok(tenant) => {
            labels.tenant = Some(tenant.name.clone());
            match gw.live().admission.enter(&tenant) {
                Ok(places) => {
                    let caller = Caller { tenant, places };
                    call(gw, &caller, (req, lines), &mut labels).await
                }
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    };
    let response = response.unwrap_or_else(IntoResponse::into_response);
    labels.answered(response.status().as_u16());
    response
}

async fn forward(
    gw: &Gateway,
    tenant: &Tenant,
    method: Method,
    id: &str,
    suffix: &str,
    (req, lines): Asked,
    labels: &mut RequestLabels,
) -> Result<Response, ApiError> {
    let (parts, _) = req.into_parts();
    let unknown = || {
        let shown: String = id.chars().take(64).collect();
        ApiError::new(
            ErrorKind::ResponseNotFound,
            format!("no stored response {shown:?} was created through this gateway for this key (or it expired)"),
        )
    };
    let (pool, at) = home_of(gw, id, tenant, labels).ok_or_else(unknown)?;
    let backend = &pool.backends[at];
    let path = format!("/{id}{suffix}");
    let uri = upstream::resource_uri(backend.uri(Endpoint::Responses), &path, parts.uri.query())
        .ok_or_else(unknown)?;
    let response = send(gw, backend, method.clone(), uri, lines, Bytes::new()).await?;
    if method == Method::DELETE && response.status().is_success() {
        gw.homes.forget(id);
    }
    Ok(response)
}

/// Sends a call on a stored object to the `backend` that has it, as it came (with the caller's
/// headers that may cross), and relays its answer.
pub(super) async fn send(
    gw: &Gateway,
    backend: &Backend,
    method: Method,
    uri: http::Uri,
    mut headers: Lines,
    body: Bytes,
) -> Result<Response, ApiError> {
    upstream::hop::take_request_headers(
        &mut headers,
        Some(&gw.live().config.server.region_header),
    )?;
    let mut answer = gw
        .upstream
        .forward(backend, method, uri, headers, body)
        .await?;
    upstream::keep_upstream_request_id(&mut answer.lines);
    let stall = gw.live().config.upstream.stream_idle_timeout;
    Ok(answer
        .map(|body| Body::new(upstream::StallLimited::new(body, stall)))
        .into_response())
}

/// The model pool and the index of the backend that keeps the stored object `id` for `tenant`,
/// with `labels` filled in; `None` when this gateway does not know it for the tenant.
pub(super) fn home_of(
    gw: &Gateway,
    id: &str,
    tenant: &Tenant,
    labels: &mut RequestLabels,
) -> Option<(Arc<ModelPool>, usize)> {
    if !is_plain_id(id) {
        return None;
    }
    let home = gw.homes.find(id, &tenant.name)?;
    let pool = gw.live().models.get(&home.model)?.clone();
    let at = pool.backends.iter().position(|b| b.name == home.backend)?;
    labels.model = Some(pool.name.clone());
    labels.backend = Some(home.backend);
    Some((pool, at))
}

/// Whether `id` can be a path segment as it is. Ids are the backends' own (`resp_...`,
/// `chatcmpl-...`); one that could not be was never remembered.
fn is_plain_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}
