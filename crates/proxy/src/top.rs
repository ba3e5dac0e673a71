//! `GET /admin/top`: who brings the load and what became of it, read from the gateway's own
//! state, for `spillway top` and scripts.
//!
//! Per tenant the counters of `traffic.rs` (offered, admitted, queued now, shed by reason,
//! callers' own retries, upstream attempts and retries), per model its requests and upstream
//! attempts, per backend its health, load and adaptive limit. Counters are cumulative since the
//! gateway started and come with its uptime on its monotonic clock: a reader computes rates
//! from two reads (`spillway top` does), and a restart shows as an uptime that went down. No
//! window is kept in the gateway, so two readers never disturb each other's rates.
//!
//! Who may read it: with an admin token configured (`admin.token_env`), only a caller that
//! presents it, like every other `/admin` route. With none, the admin API is off, but this one
//! read-only route still answers when the admin listener is bound to a loopback address, as the
//! quickstart's is: it shows what `/metrics` on the same listener already shows to anyone who
//! can reach it, and so `spillway serve` then `spillway top` works with no setup. On any other
//! address without a token it is off like the rest of the admin API.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use spillway_policy::outlier::Health;
use spillway_policy::EngineView;

use crate::error::{ApiError, ErrorKind};
use crate::gateway::Gateway;
use crate::traffic::Refused;

/// The answer of `GET /admin/top`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Top {
    /// Seconds since the gateway started, on its monotonic clock: the time between two reads.
    pub uptime_seconds: f64,
    /// Every tenant that sent a request since the gateway started, by name.
    pub tenants: Vec<TenantTop>,
    /// Every model configured or asked for since the start, by name.
    pub models: Vec<ModelTop>,
    /// Every backend of the running config, by model and name.
    pub backends: Vec<BackendTop>,
}

/// One tenant's counts since the gateway started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantTop {
    pub tenant: String,
    /// Requests its keys authenticated.
    pub offered: u64,
    /// Requests that passed admission and took a seat in their model's pool.
    pub admitted: u64,
    /// Requests waiting for a seat now.
    pub queued: u64,
    /// Requests admission refused, by reason (every reason, 0 included).
    pub shed: BTreeMap<String, u64>,
    /// Requests its callers marked as their own retries.
    pub client_retries: u64,
    /// Attempts sent upstream for its requests.
    pub upstream_attempts: u64,
    /// Of those, attempts after a request's first (spillway's retries and fallbacks).
    pub upstream_retries: u64,
}

/// One model's counts since the gateway started, over every tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelTop {
    pub model: String,
    /// Requests for the model that reached admission.
    pub offered: u64,
    pub upstream_attempts: u64,
    pub upstream_retries: u64,
}

/// One backend now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendTop {
    pub model: String,
    pub backend: String,
    pub region: String,
    /// `healthy`, `degraded` (failing, kept in rotation by the ejection cap), `probing` (its
    /// ejection over, one probe request at a time) or `ejected`.
    pub state: String,
    /// Requests in flight to it.
    pub outstanding: u32,
    /// Its adaptive concurrency limit now.
    pub limit: u32,
    pub max_concurrency: u32,
    /// Its engine's reading: `fresh`, `stale` (counted as saturated) or `none` (no engine
    /// metrics read for it).
    pub engine: String,
    /// What the engine reported running and queued, in a fresh reading.
    pub engine_running: Option<u32>,
    pub engine_waiting: Option<u32>,
}

/// Who may read `/admin/top`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Callers presenting the admin token with this digest.
    Token([u8; 32]),
    /// Anyone who reaches the loopback admin listener (no token configured).
    Loopback,
    /// No one (no token configured, a listener others can reach).
    Off,
}

impl Access {
    fn of(token: Option<[u8; 32]>, admin: SocketAddr) -> Access {
        match token {
            Some(digest) => Access::Token(digest),
            None if admin.ip().is_loopback() => Access::Loopback,
            None => Access::Off,
        }
    }

    /// The refusal for a request with `headers`, if it is refused.
    fn refusal(self, headers: &http::HeaderMap) -> Option<ApiError> {
        match self {
            Access::Token(digest) if crate::admin::presents_token(headers, &digest) => None,
            Access::Token(_) => Some(ApiError::new(
                ErrorKind::AdminUnauthorized,
                "missing or wrong admin token",
            )),
            Access::Loopback => None,
            Access::Off => Some(ApiError::new(
                ErrorKind::AdminDisabled,
                "the admin API is off: set the admin token's environment variable (admin.token_env)",
            )),
        }
    }
}

#[derive(Clone)]
struct TopState {
    gateway: Arc<Gateway>,
    access: Access,
}

/// The route, for the admin listener bound to `admin`.
pub(crate) fn routes(gateway: Arc<Gateway>, admin: SocketAddr) -> Router {
    let access = Access::of(gateway.admin_token, admin);
    Router::new()
        .route("/admin/top", get(top))
        .with_state(TopState { gateway, access })
}

async fn top(State(s): State<TopState>, req: Request) -> Response {
    if let Some(refused) = s.access.refusal(req.headers()) {
        return refused.into_response();
    }
    Json(read(&s.gateway)).into_response()
}

/// The gateway's traffic and backends now.
fn read(gw: &Gateway) -> Top {
    let live = gw.live();
    let mut models: BTreeMap<String, ModelTop> = live
        .models
        .pools()
        .iter()
        .map(|p| (p.name.to_string(), model_top(&p.name)))
        .collect();
    let mut tenants: Vec<TenantTop> = live
        .admission
        .traffic()
        .into_iter()
        .map(|(name, traffic)| {
            let counts = traffic.read();
            let (mut attempts, mut retries) = (0, 0);
            for (model, m) in &counts.models {
                attempts += m.attempts;
                retries += m.retries;
                let total = models
                    .entry(model.to_string())
                    .or_insert_with(|| model_top(model));
                total.offered += m.offered;
                total.upstream_attempts += m.attempts;
                total.upstream_retries += m.retries;
            }
            TenantTop {
                tenant: name.to_string(),
                offered: counts.offered,
                admitted: counts.admitted,
                queued: counts.queued as u64,
                shed: Refused::ALL
                    .iter()
                    .zip(counts.shed)
                    .map(|(why, n)| (why.as_str().to_owned(), n))
                    .collect(),
                client_retries: counts.client_retries,
                upstream_attempts: attempts,
                upstream_retries: retries,
            }
        })
        .collect();
    tenants.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    let now = crate::clock::now();
    let mut backends = Vec::new();
    for pool in live.models.pools() {
        for b in &pool.backends {
            let (health, degraded) = b.health.state(now);
            let state = match health {
                Health::Ejected { .. } => "ejected",
                Health::Probing => "probing",
                Health::Healthy if degraded => "degraded",
                Health::Healthy => "healthy",
            };
            let (engine, running, waiting) = match b.engine_view(now) {
                EngineView::Unknown => ("none", None, None),
                EngineView::Stale => ("stale", None, None),
                EngineView::Fresh {
                    running, waiting, ..
                } => ("fresh", Some(running), Some(waiting)),
            };
            backends.push(BackendTop {
                model: pool.name.to_string(),
                backend: b.name.to_string(),
                region: b.region.clone(),
                state: state.to_owned(),
                outstanding: b.outstanding(),
                limit: b.health.limit(),
                max_concurrency: b.max_concurrency,
                engine: engine.to_owned(),
                engine_running: running,
                engine_waiting: waiting,
            });
        }
    }
    backends.sort_by(|a, b| (&a.model, &a.backend).cmp(&(&b.model, &b.backend)));
    Top {
        uptime_seconds: crate::clock::since(gw.started).as_secs_f64(),
        tenants,
        models: models.into_values().collect(),
        backends,
    }
}

fn model_top(name: &str) -> ModelTop {
    ModelTop {
        model: name.to_owned(),
        offered: 0,
        upstream_attempts: 0,
        upstream_retries: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn bearer(token: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        h
    }

    #[test]
    fn a_configured_token_is_required_on_any_address() {
        let digest = spillway_config::key_digest("secret");
        for at in ["127.0.0.1:9090", "[::1]:9090", "10.0.0.5:9090"] {
            let access = Access::of(Some(digest), addr(at));
            assert!(access.refusal(&bearer("secret")).is_none(), "{at}");
            let wrong = access.refusal(&bearer("guess")).map(|e| e.status());
            assert_eq!(wrong, Some(http::StatusCode::UNAUTHORIZED), "{at}");
            let none = access.refusal(&http::HeaderMap::new()).map(|e| e.status());
            assert_eq!(none, Some(http::StatusCode::UNAUTHORIZED), "{at}");
        }
    }

    #[test]
    fn without_a_token_only_a_loopback_listener_answers() {
        for at in ["127.0.0.1:9090", "[::1]:9090"] {
            let access = Access::of(None, addr(at));
            assert!(access.refusal(&http::HeaderMap::new()).is_none(), "{at}");
        }
        for at in ["0.0.0.0:9090", "10.0.0.5:9090", "[::]:9090"] {
            let access = Access::of(None, addr(at));
            let refused = access.refusal(&bearer("anything")).map(|e| e.status());
            assert_eq!(refused, Some(http::StatusCode::NOT_FOUND), "{at}");
        }
    }
}
