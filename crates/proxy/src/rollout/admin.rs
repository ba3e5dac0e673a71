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

use super::{Rollouts, Steer};
use crate::error::{ApiError, ErrorKind};

pub(crate) fn routes(rollouts: Arc<Rollouts>) -> Router {
    Router::new()
        .route("/admin/rollouts", get(list))
        .route("/admin/rollouts/{model}/promote", post(promote))
        .route("/admin/rollouts/{model}/abort", post(abort))
        .route("/admin/rollouts/{model}/restart", post(restart))
        .with_state(rollouts)
}

async fn list(State(rollouts): State<Arc<Rollouts>>) -> Response {
    Json(json!({ "rollouts": rollouts.views(crate::clock::now()) })).into_response()
}

async fn promote(State(r): State<Arc<Rollouts>>, Path(model): Path<String>) -> Response {
    steer(&r, &model, Steer::Promote)
}

async fn abort(State(r): State<Arc<Rollouts>>, Path(model): Path<String>) -> Response {
    steer(&r, &model, Steer::Abort)
}

async fn restart(State(r): State<Arc<Rollouts>>, Path(model): Path<String>) -> Response {
    steer(&r, &model, Steer::Restart)
}

fn steer(rollouts: &Rollouts, model: &str, steer: Steer) -> Response {
    match rollouts.steer(model, steer, crate::clock::now()) {
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
