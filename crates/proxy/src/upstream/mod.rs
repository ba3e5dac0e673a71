//! The upstream side: the seam the attempt loop sends through ([`Upstream`]), its one production
//! implementation ([`HttpUpstream`]: HTTP/1 connections kept alive per backend), and how a client
//! request becomes an upstream request.
//!
//! The seam is small on purpose: one attempt in, a response head or the [`Outcome`] of a failure
//! out. Everything about retrying (whether, where, when, from which budget) is the attempt
//! loop's, so a scripted fake of this trait is enough to test that loop in-process.
//!
//! Connections are kept alive and reused (an LLM gateway that opens a connection per request
//! spends its CPU on handshakes and can run out of ephemeral ports under load). The connect
//! timeout is short and separate from the response timeout, so an unreachable backend is told
//! apart from a slow one: the first is skipped and the request goes elsewhere, the second is a 504.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method};
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use spillway_config::UpstreamConfig;
use spillway_policy::Outcome;
use tower::ServiceExt;
use tracing::{debug, warn};

use crate::answer::Answer;
use crate::endpoint::Endpoint;
use crate::lines::Lines;
use crate::metrics::UpstreamFailure;
use crate::pool::idle::IdleConns;
use crate::pool::Backend;
use h1::Keep;

mod body;
pub(crate) mod h1;
pub(crate) mod hop;
pub(crate) use body::{StallLimited, UpstreamBody};
use h1::{Conn, Outgoing};

/// hyper-util's pooled client, for the gateway's own reads beside the request path (health
/// checks, engine metrics pages).
pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One attempt, as the attempt loop hands it to the upstream.
pub(crate) struct Attempt<'a> {
    pub endpoint: Endpoint,
    /// The caller's query string, if any ([`with_query`]).
    pub query: Option<&'a str>,
    /// The caller's request headers as they came but for spillway's own; those that cross are
    /// chosen as each attempt is written ([`hop::write_request_headers`]).
    pub headers: &'a Lines,
    /// Its span, whose `traceparent` goes upstream.
    pub trace: &'a crate::trace::Attempt,
    /// The body as this backend gets it (renamed model, priority field): the call's own, lent,
    /// or a copy made for it.
    pub body: Cow<'a, Bytes>,
    /// When the response head must have come.
    pub until: Instant,
}

/// Where attempts go: sends one attempt to one backend and returns the response head, or the
/// outcome of an attempt that got none. It never retries on its own account, but for a kept-alive
/// connection found closed before the request was read (see [`stale`]).
pub(crate) trait Upstream: Send + Sync {
    type Body: http_body::Body<Data = Bytes, Error: std::fmt::Display> + Send + Unpin + 'static;

    fn send(
        &self,
        backend: &Arc<Backend>,
        attempt: Attempt<'_>,
    ) -> impl Future<Output = Result<Answer<Self::Body>, Outcome>> + Send;
}

/// The upstream of production: HTTP/1 connections (TLS where the backend's URL says `https`),
/// kept alive per backend between requests ([`IdleConns`]).
pub(crate) struct HttpUpstream {
    /// For the background reads; requests go through `connector` and the backends' own
    /// connections.
    client: HttpClient,
    connector: HttpsConnector<HttpConnector>,
    keep: Keep,
    /// A response head later than this is a timeout, whatever the request's deadline.
    response_timeout: Duration,
    /// How long a backend that refused a connection is left out of new picks.
    unreachable_cooldown: Duration,
}

/// Why an exchange with a backend got no response head.
enum Failure {
    /// No connection could be made; `after_stale` when a kept-alive one was found closed first,
    /// so the request may have reached the backend as it went down.
    Connect { error: BoxError, after_stale: bool },
    /// The connection failed once the request was on it.
    Exchange(h1::Error),
    /// No response head came by the deadline (the connection being made counts too).
    TimedOut,
}

impl HttpUpstream {
    /// The client of the background reads.
    pub(crate) fn client(&self) -> &HttpClient {
        &self.client
    }

    pub(crate) fn new(upstream: &UpstreamConfig) -> Self {
        HttpUpstream {
            client: client(upstream),
            connector: connector(upstream),
            keep: Keep {
                max: upstream.pool_max_idle_per_host,
                idle_timeout: upstream.pool_idle_timeout,
            },
            response_timeout: upstream.response_timeout,
            unreachable_cooldown: upstream.unreachable_cooldown,
        }
    }

    /// Sends `req`, made at `now`, on a kept-alive connection of `backend`, or a new one, and
    /// reads its response head by `deadline`; once more on a new one when the kept-alive
    /// connection turns out to have been closed ([`stale`]).
    async fn exchange(
        &self,
        backend: &Backend,
        (now, deadline): (Instant, Instant),
        req: &Outgoing,
    ) -> Result<Answer<UpstreamBody>, Failure> {
        let deadline = tokio::time::Instant::from_std(deadline);
        let (mut conn, kept) = self.checkout(backend, now, deadline).await?;
        let error = match conn.send_until(req, deadline).await {
            Ok(head) => return Ok(self.relayed(head, conn, &backend.idle)),
            Err(h1::Error::TimedOut) => return Err(Failure::TimedOut),
            Err(e) => e,
        };
        if !(kept && stale(&error)) {
            return Err(Failure::Exchange(error));
        }
        // The kept connection was already closed: the backend never read the request.
        backend
            .metrics
            .upstream_failed(UpstreamFailure::StaleConnection);
        debug!(backend = %backend.name, "kept-alive connection was closed; sending again on a new one: {error}");
        let mut conn = self.connect(backend, true, deadline).await?;
        match conn.send_until(req, deadline).await {
            Ok(head) => Ok(self.relayed(head, conn, &backend.idle)),
            Err(h1::Error::TimedOut) => Err(Failure::TimedOut),
            Err(e) => Err(Failure::Exchange(e)),
        }
    }

    /// A connection to `backend` ready for a request made at `now`, and whether it was kept
    /// from an earlier one; a new one is given up at `deadline`.
    async fn checkout(
        &self,
        backend: &Backend,
        now: Instant,
        deadline: tokio::time::Instant,
    ) -> Result<(Conn, bool), Failure> {
        match backend.idle.take(now, self.keep) {
            Some(conn) => Ok((conn, true)),
            None => Ok((self.connect(backend, false, deadline).await?, false)),
        }
    }

    /// A new connection to `backend`, given up at `deadline`; `after_stale` when a kept-alive
    /// one was found closed first.
    async fn connect(
        &self,
        backend: &Backend,
        after_stale: bool,
        deadline: tokio::time::Instant,
    ) -> Result<Conn, Failure> {
        let connecting = self
            .connector
            .clone()
            .oneshot(backend.uri(Endpoint::ChatCompletions).clone());
        // Boxed: a connection is made rarely (they are kept) and its future is large.
        let stream = tokio::time::timeout_at(deadline, Box::pin(connecting))
            .await
            .map_err(|_| Failure::TimedOut)?
            .map_err(|error| Failure::Connect { error, after_stale })?;
        Ok(Conn::new(match stream {
            MaybeHttpsStream::Http(tcp) => Box::new(tcp.into_inner()),
            tls => Box::new(TokioIo::new(tls)),
        }))
    }

    /// The response of `head` with its connection, which goes back to `idle` when the body has
    /// been read.
    fn relayed(&self, head: h1::Head, conn: Conn, idle: &Arc<IdleConns>) -> Answer<UpstreamBody> {
        let body = UpstreamBody::new(conn, (head.framing, head.reusable), idle, self.keep);
        head.response.map(|()| body)
    }
}

impl Upstream for HttpUpstream {
    type Body = UpstreamBody;

    async fn send(
        &self,
        backend: &Arc<Backend>,
        attempt: Attempt<'_>,
    ) -> Result<Answer<UpstreamBody>, Outcome> {
        let req = request(
            backend,
            (attempt.endpoint, attempt.query),
            (attempt.headers, attempt.trace),
            attempt.body,
        );
        let sent = crate::clock::now();
        let timeout = self
            .response_timeout
            .min(attempt.until.saturating_duration_since(sent));
        match self
            .exchange(backend, (sent, after(sent, timeout)), &req)
            .await
        {
            Ok(response) => {
                backend
                    .metrics
                    .upstream_responded(crate::clock::since(sent));
                Ok(response)
            }
            Err(Failure::Connect { error, after_stale }) => {
                backend.metrics.upstream_failed(UpstreamFailure::Connect);
                warn!(backend = %backend.name, "cannot connect upstream: {error}");
                backend.skip_for(crate::clock::now(), self.unreachable_cooldown);
                if after_stale {
                    // The closed connection was the backend going down with the request on
                    // it, not a stale one: the request did reach it, so what follows is a
                    // retry like any other, drawn from the budget.
                    Err(Outcome::ResetBeforeResponse)
                } else {
                    Err(Outcome::ConnectFailed)
                }
            }
            Err(Failure::Exchange(e)) => {
                backend.metrics.upstream_failed(UpstreamFailure::Connection);
                warn!(backend = %backend.name, "upstream request failed: {e}");
                Err(Outcome::ResetBeforeResponse)
            }
            Err(Failure::TimedOut) => {
                backend.metrics.upstream_failed(UpstreamFailure::Timeout);
                warn!(backend = %backend.name, "no response within {timeout:?}");
                Err(Outcome::TimedOut)
            }
        }
    }
}

impl HttpUpstream {
    /// Sends a call on a stored resource (`uri`) to `backend` as it is, once: no retry, no
    /// second connection but for a closed kept-alive one. A head later than
    /// `upstream.response_timeout` is a 504.
    pub(crate) async fn forward(
        &self,
        backend: &Backend,
        method: Method,
        uri: http::Uri,
        headers: Lines,
        body: Bytes,
    ) -> Result<Answer<UpstreamBody>, crate::error::ApiError> {
        use crate::error::{ApiError, ErrorKind};
        let untraced = HeaderMap::new();
        let own = own_headers(backend, !body.is_empty(), &untraced);
        let req = Outgoing::new(
            method,
            uri.path_and_query().map_or("/", |p| p.as_str()),
            |lines| hop::write_request_headers(&headers, &own, |n, v| lines.header(n, v)),
            Cow::Owned(body),
        );
        let now = crate::clock::now();
        let exchange = self.exchange(backend, (now, after(now, self.response_timeout)), &req);
        let e: BoxError = match exchange.await {
            Ok(response) => return Ok(response),
            Err(Failure::Connect { error, .. }) => error,
            Err(Failure::Exchange(e)) => e.into(),
            Err(Failure::TimedOut) => {
                return Err(ApiError::new(
                    ErrorKind::UpstreamTimeout,
                    format!(
                        "the backend {:?} that has this response did not answer within {:?}",
                        &*backend.name, self.response_timeout
                    ),
                ))
            }
        };
        warn!(backend = %backend.name, "upstream request failed: {e}");
        Err(ApiError::new(
            ErrorKind::UpstreamUnavailable,
            format!(
                "the backend {:?} that has this response could not be reached",
                &*backend.name
            ),
        ))
    }
}

/// The URI of a resource under `base` (a backend's endpoint URI): `suffix` added to its path,
/// the caller's `query` after the backend's own ([`with_query`]).
pub(crate) fn resource_uri(
    base: &http::Uri,
    suffix: &str,
    query: Option<&str>,
) -> Option<http::Uri> {
    let mut parts = base.clone().into_parts();
    let path = format!("{}{suffix}", base.path());
    let path_and_query = match base.query() {
        Some(own) => format!("{path}?{own}"),
        None => path,
    };
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    let uri = http::Uri::from_parts(parts).ok()?;
    Some(match query {
        Some(q) => with_query(&uri, q).unwrap_or(uri),
        None => uri,
    })
}

/// The client of the gateway's background reads, from the `[upstream]` settings.
pub fn client(cfg: &UpstreamConfig) -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(cfg.pool_idle_timeout)
        .pool_max_idle_per_host(cfg.pool_max_idle_per_host)
        .http1_max_buf_size(h1::MAX_BUFFER)
        .build(connector(cfg))
}

/// Makes connections to backends: TCP with the connect timeout, TLS for `https` URLs.
fn connector(cfg: &UpstreamConfig) -> HttpsConnector<HttpConnector> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(cfg.connect_timeout));
    http.set_keepalive(Some(std::time::Duration::from_secs(60)));
    HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .wrap_connector(http)
}

/// Whether an upstream error is a kept-alive connection the backend had already closed: the
/// connection ended, closed or reset, before any byte of a response.
///
/// Servers close idle keep-alive connections when they please, and some (llama.cpp's server
/// among them) answer `Keep-Alive` yet close the connection after every streamed response. A
/// request written to such a connection in the moment before the client sees the close meets an
/// end of stream where the response should be: the backend never read it. It is sent again at
/// once on a new connection, outside the retry budget, and says nothing about the backend. A
/// backend that went down with the request on it ends the connection the same way; then the new
/// connection is refused, and the attempt counts as a failure after sending (a retry from the
/// budget), not as a refused connection.
/// `timeout` after `now`; past the clock's range, some thirty years after it (as tokio's
/// timers take a timeout too long to be a deadline).
fn after(now: Instant, timeout: Duration) -> Instant {
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400))
}

fn stale(error: &h1::Error) -> bool {
    error.before_response()
}

/// `uri` with the caller's `query` added: after the backend's own query (an Azure backend's
/// `api-version`), whose parameters win over the caller's of the same name. `None` when the
/// caller's query adds nothing or cannot be part of a URI.
pub(crate) fn with_query(uri: &http::Uri, query: &str) -> Option<http::Uri> {
    let own = uri.query();
    let own_names: Vec<&str> = own
        .into_iter()
        .flat_map(|q| q.split('&'))
        .map(|pair| pair.split('=').next().unwrap_or(pair))
        .collect();
    let added: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| !own_names.contains(&pair.split('=').next().unwrap_or(pair)))
        .collect();
    if added.is_empty() {
        return None;
    }
    let joined = own.into_iter().chain(added).collect::<Vec<_>>().join("&");
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(format!("{}?{joined}", uri.path()).parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

/// The response header that carries the backend's own id for a request, moved there from the
/// backend's `x-request-id` or `request-id` (the Anthropic API's), which name spillway's.
pub(crate) const X_UPSTREAM_REQUEST_ID: HeaderName =
    HeaderName::from_static("x-upstream-request-id");

/// Moves the backend's own request id to [`X_UPSTREAM_REQUEST_ID`], so the caller's
/// `x-request-id` (and the Messages API's `request-id`) can be spillway's without losing it.
pub(crate) fn keep_upstream_request_id(lines: &mut Lines) -> Option<HeaderValue> {
    let theirs = lines
        .value(&crate::call::X_REQUEST_ID)
        .or_else(|| lines.value(&crate::call::REQUEST_ID))?;
    lines.remove(&crate::call::X_REQUEST_ID);
    lines.remove(&crate::call::REQUEST_ID);
    lines.insert(X_UPSTREAM_REQUEST_ID, theirs.clone());
    Some(theirs)
}

/// The upstream request for `endpoint` on `backend`: `body`, the caller's `headers` that cross
/// ([`hop::write_request_headers`]) and the gateway's own ([`own_headers`]).
fn request(
    backend: &Backend,
    (endpoint, query): (Endpoint, Option<&str>),
    (headers, trace): (&Lines, &crate::trace::Attempt),
    body: Cow<'_, Bytes>,
) -> Outgoing {
    let queried = query.and_then(|q| with_query(backend.uri(endpoint), q));
    let target = queried.as_ref().unwrap_or(backend.target(endpoint));
    let mut traced = HeaderMap::new();
    trace.inject(&mut traced);
    let own = own_headers(backend, true, &traced);
    Outgoing::new(
        Method::POST,
        target.path_and_query().map_or("/", |p| p.as_str()),
        |lines| hop::write_request_headers(headers, &own, |n, v| lines.header(n, v)),
        body,
    )
}

static CONTENT_TYPE: HeaderName = header::CONTENT_TYPE;
static HOST: HeaderName = header::HOST;
static JSON: HeaderValue = HeaderValue::from_static("application/json");

/// The headers the gateway writes on a request to `backend`, in place of the caller's of the
/// same names: the JSON content type (`json`, with a body), the backend's `Host` (made once per
/// backend), its credential, and the attempt's trace context (`traced`). Its `Content-Length`
/// is the body's own (`h1::Outgoing`).
fn own_headers<'a>(
    backend: &'a Backend,
    json: bool,
    traced: &'a HeaderMap,
) -> smallvec::SmallVec<[(&'a HeaderName, &'a HeaderValue); 6]> {
    let mut own = smallvec::SmallVec::new();
    if json {
        own.push((&CONTENT_TYPE, &JSON));
    }
    if let Some(host) = &backend.host {
        own.push((&HOST, host));
    }
    if let Some((name, value)) = &backend.auth_header {
        own.push((name, value));
    }
    own.extend(traced);
    own
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_query_follows_the_backends_own_whose_names_win() {
        let plain: http::Uri = "http://b:8000/v1/responses".parse().unwrap();
        let q = with_query(&plain, "include[]=x&limit=2").unwrap();
        assert_eq!(
            q.to_string(),
            "http://b:8000/v1/responses?include[]=x&limit=2"
        );
        let azure: http::Uri = "https://r.openai.azure.com/openai/deployments/d/chat/completions?api-version=2024-10-21"
            .parse()
            .unwrap();
        let q = with_query(&azure, "api-version=1999-01-01&x=1").unwrap();
        assert_eq!(
            q.to_string(),
            "https://r.openai.azure.com/openai/deployments/d/chat/completions?api-version=2024-10-21&x=1"
        );
        assert_eq!(with_query(&azure, "api-version=1999-01-01"), None);
        assert_eq!(with_query(&plain, "&&"), None);
    }

    #[test]
    fn the_backends_request_id_is_kept_under_its_own_name() {
        let name = |n: &'static str| HeaderName::from_static(n);
        let mut h: Lines = [(name("request-id"), HeaderValue::from_static("req_upstream"))]
            .into_iter()
            .collect();
        assert_eq!(keep_upstream_request_id(&mut h).unwrap(), "req_upstream");
        assert_eq!(h.get(&X_UPSTREAM_REQUEST_ID), Some(&b"req_upstream"[..]));
        assert_eq!(h.get(&name("request-id")), None);
        assert_eq!(keep_upstream_request_id(&mut Lines::default()), None);

        // Both: the `x-request-id` is the one kept, and neither is left.
        let mut h: Lines = [
            (name("request-id"), HeaderValue::from_static("second")),
            (name("x-request-id"), HeaderValue::from_static("first")),
        ]
        .into_iter()
        .collect();
        assert_eq!(keep_upstream_request_id(&mut h).unwrap(), "first");
        assert_eq!(h.get(&X_UPSTREAM_REQUEST_ID), Some(&b"first"[..]));
        assert_eq!(h.iter().count(), 1);
    }
}
