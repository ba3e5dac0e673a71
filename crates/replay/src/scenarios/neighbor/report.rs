//! The noisy-neighbor replay's figures: per phase, mode and tenant, what was offered, what
//! succeeded, what was shed, the latency, and the gateway's resident memory.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::args::{NeighborPlan, PHASES};
use crate::incident::RunOutcome;
use crate::plan::Mode;
use crate::report::{
    buckets_between, error_list, histogram_buckets, latency, layout, mebibytes, millis,
    quantile_ms, trim_float,
};
use crate::rss::RssPeaks;
use crate::tally::{ErrorKey, SlotTally};

const TENANTS: [&str; 2] = ["flood", "quiet"];

#[derive(Debug, Serialize)]
pub(crate) struct NeighborReport {
    pub(crate) scenario: &'static str,
    pub(crate) flood_limit_per_min: u32,
    pub(crate) quiet_rate: f64,
    pub(crate) phases_ms: BTreeMap<&'static str, u128>,
    pub(crate) runs: Vec<RunReport>,
}

impl NeighborReport {
    pub(crate) fn new(plan: &NeighborPlan, runs: Vec<RunReport>) -> NeighborReport {
        NeighborReport {
            scenario: "noisy-neighbor",
            flood_limit_per_min: plan.flood_limit,
            quiet_rate: plan.quiet_rate,
            phases_ms: PHASES
                .iter()
                .zip(plan.phases)
                .map(|(p, d)| (*p, d.as_millis()))
                .collect(),
            runs,
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct RunReport {
    pub(crate) mode: Mode,
    pub(crate) completed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    pub(crate) gateway_baseline_rss_bytes: Option<u64>,
    pub(crate) gateway_peak_rss_bytes: Option<u64>,
    pub(crate) phases: Vec<PhaseFigures>,
    pub(crate) in_flight_at_end: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct PhaseFigures {
    pub(crate) phase: &'static str,
    pub(crate) gateway_peak_rss_bytes: Option<u64>,
    pub(crate) tenants: Vec<TenantFigures>,
}

#[derive(Debug, Serialize)]
pub(crate) struct TenantFigures {
    pub(crate) tenant: &'static str,
    /// New requests offered per second (resends not included).
    pub(crate) offered_per_s: f64,
    /// Every HTTP request sent per second, resends included.
    pub(crate) sent_per_s: f64,
    pub(crate) succeeded: u64,
    /// Requests started in the phase that ended with a 2xx.
    pub(crate) success_rate: Option<f64>,
    /// Attempts the gateway refused (429 or 503).
    pub(crate) shed: u64,
    pub(crate) p99_ms: Option<f64>,
    /// From the gateway's `spillway_queue_wait_seconds`: the upper bound of the bucket holding
    /// the 99th percentile of this tenant's waits for a seat in the phase.
    pub(crate) queue_wait_p99_ms: Option<f64>,
    pub(crate) errors_by_status: BTreeMap<String, u64>,
}

impl RunReport {
    /// `tallies`: the flood tenant's, then the quiet one's.
    pub(crate) fn completed(
        mode: Mode,
        durations: &[Duration; 3],
        tallies: [&[SlotTally]; 2],
        pages: &[String],
        rss: &RssPeaks,
        in_flight_at_end: usize,
    ) -> RunReport {
        let phases = PHASES
            .iter()
            .enumerate()
            .map(|(i, phase)| {
                let secs = durations[i].as_secs_f64();
                let tenants = TENANTS
                    .iter()
                    .zip(tallies)
                    .filter_map(|(tenant, slots)| {
                        let t = slots.get(i)?;
                        let wait = match (pages.get(i), pages.get(i + 1)) {
                            (Some(before), Some(after)) => queue_wait_p99(tenant, before, after),
                            _ => None,
                        };
                        Some(figures(tenant, t, secs, wait))
                    })
                    .collect();
                PhaseFigures {
                    phase,
                    gateway_peak_rss_bytes: rss.per_slot.get(i).copied().flatten(),
                    tenants,
                }
            })
            .collect();
        RunReport {
            mode,
            completed: true,
            error: None,
            gateway_baseline_rss_bytes: rss.baseline,
            gateway_peak_rss_bytes: rss.overall,
            phases,
            in_flight_at_end,
        }
    }
}

impl RunOutcome for RunReport {
    fn failed(mode: Mode, error: String) -> RunReport {
        RunReport {
            mode,
            completed: false,
            error: Some(error),
            gateway_baseline_rss_bytes: None,
            gateway_peak_rss_bytes: None,
            phases: Vec::new(),
            in_flight_at_end: 0,
        }
    }

    fn mode(&self) -> Mode {
        self.mode
    }

    fn is_complete(&self) -> bool {
        self.completed
    }

    fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}

/// A tenant's p99 queue wait between two metrics pages, in ms.
fn queue_wait_p99(tenant: &str, before: &str, after: &str) -> Option<f64> {
    let series =
        format!("spillway_queue_wait_seconds_bucket{{tenant=\"{tenant}\",class=\"standard\",");
    let earlier = histogram_buckets(before, &series);
    let later = histogram_buckets(after, &series);
    quantile_ms(&buckets_between(&earlier, &later)?, 0.99).0
}

fn figures(tenant: &'static str, t: &SlotTally, secs: f64, wait: Option<f64>) -> TenantFigures {
    let shed = [429, 503]
        .iter()
        .filter_map(|s| t.errors.get(&ErrorKey::Status(*s)))
        .sum();
    TenantFigures {
        tenant,
        offered_per_s: (t.started + t.dropped) as f64 / secs,
        sent_per_s: t.attempts as f64 / secs,
        succeeded: t.succeeded,
        success_rate: (t.started > 0).then(|| t.succeeded as f64 / t.started as f64),
        shed,
        p99_ms: (!t.latency_us.is_empty())
            .then(|| t.latency_us.value_at_quantile(0.99) as f64 / 1000.0),
        queue_wait_p99_ms: wait,
        errors_by_status: t.errors.iter().map(|(k, n)| (k.label(), *n)).collect(),
    }
}

pub(crate) fn table(report: &NeighborReport) -> String {
    let phase_list: Vec<String> = PHASES
        .iter()
        .map(|p| format!("{p} {}", millis(report.phases_ms[p])))
        .collect();
    let mut out = format!(
        "noisy-neighbor (IL-0248, IL-0110): flood is limited to {}/min and sends 50x that during \
         the flood, resending every refusal at once; quiet sends {}/s within its limit; \
         phases: {}\n\n",
        report.flood_limit_per_min,
        trim_float(report.quiet_rate),
        phase_list.join(", ")
    );
    let header = [
        "phase",
        "gateway",
        "tenant",
        "offered/s",
        "sent/s",
        "success",
        "shed",
        "p99",
        "queue p99",
        "peak RSS",
        "errors (status: count)",
    ];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for (i, phase) in PHASES.iter().enumerate() {
        for run in report.runs.iter().filter(|r| r.completed) {
            let Some(p) = run.phases.get(i) else { continue };
            for f in &p.tenants {
                rows.push(vec![
                    (*phase).to_owned(),
                    run.mode.to_string(),
                    f.tenant.to_owned(),
                    format!("{:.1}", f.offered_per_s),
                    format!("{:.1}", f.sent_per_s),
                    f.success_rate
                        .map_or("-".to_owned(), |r| format!("{:.1}%", r * 100.0)),
                    f.shed.to_string(),
                    f.p99_ms.map_or("-".to_owned(), latency),
                    f.queue_wait_p99_ms
                        .map_or("-".to_owned(), |ms| format!("<={}", latency(ms))),
                    p.gateway_peak_rss_bytes.map_or("-".to_owned(), mebibytes),
                    error_list(&f.errors_by_status),
                ]);
            }
        }
    }
    out += &layout(&rows, |c| c < 3 || c == header.len() - 1);
    out +=
        "\nsuccess = requests started in the phase that ended 2xx (after the caller's resends); \
            shed = attempts refused with 429 or 503; p99 = first send to final answer; queue p99 \
            = bucket bound of the gateway's spillway_queue_wait_seconds for the tenant\n";
    for run in &report.runs {
        if let Some(e) = &run.error {
            out += &format!("{}: did not complete: {e}\n", run.mode);
        }
    }
    out
}
