//! The replay's HTTP client: plain HTTP/1.1 over pooled keep-alive connections, one deadline
//! per exchange.
//!
//! The load client must behave like the callers of an incident, so it is deliberately bare:
//! it follows no redirects, reads no `Retry-After`, keeps no state between requests. Each
//! exchange (connect, request, whole response body) runs under one timeout so that no request
//! can hold a replay past its schedule, and its failure is classified the way a naive caller
//! sees it: a status, a refused connection, a connection that broke, or a timeout.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Time to open a TCP connection on loopback; a gateway that cannot accept in this time is
/// overloaded, which the caller sees as a connection error.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A pooled HTTP/1.1 client. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub(crate) struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
}

/// Why an exchange produced no status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Failure {
    /// The connection could not be opened.
    Connect,
    /// The connection broke before a whole response arrived.
    Connection,
    /// The exchange did not finish within its timeout.
    Timeout,
}

impl Failure {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::Connection => "connection",
            Failure::Timeout => "timeout",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Failure::Connect => "connection refused or not opened in time",
            Failure::Connection => "connection broke before the whole response",
            Failure::Timeout => "no whole response in time",
        })
    }
}

impl HttpClient {
    /// A client keeping at most `max_idle` idle connections per host.
    pub(crate) fn new(max_idle: usize) -> HttpClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let inner = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(max_idle)
            .build(connector);
        HttpClient { inner }
    }

    /// Sends one request and reads the whole response body, all within `timeout`.
    pub(crate) async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), Failure> {
        let exchange = async {
            let response = self.inner.request(request).await.map_err(|e| {
                if e.is_connect() {
                    Failure::Connect
                } else {
                    Failure::Connection
                }
            })?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|_| Failure::Connection)?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(Failure::Timeout))
    }

    pub(crate) async fn get(
        &self,
        uri: Uri,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), Failure> {
        self.exchange(request(Method::GET, uri, None, Bytes::new()), timeout)
            .await
    }

    pub(crate) async fn patch_json(
        &self,
        uri: Uri,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), Failure> {
        let body = Bytes::from(body.to_string());
        self.exchange(request(Method::PATCH, uri, None, body), timeout)
            .await
    }
}

/// A request with a JSON body (when not empty) and, if given, an `Authorization` value.
pub(crate) fn request(
    method: Method,
    uri: Uri,
    authorization: Option<&HeaderValue>,
    body: Bytes,
) -> Request<Full<Bytes>> {
    let json = !body.is_empty();
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    if let Some(value) = authorization {
        headers.insert(http::header::AUTHORIZATION, value.clone());
    }
    if json {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    request
}

/// `http://ADDR/PATH` as a URI; `path` must start with `/`.
pub(crate) fn uri(addr: std::net::SocketAddr, path: &str) -> Uri {
    Uri::builder()
        .scheme("http")
        .authority(addr.to_string())
        .path_and_query(path)
        .build()
        .expect("a socket address and an absolute path form a valid URI")
}
