//! One inference call from arrival to relayed response, in four stages that each take the one
//! `Call` value: read -> admit -> attempt -> respond.
//!
//! - read (`read.rs`): the key is checked before the body is read, the call is counted in flight
//!   from its head (G4), its body is capped in size and time before it is parsed, and its model,
//!   region and class are resolved;
//! - admit (`crate::admission`): the tenant's limits, the shedding of a caller's own retry while
//!   the model's backends are failing, adaptive throttling and the queue seat, in one call that
//!   returns one `Ticket`;
//! - attempt (`crate::attempt`): the only stage that retries, within the model's budget;
//! - respond (`respond.rs`): the chosen response is relayed as it arrives, and the ticket settles
//!   itself when the body ends or the client leaves.
//!
//! The `Call` (`call.rs`) holds everything a stage needs to know about the request.

mod asked;
pub(crate) mod lifecycle;
mod read;
mod respond;
pub(crate) mod stored;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::{post, MethodRouter};
use tracing::debug;

use crate::answer::Answer;
use crate::call::Call;
use crate::endpoint::{Dialect, Endpoint};
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::lines::Lines;
use crate::live::Live;
use crate::metrics::{Labels, RequestLabels};
use crate::trace::CallTrace;

pub(crate) use read::authenticate;

/// The response header naming the model that answered, when a fallback did or the caller named
/// none.
pub(crate) const X_SPILLWAY_MODEL: http::HeaderName =
    http::HeaderName::from_static("x-spillway-model");

/// The router's `POST` handler for `endpoint`'s path. The API listener's service answers these
/// routes before the router (`server::Api`); the router has them too, so that another method on
/// the path is refused as not allowed, and so that it would answer them the same way.
pub(crate) fn inference(endpoint: Endpoint) -> MethodRouter<Arc<Gateway>> {
    post(
        move |State(gw): State<Arc<Gateway>>, req: Request| async move {
            let (req, lines) = crate::lines::taken(req);
            let (parts, body) = req.into_parts();
            handle(&gw, endpoint, parts.uri.query(), body, lines)
                .await
                .into_response()
        },
    )
}

/// Serves one inference call to `endpoint`: its URI's `query`, its `body` and its header lines.
pub(crate) async fn handle(
    gw: &Gateway,
    endpoint: Endpoint,
    query: Option<&str>,
    body: Body,
    lines: Lines,
) -> Answer {
    let dialect = endpoint.dialect();
    let started = crate::clock::now();
    // The Messages API names its request id `request-id`: the same id as `x-request-id`.
    let anthropic_id = (dialect == Dialect::Anthropic)
        .then(|| lines.value(&crate::call::X_REQUEST_ID))
        .flatten();
    let trace = gw.tracing.start(&lines, endpoint);
    // The config this request runs on, to its end, whatever a reload does meanwhile.
    let live = gw.live();
    let with_id = |mut answer: Answer| {
        if let Some(id) = anthropic_id {
            answer.lines.insert(crate::call::REQUEST_ID, id);
        }
        answer
    };
    let mut labels = RequestLabels::unrouted();
    // The call is bound apart from the result it came in, which is gone before the next await:
    // a future holding both would be larger by a call, and be copied so.
    let read = read::read(
        gw,
        &live,
        endpoint,
        (query, body, lines, started),
        &mut labels,
    );
    let mut call = match read.await {
        Ok(call) => call,
        Err(e) => {
            not_relayed(&trace, &e, endpoint, labels.view(), started);
            return with_id(answered(refused(e, dialect), labels.view()));
        }
    };
    call.trace = trace;
    call.trace
        .read(&call.tenant.name, &call.pool.name, call.summary.stream);
    let response = match admit_attempt_respond(gw, &live, &mut call).await {
        Ok(response) => response,
        Err(e) => {
            not_relayed(&call.trace, &e, endpoint, call.labels(), started);
            refused(e, dialect)
        }
    };
    with_id(answered(response, call.labels()))
}

async fn admit_attempt_respond<'l>(
    gw: &Gateway,
    live: &'l Live,
    call: &mut Call<'l>,
) -> Result<Answer, ApiError> {
    let ticket = live.admission.admit(call).await?;
    call.trace.admitted(ticket.waited());
    let attempted = crate::attempt::run(
        call,
        ticket.traffic(),
        &live.retries,
        &gw.upstream,
        &live.models,
    )
    .await;
    if let Some(backend) = attempted.backend {
        call.backend_label = Some(backend);
    }
    let chosen = attempted.result?;
    // The call's span now ends with the relayed body.
    let trace = std::mem::replace(&mut call.trace, CallTrace::none());
    // The model whose backend answered: the call's own, or a fallback.
    let own = &call.pool.name;
    let model = attempted.fallback.unwrap_or(own);
    let mut response = respond::respond(gw, live, call, (ticket, trace), (chosen, model));
    let unasked = (!call.model_named).then_some(own);
    if let Some(model) = attempted.fallback.or(unasked) {
        // The model that answered, when it was not the one asked for.
        if let Ok(value) = http::HeaderValue::from_str(model) {
            response.lines.insert(X_SPILLWAY_MODEL, value);
        }
    }
    Ok(response)
}

/// A call answered by the gateway itself (refused, or failed without a response to relay): its
/// span and the GenAI request duration are told why.
fn not_relayed(
    trace: &CallTrace,
    e: &ApiError,
    endpoint: Endpoint,
    labels: Labels<'_>,
    started: std::time::Instant,
) {
    let (status, code) = (e.status().as_u16(), e.parts().2);
    trace.refused(status, code);
    crate::genai::failed(
        crate::genai::operation(endpoint),
        labels.model(),
        crate::genai::status_error(status),
        crate::clock::since(started),
    );
}

fn refused(e: ApiError, dialect: Dialect) -> Answer {
    debug!(
        code = e.parts().2,
        status = e.status().as_u16(),
        "request refused: {}",
        e.message
    );
    e.answer(dialect)
}

fn answered(answer: Answer, labels: Labels<'_>) -> Answer {
    labels.answered(answer.status.as_u16());
    answer
}

/// A refusal of a request that reached no handler of the API, counted in
/// `spillway_requests_total` like every other answer.
pub(crate) fn counted(e: ApiError, dialect: Dialect) -> Response {
    crate::metrics::RequestLabels::unrouted().answered(e.status().as_u16());
    e.response(dialect)
}
