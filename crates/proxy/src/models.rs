//! `GET /v1/models` and `GET /v1/models/{id}`: the models a caller's key may use, answered from
//! the configuration alone (never a backend), each with the API surfaces its backends serve.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::HeaderMap;
use serde_json::{json, Value};

use crate::auth::Tenant;
use crate::endpoint::Dialect;
use crate::error::{ApiError, ErrorKind};
use crate::gateway::Gateway;
use crate::handler::counted;
use crate::live::Live;
use crate::metrics::RequestLabels;

pub(crate) async fn list(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let tenant = match caller(&gw, headers).await {
        Ok(t) => t,
        Err(response) => return response,
    };
    let live = gw.live();
    let data: Vec<_> = live
        .models
        .names
        .iter()
        .filter(|m| tenant.may_use(m))
        .map(|m| model(&live, &tenant, m))
        .collect();
    answered(&tenant, 200);
    Json(json!({ "object": "list", "data": data })).into_response()
}

pub(crate) async fn one(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let tenant = match caller(&gw, headers).await {
        Ok(t) => t,
        Err(response) => return response,
    };
    // A model the key may not use is not shown to exist, as in the list.
    let live = gw.live();
    if live.models.get(&id).is_none() || !tenant.may_use(&id) {
        let shown: String = id.chars().take(64).collect();
        let e = ApiError::new(
            ErrorKind::ModelNotFound,
            format!("the model {shown:?} does not exist"),
        );
        answered(&tenant, e.status().as_u16());
        return e.into_response();
    }
    answered(&tenant, 200);
    Json(model(&live, &tenant, &id)).into_response()
}

/// The caller's tenant; or the refusal, counted.
async fn caller(gw: &Gateway, headers: HeaderMap) -> Result<Arc<Tenant>, Response> {
    crate::handler::authenticate(gw, &crate::lines::Lines::from_map(headers))
        .await
        .map_err(|e| counted(e, Dialect::OpenAi))
}

fn answered(tenant: &Tenant, status: u16) {
    let mut labels = RequestLabels::unrouted();
    labels.tenant = Some(tenant.name.clone());
    labels.answered(status);
}

/// One model as the list shows it: the OpenAI model object, plus the surfaces of the backends
/// this tenant's requests may reach.
fn model(live: &Live, tenant: &Tenant, name: &str) -> Value {
    let surfaces: Vec<&str> = live.models.get(name).map_or_else(Vec::new, |pool| {
        spillway_config::Surface::ALL
            .into_iter()
            .filter(|s| pool.serves(*s, tenant.pool.as_deref()))
            .map(|s| s.as_str())
            .collect()
    });
    json!({
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "spillway",
        "surfaces": surfaces,
    })
}
