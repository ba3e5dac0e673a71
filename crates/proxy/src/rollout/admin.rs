//! The admin API's rollout routes, behind the admin token like every `/admin` route:
//!
//! - `GET /admin/rollouts`: every running rollout, its step, share, state and counts;
//! - `POST /admin/rollouts/{model}/promote`: the next step now, whatever the step's time and
//!   counts;
//! - `POST /admin/rollouts/{model}/abort`: the new version takes no traffic from now on;
//! - `POST /admin/rollouts/{model}/restart`: the first step again (after a halt or an abort).
//!
//! A steer is saved like every change of a rollout's state, so it holds across a restart.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::Steer;
use crate::error::{ApiError, ErrorKind};
use crate::gateway::Gateway;

pub(crate) fn routes(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/admin/rollouts", get(list))
        .route("/admin/rollouts/{model}/promote", post(promote))
        .route("/admin/rollouts/{model}/abort", post(abort))
        .route("/admin/rollouts/{model}/restart", post(restart))
        .with_state(gw)
}

async fn list(State(gw): State<Arc<Gateway>>) -> Response {
    Json(json!({ "rollouts": gw.rollouts.views(crate::clock::now()) })).into_response()
}

async fn promote(State(gw): State<Arc<Gateway>>, Path(model): Path<String>) -> Response {
    steer(&gw, &model, Steer::Promote)
}

async fn abort(State(gw): State<Arc<Gateway>>, Path(model): Path<String>) -> Response {
    steer(&gw, &model, Steer::Abort)
}

async fn restart(State(gw): State<Arc<Gateway>>, Path(model): Path<String>) -> Response {
    steer(&gw, &model, Steer::Restart)
}

fn steer(gw: &Gateway, model: &str, steer: Steer) -> Response {
    match gw.rollouts.steer(model, steer, crate::clock::now()) {
        Some(Ok(view)) => Json(view).into_response(),
        Some(Err(why)) => ApiError::new(ErrorKind::Conflict, why).into_response(),
        None => {
            let shown: String = model.chars().take(64).collect();
            ApiError::new(
                ErrorKind::NotFound,
                format!("the model {shown:?} has no staged rollout running"),
            )
            .into_response()
        }
    }
}
