//! The shared state of the request path, built once from the checked config.
//!
//! Everything a request reads lives here: the tenants and their cache, the upstream seam, the
//! client connections and, behind one atomic pointer, the current config's state (`live.rs`:
//! the model pools, admission, the settings of each stage), which a reload replaces. The process
//! around it (listeners, background tasks, shutdown) is `server.rs`'s; this file knows nothing of
//! it.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arc_swap::ArcSwap;
use spillway_config::Config;
use tracing::{info, warn};

use crate::admission::Admission;
use crate::auth::TenantDirectory;
use crate::changes::{Changes, Startup};
use crate::connections::Connections;
use crate::live::Live;
use crate::mocks::{base_resolver, MockFleet, MockPlan};
use crate::pool::Models;
use crate::request::BodyBudget;
use crate::rollout::Rollouts;
use crate::tenants::StoreDirectory;
use crate::upstream::HttpUpstream;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Setup(String),
}

/// Shared state of the request path.
pub struct Gateway {
    pub(crate) directory: Arc<dyn TenantDirectory>,
    pub(crate) tenants: Arc<StoreDirectory>,
    pub(crate) admin_token: Option<[u8; 32]>,
    /// What the attempt loop sends through; its pooled client also serves health checks and
    /// engine scrapes, so they reuse the requests' connections.
    pub(crate) upstream: HttpUpstream,
    pub(crate) ready: AtomicBool,
    /// The API listener's client connections (`server.max_connections`).
    pub(crate) connections: Arc<Connections>,
    pub(crate) body_budget: &'static BodyBudget,
    /// The backend each stored response lives on (the Responses API).
    pub(crate) homes: Arc<crate::homes::Homes>,
    /// The in-process mock backends.
    pub(crate) mocks: MockFleet,
    /// The current config's state; replaced whole by a reload.
    live: ArcSwap<Live>,
    /// Reloads, one at a time, and the last-known-good config.
    pub(crate) changes: Changes,
    /// The models' rollouts, kept across reloads and restarts.
    pub(crate) rollouts: Arc<Rollouts>,
    /// When the gateway started: the time base of the traffic counters (`top.rs`).
    pub(crate) started: std::time::Instant,
    /// Traces (`[telemetry]`): off unless an OTLP endpoint is configured.
    pub(crate) tracing: crate::trace::Tracing,
}

impl Gateway {
    /// The request path's state for the config of `startup`; `mocks` are the mock backends
    /// started for it.
    pub(crate) async fn build(startup: Startup, mocks: MockPlan) -> Result<Self, StartError> {
        let (config, source) = (startup.config(), startup.source());
        let tenants = Arc::new(open_tenants(&config).await?);
        let bases = mocks.bases();
        let changes = Changes::new(startup);
        let rollouts = Arc::new(Rollouts::load(
            changes.data_dir(),
            changes.anomaly_counter(),
        ));
        let (models, _) =
            Models::rebuilt(&config, base_resolver(&bases), &Models::default(), &|m| {
                rollouts.cell_for(m)
            })
            .map_err(StartError::Setup)?;
        rollouts.adopt(models.rollouts());
        let shared = match &config.admission.redis {
            Some(url) => Some(
                crate::shared_limits::SharedLimits::start(url, config.admission.redis_timeout)
                    .await
                    .map_err(|e| StartError::Setup(format!("admission.redis: {e}")))?,
            ),
            None => None,
        };
        let admission = Admission::new(
            &config.admission,
            config.retry.shed_client_retries,
            models.pools().iter().map(|p| &**p),
            shared,
        );
        let tracing = crate::trace::Tracing::new(&config.telemetry).map_err(StartError::Setup)?;
        let fleet = MockFleet::default();
        fleet.commit(mocks, config.server.shutdown_grace);
        Ok(Gateway {
            upstream: HttpUpstream::new(&config.upstream),
            directory: tenants.clone(),
            tenants,
            admin_token: admin_token(&config.admin.token_env),
            ready: AtomicBool::new(false),
            connections: Arc::new(
                Connections::new(&config.server, config.server.max_connections, "api")
                    .with_request_ids(),
            ),
            body_budget: BodyBudget::new(
                config.admission.max_buffered_body_bytes,
                config.admission.max_buffered_body_bytes_per_tenant,
            ),
            homes: Arc::default(),
            mocks: fleet,
            live: ArcSwap::from_pointee(Live::new(config, source, models, admission)),
            changes,
            rollouts,
            started: crate::clock::now(),
            tracing,
        })
    }

    /// The current config's state. A request takes it once and keeps it to its end.
    pub(crate) fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Puts `next` in place of the current config's state and returns the one it replaced.
    pub(crate) fn swap(&self, next: Live) -> Arc<Live> {
        self.live.swap(Arc::new(next))
    }
}

/// Builds the cached directory (loaded from its snapshot, if any), then opens the store and
/// applies the config's tenants to it. A store that cannot be reached now is waited out when
/// the snapshot gave the cache keys to serve: the gateway starts without it and connects in the
/// background (`store_connect.rs`); anything else about the store fails the start.
async fn open_tenants(config: &Config) -> Result<StoreDirectory, StartError> {
    let bootstrap =
        crate::tenants::Bootstrap::resolve(&config.tenants).map_err(StartError::Setup)?;
    let options = spillway_store::PoolOptions {
        max_connections: config.store.max_connections,
        acquire_timeout: config.store.acquire_timeout,
        ..spillway_store::PoolOptions::default()
    };
    let handle = Arc::new(spillway_store::DeferredStore::new(options.max_connections));
    let store: Arc<dyn spillway_store::Store> = handle.clone();
    let c = &config.cache;
    let cache = spillway_directory::Directory::new(store.clone(), c.clone())
        .await
        .map_err(|e| StartError::Setup(format!("key cache: {e}")))?;
    if c.naive {
        warn!("cache.naive is set: the key cache has no single flight, no load cap and no stale answers; for demonstrations only");
    }
    let mut snapshot_keys = 0;
    if c.snapshot.is_some() {
        match cache.load_snapshot().await {
            Ok(n) => {
                snapshot_keys = n;
                info!(entries = n, "key cache loaded from its snapshot");
            }
            Err(e) => warn!("key cache snapshot not loaded: {e}"),
        }
    }
    let url = redact(&config.store.url);
    let opening =
        crate::store_connect::StoreOpening::new(config.store.url.clone(), options, bootstrap);
    match opening.attempt().await {
        Ok(opened) => {
            handle.connect(opened);
        }
        Err(e) => match crate::store_connect::on_first_failure(&e, snapshot_keys) {
            crate::store_connect::Start::Refuse(why) => {
                return Err(StartError::Setup(format!("store {url}: {why}")));
            }
            crate::store_connect::Start::WithoutStore => {
                warn!(
                    snapshot_keys,
                    "started without its store ({url}: {e}): serving the keys of the key-cache \
                     snapshot, answering other keys 503 store_unavailable; will keep trying to \
                     connect in the background"
                );
                tokio::spawn(opening.keep_trying(Arc::downgrade(&handle)));
            }
        },
    }
    Ok(StoreDirectory::new(store, cache))
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            let user = creds.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// The admin token's digest, from the environment; `None` turns the admin API off.
fn admin_token(var: &str) -> Option<[u8; 32]> {
    match std::env::var(var) {
        Ok(t) if !t.trim().is_empty() => Some(spillway_config::key_digest(t.trim())),
        _ => {
            info!("admin API off: {var} is not set");
            None
        }
    }
}
