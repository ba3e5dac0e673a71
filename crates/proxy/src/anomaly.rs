//! 4xx anomaly detection per model and backend, outside rollouts too.
//!
//! In IL-0235 the 400s the new engine version returned were the signal, and nobody watched
//! them: the monitoring saw only client-side errors, and found the outage an hour late. A
//! gateway that relays a backend's 400 as the caller's mistake hides it in the same way. So every
//! backend's share of 4xx answers (429 aside, a capacity answer) is compared, each second, with
//! its own recent baseline (`spillway_policy::anomaly`, with its defaults: a minute's window
//! against half an hour), and a jump is a `WARN` log line, `spillway_backend_4xx_anomaly` at 1,
//! one more `spillway_4xx_anomalies_total`, and an anomaly of the running config (which delays
//! its being saved as last-known-good). The return to normal is logged once too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, describe_counter, describe_gauge, gauge};
use spillway_policy::anomaly::Change;
use tracing::{info, warn};

use crate::pool::Models;

const ANOMALOUS: &str = "spillway_backend_4xx_anomaly";
const SHARE: &str = "spillway_backend_4xx_share";
const BASELINE: &str = "spillway_backend_4xx_baseline_share";
const JUMPS: &str = "spillway_4xx_anomalies_total";

/// How often every backend's 4xx share is judged.
pub(crate) const EVALUATE_EVERY: Duration = Duration::from_secs(1);

pub(crate) fn describe() {
    describe_gauge!(
        ANOMALOUS,
        "1 while a backend's share of 4xx answers (429 aside) is far above its own baseline."
    );
    describe_gauge!(
        SHARE,
        "A backend's share of 4xx answers (429 aside) over the last minute."
    );
    describe_gauge!(
        BASELINE,
        "A backend's share of 4xx answers (429 aside) over its baseline (half an hour)."
    );
    describe_counter!(JUMPS, "Jumps of a backend's 4xx share above its baseline.");
}

/// Judges every backend of `models` at `now`: logs, counts and gauges each change.
pub(crate) fn evaluate(models: &Models, now: Instant, anomalies: &AtomicU64) {
    for pool in models.pools() {
        for b in &pool.backends {
            let (change, share, baseline) = b
                .health
                .four_xx(|d| (d.evaluate(now), d.share(now), d.baseline_share(now)));
            let (model, backend) = (pool.name.to_string(), b.name.to_string());
            gauge!(SHARE, "model" => model.clone(), "backend" => backend.clone()).set(share);
            gauge!(BASELINE, "model" => model.clone(), "backend" => backend.clone()).set(baseline);
            match change {
                Some(Change::Anomalous {
                    share,
                    baseline_share,
                    p_value,
                }) => {
                    warn!(
                        model,
                        backend,
                        "4xx ANOMALY: {:.1} % of the backend's answers are 4xx against {:.2} % in its baseline (p = {p_value:.1e}); a change of the backend or of its callers",
                        share * 100.0,
                        baseline_share * 100.0,
                    );
                    anomalies.fetch_add(1, Ordering::Relaxed);
                    counter!(JUMPS, "model" => model.clone(), "backend" => backend.clone())
                        .increment(1);
                    gauge!(ANOMALOUS, "model" => model, "backend" => backend).set(1.0);
                }
                Some(Change::Normal {
                    share,
                    baseline_share,
                }) => {
                    info!(
                        model,
                        backend,
                        "4xx share back to normal: {:.1} % against {:.2} % in its baseline",
                        share * 100.0,
                        baseline_share * 100.0,
                    );
                    gauge!(ANOMALOUS, "model" => model, "backend" => backend).set(0.0);
                }
                None => {}
            }
        }
    }
}

/// Clears the 4xx gauges of a backend a reload removed, so an alert on one that was anomalous
/// does not fire for ever for a backend that is gone.
pub(crate) fn forget(model: &str, backend: &str) {
    for name in [ANOMALOUS, SHARE, BASELINE] {
        gauge!(name, "model" => model.to_owned(), "backend" => backend.to_owned()).set(0.0);
    }
}

/// Judges the running config's backends each [`EVALUATE_EVERY`], for as long as it runs.
pub(crate) async fn watch(current: impl Fn() -> Arc<crate::live::Live>, anomalies: Arc<AtomicU64>) {
    let mut tick = tokio::time::interval(EVALUATE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        evaluate(&current().models, crate::clock::now(), &anomalies);
    }
}
