//! The respond stage: the chosen upstream response becomes the client's, relayed frame by frame
//! (`crate::relay`), with its ticket and its backend's metrics told how it ended.
//!
//! A relayed 5xx tells the caller not to retry: spillway already did, within the budget.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderValue};
use tracing::debug;

use crate::admission::{insert_rate_headers, Ticket};
use crate::answer::Answer;
use crate::attempt::Chosen;
use crate::call::Call;
use crate::endpoint::{Endpoint, Surface};
use crate::gateway::Gateway;
use crate::homes::{Home, Homes, IdScanner};
use crate::lines::Lines;
use crate::live::Live;
use crate::pool::{Backend, ModelPool};
use crate::relay::{BodyEnd, EndObserver, RelayBody};
use crate::rollout::RolloutCell;
use crate::trace::{self, fields::Fields, CallTrace};
use crate::upstream;
use crate::usage::UsageScanner;

/// The client's response for the `chosen` upstream one.
pub(super) fn respond<B>(
    gw: &Gateway,
    live: &Live,
    call: &Call<'_>,
    (ticket, trace): (Ticket, CallTrace),
    (chosen, model): (Chosen<B>, &Arc<str>),
) -> Answer
where
    B: http_body::Body<Data = Bytes, Error: std::fmt::Display> + Send + Unpin + 'static,
{
    let Chosen {
        response,
        hold,
        rollout,
        trace: attempt,
    } = chosen;
    let Answer {
        status,
        mut lines,
        body,
        extensions,
    } = response;
    let theirs = upstream::keep_upstream_request_id(&mut lines);
    debug!(
        request_id = ?call.id(),
        upstream_request_id = ?theirs,
        backend = %hold.backend().name,
        status = status.as_u16(),
        "relaying the backend's response"
    );
    if status.is_server_error() && live.relay.discourage_caller_retries {
        lines.insert(
            crate::error::X_SHOULD_RETRY,
            HeaderValue::from_static("false"),
        );
    }
    // A success is counted on its rollout's side once its body has ended (an error status was
    // counted by the attempt loop).
    let rollout = rollout
        .filter(|_| status.is_success())
        .map(|cell| Counted { cell });
    let sse = is_sse(&lines);
    insert_rate_headers(&mut lines, ticket.rate_headers());
    // A create's answer names the object its backend stored: remember where it lives.
    let stored = match call.endpoint {
        // `store: false` keeps nothing to come back to.
        Endpoint::Responses if call.summary.store != Some(false) => Some("resp_"),
        Endpoint::ChatCompletions
            if call.summary.store == Some(true)
                && hold.backend().surfaces.contains(Surface::StoredChat) =>
        {
            Some("chatcmpl")
        }
        _ => None,
    };
    let home = stored
        .filter(|_| status.is_success())
        .map(|prefix| Remember {
            scanner: IdScanner::new(prefix),
            homes: gw.homes.clone(),
            home: Home {
                model: model.clone(),
                backend: hold.backend().name.clone(),
                tenant: call.tenant.name.clone(),
            },
        });
    let fields = trace.recording().then(Fields::default);
    // Built where it is boxed (see `RelayBody::new`).
    let state = Box::new((
        hold,
        Finish {
            started: call.started,
            status: status.as_u16(),
            sse,
            endpoint: call.endpoint,
            pool: call.pool.clone(),
            first_byte: None,
            usage: UsageScanner::new(sse),
            ticket: ticket.relayed(sse),
            home,
            rollout,
            trace,
            attempt,
            fields,
        },
    ));
    let relay = RelayBody::new(
        body,
        sse,
        call.endpoint,
        live.relay.stream_idle_timeout,
        state,
    );
    Answer {
        status,
        lines,
        body: Body::new(relay),
        extensions,
    }
}

/// Whether the answer is an event stream: its content type, read as `HeaderValue::to_str` would
/// read it, begins so (the whole value is looked at only then).
fn is_sse(lines: &Lines) -> bool {
    lines
        .get(&header::CONTENT_TYPE)
        .is_some_and(|v| v.starts_with(b"text/event-stream") && crate::lines::text(v).is_some())
}

/// The end of a relayed response: its backend's metrics, the GenAI metrics, the ticket it
/// settles, the home of the response it stored, its rollout's count and its trace.
struct Finish {
    started: Instant,
    status: u16,
    sse: bool,
    /// The call's endpoint and own model, for the GenAI metrics.
    endpoint: Endpoint,
    pool: Arc<ModelPool>,
    /// Since the call arrived, when the first byte of the body came.
    first_byte: Option<Duration>,
    /// The usage the backend reports in the body.
    usage: UsageScanner,
    ticket: Ticket,
    home: Option<Remember>,
    rollout: Option<Counted>,
    /// The call's span and the chosen attempt's, ended with the body.
    trace: CallTrace,
    attempt: trace::Attempt,
    /// The response's model and finish reasons, read only for a recorded span.
    fields: Option<Fields>,
}

/// A relayed success of a model with a rollout, to be counted on its side when its body ends.
struct Counted {
    cell: Arc<RolloutCell>,
}

/// Where a Responses API create's answer was stored, remembered once its id is read.
struct Remember {
    scanner: IdScanner,
    homes: Arc<Homes>,
    home: Home,
}

impl EndObserver for Finish {
    fn arrived(&mut self, data: &Bytes) {
        if self.first_byte.is_none() && !data.is_empty() {
            self.first_byte = Some(crate::clock::since(self.started));
        }
    }

    fn frame(&mut self, data: &Bytes) {
        self.usage.feed(data);
        if let Some(f) = &mut self.fields {
            f.feed(data);
        }
        self.ticket.frame(data);
        if let Some(r) = &mut self.home {
            r.scanner.feed(data);
        }
    }

    fn ended(&mut self, end: BodyEnd, backend: &Backend) {
        let m = &backend.metrics;
        let duration = crate::clock::since(self.started);
        m.body_ended(duration);
        let broken = match end {
            BodyEnd::Complete => None,
            BodyEnd::UpstreamBroke => Some("stream_broken"),
            BodyEnd::UpstreamStalled => Some("stream_stalled"),
            BodyEnd::ClientGone => Some("client_gone"),
        };
        match end {
            BodyEnd::Complete => {}
            BodyEnd::UpstreamBroke => m.stream_broke(false),
            BodyEnd::UpstreamStalled => m.stream_broke(true),
            BodyEnd::ClientGone => m.client_cancelled(),
        }
        let usage = self.usage.usage();
        self.ticket.ended(end == BodyEnd::Complete, usage);
        let error = broken
            .or_else(|| (self.status >= 400).then(|| crate::genai::status_error(self.status)));
        let served = crate::genai::Served {
            duration,
            error,
            first_byte: self.first_byte.filter(|_| self.sse),
            tokens: usage.map(|u| (u.prompt_tokens, u.completion_tokens)),
        };
        self.pool.genai.record(self.endpoint, &served);
        let answer = trace::Answer {
            status: self.status,
            usage,
            fields: self.fields.as_ref(),
            first_byte: self.first_byte,
            error,
        };
        self.attempt.ended(&answer);
        self.trace.ended(&answer);
        if let Some(c) = self.rollout.take() {
            let broke = matches!(end, BodyEnd::UpstreamBroke | BodyEnd::UpstreamStalled);
            if end != BodyEnd::ClientGone {
                c.cell
                    .body_ended(backend.side, self.status, self.first_byte, broke);
            }
        }
        if let Some(r) = self.home.take().filter(|_| end == BodyEnd::Complete) {
            if let Some(id) = r.scanner.id() {
                r.homes.remember(id, r.home);
            }
        }
    }
}
