//! The read stage: from an HTTP request to a [`Call`], or the refusal to answer with.
//!
//! The order matters: the key is checked before the body is read; the call is counted in flight
//! (globally and for its tenant) from its head, while its body arrives, because a body still
//! arriving holds memory too (G4); the body is capped in size and time before it is parsed; and
//! only then are the model, the region and the class resolved.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::Request;
use http::{HeaderMap, HeaderName};
use spillway_policy::Priority;
use tracing::warn;

use crate::auth::{presented_key, Tenant};
use crate::call::Call;
use crate::endpoint::Endpoint;
use crate::error::{ApiError, ErrorKind};
use crate::gateway::Gateway;
use crate::live::Live;
use crate::metrics::RequestLabels;
use crate::request::{read_body, summarize, BodyLimits};

/// Reads `req`, which arrived at `started`, into a call; a refusal comes with the labels known
/// by then.
pub(super) async fn read(
    gw: &Gateway,
    live: &Live,
    endpoint: Endpoint,
    (req, started): (Request, Instant),
) -> Result<Call, (ApiError, RequestLabels)> {
    let mut labels = RequestLabels::unrouted();
    match build(gw, live, endpoint, (req, started), &mut labels).await {
        Ok(call) => Ok(call),
        Err(e) => Err((e, labels)),
    }
}

async fn build(
    gw: &Gateway,
    live: &Live,
    endpoint: Endpoint,
    (req, started): (Request, Instant),
    labels: &mut RequestLabels,
) -> Result<Call, ApiError> {
    let (parts, body) = req.into_parts();
    let tenant = authenticate(gw, &parts.headers).await?;
    labels.tenant = tenant.name.clone();
    let entered = live.admission.enter(&tenant)?;
    let limits = BodyLimits {
        cap: live.config.server.max_body_bytes,
        deadline: started + live.config.server.body_read_timeout,
        timeout: live.config.server.body_read_timeout,
    };
    let (mut body, body_hold) =
        read_body(body, limits, &gw.body_budget, entered.body_held()).await?;
    let mut summary = summarize(&body, endpoint.continues_responses())?;
    let model_named = !summary.model.is_empty();
    let home = continued(gw, endpoint, &tenant, &mut summary)?;
    if summary.model.is_empty() {
        body = defaulted(&tenant, &mut summary, &body)?;
    }
    let pool = live.models.get(&summary.model).cloned().ok_or_else(|| {
        ApiError::new(
            ErrorKind::ModelNotFound,
            format!("the model {:?} does not exist", shown(&summary.model)),
        )
    })?;
    labels.model = pool.name.clone();
    if !tenant.may_use(&summary.model) {
        return Err(ApiError::new(
            ErrorKind::ModelNotAllowed,
            format!(
                "this API key may not use the model {:?}",
                shown(&summary.model)
            ),
        ));
    }
    if !pool.serves(endpoint.surface(), tenant.pool.as_deref()) {
        return Err(ApiError::new(
            ErrorKind::SurfaceNotServed,
            format!(
                "the model {:?} has no backend that serves POST /v1{}",
                shown(&summary.model),
                endpoint.path()
            ),
        ));
    }
    let headers = parts.headers;
    let region = match headers
        .get(&live.config.server.region_header)
        .and_then(|v| v.to_str().ok())
    {
        Some(asked) => Some(Arc::from(asked)),
        None => live.home_region.clone(),
    };
    let priority = requested_class(&headers, &live.config.server.priority_header)?
        .map_or(tenant.limits.priority, |asked| {
            tenant.limits.priority.lowered_to(asked)
        });
    let id = headers.get(crate::call::X_REQUEST_ID).cloned();
    let affinity_key = crate::affinity::key(&pool.balance, &headers, &body);
    // It goes to the backend of the response it continues, when that is one of its model's.
    let home = home
        .filter(|h| h.model == pool.name)
        .and_then(|h| pool.backends.iter().position(|b| b.name == h.backend));
    let client_retry = is_client_retry(&headers, &live.client_retry_headers);
    let mut headers = headers;
    crate::upstream::outbound_headers(&mut headers, &live.config.server.region_header);
    Ok(Call {
        id,
        endpoint,
        query: parts.uri.query().map(Box::from),
        started,
        deadline: started + live.retries.deadline,
        affinity_key,
        home,
        client_retry,
        model_named,
        labels: labels.clone(),
        tenant,
        headers,
        body,
        summary,
        pool,
        region,
        priority,
        throttle_pass: None,
        traffic: entered.traffic().clone(),
        trace: crate::trace::CallTrace::none(),
        entered: Some(entered),
        _body_hold: Some(body_hold),
    })
}

/// The caller's tenant, from the key it presents.
pub(crate) async fn authenticate(
    gw: &Gateway,
    headers: &HeaderMap,
) -> Result<Arc<Tenant>, ApiError> {
    let digest = presented_key(headers)?;
    match gw.directory.lookup(&digest).await {
        Ok(Some(tenant)) if tenant.enabled => Ok(tenant),
        Ok(Some(_)) => Err(ApiError::new(
            ErrorKind::TenantDisabled,
            "the tenant of this API key is disabled",
        )),
        Ok(None) => Err(ApiError::new(ErrorKind::InvalidApiKey, "invalid API key")),
        Err(e) => {
            warn!("tenant lookup failed: {e}");
            Err(ApiError::new(
                ErrorKind::StoreUnavailable,
                "cannot check the API key right now: the tenant store cannot be reached",
            )
            .retry_after(std::time::Duration::from_secs(1)))
        }
    }
}

/// The home of the stored response a Responses API request continues (`previous_response_id`),
/// whose model is the request's when it names none (then the body goes as it came: the backend
/// that holds the response knows its model). An id this gateway did not see created for
/// this tenant (or has forgotten) is a 404: no backend would know it either.
fn continued(
    gw: &Gateway,
    endpoint: Endpoint,
    tenant: &Tenant,
    summary: &mut crate::request::RequestSummary,
) -> Result<Option<crate::homes::Home>, ApiError> {
    let Some(id) = summary
        .previous_response_id
        .as_deref()
        .filter(|_| endpoint.continues_responses())
    else {
        return Ok(None);
    };
    let home = gw.homes.find(id, &tenant.name).ok_or_else(|| {
        ApiError::new(
            ErrorKind::ResponseNotFound,
            format!("no stored response {:?} was created through this gateway for this key (or it expired)", shown(id)),
        )
    })?;
    if summary.model.is_empty() {
        summary.model = home.model.to_string();
    }
    Ok(Some(home))
}

/// `body` with the tenant's default model filled in, for a Responses API request that names no
/// model and continues no stored response (the API allows it, e.g. with a stored prompt). The
/// backend is told which model it runs, as it would be had the caller named it.
fn defaulted(
    tenant: &Tenant,
    summary: &mut crate::request::RequestSummary,
    body: &bytes::Bytes,
) -> Result<bytes::Bytes, ApiError> {
    let Some(model) = tenant.default_model.as_deref() else {
        return Err(ApiError::new(
            ErrorKind::MalformedRequest,
            "request body needs a non-empty string field `model` (or `previous_response_id`): \
             this key's tenant has no default_model",
        ));
    };
    summary.model = model.to_owned();
    crate::request::with_model(body, model)
}

/// Whether a request carries a caller's retry marker with a value other than 0.
fn is_client_retry(headers: &HeaderMap, markers: &[HeaderName]) -> bool {
    markers.iter().any(|name| {
        headers
            .get(name)
            .is_some_and(|v| v.as_bytes() != b"0" && !v.is_empty())
    })
}

/// The longest part of a caller's model name repeated in an answer or a log line.
const SHOWN_MODEL_BYTES: usize = 64;

/// A caller's model name as it is repeated back: cut (at a character boundary) to
/// [`SHOWN_MODEL_BYTES`], so a made-up name the size of the body limit is not echoed whole into
/// the answer and the log.
fn shown(model: &str) -> std::borrow::Cow<'_, str> {
    if model.len() <= SHOWN_MODEL_BYTES {
        return model.into();
    }
    let mut cut = SHOWN_MODEL_BYTES;
    while !model.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &model[..cut]).into()
}

/// The class a request asks for in `header` (`critical`, `standard` or `batch`), if any. It can
/// only lower the tenant's class (see `Priority::lowered_to`).
fn requested_class(headers: &HeaderMap, header: &HeaderName) -> Result<Option<Priority>, ApiError> {
    let Some(value) = headers.get(header) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<Priority>().ok())
        .map(Some)
        .ok_or_else(|| {
            ApiError::new(
                ErrorKind::MalformedRequest,
                format!("the {header} header must be critical, standard or batch"),
            )
        })
}
