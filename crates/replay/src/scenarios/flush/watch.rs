//! `/livez` watched throughout a run, every 100 ms, counted per phase.
//!
//! G6 promises that liveness never depends on the store: while the store is gone the gateway
//! must keep answering `/livez`, or an orchestrator would restart instances that are serving
//! fine from their cache. This watcher is the replay's evidence either way; it is separate from
//! the supervisor (which probes once a second and acts) so that it sees short gaps too.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::http::{uri, HttpClient};
use crate::tally::Schedule;

const EVERY: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_millis(500);

/// Probes of one phase.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct LivezCounts {
    pub(crate) probes: u64,
    /// Probes without a 200 within 500 ms.
    pub(crate) failed: u64,
}

pub(crate) struct LivezWatch {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Vec<LivezCounts>>,
}

impl LivezWatch {
    pub(crate) fn start(api: SocketAddr, schedule: Schedule) -> LivezWatch {
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let client = HttpClient::new(1);
            let url = uri(api, "/livez");
            let mut counts = vec![LivezCounts::default(); schedule.drain() + 1];
            let mut ticks = tokio::time::interval(EVERY);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = ticks.tick() => {}
                }
                let slot = schedule.slot(Instant::now());
                let ok = matches!(
                    client.get(url.clone(), TIMEOUT).await,
                    Ok((StatusCode::OK, _))
                );
                let c = &mut counts[slot];
                c.probes += 1;
                c.failed += u64::from(!ok);
            }
            counts
        });
        LivezWatch { stop, task }
    }

    /// Per phase, then the drain slot.
    pub(crate) async fn stop(self) -> Vec<LivezCounts> {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}
