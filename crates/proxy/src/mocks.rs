//! The in-process mock backends (`kind = "mock"`): started with the gateway, and at a reload
//! started for the backends the new config adds or changes, kept for those it leaves alone, and
//! stopped (after the shutdown grace, so requests on them finish) for those it drops.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Uri;
use spillway_config::{BackendKind, Config, MockProfile};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

/// A mock backend's base URL, by (model, backend) name.
pub(crate) type MockBases = HashMap<(String, String), String>;

/// The mock backends running now.
#[derive(Default)]
pub(crate) struct MockFleet {
    running: Mutex<HashMap<(String, String), Running>>,
}

#[derive(Clone)]
struct Running {
    profile: MockProfile,
    base: String,
    stop: Arc<watch::Sender<bool>>,
}

/// The mock backends a config needs: those kept and those started for it. Dropped without
/// [`MockFleet::commit`], it stops those it started.
pub(crate) struct MockPlan {
    next: HashMap<(String, String), Running>,
    started: Vec<(String, String)>,
    committed: bool,
}

impl MockPlan {
    pub(crate) fn bases(&self) -> MockBases {
        self.next
            .iter()
            .map(|(k, r)| (k.clone(), r.base.clone()))
            .collect()
    }
}

impl Drop for MockPlan {
    fn drop(&mut self) {
        if !self.committed {
            for key in &self.started {
                if let Some(r) = self.next.get(key) {
                    let _ = r.stop.send(true);
                }
            }
        }
    }
}

/// Resolves a backend's base URL: its own, or the address its mock was started on.
pub(crate) fn base_resolver(
    bases: &MockBases,
) -> impl FnMut(&spillway_config::ModelConfig, &spillway_config::BackendConfig) -> Result<Uri, String> + '_
{
    move |m, b| match &b.kind {
        BackendKind::OpenAi { url } | BackendKind::Azure { url, .. } => Ok(url.clone()),
        BackendKind::Mock(_) => bases
            .get(&(m.name.clone(), b.name.clone()))
            .ok_or("mock backend was not started")?
            .parse::<Uri>()
            .map_err(|e| e.to_string()),
    }
}

impl MockFleet {
    /// Starts the mock backends of `config` that are not running with the same profile.
    pub(crate) async fn plan(&self, config: &Config) -> std::io::Result<MockPlan> {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut plan = MockPlan {
            next: HashMap::new(),
            started: Vec::new(),
            committed: false,
        };
        for m in &config.models {
            for b in &m.backends {
                let BackendKind::Mock(profile) = &b.kind else {
                    continue;
                };
                let key = (m.name.clone(), b.name.clone());
                if let Some(r) = running.get(&key).filter(|r| &r.profile == profile) {
                    plan.next.insert(key, r.clone());
                    continue;
                }
                let (stop, stopped) = watch::channel(false);
                let addr = start(profile.clone(), stopped).await?;
                info!(model = %m.name, backend = %b.name, region = %b.region, "mock backend listening on http://{addr}");
                plan.started.push(key.clone());
                let base = format!("http://{addr}/v1");
                plan.next.insert(
                    key,
                    Running {
                        profile: profile.clone(),
                        base,
                        stop: Arc::new(stop),
                    },
                );
            }
        }
        Ok(plan)
    }

    /// Makes `plan` the running fleet; the mocks it does not keep stop after `grace`.
    pub(crate) fn commit(&self, mut plan: MockPlan, grace: Duration) {
        plan.committed = true;
        let next = std::mem::take(&mut plan.next);
        let old = std::mem::replace(
            &mut *self.running.lock().unwrap_or_else(|e| e.into_inner()),
            next.clone(),
        );
        for (key, r) in old {
            if next
                .get(&key)
                .is_none_or(|n| !Arc::ptr_eq(&n.stop, &r.stop))
            {
                tokio::spawn(async move {
                    tokio::time::sleep(grace).await;
                    let _ = r.stop.send(true);
                });
            }
        }
    }

    /// Stops every mock backend (at shutdown, after requests were drained).
    pub(crate) fn stop_all(&self) {
        for r in self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            let _ = r.stop.send(true);
        }
    }
}

async fn start(
    profile: MockProfile,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    let server = spillway_mock::MockServer::new(profile);
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = server.serve(listener, stopped).await {
            warn!("mock backend on {addr} stopped: {e}");
        }
    });
    Ok(addr)
}
