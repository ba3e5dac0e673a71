//! The read stage: from an HTTP request to a [`Call`], or the refusal to answer with.
//!
//! The order matters: the key is checked before the body is read; the call is counted in flight
//! (globally and for its tenant) from its head, while its body arrives, because a body still
//! arriving holds memory too (G4); the body is capped in size and time before it is parsed; and
//! only then are the model, the region and the class resolved.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use http::HeaderName;
use spillway_policy::Priority;
use tracing::warn;

use super::asked::{asked, Looked};
use crate::admission::gate::Entered;
use crate::auth::{presented_key, Tenant};
use crate::call::Call;
use crate::endpoint::Endpoint;
use crate::error::{ApiError, ErrorKind};
use crate::gateway::Gateway;
use crate::lines::Lines;
use crate::live::Live;
use crate::metrics::RequestLabels;
use crate::pool::ModelPool;
use crate::request::{read_body, summarize, BodyHold, BodyLimits};

/// Reads a request (its URI's query, its body and its header lines), which arrived at `started`,
/// into a call; on a refusal, `labels` holds what was
/// known by then. (The labels are the caller's rather than part of an error returned with them:
/// a wrapper pairing them with the error would move the call once more on its way out. A call
/// read is labelled from the tenant and pool it holds, `Call::labels`: `labels` is filled in
/// only on a refusal, by [`Refused`].)
pub(super) async fn read<'l>(
    gw: &Gateway,
    live: &'l Live,
    endpoint: Endpoint,
    (query, body, mut headers, started): (Option<&str>, Body, Lines, Instant),
    labels: &mut RequestLabels,
) -> Result<Call<'l>, ApiError> {
    let tenant = authenticate(gw, &headers).await?;
    let mut refused = Refused {
        labels,
        tenant: &tenant.name,
        model: None,
        read: false,
    };
    let entered = live.admission.enter(&tenant)?;
    let limits = BodyLimits {
        cap: live.config.server.max_body_bytes,
        deadline: started + live.config.server.body_read_timeout,
        timeout: live.config.server.body_read_timeout,
    };
    let mut body = read_body(body, limits, gw.body_budget, entered.body_held()).await?;
    let mut summary = summarize(&body, endpoint.continues_responses())?;
    let model_named = !summary.model.is_empty();
    let home = continued(gw, endpoint, &tenant, &mut summary)?;
    if summary.model.is_empty() {
        body = defaulted(gw, &entered, &tenant, &mut summary, &body)?;
    }
    let found = live.models.get(&summary.model).ok_or_else(|| {
        ApiError::new(
            ErrorKind::ModelNotFound,
            format!("the model {:?} does not exist", shown(&summary.model)),
        )
    })?;
    refused.model = Some(&found.name);
    let pool = found;
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
    let rewrite_room = rewrite_room(gw, &entered, pool, endpoint, &summary, &body)?;
    let looked = Looked {
        region: &live.config.server.region_header,
        class: &live.config.server.priority_header,
        retry_markers: &live.client_retry_headers,
    };
    let asked = asked(&headers, &looked);
    let region = match asked.region.and_then(crate::lines::text) {
        Some(asked) => Some(Arc::from(asked)),
        None => live.home_region.clone(),
    };
    let priority = requested_class(asked.class, looked.class)?
        .map_or(tenant.limits.priority, |asked| {
            tenant.limits.priority.lowered_to(asked)
        });
    let client_retry = asked.retry;
    let sent_region = asked.region.is_some();
    let affinity_key = crate::affinity::key(&pool.balance, &headers, &body);
    // It goes to the backend of the response it continues, when that is one of its model's.
    let home = home
        .filter(|h| h.model == pool.name)
        .and_then(|h| pool.backends.iter().position(|b| b.name == h.backend));
    let ours = sent_region.then_some(looked.region);
    crate::upstream::hop::take_request_headers(&mut headers, ours)?;
    refused.read();
    Ok(Call {
        endpoint,
        query: query.map(Box::from),
        started,
        deadline: started + live.retries.deadline,
        affinity_key,
        home,
        client_retry,
        model_named,
        backend_label: None,
        tenant,
        headers,
        body,
        summary,
        pool,
        region,
        priority,
        throttle_pass: None,
        trace: crate::trace::CallTrace::none(),
        entered: Some(entered),
        _rewrite_room: rewrite_room,
    })
}

/// The labels of a request refused while it is read, named once its tenant is known: filled in
/// when this is dropped (by a refusal's early return, or the request's future dropped) unless it
/// was [`read`](Refused::read), so that a request read whole takes no reference to the names.
struct Refused<'a> {
    labels: &'a mut RequestLabels,
    tenant: &'a Arc<str>,
    model: Option<&'a Arc<str>>,
    read: bool,
}

impl Refused<'_> {
    /// The request was read whole: nothing is filled in.
    fn read(mut self) {
        self.read = true;
    }
}

impl Drop for Refused<'_> {
    fn drop(&mut self) {
        if !self.read {
            self.labels.tenant = Some(self.tenant.clone());
            self.labels.model = self.model.cloned();
        }
    }
}

/// The caller's tenant, from the key it presents.
pub(crate) async fn authenticate(gw: &Gateway, headers: &Lines) -> Result<Arc<Tenant>, ApiError> {
    let digest = presented_key(headers)?;
    // A cache hit is answered without the boxed future a lookup that may wait needs.
    let looked = match gw.directory.cached(&digest) {
        Some(looked) => looked,
        None => gw.directory.lookup(&digest).await,
    };
    match looked {
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
    gw: &Gateway,
    entered: &Entered,
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
    let changes = crate::request::Changes {
        model: Some(model),
        ..Default::default()
    };
    // The copy takes the body's place, and its own place in the budget.
    crate::request::rewritten_held(body, &changes, gw.body_budget, entered.body_held())
}

/// Room in the body budget for the copies of `body` the call's attempts may hold beside it at
/// once: one an attempt sends to a backend told another model name, a priority or a tenant
/// tag, and one more while the call is on a fallback model (its body names that model), each
/// the body's size and what the rewrite adds (a name, a number; 4 KiB covers them).
fn rewrite_room(
    gw: &Gateway,
    entered: &Entered,
    pool: &ModelPool,
    endpoint: Endpoint,
    summary: &crate::request::RequestSummary,
    body: &[u8],
) -> Result<Option<BodyHold>, ApiError> {
    let stored = summary.stores_chat(endpoint);
    // Whether a backend is sent a copy does not depend on the tenant's name or the class.
    let rewrites = pool
        .backends
        .iter()
        .any(|b| !b.changes(stored, "", Priority::default()).is_empty());
    let copies = if !pool.fallbacks.is_empty() {
        2
    } else {
        u64::from(rewrites)
    };
    if copies == 0 {
        return Ok(None);
    }
    let room = copies * (body.len() as u64 + REWRITE_GROWTH);
    let share = gw.body_budget.tenant_share();
    if body.len() as u64 + room > share {
        // It could never fit, however long the caller waited.
        return Err(ApiError::new(
            ErrorKind::BodyTooLarge,
            format!(
                "a request body of {} bytes to the model {:?} needs {} bytes of the body budget \
                 (its backends are sent a copy of it), more than a tenant's maximum of {share}",
                body.len(),
                shown(&pool.name),
                body.len() as u64 + room
            ),
        ));
    }
    gw.body_budget.hold(entered.body_held(), room).map(Some)
}

/// What a rewrite may add to a body, at most: a model name, a priority, a tenant tag.
const REWRITE_GROWTH: u64 = 4096;

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
fn requested_class(
    value: Option<&[u8]>,
    header: &HeaderName,
) -> Result<Option<Priority>, ApiError> {
    let Some(value) = value else {
        return Ok(None);
    };
    crate::lines::text(value)
        .and_then(|v| v.trim().parse::<Priority>().ok())
        .map(Some)
        .ok_or_else(|| {
            ApiError::new(
                ErrorKind::MalformedRequest,
                format!("the {header} header must be critical, standard or batch"),
            )
        })
}
