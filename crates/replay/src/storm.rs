//! The retry-storm scenario (IL-0248) from start to finish, once per gateway mode.
//!
//! Each mode runs on a fresh fleet: counters read, the load started, the fault switched on
//! and off at the phase boundaries, the counters read again at each boundary, the load drained,
//! and every process stopped whatever happened. A mode that fails (its gateway would not start,
//! a control request failed) is reported as not completed and the other mode still runs; the
//! replay then ends with an error naming it.

use std::sync::Arc;

use tokio::time::Instant;

use crate::args::{Mode, StormPlan};
use crate::fleet::{Fleet, MODEL};
use crate::http::{uri, HttpClient};
use crate::load::{self, Target};
use crate::report::{self, Report, RunInputs, RunReport};
use crate::rss::RssSampler;
use crate::tally::{Schedule, Tally, PHASES};
use crate::ReplayError;

/// Runs every mode of `plan`, prints the table, writes the JSON if asked.
pub(crate) async fn run(plan: StormPlan) -> Result<(), ReplayError> {
    let mut runs = Vec::with_capacity(plan.modes.len());
    let mut first_failure = None;
    for &mode in &plan.modes {
        match run_mode(&plan, mode).await {
            Ok(run) => runs.push(run),
            Err(e) => {
                let message = e.to_string();
                say(mode, &format!("did not complete: {message}"));
                first_failure.get_or_insert((mode, message.clone()));
                runs.push(RunReport::failed(mode, message));
            }
        }
    }
    let report = Report::new(&plan, runs);
    let table = report
        .runs
        .iter()
        .any(|r| r.completed)
        .then(|| report::table(&report));
    let failed = first_failure.as_ref().map(|(m, e)| (*m, e.as_str()));
    report::publish(&report, table, plan.json.as_ref(), failed)
}

/// A progress line on stderr.
fn say(mode: Mode, message: &str) {
    eprintln!("replay: {mode}: {message}");
}

async fn run_mode(plan: &StormPlan, mode: Mode) -> Result<RunReport, ReplayError> {
    say(
        mode,
        "starting mock backends a1, a2 (region-a), b1 (region-b) and the gateway",
    );
    let control = HttpClient::new(4);
    let fleet = Fleet::start(mode, &control).await?;
    say(
        mode,
        &format!(
            "gateway (pid {}) ready on http://{}",
            fleet.gateway_pid, fleet.gateway_addr
        ),
    );
    let outcome = drive(plan, mode, &fleet, &control).await;
    fleet.stop().await;
    say(mode, "stopped every process of this run");
    outcome
}

/// The phases of one run against a ready fleet.
async fn drive(
    plan: &StormPlan,
    mode: Mode,
    fleet: &Fleet,
    control: &HttpClient,
) -> Result<RunReport, ReplayError> {
    let before = fleet.received(control).await?;
    let schedule = Schedule::new(Instant::now(), &plan.phases);
    let tally = Arc::new(Tally::new(&schedule));
    let rss = RssSampler::start(fleet.gateway_pid, schedule);
    let target = Arc::new(Target::chat(
        uri(fleet.gateway_addr, "/v1/chat/completions"),
        std::slice::from_ref(&fleet.key),
        MODEL,
    ));
    let load = load::offer(plan.load, target, schedule, Arc::clone(&tally));
    let phases = async {
        let mut received = vec![before];
        for (i, name) in PHASES.iter().enumerate() {
            let started = match i {
                1 => {
                    fleet.set_fault(control, true, false).await?;
                    "fault: a1 and a2 now answer every request with HTTP 500"
                }
                2 => {
                    fleet.set_fault(control, true, true).await?;
                    "outage: every backend (b1 too) now answers every request with HTTP 500"
                }
                3 => {
                    fleet.set_fault(control, false, true).await?;
                    "recovery: every backend is healthy again"
                }
                _ => "steady: all backends healthy",
            };
            say(
                mode,
                &format!("{started} ({})", humantime::format_duration(plan.phases[i])),
            );
            tokio::time::sleep_until(schedule.end_of(i)).await;
            let counters = fleet.received(control).await?;
            let upstream: u64 = counters
                .iter()
                .zip(&received[i])
                .map(|(now, then)| now.saturating_sub(*then))
                .sum();
            let slot = &tally.snapshot()[i];
            say(
                mode,
                &format!(
                    "{name} done: {} new requests, {} client requests, {} upstream attempts",
                    slot.started, slot.attempts, upstream
                ),
            );
            received.push(counters);
        }
        Ok::<_, ReplayError>(received)
    };
    let (received, drained) = tokio::try_join!(phases, async { Ok(load.await) })?;
    if drained.in_flight_at_end > 0 {
        say(
            mode,
            &format!(
                "{} request chain(s) were in flight at the end; {} finished within {}, {} abandoned",
                drained.in_flight_at_end,
                drained.in_flight_at_end - drained.abandoned,
                humantime::format_duration(load::DRAIN_GRACE),
                drained.abandoned
            ),
        );
    }
    let rss = rss.stop().await;
    let backends: Vec<&'static str> = fleet.backends.iter().map(|b| b.name).collect();
    Ok(RunReport::completed(
        mode,
        RunInputs {
            phases: plan.phases,
            slots: &tally.snapshot(),
            received: &received,
            backends: &backends,
            rss: &rss,
            drained,
        },
    ))
}
