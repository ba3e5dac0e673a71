//! The upstream side: one pooled HTTP client for every backend, and how a client request becomes
//! an upstream request.
//!
//! Connections are kept alive and reused (an LLM gateway that opens a connection per request
//! spends its CPU on handshakes and can run out of ephemeral ports under load). The connect
//! timeout is short and separate from the response timeout, so an unreachable backend is told
//! apart from a slow one: the first is skipped and the request goes elsewhere, the second is a 504.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request};
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use spillway_config::UpstreamConfig;

use crate::pool::{Backend, Endpoint};

pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Builds the shared upstream client from the `[upstream]` settings.
pub fn client(cfg: &UpstreamConfig) -> HttpClient {
    build(cfg, cfg.pool_max_idle_per_host)
}

/// A client that keeps no connection for reuse: every request it sends opens its own. Used to
/// resend a request whose pooled connection turned out to be closed (see [`is_stale_connection`]).
pub fn fresh_client(cfg: &UpstreamConfig) -> HttpClient {
    build(cfg, 0)
}

/// Whether an upstream error is a kept-alive connection the backend had already closed: the
/// connection ended before any byte of a response, with no error of its own.
///
/// Servers close idle keep-alive connections when they please, and some (llama.cpp's server
/// among them) answer `Keep-Alive` yet close the connection after every streamed response. A
/// request written to such a connection in the moment before the client sees the close meets an
/// end of stream where the response should be: the backend never read it. It is sent again at
/// once on a new connection, outside the retry budget, and says nothing about the backend. A
/// backend that went down with the request on it ends the connection the same way; then the new
/// connection is refused, and the attempt counts as a failure after sending (a retry from the
/// budget), not as a refused connection.
pub fn is_stale_connection(error: &hyper_util::client::legacy::Error) -> bool {
    if error.is_connect() {
        return false;
    }
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        if let Some(hyper) = e.downcast_ref::<hyper::Error>() {
            return hyper.is_incomplete_message();
        }
        source = e.source();
    }
    false
}

fn build(cfg: &UpstreamConfig, max_idle_per_host: usize) -> HttpClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(cfg.connect_timeout));
    http.set_keepalive(Some(std::time::Duration::from_secs(60)));
    let connector = HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(cfg.pool_idle_timeout)
        .pool_max_idle_per_host(max_idle_per_host)
        .build(connector)
}

/// Request headers that never travel upstream: hop-by-hop headers, the caller's own credentials
/// (the upstream gets the backend's key instead), and framing the client recomputes.
fn is_stripped_request_header(name: &header::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "authorization"
            | "api-key"
            | "host"
            | "content-length"
            | "connection"
            | "keep-alive"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "cookie"
    )
}

/// Removes the hop-by-hop headers of an upstream response before it is relayed.
pub fn strip_response_headers(headers: &mut HeaderMap) {
    for name in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// The upstream request for `endpoint` on `backend`, carrying `body` and the client's headers
/// minus those that must not cross.
pub fn request(
    backend: &Backend,
    endpoint: Endpoint,
    client_headers: &HeaderMap,
    skip_header: &header::HeaderName,
    body: Bytes,
) -> Request<Full<Bytes>> {
    let length = body.len();
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = backend.uri(endpoint).clone();
    let headers = req.headers_mut();
    headers.reserve(client_headers.len() + 2);
    for (name, value) in client_headers {
        if !is_stripped_request_header(name) && name != skip_header {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    if let Some((name, value)) = &backend.auth_header {
        headers.insert(name.clone(), value.clone());
    }
    req
}
