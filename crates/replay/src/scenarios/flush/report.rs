//! The cache-flush replay's figures: per phase and mode, what the callers saw, what reached
//! the store, how long lookups took in the gateway, and how often it was restarted.
//!
//! Store statements are counted on the wire by the store link, so they include every query of
//! every gateway process, restarts and warm-ups included. Lookup latency comes from the
//! gateway's `spillway_key_lookup_seconds` histogram, read at each phase boundary; its p99 is
//! the upper bound of the bucket holding the 99th percentile. A process's histogram dies with
//! it, so in a phase with restarts the figure covers only the last process (and is flagged).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::args::{FlushPlan, PHASES, STEADY};
use super::gateway::Gateway;
use super::store_link::StoreLink;
use super::watch::LivezCounts;
use crate::http::{uri, HttpClient};
use crate::incident::RunOutcome;
use crate::load::Drained;
use crate::plan::Mode;
use crate::report::{
    buckets_between, error_list, histogram_buckets, latency, layout, quantile_ms, trim_float,
};
use crate::tally::SlotTally;

const LOOKUP_SERIES: &str = "spillway_key_lookup_seconds_bucket{";

/// What was true at a phase boundary.
#[derive(Debug, Clone)]
pub(crate) struct Mark {
    pub(crate) statements: u64,
    pub(crate) connections: u64,
    pub(crate) restarts: u64,
    pub(crate) probe_restarts: u64,
    /// Cumulative lookup histogram of the process running then: (upper bound s, count).
    lookups: Option<Vec<(f64, u64)>>,
}

impl Mark {
    pub(crate) async fn take(link: &StoreLink, gateway: &Gateway, control: &HttpClient) -> Mark {
        let page = control
            .get(uri(gateway.admin, "/metrics"), Duration::from_secs(2))
            .await;
        let lookups = match page {
            Ok((status, body)) if status.is_success() => Some(histogram_buckets(
                &String::from_utf8_lossy(&body),
                LOOKUP_SERIES,
            )),
            _ => None,
        };
        Mark {
            statements: link.statements(),
            connections: link.connections(),
            restarts: gateway.restarts(),
            probe_restarts: gateway.probe_restarts(),
            lookups,
        }
    }
}

/// The lookups between two marks: the difference when one process spans both, else the later
/// mark's own counts (`partial`).
fn lookups_between(before: &Mark, after: &Mark) -> (Option<Vec<(f64, u64)>>, bool) {
    let Some(later) = &after.lookups else {
        return (None, true);
    };
    let same = before.restarts == after.restarts;
    match before.lookups.as_deref().filter(|_| same) {
        Some(earlier) => match buckets_between(earlier, later) {
            Some(diff) => (Some(diff), false),
            None => (Some(later.clone()), true),
        },
        None => (Some(later.clone()), true),
    }
}

/// Everything a `cache-flush` replay measured.
#[derive(Debug, Serialize)]
pub(crate) struct FlushReport {
    pub(crate) scenario: &'static str,
    pub(crate) settings: Settings,
    pub(crate) runs: Vec<RunReport>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Settings {
    pub(crate) keys: u32,
    pub(crate) rate: f64,
    pub(crate) phases_ms: BTreeMap<&'static str, u128>,
}

impl FlushReport {
    pub(crate) fn new(plan: &FlushPlan, runs: Vec<RunReport>) -> FlushReport {
        FlushReport {
            scenario: "cache-flush",
            settings: Settings {
                keys: plan.keys,
                rate: plan.rate,
                phases_ms: PHASES
                    .iter()
                    .zip(plan.phases)
                    .map(|(p, d)| (*p, d.as_millis()))
                    .collect(),
            },
            runs,
        }
    }
}

/// One mode's run.
#[derive(Debug, Serialize)]
pub(crate) struct RunReport {
    pub(crate) mode: Mode,
    pub(crate) completed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    pub(crate) phases: Vec<PhaseFigures>,
    /// Requests still in flight when the last phase ended.
    pub(crate) in_flight_at_end: usize,
    /// Phase events (flush, restart) that failed, with why: the gateway was down just then.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) events_failed: Vec<String>,
}

/// One phase of one run.
#[derive(Debug, Serialize)]
pub(crate) struct PhaseFigures {
    pub(crate) phase: &'static str,
    pub(crate) duration_s: f64,
    /// Requests offered (sent or dropped for lack of a client slot).
    pub(crate) offered: u64,
    pub(crate) succeeded: u64,
    pub(crate) succeeded_per_s: f64,
    /// Requests sent in this phase that did not get a 2xx, dropped ones included.
    pub(crate) error_rate: Option<f64>,
    pub(crate) errors_by_status: BTreeMap<String, u64>,
    /// SQL statements that reached the store, on the wire.
    pub(crate) store_statements: u64,
    pub(crate) store_statements_per_s: f64,
    /// Connections opened to the store (each restart opens a pool's worth).
    pub(crate) store_connections: u64,
    /// This phase's store rate over the steady phase's.
    pub(crate) store_vs_steady: Option<f64>,
    pub(crate) lookup_p99_ms: Option<f64>,
    pub(crate) lookups: u64,
    /// The lookup figures cover only the last gateway process of the phase.
    pub(crate) lookup_figures_partial: bool,
    pub(crate) request_p99_ms: Option<f64>,
    /// Gateway restarts in this phase: deliberate and the supervisor's.
    pub(crate) restarts: u64,
    pub(crate) supervisor_restarts: u64,
    pub(crate) livez: LivezCounts,
}

impl RunReport {
    /// `marks` has one more entry than there are phases (every boundary).
    pub(crate) fn completed(
        mode: Mode,
        durations: &[Duration],
        slots: &[SlotTally],
        marks: &[Mark],
        livez: &[LivezCounts],
        drained: Drained,
    ) -> RunReport {
        let mut phases: Vec<PhaseFigures> = Vec::with_capacity(PHASES.len());
        for (i, phase) in PHASES.iter().enumerate() {
            let (Some(t), Some(before), Some(after)) =
                (slots.get(i), marks.get(i), marks.get(i + 1))
            else {
                break;
            };
            let secs = durations[i].as_secs_f64();
            let statements = after.statements.saturating_sub(before.statements);
            let per_s = statements as f64 / secs;
            let steady = phases.get(STEADY).map(|p| p.store_statements_per_s);
            let (buckets, partial) = lookups_between(before, after);
            let (lookup_p99_ms, lookups) = buckets
                .as_deref()
                .map_or((None, 0), |b| quantile_ms(b, 0.99));
            let offered = t.started + t.dropped;
            phases.push(PhaseFigures {
                phase,
                duration_s: secs,
                offered,
                succeeded: t.succeeded,
                succeeded_per_s: t.succeeded as f64 / secs,
                error_rate: (offered > 0)
                    .then(|| offered.saturating_sub(t.succeeded) as f64 / offered as f64),
                errors_by_status: t.errors.iter().map(|(k, n)| (k.label(), *n)).collect(),
                store_statements: statements,
                store_statements_per_s: per_s,
                store_connections: after.connections.saturating_sub(before.connections),
                store_vs_steady: match steady {
                    _ if i == STEADY => (per_s > 0.0).then_some(1.0),
                    Some(s) if s > 0.0 => Some(per_s / s),
                    _ => None,
                },
                lookup_p99_ms,
                lookups,
                lookup_figures_partial: partial,
                request_p99_ms: (!t.latency_us.is_empty())
                    .then(|| t.latency_us.value_at_quantile(0.99) as f64 / 1000.0),
                restarts: after.restarts.saturating_sub(before.restarts),
                supervisor_restarts: after.probe_restarts.saturating_sub(before.probe_restarts),
                livez: livez.get(i).copied().unwrap_or_default(),
            });
        }
        RunReport {
            mode,
            completed: true,
            error: None,
            phases,
            in_flight_at_end: drained.in_flight_at_end,
            events_failed: Vec::new(),
        }
    }
}

impl RunOutcome for RunReport {
    fn failed(mode: Mode, error: String) -> RunReport {
        RunReport {
            mode,
            completed: false,
            error: Some(error),
            phases: Vec::new(),
            in_flight_at_end: 0,
            events_failed: Vec::new(),
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

/// The side-by-side table: one row per phase and mode.
pub(crate) fn table(report: &FlushReport) -> String {
    let s = &report.settings;
    let phase_list: Vec<String> = PHASES
        .iter()
        .map(|p| format!("{p} {}", crate::report::millis(s.phases_ms[p])))
        .collect();
    let mut out = format!(
        "cache-flush (IL-0136): {} requests/s over {} keys; phases: {} (flush, restart, store \
         down and back at their starts)\n\n",
        trim_float(s.rate),
        s.keys,
        phase_list.join(", ")
    );
    let header = [
        "phase",
        "gateway",
        "ok req/s",
        "errors",
        "store q/s",
        "vs steady",
        "lookup p99",
        "request p99",
        "restarts",
        "livez down",
        "errors (status: count)",
    ];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for (i, phase) in PHASES.iter().enumerate() {
        for run in report.runs.iter().filter(|r| r.completed) {
            let Some(f) = run.phases.get(i) else { continue };
            let star = if f.lookup_figures_partial { "*" } else { "" };
            rows.push(vec![
                (*phase).to_owned(),
                run.mode.to_string(),
                format!("{:.0}", f.succeeded_per_s),
                f.error_rate
                    .map_or("-".to_owned(), |r| format!("{:.1}%", r * 100.0)),
                format!("{:.0}", f.store_statements_per_s),
                f.store_vs_steady
                    .map_or("-".to_owned(), |r| format!("{r:.2}x")),
                f.lookup_p99_ms
                    .map_or("-".to_owned(), |ms| format!("<={}{star}", latency(ms))),
                f.request_p99_ms.map_or("-".to_owned(), latency),
                f.restarts.to_string(),
                format!("{}/{}", f.livez.failed, f.livez.probes),
                error_list(&f.errors_by_status),
            ]);
        }
    }
    out += &layout(&rows, |c| c < 2 || c == header.len() - 1);
    out += "\nstore q/s = SQL statements reaching PostgreSQL, counted on the wire; lookup p99 = \
            bucket bound from the gateway's histogram (* = last process of the phase only); \
            livez down = failed /livez probes / probes (every 100 ms)\n";
    for run in &report.runs {
        if let Some(e) = &run.error {
            out += &format!("{}: did not complete: {e}\n", run.mode);
        }
        for e in &run.events_failed {
            out += &format!("{}: event failed: {e}\n", run.mode);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_buckets_are_read_and_differenced_within_one_process() {
        let page = "# TYPE spillway_key_lookup_seconds histogram\n\
                    spillway_key_lookup_seconds_bucket{le=\"0.0001\"} 90\n\
                    spillway_key_lookup_seconds_bucket{le=\"0.001\"} 99\n\
                    spillway_key_lookup_seconds_bucket{le=\"+Inf\"} 100\n\
                    spillway_key_lookup_seconds_count 100\n";
        let buckets = histogram_buckets(page, LOOKUP_SERIES);
        assert_eq!(buckets.len(), 3);
        assert_eq!(quantile_ms(&buckets, 0.99), (Some(1.0), 100));
        assert_eq!(quantile_ms(&buckets, 0.5), (Some(0.1), 100));
        let mark = |restarts, lookups| Mark {
            statements: 0,
            connections: 0,
            restarts,
            probe_restarts: 0,
            lookups,
        };
        let before = mark(0, Some(vec![(0.1, 10), (f64::INFINITY, 10)]));
        let after = mark(0, Some(vec![(0.1, 10), (f64::INFINITY, 30)]));
        let (diff, partial) = lookups_between(&before, &after);
        assert!(!partial);
        assert_eq!(diff.unwrap(), vec![(0.1, 0), (f64::INFINITY, 20)]);
        // A restart in between: only the new process's counts.
        let restarted = mark(1, Some(vec![(0.1, 5), (f64::INFINITY, 5)]));
        let (own, partial) = lookups_between(&before, &restarted);
        assert!(partial);
        assert_eq!(own.unwrap()[1].1, 5);
        assert_eq!(quantile_ms(&[], 0.99), (None, 0));
    }
}
