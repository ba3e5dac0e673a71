//! The URL map: OpenAI `/v1` paths, Anthropic's Messages paths, Azure OpenAI deployment paths,
//! vLLM's `/metrics`, and the mock's own `/health`, `/stats` and `/control`.
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/embeddings`: OpenAI's
//!   inference endpoints; `GET /v1/models`: the profile's models.
//! - `POST /v1/responses`: the OpenAI Responses API's create, which stores the response unless
//!   told not to; `POST /v1/responses/compact`: its compaction. Both are inference requests.
//! - `GET`/`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`, `GET
//!   /v1/responses/{id}/input_items`: the responses this server stored (`lifecycle.rs`).
//! - `GET /v1/chat/completions` (the list), `GET`/`POST`/`DELETE /v1/chat/completions/{id}`
//!   (retrieve, update the metadata, delete), `GET /v1/chat/completions/{id}/messages`: the
//!   chat completions stored with `store: true` (`chats.rs`, served by `lifecycle.rs`).
//! - `POST /v1/messages`, `POST /v1/messages/count_tokens`: the Anthropic Messages API, whose
//!   answers (errors included, and those of unknown paths or methods under `/v1/messages`)
//!   follow Anthropic's conventions.
//! - `POST /openai/deployments/{deployment}/{chat/completions,completions,embeddings}`: Azure
//!   paths, which name the model in the URL and require `?api-version=`; they serve the same
//!   handlers so a gateway's Azure backend kind can be tested against the same server as its
//!   OpenAI kind (a chat stored from one is read under `/v1`).
//! - `GET /metrics` (vLLM's load), `GET /health`, `GET /stats`, `POST /stats/reset`, and
//!   `GET`/`PUT`/`PATCH /control` (the profile).
//!
//! Every inference endpoint is served by the one pipeline in `api.rs`; the routes of stored
//! responses and chat completions share its first steps (counting, faults, the key) and then
//! answer at once.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::Uri;
use serde_json::json;

use crate::api::{self, authorize};
use crate::control;
use crate::error::{ApiError, Dialect};
use crate::lifecycle::{self, Action, StoredId};
use crate::metrics;
use crate::request::{Endpoint, Surface};
use crate::{MockServer, MockStats};

/// Every route of the mock server.
pub(crate) fn router(server: MockServer) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat).get(list_chats))
        .route(
            "/v1/chat/completions/{id}",
            get(retrieve_chat).post(update_chat).delete(delete_chat),
        )
        .route("/v1/chat/completions/{id}/messages", get(chat_messages))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/responses", post(responses))
        .route("/v1/responses/compact", post(compact))
        .route(
            "/v1/responses/{id}",
            get(retrieve_response).delete(delete_response),
        )
        .route("/v1/responses/{id}/cancel", post(cancel_response))
        .route("/v1/responses/{id}/input_items", get(input_items))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
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
        .fallback(|uri: Uri| async move {
            Dialect::of_path(uri.path()).answer(ApiError::route_not_found())
        })
        .method_not_allowed_fallback(|uri: Uri| async move {
            Dialect::of_path(uri.path()).answer(ApiError::method_not_allowed())
        })
        .with_state(server)
}

const CHAT: Endpoint = Endpoint::Generate(Surface::Chat);
const COMPLETIONS: Endpoint = Endpoint::Generate(Surface::Completions);

async fn chat(State(s): State<MockServer>, req: Request) -> Response {
    api::infer(s, CHAT, None, req).await
}

async fn completions(State(s): State<MockServer>, req: Request) -> Response {
    api::infer(s, COMPLETIONS, None, req).await
}

async fn embeddings(State(s): State<MockServer>, req: Request) -> Response {
    api::infer(s, Endpoint::Embeddings, None, req).await
}

async fn responses(State(s): State<MockServer>, req: Request) -> Response {
    api::infer(s, Endpoint::Generate(Surface::Responses), None, req).await
}

async fn compact(State(s): State<MockServer>, req: Request) -> Response {
    api::infer(s, Endpoint::Compact, None, req).await
}

async fn retrieve_response(State(s): State<MockServer>, id: StoredId, req: Request) -> Response {
    lifecycle::serve(s, Action::Retrieve, Some(id), req).await
}

async fn delete_response(State(s): State<MockServer>, id: StoredId, req: Request) -> Response {
    lifecycle::serve(s, Action::Delete, Some(id), req).await
}

async fn cancel_response(State(s): State<MockServer>, id: StoredId, req: Request) -> Response {
    lifecycle::serve(s, Action::Cancel, Some(id), req).await
}

async fn input_items(State(s): State<MockServer>, id: StoredId, req: Request) -> Response {
    lifecycle::serve(s, Action::InputItems, Some(id), req).await
}

async fn list_chats(State(s): State<MockServer>, req: Request) -> Response {
    lifecycle::serve(s, Action::ListChats, None, req).await
}

async fn retrieve_chat(State(s): State<MockServer>, id: StoredId, req: Request) -> Response {
    lifecycle::serve(s, Action::RetrieveChat, Some(id), req).await
}

async fn update_chat(State(s): State<MockServer>, id: StoredId, req: Request) -> Response {
    lifecycle::serve(s, Action::UpdateChat, Some(id), req).await
}

async fn delete_chat(State(s): State<MockServer>, id: StoredId, req: Request) -> Response {
    lifecycle::serve(s, Action::DeleteChat, Some(id), req).await
}

async fn chat_messages(State(s): State<MockServer>, id: StoredId, req: Request) -> Response {
    lifecycle::serve(s, Action::ChatMessages, Some(id), req).await
}

async fn messages(State(s): State<MockServer>, req: Request) -> Response {
    api::infer(s, Endpoint::Generate(Surface::Messages), None, req).await
}

async fn count_tokens(State(s): State<MockServer>, req: Request) -> Response {
    api::infer(s, Endpoint::CountTokens, None, req).await
}

type Deployment = Result<Path<String>, PathRejection>;

async fn azure_chat(State(s): State<MockServer>, d: Deployment, req: Request) -> Response {
    azure(s, CHAT, d, req).await
}

async fn azure_completions(State(s): State<MockServer>, d: Deployment, req: Request) -> Response {
    azure(s, COMPLETIONS, d, req).await
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
