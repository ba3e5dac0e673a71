//! One inference request from arrival to relayed response: authenticate, read, route, send.
//!
//! The order matters: the key is checked before the body is read, the body is capped before it
//! is parsed, and the backend's concurrency is taken before a byte goes upstream. A backend that
//! refuses the connection (or cannot be connected to in time) never saw the request, so the
//! request moves to another backend and the first one is skipped for a cooldown; a backend that
//! accepted the request and then failed is not retried here.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::header;
use tracing::{debug, warn};

use crate::auth::{presented_key, Tenant};
use crate::error::{ApiError, ErrorKind};
use crate::metrics::{BodyMetrics, RequestLabels, UpstreamFailure};
use crate::pool::Endpoint;
use crate::relay::RelayBody;
use crate::request::{read_body, summarize, with_model};
use crate::server::Gateway;
use crate::upstream;

/// Backends tried for one request when the first ones cannot be connected to.
const MAX_CONNECT_ATTEMPTS: usize = 3;

pub async fn chat_completions(state: State<Arc<Gateway>>, req: Request) -> Response {
    forward(state, Endpoint::ChatCompletions, req).await
}

pub async fn completions(state: State<Arc<Gateway>>, req: Request) -> Response {
    forward(state, Endpoint::Completions, req).await
}

pub async fn embeddings(state: State<Arc<Gateway>>, req: Request) -> Response {
    forward(state, Endpoint::Embeddings, req).await
}

async fn forward(State(gw): State<Arc<Gateway>>, endpoint: Endpoint, req: Request) -> Response {
    let started = Instant::now();
    let mut labels = RequestLabels::unrouted();
    let response = match route(&gw, endpoint, req, started, &mut labels).await {
        Ok(response) => response,
        Err(e) => {
            debug!(
                code = e.parts().2,
                status = e.status().as_u16(),
                "request refused: {}",
                e.message
            );
            e.into_response()
        }
    };
    labels.answered(response.status().as_u16());
    response
}

/// The caller's tenant, from the key it presents.
pub async fn authenticate(
    gw: &Gateway,
    headers: &http::HeaderMap,
) -> Result<Arc<Tenant>, ApiError> {
    let digest = presented_key(headers)?;
    match gw.directory.lookup(&digest).await {
        Ok(Some(tenant)) => Ok(tenant),
        Ok(None) => Err(ApiError::new(ErrorKind::InvalidApiKey, "invalid API key")),
        Err(e) => {
            warn!("tenant lookup failed: {e}");
            Err(
                ApiError::new(ErrorKind::Internal, "cannot check the API key right now")
                    .retry_after(std::time::Duration::from_secs(1)),
            )
        }
    }
}

async fn route(
    gw: &Gateway,
    endpoint: Endpoint,
    req: Request,
    started: Instant,
    labels: &mut RequestLabels,
) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let tenant = authenticate(gw, &parts.headers).await?;
    labels.tenant = tenant.name.clone();
    let body = read_body(body, gw.server.max_body_bytes).await?;
    let summary = summarize(&body)?;
    let pool = gw.models.get(&summary.model).ok_or_else(|| {
        ApiError::new(
            ErrorKind::ModelNotFound,
            format!("the model {:?} does not exist", summary.model),
        )
    })?;
    labels.model = pool.name.clone();
    if !tenant.may_use(&summary.model) {
        return Err(ApiError::new(
            ErrorKind::ModelNotAllowed,
            format!("this API key may not use the model {:?}", summary.model),
        ));
    }
    let region = parts
        .headers
        .get(&gw.server.region_header)
        .and_then(|v| v.to_str().ok())
        .or(gw.server.home_region.as_deref());

    let mut tried = Vec::with_capacity(MAX_CONNECT_ATTEMPTS);
    let mut unreachable = 0;
    while tried.len() < MAX_CONNECT_ATTEMPTS {
        let Some((index, hold, spilled)) = pool.acquire(region, &tried) else {
            break;
        };
        tried.push(index);
        let backend = hold.backend().clone();
        labels.backend = backend.name.clone();
        let upstream_body = match &backend.rename_to {
            Some(name) => with_model(&body, name)?,
            None => body.clone(),
        };
        let up = upstream::request(
            &backend,
            endpoint,
            &parts.headers,
            &gw.server.region_header,
            upstream_body,
        );
        let sent = Instant::now();
        let result =
            tokio::time::timeout(gw.upstream.response_timeout, gw.client.request(up)).await;
        let response = match result {
            Ok(Ok(response)) => response,
            Ok(Err(e)) if e.is_connect() => {
                backend.metrics.upstream_failed(UpstreamFailure::Connect);
                warn!(backend = %backend.name, "cannot connect upstream, trying another backend: {e}");
                backend.skip_for(gw.upstream.unreachable_cooldown);
                unreachable += 1;
                continue;
            }
            Ok(Err(e)) => {
                backend.metrics.upstream_failed(UpstreamFailure::Connection);
                warn!(backend = %backend.name, "upstream request failed: {e}");
                return Err(ApiError::new(
                    ErrorKind::UpstreamUnavailable,
                    "the backend closed the connection before answering",
                ));
            }
            Err(_) => {
                backend.metrics.upstream_failed(UpstreamFailure::Timeout);
                backend.skip_for(gw.upstream.unreachable_cooldown);
                return Err(ApiError::new(
                    ErrorKind::UpstreamTimeout,
                    format!(
                        "the backend did not answer within {:?}",
                        gw.upstream.response_timeout
                    ),
                ));
            }
        };
        backend.metrics.upstream_responded(sent.elapsed());
        if spilled {
            backend.metrics.spilled_over();
        }
        let (mut head, incoming) = response.into_parts();
        upstream::strip_response_headers(&mut head.headers);
        let sse = head
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let observer = BodyMetrics { backend, started };
        let relay = RelayBody::new(
            incoming,
            sse,
            gw.upstream.stream_idle_timeout,
            hold,
            observer,
        );
        return Ok(Response::from_parts(head, Body::new(relay)));
    }
    let message = if unreachable > 0 {
        format!(
            "no backend of the model {:?} could be reached",
            summary.model
        )
    } else {
        format!(
            "every backend of the model {:?} is at its concurrency limit",
            summary.model
        )
    };
    Err(ApiError::new(ErrorKind::NoCapacity, message)
        .retry_after(crate::server::NO_CAPACITY_RETRY_AFTER))
}
