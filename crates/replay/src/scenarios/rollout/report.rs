//! The bad-rollout replay's figures: per mode and phase, what the callers saw (their failures,
//! the 400s and the capacity refusals apart) and what reached the new version; per mode, how
//! long the new version was given traffic.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::args::{BadRolloutPlan, PHASES};
use super::fleet::{rollout_mode, step_duration, NewCounters, MIN_STEP_REQUESTS, STEPS};
use super::watch::Watched;
use crate::incident::RunOutcome;
use crate::plan::Mode;
use crate::report::{error_list, layout, millis, trim_float};
use crate::tally::{ErrorKey, SlotTally};

#[derive(Debug, Serialize)]
pub(crate) struct BadRolloutReport {
    pub(crate) scenario: &'static str,
    pub(crate) rate: f64,
    pub(crate) tools_share: f64,
    pub(crate) regions: usize,
    pub(crate) phases_ms: BTreeMap<&'static str, u128>,
    /// The protected mode's `[models.rollout]`.
    pub(crate) staged: StagedSettings,
    pub(crate) runs: Vec<RunReport>,
}

#[derive(Debug, Serialize)]
pub(crate) struct StagedSettings {
    pub(crate) steps_percent: [u32; 3],
    pub(crate) min_step_duration_ms: u128,
    pub(crate) min_step_requests: u64,
}

impl BadRolloutReport {
    pub(crate) fn new(plan: &BadRolloutPlan, runs: Vec<RunReport>) -> BadRolloutReport {
        BadRolloutReport {
            scenario: "bad-rollout",
            rate: plan.load.rate,
            tools_share: plan.tools_share,
            regions: plan.regions,
            phases_ms: PHASES
                .iter()
                .zip(plan.phases)
                .map(|(p, d)| (*p, d.as_millis()))
                .collect(),
            staged: StagedSettings {
                steps_percent: STEPS,
                min_step_duration_ms: step_duration(plan.phases[1]).as_millis(),
                min_step_requests: MIN_STEP_REQUESTS,
            },
            runs,
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct RunReport {
    pub(crate) mode: Mode,
    /// `staged` or `replace`: the `[models.rollout]` mode this run reloaded.
    pub(crate) rollout_mode: &'static str,
    pub(crate) completed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    pub(crate) phases: Vec<PhaseFigures>,
    /// From the reload on (see `watch.rs`).
    pub(crate) watched: Option<Watched>,
    pub(crate) in_flight_at_end: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct PhaseFigures {
    pub(crate) phase: &'static str,
    /// New requests offered in the phase (dropped ones included).
    pub(crate) offered: u64,
    /// Requests offered in the phase that got a 2xx.
    pub(crate) succeeded: u64,
    /// Requests offered in the phase that did not: an error status, no answer, dropped or
    /// unfinished. With no client retries, each saw exactly one error.
    pub(crate) failed: u64,
    pub(crate) failed_share: Option<f64>,
    pub(crate) status_400: u64,
    pub(crate) status_429: u64,
    pub(crate) status_503: u64,
    /// Failures that were neither 400, 429 nor 503.
    pub(crate) other_errors: u64,
    pub(crate) errors_by_status: BTreeMap<String, u64>,
    pub(crate) p99_ms: Option<f64>,
    /// What the new version's backends counted during the phase.
    pub(crate) new_version_received: u64,
    pub(crate) new_version_429: u64,
    pub(crate) new_version_400: u64,
}

impl RunReport {
    /// `counters`: the new version's at the start of the run and at the end of each phase.
    pub(crate) fn completed(
        mode: Mode,
        slots: &[SlotTally],
        counters: &[NewCounters],
        watched: Watched,
        in_flight_at_end: usize,
    ) -> RunReport {
        let phases = PHASES
            .iter()
            .enumerate()
            .filter_map(|(i, phase)| {
                let slot = slots.get(i)?;
                let (then, now) = (counters.get(i)?, counters.get(i + 1)?);
                Some(figures(phase, slot, *then, *now))
            })
            .collect();
        RunReport {
            mode,
            rollout_mode: rollout_mode(mode),
            completed: true,
            error: None,
            phases,
            watched: Some(watched),
            in_flight_at_end,
        }
    }
}

impl RunOutcome for RunReport {
    fn failed(mode: Mode, error: String) -> RunReport {
        RunReport {
            mode,
            rollout_mode: rollout_mode(mode),
            completed: false,
            error: Some(error),
            phases: Vec::new(),
            watched: None,
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

fn figures(
    phase: &'static str,
    t: &SlotTally,
    then: NewCounters,
    now: NewCounters,
) -> PhaseFigures {
    let status = |code: u16| t.errors.get(&ErrorKey::Status(code)).copied().unwrap_or(0);
    let offered = t.started + t.dropped;
    let failed = offered.saturating_sub(t.succeeded);
    let (status_400, status_429, status_503) = (status(400), status(429), status(503));
    PhaseFigures {
        phase,
        offered,
        succeeded: t.succeeded,
        failed,
        failed_share: (offered > 0).then(|| failed as f64 / offered as f64),
        status_400,
        status_429,
        status_503,
        other_errors: failed.saturating_sub(status_400 + status_429 + status_503),
        errors_by_status: t.errors.iter().map(|(k, n)| (k.label(), *n)).collect(),
        p99_ms: (!t.latency_us.is_empty())
            .then(|| t.latency_us.value_at_quantile(0.99) as f64 / 1000.0),
        new_version_received: now.received.saturating_sub(then.received),
        new_version_429: now.queue_full.saturating_sub(then.queue_full),
        new_version_400: now.rejected_field.saturating_sub(then.rejected_field),
    }
}

pub(crate) fn table(report: &BadRolloutReport) -> String {
    let phase_list: Vec<String> = PHASES
        .iter()
        .map(|p| format!("{p} {}", millis(report.phases_ms[p])))
        .collect();
    let steps: Vec<String> = STEPS.iter().map(|s| format!("{s}%")).collect();
    let mut out = format!(
        "bad-rollout (IL-0235): {} requests/s over {} regions, {}% of them with `tools`, which \
         the new version refuses with 400; the new version has a fraction of the old one's \
         capacity; phases: {} (the rollout is reloaded at the start of `rollout`); protected: \
         staged, steps {}, each held {} and {} requests; naive: replace\n\n",
        trim_float(report.rate),
        report.regions,
        trim_float(report.tools_share * 100.0),
        phase_list.join(", "),
        steps.join(" "),
        millis(report.staged.min_step_duration_ms),
        report.staged.min_step_requests,
    );
    let header = [
        "phase",
        "gateway",
        "offered",
        "ok",
        "failed",
        "400",
        "429",
        "503",
        "to new",
        "new 429",
        "errors (status: count)",
    ];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for (i, phase) in PHASES.iter().enumerate() {
        for run in report.runs.iter().filter(|r| r.completed) {
            let Some(f) = run.phases.get(i) else { continue };
            let share = f
                .failed_share
                .map_or("-".to_owned(), |s| format!("{:.1}%", s * 100.0));
            rows.push(vec![
                (*phase).to_owned(),
                run.mode.to_string(),
                f.offered.to_string(),
                f.succeeded.to_string(),
                format!("{} ({share})", f.failed),
                f.status_400.to_string(),
                f.status_429.to_string(),
                f.status_503.to_string(),
                f.new_version_received.to_string(),
                f.new_version_429.to_string(),
                error_list(&f.errors_by_status),
            ]);
        }
    }
    out += &layout(&rows, |c| c < 2 || c == header.len() - 1);
    out += "\n";
    let header = [
        "gateway",
        "rollout",
        "halted after",
        "back on old after",
        "new share at end",
        "halt evidence",
    ];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for run in report.runs.iter().filter(|r| r.completed) {
        let Some(w) = &run.watched else { continue };
        rows.push(vec![
            run.mode.to_string(),
            run.rollout_mode.to_owned(),
            w.halted_after.map_or("never".to_owned(), seconds),
            back_on_old(w),
            w.share_percent_at_end
                .map_or("-".to_owned(), |s| format!("{}%", trim_float(s))),
            w.halt_reason.as_ref().map_or("-".to_owned(), evidence),
        ]);
    }
    out += &layout(&rows, |c| c < 2 || c == header.len() - 1);
    out += "\nok = requests offered in the phase that got a 2xx; failed = the others (no client \
            retries: each saw one error); 400, 429, 503 = callers' answers with that status (the \
            gateway answers a backend's 429 with its own 503, keeping 429 for a tenant over its \
            quota); to new = requests the new version's backends received; new 429 = their 429s; \
            halted after, back on old after = from the reload (polled every 200 ms); back on old \
            = the last request that reached the new version\n";
    for run in &report.runs {
        if let Some(e) = &run.error {
            out += &format!("{}: did not complete: {e}\n", run.mode);
        }
    }
    out
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn back_on_old(w: &Watched) -> String {
    match (w.back_on_old(), w.last_new_request) {
        (Some(d), _) => seconds(d),
        (None, Some(_)) => "never".to_owned(),
        (None, None) => "-".to_owned(),
    }
}

/// The halt's signal and counts: `client_error 400 (6 of 31 against 0 of 270)`.
fn evidence(reason: &Value) -> String {
    let signal = match &reason["signal"] {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_string(),
    };
    let c = &reason["counts"];
    format!(
        "{signal} ({} of {} against {} of {})",
        c["new_events"], c["new_requests"], c["old_events"], c["old_requests"]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_halt_s_evidence_reads_as_the_gateway_logs_it() {
        let reason = serde_json::json!({
            "signal": {"client_error": 400},
            "counts": {"new_events": 6, "new_requests": 31, "old_events": 0, "old_requests": 270},
        });
        assert_eq!(
            evidence(&reason),
            "client_error 400 (6 of 31 against 0 of 270)"
        );
        let capacity = serde_json::json!({"signal": "capacity", "counts": {
            "new_events": 9, "new_requests": 40, "old_events": 1, "old_requests": 300}});
        assert_eq!(evidence(&capacity), "capacity (9 of 40 against 1 of 300)");
    }

    #[test]
    fn a_new_version_still_serving_at_the_end_was_never_rolled_back() {
        let mut w = Watched {
            last_new_request: Some(Duration::from_millis(4400)),
            ..Watched::default()
        };
        assert_eq!(back_on_old(&w), "4.4 s");
        w.new_version_serving_at_end = true;
        assert_eq!(back_on_old(&w), "never");
        assert_eq!(back_on_old(&Watched::default()), "-");
    }
}
