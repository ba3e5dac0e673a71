//! `spillway replay retry-storm`: IL-0248 from start to finish, once per gateway mode.
//!
//! Each mode runs on a fresh fleet ([`fleet`]: three mock backends and a gateway): counters
//! read, the load started, the fault switched on and off at the phase boundaries, the counters
//! read again at each boundary, the load drained, and every process stopped whatever happened.
//! A mode that fails (its gateway would not start, a control request failed) is reported as not
//! completed and the other mode still runs; the replay then ends with an error naming it.

mod args;
mod fleet;
mod report;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::time::Instant;

use crate::error::ReplayError;
use crate::http::{uri, HttpClient};
use crate::incident::{self, say, Incident};
use crate::load::{self, Target};
use crate::plan::Mode;
use crate::rss::RssSampler;
use crate::tally::{Schedule, Tally};
use crate::timeline::{GatewayReading, Recording, StoreCount, Timeline};
pub use args::RetryStormArgs;
use args::{StormPlan, PHASES};
use fleet::{Fleet, MODEL};
use report::{Report, RunInputs, RunReport};

/// Checks `args` into a plan, and returns the replay of it, not started yet: every mode run,
/// the table printed, the JSON written if asked.
pub(crate) fn replay(
    args: &RetryStormArgs,
) -> Result<impl Future<Output = Result<(), ReplayError>>, ReplayError> {
    let plan = args.check()?;
    Ok(async move { incident::replay(&plan).await })
}

impl Incident for StormPlan {
    const SCENARIO: &'static str = "retry-storm";
    type Run = RunReport;
    type Report = Report;

    fn modes(&self) -> &[Mode] {
        &self.modes
    }

    fn json(&self) -> Option<&PathBuf> {
        self.json.as_ref()
    }

    fn out(&self) -> Option<&PathBuf> {
        self.out.as_ref()
    }

    async fn run_mode(&self, mode: Mode) -> Result<(RunReport, Timeline), ReplayError> {
        run_mode(self, mode).await
    }

    fn report(&self, runs: Vec<RunReport>) -> Report {
        Report::new(self, runs)
    }

    fn table(report: &Report) -> String {
        report::table(report)
    }
}

async fn run_mode(plan: &StormPlan, mode: Mode) -> Result<(RunReport, Timeline), ReplayError> {
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
) -> Result<(RunReport, Timeline), ReplayError> {
    let before = fleet.received(control).await?;
    let schedule = Schedule::new(Instant::now(), &plan.phases);
    let tally = Arc::new(Tally::new(&schedule));
    let rss = RssSampler::start(fleet.gateway_pid, schedule);
    let gateway = plan.out.as_ref().map(|_| GatewayReading {
        admin: fleet.admin_addr,
        store: StoreCount::Gateway,
    });
    let recording = Recording::start(mode, &PHASES, schedule, gateway);
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
    let timeline = recording.finish(&[&tally]).await;
    let backends: Vec<&'static str> = fleet.backends.iter().map(|b| b.name).collect();
    let report = RunReport::completed(
        mode,
        RunInputs {
            phases: plan.phases,
            slots: &tally.snapshot(),
            received: &received,
            backends: &backends,
            rss: &rss,
            drained,
        },
    );
    Ok((report, timeline))
}
