//! `spillway replay bad-rollout`: IL-0235, a new version rolled out that cannot serve a feature.
//!
//! In IL-0235 a model update turned on a feature the deployed engine did not support: requests
//! that used it failed with 400, the reduced capacity answered 429, in seven regions; monitoring
//! watched only client-side errors, so detection took an hour, and the rollback fifteen. Here each
//! region has a backend of the current version and one of the new ([`fleet`]); callers send a
//! share of their requests with the feature (`tools`) at a fixed rate, without retries; a
//! gateway serves the old version through `steady`, the rollout is started at the start of
//! `rollout` by rewriting its config and reloading it, and `after` shows what is left of it. The
//! protected mode rolls out in stages and the comparator halts it; the naive mode replaces the
//! old version at once, as a deployment without stages does, and nothing halts it. From the
//! reload on, [`watch`] times the halt and the last request that reached the new version.
//!
//! The naive run is the gateway's `replace` mode: every attempt goes to the new version, and the
//! old backends the config still lists take nothing, as if they were gone; so its failures hold
//! at about the tools share plus what the new version's capacity refuses, and never end, since
//! nothing takes the new version out of the config.

mod args;
mod fleet;
mod report;
mod watch;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::json;
use tokio::time::Instant;

use crate::error::ReplayError;
use crate::http::{uri, HttpClient};
use crate::incident::{self, say, Incident};
use crate::load::{self, Target};
use crate::plan::Mode;
use crate::tally::{Schedule, Tally};
use crate::timeline::{GatewayReading, Recording, StoreCount, Timeline};

pub use args::BadRolloutArgs;
use args::{BadRolloutPlan, PHASES};
use fleet::{Fleet, FEATURE, MODEL};
use report::{BadRolloutReport, RunReport};

/// Checks `args` into a plan, and returns the replay of it, not started yet: every mode run,
/// the table printed, the JSON written if asked.
pub(crate) fn replay(
    args: &BadRolloutArgs,
) -> Result<impl Future<Output = Result<(), ReplayError>>, ReplayError> {
    let plan = args.check()?;
    Ok(async move { incident::replay(&plan).await })
}

impl Incident for BadRolloutPlan {
    const SCENARIO: &'static str = "bad-rollout";
    type Run = RunReport;
    type Report = BadRolloutReport;

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

    fn report(&self, runs: Vec<RunReport>) -> BadRolloutReport {
        BadRolloutReport::new(self, runs)
    }

    fn table(report: &BadRolloutReport) -> String {
        report::table(report)
    }
}

async fn run_mode(plan: &BadRolloutPlan, mode: Mode) -> Result<(RunReport, Timeline), ReplayError> {
    say(
        mode,
        &format!(
            "starting an old-version and a new-version mock backend in each of {} regions, \
             and the gateway on the old version",
            plan.regions
        ),
    );
    let control = HttpClient::new(4);
    let fleet = Fleet::start(mode, plan, &control).await?;
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
    plan: &BadRolloutPlan,
    mode: Mode,
    fleet: &Fleet,
    control: &HttpClient,
) -> Result<(RunReport, Timeline), ReplayError> {
    let before = fleet.new_counters(control).await?;
    let schedule = Schedule::new(Instant::now(), &plan.phases);
    let tally = Arc::new(Tally::new(&schedule));
    let gateway = plan.out.as_ref().map(|_| GatewayReading {
        admin: fleet.admin_addr,
        store: StoreCount::Gateway,
    });
    let recording = Recording::start(mode, &PHASES, schedule, gateway);
    let mut with_feature = load::chat_body(MODEL);
    with_feature[FEATURE] = json!([{
        "type": "function",
        "function": {"name": "lookup_incident", "parameters": {"type": "object", "properties": {}}},
    }]);
    let target = Target::chat(
        uri(fleet.gateway_addr, "/v1/chat/completions"),
        std::slice::from_ref(&fleet.key),
        MODEL,
    )
    .with_variant(&with_feature, plan.tools_share);
    let load = load::offer(plan.load, Arc::new(target), schedule, Arc::clone(&tally));
    let phases = async {
        announce(mode, plan, 0);
        tokio::time::sleep_until(schedule.end_of(0)).await;
        let at_reload = fleet.new_counters(control).await?;
        report_phase(mode, 0, &tally, before, at_reload);
        fleet.start_rollout(mode, plan, control).await?;
        let reloaded = Instant::now();
        announce(mode, plan, 1);
        let rest = async {
            let mut counters = vec![before, at_reload];
            for i in 1..PHASES.len() {
                tokio::time::sleep_until(schedule.end_of(i)).await;
                let now = fleet.new_counters(control).await?;
                report_phase(mode, i, &tally, counters[i], now);
                counters.push(now);
                announce(mode, plan, i + 1);
            }
            Ok::<_, ReplayError>(counters)
        };
        let watch = watch::follow(mode, fleet, at_reload, reloaded, schedule.end());
        let (watched, counters) = tokio::join!(watch, rest);
        Ok::<_, ReplayError>((counters?, watched))
    };
    let ((counters, watched), drained) = tokio::try_join!(phases, async { Ok(load.await) })?;
    let timeline = recording.finish(&[&tally]).await;
    let report = RunReport::completed(
        mode,
        &tally.snapshot(),
        &counters,
        watched,
        drained.in_flight_at_end,
    );
    Ok((report, timeline))
}

/// A progress line at the start of phase `i`, if there is one.
fn announce(mode: Mode, plan: &BadRolloutPlan, i: usize) {
    let what = match i {
        0 => "the old version only".to_owned(),
        1 => format!(
            "the config rewritten with [models.rollout] mode = \"{}\" and reloaded: applied",
            fleet::rollout_mode(mode)
        ),
        2 => "the rollout left as it is".to_owned(),
        _ => return,
    };
    let length = humantime::format_duration(plan.phases[i]);
    say(mode, &format!("{}: {what} ({length})", PHASES[i]));
}

/// A progress line at the end of phase `i`: what the callers and the new version saw in it.
fn report_phase(
    mode: Mode,
    i: usize,
    tally: &Tally,
    then: fleet::NewCounters,
    now: fleet::NewCounters,
) {
    let snapshot = tally.snapshot();
    let Some(slot) = snapshot.get(i) else { return };
    let errors: u64 = slot.errors.values().sum();
    say(
        mode,
        &format!(
            "{} done: {} requests, {} error answers, the new version received {}",
            PHASES[i],
            slot.started + slot.dropped,
            errors,
            now.received.saturating_sub(then.received)
        ),
    );
}
