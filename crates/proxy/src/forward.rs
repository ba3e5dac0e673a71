//! One inference request from arrival to relayed response: authenticate, read, route, send.
//!
//! The order matters: the key is checked before the body is read, the body is capped before it
//! is parsed, a caller's own retry is refused first while the model's backends are failing, and
//! every request deposits into the model's retry budget before its attempts (`attempts`) run.
//! A relayed 5xx tells the caller not to retry: spillway already did, within the budget.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use spillway_policy::Priority;
use tracing::{debug, warn};

use crate::admission::{insert_rate_headers, Admitted, Ask};
use crate::attempts::{discourage_retry, is_client_retry, is_sse, Attempts, Chosen, Counted};
use crate::auth::{presented_key, Tenant};
use crate::error::{ApiError, ErrorKind};
use crate::metrics::{BodyMetrics, RequestLabels};
use crate::pool::Endpoint;
use crate::relay::{BodyEnd, EndObserver, RelayBody};
use crate::request::{read_body, summarize, BodyLimits};
use crate::server::Gateway;
use crate::upstream;
use crate::usage::UsageScanner;

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
    // Counted in flight from here, while its body arrives (G4).
    let entered = gw.admission.enter(&tenant)?;
    let limits = BodyLimits {
        cap: gw.server.max_body_bytes,
        deadline: started + gw.server.body_read_timeout,
        timeout: gw.server.body_read_timeout,
    };
    let (body, _body_hold) = read_body(body, limits, &gw.body_budget, entered.body_held()).await?;
    let summary = summarize(&body)?;
    let pool = gw.models.get(&summary.model).ok_or_else(|| {
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
    let mut admitted = gw
        .admission
        .admit(
            &tenant,
            entered,
            Ask {
                summary: &summary,
                body_len: body.len(),
                completes: endpoint != Endpoint::Embeddings,
            },
        )
        .await?;
    let region = parts
        .headers
        .get(&gw.server.region_header)
        .and_then(|v| v.to_str().ok())
        .or(gw.server.home_region.as_deref());

    let retry = &gw.retry;
    let now = Instant::now();
    if is_client_retry(&parts.headers, &retry.client_retry_headers) {
        // A caller's retry while the pool is failing would only stack its retries on ours.
        let shed = retry.shed_client_retries && !retry.naive && pool.is_failing(now);
        labels.client_retry(shed);
        if shed {
            return Err(ApiError::new(
                ErrorKind::ClientRetryShed,
                format!(
                    "the backends of the model {:?} are failing and spillway has retried already; retried requests are refused first",
                    &*pool.name
                ),
            )
            .retry_after(crate::server::NO_CAPACITY_RETRY_AFTER));
        }
    }
    if !pool.throttle_admits(now) {
        // The backends have been failing: only a share of requests reaches them until they
        // accept again, however often callers resend.
        pool.metrics.throttled();
        return Err(ApiError::new(
            ErrorKind::BackendsFailing,
            format!(
                "the backends of the model {:?} are failing; spillway sends them only a share of requests until they recover",
                &*pool.name
            ),
        )
        .retry_after(crate::server::NO_CAPACITY_RETRY_AFTER));
    }
    if !retry.naive {
        pool.budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .deposit(now);
    }
    let class = requested_class(&parts.headers, &gw.server.priority_header)?
        .map_or(tenant.limits.priority, |asked| {
            tenant.limits.priority.lowered_to(asked)
        });
    gw.admission
        .seat(pool, &tenant, class, &mut admitted)
        .await?;
    let _in_flight = Counted::new(&pool.in_flight);
    let attempts = Attempts {
        gw,
        pool,
        endpoint,
        headers: &parts.headers,
        body: &body,
        region,
        bulkhead: tenant.pool.as_deref(),
        deadline: started + retry.deadline,
        wait_until: Instant::now() + gw.admission.queue_wait(),
        affinity_key: crate::affinity::key(&pool.balance, &parts.headers, &body),
        priority: class,
    };
    let (chosen, made) = attempts.run(labels).await;
    pool.metrics.attempts(made);
    labels.attempted(made);
    let Chosen {
        response,
        hold,
        spilled_over,
    } = chosen?;
    let backend = hold.backend().clone();
    if spilled_over {
        backend.metrics.spilled_over();
    }
    let (mut head, incoming) = response.into_parts();
    upstream::strip_response_headers(&mut head.headers);
    if head.status.is_server_error() && !retry.naive {
        discourage_retry(&mut head.headers);
    }
    let sse = is_sse(&head.headers);
    insert_rate_headers(&mut head.headers, &admitted.headers);
    let observer = Finish {
        metrics: BodyMetrics { backend, started },
        usage: tenant
            .limits
            .tokens_per_min
            .is_some()
            .then(|| UsageScanner::new(sse)),
        data_frames: 0,
        sse,
        admitted: Some(admitted),
    };
    let relay = RelayBody::new(
        incoming,
        sse,
        gw.upstream.stream_idle_timeout,
        hold,
        observer,
    );
    Ok(Response::from_parts(head, Body::new(relay)))
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
fn requested_class(
    headers: &http::HeaderMap,
    header: &http::HeaderName,
) -> Result<Option<Priority>, ApiError> {
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

/// The end of a relayed response: its metrics, and the admission it settles, with the tokens
/// the backend reported (read from the body as it passes, only for tenants with a
/// tokens-per-minute limit).
struct Finish {
    metrics: BodyMetrics,
    usage: Option<UsageScanner>,
    data_frames: u64,
    sse: bool,
    admitted: Option<Admitted>,
}

impl EndObserver for Finish {
    fn frame(&mut self, data: &bytes::Bytes) {
        if let Some(scanner) = &mut self.usage {
            scanner.feed(data);
            self.data_frames += 1;
        }
    }

    fn ended(&mut self, end: BodyEnd) {
        self.metrics.ended(end);
        let Some(admitted) = self.admitted.take() else {
            return;
        };
        let reported = self
            .usage
            .as_ref()
            .and_then(UsageScanner::usage)
            .map(|u| u.total_tokens);
        let used = match (reported, end) {
            (Some(tokens), _) => Some(tokens),
            // Without a report the estimate stands for a response that completed; a stream cut
            // short is charged its prompt and about a token per event it carried.
            (None, BodyEnd::Complete) => None,
            (None, _) if self.sse && self.usage.is_some() => {
                Some(admitted.prompt_estimate() + self.data_frames)
            }
            (None, _) => None,
        };
        admitted.settle(used);
    }
}
