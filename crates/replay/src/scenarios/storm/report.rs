//! The retry-storm replay's figures: raw figures (serialized as the `--json` file) and the table.
//!
//! Figures are computed once, here, from the tallies and the backends' counters, so the JSON
//! and the table can never disagree. Rates divide by the phase's scheduled length, the same
//! boundaries every event was attributed by; ratios with nothing to divide by are absent
//! (`null`), never a made-up zero or infinity.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::args::{StormPlan, PHASES};
use crate::incident::RunOutcome;
use crate::load::{Drained, DRAIN_GRACE};
use crate::plan::{LoadPlan, Mode};
use crate::report::{error_list, latency, layout, mebibytes, millis, trim_float};
use crate::rss::RssPeaks;
use crate::tally::SlotTally;

/// Everything a `retry-storm` replay measured.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) scenario: &'static str,
    pub(crate) settings: Settings,
    pub(crate) runs: Vec<RunReport>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Settings {
    #[serde(flatten)]
    pub(crate) load: LoadPlan,
    pub(crate) phases_ms: BTreeMap<&'static str, u128>,
    pub(crate) drain_grace_ms: u128,
}

/// One mode's run.
#[derive(Debug, Serialize)]
pub(crate) struct RunReport {
    pub(crate) mode: Mode,
    /// Whether every phase ran; when false, `error` says why and the figures are empty.
    pub(crate) completed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    pub(crate) gateway_baseline_rss_bytes: Option<u64>,
    pub(crate) gateway_peak_rss_bytes: Option<u64>,
    pub(crate) phases: Vec<PhaseFigures>,
    pub(crate) drain: Option<DrainFigures>,
}

/// One phase of one run.
#[derive(Debug, Serialize)]
pub(crate) struct PhaseFigures {
    pub(crate) phase: &'static str,
    pub(crate) duration_s: f64,
    /// New requests offered: started plus dropped.
    pub(crate) offered: u64,
    pub(crate) dropped: u64,
    /// New requests started (request chains).
    pub(crate) new_requests: u64,
    /// Every HTTP request the client sent, resends included.
    pub(crate) client_requests: u64,
    /// Requests the backends received (the rise of their `/stats` `received`).
    pub(crate) upstream_attempts: u64,
    pub(crate) upstream_by_backend: BTreeMap<&'static str, u64>,
    pub(crate) new_requests_per_s: f64,
    pub(crate) client_requests_per_s: f64,
    pub(crate) upstream_attempts_per_s: f64,
    /// Upstream attempts per new request.
    pub(crate) amplification: Option<f64>,
    /// Upstream attempts per client request: the gateway's own share of the amplification.
    pub(crate) gateway_amplification: Option<f64>,
    pub(crate) succeeded: u64,
    pub(crate) failed: u64,
    pub(crate) exhausted: u64,
    pub(crate) unfinished: u64,
    /// Chains ending 2xx per chain started.
    pub(crate) success_rate: Option<f64>,
    pub(crate) latency_ms: Option<Latency>,
    /// Client requests that did not get a 2xx, by status or connection failure.
    pub(crate) errors_by_status: BTreeMap<String, u64>,
    pub(crate) gateway_peak_rss_bytes: Option<u64>,
}

/// Chain latency (first send to final answer, resends included), in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Latency {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
}

/// The chains still in flight when the last phase ended.
#[derive(Debug, Serialize)]
pub(crate) struct DrainFigures {
    pub(crate) in_flight_at_end: usize,
    pub(crate) abandoned: usize,
    pub(crate) took_ms: u128,
    pub(crate) client_requests: u64,
    pub(crate) errors_by_status: BTreeMap<String, u64>,
}

impl Report {
    pub(crate) fn new(plan: &StormPlan, runs: Vec<RunReport>) -> Report {
        Report {
            scenario: "retry-storm",
            settings: Settings {
                load: plan.load,
                phases_ms: PHASES
                    .iter()
                    .zip(plan.phases)
                    .map(|(name, d)| (*name, d.as_millis()))
                    .collect(),
                drain_grace_ms: DRAIN_GRACE.as_millis(),
            },
            runs,
        }
    }
}

/// What one run produced, ready to be turned into figures.
pub(crate) struct RunInputs<'a> {
    pub(crate) phases: [Duration; 4],
    /// Per phase then the drain slot.
    pub(crate) slots: &'a [SlotTally],
    /// Each backend's `received` at the start and at the end of every phase.
    pub(crate) received: &'a [Vec<u64>],
    pub(crate) backends: &'a [&'static str],
    pub(crate) rss: &'a RssPeaks,
    pub(crate) drained: Drained,
}

impl RunReport {
    pub(crate) fn completed(mode: Mode, run: RunInputs<'_>) -> RunReport {
        let phases = PHASES
            .iter()
            .enumerate()
            .map(|(i, name)| phase_figures(name, i, &run))
            .collect();
        let drain = run.slots.get(PHASES.len()).map(|t| DrainFigures {
            in_flight_at_end: run.drained.in_flight_at_end,
            abandoned: run.drained.abandoned,
            took_ms: run.drained.took.as_millis(),
            client_requests: t.attempts,
            errors_by_status: errors(t),
        });
        RunReport {
            mode,
            completed: true,
            error: None,
            gateway_baseline_rss_bytes: run.rss.baseline,
            gateway_peak_rss_bytes: run.rss.overall,
            phases,
            drain,
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
            drain: None,
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

fn phase_figures(name: &'static str, i: usize, run: &RunInputs<'_>) -> PhaseFigures {
    let t = &run.slots[i];
    let seconds = run.phases[i].as_secs_f64();
    let upstream_by_backend: BTreeMap<&'static str, u64> = run
        .backends
        .iter()
        .enumerate()
        .map(|(b, name)| {
            let at = |k: usize| run.received.get(k).and_then(|r| r.get(b)).copied();
            let rise = match (at(i), at(i + 1)) {
                (Some(before), Some(after)) => after.saturating_sub(before),
                _ => 0,
            };
            (*name, rise)
        })
        .collect();
    let upstream: u64 = upstream_by_backend.values().sum();
    let finished = t.succeeded + t.failed + t.exhausted;
    PhaseFigures {
        phase: name,
        duration_s: seconds,
        offered: t.started + t.dropped,
        dropped: t.dropped,
        new_requests: t.started,
        client_requests: t.attempts,
        upstream_attempts: upstream,
        upstream_by_backend,
        new_requests_per_s: t.started as f64 / seconds,
        client_requests_per_s: t.attempts as f64 / seconds,
        upstream_attempts_per_s: upstream as f64 / seconds,
        amplification: ratio(upstream, t.started),
        gateway_amplification: ratio(upstream, t.attempts),
        succeeded: t.succeeded,
        failed: t.failed,
        exhausted: t.exhausted,
        unfinished: t.unfinished(),
        success_rate: ratio(t.succeeded, t.started),
        latency_ms: (finished > 0).then(|| Latency {
            p50: t.latency_us.value_at_quantile(0.50) as f64 / 1000.0,
            p99: t.latency_us.value_at_quantile(0.99) as f64 / 1000.0,
            max: t.latency_us.max() as f64 / 1000.0,
        }),
        errors_by_status: errors(t),
        gateway_peak_rss_bytes: run.rss.per_slot.get(i).copied().flatten(),
    }
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

fn errors(t: &SlotTally) -> BTreeMap<String, u64> {
    t.errors.iter().map(|(k, n)| (k.label(), *n)).collect()
}

/// The side-by-side table: one row per phase and mode, the modes of a phase next to each other.
pub(crate) fn table(report: &Report) -> String {
    let s = &report.settings;
    let phase_list: Vec<String> = PHASES
        .iter()
        .map(|p| format!("{p} {}", millis(s.phases_ms[p])))
        .collect();
    let mut out = format!(
        "retry-storm (IL-0248): {} new requests/s offered, at most {} chains in flight, \
         {} immediate resends per request; phases: {} (a1 and a2 answer HTTP 500 during fault, \
         every backend during outage)\n\n",
        trim_float(s.load.rate),
        s.load.max_outstanding,
        s.load.client_retries,
        phase_list.join(", ")
    );
    let header = [
        "phase",
        "gateway",
        "client req/s",
        "new req/s",
        "upstream/s",
        "amplification",
        "success",
        "p99 latency",
        "dropped",
        "peak RSS",
        "errors (client requests)",
    ];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for (i, phase) in PHASES.iter().enumerate() {
        for run in report.runs.iter().filter(|r| r.completed) {
            let Some(f) = run.phases.get(i) else { continue };
            rows.push(vec![
                (*phase).to_owned(),
                run.mode.to_string(),
                format!("{:.1}", f.client_requests_per_s),
                format!("{:.1}", f.new_requests_per_s),
                format!("{:.1}", f.upstream_attempts_per_s),
                f.amplification
                    .map_or("-".to_owned(), |a| format!("{a:.2}x")),
                f.success_rate
                    .map_or("-".to_owned(), |r| format!("{:.1}%", r * 100.0)),
                f.latency_ms.map_or("-".to_owned(), |l| latency(l.p99)),
                f.dropped.to_string(),
                f.gateway_peak_rss_bytes.map_or("-".to_owned(), mebibytes),
                error_list(&f.errors_by_status),
            ]);
        }
    }
    out += &layout(&rows, |c| c < 2 || c == header.len() - 1);
    out += "\namplification = upstream attempts / new requests; success = chains ending 2xx / \
            chains started; p99 = first send to final answer of a chain, resends included\n";
    for run in &report.runs {
        if let Some(e) = &run.error {
            let _ = writeln!(out, "{}: did not complete: {e}", run.mode);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tally::{Attempt, ChainEnd, Tally};
    use http::StatusCode;

    fn plan() -> StormPlan {
        StormPlan {
            modes: vec![Mode::Protected],
            phases: [1, 2, 1, 1].map(Duration::from_secs),
            load: LoadPlan {
                rate: 10.0,
                max_outstanding: 4,
                client_retries: 48,
                resend_429: false,
                surge: None,
                attempt_timeout: Duration::from_secs(1),
            },
            json: None,
            out: None,
        }
    }

    #[test]
    fn figures_divide_by_the_phase_and_leave_empty_ratios_out() {
        let now = tokio::time::Instant::now();
        let tally = Tally::new(&crate::tally::Schedule::new(now, &plan().phases));
        for _ in 0..4 {
            tally.started(1, now);
        }
        for _ in 0..10 {
            let error = Attempt::Status(StatusCode::INTERNAL_SERVER_ERROR);
            tally.attempt(1, error, now, now);
        }
        tally.attempt(1, Attempt::Status(StatusCode::OK), now, now);
        tally.ended(1, ChainEnd::Succeeded, Duration::from_millis(40));
        let slots = tally.snapshot();
        let received = vec![
            vec![0, 0, 0],
            vec![5, 5, 0],
            vec![45, 45, 10],
            vec![45, 45, 10],
            vec![45, 45, 10],
        ];
        let run = RunReport::completed(
            Mode::Protected,
            RunInputs {
                phases: plan().phases,
                slots: &slots,
                received: &received,
                backends: &["a1", "a2", "b1"],
                rss: &RssPeaks::default(),
                drained: Drained::default(),
            },
        );
        let fault = &run.phases[1];
        assert_eq!(fault.upstream_attempts, 90);
        assert_eq!(fault.upstream_attempts_per_s, 45.0);
        assert_eq!(fault.client_requests_per_s, 5.5);
        assert_eq!(fault.amplification, Some(22.5));
        assert_eq!(fault.success_rate, Some(0.25));
        assert_eq!(fault.unfinished, 3);
        assert_eq!(fault.errors_by_status["500"], 10);
        let steady = &run.phases[0];
        assert_eq!(steady.amplification, None);
        assert!(steady.latency_ms.is_none());

        let report = Report::new(
            &plan(),
            vec![run, RunReport::failed(Mode::Naive, "x".into())],
        );
        let table = table(&report);
        assert!(table.contains("22.50x"), "{table}");
        assert!(table.contains("naive: did not complete: x"), "{table}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["runs"][0]["phases"][0]["amplification"],
            serde_json::Value::Null
        );
        assert_eq!(json["runs"][1]["completed"], false);
        assert_eq!(json["settings"]["phases_ms"]["fault"], 2000);
        assert_eq!(json["settings"]["attempt_timeout_ms"], 1000);
    }
}
