//! The admin API's config routes, behind the admin token like every `/admin` route:
//!
//! - `GET /admin/config`: the running config (hash, when and where from), the file as it is now
//!   (pending: whether it differs, whether it would pass, what would need a restart), the
//!   last-known-good one, and the last reload's answer;
//! - `POST /admin/config/reload`: reload the file; 200 when applied or unchanged, 422 with the
//!   problems when rejected (nothing changed);
//! - `POST /admin/config/rollback`: put the last-known-good config in place, through the same
//!   checks and the same swap as a reload.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::StatusCode;
use serde_json::{json, Value};

use super::{problems, reload, restart, saved, Ended, From, Loaded, Outcome};
use crate::gateway::Gateway;

pub(crate) fn routes(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/admin/config", get(show))
        .route("/admin/config/reload", post(reload_file))
        .route("/admin/config/rollback", post(rollback))
        .with_state(gw)
}

async fn reload_file(State(gw): State<Arc<Gateway>>) -> Response {
    answer(reload(&gw, From::File).await)
}

async fn rollback(State(gw): State<Arc<Gateway>>) -> Response {
    answer(reload(&gw, From::LastKnownGood).await)
}

fn answer(outcome: Outcome) -> Response {
    let status = match outcome.result {
        Ended::Applied | Ended::Unchanged => StatusCode::OK,
        Ended::Rejected => StatusCode::UNPROCESSABLE_ENTITY,
    };
    let mut body = serde_json::to_value(&outcome).unwrap_or(Value::Null);
    if outcome.result == Ended::Rejected {
        // The API's error shape too, for clients that look only for it.
        body["error"] = json!({
            "message": format!("config rejected, nothing changed: {}", outcome.problems.join("; ")),
            "type": "invalid_request_error",
            "code": "config_rejected",
        });
    }
    (status, Json(body)).into_response()
}

async fn show(State(gw): State<Arc<Gateway>>) -> Response {
    let live = gw.live();
    let pending = match gw.changes.path() {
        None => Value::Null,
        Some(path) => match Loaded::from_file(path) {
            Ok(file) if file.hash == live.source.hash => json!({
                "path": path.display().to_string(),
                "hash": file.hash,
                "differs": false,
            }),
            Ok(file) => {
                let mut config = file.config;
                gw.changes.startup.apply_overrides(&mut config);
                json!({
                    "path": path.display().to_string(),
                    "hash": file.hash,
                    "differs": true,
                    "problems": [],
                    "restart_required": restart::pin(&live.config, &mut config),
                })
            }
            Err(e) => json!({
                "path": path.display().to_string(),
                "hash": std::fs::read(path).ok().map(|b| super::hash(&b)),
                "differs": true,
                "problems": problems(e),
            }),
        },
    };
    let last_known_good = match saved::read(gw.changes.data_dir()) {
        Ok(Some(s)) => json!({
            "hash": s.hash,
            "saved_at": s.saved_at,
            "source": s.source,
            "path": saved::path(gw.changes.data_dir()).display().to_string(),
        }),
        Ok(None) => Value::Null,
        Err(e) => json!({ "problems": [e] }),
    };
    let models = &live.models.names;
    let backends: usize = live.config.models.iter().map(|m| m.backends.len()).sum();
    Json(json!({
        "running": {
            "source": live.source,
            "models": models,
            "backends": backends,
            "tenants": live.config.tenants.len(),
        },
        "pending": pending,
        "last_known_good": last_known_good,
        "last_reload": gw.changes.last(),
    }))
    .into_response()
}
