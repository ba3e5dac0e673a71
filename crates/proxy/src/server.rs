//! The gateway process: listeners, routes, in-process mock backends, readiness and shutdown.
//!
//! Two listeners, never one: the main listener serves the OpenAI API and the probes; the admin
//! listener serves metrics (and later the admin API), so operators can firewall it apart and a
//! flood on the API cannot hide the gateway's own view of itself.
//!
//! Probes are local by construction: `/livez` answers from the process alone and `/readyz` from
//! an in-memory flag, so no remote dependency can make an orchestrator restart healthy gateways.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::future::Either;
use http::StatusCode;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::changes::Startup;
use crate::endpoint::{Dialect, Endpoint};
use crate::error::{ApiError, ErrorKind};
use crate::gateway::{Gateway, StartError};
use crate::handler;
use crate::lines::Lines;
use crate::mocks::MockFleet;

/// How long the spans still queued at shutdown may take to be exported.
const TRACE_FLUSH: Duration = Duration::from_secs(5);

/// A gateway whose listeners are bound and whose mock backends run, ready to serve.
pub struct BoundGateway {
    gateway: Arc<Gateway>,
    metrics: crate::histograms::MetricsHandle,
    listener: TcpListener,
    admin_listener: TcpListener,
    warm_batch: u32,
    warm_max_keys: u64,
    /// `SIGHUP`, taken over before the gateway says it listens: it reloads the config.
    hangups: tokio::signal::unix::Signal,
}

impl BoundGateway {
    /// Binds both listeners, starts in-process mock backends and builds the request path.
    pub async fn bind(startup: Startup) -> Result<Self, StartError> {
        let config = startup.config();
        let hangups = crate::reload::hangups()?;
        let listener = bind(config.server.listen).await?;
        let admin_listener = bind(config.server.admin_listen).await?;
        let mocks = MockFleet::default()
            .plan(&config)
            .await
            .map_err(|e| StartError::Setup(format!("mock backends: {e}")))?;
        let gateway = Arc::new(Gateway::build(startup, mocks).await?);
        Ok(Self {
            gateway,
            metrics: crate::page::recorder(),
            listener,
            admin_listener,
            warm_batch: config.cache.warm_batch,
            warm_max_keys: config.cache.warm_max_keys,
            hangups,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener
            .local_addr()
            .expect("bound listener has an address")
    }

    /// Serves until `shutdown` resolves; then turns readiness off, keeps accepting for
    /// `shutdown_delay` (so load balancers see `/readyz` fail before connections are refused),
    /// stops accepting, and lets in-flight requests and streams finish for up to `shutdown_grace`.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let gw = self.gateway;
        let started = gw.live();
        let server = started.config.server.clone();
        let (stop_tx, stop_rx) = watch::channel(false);
        let main = Api {
            gw: gw.clone(),
            router: api_router(gw.clone()),
        };
        let admin_metrics = self.metrics;
        let admin = admin_router(
            AdminState {
                gateway: gw.clone(),
                metrics: admin_metrics.clone(),
            },
            self.admin_listener.local_addr()?,
        );
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let admin_connections = Arc::new(crate::connections::Connections::new(
            &server,
            server.admin_max_connections,
            "admin",
        ));
        let main_server =
            gw.connections
                .clone()
                .serve(self.listener, main, stopped(stop_rx.clone()));
        let admin_server =
            admin_connections.serve(self.admin_listener, admin, stopped(stop_rx.clone()));
        let main_task = tokio::spawn(main_server);
        let admin_task = tokio::spawn(admin_server);
        started.spawn_tasks(gw.upstream.client());
        drop(started);
        crate::reload::spawn_tasks(&gw, self.hangups, &stop_rx);
        let judge = gw.clone();
        let judge_task = tokio::spawn(async move { crate::rollout::judge(&judge.rollouts).await });
        let watched = gw.clone();
        let anomalies = gw.changes.anomaly_counter();
        let anomaly_task = tokio::spawn(crate::anomaly::watch(move || watched.live(), anomalies));
        let warm = gw.tenants.clone();
        let (batch, max_keys) = (self.warm_batch, self.warm_max_keys);
        let warm_task = tokio::spawn(async move {
            match warm.cache().warm_from_store(batch, max_keys).await {
                Ok(n) => info!(keys = n, "key cache warmed from the store"),
                Err(e) => warn!("key cache not warmed from the store: {e}"),
            }
        });
        gw.ready.store(true, Ordering::Release);

        shutdown.await;
        warm_task.abort();
        match gw.tenants.cache().save_snapshot().await {
            Ok(n) if n > 0 => info!(entries = n, "key cache snapshot saved"),
            Ok(_) => {}
            Err(e) => warn!("key cache snapshot not saved: {e}"),
        }
        gw.ready.store(false, Ordering::Release);
        // The config in place at shutdown says how long to wait.
        let (delay, grace) = {
            let live = gw.live();
            (
                live.config.server.shutdown_delay,
                live.config.server.shutdown_grace,
            )
        };
        if !delay.is_zero() {
            info!(delay = ?delay, "shutting down: readiness off, still accepting for the delay");
            tokio::time::sleep(delay).await;
        }
        info!(grace = ?grace, "shutting down: no new connections, draining in-flight requests");
        let _ = stop_tx.send(true);
        let drained = tokio::time::timeout(grace, async {
            let main = main_task.await;
            let admin = admin_task.await;
            (main, admin)
        })
        .await;
        judge_task.abort();
        anomaly_task.abort();
        gw.live().retire();
        gw.mocks.stop_all();
        // The spans of the last requests, exported (the exporter waits on its own thread).
        let traced = gw.clone();
        let _ = tokio::task::spawn_blocking(move || traced.tracing.shutdown(TRACE_FLUSH)).await;
        match drained {
            Ok((main, _)) => main.map_err(std::io::Error::other),
            Err(_) => {
                warn!("shutdown grace of {grace:?} ran out; dropping the requests still in flight");
                Ok(())
            }
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

/// The API listener's service: the inference routes (each a `POST` to a fixed path) go straight
/// to their handler, everything else through the router. The router would answer them the same
/// way; this skips its per-request work (route lookup, boxed services and futures, extractors)
/// on the path every inference request takes.
#[derive(Clone)]
struct Api {
    gw: Arc<Gateway>,
    router: Router,
}

impl crate::connections::Serve for Api {
    /// The handler's own future, not one awaiting it: the connection makes it in place, where a
    /// future around it would take a copy of it.
    fn serve<'a>(
        &'a self,
        head: &'a http::Request<()>,
        body: axum::body::Body,
        lines: Lines,
    ) -> impl Future<Output = crate::answer::Answer> + Send + 'a {
        let direct = if head.method() == http::Method::POST {
            Endpoint::of_inference_path(head.uri().path())
        } else {
            None
        };
        match direct {
            Some(endpoint) => {
                let query = head.uri().query();
                Either::Left(handler::handle(&self.gw, endpoint, query, body, lines))
            }
            None => Either::Right(self.router.serve(head, body, lines)),
        }
    }
}

fn api_router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            handler::inference(Endpoint::ChatCompletions).get(handler::stored::list),
        )
        .route(
            "/v1/chat/completions/{id}",
            get(handler::stored::get)
                .post(handler::stored::update)
                .delete(handler::stored::delete),
        )
        .route(
            "/v1/chat/completions/{id}/messages",
            get(handler::stored::messages),
        )
        .route("/v1/completions", handler::inference(Endpoint::Completions))
        .route("/v1/embeddings", handler::inference(Endpoint::Embeddings))
        .route("/v1/responses", handler::inference(Endpoint::Responses))
        .route(
            "/v1/responses/compact",
            handler::inference(Endpoint::ResponsesCompact),
        )
        .route(
            "/v1/responses/{id}",
            get(handler::lifecycle::get).delete(handler::lifecycle::delete),
        )
        .route(
            "/v1/responses/{id}/cancel",
            post(handler::lifecycle::cancel),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(handler::lifecycle::input_items),
        )
        .route("/v1/messages", handler::inference(Endpoint::Messages))
        .route(
            "/v1/messages/count_tokens",
            handler::inference(Endpoint::CountTokens),
        )
        .route("/v1/models", get(crate::models::list))
        .route("/v1/models/{id}", get(crate::models::one))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .fallback(|uri: http::Uri| async move {
            handler::counted(
                ApiError::new(ErrorKind::RouteNotFound, "no such endpoint"),
                Dialect::of_path(uri.path()),
            )
        })
        .method_not_allowed_fallback(|uri: http::Uri| async move {
            handler::counted(
                ApiError::new(
                    ErrorKind::MethodNotAllowed,
                    "method not allowed on this endpoint",
                ),
                Dialect::of_path(uri.path()),
            )
        })
        .with_state(gw)
}

async fn readyz(State(gw): State<Arc<Gateway>>) -> Response {
    // Local state only: the listener is up and the key cache is warm (a snapshot or the store
    // answered once since start). Never a query to the store from here (IL-0136).
    if gw.ready.load(Ordering::Acquire) && gw.tenants.cache().is_warm() {
        "ready".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

#[derive(Clone)]
struct AdminState {
    gateway: Arc<Gateway>,
    metrics: crate::histograms::MetricsHandle,
}

fn admin_router(state: AdminState, admin_addr: SocketAddr) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(s): State<AdminState>| async move {
                (
                    [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    crate::page::render(&s.metrics, &s.gateway),
                )
            }),
        )
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(s): State<AdminState>| async move { readyz(State(s.gateway)).await }),
        )
        .route(
            "/healthz/deps",
            get(|State(s): State<AdminState>| async move {
                crate::admin::deps(&s.gateway.tenants).await
            }),
        )
        .fallback(|| async { ApiError::new(ErrorKind::RouteNotFound, "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorKind::MethodNotAllowed,
                "method not allowed on this endpoint",
            )
        })
        .with_state(state.clone())
        .merge(crate::admin::router(
            crate::admin::AdminApi {
                store: state.gateway.tenants.store().clone(),
                directory: state.gateway.tenants.clone(),
                token: state.gateway.admin_token,
            },
            crate::reload::routes(state.gateway.clone())
                .merge(crate::rollout::routes(state.gateway.rollouts.clone())),
        ))
        .merge(crate::top::routes(state.gateway.clone(), admin_addr))
        .layer(middleware::map_response(json_errors))
}

/// The longest text of an extractor's rejection taken into a JSON error's message.
const MAX_REJECTION_TEXT: usize = 1024;

/// Gives an error answered in plain text (axum's extractors reject a body too large, of the
/// wrong type or not JSON that way) the API's JSON shape, with its text as the message.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let kind = match status {
        StatusCode::PAYLOAD_TOO_LARGE => ErrorKind::BodyTooLarge,
        StatusCode::METHOD_NOT_ALLOWED => ErrorKind::MethodNotAllowed,
        StatusCode::NOT_FOUND => ErrorKind::RouteNotFound,
        s if s.is_server_error() => ErrorKind::Internal,
        _ => ErrorKind::MalformedRequest,
    };
    let (head, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_REJECTION_TEXT)
        .await
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_owned());
    let mut answer = ApiError::new(kind, text).into_response();
    // The status stays what the extractor said (a 415 or a 422 is more precise than a 400).
    *answer.status_mut() = status;
    for (name, value) in &head.headers {
        if name != http::header::CONTENT_TYPE && name != http::header::CONTENT_LENGTH {
            answer.headers_mut().insert(name, value.clone());
        }
    }
    answer
}
