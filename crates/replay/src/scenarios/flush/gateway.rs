//! The cache-flush scenario's gateway: one `spillway serve` process on fixed ports, restarted
//! on purpose for the "restart at peak" phase, and watched by a supervisor that probes it the
//! way an orchestrator would, restarting it after [`FAILURES_TO_RESTART`] failed probes in a row.
//!
//! The probe is what IL-0136 turned on. The protected run probes `/livez`, which reads only the
//! process's own state. The naive run probes `/healthz/deps`, which asks the store: the
//! incident's health checks opened database connections, so while the database was down or
//! starved they failed, and instances were restarted in a loop for hours, each coming back
//! cold and adding to the database's load.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::error::ReplayError;
use crate::http::{uri, HttpClient};
use crate::process::ChildProcess;
use crate::ready::{self, START_DEADLINE};

/// How often the supervisor probes.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Failed probes in a row that make the supervisor restart the gateway.
pub(crate) const FAILURES_TO_RESTART: u32 = 3;
/// How long a gateway may take to exit after SIGTERM before it is killed.
const TERM_GRACE: Duration = Duration::from_secs(3);

/// What the supervisor asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// `GET /livez` on the API listener: the process is alive.
    Livez,
    /// `GET /healthz/deps` on the admin listener: the store answered a ping.
    Deps,
}

/// A gateway process that can be restarted on the same ports.
pub(crate) struct Gateway {
    pub(crate) api: SocketAddr,
    pub(crate) admin: SocketAddr,
    config: PathBuf,
    env: Vec<(String, String)>,
    process: Mutex<Option<ChildProcess>>,
    /// Processes started, the first included.
    starts: AtomicU64,
    /// Restarts the supervisor made.
    probe_restarts: AtomicU64,
}

impl Gateway {
    /// Starts the first process and waits until its `/livez` answers 200 (not `/readyz`: a
    /// naive gateway, which does not warm its cache, is ready only once traffic reached the
    /// store; the load is what the first phase measures).
    pub(crate) async fn start(
        api: SocketAddr,
        admin: SocketAddr,
        config: PathBuf,
        env: Vec<(String, String)>,
        control: &HttpClient,
    ) -> Result<Arc<Gateway>, ReplayError> {
        let gateway = Gateway {
            api,
            admin,
            config,
            env,
            process: Mutex::new(None),
            starts: AtomicU64::new(0),
            probe_restarts: AtomicU64::new(0),
        };
        let mut process = gateway.spawn().await?;
        ready::wait_for(&mut process, api, "/livez", control).await?;
        *gateway.process.lock().await = Some(process);
        Ok(Arc::new(gateway))
    }

    /// Restarts so far: deliberate ones and the supervisor's.
    pub(crate) fn restarts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed).saturating_sub(1)
    }

    /// Restarts the supervisor made after failed probes.
    pub(crate) fn probe_restarts(&self) -> u64 {
        self.probe_restarts.load(Ordering::Relaxed)
    }

    /// SIGTERM (the gateway drains and saves its cache snapshot), a kill after
    /// [`TERM_GRACE`], then a new process on the same ports. Does not wait for readiness: the
    /// load keeps coming, as it would to a restarted instance behind a load balancer.
    pub(crate) async fn restart(&self) -> Result<(), ReplayError> {
        let mut slot = self.process.lock().await;
        if let Some(old) = slot.take() {
            terminate(old).await;
        }
        *slot = Some(self.spawn().await?);
        Ok(())
    }

    /// Kills the current process, if any.
    pub(crate) async fn stop(&self) {
        if let Some(process) = self.process.lock().await.take() {
            process.stop().await;
        }
    }

    /// Starts probing every [`PROBE_EVERY`]; dropping or stopping the result ends it.
    pub(crate) fn supervise(self: &Arc<Self>, probe: Probe, control: HttpClient) -> Supervisor {
        let (stop, mut stopped) = watch::channel(false);
        let gateway = Arc::clone(self);
        let url = match probe {
            Probe::Livez => uri(self.api, "/livez"),
            Probe::Deps => uri(self.admin, "/healthz/deps"),
        };
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(Instant::now() + PROBE_EVERY, PROBE_EVERY);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut failures = 0;
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = ticks.tick() => {}
                }
                let answer = control.get(url.clone(), PROBE_TIMEOUT).await;
                if matches!(answer, Ok((StatusCode::OK, _))) {
                    failures = 0;
                    continue;
                }
                failures += 1;
                if failures < FAILURES_TO_RESTART {
                    continue;
                }
                failures = 0;
                gateway.probe_restarts.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = gateway.restart().await {
                    eprintln!("replay: supervisor: the restarted gateway did not start: {e}");
                }
            }
        });
        Supervisor { stop, task }
    }

    async fn spawn(&self) -> Result<ChildProcess, ReplayError> {
        self.starts.fetch_add(1, Ordering::Relaxed);
        let config = self.config.to_string_lossy();
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let (process, _) = ChildProcess::start(
            "gateway",
            &["serve", "--config", &config],
            &env,
            START_DEADLINE,
        )
        .await?;
        Ok(process)
    }
}

/// A running supervisor.
pub(crate) struct Supervisor {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Supervisor {
    /// Ends the probing, waiting for a restart in progress to finish.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// SIGTERM, then a kill if the process has not exited within [`TERM_GRACE`].
async fn terminate(mut process: ChildProcess) {
    if process.terminate().await {
        let end = Instant::now() + TERM_GRACE;
        while process.exited().is_none() && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    process.stop().await;
}

/// `N` free ports on 127.0.0.1 for the gateway to listen on: bound together, read and released.
/// Bound together, they are `N` different ports (one released before the next is bound may be
/// handed out again). The gateway keeps its ports across restarts, as an instance behind a load
/// balancer does.
pub(crate) fn free_ports<const N: usize>() -> Result<[SocketAddr; N], ReplayError> {
    let failed = |source| ReplayError::Scratch {
        what: "a free port on 127.0.0.1".to_owned(),
        source,
    };
    let mut held = Vec::with_capacity(N);
    for _ in 0..N {
        held.push(std::net::TcpListener::bind("127.0.0.1:0").map_err(failed)?);
    }
    let mut ports = [SocketAddr::from(([127, 0, 0, 1], 0)); N];
    for (port, listener) in ports.iter_mut().zip(&held) {
        *port = listener.local_addr().map_err(failed)?;
    }
    Ok(ports)
}
