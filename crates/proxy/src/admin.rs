//! The admin API on the admin listener: tenants and keys in the store, and the lookup cache.
//!
//! Every route but `/metrics`, `/livez` and `/healthz/deps` needs `Authorization: Bearer TOKEN`
//! with the token from the environment variable named by `admin.token_env`; without that
//! variable the admin API is off (404 `admin_api_disabled`). The token is compared by digest,
//! in constant time, and never logged. A key's secret appears once, in the response that
//! creates it.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::StatusCode;
use serde::Deserialize;
use spillway_store::{Priority, Store, StoreError, TenantSpec, TenantUpdate};

use crate::error::{ApiError, ErrorKind};
use crate::tenants::StoreDirectory;

/// Largest admin request body.
const MAX_ADMIN_BODY: usize = 64 * 1024;

#[derive(Clone)]
pub(crate) struct AdminApi {
    pub store: Arc<dyn Store>,
    pub directory: Arc<StoreDirectory>,
    /// SHA-256 of the admin token; `None`: the admin API is off.
    pub token: Option<[u8; 32]>,
}

pub(crate) fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound(what) => {
            ApiError::new(ErrorKind::NotFound, format!("{what} not found"))
        }
        StoreError::Conflict(what) => {
            ApiError::new(ErrorKind::Conflict, format!("{what} already exists"))
        }
        StoreError::Invalid(why) => ApiError::new(ErrorKind::MalformedRequest, why),
        StoreError::Unavailable(why) => {
            tracing::warn!("store unavailable: {why}");
            ApiError::new(
                ErrorKind::StoreUnavailable,
                "the tenant store cannot be reached",
            )
            .retry_after(std::time::Duration::from_secs(1))
        }
    }
}

/// The routes under `/admin`, and `more` of them, behind the token check.
pub(crate) fn router(api: AdminApi, more: Router) -> Router {
    Router::new()
        .route("/admin/tenants", get(list_tenants).post(create_tenant))
        .route(
            "/admin/tenants/{name}",
            get(show_tenant).patch(update_tenant),
        )
        .route("/admin/tenants/{name}/disable", post(disable_tenant))
        .route(
            "/admin/tenants/{name}/keys",
            get(list_keys).post(create_key),
        )
        .route("/admin/keys/{id}/revoke", post(revoke_key))
        .route("/admin/cache/flush", post(flush_cache))
        .with_state(api.clone())
        .merge(more)
        .layer(middleware::from_fn_with_state(api, require_token))
        .layer(DefaultBodyLimit::max(MAX_ADMIN_BODY))
}

async fn require_token(State(api): State<AdminApi>, req: Request, next: Next) -> Response {
    let Some(expected) = api.token else {
        return ApiError::new(
            ErrorKind::AdminDisabled,
            "the admin API is off: set the admin token's environment variable (admin.token_env)",
        )
        .into_response();
    };
    if !presents_token(req.headers(), &expected) {
        return ApiError::new(ErrorKind::AdminUnauthorized, "missing or wrong admin token")
            .into_response();
    }
    next.run(req).await
}

/// Whether `headers` carry `Authorization: Bearer TOKEN` with the token whose digest is
/// `expected`.
pub(crate) fn presents_token(headers: &http::HeaderMap, expected: &[u8; 32]) -> bool {
    let presented = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| spillway_config::key_digest(t.trim()));
    // Compare digests without an early exit, so timing says nothing about the token.
    presented.is_some_and(|d| {
        d.iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    })
}

/// A tenant as the admin API takes it: only `name` is required.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewTenant {
    pub name: String,
    pub requests_per_min: Option<u32>,
    pub tokens_per_min: Option<u32>,
    pub max_concurrency: Option<u32>,
    #[serde(default)]
    pub priority: Priority,
    pub allowed_models: Option<Vec<String>>,
    pub pool: Option<String>,
    pub default_model: Option<String>,
    pub enabled: Option<bool>,
}

impl From<NewTenant> for TenantSpec {
    fn from(t: NewTenant) -> Self {
        TenantSpec {
            name: t.name,
            requests_per_min: t.requests_per_min,
            tokens_per_min: t.tokens_per_min,
            max_concurrency: t.max_concurrency,
            priority: t.priority,
            allowed_models: t.allowed_models,
            pool: t.pool,
            default_model: t.default_model,
            enabled: t.enabled.unwrap_or(true),
        }
    }
}

/// A partial change of a tenant as the admin API takes it: a field left out stays as it is, a
/// `null` clears an optional one (a limit becomes no limit, the model list every model, the pool
/// and the default model none), and a field the API does not know is refused rather than ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantPatch {
    #[serde(default, deserialize_with = "present")]
    requests_per_min: Option<Option<u32>>,
    #[serde(default, deserialize_with = "present")]
    tokens_per_min: Option<Option<u32>>,
    #[serde(default, deserialize_with = "present")]
    max_concurrency: Option<Option<u32>>,
    #[serde(default, deserialize_with = "not_null")]
    priority: Option<Priority>,
    #[serde(default, deserialize_with = "present")]
    allowed_models: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "present")]
    pool: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    default_model: Option<Option<String>>,
    #[serde(default, deserialize_with = "not_null")]
    enabled: Option<bool>,
}

impl From<TenantPatch> for TenantUpdate {
    fn from(p: TenantPatch) -> Self {
        TenantUpdate {
            requests_per_min: p.requests_per_min,
            tokens_per_min: p.tokens_per_min,
            max_concurrency: p.max_concurrency,
            priority: p.priority,
            allowed_models: p.allowed_models,
            pool: p.pool,
            default_model: p.default_model,
            enabled: p.enabled,
        }
    }
}

/// A field that is there, `null` included (`Some(None)`); serde's default for a missing one
/// gives `None`. Plain `Option<Option<T>>` would read `null` as missing.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// A field that cannot be cleared: `null` is a type error that names what is expected.
fn not_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            ErrorKind::MalformedRequest,
            format!("invalid JSON body: {e}"),
        )
    })
}

async fn list_tenants(State(api): State<AdminApi>) -> Result<Response, ApiError> {
    let tenants = api.store.list_tenants().await.map_err(store_error)?;
    Ok(Json(serde_json::json!({ "object": "list", "data": tenants })).into_response())
}

async fn create_tenant(
    State(api): State<AdminApi>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let spec: TenantSpec = json_body::<NewTenant>(&body)?.into();
    let tenant = api.store.create_tenant(&spec).await.map_err(store_error)?;
    Ok((StatusCode::CREATED, Json(tenant)).into_response())
}

async fn show_tenant(
    State(api): State<AdminApi>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    match api.store.get_tenant(&name).await.map_err(store_error)? {
        Some(t) => Ok(Json(t).into_response()),
        None => Err(store_error(StoreError::NotFound(format!(
            "tenant {name:?}"
        )))),
    }
}

async fn update_tenant(
    State(api): State<AdminApi>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let patch: TenantPatch = json_body(&body)?;
    apply(&api, &name, &patch.into()).await
}

async fn disable_tenant(
    State(api): State<AdminApi>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let update = TenantUpdate {
        enabled: Some(false),
        ..TenantUpdate::default()
    };
    apply(&api, &name, &update).await
}

/// Updates a tenant and forgets its keys' cached lookups, so the change holds here at once.
async fn apply(api: &AdminApi, name: &str, update: &TenantUpdate) -> Result<Response, ApiError> {
    let tenant = api
        .store
        .update_tenant(name, update)
        .await
        .map_err(store_error)?;
    api.directory.tenant_changed(name);
    Ok(Json(tenant).into_response())
}

async fn list_keys(
    State(api): State<AdminApi>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let keys = api.store.list_keys(&name).await.map_err(store_error)?;
    Ok(Json(serde_json::json!({ "object": "list", "data": keys })).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewKey {
    description: Option<String>,
    /// Unix seconds.
    expires_at: Option<i64>,
}

async fn create_key(
    State(api): State<AdminApi>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let new: NewKey = if body.is_empty() {
        NewKey::default()
    } else {
        json_body(&body)?
    };
    let issued = api
        .store
        .create_key(&name, new.description.as_deref(), new.expires_at)
        .await
        .map_err(store_error)?;
    // A lookup of this key made before it existed may be cached as "unknown".
    api.directory
        .cache()
        .invalidate(&spillway_store::digest_secret(&issued.secret));
    // The one time the secret is shown.
    let body = serde_json::json!({ "secret": issued.secret, "key": issued.key });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn revoke_key(
    State(api): State<AdminApi>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let key = api.store.revoke_key(&id).await.map_err(store_error)?;
    api.directory.key_revoked(&key.id);
    Ok(Json(key).into_response())
}

async fn flush_cache(State(api): State<AdminApi>) -> Response {
    api.directory.flush();
    Json(serde_json::json!({ "flushed": true })).into_response()
}

/// Health of the gateway's dependencies, for dashboards and humans. Never used by `/livez` or
/// `/readyz`: a store or Redis outage must not restart healthy gateways (IL-0136).
pub(crate) async fn deps(directory: &StoreDirectory) -> Response {
    let (status, body) = directory.deps().await;
    (status, Json(body)).into_response()
}
