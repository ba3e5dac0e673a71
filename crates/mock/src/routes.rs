//! The URL map: OpenAI `/v1` paths, Azure OpenAI deployment paths, vLLM's `/metrics`, and the
//! mock's own `/health`, `/stats` and `/control`.
//!
//! Azure paths name the model in the URL (`/openai/deployments/{deployment}/...`) and require
//! `?api-version=`; they serve the same handlers so a gateway's Azure backend kind can be tested
//! against the same server as its OpenAI kind.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::api::{self, authorize};
use crate::control;
use crate::error::ApiError;
use crate::metrics;
use crate::request::Endpoint;
use crate::{MockServer, MockStats};

/// Every route of the mock server.
pub(crate) fn router(server: MockServer) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route(
            "/openai/deployments/{deployment}/chat/completions",
            post(azure_chat),
        )
        .route(
            "/openai/deployments/{deployment}/completions",
            post(azure_completions),
        )
        .route(
            "/openai/deployments/{deployment}/embeddings",
            post(azure_embeddings),
        )
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics::metrics))
        .route("/stats", get(stats))
        .route("/stats/reset", post(reset_stats))
        .route(
            "/control",
            get(control::get_profile)
                .put(control::put_profile)
                .patch(control::patch_profile),
        )
        .fallback(|| async { ApiError::route_not_found() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .with_state(server)
}

async fn chat(State(s): State<MockServer>, req: Request) -> Response {
    api::infer(s, Endpoint::Chat, None, req).await
}

async fn completions(State(s): State<MockServer>, req: Request) -> Response {
    api::infer(s, Endpoint::Completions, None, req).await
}

async fn embeddings(State(s): State<MockServer>, req: Request) -> Response {
    api::infer(s, Endpoint::Embeddings, None, req).await
}

type Deployment = Result<Path<String>, PathRejection>;

async fn azure_chat(State(s): State<MockServer>, d: Deployment, req: Request) -> Response {
    azure(s, Endpoint::Chat, d, req).await
}

async fn azure_completions(State(s): State<MockServer>, d: Deployment, req: Request) -> Response {
    azure(s, Endpoint::Completions, d, req).await
}

async fn azure_embeddings(State(s): State<MockServer>, d: Deployment, req: Request) -> Response {
    azure(s, Endpoint::Embeddings, d, req).await
}

async fn azure(server: MockServer, endpoint: Endpoint, d: Deployment, req: Request) -> Response {
    match d {
        Ok(Path(deployment)) => api::infer(server, endpoint, Some(deployment), req).await,
        Err(e) => ApiError::invalid("invalid_deployment", e.body_text()).into_response(),
    }
}

/// The profile's models in the OpenAI list shape.
async fn models(State(server): State<MockServer>, headers: http::HeaderMap) -> Response {
    let live = server.live();
    if let Err(e) = authorize(&live, &headers) {
        return e.into_response();
    }
    let data: Vec<_> = live
        .profile
        .models
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "spillway-mock"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn stats(State(server): State<MockServer>) -> Json<MockStats> {
    Json(server.stats())
}

/// Zeroes the counters and answers with the (zeroed) stats.
async fn reset_stats(State(server): State<MockServer>) -> Json<MockStats> {
    server.reset_stats();
    Json(server.stats())
}
